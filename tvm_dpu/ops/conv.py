"""Dense convolutions on the CONV engine: conv2d (groups 1, or grouped), its transposed form, and dense (a conv
whose kernel covers the whole input)."""
from __future__ import annotations

from tvm_dpu.ops import OpDef, OpSpec

#: Attributes every conv-class op has (pairs are (h, w); pads are [top, left, bottom, right]).
CONV_DEFAULTS = {"strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "groups": 1, "act": "none",
                 "alpha": None}
_WEIGHTS = {"params": ("weights",), "optional_params": ("bias",)}

CONV2D = OpDef(
    "conv2d", OpSpec(dict(CONV_DEFAULTS, in_slice=None), **_WEIGHTS),
    golden="golden_conv:eval_conv2d", float_ref="eval_conv2d", quant="quant_conv", fix_points="fp_conv",
    cost="conv_layer", work="conv_work", emitter="emit_conv_class", patterns=("dpu.conv2d",),
    relax_ops=("relax.nn.conv2d",), isa_emitters=(("DPUV3E", "dpuv3e_ops:emit_conv"),),
    doc="conv2d (groups 1 or grouped) with optional bias and fused act; a grouped one is checked per group")

# Costed alone as one ALU-style pass (the analytic model's conv formula covers conv2d and dense only); inside a
# fused group as a CONV-engine op. groups == C_in == C_out is
# the ALU's depthwise form, which the limits table checks as its own kind.
CONV2D_TRANSPOSE = OpDef(
    "conv2d_transpose", OpSpec(dict(CONV_DEFAULTS, output_padding=[0, 0]), **_WEIGHTS),
    golden="golden_conv:eval_conv2d_transpose", float_ref="eval_conv2d_transpose", quant="quant_conv",
    fix_points="fp_conv", cost="alu_layer", work="conv_work", emitter="emit_conv_class",
    limit_kinds=("depthwise_conv2d_transpose",), isa_emitters=(("DPUV3E", "dpuv3e_ops:emit_conv"),),
    patterns=("dpu.conv2d_transpose",), relax_ops=("relax.nn.conv2d_transpose",),
    doc="transposed conv as a stride-1 conv over the zero-inserted input; depthwise when groups == C")

DENSE = OpDef(
    "dense", OpSpec({"act": "none", "alpha": None, "in_slice": None}, **_WEIGHTS),
    golden="golden_conv:eval_dense", float_ref="eval_dense", quant="quant_conv", fix_points="fp_conv",
    cost="conv_layer", work="conv_work", emitter="emit_conv_class", patterns=("dpu.dense",),
    relax_ops=("relax.nn.conv2d", "relax.reshape"), isa_emitters=(("DPUV3E", "dpuv3e_ops:emit_conv"),),
    doc="inner product: a conv whose kernel is the whole input, output (N, O, 1, 1)")
