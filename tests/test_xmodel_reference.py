"""The bar of issue 21 on every vendored xmodel: `tvm-dpu run` ends with no error, and an independent integer
reference computed from the op graph (tests/xmodel_reference.py) agrees bit for bit with vai_c's machine code on
the emulator, at every DPU subgraph output and at the model output."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from tvm_dpu.cli import main
from tvm_dpu.xmodel.runner import load_xmodel
from xmodel_reference import reference_values

DATA = Path(__file__).parent / "data" / "xmodel"
FILES = sorted(DATA.glob("*.xmodel"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_cli_run_ends_without_error(path, capsys):
    assert main(["run", str(path)]) == 0
    out = capsys.readouterr().out
    # the output line names the XIR op the output comes from (issue 25: names kept end to end)
    assert out.count("ended=True") == 2 and re.search(r"output 0 \(\S+\): shape \(1, 10\)", out)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_vai_c_code_on_the_emulator_matches_the_integer_reference(path):
    runner = load_xmodel(path)
    rng = np.random.default_rng(21)
    checked = varied = 0
    for k in range(4):
        # images as the example feeds them (pixels / 255 scaled, fix_point -2 -> steps of 4) and wider ranges that
        # saturate the input and exercise negative activations
        image = (rng.uniform(0, 1, (1, 28, 28, 1)) * (255 if k % 2 else 600) - (0 if k < 2 else 300))
        image = image.astype(np.float32)
        got = runner.run_values({"input_1": image})
        want = reference_values(runner.model, image)
        for prog in runner.programs.values():
            for t in prog.sub.outputs:
                assert got[t.op].dtype == np.int8
                np.testing.assert_array_equal(got[t.op], want[t.op], err_msg=f"{path.name} {t.op}")
                checked += got[t.op].size
        (final,) = runner.outputs
        np.testing.assert_array_equal(got[final.name], want[final.name])
        varied += len(np.unique(got[final.name])) > 1
    assert checked == 4 * (2 * 2 * 64 + 10)
    assert varied >= 2  # the comparison is not between constant (e.g. all-zero) outputs
