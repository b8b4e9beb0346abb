"""Horizontal fusion (codegen.fused_hconv): convs sharing one input, each input tile loaded once for all of them."""
from __future__ import annotations

from tvm_dpu.templates import ANY, CONV, Pattern, TemplateDef, v

_SRC = v("src", ANY, member=False)
_HOOKS = dict(fits="fused_hconv:hconv_fits", emitter="fused_hconv:emit_group", cost="fused_cycles",
              on_chip=False)  # every member's output is a group output

HCONV2 = TemplateDef(
    "hconv2", 80,
    Pattern("horizontal", (_SRC, v("a", CONV, "conv_plain"), v("b", CONV, "conv_plain")), (("src", "a"), ("src", "b"))),
    **_HOOKS, doc="two convs reading one feature map")
HCONV3 = TemplateDef(
    "hconv3", 90,
    Pattern("horizontal", (_SRC, v("a", CONV, "conv_plain"), v("b", CONV, "conv_plain"), v("c", CONV, "conv_plain")),
            (("src", "a"), ("src", "b"), ("src", "c"))),
    **_HOOKS, doc="three convs reading one feature map")
