"""Choosing the fusions: candidate groups from the template embeddings, and DNNVM Algorithm 2.

Modes:
* ``none``: every op alone; a concat copies each input into its slice (an honest baseline).
* ``greedy``: candidates in graph order (first member's position, then template order); the first that does
  not overlap an earlier pick wins, as GPP compilers do. Legal concats are fused into their producers' SAVEs.
* ``optimal``: Algorithm 2. Linear edges (a single-consumer output feeding a single-input op) split the graph
  into paths whose ends are barriers or touch them; inside a path the best split into vertical groups is a DAG
  shortest path (the Floyd of the paper, on a chain). The branch special cases live at the barriers: an
  eltwise add fused with the conv ending one of its input branches (which prunes that branch's tail), or convs
  sharing one input fused horizontally (which prunes the heads of their branches). Each barrier's options are
  enumerated with the branches' shortest paths recomputed (cached per path and pruned ends), barrier by
  barrier in graph order, repeated until no barrier changes its choice. If that ever costs more than greedy,
  the greedy plan is returned (counted in `FusionPlan.stats["fallback"]`). With the simulator as the cost source
  (the builder's), every region the searched plan groups differently from greedy is then settled in context
  (`_in_context`: both groupings simulated with their neighbouring groups), since candidates costed alone miss the
  stalls and overlaps at group boundaries (`stats["in_context"]` = regions regrouped as greedy).

Only feasible (tile_width) and profitable (cheaper than its members alone) candidates are kept, so every mode
is at least as fast as ``none`` in the cost model.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import tvm_dpu.templates as tpl
from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.compiler import compile_graph_fused, concat_fusions, order_groups
from tvm_dpu.codegen.fused import FUSED_EMITTERS, emittable
from tvm_dpu.errors import FusionError
from tvm_dpu.fusion.cost import (copy_cost, cost, cost_source, cost_source_name, group_variants, lone_program,
                                 piece_cycles, piece_key, tile_width)
from tvm_dpu.fusion.ddr import DdrBytes, prefer
from tvm_dpu.fusion.fork import with_forks
from tvm_dpu.fusion.isomorphism import all_embeddings
from tvm_dpu.fusion.opgraph import OpGraph
from tvm_dpu.fusion.residency import with_residency
from tvm_dpu.fusion.templates import TEMPLATES, Template
from tvm_dpu.types import SINGLE, CompiledSubgraph, FusionPlan, Group
from tvm_dpu.xgraph.graph import Graph

MODES = ("none", "greedy", "optimal")
INF = float("inf")


@dataclass
class Candidate:
    group: Group
    site: str  # the barrier whose special case it is ("" for vertical candidates)
    tile_width: int
    saving: float


def candidates(graph: Graph, arch: Arch, og: OpGraph | None = None,
               templates: tuple[Template, ...] = TEMPLATES,
               accept: Callable[[Group, Graph, Arch], bool] | None = None) -> list[Candidate]:
    """Feasible, profitable groups from all embeddings of `templates` (deduplicated: automorphic embeddings of a
    template give one group), in greedy priority order. `accept` may reject more groups (e.g. those the code
    generator cannot emit as one pipeline)."""
    og = og or OpGraph.of(graph)
    pos = {v: i for i, v in enumerate(og.order)}
    prio = {t.name: i for i, t in enumerate(TEMPLATES)}
    out: dict[tuple[str, tuple[str, ...]], Candidate] = {}
    embs = all_embeddings(og, templates)
    for t in templates:
        members_keys = [v.key for v in t.vertices if v.member]
        anchor = [v.key for v in t.vertices if not v.member]
        for m in embs[t.name]:
            members = tuple(sorted((m[k] for k in members_keys), key=pos.__getitem__))
            key = (t.name, members)
            if key in out:
                continue
            tw = tile_width(members, t.name, graph, arch)
            if tw is None:
                continue
            g = Group(t.name, members)
            if accept is not None and not accept(g, graph, arch):
                continue
            alone = sum(cost(Group(SINGLE, (n,)), graph, arch) for n in members)
            saving = alone - cost(g, graph, arch)
            if saving <= 0:
                continue
            site = m[anchor[0]] if anchor else (m["add"] if t.kind == "eltwise" else "")
            out[key] = Candidate(g, site, tw, saving)
    return sorted(out.values(), key=lambda c: (pos[c.group.ops[0]], prio[c.group.template]))


def plan_cost(groups: list[Group], concat_fused: frozenset[str], graph: Graph, arch: Arch) -> float:
    """Cycles of a plan in the cost model: its groups plus a copy per concat input not fused."""
    total = sum(cost(g, graph, arch) for g in groups)
    for op in graph.ops:
        if op.type == "concat":
            total += sum(copy_cost(graph, arch, t) for t in op.inputs if t not in concat_fused)
    return total


def _singles(graph: Graph, taken: set[str]) -> list[Group]:
    return [Group(SINGLE, (op.name,)) for op in graph.ops if op.name not in taken]


def _greedy(graph: Graph, cands: list[Candidate]) -> list[Group]:
    taken: set[str] = set()
    groups: list[Group] = []
    for c in cands:
        if taken.isdisjoint(c.group.ops):
            groups.append(c.group)
            taken.update(c.group.ops)
    return groups + _singles(graph, taken)


class _Search:
    """State of Algorithm 2 on one graph."""

    def __init__(self, graph: Graph, arch: Arch, og: OpGraph, cands: list[Candidate]):
        self.graph, self.arch, self.og = graph, arch, og
        self.paths = self._paths()
        self.path_of = {n: (i, k) for i, p in enumerate(self.paths) for k, n in enumerate(p)}
        self.vertical = {c.group.ops: c.group for c in cands if c.site == ""}
        self.sites: dict[str, list[Candidate]] = {}
        for c in cands:
            if c.site:
                self.sites.setdefault(c.site, []).append(c)
        pos = {v: i for i, v in enumerate(og.order)}
        self.site_order = sorted(self.sites, key=pos.__getitem__)
        self._pc: dict[tuple[int, bool, bool], tuple[float, list[Group]]] = {}
        self.ddr = DdrBytes(graph)

    def _paths(self) -> list[list[str]]:
        og = self.og
        nxt: dict[str, str] = {}
        has_prev: set[str] = set()
        for u in og.ops:
            s = og.succ[u]
            if len(s) == 1 and not og.is_graph_output(u) and og.pred[s[0]] == [u] and len(og.ops[s[0]].inputs) - \
                    sum(1 for t in og.ops[s[0]].inputs if og.graph.tensors[t].is_const) == 1:
                nxt[u] = s[0]
                has_prev.add(s[0])
        paths = []
        for u in og.ops:
            if u in has_prev:
                continue
            p = [u]
            while p[-1] in nxt:
                p.append(nxt[p[-1]])
            paths.append(p)
        return paths

    def path_cost(self, i: int, head: bool, tail: bool, whole: bool = False) -> tuple[float, list[Group]]:
        """Shortest execution path of path i with its head / tail op (or, `whole`, all its ops) taken by a barrier's
        special case."""
        if whole:
            return 0.0, []
        key = (i, head, tail)
        hit = self._pc.get(key)
        if hit is not None:
            return hit
        p = self.paths[i]
        lo, hi = (1 if head else 0), len(p) - (1 if tail else 0)
        if lo > hi:
            res: tuple[float, list[Group]] = (INF, [])
        else:
            seg = p[lo:hi]
            n = len(seg)
            best = [0.0] + [INF] * n
            choice: list[Group | None] = [None] * (n + 1)
            for j in range(1, n + 1):
                for i0 in range(j - 1, -1, -1):
                    ops = tuple(seg[i0:j])
                    g = Group(SINGLE, ops) if j - i0 == 1 else self.vertical.get(ops)
                    if g is None:
                        if j - i0 > 3:
                            break
                        continue
                    c = best[i0] + cost(g, self.graph, self.arch)
                    if c < best[j]:
                        best[j], choice[j] = c, g
            groups: list[Group] = []
            j = n
            while j > 0:
                g = choice[j]
                assert g is not None
                groups.append(g)
                j -= len(g.ops)
            res = (best[n], groups[::-1])
        self._pc[key] = res
        return res

    def claims_of(self, c: Candidate) -> list[tuple[int, int]]:
        """(path, end) pairs the special candidate takes: end 0 = head, 1 = tail, 2 = every op of the path (a
        chain ending at the barrier, pw_dw_pw_add's, must take its whole path: both ends and 2)."""
        out = []
        on_path: dict[int, int] = {}
        for n in c.group.ops:
            on_path[self.path_of[n][0]] = on_path.get(self.path_of[n][0], 0) + 1
        for n in c.group.ops:
            i, k = self.path_of[n]
            last = len(self.paths[i]) - 1
            if on_path[i] > 1:
                if on_path[i] != last + 1:
                    return []  # part of a path's middle: not a special case the search can take
                if k == 0:
                    out += [(i, 0), (i, 1), (i, 2)]
            elif k == 0 and (not tpl.get(c.group.template).at_barrier or n == c.site):
                out.append((i, 0))
            elif k == last:
                out.append((i, 1))
            else:
                return []  # not at a path end: not a special case the search can take
        return out

    def run(self, max_sweeps: int = 10) -> tuple[list[Group], int]:
        claim: dict[tuple[int, int], str] = {}
        chosen: dict[str, Candidate | None] = {s: None for s in self.site_order}
        claims = {id(c): self.claims_of(c) for cs in self.sites.values() for c in cs}
        sweeps = 0
        for sweeps in range(1, max_sweeps + 1):
            changed = False
            for s in self.site_order:
                cur = chosen[s]
                own = set(claims[id(cur)]) if cur is not None else set()
                affected = {p for p, _ in own}
                for c in self.sites[s]:
                    affected.update(p for p, _ in claims[id(c)])

                def total(opt: Candidate | None) -> tuple[float, list[Group]]:
                    """Cycles of option `opt` at this barrier and the groups it makes of the paths it touches."""
                    mine = set(claims[id(opt)]) if opt is not None else set()
                    if opt is not None and not mine:
                        return INF, []
                    tot = cost(opt.group, self.graph, self.arch) if opt is not None else 0.0
                    groups = [opt.group] if opt is not None else []
                    for p in affected:
                        ends = []
                        for e in (0, 1, 2):
                            other = claim.get((p, e))
                            if other == s:
                                other = None
                            if other is not None and (p, e) in mine:
                                return INF, []
                            ends.append(other is not None or (p, e) in mine)
                        c, gs = self.path_cost(p, *ends)
                        tot += c
                        groups += gs
                    return tot, groups

                # the fastest option, or within DDR_TIE of it the one moving the fewest DDR bytes (fusion.ddr)
                options = []
                for opt in [cur] + [o for o in [None, *self.sites[s]] if o is not cur]:
                    t, gs = total(opt)
                    options.append((opt, t, self.ddr.of(gs)))
                best_c = prefer(options)
                if best_c is not cur:
                    changed = True
                    for k in own:
                        claim.pop(k, None)
                    if best_c is not None:
                        for k in claims[id(best_c)]:
                            claim[k] = s
                    chosen[s] = best_c
            if not changed:
                break
        groups = [c.group for c in chosen.values() if c is not None]
        for i in range(len(self.paths)):
            groups.extend(self.path_cost(i, (i, 0) in claim, (i, 1) in claim, (i, 2) in claim)[1])
        return groups, sweeps


def plan_fusion(graph: Graph, arch: Arch, mode: str = "optimal", templates: tuple[str, ...] | None = None,
                accept: Callable[[Group, Graph, Arch], bool] | None = None, residency: bool = True) -> FusionPlan:
    """Choose the fusion groups of `graph` for `arch` in `mode` (none | greedy | optimal), using the templates
    named in `templates` (default: all of templates.TEMPLATES) and the groups `accept` lets through; with
    `residency`, runs of groups inside linear chains become resident chains where that is faster on the timing
    model (fusion.residency; not in mode none, the unfused baseline)."""
    if mode not in MODES:
        raise FusionError(f"fusion mode {mode!r} is not one of {', '.join(MODES)}")
    known = {t.name: t for t in TEMPLATES}
    if templates is not None:
        bad = [n for n in templates if n not in known]
        if bad:
            raise FusionError(f"unknown fusion template(s) {bad} (known: {', '.join(known)})")
    use = TEMPLATES if templates is None else tuple(t for t in TEMPLATES if t.name in templates)
    t0 = time.perf_counter()
    if mode == "none":
        # Every op on its own, with the concat aliases the unfused compiler (compile_graph) makes: concats are
        # memory planning, not kernel fusion, so the baseline must not pay copies the compiler never emits.
        groups = _singles(graph, set())
        cf: frozenset[str] = concat_fusions(graph)
        return FusionPlan(mode, groups, cf, plan_cost(groups, cf, graph, arch),
                          {"t_isomorphism": 0.0, "t_selection": time.perf_counter() - t0, "candidates": 0})
    og = OpGraph.of(graph)
    cands = candidates(graph, arch, og, use, accept)
    t1 = time.perf_counter()
    cf = concat_fusions(graph)
    greedy = _greedy(graph, cands)
    split = None
    if cost_source_name() == "simulate":
        # the split_check groups greedy takes kept only where faster in context, as in the optimal plan: greedy
        # takes a conv_conv_pool wherever no conv_conv starts at its first conv (VGG-16 on B4096: both the conv1
        # and conv2 blocks, where the optimal plan keeps conv1's), and the builder compiles every plan that differs
        greedy, split = _split_in_context(graph, arch, greedy, cands)
    greedy = order_groups(graph, greedy)
    g_cost = plan_cost(greedy, cf, graph, arch)
    stats = {"t_isomorphism": t1 - t0, "candidates": len(cands), "fallback": 0, "greedy_cost": g_cost}
    if mode == "greedy":
        if split is not None:
            stats["split_in_context"] = split
        groups = _resident(graph, arch, greedy, stats, residency)
        stats["t_selection"] = time.perf_counter() - t1
        return FusionPlan(mode, groups, cf, plan_cost(groups, cf, graph, arch), stats,
                          group_variants(graph, arch, groups))
    groups, sweeps = _Search(graph, arch, og, cands).run()
    if cost_source_name() == "simulate":
        groups, stats["in_context"] = _in_context(graph, arch, groups, greedy)
        groups, split = _split_in_context(graph, arch, groups, cands)
        if split is not None:
            stats["split_in_context"] = split
    groups = order_groups(graph, groups)
    o_cost = plan_cost(groups, cf, graph, arch)
    stats["sweeps"] = sweeps
    if o_cost > g_cost:
        groups, o_cost = greedy, g_cost
        stats["fallback"] = 1
    groups = _resident(graph, arch, groups, stats, residency)
    stats["t_selection"] = time.perf_counter() - t1
    # the fused groups' variants the search costed them in (conv_add tilings, pw_dw_pw orders), so a plan compiles
    # to the program its cost describes whoever compiles it
    return FusionPlan(mode, groups, cf, plan_cost(groups, cf, graph, arch), stats,
                      group_variants(graph, arch, groups))


def _resident(graph: Graph, arch: Arch, groups: list[Group], stats: dict, residency: bool) -> list[Group]:
    """`groups` with the resident chains (fusion.residency) that make the program faster, then the fork chains
    (fusion.fork) the timing model picks, in executable order; stats["resident"] and stats["forks"] count them
    (absent when there are none, so such a plan is the same as before)."""
    if not residency:
        return groups
    window = lambda gs: _window_cycles(graph, arch, gs)
    plan, n = with_residency(graph, arch, groups, window)
    plan, forks = with_forks(graph, arch, plan, window)
    if not n and not forks:
        return groups
    stats.update({k: v for k, v in (("resident", n), ("forks", forks)) if v})
    return order_groups(graph, plan)


def _regions(searched: list[Group], other: list[Group]) -> list[set[str]]:
    """The smallest op sets the two plans group differently, each closed under the groups of both plans (so
    either plan's grouping of one region can be swapped in independently of the others)."""
    of_s = {n: g for g in searched for n in g.ops}
    of_o = {n: g for g in other for n in g.ops}
    parent = {n: n for n in of_s}

    def find(n: str) -> str:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    differ = [n for n in of_s if of_s[n] != of_o[n]]
    for n in differ:
        for g in (of_s[n], of_o[n]):
            for m in g.ops:
                parent[find(m)] = find(n)
    regions: dict[str, set[str]] = {}
    for n in differ:
        regions.setdefault(find(n), set()).update(*(g.ops for g in (of_s[n], of_o[n])))
    return list(regions.values())


def _window_cycles(graph: Graph, arch: Arch, groups: list[Group]) -> float:
    """Simulated cycles of `groups` compiled together as one program (a plan's neighbourhood; pieces of one
    geometry are compiled once, fusion.cost.piece_cycles)."""
    return piece_cycles(graph, arch, groups)


class _Around:
    """The groups of a plan around a region of ops: those producing its inputs and consuming its outputs (the
    context a region's groupings are compiled in to compare them)."""

    def __init__(self, graph: Graph, plan: list[Group]):
        self.graph = graph
        self.producer = {t: op.name for op in graph.ops for t in op.outputs}
        self.readers: dict[str, list[str]] = {}
        for op in graph.ops:
            for t in op.inputs:
                self.readers.setdefault(t, []).append(op.name)
        self.of = {n: g for g in plan for n in g.ops}

    def __call__(self, region: set[str]) -> list[Group]:
        near: set[str] = set()
        for n in region:
            op = self.graph.op(n)
            near.update(self.producer[t] for t in op.inputs if t in self.producer)
            near.update(m for t in op.outputs for m in self.readers.get(t, ()))
        return list({id(self.of[n]): self.of[n] for n in near - region}.values())


def _splits(group: Group, cands: list[Candidate]) -> list[list[Group]]:
    """Every grouping of `group`'s ops into disjoint smaller candidates and single ops (at least one of them
    smaller than the group)."""
    region = set(group.ops)
    subs = [c.group for c in cands if set(c.group.ops) < region]
    out: list[list[Group]] = []

    def extend(i: int, taken: set[str], chosen: list[Group]) -> None:
        if i == len(subs):
            out.append(chosen + [Group(SINGLE, (n,)) for n in group.ops if n not in taken])
            return
        extend(i + 1, taken, chosen)
        if taken.isdisjoint(subs[i].ops):
            extend(i + 1, taken | set(subs[i].ops), chosen + [subs[i]])

    extend(0, set(), [])
    return out


def _split_in_context(graph: Graph, arch: Arch, groups: list[Group], cands: list[Candidate]
                      ) -> tuple[list[Group], int | None]:
    """`groups` with each group of a template marked `split_check` replaced by the fastest grouping of its ops into
    smaller candidates where that is faster in context (compiled with the plan's groups around it and simulated;
    the group is kept on a tie). Costed alone, such a group is compared with the sum of its parts costed alone,
    each of which pays a DDR round trip and idle engines that in the program overlap the neighbours' work; a
    conv_conv_pool's strips add CONVs that only the whole program shows whether its DDR savings repay (VGG-16's
    conv2 block on B4096: 1,476,959 cycles alone against 1,457,537 for conv2_1 and conv_pool). Returns the plan and
    how many groups were split (None: the plan has no such group)."""
    marked = [g for g in groups if tpl.get(g.template).split_check]
    if not marked:
        return groups, None
    around_of = _Around(graph, groups)
    plan, split = list(groups), 0
    for g in marked:
        around = around_of(set(g.ops))
        mine = _window_cycles(graph, arch, around + [g])
        best = min(((_window_cycles(graph, arch, around + alt), alt) for alt in _splits(g, cands)),
                   key=lambda t: t[0], default=(INF, []))
        if best[0] < mine:
            plan = [x for x in plan if x is not g] + best[1]
            split += 1
    return plan, split


def _in_context(graph: Graph, arch: Arch, searched: list[Group], greedy: list[Group]) -> tuple[list[Group], int]:
    """`searched` with each region it groups differently from `greedy` regrouped as greedy does where that is
    faster in context: both groupings of the region compiled with the searched plan's groups around it (the
    groups producing its inputs and consuming its outputs) and simulated. A candidate costed alone starts with
    idle engines and no pending SAVE; in the program it waits for its producer's SAVEs to complete (an op reading
    a map just saved starts a DDR round trip later) and its weight LOADs overlap the previous group's CONVs,
    so near ties between groupings (MobileNetV2's pw_dw + conv_add vs dw_pw + add) can flip. Returns the plan and
    the number of regions regrouped."""
    around_of = _Around(graph, searched)
    plan = list(searched)
    swapped = 0
    ddr = DdrBytes(graph)
    for region in _regions(searched, greedy):
        mine = [g for g in searched if set(g.ops) <= region]
        theirs = [g for g in greedy if set(g.ops) <= region]
        around = around_of(region)
        # the faster grouping in context, or within DDR_TIE the one moving fewer DDR bytes (fusion.ddr)
        options = [(grouping, _window_cycles(graph, arch, around + grouping), ddr.of(grouping))
                   for grouping in (mine, theirs)]
        if prefer(options) is theirs:
            plan = [g for g in plan if not set(g.ops) <= region] + theirs
            swapped += 1
    return plan, swapped


#: How the builder costs candidates: the timing simulator on each candidate's own program (the analytic model
#: does not see the extra CONVs of a fused emitter's smaller tiles, which the fitted CONV fill makes count;
#: benchmarks/bench_fusion.py's "opt/sim" column). Searching this way costs ResNet-50 about the same time.
BUILD_COST_SOURCE = "simulate"


def compile_with_fusion(graph: Graph, arch: Arch, mode: str = "optimal", keep_params: bool = True,
                        without: tuple[str, ...] = ()) -> tuple[CompiledSubgraph, FusionPlan]:
    """Plan (with the templates that have a fused emitter, but those named in `without`, so the plan's gains are
    the program's; candidates costed by BUILD_COST_SOURCE) and compile: the one call the builder needs for
    `fusion="none"|"greedy"|"optimal"`."""
    with cost_source(BUILD_COST_SOURCE):
        plan = plan_fusion(graph, arch, mode, tuple(t for t in FUSED_EMITTERS if t not in without), emittable)
    return compile_graph_fused(graph, arch, plan, keep_params), plan


# ---------------------------------------------------------------------------------------------------------
# Kernel polymorphism: an instruction-sequence variant per lone conv, chosen with the timing model
# ---------------------------------------------------------------------------------------------------------
def choose_conv_variants(graph: Graph, arch: Arch, plan: FusionPlan) -> FusionPlan:
    """`plan` (its fused groups' variants kept) with a variant (codegen.conv.CONV_VARIANTS) for every conv the
    plan leaves alone: each variant of the op compiled on its own and run on the timing simulator, the fewest
    cycles win (ties: the earlier variant, "wide" first; variants that emit the same instructions are timed once).
    `stats["conv_variants"]` says, per op with a real choice, the predicted cycles of each variant and which was
    chosen."""
    from dataclasses import replace

    from tvm_dpu.codegen.conv import CONV_VARIANTS
    from tvm_dpu.xgraph import ops as xops

    lone = {g.ops[0] for g in plan.groups if g.single}
    chosen = {n: v for n, v in plan.variants.items() if n not in lone}  # the fused groups' own (TemplateDef.variants)
    report: dict[str, dict] = {}
    timed: dict[tuple, dict[str, float]] = {}
    for g in plan.groups:
        if not g.single:
            continue
        op = graph.op(g.ops[0])
        if op.type not in ("conv2d", "dense", "conv2d_transpose") or xops.is_depthwise(op, graph):
            continue
        # Ops of the same geometry (a repeated block) compile alone to the same instructions up to their quantization
        # shifts and addresses, which no engine's timing depends on: time them once (fusion.cost.piece_key).
        geometry = piece_key(graph.extract(g.ops), [g]) or (op.name,)
        if geometry in timed:
            cycles = timed[geometry]
        else:
            cycles = timed[geometry] = _variant_cycles(graph, arch, g, op)
        if len(cycles) < 2:
            continue
        best = min(cycles, key=lambda v: (cycles[v], CONV_VARIANTS.index(v)))
        report[op.name] = {"chosen": best, "predicted_cycles": cycles,
                           "why": f"{best} is the fastest of {len(cycles)} distinct variants on the timing model "
                                  f"({cycles[best]:.0f} cycles vs {cycles['wide']:.0f} for wide)"}
        if best != "wide":
            chosen[op.name] = best
    return replace(plan, variants=chosen, stats={**plan.stats, "conv_variants": report})


def _variant_cycles(graph: Graph, arch: Arch, g: Any, op: Any) -> dict[str, float]:
    """Predicted cycles of each distinct variant of the lone conv `op` (group `g`) compiled on its own."""
    from tvm_dpu.codegen.conv import CONV_VARIANTS
    from tvm_dpu.codegen.tiling import CodegenError
    from tvm_dpu.timing.simulate import cycles as program_cycles

    sub = graph.extract(g.ops)
    cycles: dict[str, float] = {}
    seen: set[bytes] = set()
    for v in CONV_VARIANTS:
        # the default variant's program is the op's own piece when the search costed it (fusion.cost)
        code = lone_program(graph, arch, op.name) if v == "wide" else None
        try:
            if code is None:
                code = compile_graph_fused(sub, arch, FusionPlan("variant", [g], variants={op.name: v}),
                                           keep_params=False).code
        except CodegenError:
            continue  # a variant whose tiles do not fit is no candidate
        if code.tobytes() in seen:
            continue  # the same instructions as an earlier variant (e.g. one column tile: narrow == wide)
        seen.add(code.tobytes())
        cycles[v] = program_cycles(code, arch)
    return cycles


def compile_with_variants(graph: Graph, arch: Arch, plan: FusionPlan, compiled: CompiledSubgraph
                          ) -> tuple[CompiledSubgraph, FusionPlan]:
    """`compiled` (graph compiled with `plan`) recompiled with the conv variants of `choose_conv_variants`, kept
    only when the whole program is faster on the timing simulator (the per-op choice is made on each op alone);
    `stats["conv_variants_kept"]` says whether it was."""
    from dataclasses import replace

    from tvm_dpu.timing.simulate import cycles as program_cycles

    with_variants = choose_conv_variants(graph, arch, plan)
    if with_variants.variants == plan.variants:
        with_variants.stats["conv_variants_kept"] = False
        return compiled, with_variants
    candidate = compile_graph_fused(graph, arch, with_variants)
    if program_cycles(candidate.code, arch) < program_cycles(compiled.code, arch):
        with_variants.stats["conv_variants_kept"] = True
        return candidate, with_variants
    return compiled, replace(with_variants, variants=dict(plan.variants),
                             stats={**with_variants.stats, "conv_variants_kept": False})
