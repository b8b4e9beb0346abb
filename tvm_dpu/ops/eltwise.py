"""Element-wise add (1-4 inputs of equal shape) and multiply (2 inputs: equal shapes, or a (N, C, 1, 1) channel
gate broadcast over H x W) on the ELEW engine, act none / relu."""
from __future__ import annotations

from tvm_dpu.ops import OpDef, OpSpec

ELTWISE_ADD, ELTWISE_MUL = (
    OpDef(kind, OpSpec({"act": "none"}, n_inputs=n_inputs), golden="golden_misc:eval_eltwise",
          float_ref="eval_eltwise", quant="quant_eltwise", fix_points="fp_free", cost="elew_layer",
          work="pass_work", emitter="emit_eltwise", patterns=(pattern,), relax_ops=(relax_op,),
          isa_emitters=isa)
    for kind, n_inputs, pattern, relax_op, isa in (
        ("eltwise_add", (1, 4), "dpu.add", "relax.add", (("DPUV3E", "dpuv3e_ops:emit_eltwise"),)),
        ("eltwise_mul", (2, 2), "dpu.mul", "relax.multiply", ())))  # the DPUV3E ELEW engine adds only
