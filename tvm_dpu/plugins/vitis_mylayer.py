"""`Mylayer`, the custom operator of Vitis AI's TensorFlow 2 custom-op example (`tf2_custom_op`), as a host runner
for vai_c .xmodel files: a PReLU, out = x where x >= 0, else x * alpha, with the alpha tensor (the op's second
input) repeated over the flattened input. Vitis AI registers it with VART as a CPU op; here a plugin's `cpu`
runner supplies it (docs/plugins.md, "XIR custom ops"). It claims nothing when compiling ONNX models."""
from __future__ import annotations

import numpy as np

from tvm_dpu.plugins.api import Plugin, PluginError
from tvm_dpu.plugins.registry import register_plugin


@register_plugin
class VitisMylayer(Plugin):
    name = "vitis_mylayer"
    device = "cpu"
    version = "1"
    cpu_ops = ("Mylayer",)

    def cpu(self, op_type, name, attrs, inputs, output_shape):
        if len(inputs) != 2:
            raise PluginError(f"Mylayer op {name!r}: expected inputs (x, alpha), got {len(inputs)}")
        x = np.asarray(inputs[0], np.float32).reshape(-1)
        alpha = np.asarray(inputs[1], np.float32).reshape(-1)
        if alpha.size == 0:
            raise PluginError(f"Mylayer op {name!r}: empty alpha")
        slope = np.resize(alpha, x.size)  # alpha[i % alpha.size], as Vitis AI's reference implementation indexes it
        return np.where(x >= 0, x, x * slope).reshape(output_shape)
