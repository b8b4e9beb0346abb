"""Branch concurrency at compile time: cut one DPU subgraph's quantized XGraph into segments, compile each as a
program of its own and list-schedule them on the cores of the arch (timing/multicore.py).

Segments are maximal chains of the fusion plan's groups: a group joins its predecessor's segment when it is that
predecessor's only consumer and reads from no other group, so the branches of an Inception block, a ResNet
shortcut conv and independent sub-networks become separate segments, and a fused group is never cut. Each
segment is `Graph.extract(members)` compiled by `compile_subgraph`: tensors are shared, so fix points carry over
and a segment computes exactly what the ops compute in the whole program (bit-identical). The segments kept are
linked over one shared DDR region (codegen/relocate.py): each tensor they hand each other has a slot there at an
offset fixed here, the producer saves into it and the consumers load from it, with no host copy between them.

Cutting costs DPU work (a segment saves what the next one loads again, and fusion across a cut is lost), so the
schedule is kept only when the timing model predicts it beats the whole program on one core; otherwise the
partition stays one program and `MulticoreInfo.used` is False with the reason.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.compiler import group_dependencies
from tvm_dpu.codegen.relocate import link_segments
from tvm_dpu.errors import DPUError
from tvm_dpu.security.program_blob import Multicore, Segment
from tvm_dpu.timing.multicore import (HOST_DISPATCH_S, coalesce, contention_cycles, list_schedule,
                                      topological_order)
from tvm_dpu.timing.host import load_host_cost
from tvm_dpu.timing.simulate import simulate
from tvm_dpu.types import REG_SHARED


@dataclass
class MulticoreInfo:
    """What the multi-core scheduling of one partition decided (for report.json)."""

    cores: int
    used: bool
    reason: str
    single_cycles: float
    multi_cycles: float
    contention_free_cycles: float
    segments: list[dict] = field(default_factory=list)
    split_convs: list[str] = field(default_factory=list)  # convs cut over their output channels
    shared_bytes: int = 0  # the shared feature-map region the linked segments address (REG_SHARED)

    def to_json(self) -> dict:
        return {"cores": self.cores, "used": self.used, "reason": self.reason, "split_convs": self.split_convs,
                "shared_region_bytes": self.shared_bytes,
                "predicted_cycles": {"cores_1": self.single_cycles, f"cores_{self.cores}": self.multi_cycles,
                                     "contention_free": self.contention_free_cycles},
                "segments": self.segments}


def check_cores(cores: int, arch: Arch) -> int:
    """`cores` as an int in [1, arch.cores]; DPUError naming the arch otherwise."""
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        raise DPUError(f"cores={cores!r}: expected a positive number of DPU cores")
    if cores > arch.cores:
        raise DPUError(f"cores={cores}: {arch.name} has {arch.cores} DPU core{'s' if arch.cores != 1 else ''}; "
                       f"choose cores between 1 and {arch.cores} (a board preset such as zcu102 has 3)")
    return cores


def segment_members(graph: Any, plan: Any) -> list[list[str]]:
    """Op names of each segment (maximal chains of the plan's groups), segments in topological order."""
    _, first, preds = group_dependencies(graph, plan.groups)
    succs: dict[int, set[int]] = {gi: set() for gi in preds}
    for gi, ps in preds.items():
        for p in ps:
            succs[p].add(gi)
    # Topological order of the groups (a fused group may read a group whose first op comes after its own first
    # op, e.g. conv+add reading the shortcut), ties by first op position.
    order = topological_order([sorted(preds[gi]) for gi in range(len(plan.groups))], key=first.get)
    if order is None:
        raise DPUError(f"graph {graph.name!r}: the fusion plan's groups depend on each other in a cycle")
    segment_of: dict[int, int] = {}
    segments: list[list[int]] = []
    for gi in order:
        (p,) = preds[gi] if len(preds[gi]) == 1 else (None,)
        if p is not None and succs[p] == {gi}:
            segment_of[gi] = segment_of[p]
            segments[segment_of[p]].append(gi)
        else:
            segment_of[gi] = len(segments)
            segments.append([gi])
    members = [{op for gi in seg for op in plan.groups[gi].ops} for seg in segments]
    return [[op.name for op in graph.ops if op.name in m] for m in members]


#: When a partition keeps its segments: "auto" merges segments that gain nothing from running apart
#: (timing.multicore.coalesce) and keeps them when the schedule is predicted faster than one program on one core;
#: "always" keeps the finest cut whenever it has two or more segments (to measure the runtime, or test it on
#: small models).
SEGMENT_POLICIES = ("auto", "always")


#: Split the convs the plan leaves alone that take at least these shares of the one-core cycles (each a
#: candidate segmentation; no split is always a candidate too).
SPLIT_SHARES = (0.05, 0.02)


def split_convs(graph: Any, names: dict[str, int], ocp: int) -> Any:
    """`graph` with each conv2d in `names` (op name -> parts) replaced by convs over slices of its output channels
    (OCP-aligned, weights and biases sliced, same attributes and fix points) and a concat of their outputs into
    the op's output tensor: the parts are independent work for several cores, and each output channel is computed
    exactly as before (a channel's arithmetic depends only on its own weights and the shared fix points)."""
    from tvm_dpu.xgraph.graph import Graph, Op, Tensor
    from tvm_dpu.xgraph.validate import validate_graph

    out = Graph(graph.name, dict(graph.tensors), [], list(graph.inputs), list(graph.outputs))
    for op in graph.ops:
        k = names.get(op.name, 1)
        if k < 2:
            out.ops.append(op)
            continue
        y = graph.tensors[op.outputs[0]]
        cout = y.shape[1]
        step = -(-(-(-cout // k)) // ocp) * ocp  # ceil(cout / k) rounded up to whole output-channel groups
        parts = []
        for c0 in range(0, cout, step):
            n = min(step, cout - c0)
            params = {}
            for role, tname in op.params.items():
                t = graph.tensors[tname]
                if role in ("weights", "bias"):
                    name = f"{tname}@{c0}"
                    out.tensors[name] = Tensor(name, (n,) + t.shape[1:], t.dtype, t.fix_point, t.data[c0:c0 + n])
                    params[role] = name
                else:
                    params[role] = tname
            part = f"{y.name}@{c0}"
            out.tensors[part] = Tensor(part, (1, n) + y.shape[2:], y.dtype, y.fix_point)
            out.ops.append(Op(f"{op.name}@{c0}", op.type, list(op.inputs), [part], dict(op.attrs), params,
                              list(op.source)))
            parts.append(part)
        out.ops.append(Op(f"{op.name}@concat", "concat", parts, [y.name], {"axis": 1}, {}, list(op.source)))
    validate_graph(out)
    return out


def _split_candidates(graph: Any, whole: Any, plan: Any, arch: Arch, cores: int) -> list[dict[str, int]]:
    """Sets of convs to split into `cores` parts (op name -> parts), one per share of SPLIT_SHARES: the convs
    (conv2d of one group or dense, at least `cores` output-channel groups) of the plan's groups that are a lone
    conv or a chain of nothing but convs (a resident classifier such as AlexNet's fc6-fc8), whose group's cycles on
    the timing model take at least that share of the partition's one-core cycles. Distinct, non-empty sets only.

    A classifier's weights, streamed once per call, are often the longest serial stretch of a network (fGrain
    splits AlexNet's fc layers over its virtual FPGAs): split over the cores, each streams a third of them."""
    from tvm_dpu.xgraph import ops as xops

    timing = simulate(whole.code, arch, op_ranges=whole.op_ranges)
    # the timing model names a fused group's range by its members joined with "+": each member takes its group's
    cycles = {n: o.cycles for o in timing.ops for n in o.name.split("+")}

    def splittable(name: str) -> bool:
        op = graph.op(name)
        whole_conv = op.type == "dense" or (op.type == "conv2d" and xops.attr(op, "groups") == 1)
        return whole_conv and graph.tensors[op.outputs[0]].shape[1] >= cores * arch.ocp

    ok = [n for g in plan.groups if all(splittable(n) for n in g.ops) for n in g.ops]
    out: list[dict[str, int]] = []
    for share in SPLIT_SHARES:
        chosen = {n: cores for n in ok if cycles.get(n, 0.0) >= share * timing.cycles}
        if chosen and chosen not in out:
            out.append(chosen)
    return out


def _split_plan(plan: Any, split: dict[str, int], graph: Any) -> Any:
    """`plan` for the graph after `split_convs`: a group with a split member is dissolved (its parts no longer form
    its chain), and every op no group keeps (the parts, their concats, a dissolved group's others) is a group of its
    own."""
    from tvm_dpu.types import SINGLE, FusionPlan, Group

    groups = [g for g in plan.groups if not any(n in split for n in g.ops)]
    known = {n for g in groups for n in g.ops}
    groups += [Group(SINGLE, (op.name,)) for op in graph.ops if op.name not in known]
    return FusionPlan(plan.mode, groups)


def _compile_segments(symbol: str, graph: Any, members: list[list[str]], arch: Arch, cores: int, fusion: str,
                      compile_fn: Any, known: dict[int, tuple[Any, list[float]]]
                      ) -> tuple[list[Any], list[list[int]], list[list[float]]]:
    """(compiled segments, their dependencies, their cycles for 1..cores active cores); `known[i]` gives segment
    i's (compiled, cycles) when it is already compiled."""
    compiled, cycles = [], []
    for i, ops in enumerate(members):
        if i in known:
            c, cyc = known[i]
        else:
            c = compile_fn(graph.extract(ops, f"{symbol}.seg{i}"), arch, fusion)[0]
            cyc = contention_cycles(c.code, arch, cores)
        compiled.append(c)
        cycles.append(cyc)
    producer = {b.name: i for i, c in enumerate(compiled) for b in c.outputs}
    deps = [sorted({producer[b.name] for b in c.inputs if b.name in producer}) for c in compiled]
    return compiled, deps, cycles


def compile_multicore(symbol: str, graph: Any, whole: Any, plan: Any, arch: Arch, cores: int, fusion: str,
                      compile_fn: Any, policy: str = "auto") -> tuple[Multicore | None, MulticoreInfo]:
    """Segments of `graph` (compiled by `compile_fn(graph, arch, fusion) -> (CompiledSubgraph, plan)`) scheduled
    on `cores` cores, or None when one program on one core is predicted to be as fast and `policy` is "auto"
    (`whole`: the partition compiled as one program). Returns (what the program blob carries, the decision for
    the report)."""
    single = simulate(whole.code, arch).cycles
    # Candidates: the chains of the plan's groups, and the same after splitting the heaviest lone convs into
    # `cores` parts over their output channels; the shortest predicted schedule wins.
    candidates = [(graph, plan, {})]
    for split in _split_candidates(graph, whole, plan, arch, cores):
        g2 = split_convs(graph, split, arch.ocp)
        candidates.append((g2, _split_plan(plan, split, g2), split))
    # each segment costs the host a dispatch (the host cost model, timing/host.py; the dispatches add up: one host
    # thread runs Python at a time), so candidates compete on their schedule with that charged: a finer cut must
    # save more DPU time than its extra segments cost
    charge = load_host_cost().segment_seconds() * arch.freq_mhz * 1e6
    best = None
    for g, p, split in candidates:
        members = segment_members(g, p)
        if len(members) < 2:
            continue
        compiled, deps, cycles = _compile_segments(symbol, g, members, arch, cores, fusion, compile_fn, {})
        # Fewer, longer segments where the schedule allows it (timing.multicore.coalesce), then compiled again;
        # segments="always" keeps the finest cut (it exists to exercise and measure the runtime).
        groups = coalesce(cycles, deps, cores, saving=HOST_DISPATCH_S * arch.freq_mhz * 1e6) \
            if policy == "auto" else [[i] for i in range(len(members))]
        if len(groups) < 2:
            continue
        if len(groups) < len(members):
            cache = {(i,): (c, cyc) for i, (c, cyc) in enumerate(zip(compiled, cycles))}
            members = [[op.name for op in g.ops if op.name in {n for i in grp for n in members[i]}] for grp in groups]
            keys = [tuple(grp) for grp in groups]
            compiled, deps, cycles = _compile_segments(symbol, g, members, arch, cores, fusion, compile_fn,
                                                       {i: cache[k] for i, k in enumerate(keys) if k in cache})
        sched = list_schedule(cycles, deps, cores)
        if best is None or sched.makespan + len(members) * charge < best[0].makespan + len(best[1]) * charge:
            best = (sched, members, compiled, deps, cycles, split)
    if best is None:
        return None, MulticoreInfo(cores, False, "one segment (after merging segments that gain nothing from "
                                   "running apart): nothing runs concurrently", single, single, single)
    sched, members, compiled, deps, cycles, split = best
    ideal = list_schedule(cycles, deps, cores, contention=False)
    segs = [Segment(c, s.core, s.start, s.end, d) for c, s, d in zip(compiled, sched.slots, deps)]
    rows = [{"segment": i, "ops": ops, "core": s.core, "start_cycle": s.start, "end_cycle": s.end,
             "after": d, "cycles_by_active_cores": cyc}
            for i, (ops, s, d, cyc) in enumerate(zip(members, sched.slots, deps, cycles))]
    # Keep the segments only when they win with the runtime's host cost charged too (the host cost model,
    # timing/host.py: per segment its dispatch and the wait for its core; the one program once; the segments
    # hand feature maps over in the shared region, so no copy is charged): a DPU-only gain smaller than that is
    # lost to dispatch. The dispatches add up (one host thread runs Python at a time), as bench_vdpu predicts
    # them: charged per segment inside the schedule, full GoogLeNet kept 36 segments predicted 0.5% faster and
    # measured 25% slower end to end.
    hz = arch.freq_mhz * 1e6
    charged = sched.makespan + len(members) * charge
    single_charged = single + charge
    faster = sched.makespan < single and charged < single_charged
    used = faster or policy == "always"
    reason = (f"{len(members)} segments on {cores} cores" +
              (f" ({len(split)} convs split over their output channels)" if split else "") +
              f": predicted {sched.makespan:.0f} DPU cycles vs {single:.0f} on one core; with the host's "
              f"{charge / hz * 1e6:.0f} us per segment {charged:.0f} vs {single_charged:.0f}" +
              ("" if used else "; kept as one program") + (" (kept: segments='always')" if used and not faster else ""))
    info = MulticoreInfo(cores, used, reason, single, sched.makespan if used else single, ideal.makespan, rows)
    info.split_convs = sorted(split)
    if not used:
        return None, info
    linked = link_segments([g.sg for g in segs])
    info.shared_bytes = int(linked[0].region_sizes[REG_SHARED])
    segs = [replace(g, sg=s) for g, s in zip(segs, linked)]
    return Multicore(cores, segs, single, sched.makespan), info
