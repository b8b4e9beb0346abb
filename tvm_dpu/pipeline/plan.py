"""Stage planning: cut a chain of ops into one stage per board, minimising the slowest stage.

A frame flows through the boards in order; with frames pipelined, throughput is 1 / (slowest stage period). A
stage computes its ops (their predicted time on that stage's board) and sends what crosses its outgoing cut over
the link (every tensor produced at or before the cut and used after it is sent, so a tensor that skips stages is
sent at every cut it crosses). With an overlapped link (`Link.overlap`, the default for every link in
links.json) the board's DMA sends frame f while the DPU computes frame f+1 from a second output buffer, so the
stage period is max(compute, send) and the stage holds its outgoing tensors twice; otherwise the period is
compute + send. A frame's latency is the sum of every stage's compute, host time and send. Each stage must fit its
board's memory: its weights, its largest feature-map working set, the buffer it receives into (which holds the
tensors that skip the stage's ops for the whole frame) and its output buffer (twice with an overlapped link),
within `Board.ddr_bytes`.

Host time (`HostTerms`, from the measured host cost model tvm_dpu.timing.host): every stage's frame also costs
its board's ARM cores the runtime call, the DPU driver call, the DMA of the int8 bytes it receives and sends (a
stage between two others passes the DPU's int8 through: no quantize / dequantize; only the first stage quantizes
the float input and the last dequantizes the output; a stage with CPU ops runs through the Relax VM on floats and
pays the conversions), and the CPU ops it runs. A stage is double-buffered as a board runs it: its ARM cores
receive and prepare frame f+1 (and read back and send frame f-1) while the DPU computes frame f, so with an
overlapped link the period is max(DPU + driver, host, send); only the driver's programming of the DPU
(`HostTerms.serial_s`) keeps the DPU waiting. `HostTerms(overlap=False)` and a blocking link keep the host
strictly serial: max(DPU + host, send), and DPU + host + send.

`plan_chain` is exact for one op order: dynamic programming over (boards used, ops covered) with the bottleneck as
the objective, O(boards x ops^2). Boards may differ (an op's time is given per board arch). One order does not
suffice on a branchy graph (what crosses a cut depends on which branch runs first), so `plan_model` plans several
valid orders (`unit_orders`: program order, depth-first, breadth-first, free-first) and keeps the best; it is
exact over those orders, not over every topological order (their number grows exponentially with the branches).

`op_chain` builds the chain of a compiled single-DPU-subgraph model from the timing model (per-op cycles of the
program as compiled) and its XGraph (tensor sizes, weights).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Sequence

from tvm_dpu.errors import DPUError
from tvm_dpu.timing.host import HostCost


class PlanError(DPUError, ValueError):
    """No feasible plan (too few ops, a stage that cannot fit a board's memory) or a bad request."""


@dataclass(frozen=True)
class Link:
    """A link model: bandwidth, per-transfer latency and whether sending overlaps the next frame's compute."""

    name: str
    gbit_per_s: float
    latency_us: float
    overlap: bool = True

    def seconds(self, nbytes: int) -> float:
        return 0.0 if nbytes <= 0 else self.latency_us * 1e-6 + nbytes * 8 / (self.gbit_per_s * 1e9)

    def period(self, compute_s: float, send_s: float) -> float:
        """A stage's period (its time per frame in the pipeline) from its compute and send times."""
        return max(compute_s, send_s) if self.overlap else compute_s + send_s


@dataclass(frozen=True)
class Board:
    """One board of the pipeline: its DPU arch (a preset name or a label; the key of `OpCost.seconds`), usable
    DDR bytes and, for a configuration that is no preset (design-space exploration picks clock and size), the
    `Arch` itself in `spec`; `part`: its FPGA part when known (the board kind a Ray cluster places its stage on)."""

    name: str
    arch: str
    ddr_bytes: int
    spec: Any = field(default=None, compare=False)
    part: str | None = None

    def load(self) -> Any:
        """The board's `Arch`."""
        from tvm_dpu.arch import load_arch

        return self.spec if self.spec is not None else load_arch(self.arch)


@dataclass(frozen=True)
class OpCost:
    """One op of the chain: predicted seconds per board arch, its weight bytes, its working-set bytes (inputs +
    outputs in DDR), and the bytes that cross a cut placed right after it."""

    name: str
    seconds: dict[str, float]
    param_bytes: int
    work_bytes: int
    cut_bytes: int
    #: Seconds of host work the op is (a CPU op on the board's ARM cores, the same on every board): counted as
    #: host time, not DPU time.
    host_seconds: float = 0.0


@dataclass
class Stage:
    board: Board
    first: int  # index of the first op
    end: int  # one past the last op
    compute_s: float
    send_bytes: int
    send_s: float
    memory_bytes: int
    overlap: bool = True  # the link's: sending overlaps the next frame's compute
    host_s: float = 0.0  # the host's time per frame (HostTerms and CPU ops), serial part included
    serial_s: float = 0.0  # of host_s, what the DPU waits for (the driver programming it)
    host_overlap: bool = False  # double-buffered: the host works on other frames while the DPU runs

    @property
    def busy_s(self) -> float:
        """DPU plus host time of one frame on the stage's board (its share of a frame's latency)."""
        return self.compute_s + self.host_s

    @property
    def dpu_s(self) -> float:
        """The DPU's time per frame: its compute and the driver it waits for."""
        return self.compute_s + self.serial_s

    @property
    def seconds(self) -> float:
        """The stage's period: time per frame once frames are pipelined (see the module docstring)."""
        if not self.overlap:
            return self.busy_s + self.send_s
        if self.host_overlap:
            return max(self.dpu_s, self.host_s, self.send_s)
        return max(self.busy_s, self.send_s)

    @property
    def bound(self) -> str:
        """What sets the stage's period: "link", "host" or "DPU"."""
        if self.overlap and self.host_overlap:
            if self.send_s >= max(self.dpu_s, self.host_s):
                return "link"
            return "host" if self.host_s > self.dpu_s else "DPU"
        link_bound = self.send_s >= self.busy_s if self.overlap else self.send_s > max(self.compute_s, self.host_s)
        if link_bound:
            return "link"
        return "host" if self.host_s > self.compute_s else "DPU"


@dataclass(frozen=True)
class HostTerms:
    """The host's share of a pipeline plan: the measured cost model, the elements of the model's inputs and
    outputs (what the first stage receives and the last one returns), the seconds of the CPU ops before and
    after the model's DPU part (run by the first and the last stage), which stages run through the Relax VM on
    floats (`first_vm`: CPU ops before the DPU part; `last_vm`: after it; `middle_vm`: every other stage, e.g. a
    split with CPU ops anywhere) while the others pass int8 through, and whether a stage is double-buffered
    (`overlap`, see the module docstring)."""

    cost: HostCost
    input_elems: int = 0
    output_elems: int = 0
    first_cpu_s: float = 0.0
    last_cpu_s: float = 0.0
    first_vm: bool = False
    last_vm: bool = False
    middle_vm: bool = False
    overlap: bool = True

    def stage_s(self, recv: int, send: int, first: bool, last: bool, region_bytes: int = 0) -> float:
        """Host seconds of one frame of a stage receiving `recv` and sending `send` elements (the first stage
        receives the model's float inputs, the last returns its float outputs) whose program has `region_bytes` of
        weights."""
        c = self.cost
        cpu = (self.first_cpu_s if first else 0.0) + (self.last_cpu_s if last else 0.0)
        vm = (first and self.first_vm) or (last and self.last_vm) or (not first and not last and self.middle_vm)
        if vm:
            return c.call_seconds(recv, send, region_bytes=region_bytes) + cpu
        return c.int8_call_seconds(recv, send, quant_elems=recv if first else 0, dequant_elems=send if last else 0,
                                   region_bytes=region_bytes) + cpu

    def serial_s(self) -> float:
        """Of a stage's host time, what the DPU waits for: the driver programming it (one DPU program per stage);
        all of it without `overlap`."""
        return self.cost.scale * self.cost.dpu_call_s


@dataclass
class Plan:
    stages: list[Stage]
    link: Link
    ops: list[str] = field(default_factory=list)

    @property
    def bottleneck_s(self) -> float:
        return max(s.seconds for s in self.stages)

    @property
    def fps(self) -> float:
        return 1.0 / self.bottleneck_s if self.bottleneck_s > 0 else float("inf")

    @property
    def latency_s(self) -> float:
        """One frame from the first stage's input to the last stage's output."""
        return sum(s.busy_s + s.send_s for s in self.stages)

    def bottleneck(self) -> str:
        """The slowest stage and what bounds it, e.g. "stage 2 (DPU 4.1 ms + host 0.9 ms; link 0.2 ms): DPU"."""
        i = max(range(len(self.stages)), key=lambda k: self.stages[k].seconds)
        s = self.stages[i]
        join = ", host overlapped" if s.host_overlap else " +"
        return (f"stage {i} (DPU {s.compute_s * 1e3:.3f} ms{join} {s.host_s * 1e3:.3f} ms; link "
                f"{s.send_s * 1e3:.3f} ms): {s.bound}")

    def to_json(self) -> dict:
        return {"link": self.link.name, "overlap": self.link.overlap, "bottleneck_ms": self.bottleneck_s * 1e3,
                "fps": self.fps, "latency_ms": self.latency_s * 1e3, "bottleneck": self.bottleneck(),
                "stages": [{"board": s.board.name, "arch": s.board.arch, "ops": self.ops[s.first:s.end],
                            "first": s.first, "end": s.end, "compute_ms": s.compute_s * 1e3,
                            "host_ms": s.host_s * 1e3, "serial_host_ms": s.serial_s * 1e3,
                            "host_overlap": s.host_overlap, "period_ms": s.seconds * 1e3, "bound": s.bound,
                            "send_bytes": s.send_bytes, "send_ms": s.send_s * 1e3,
                            "memory_bytes": s.memory_bytes}
                           for s in self.stages]}


def _data() -> dict:
    return json.loads(resources.files("tvm_dpu.pipeline").joinpath("links.json").read_text())


def default_link(executor: str = "local") -> str:
    """The link model a pipeline is planned with unless one is named: the Ray executor moves tensors through Ray's
    object store over IP ("ray-gbe", measured by benchmarks/bench_links.py), the local one stands for boards on
    the paper's serial links ("serial-8.5g")."""
    return "ray-gbe" if executor == "ray" else "serial-8.5g"


def load_link(name: str) -> Link:
    """A link model by name ("serial-8.5g", "gbe"; see links.json)."""
    links = _data()["links"]
    if name not in links:
        raise PlanError(f"link {name!r}: known links are {sorted(links)}")
    d = links[name]
    return Link(name, float(d["gbit_per_s"]), float(d["latency_us"]), bool(d.get("overlap", True)))


def stage_times_ms(stages: Sequence[dict], link: str | None) -> list[tuple[float, float, float]]:
    """Per stage of a pipeline document (`StageSpec.to_json`: predicted_ms, send_bytes): (compute ms, send ms,
    period ms) under the link model `link` (None: no link, the period is the compute time)."""
    model = load_link(link) if link else None
    out = []
    for st in stages:
        compute = float(st["predicted_ms"])
        send = model.seconds(int(st["send_bytes"])) * 1e3 if model else 0.0
        out.append((compute, send, model.period(compute, send) if model else compute))
    return out


def board_ddr_bytes(board: str) -> int:
    """Usable DDR of a board preset: its PS DDR less a quarter kept for the OS and the CPU side."""
    table = _data()["board_ddr_bytes"]
    if board not in table:
        raise PlanError(f"board {board!r}: DDR size unknown (known: {sorted(k for k in table if k[0] != '_')}); "
                        "give Board(..., ddr_bytes=...)")
    return int(table[board]) * 3 // 4


def plan_chain(ops: Sequence[OpCost], boards: Sequence[Board], link: Link, host: HostTerms | None = None) -> Plan:
    """The plan of `ops` (in order) over `boards` (in pipeline order, one stage each, every stage non-empty) with
    the smallest bottleneck stage time, host time included when `host` is given; PlanError when none fits."""
    n, k = len(ops), len(boards)
    if k == 0:
        raise PlanError("no boards")
    if n < k:
        raise PlanError(f"{n} ops cannot fill {k} stages (each board needs at least one op)")
    for b in boards:
        missing = [o.name for o in ops if b.arch not in o.seconds]
        if missing:
            raise PlanError(f"board {b.name}: no predicted time on {b.arch} for op(s) {missing[:5]}")

    def stage(b: Board, i: int, j: int) -> Stage | None:
        send = ops[j - 1].cut_bytes if j < n else 0
        recv = ops[i - 1].cut_bytes if i > 0 else 0
        params = sum(o.param_bytes for o in ops[i:j])
        # the receive buffer holds what skips the stage's ops for the whole frame; the output buffer is doubled
        # when sending overlaps the next frame
        memory = params + max(o.work_bytes for o in ops[i:j]) + recv + (send if link.overlap else 0)
        if memory > b.ddr_bytes:
            return None
        host_s = sum(o.host_seconds for o in ops[i:j])
        if host is not None:
            # the stage program's weights stay resident on its board (written once at load), so a frame pays none
            host_s += host.stage_s(recv if i > 0 else host.input_elems, send if j < n else host.output_elems,
                                   i == 0, j == n)
        overlap = host is not None and host.overlap and link.overlap  # one output buffer: nothing overlaps
        return Stage(b, i, j, sum(o.seconds[b.arch] for o in ops[i:j]), send, link.seconds(send), memory,
                     link.overlap, host_s, host.serial_s() if overlap else 0.0, overlap)

    inf = float("inf")
    # best[s][j]: smallest bottleneck of ops[0:j] on boards[0:s]; choice[s][j]: where stage s-1 starts.
    best = [[inf] * (n + 1) for _ in range(k + 1)]
    choice = [[-1] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0.0
    for s in range(1, k + 1):
        for j in range(s, n - (k - s) + 1):
            for i in range(s - 1, j):
                if best[s - 1][i] == inf:
                    continue
                st = stage(boards[s - 1], i, j)
                if st is None:
                    continue
                value = max(best[s - 1][i], st.seconds)
                if value < best[s][j]:
                    best[s][j], choice[s][j] = value, i
    if best[k][n] == inf:
        worst = max(ops, key=lambda o: o.param_bytes + o.work_bytes)
        raise PlanError(f"no way to fit the model on {k} board(s): every split leaves a stage beyond its board's "
                        f"memory (the largest op, {worst.name!r}, needs {worst.param_bytes + worst.work_bytes} B; "
                        f"smallest board {min(b.ddr_bytes for b in boards)} B)")
    stages, j = [], n
    for s in range(k, 0, -1):
        i = choice[s][j]
        stages.append(stage(boards[s - 1], i, j))
        j = i
    return Plan(list(reversed(stages)), link, [o.name for o in ops])


@dataclass
class ChainUnit:
    """One unit of a model's op chain: a code range of the compiled program (a fused group such as "conv2+add" is
    one unit, never cut inside) and the XGraph ops it covers (an op without instructions of its own, such as an
    aliased concat, joins the unit before it)."""

    name: str
    ops: list  # xgraph.graph.Op


def single_subgraph(model: Any):
    """The one `SubgraphRunner` of a model whose DPU part is one subgraph with its quantized XGraph; PlanError
    otherwise."""
    if len(model.runners) != 1:
        raise PlanError(f"a pipeline splits a model with one DPU subgraph; this one has {len(model.runners)}")
    (runner,) = model.runners.values()
    if runner.graph is None:
        raise PlanError("splitting a model needs its quantized XGraph (a model built in this process, or an artifact "
                        "with verification data)")
    return runner


def chain_units(model: Any) -> list[ChainUnit]:
    """The units of `model`'s single DPU subgraph in program order (see `ChainUnit`)."""
    return runner_units(single_subgraph(model))


def runner_units(runner: Any) -> list[ChainUnit]:
    """The units of one DPU subgraph (a `SubgraphRunner` with its quantized XGraph) in program order."""
    units = [ChainUnit(name, []) for name, _, _ in runner.sg.op_ranges]
    unit_of_op = {member: u for u, unit in enumerate(units) for member in unit.name.split("+")}
    current = 0
    for op in runner.graph.ops:
        current = unit_of_op.get(op.name, current)
        units[current].ops.append(op)
    return units


def tensor_bytes(graph: Any, name: str) -> int:
    """Bytes of an XGraph tensor as the DPU stores it (int8 feature maps, int32 / float32 where typed so)."""
    tensor = graph.tensors[name]
    size = 1
    for d in tensor.shape:
        size *= int(d)
    return size * (4 if tensor.dtype in ("int32", "float32") else 1)


def unit_deps(units: Sequence[ChainUnit]) -> list[set[int]]:
    """Per unit, the units whose outputs it reads."""
    producer = {t: u for u, unit in enumerate(units) for op in unit.ops for t in op.outputs}
    return [{producer[t] for op in unit.ops for t in op.inputs if t in producer and producer[t] != u}
            for u, unit in enumerate(units)]


def unit_orders(units: Sequence[ChainUnit], limit: int = 4) -> list[list[int]]:
    """Up to `limit` distinct valid (topological) orders of `units`: program order first, then Kahn's algorithm
    taking the most recently readied unit (finish a branch before starting the next), the oldest (interleave
    branches), and the unit that completes the most producers' readers (frees their maps soonest)."""
    deps = unit_deps(units)
    n = len(units)
    users: list[set[int]] = [set() for _ in range(n)]
    for u, ds in enumerate(deps):
        for d in ds:
            users[d].add(u)

    def kahn(pick) -> list[int]:
        indeg = [len(d) for d in deps]
        ready = [u for u in range(n) if indeg[u] == 0]
        order: list[int] = []
        while ready:
            u = pick(ready, order)
            ready.remove(u)
            order.append(u)
            for v in sorted(users[u]):
                indeg[v] -= 1
                if indeg[v] == 0:
                    ready.append(v)
        return order

    def frees_most(ready: list[int], order: list[int]) -> int:
        done = set(order)

        def freed(u: int) -> int:  # producers whose last pending reader is u
            return sum(1 for d in deps[u] if not users[d] - done - {u})

        return max(ready, key=lambda u: (freed(u), -u))

    candidates = [list(range(n)), kahn(lambda r, o: r[-1]), kahn(lambda r, o: r[0]), kahn(frees_most)]
    orders: list[list[int]] = []
    for c in candidates:
        if len(c) == n and c not in orders:
            orders.append(c)
    return orders[:max(1, limit)]


def op_chain(model: Any, boards: Sequence[Board], order: Sequence[int] | None = None,
             _seconds: dict | None = None) -> list[OpCost]:
    """The op chain of a compiled single-DPU-subgraph model (`CompiledModel`): per unit (`chain_units`), the timing
    model's cycles of the program as compiled, re-simulated for each distinct board arch, and from the quantized
    XGraph the weight bytes, working-set bytes and the bytes crossing a cut after it. `order`: the units in
    another valid order (`unit_orders`; default program order), which changes what crosses each cut."""
    from tvm_dpu.timing.simulate import simulate

    runner = single_subgraph(model)
    graph, sg = runner.graph, runner.sg
    units = chain_units(model)
    per_arch: dict[str, list[float]] = {} if _seconds is None else _seconds
    for b in boards:
        if b.arch not in per_arch:
            timing = simulate(sg.code, b.load(), op_ranges=sg.op_ranges)
            per_arch[b.arch] = [ot.cycles / timing.freq_hz for ot in timing.ops]
    order = list(range(len(units))) if order is None else list(order)
    if sorted(order) != list(range(len(units))):
        raise PlanError(f"order {order[:8]}...: not a permutation of the model's {len(units)} units")
    produced_at: dict[str, int] = {t: -1 for t in graph.inputs}
    last_use: dict[str, int] = {}
    for pos, u in enumerate(order):
        for op in units[u].ops:
            for t in op.inputs:
                last_use[t] = max(last_use.get(t, -1), pos)
            for t in op.outputs:
                produced_at[t] = pos
    for t in graph.outputs:
        last_use[t] = len(units)  # the model output leaves the last stage
    for t, p in produced_at.items():
        if t in last_use and last_use[t] < p:
            raise PlanError(f"order reads tensor {t!r} before the unit that produces it")

    out = []
    for pos, u in enumerate(order):
        unit = units[u]
        fmaps = {t for op in unit.ops for t in list(op.inputs) + list(op.outputs)
                 if t in graph.tensors and graph.tensors[t].data is None}
        out.append(OpCost(
            name=unit.name, seconds={a: per_arch[a][u] for a in per_arch},
            param_bytes=sum(tensor_bytes(graph, t) for op in unit.ops for t in op.params.values()),
            work_bytes=sum(tensor_bytes(graph, t) for t in fmaps),
            cut_bytes=sum(tensor_bytes(graph, t) for t, p in produced_at.items() if p <= pos < last_use.get(t, -1))))
    return out


def plan_model(model: Any, boards: Sequence[Board], link: Link, host: HostTerms | None = None,
               orders: int = 4) -> Plan:
    """The best plan of `model` over `boards` among several valid op orders (`unit_orders`): the planner is exact
    for one order, and another topological order of a branchy graph can cut with fewer bytes in flight; ties
    keep program order."""
    units = chain_units(model)
    seconds: dict = {}
    best: Plan | None = None
    error: PlanError | None = None
    for order in unit_orders(units, orders):
        try:
            plan = plan_chain(op_chain(model, boards, order, seconds), boards, link, host)
        except PlanError as e:
            error = error or e
            continue
        if best is None or plan.bottleneck_s < best.bottleneck_s - 1e-12:
            best = plan
    if best is None:
        raise error if error is not None else PlanError("no valid op order")
    return best
