"""Nearest-neighbour upsampling by integer factors (pixel replication, same fix_point in and out)."""
from __future__ import annotations

from tvm_dpu.ops import OpDef, OpSpec

UPSAMPLE_NEAREST = OpDef(
    "upsample_nearest", OpSpec(required=("scale",)),
    golden="tvm_dpu.xgraph.golden_misc:eval_upsample_nearest",
    float_ref="tvm_dpu.xgraph.float_ref:eval_upsample_nearest",
    quant="tvm_dpu.xgraph.ops:quant_upsample",
    fix_points="tvm_dpu.quant.quantize:fp_upsample",
    cost="tvm_dpu.timing.analytic:alu_layer",
    emitter="tvm_dpu.codegen.compiler:emit_upsample_op",
    patterns=("dpu.upsample",), relax_ops=("relax.image.resize2d",),
    doc="scale [sh, sw] (integers)")
