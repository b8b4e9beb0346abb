"""Max and average pooling on the ALU (global average pooling is an avg_pool2d with global=True)."""
from __future__ import annotations

from tvm_dpu.ops import OpDef, OpSpec

_POOL_DEFAULTS = {"strides": [1, 1], "pads": [0, 0, 0, 0]}

MAX_POOL2D = OpDef(
    "max_pool2d", OpSpec(dict(_POOL_DEFAULTS), required=("kernel",)),
    golden="tvm_dpu.xgraph.golden_pool:eval_max_pool2d",
    float_ref="tvm_dpu.xgraph.float_ref:eval_max_pool2d",
    quant="tvm_dpu.xgraph.ops:quant_maxpool",
    fix_points="tvm_dpu.quant.quantize:fp_max_pool",
    cost="tvm_dpu.timing.analytic:alu_layer",
    emitter="tvm_dpu.codegen.compiler:emit_pool",
    patterns=("dpu.max_pool2d",), relax_ops=("relax.nn.max_pool2d",),
    doc="window max (padding value -128)")

AVG_POOL2D = OpDef(
    "avg_pool2d", OpSpec(dict(_POOL_DEFAULTS, kernel=None, count_include_pad=True, **{"global": False})),
    golden="tvm_dpu.xgraph.golden_pool:eval_avg_pool2d",
    float_ref="tvm_dpu.xgraph.float_ref:eval_avg_pool2d",
    quant="tvm_dpu.xgraph.ops:quant_avgpool",
    fix_points="tvm_dpu.quant.quantize:fp_free",
    cost="tvm_dpu.timing.analytic:alu_layer",
    emitter="tvm_dpu.codegen.compiler:emit_pool",
    limit_kinds=("global_avg_pool",),  # kernel = input H x W, checked against its own limits
    patterns=("dpu.avg_pool2d", "dpu.global_avg_pool"), relax_ops=("relax.nn.avg_pool2d", "relax.mean"),
    doc="window mean; the DPU divides by kh*kw (count_include_pad semantics)")
