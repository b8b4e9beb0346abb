"""The shipped vitis_ppscatter plugin (PointPillars' PPScatterV2 custom op of Vitis AI's PyTorch example) against
a plain per-pillar loop written from the op's description, and its refusals."""
from __future__ import annotations

import numpy as np
import pytest

from tvm_dpu.plugins import PluginError, registry


def _loop(feats, coords, shape):
    """Vitis AI's reference semantics, pillar by pillar."""
    out = np.zeros(shape, np.float32)
    for n in range(coords.shape[1]):
        x, y = int(coords[0, n, 3]), int(coords[0, n, 2])
        if x < 0:
            break
        out[0, :, y, x] = feats[0, :, n, 0]
    return out


def _plugin():
    return registry.plugin_for_cpu_op("PPScatterV2")


def test_shipped_and_found_by_op_type():
    assert _plugin().name == "vitis_ppscatter"


@pytest.mark.parametrize("seed", range(4))
def test_matches_the_pillar_loop(seed):
    rng = np.random.default_rng(seed)
    c, p, h, w = 5, 40, 7, 9
    feats = rng.normal(size=(1, c, p, 1)).astype(np.float32)
    coords = np.zeros((1, p, 4), np.float32)
    coords[0, :, 2] = rng.integers(0, h, p)
    coords[0, :, 3] = rng.integers(0, w, p) + rng.uniform(0, 0.9, p)  # truncated to the cell
    coords[0, 30:, 3] = -1  # unused pillar slots end the list ...
    coords[0, 35, 3] = 2  # ... even if a later slot looks valid
    got = _plugin().cpu("PPScatterV2", "scatter", {}, [feats, coords], (1, c, h, w))
    want = _loop(feats, coords, (1, c, h, w))
    np.testing.assert_array_equal(got, want)
    assert np.count_nonzero(got.any(axis=1)) > 10  # several cells written, duplicates among 30 pillars in 63 cells


def test_refuses_coordinates_outside_the_canvas_and_bad_shapes():
    feats = np.ones((1, 2, 3, 1), np.float32)
    coords = np.array([[[0, 0, 1, 1], [0, 0, 4, 0], [0, 0, 0, 0]]], np.float32)
    with pytest.raises(PluginError, match=r"pillar 1 at \(y=4, x=0\) is outside the 4x4 canvas"):
        _plugin().cpu("PPScatterV2", "scatter", {}, [feats, coords], (1, 2, 4, 4))
    with pytest.raises(PluginError, match="do not match 3 pillars of 5 channels"):
        _plugin().cpu("PPScatterV2", "scatter", {}, [feats, coords], (1, 5, 4, 4))
    with pytest.raises(PluginError, match="expected inputs"):
        _plugin().cpu("PPScatterV2", "scatter", {}, [feats], (1, 2, 4, 4))
