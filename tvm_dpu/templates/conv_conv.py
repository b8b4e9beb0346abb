"""Two convs in a row (codegen.fused_conv_conv): a pointwise second conv reads the first's output tile in VB1, a
windowed one reads it from a circular buffer of rows."""
from __future__ import annotations

from tvm_dpu.templates import CONV, Pattern, TemplateDef, Tiling, v

CONV_CONV = TemplateDef(
    "conv_conv", 20,
    Pattern("vertical", (v("conv1", CONV, "conv_plain", "single_consumer"), v("conv2", CONV, "conv_plain")),
            (("conv1", "conv2"),)),
    fits="fused_conv_conv:group_fits", emitter="fused_conv_conv:emit_group", cost="fused_cycles", relocated=True,
    tiling=Tiling(fit=False),  # the search's bank model keeps a candidate its fit test refuses (accept drops it)
    doc="conv feeding a conv")
