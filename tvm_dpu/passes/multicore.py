"""Branch concurrency at compile time: cut one DPU subgraph's quantized XGraph into segments, compile each as a
program of its own and list-schedule them on the cores of the arch (timing/multicore.py).

Segments are maximal chains of the fusion plan's groups: a group joins its predecessor's segment when it is that
predecessor's only consumer and reads from no other group, so the branches of an Inception block, a ResNet
shortcut conv and independent sub-networks become separate segments, and a fused group is never cut. Each
segment is `Graph.extract(members)` compiled by `compile_subgraph`: tensors are shared, so fix points carry over
and a segment computes exactly what the ops compute in the whole program (bit-identical); feature maps between
segments pass through host memory in int8.

Cutting costs DPU work (a segment saves what the next one loads again, and fusion across a cut is lost), so the
schedule is kept only when the timing model predicts it beats the whole program on one core; otherwise the
partition stays one program and `MulticoreInfo.used` is False with the reason.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tvm_dpu.arch.arch import Arch
from tvm_dpu.errors import DPUError
from tvm_dpu.program_blob import Multicore, Segment
from tvm_dpu.timing.multicore import contention_cycles, list_schedule
from tvm_dpu.timing.simulate import simulate


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

    def to_json(self) -> dict:
        return {"cores": self.cores, "used": self.used, "reason": self.reason,
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
    group_of = {op: gi for gi, g in enumerate(plan.groups) for op in g.ops}
    producer = {t: group_of[op.name] for op in graph.ops for t in op.outputs}
    preds: dict[int, set[int]] = {gi: set() for gi in range(len(plan.groups))}
    succs: dict[int, set[int]] = {gi: set() for gi in range(len(plan.groups))}
    for op in graph.ops:
        gi = group_of[op.name]
        for t in op.inputs:
            p = producer.get(t)
            if p is not None and p != gi:
                preds[gi].add(p)
                succs[p].add(gi)
    # Topological order of the groups (a fused group may read a group whose first op comes after its own first
    # op, e.g. conv+add reading the shortcut), ties by first op position.
    first = {}
    for i, op in enumerate(graph.ops):
        first.setdefault(group_of[op.name], i)
    waiting = {gi: len(ps) for gi, ps in preds.items()}
    ready = sorted((gi for gi, w in waiting.items() if w == 0), key=first.get)
    order: list[int] = []
    while ready:
        gi = ready.pop(0)
        order.append(gi)
        for s in succs[gi]:
            waiting[s] -= 1
            if waiting[s] == 0:
                ready.append(s)
        ready.sort(key=first.get)
    if len(order) != len(plan.groups):
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


#: When a partition keeps its segments: "auto" when the schedule is predicted faster than one program on one
#: core, "always" whenever it has two or more (to measure the runtime's cost, or test it on small models).
SEGMENT_POLICIES = ("auto", "always")


def compile_multicore(symbol: str, graph: Any, whole: Any, plan: Any, arch: Arch, cores: int, fusion: str,
                      compile_fn: Any, policy: str = "auto") -> tuple[Multicore | None, MulticoreInfo]:
    """Segments of `graph` (compiled by `compile_fn(graph, arch, fusion) -> (CompiledSubgraph, plan)`) scheduled
    on `cores` cores, or None when one program on one core is predicted to be as fast and `policy` is "auto"
    (`whole`: the partition compiled as one program). Returns (what the program blob carries, the decision for
    the report)."""
    single = simulate(whole.code, arch).cycles
    members = segment_members(graph, plan)
    if len(members) < 2:
        return None, MulticoreInfo(cores, False, "one segment: nothing runs concurrently", single, single, single)
    compiled = []
    for i, ops in enumerate(members):
        sub = graph.extract(ops, f"{symbol}.seg{i}")
        csg, _ = compile_fn(sub, arch, fusion)
        compiled.append(csg)
    producer = {b.name: i for i, c in enumerate(compiled) for b in c.outputs}
    deps = [sorted({producer[b.name] for b in c.inputs if b.name in producer}) for c in compiled]
    cycles = [contention_cycles(c.code, arch, cores) for c in compiled]
    sched = list_schedule(cycles, deps, cores)
    ideal = list_schedule(cycles, deps, cores, contention=False)
    segs = [Segment(c, s.core, s.start, s.end, d) for c, s, d in zip(compiled, sched.slots, deps)]
    rows = [{"segment": i, "ops": ops, "core": s.core, "start_cycle": s.start, "end_cycle": s.end,
             "after": d, "cycles_by_active_cores": cyc}
            for i, (ops, s, d, cyc) in enumerate(zip(members, sched.slots, deps, cycles))]
    used = sched.makespan < single or policy == "always"
    reason = (f"{len(members)} segments on {cores} cores: predicted {sched.makespan:.0f} cycles vs {single:.0f} on "
              "one core" + ("" if used else "; kept as one program") +
              (" (kept: segments='always')" if sched.makespan >= single and used else ""))
    info = MulticoreInfo(cores, used, reason, single, sched.makespan if used else single, ideal.makespan, rows)
    return (Multicore(cores, segs, single, sched.makespan) if used else None), info
