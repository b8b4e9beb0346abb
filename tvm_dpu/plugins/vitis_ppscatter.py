"""`PPScatterV2`, the custom operator of Vitis AI's PyTorch custom-op example (PointPillars), as a host runner for
vai_c .xmodel files: it scatters the pillar features onto the bird's-eye-view canvas. Inputs: features
(1, C, P, 1) and pillar coordinates (1, P, 4) as (batch, z, y, x); output (1, C, H, W), zero where no pillar lands.
As Vitis AI's reference implementation does, pillars are taken in order until the first one whose x is negative
(the padding of unused pillar slots), coordinates are truncated to integers, and a later pillar at the same cell
overwrites an earlier one. A coordinate outside the canvas is an error here (the reference would write out of
bounds). It claims nothing when compiling ONNX models."""
from __future__ import annotations

import numpy as np

from tvm_dpu.plugins.api import Plugin, PluginError
from tvm_dpu.plugins.registry import register_plugin


@register_plugin
class VitisPPScatter(Plugin):
    name = "vitis_ppscatter"
    device = "cpu"
    version = "1"
    cpu_ops = ("PPScatterV2",)

    def cpu(self, op_type, name, attrs, inputs, output_shape):
        if len(inputs) != 2:
            raise PluginError(f"PPScatterV2 op {name!r}: expected inputs (features, coords), got {len(inputs)}")
        feats, coords = (np.asarray(a, np.float32) for a in inputs)
        if len(output_shape) != 4 or feats.ndim != 4 or coords.ndim != 3 or coords.shape[2] < 4:
            raise PluginError(f"PPScatterV2 op {name!r}: shapes {feats.shape}, {coords.shape} -> {output_shape}")
        n, c, h, w = output_shape
        p = coords.shape[1]
        if n != 1 or feats.shape[:3] != (1, c, p):
            raise PluginError(f"PPScatterV2 op {name!r}: features {feats.shape} do not match {p} pillars of "
                              f"{c} channels in batch 1")
        xs = np.trunc(coords[0, :, 3]).astype(np.int64)
        ys = np.trunc(coords[0, :, 2]).astype(np.int64)
        stop = np.flatnonzero(xs < 0)
        used = int(stop[0]) if stop.size else p
        xs, ys = xs[:used], ys[:used]
        bad = np.flatnonzero((xs >= w) | (ys < 0) | (ys >= h))
        if bad.size:
            k = int(bad[0])
            raise PluginError(f"PPScatterV2 op {name!r}: pillar {k} at (y={ys[k]}, x={xs[k]}) is outside the "
                              f"{h}x{w} canvas")
        cell = ys * w + xs
        # the last pillar per cell wins, as in the reference's sequential loop
        last = len(cell) - 1 - np.unique(cell[::-1], return_index=True)[1]
        out = np.zeros((c, h * w), np.float32)
        out[:, cell[last]] = feats[0, :, :, 0][:, last]
        return out.reshape(output_shape)
