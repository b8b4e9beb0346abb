"""Element-wise add and multiply on the ELEW engine."""
from __future__ import annotations

from tvm_dpu.ops import OpDef, OpSpec

ELTWISE_ADD = OpDef(
    "eltwise_add", OpSpec({"act": "none"}, n_inputs=(1, 4)),
    golden="tvm_dpu.xgraph.golden_misc:eval_eltwise",
    float_ref="tvm_dpu.xgraph.float_ref:eval_eltwise",
    quant="tvm_dpu.xgraph.ops:quant_eltwise",
    fix_points="tvm_dpu.quant.quantize:fp_free",
    cost="tvm_dpu.timing.analytic:alu_layer",
    emitter="tvm_dpu.codegen.compiler:emit_eltwise",
    patterns=("dpu.add",), relax_ops=("relax.add",),
    doc="1-4 inputs of equal shape, act none / relu")

ELTWISE_MUL = OpDef(
    "eltwise_mul", OpSpec({"act": "none"}, n_inputs=(2, 2)),
    golden="tvm_dpu.xgraph.golden_misc:eval_eltwise",
    float_ref="tvm_dpu.xgraph.float_ref:eval_eltwise",
    quant="tvm_dpu.xgraph.ops:quant_eltwise",
    fix_points="tvm_dpu.quant.quantize:fp_free",
    cost="tvm_dpu.timing.analytic:alu_layer",
    emitter="tvm_dpu.codegen.compiler:emit_eltwise",
    patterns=("dpu.mul",), relax_ops=("relax.multiply",),
    doc="2 inputs of equal shape, or a (N, C, 1, 1) channel gate broadcast over H x W")
