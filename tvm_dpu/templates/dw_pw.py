"""Depthwise then pointwise conv (codegen.fused_dw_pw): the depthwise output tile in VB1 is the pointwise conv's
input tile."""
from __future__ import annotations

from tvm_dpu.templates import CONV, DEPTHWISE, Pattern, TemplateDef, v

DW_PW = TemplateDef(
    "dw_pw", 40,
    Pattern("vertical", (v("dw", DEPTHWISE, "single_consumer"), v("pw", CONV, "pointwise")), (("dw", "pw"),)),
    fits="fused_dw_pw:group_fits", emitter="fused_dw_pw:emit_group",
    cost="dw_pw_cycles",  # the pointwise CONVs get the ALU's ALU_PP rows per tile, not PP
    relocated=True, doc="depthwise conv feeding a pointwise conv")
