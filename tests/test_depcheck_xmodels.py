"""vai_c's own programs, read from the vendored .xmodel files, under the dependency protocol: the timing model runs
every DPU subgraph as written (no deadlock, no bit cleared) and the checker finds no imbalance and no race in any of
them; `tvm-dpu inspect --check-deps` takes an .xmodel."""
from __future__ import annotations

from pathlib import Path

import pytest

from tvm_dpu.cli import main
from tvm_dpu.timing.simulate import simulate
from tvm_dpu.xmodel.commands import check_deps
from tvm_dpu.xmodel.runner import load_xmodel

# DPUCZDX8G programs only: the dependency protocol checked is DPUCZDX8G's; DPUCAHX8H's (dpucahx8h/) is not written
# yet (docs/dependency-protocol.md, "DPUCAHX8H")
XMODELS = sorted(p for p in (Path(__file__).parent / "data" / "xmodel").rglob("*.xmodel") if "dpucahx8h" not in p.parts)


def test_the_vendored_networks_are_there():
    assert len(XMODELS) >= 3, XMODELS


@pytest.mark.parametrize("path", XMODELS, ids=lambda p: p.name)
def test_timing_model_runs_vai_c_programs_as_written(path):
    runner = load_xmodel(path)
    assert runner.programs
    for name, prog in runner.programs.items():
        result = simulate(prog.sg.code, runner.arch)
        assert result.cycles > 0, name


@pytest.mark.parametrize("path", XMODELS, ids=lambda p: p.name)
def test_checker_finds_vai_c_programs_clean(path):
    for name, per in check_deps(path).items():
        rep = per["program"]
        assert rep.races_checked
        assert rep.ok, (name, rep.problems[:3], rep.races[:3])


def test_inspect_check_deps_on_an_xmodel(capsys):
    assert main(["inspect", str(XMODELS[0]), "--check-deps"]) == 0
    assert "races checked: ok" in capsys.readouterr().out
