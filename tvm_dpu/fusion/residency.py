"""Choosing on-chip residency (codegen.resident): which linear chains of a fusion plan run as one resident chain.

A resident chain keeps its intermediate maps in the image banks; whether that is faster than the plan's own
groups depends on what it saves (SAVE/LOAD round trips, their latency in the engines' token chains) against
what it may lose (no DDR-side double buffering of the chain's input, whole-width CONVs). So it is a plan choice
costed on the timing model, like the templates: per maximal linear chain of the graph (each op the only consumer
of the previous one's output), the plan's groups lying inside it are the units; a shortest path over the unit
boundaries picks where resident chains replace runs of units (each candidate chain compiled alone and simulated,
`fusion.cost.cost`, in both emission orders: the registry's resident templates), and every chosen chain is then kept
only if the program around it is faster with it than with the units it replaces (`window`: the neighbouring
groups compiled together and simulated, as select._in_context does for the templates).
"""
from __future__ import annotations

from typing import Callable

import tvm_dpu.templates as tpl
from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.resident import consumer_counts, interior_rows, resident_fits
from tvm_dpu.fusion.cost import cost
from tvm_dpu.types import Group
from tvm_dpu.xgraph.graph import Graph

INF = float("inf")


def linear_chains(graph: Graph) -> list[list[str]]:
    """Maximal chains of ops in graph order where each op after the first reads exactly one feature map, the
    output of the op before it, which nothing else reads and which is not a graph output."""
    producer = {t: op for op in graph.ops for t in op.outputs}
    readers: dict[str, int] = {}
    for op in graph.ops:
        for t in set(op.inputs):
            readers[t] = readers.get(t, 0) + 1
    outputs = set(graph.outputs)
    prev: dict[str, str] = {}
    for op in graph.ops:
        feeds = [t for t in op.inputs if not graph.tensors[t].is_const]
        if len(feeds) == 1 and feeds[0] in producer and readers[feeds[0]] == 1 and feeds[0] not in outputs \
                and len(producer[feeds[0]].outputs) == 1:
            prev[op.name] = producer[feeds[0]].name
    nxt = {p: n for n, p in prev.items()}
    chains = []
    for op in graph.ops:
        if op.name in prev or op.name not in nxt:
            continue
        chain = [op.name]
        while chain[-1] in nxt:
            chain.append(nxt[chain[-1]])
        chains.append(chain)
    return chains


def _segments(chain: list[str], owner: dict[str, Group]) -> list[list[Group]]:
    """The runs of plan groups lying wholly inside `chain`, each group once, in chain order (a group reaching
    outside the chain cuts it)."""
    inside = set(chain)
    out: list[list[Group]] = [[]]
    seen: set[int] = set()
    for n in chain:
        g = owner[n]
        if not set(g.ops) <= inside:
            if out[-1]:
                out.append([])
            continue
        if id(g) not in seen:
            seen.add(id(g))
            out[-1].append(g)
    return [s for s in out if s]


def _best_cover(graph: Graph, arch: Arch, units: list[Group]) -> list[Group]:
    """The cheapest cover of `units` (consecutive plan groups of one chain) by themselves and resident chains of
    two or more ops (shortest path over the unit boundaries, candidates costed alone)."""
    k = len(units)
    # one graph, many candidate chains: op lookups, consumer counts and chain steps computed once, so the cover
    # costs the candidates' lengths, not the graph's size per candidate (a 300-conv chain took 20 minutes)
    by_name = {op.name: op for op in graph.ops}
    consumers = consumer_counts(graph)
    steps: dict = {}
    best = [0.0] + [INF] * k
    choice: list[tuple[int, Group | None]] = [(0, None)] * (k + 1)
    capacity = 2 * arch.bank_depth  # rows of the two image bank groups a chain's maps share
    for j in range(1, k + 1):
        c = best[j - 1] + cost(units[j - 1], graph, arch)
        if c < best[j]:
            best[j], choice[j] = c, (j - 1, None)
        floor = 0  # rows the chain's inner maps need at least: a longer chain (smaller i) needs more
        for i in range(j - 1, -1, -1):
            ops = tuple(n for u in units[i:j] for n in u.ops)
            for a, b in zip(ops[:len(units[i].ops)], ops[1:len(units[i].ops) + 1]):
                rows = interior_rows(arch, graph, by_name[a], by_name[b], steps)
                floor = capacity + 1 if rows is None else floor + rows
            if floor > capacity:
                break  # neither this chain nor any longer one fits (or one of its ops never can be resident)
            if len(ops) < 2 or (j - i == 1 and tpl.get(units[i].template).resident):
                continue
            if not resident_fits(arch, graph, [by_name[n] for n in ops], consumers, steps):
                continue
            for template in tpl.residents():  # both emission orders; the first wins a tie
                g = Group(template, ops)
                c = best[i] + cost(g, graph, arch)
                if c < best[j]:
                    best[j], choice[j] = c, (i, g)
    out: list[Group] = []
    j = k
    while j > 0:
        i, g = choice[j]
        out.append(g if g is not None else units[j - 1])
        j = i
    return out[::-1]


def with_residency(graph: Graph, arch: Arch, groups: list[Group],
                   window: Callable[[list[Group]], float]) -> tuple[list[Group], int]:
    """`groups` with runs of groups inside linear chains replaced by resident chains where the timing model says
    the program is faster (see the module docstring); `window(groups)` is the simulated cycles of those groups
    compiled together. Returns the plan and the number of resident chains in it."""
    owner = {n: g for g in groups for n in g.ops}
    producer = {t: op.name for op in graph.ops for t in op.outputs}
    readers = graph.readers()
    plan = list(groups)
    chosen = 0
    for chain in linear_chains(graph):
        for units in _segments(chain, owner):
            for g in _best_cover(graph, arch, units):
                if not tpl.get(g.template).resident or g in units:
                    continue
                replaced = [u for u in units if set(u.ops) <= set(g.ops)]
                near = {producer[t] for n in g.ops for t in graph.op(n).inputs if t in producer}
                near |= {m for n in g.ops for t in graph.op(n).outputs for m in readers.get(t, ())}
                of = {n: u for u in plan for n in u.ops}
                around = list({id(of[n]): of[n] for n in near - set(g.ops)}.values())
                if window(around + [g]) < window(around + replaced):
                    plan = [u for u in plan if not set(u.ops) <= set(g.ops)] + [g]
                    chosen += 1
    return plan, chosen
