"""Branch concurrency on the cores of one DPU device: list scheduling of a DPU subgraph's segments on N cores,
with the DDR bandwidth the cores share charged to whatever runs at the same time.

A segment is a piece of one DPU subgraph compiled as a program of its own (backend/multicore.py cuts and compiles
them); segments depend on each other through the int8 feature maps one produces and another reads.

Contention rule (one rule, used by the scheduler and reported): the board's DDR bandwidth (`ddr_bytes_per_s` of
the arch preset, times `ddr_efficiency`) is split evenly among the cores streaming at once. A segment's cycles
when k segments run at the same time are its cycles simulated with `TimingParams.active_cores = k` (the
cycle-level simulator gives each core 1/k of the DDR share), so only its DDR-bound part stretches: a compute-bound
segment barely changes, a pure DMA segment takes up to k times longer. While k segments overlap, each advances at
1/cycles_k of its work per cycle; when a segment starts or ends, k changes and the others' rates with it (an
event-driven fluid simulation). `contention=False` uses cycles_1 throughout (the ideal bound).

Priority: critical path (the longest chain of contention-free cycles from a segment to the end, upward rank as in
HEFT); ties by segment index. A free core takes the highest-priority ready segment (non-delay list scheduling);
segments on one core never overlap, and a segment starts only when every segment it depends on has ended.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from tvm_dpu.arch import load_arch
from tvm_dpu.arch.arch import Arch
from tvm_dpu.timing.params import TimingError, TimingParams, load_params
from tvm_dpu.timing.simulate import simulate

_EPS = 1e-9


def contention_cycles(code: Any, arch: Arch | str, max_cores: int, params: TimingParams | None = None
                      ) -> list[float]:
    """[cycles of `code` when k = 1 .. max_cores cores stream from DDR at once] (see the module docstring)."""
    a = load_arch(arch)
    base = params if params is not None else load_params(a)
    return [simulate(code, a, base.replace(active_cores=k)).cycles for k in range(1, max_cores + 1)]


@dataclass(frozen=True)
class Slot:
    """Where and when one segment runs in a schedule (cycles of the core clock)."""

    segment: int
    core: int
    start: float
    end: float


@dataclass
class Schedule:
    """A list schedule of segments on `cores` cores: one `Slot` per segment (segment order) and the makespan."""

    cores: int
    slots: list[Slot]
    makespan: float
    contention: bool = True


def critical_path(cycles: Sequence[float], deps: Sequence[Sequence[int]]) -> list[float]:
    """Upward rank of each segment: its own cycles plus the longest chain of cycles of the segments after it."""
    n = len(cycles)
    succ: list[list[int]] = [[] for _ in range(n)]
    for i, ds in enumerate(deps):
        for d in ds:
            succ[d].append(i)
    rank = [0.0] * n
    for i in reversed(range(n)):  # deps point to lower indices (topological order), so successors come later
        rank[i] = float(cycles[i]) + max((rank[j] for j in succ[i]), default=0.0)
    return rank


def list_schedule(cycles: Sequence[Sequence[float]], deps: Sequence[Sequence[int]], cores: int,
                  contention: bool = True) -> Schedule:
    """Schedule segments on `cores` cores. `cycles[i][k-1]`: segment i's cycles while k segments run at once
    (`contention_cycles`; a list of one value means no contention data: it is used for every k); `deps[i]`: the
    segments i reads from, all with lower indices. Returns the `Schedule` (see the module docstring)."""
    n = len(cycles)
    if cores < 1:
        raise TimingError(f"schedule on {cores} cores: need at least one")
    for i, ds in enumerate(deps):
        bad = [d for d in ds if not 0 <= d < i]
        if bad:
            raise TimingError(f"segment {i} depends on {bad}: dependencies must be earlier segments")
        if not cycles[i] or min(cycles[i]) <= 0:
            raise TimingError(f"segment {i}: cycles {list(cycles[i])} must be positive")

    def cyc(i: int, k: int) -> float:
        row = cycles[i]
        return float(row[min(k, len(row)) - 1] if contention else row[0])

    rank = critical_path([c[0] for c in cycles], deps)
    waiting = [len(set(ds)) for ds in deps]
    succ: list[list[int]] = [[] for _ in range(n)]
    for i, ds in enumerate(deps):
        for d in set(ds):
            succ[d].append(i)
    ready = [i for i in range(n) if waiting[i] == 0]
    running: dict[int, tuple[int, float]] = {}  # segment -> (core, fraction of its work left)
    free = list(range(cores))
    starts: dict[int, tuple[int, float]] = {}
    ends: dict[int, float] = {}
    t = 0.0
    while len(ends) < n:
        ready.sort(key=lambda i: (-rank[i], i))
        free.sort()
        while ready and free:
            i = ready.pop(0)
            core = free.pop(0)
            running[i] = (core, 1.0)
            starts[i] = (core, t)
        if not running:
            raise TimingError("schedule: segments left that can never become ready (a dependency cycle)")
        k = len(running)
        # next event: the first running segment to finish at the current rates
        dt, first = min((left * cyc(i, k), i) for i, (_, left) in running.items())
        t += dt
        done = [first]
        for i, (core, left) in list(running.items()):
            left -= dt / cyc(i, k)
            if i != first and left <= _EPS:
                done.append(i)
            running[i] = (core, left)
        for i in done:
            core, _ = running.pop(i)
            ends[i] = t
            free.append(core)
            for j in succ[i]:
                waiting[j] -= 1
                if waiting[j] == 0:
                    ready.append(j)
    slots = [Slot(i, starts[i][0], starts[i][1], ends[i]) for i in range(n)]
    return Schedule(cores, slots, max(ends.values(), default=0.0), contention)


def schedule_trace(cores: int, slots: Sequence[Slot], names: Sequence[str], freq_hz: float, title: str = "DPU"
                   ) -> dict[str, Any]:
    """Chrome trace JSON (Perfetto / chrome://tracing) of a schedule: one track per core, one complete event per
    segment (`names[slot.segment]`), microseconds at the core clock."""
    us = 1e6 / freq_hz
    ev: list[dict[str, Any]] = [{"ph": "M", "pid": 0, "name": "process_name", "args": {"name": title}}]
    for c in range(cores):
        ev.append({"ph": "M", "pid": 0, "tid": c, "name": "thread_name", "args": {"name": f"core {c}"}})
    for s in slots:
        ev.append({"ph": "X", "pid": 0, "tid": s.core, "name": names[s.segment], "ts": s.start * us,
                   "dur": (s.end - s.start) * us, "args": {"segment": s.segment, "cycles": s.end - s.start}})
    makespan = max((s.end for s in slots), default=0.0)
    return {"traceEvents": ev, "displayTimeUnit": "ns",
            "otherData": {"cores": cores, "makespan_cycles": makespan, "latency_ms": makespan * us / 1e3}}


def topological_order(preds: Sequence[Sequence[int]], key: Any = None) -> list[int] | None:
    """An order of nodes 0..n-1 in which every node comes after the nodes of `preds[node]`; among the nodes ready
    at once, the smallest `key(node)` first (default: the node number). None when they form a cycle."""
    key = key if key is not None else (lambda n: n)
    waiting = [len(set(p)) for p in preds]
    succ: list[list[int]] = [[] for _ in preds]
    for n, ps in enumerate(preds):
        for p in set(ps):
            succ[p].append(n)
    ready = sorted((n for n in range(len(preds)) if waiting[n] == 0), key=key)
    order: list[int] = []
    while ready:
        n = ready.pop(0)
        order.append(n)
        for s in succ[n]:
            waiting[s] -= 1
            if waiting[s] == 0:
                ready.append(s)
        ready.sort(key=key)
    return order if len(order) == len(preds) else None


def _quotient(groups: list[list[int]], cycles: Sequence[Sequence[float]], deps: Sequence[Sequence[int]]
              ) -> tuple[list[list[int]], list[list[float]], list[list[int]]]:
    """Segments merged by `groups` (lists of segment indices): the groups in a topological order, their cycles
    (member cycles added, per k) and dependencies (on earlier groups)."""
    owner = {i: gi for gi, g in enumerate(groups) for i in g}
    gdeps = [sorted({owner[d] for i in g for d in deps[i]} - {gi}) for gi, g in enumerate(groups)]
    order = topological_order(gdeps, key=lambda gi: min(groups[gi]))
    if order is None:
        raise TimingError("merged segments depend on each other in a cycle")
    pos = {gi: k for k, gi in enumerate(order)}
    width = max(len(c) for c in cycles)
    out_cycles = [[sum(float(cycles[i][min(k, len(cycles[i]) - 1)]) for i in groups[gi]) for k in range(width)]
                  for gi in order]
    return ([sorted(groups[gi]) for gi in order], out_cycles, [sorted(pos[d] for d in gdeps[gi]) for gi in order])


def _reaches(deps: Sequence[Sequence[int]], src: int, dst: int, skip: int) -> bool:
    """Whether `dst` depends on `src` through some segment other than the direct edge (never entering `skip`)."""
    succ: dict[int, list[int]] = {}
    for i, ds in enumerate(deps):
        for d in ds:
            succ.setdefault(d, []).append(i)
    stack = [s for s in succ.get(src, []) if s != dst and s != skip]
    seen = set(stack)
    while stack:
        n = stack.pop()
        if n == dst:
            return True
        for s in succ.get(n, []):
            if s not in seen and s != skip:
                seen.add(s)
                stack.append(s)
    return False


#: Host time the runtime spends per segment (dispatch, DDR regions, feature-map hand-off), which a merge of two
#: segments saves. Our measurement on the x86 development host (run_segments without DPU work, reduced GoogLeNet:
#: ~30 us per segment; benchmarks/bench_vdpu.py); a board's ARM host is slower, so this is a lower bound there.
HOST_DISPATCH_S = 30e-6


def coalesce(cycles: Sequence[Sequence[float]], deps: Sequence[Sequence[int]], cores: int, saving: float = 0.0,
             max_trials: int | None = None) -> list[list[int]]:
    """Groups of segments to merge into one program each: two segments that run one after the other on a core
    are merged when the schedule of the merged segments (their cycles added, an upper bound: a merged program
    also saves the DDR hand-off between them) is longer by at most `saving` cycles (what one segment fewer saves
    the host, e.g. HOST_DISPATCH_S at the core clock); repeated while a merge is accepted. Returns the groups
    (segment indices) in a topological order."""
    groups = [[i] for i in range(len(cycles))]
    g, c, d = _quotient(groups, cycles, deps)
    best = list_schedule(c, d, cores).makespan
    trials = 0
    limit = max_trials if max_trials is not None else 20 * len(cycles)
    merged = True
    while merged and trials < limit:
        merged = False
        sched = list_schedule(c, d, cores)
        by_core: list[list[int]] = [[] for _ in range(cores)]
        for s in sorted(sched.slots, key=lambda s: (s.start, s.segment)):
            by_core[s.core].append(s.segment)
        pairs = [(u, v) for seq in by_core for u, v in zip(seq, seq[1:])]
        for u, v in pairs:
            if trials >= limit:
                break
            if _reaches(d, u, v, -1):
                continue  # v waits for something that waits for u: one program cannot hold both
            trials += 1
            trial = [grp for k, grp in enumerate(g) if k not in (u, v)] + [g[u] + g[v]]
            tg, tc, td = _quotient(trial, cycles, deps)
            m = list_schedule(tc, td, cores).makespan
            if m <= best + saving + _EPS * max(1.0, best):
                g, c, d, best = tg, tc, td, m
                merged = True
                break
    return g
