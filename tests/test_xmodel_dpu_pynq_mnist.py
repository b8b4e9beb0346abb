"""A second vai_c network, from a second source: DPU-PYNQ's MNIST classifier (vai_c_tensorflow2 3.5 for the KV260
B4096 DPU; a channel-augmented 3x3 conv + ReLU, a max pool and two dense layers as conv2d-fix on the DPU, softmax on
the CPU). Its provenance is in data/xmodel/dpu_pynq/PROVENANCE.md.

The bar of issue 21 on this file: `tvm-dpu run` ends with no error, `inspect` lists the subgraph tree, and an
independent integer reference computed from the op graph (tests/xmodel_reference.py) agrees bit for bit with vai_c's
machine code on the emulator at the DPU output (the float softmax after it to float rounding)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tvm_dpu.cli import main
from tvm_dpu.errors import XModelError
from tvm_dpu.xmodel import read_xmodel
from tvm_dpu.xmodel.runner import load_xmodel
from xmodel_reference import reference_values

MNIST = Path(__file__).parent / "data" / "xmodel" / "dpu_pynq" / "dpu_mnist_classifier.xmodel"
DPU_OUT = "quant_dense_1(TransferMatMulToConv2d)_inserted_fix_3_reshaped"


def _digit_like(rng: np.random.Generator) -> np.ndarray:
    """A stroke image in [0, 1] like MNIST's (a thick random polyline on black), so the first conv sees the value
    range the classifier was quantized for, not only noise."""
    img = np.zeros((28, 28), np.float32)
    pts = rng.uniform(5, 23, (4, 2))
    for a, b in zip(pts[:-1], pts[1:]):
        for t in np.linspace(0, 1, 40):
            y, x = (a + (b - a) * t).astype(int)
            img[max(y - 1, 0):y + 2, max(x - 1, 0):x + 2] = 1.0
    return img.reshape(1, 28, 28, 1)


def test_the_file_is_vai_c_isa1_code_with_the_expected_tree():
    assert MNIST.stat().st_size < 1 << 20
    m = read_xmodel(MNIST)
    assert m.name == "mnist_classifier"
    (dpu,) = m.dpu_subgraphs()
    assert dpu.fingerprint == 0x0101000056010407 and len(dpu.mc_code) == 4572
    assert [s.name for s in m.cpu_subgraphs()] == ["subgraph_quant_dense_1_softmax"]
    assert [(s.name, s.device) for s in m.root.children] == [
        ("subgraph_input_1", "USER"), ("subgraph_quant_conv2d", "DPU"), ("subgraph_quant_dense_1_softmax", "CPU")]
    assert [t.fix_point for t in dpu.inputs] == [6] and [t.fix_point for t in dpu.outputs] == [2]


@pytest.mark.parametrize("command, printed", [
    (["run"], ["ended=True", "output 0 (quant_dense_1_softmax): shape (1, 10)"]),
    (["inspect", "--disasm"], ["subgraph_quant_conv2d [DPU] DPUCZDX8G_ISA1_B4096 fingerprint 0x0101000056010407",
                               "subgraph_quant_dense_1_softmax [CPU]", " END"])])
def test_cli_run_ends_and_inspect_lists_the_tree(command, printed, capsys):
    assert main([command[0], str(MNIST), *command[1:]]) == 0
    out = capsys.readouterr().out
    assert all(line in out for line in printed), out
    assert out.count("ended=True") == (command[0] == "run")


def test_vai_c_code_on_the_emulator_matches_the_integer_reference():
    runner = load_xmodel(MNIST)
    rng = np.random.default_rng(21)
    classes = set()
    for k in range(6):
        # stroke images, then wider ranges that saturate the input (fix_point 6: |x| < 2) and go negative
        image = _digit_like(rng) if k < 3 else rng.uniform(-3, 3, (1, 28, 28, 1)).astype(np.float32)
        got = runner.run_values({"input_1": image})
        want = reference_values(runner.model, image)
        assert got[DPU_OUT].dtype == np.int8
        np.testing.assert_array_equal(got[DPU_OUT], want[DPU_OUT], err_msg=f"input {k}")
        (final,) = runner.outputs
        np.testing.assert_allclose(got[final.name], want[final.name], rtol=1e-5, atol=1e-7)
        classes.add(int(np.argmax(got[final.name])))
        assert len(np.unique(got[DPU_OUT])) > 1  # not a constant (e.g. all-zero) logit vector
    assert len(classes) >= 2


_BASE = MNIST.read_bytes()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(_BASE) - 1), st.integers(0, 255)), min_size=1, max_size=8),
       st.integers(0, len(_BASE)))
def test_fuzz_mutated_and_truncated_gives_only_xmodel_error(edits, cut):
    data = bytearray(_BASE)
    for at, byte in edits:
        data[at] = byte
    try:
        read_xmodel(bytes(data[:cut]))
    except XModelError:
        pass


def test_a_crlf_damaged_copy_is_one_clear_error():
    """A damage met in the wild: a fork of DPU-PYNQ stores an xmodel that git's CRLF->LF conversion shortened
    (every 0x0d before 0x0a dropped; tests/data/xmodel/PUBLIC_NETWORKS.txt). The reader names the field and offset
    where the stream stops making sense instead of returning a wrong graph."""
    assert _BASE.count(b"\r\n") > 100
    with pytest.raises(XModelError, match=r"field Graph\.op_node.* at offset \d+"):
        read_xmodel(_BASE.replace(b"\r\n", b"\n"))
