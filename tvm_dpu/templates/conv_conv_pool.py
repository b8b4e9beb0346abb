"""conv -> windowed conv -> 2x2 stride-2 pool, both intermediates on chip (codegen.fused_conv_conv_pool): VGG's
blocks, streamed in row strips."""
from __future__ import annotations

from tvm_dpu.templates import CONV, POOL, Pattern, TemplateDef, Tiling, v

# after conv_conv (20), so greedy groups as it did before this template existed wherever conv_conv is a candidate
# (greedy cannot tell where the strips' extra CONVs cost more than the DDR they save: VGG-16 greedy on B4096 took
# 713.7 instead of 715.5 GOPS at priority 15); the optimal search weighs both, split_check in context
CONV_CONV_POOL = TemplateDef(
    "conv_conv_pool", 25,
    Pattern("vertical", (v("conv1", CONV, "conv_plain", "single_consumer"),
                         v("conv2", CONV, "conv_plain", "single_consumer"), v("pool", POOL)),
            (("conv1", "conv2"), ("conv2", "pool"))),
    fits="fused_conv_conv_pool:group_fits", emitter="fused_conv_conv_pool:emit_group", cost="fused_cycles",
    variants="fused_conv_conv_pool:group_variants", relocated=True, split_check=True,
    tiling=Tiling(fit=False),  # as conv_conv: the search's bank model keeps a candidate its fit test refuses
    doc="conv feeding a windowed conv feeding a 2x2 stride-2 pool")
