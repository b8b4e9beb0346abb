"""Resident chains (codegen.resident): a linear chain of any length >= 2 with every intermediate map kept in the
image banks. Not matched by a pattern: fusion.residency finds the chains and costs both emission orders on the
timing simulator (the first wins a tie)."""
from __future__ import annotations

from tvm_dpu.templates import TemplateDef

_HOOKS = dict(pattern=None, fits="resident:resident_fits", cost=None, resident=True,
              missing={"cost": "no analytic model: a resident chain's gain is latency and overlap, which only the "
                               "timing simulator sees"})

#: Each op's units emitted as soon as the rows they read are, consumers first.
RESIDENT = TemplateDef("resident", 100, emitter="resident:emit_group", **_HOOKS,
                       doc="resident chain, units emitted as their rows are ready")
#: Conv after conv, the order of vai_c's programs (codegen.resident.emit_resident's `seq`).
RESIDENT_SEQ = TemplateDef("resident_seq", 110, emitter="resident:emit_group_seq", **_HOOKS,
                           doc="resident chain, each conv after every earlier op")
