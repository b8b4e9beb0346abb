"""One op alone: the group every op not in a fused template forms (types.SINGLE)."""
from __future__ import annotations

from tvm_dpu.templates import SINGLE, TemplateDef

_OWN = "one op alone is emitted by its op's emitter (tvm_dpu/ops/), never as a fused pipeline"

SINGLE_OP = TemplateDef(
    SINGLE, -1, pattern=None, fits=None, emitter=None, cost="fused_cycles", on_chip=False,
    missing={"fits": _OWN, "emitter": _OWN}, doc="one op on its own")
