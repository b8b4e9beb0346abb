"""Nearest-neighbour upsampling by integer factors `scale` [sh, sw] (pixel replication, same fix_point in and
out)."""
from __future__ import annotations

from tvm_dpu.ops import OpDef, OpSpec

UPSAMPLE_NEAREST = OpDef(
    "upsample_nearest", OpSpec(required=("scale",)), golden="golden_misc:eval_upsample_nearest",
    float_ref="eval_upsample_nearest", quant="quant_upsample", fix_points="fp_upsample",
    cost="copy_layer", work="move_work",
    emitter="emit_upsample_op", patterns=("dpu.upsample",), relax_ops=("relax.image.resize2d",),
    # LOAD / SAVE only, with fields both instruction sets have: the DPUV2 emitter serves DPUV3E as it is
    isa_emitters=(("DPUV3E", "compiler:emit_upsample_op"),))
