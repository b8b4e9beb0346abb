"""vai_c networks too large to vendor (> 1 MB), checked where a copy is at hand: set TVM_DPU_XMODELS to a directory
holding them (file names and sources in tests/data/xmodel/PUBLIC_NETWORKS.txt; the test skips a file it cannot find).

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

ROOT = Path(os.environ.get("TVM_DPU_XMODELS", "xmodels-not-vendored"))
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


PointPillars = "pointpillars_custom_op_zcu102_b1cf25b1dfb930f20eed5b30185d4d4ea5d74c1b.xmodel"


@pytest.mark.slow
def test_pointpillars_runs_end_to_end_with_the_shipped_ppscatter_plugin():
    """Vitis AI's PyTorch custom-op example (Xilinx/Vitis-AI, Apache-2.0): two DPU subgraphs (33068 and 20320
    instructions) around PPScatterV2 on the CPU, which the shipped vitis_ppscatter plugin supplies. No integer
    reference (transposed-conv2d-fix is not in it): this pins that the whole graph runs and the heads vary."""
    path = ROOT / PointPillars
    if not path.is_file():
        pytest.skip(f"{path} not present (set TVM_DPU_XMODELS)")
    runner = load_xmodel(path)
    rng = np.random.default_rng(0)
    coords = np.full((1, 12000, 4), -1, np.float32)
    coords[0, :3000, 2] = rng.integers(0, 496, 3000)
    coords[0, :3000, 3] = rng.integers(0, 432, 3000)
    feats = rng.normal(0, 1, (1, 12000, 100, 4)).astype(np.float32)
    outs = runner.run({"VoxelNet__input_0": feats, "VoxelNet__input_1": coords})
    assert [o.shape for o in outs] == [(1, 248, 216, 12), (1, 248, 216, 18), (1, 248, 216, 42)]
    assert all(len(np.unique(o)) > 10 for o in outs)
