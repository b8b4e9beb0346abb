"""A conv writing its rows straight into the row-fetch layout of an ALU consumer (codegen.fused_conv_pool): a max /
average pool (conv_pool) or a depthwise conv (pw_dw), through a circular buffer of VB1."""
from __future__ import annotations

from tvm_dpu.templates import CONV, DEPTHWISE, POOL, Pattern, TemplateDef, v

_HOOKS = dict(fits="fused_conv_pool:group_fits", emitter="fused_conv_pool:emit_group", cost="fused_cycles",
              relocated=True)

CONV_POOL = TemplateDef(
    "conv_pool", 10,
    Pattern("vertical", (v("conv", CONV, "conv_plain", "single_consumer"), v("pool", POOL)), (("conv", "pool"),)),
    **_HOOKS, variants="fused_conv_pool:group_variants", doc="conv feeding a pool")
PW_DW = TemplateDef(
    "pw_dw", 50,
    Pattern("vertical", (v("pw", CONV, "pointwise", "single_consumer"), v("dw", DEPTHWISE)), (("pw", "dw"),)),
    **_HOOKS, variants="fused_conv_pool:group_variants",  # a fork chain's tight tile (fusion.fork)
    doc="pointwise conv feeding a depthwise conv")
