"""Depthwise convolution (groups == C_in == C_out, multiplier 1), run on the ALU."""
from __future__ import annotations

from tvm_dpu.ops import OpDef, OpSpec
from tvm_dpu.ops.conv import CONV_DEFAULTS

# the conv2d pattern with groups == C == O; act none / relu / relu6
DEPTHWISE_CONV2D = OpDef(
    "depthwise_conv2d", OpSpec(dict(CONV_DEFAULTS), params=("weights",), optional_params=("bias",)),
    golden="golden_conv:eval_conv2d", float_ref="eval_conv2d", quant="quant_conv", fix_points="fp_conv",
    cost="depthwise_layer", work="depthwise_work", emitter="emit_conv_class", patterns=("dpu.conv2d",),
    relax_ops=("relax.nn.conv2d",), isa_emitters=(("DPUV3E", "dpuv3e_ops:emit_conv"),),
    doc="depthwise conv on the ALU (DPUV3E: on the DPTWISE engine, or as diagonal convs on CONV without one)")
