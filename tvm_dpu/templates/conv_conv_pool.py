"""conv -> windowed conv -> 2x2 stride-2 pool, both intermediates on chip (codegen.fused_conv_conv_pool): VGG's
blocks, streamed in row strips."""
from __future__ import annotations

from tvm_dpu.templates import CONV, POOL, Pattern, TemplateDef, Tiling, v

# before conv_conv (20), so greedy takes the whole block where both fit; after conv_pool (10), which greedy reaches
# first only where the chain starts at the pool's conv
CONV_CONV_POOL = TemplateDef(
    "conv_conv_pool", 15,
    Pattern("vertical", (v("conv1", CONV, "conv_plain", "single_consumer"),
                         v("conv2", CONV, "conv_plain", "single_consumer"), v("pool", POOL)),
            (("conv1", "conv2"), ("conv2", "pool"))),
    fits="fused_conv_conv_pool:group_fits", emitter="fused_conv_conv_pool:emit_group", cost="fused_cycles",
    variants="fused_conv_conv_pool:group_variants", relocated=True, split_check=True,
    tiling=Tiling(fit=False),  # as conv_conv: the search's bank model keeps a candidate its fit test refuses
    doc="conv feeding a windowed conv feeding a 2x2 stride-2 pool")
