"""Whether a fusion group fits its template's fused emitter on an arch, and the emission variants worth timing.

Each template names its fit test and variants in the template registry (tvm_dpu/templates/), as functions of this
package (the fused_*.py modules and resident.py); this module resolves them. The fused compiler
(compiler.compile_graph_fused) emits a group as one pipeline when `emittable`, else member by member; the fusion
search asks the same question to keep only plans whose gains the program realises."""
from __future__ import annotations

import tvm_dpu.templates as tpl
from tvm_dpu.arch.arch import Arch
from tvm_dpu.types import Group
from tvm_dpu.xgraph.graph import Graph

#: Templates with a fused emitter that the search matches (the resident chains are chosen by fusion.residency).
FUSED_EMITTERS = tuple(d.name for d in tpl.matched() if d.fused)


def emittable(group: Group, graph: Graph, arch: Arch) -> bool:
    """Whether `group` compiles to one fused pipeline on `arch` (else it is emitted member by member)."""
    if tpl.get(group.template).fits is None:
        return False
    return bool(tpl.hook(group.template, "fits")(arch, graph, [graph.op(n) for n in group.ops]))


def variants_of(group: Group, graph: Graph, arch: Arch) -> tuple[str, ...]:
    """The emission variants of `group` that give different programs ("wide", the default, first); one when its
    template has no variants."""
    if tpl.get(group.template).variants is None:
        return ("wide",)
    return tuple(tpl.hook(group.template, "variants")(arch, graph, [graph.op(n) for n in group.ops]))
