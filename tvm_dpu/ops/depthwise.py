"""Depthwise convolution (groups == C_in == C_out, multiplier 1), run on the ALU."""
from __future__ import annotations

from tvm_dpu.ops import OpDef, OpSpec
from tvm_dpu.ops.conv import CONV_DEFAULTS

DEPTHWISE_CONV2D = OpDef(
    "depthwise_conv2d", OpSpec(dict(CONV_DEFAULTS), params=("weights",), optional_params=("bias",)),
    golden="tvm_dpu.xgraph.golden_conv:eval_conv2d",
    float_ref="tvm_dpu.xgraph.float_ref:eval_conv2d",
    quant="tvm_dpu.xgraph.ops:quant_conv",
    fix_points="tvm_dpu.quant.quantize:fp_conv",
    cost="tvm_dpu.timing.analytic:alu_layer",
    emitter="tvm_dpu.codegen.compiler:emit_conv_class",
    patterns=("dpu.conv2d",), relax_ops=("relax.nn.conv2d",),  # the conv2d pattern with groups == C == O
    doc="depthwise conv on the ALU (act none / relu / relu6)")
