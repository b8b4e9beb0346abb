"""Readable command output: progress bars only on a terminal, partition reasons wrapped, and a missing cross
compiler said before anything is compiled."""
from __future__ import annotations

import io
import sys
import warnings

import pytest

import tvm_dpu
from tvm_dpu.cli import main
from tvm_dpu.util.progress import progress_wanted
from tvm_dpu.types import TABLE_WIDTH, NodeReport, PartitionReport

from test_runner import conv_model


class _Stream(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


@pytest.mark.parametrize("tty", [False, True])
def test_progress_bars_only_on_a_terminal(tty, monkeypatch):
    monkeypatch.delenv("TVM_DPU_PROGRESS", raising=False)
    err = _Stream(tty)
    monkeypatch.setattr(sys, "stderr", err)
    assert progress_wanted(True) is tty and progress_wanted(False) is False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tvm_dpu.build(conv_model(), arch="B4096", progress=True)
    drawn = err.getvalue()
    assert ("DPU subgraphs" in drawn) is tty and ("\r" in drawn) is tty


def test_long_reasons_are_wrapped():
    reason = "the kernel " + "is far too wide for the DPU's weight buffer on this arch " * 7
    report = PartitionReport("B4096", [NodeReport("conv_with_a_long_name", "Conv", "cpu", None, reason),
                                       NodeReport("relu", "Relu", "dpu", 0, None)], 1)
    text = report.table()
    assert max(len(line) for line in text.splitlines()) <= TABLE_WIDTH
    assert " ".join(text.split()).count("weight buffer") == 7  # nothing lost in the wrap
    assert len(text.splitlines()) > 5  # the reason takes several lines


def test_missing_cross_compiler_is_said_before_compiling(tmp_path, capsys, monkeypatch):
    import onnx

    import tvm_dpu.util.toolchains as toolchains

    which = toolchains.shutil.which
    monkeypatch.setattr(toolchains.shutil, "which",
                        lambda name, *a, **k: None if name.startswith("aarch64") else which(name, *a, **k))
    onnx.save(conv_model(), tmp_path / "m.onnx")
    out = tmp_path / "out"
    assert main(["compile", str(tmp_path / "m.onnx"), "--arch", "B4096", "-o", str(out), "--cross", "aarch64",
                 "-q"]) == 2
    err = capsys.readouterr().err
    assert "aarch64-linux-gnu-gcc" in err and "apt-get install gcc-aarch64-linux-gnu" in err
    assert not out.exists()  # refused before the compile wrote anything
