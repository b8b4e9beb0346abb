"""vai_c networks too large to vendor (> 1 MB), checked where a copy is at hand: set TVM_DPU_XMODELS to a directory
holding them (file names and sources in /work/scratch/xmodels/PROVENANCE.txt; the test skips a file it cannot find).

YOLOX-nano (Vitis AI model zoo, compiled by vai_c_xir 2.5 for the KV260 B4096 and B512 DPUs; from
iotengineer22/kv260-ubuntu-test, Apache-2.0): 83 conv2d-fix, 30 depthwise-conv2d-fix, 7 eltwise-fix, 16 concat-fix,
3 max pool-fix and 2 nearest upsample-fix ops in one DPU subgraph of 12148 (B4096) or 22475 (B512) instructions.
vai_c's code on the emulator must agree bit for bit with the independent integer reference at all three heads."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from tvm_dpu.xmodel.runner import load_xmodel
from xmodel_reference import reference_values

ROOT = Path(os.environ.get("TVM_DPU_XMODELS", "/work/scratch/xmodels"))
YOLOX = {"b4096": "yolox_nano_b4096_kv260-ubuntu-test_75f296b4ec8e95884c93db81778009db97cd788e.xmodel",
         "b512": "yolox_nano_b512_kv260-ubuntu-test_d8e11740a58a72e58df98e3defb08cf9a94f6a29.xmodel"}


@pytest.mark.slow
@pytest.mark.parametrize("arch", sorted(YOLOX))
def test_yolox_nano_matches_the_integer_reference(arch):
    path = ROOT / YOLOX[arch]
    if not path.is_file():
        pytest.skip(f"{path} not present (set TVM_DPU_XMODELS)")
    runner = load_xmodel(path)
    (dpu,) = runner.model.dpu_subgraphs()
    assert dpu.fingerprint == {"b4096": 0x0101000016010407, "b512": 0x0101000016010200}[arch]
    (inp,) = runner.inputs
    rng = np.random.default_rng(5)
    for image in (rng.uniform(0, 255, inp.shape), rng.normal(0, 40, inp.shape)):
        image = image.astype(np.float32)
        got = runner.run_values({inp.name: image})
        want = reference_values(runner.model, image)
        assert len(dpu.outputs) == 3
        for t in dpu.outputs:
            np.testing.assert_array_equal(got[t.op], want[t.op], err_msg=f"{arch} {t.op}")
            assert len(np.unique(got[t.op])) > 10
