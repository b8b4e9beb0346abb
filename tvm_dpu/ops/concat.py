"""Channel concatenation (inputs saved into channel slices of the output, requantized where fix_points differ)."""
from __future__ import annotations

from tvm_dpu.ops import OpDef, OpSpec

CONCAT = OpDef(
    "concat", OpSpec({"axis": 1}, n_inputs=(1, 1 << 16)),
    golden="tvm_dpu.xgraph.golden_misc:eval_concat",
    float_ref="tvm_dpu.xgraph.float_ref:eval_concat",
    quant="tvm_dpu.xgraph.ops:quant_concat",
    fix_points="tvm_dpu.quant.quantize:fp_concat",
    cost="tvm_dpu.timing.analytic:alu_layer",
    emitter="tvm_dpu.codegen.compiler:emit_concat",
    patterns=("dpu.concat",), relax_ops=("relax.concat",),
    doc="concatenation along axis 1 (the code generator; the XGraph allows axes 1-3)")
