"""conv + add at the add's barrier (codegen.fused_conv_add): per output tile the CONVs leave the conv's result in
VB1, the add's other operand is loaded beside it, one ELEW adds them in place; the conv's output never reaches DDR."""
from __future__ import annotations

from tvm_dpu.templates import ADD, CONV, Pattern, TemplateDef, Tiling, v

CONV_ADD = TemplateDef(
    "conv_add", 30,
    Pattern("eltwise", (v("conv", CONV, "conv_plain", "single_consumer"), v("add", ADD, "add2")), (("conv", "add"),)),
    fits="fused_conv_add:group_fits", emitter="fused_conv_add:emit_group", cost="fused_cycles",
    variants="fused_conv_add:group_variants",
    tiling=Tiling(extra_outputs=1),  # the add's loaded operand beside the output tile
    doc="conv whose only consumer is a two-input add")
