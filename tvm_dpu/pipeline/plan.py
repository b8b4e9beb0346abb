"""Stage planning: cut a chain of ops into one stage per board, minimising the slowest stage.

A frame flows through the boards in order; with frames pipelined, throughput is 1 / (slowest stage period). A
stage computes its ops (their predicted time on that stage's board) and sends what crosses its outgoing cut over
the link (every tensor produced at or before the cut and used after it is sent, so a tensor that skips stages is
sent at every cut it crosses). With an overlapped link (`Link.overlap`, the default for every link in
links.json) the board's DMA sends frame f while the DPU computes frame f+1 from a second output buffer, so the
stage period is max(compute, send) and the stage holds its outgoing tensors twice; otherwise the period is
compute + send. A frame's latency is the sum of every stage's compute and send. Each stage must fit its board's
memory: its weights plus its largest feature-map working set (plus the second output buffer), within
`Board.ddr_bytes`.

`plan_chain` is exact: dynamic programming over (boards used, ops covered) with the bottleneck as the objective,
O(boards x ops^2). Boards may differ (an op's time is given per board arch).

`op_chain` builds the chain of a compiled single-DPU-subgraph model from the timing model (per-op cycles of the
program as compiled) and its XGraph (tensor sizes, weights).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Sequence

from tvm_dpu.errors import DPUError


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

    @property
    def seconds(self) -> float:
        """The stage's period: time per frame once frames are pipelined."""
        return max(self.compute_s, self.send_s) if self.overlap else self.compute_s + self.send_s


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
        return sum(s.compute_s + s.send_s for s in self.stages)

    def to_json(self) -> dict:
        return {"link": self.link.name, "overlap": self.link.overlap, "bottleneck_ms": self.bottleneck_s * 1e3,
                "fps": self.fps, "latency_ms": self.latency_s * 1e3,
                "stages": [{"board": s.board.name, "arch": s.board.arch, "ops": self.ops[s.first:s.end],
                            "first": s.first, "end": s.end, "compute_ms": s.compute_s * 1e3,
                            "send_bytes": s.send_bytes, "send_ms": s.send_s * 1e3, "memory_bytes": s.memory_bytes}
                           for s in self.stages]}


def _data() -> dict:
    return json.loads(resources.files("tvm_dpu.pipeline").joinpath("links.json").read_text())


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


def plan_chain(ops: Sequence[OpCost], boards: Sequence[Board], link: Link) -> Plan:
    """The plan of `ops` (in order) over `boards` (in pipeline order, one stage each, every stage non-empty) with
    the smallest bottleneck stage time; PlanError when none fits."""
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
        params = sum(o.param_bytes for o in ops[i:j])
        memory = params + max(o.work_bytes for o in ops[i:j]) + (send if link.overlap else 0)
        if memory > b.ddr_bytes:
            return None
        return Stage(b, i, j, sum(o.seconds[b.arch] for o in ops[i:j]), send, link.seconds(send), memory,
                     link.overlap)

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


def op_chain(model: Any, boards: Sequence[Board]) -> list[OpCost]:
    """The op chain of a compiled single-DPU-subgraph model (`CompiledModel`): per unit (`chain_units`), the timing
    model's cycles of the program as compiled, re-simulated for each distinct board arch, and from the quantized
    XGraph the weight bytes, working-set bytes and the bytes crossing a cut after it."""
    from tvm_dpu.timing.simulate import simulate

    runner = single_subgraph(model)
    graph, sg = runner.graph, runner.sg
    units = chain_units(model)
    per_arch: dict[str, list[float]] = {}
    for b in boards:
        if b.arch not in per_arch:
            timing = simulate(sg.code, b.load(), op_ranges=sg.op_ranges)
            per_arch[b.arch] = [ot.cycles / timing.freq_hz for ot in timing.ops]
    produced_at: dict[str, int] = {t: -1 for t in graph.inputs}
    last_use: dict[str, int] = {}
    for u, unit in enumerate(units):
        for op in unit.ops:
            for t in op.inputs:
                last_use[t] = max(last_use.get(t, -1), u)
            for t in op.outputs:
                produced_at[t] = u
    for t in graph.outputs:
        last_use[t] = len(units)  # the model output leaves the last stage

    out = []
    for u, unit in enumerate(units):
        fmaps = {t for op in unit.ops for t in list(op.inputs) + list(op.outputs)
                 if t in graph.tensors and graph.tensors[t].data is None}
        out.append(OpCost(
            name=unit.name, seconds={a: per_arch[a][u] for a in per_arch},
            param_bytes=sum(tensor_bytes(graph, t) for op in unit.ops for t in op.params.values()),
            work_bytes=sum(tensor_bytes(graph, t) for t in fmaps),
            cut_bytes=sum(tensor_bytes(graph, t) for t, p in produced_at.items() if p <= u < last_use.get(t, -1))))
    return out
