"""Concatenation (axis 1 in the code generator: inputs saved into channel slices of the output, requantized where
their fix_points differ)."""
from __future__ import annotations

from tvm_dpu.ops import OpDef, OpSpec

CONCAT = OpDef("concat", OpSpec({"axis": 1}, n_inputs=(1, 1 << 16)), golden="golden_misc:eval_concat",
               float_ref="eval_concat", quant="quant_concat", fix_points="fp_concat", cost="concat_layer",
               work="move_work", emitter="emit_concat", patterns=("dpu.concat",), relax_ops=("relax.concat",),
               isa_emitters=(("DPUV3E", "dpuv3e_ops:emit_concat"),))
