"""Dense convolutions on the CONV engine: conv2d (groups 1, or grouped), its transposed form, and dense (a conv
whose kernel covers the whole input)."""
from __future__ import annotations

from tvm_dpu.ops import OpDef, OpSpec

#: Attributes every conv-class op has (pairs are (h, w); pads are [top, left, bottom, right]).
CONV_DEFAULTS = {"strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "groups": 1, "act": "none",
                 "alpha": None}

CONV2D = OpDef(
    "conv2d", OpSpec(dict(CONV_DEFAULTS, in_slice=None), params=("weights",), optional_params=("bias",)),
    golden="tvm_dpu.xgraph.golden_conv:eval_conv2d",
    float_ref="tvm_dpu.xgraph.float_ref:eval_conv2d",
    quant="tvm_dpu.xgraph.ops:quant_conv",
    fix_points="tvm_dpu.quant.quantize:fp_conv",
    cost="tvm_dpu.timing.analytic:conv_layer",
    emitter="tvm_dpu.codegen.compiler:emit_conv_class",
    patterns=("dpu.conv2d",), relax_ops=("relax.nn.conv2d",),
    doc="conv2d (groups 1 or grouped) with optional bias and fused act; a grouped one is checked per group")

CONV2D_TRANSPOSE = OpDef(
    "conv2d_transpose", OpSpec(dict(CONV_DEFAULTS, output_padding=[0, 0]), params=("weights",),
                               optional_params=("bias",)),
    golden="tvm_dpu.xgraph.golden_conv:eval_conv2d_transpose",
    float_ref="tvm_dpu.xgraph.float_ref:eval_conv2d_transpose",
    quant="tvm_dpu.xgraph.ops:quant_conv",
    fix_points="tvm_dpu.quant.quantize:fp_conv",
    # costed as an ALU op: the analytic model has no transposed-conv formula (its conv formula is conv2d/dense)
    cost="tvm_dpu.timing.analytic:alu_layer",
    emitter="tvm_dpu.codegen.compiler:emit_conv_class",
    limit_kinds=("depthwise_conv2d_transpose",),  # groups == C_in == C_out: the ALU's depthwise form
    patterns=("dpu.conv2d_transpose",), relax_ops=("relax.nn.conv2d_transpose",),
    doc="transposed conv as a stride-1 conv over the zero-inserted input; depthwise when groups == C")

DENSE = OpDef(
    "dense", OpSpec({"act": "none", "alpha": None, "in_slice": None}, params=("weights",),
                    optional_params=("bias",)),
    golden="tvm_dpu.xgraph.golden_conv:eval_dense",
    float_ref="tvm_dpu.xgraph.float_ref:eval_dense",
    quant="tvm_dpu.xgraph.ops:quant_conv",
    fix_points="tvm_dpu.quant.quantize:fp_conv",
    cost="tvm_dpu.timing.analytic:conv_layer",
    emitter="tvm_dpu.codegen.compiler:emit_conv_class",
    patterns=("dpu.dense",), relax_ops=("relax.nn.conv2d", "relax.reshape"),
    doc="inner product: a conv whose kernel is the whole input, output (N, O, 1, 1)")
