"""Max and average pooling on the ALU (global average pooling is an avg_pool2d with global=True)."""
from __future__ import annotations

from tvm_dpu.ops import OpDef, OpSpec

_POOL_DEFAULTS = {"strides": [1, 1], "pads": [0, 0, 0, 0]}

MAX_POOL2D = OpDef(
    "max_pool2d", OpSpec(dict(_POOL_DEFAULTS), required=("kernel",)),
    golden="golden_pool:eval_max_pool2d", float_ref="eval_max_pool2d", quant="quant_maxpool",
    fix_points="fp_max_pool", cost="window_layer", work="window_work",
    emitter="emit_pool", patterns=("dpu.max_pool2d",), isa_emitters=(("DPUV3E", "dpuv3e_ops:emit_pool"),),
    relax_ops=("relax.nn.max_pool2d",), doc="window max (padding value -128)")

# global average pooling (kernel = input H x W) is checked against its own limits
AVG_POOL2D = OpDef(
    "avg_pool2d", OpSpec(dict(_POOL_DEFAULTS, kernel=None, count_include_pad=True, **{"global": False})),
    golden="golden_pool:eval_avg_pool2d", float_ref="eval_avg_pool2d", quant="quant_avgpool", fix_points="fp_avg_pool",
    cost="window_layer", work="window_work", emitter="emit_pool", limit_kinds=("global_avg_pool",),
    isa_emitters=(("DPUV3E", "dpuv3e_ops:emit_pool"),),
    patterns=("dpu.avg_pool2d", "dpu.global_avg_pool"), relax_ops=("relax.nn.avg_pool2d", "relax.mean"),
    doc="window mean; the DPU divides by kh*kw (count_include_pad semantics)")
