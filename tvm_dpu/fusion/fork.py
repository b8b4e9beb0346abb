"""Fork chains (issue 36 item 3): a pointwise conv whose output several ops read, fused with one depthwise reader.

The search's vertical groups keep an intermediate map on chip only where one op reads it, so a 1x1 conv feeding
two branches (YOLOX's CSP block outputs, which feed the next stage's stride-2 depthwise conv and the FPN; its head
stems, which feed a regression and a classification branch) runs alone: it SAVEs its output and the depthwise conv
LOADs it straight back. vai_c keeps such a map in the banks for the reader that follows and SAVEs it for the
others. A fork chain does the same: the conv joins the group of one depthwise reader (pw_dw with a lone depthwise
conv, pw_dw_pw with a dw_pw group), the chain keeps the conv's rows in its circular buffer for the depthwise conv
and its strips also SAVE them (fused_chain's side SAVEs) for the other readers; the map's re-read is gone.

It is a plan choice costed on the timing model like fusion.residency's: after the search, per forking pointwise conv
alone in its group, each reader group it could join is compiled with its neighbouring groups and simulated
(`window`), and the fastest option wins, or within DDR_TIE of it the one moving the fewest DDR bytes (fusion.ddr's
rule, the option listed first, the plan as it is, winning a full tie).
"""
from __future__ import annotations

from typing import Callable

from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.fused import emittable
from tvm_dpu.codegen.fused_conv import is_pointwise
from tvm_dpu.fusion.cost import simulated_cost
from tvm_dpu.fusion.ddr import DdrBytes, prefer
from tvm_dpu.types import SINGLE, Group
from tvm_dpu.xgraph import ops as xops
from tvm_dpu.xgraph.graph import Graph

#: The group a fork conv and its reader's group become, by the reader group's template.
_JOINS = {SINGLE: "pw_dw", "dw_pw": "pw_dw_pw"}


def fork_options(graph: Graph, arch: Arch, groups: list[Group]) -> list[tuple[Group, list[tuple[Group, Group]]]]:
    """(the forking conv's group, [(a reader's group, the group both become)]) per pointwise conv alone in its
    group whose output two or more ops read (not a graph output), the readers being depthwise convs heading their
    groups (_JOINS); only joined groups that compile as one pipeline (`emittable`)."""
    owner = {n: g for g in groups for n in g.ops}
    readers = graph.readers()
    out = []
    for op in graph.ops:
        g = owner[op.name]
        if g.ops != (op.name,) or op.type != "conv2d" or xops.attr(op, "groups") != 1 or not is_pointwise(graph, op):
            continue
        t = op.outputs[0]
        if t in graph.outputs or len(set(readers.get(t, ()))) < 2:
            continue
        joins = []
        for r in dict.fromkeys(readers[t]):
            rg = owner[r]
            if graph.op(r).type != "depthwise_conv2d" or rg.ops[0] != r or rg.template not in _JOINS:
                continue
            new = Group(_JOINS[rg.template], (op.name, *rg.ops))
            if emittable(new, graph, arch):
                joins.append((rg, new))
        if joins:
            out.append((g, joins))
    return out


def with_forks(graph: Graph, arch: Arch, groups: list[Group],
               window: Callable[[list[Group]], float]) -> tuple[list[Group], int]:
    """`groups` with fork chains where the rule of the module docstring picks one; `window(groups)` is the simulated
    cycles of those groups compiled together. Returns the plan and the number of fork chains in it."""
    producer = {t: op.name for op in graph.ops for t in op.outputs}
    readers = graph.readers()
    ddr = DdrBytes(graph)
    plan = list(groups)
    chosen = 0
    for g, joins in fork_options(graph, arch, groups):
        # every option over the same ops: the conv, its candidate readers' groups and the groups next to them
        base = [g] + [rg for rg, _ in joins]
        members = {n for u in base for n in u.ops}
        of = {n: u for u in plan for n in u.ops}
        near = {producer[t] for n in members for t in graph.op(n).inputs if t in producer}
        near |= {m for n in members for t in graph.op(n).outputs for m in readers.get(t, ())}
        around = list({id(of[n]): of[n] for n in near - members}.values())
        for _, new in joins:
            simulated_cost(new, graph, arch)  # its fastest variant costed alone, which the windows then compile
        options = [base] + [[new] + [u for u in base[1:] if u is not rg] for rg, new in joins]
        pick = prefer([(i, window(around + gs), ddr.of(gs)) for i, gs in enumerate(options)])
        if pick:
            plan = [u for u in plan if all(u is not b for b in base)] + options[pick]
            chosen += 1
    return plan, chosen
