"""Design-space exploration: which DPUCZDX8G configuration to put on a board for a given model.

The PYNQ-cluster paper (shared/seeds/002, Algorithm 1) sizes its own accelerator from the DSP budget alone: it
doubles the output and input channel unrolling factors in turn while To x Ti multipliers (two int8 MACs per DSP)
still fit. On the DPU the design space is the convolution architecture (B512 .. B4096, i.e. PP x ICP x OCP), the
number of cores (1 .. 4) and the clock. `explore` generalises Algorithm 1 to it:

* cost of a configuration = cores x the per-core LUT / BRAM36K / DSP of its architecture (PG338, dpu_resources.json,
  with its source and caveats); it fits when every cost is within the board's budget;
* its predicted single-frame latency comes from the timing model on the model's own program code-generated for
  that architecture (the quantized graph is arch-independent, so it is quantized once), at that clock;
* its predicted throughput = min(cores / latency, DDR bandwidth / DDR bytes per frame): cores run different
  frames, and together they cannot move more bytes than the board's DDR delivers (the bound is reported);
* configurations are ranked by throughput, then latency, then DSP used. For comparison `algorithm1` gives the
  architecture the paper's rule would pick from the DSP budget alone.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from importlib import resources
from typing import Any, Sequence

from tvm_dpu.pipeline.plan import PlanError

ARCHS = ("B512", "B800", "B1024", "B1152", "B1600", "B2304", "B3136", "B4096")


def resource_table(dsp_usage: str = "high") -> dict[str, dict[str, float]]:
    """Per-core PL cost of each architecture (PG338; see dpu_resources.json)."""
    data = json.loads(resources.files("tvm_dpu.pipeline").joinpath("dpu_resources.json").read_text())
    table = data["dsp_usage"]
    if dsp_usage not in table:
        raise PlanError(f"dsp_usage {dsp_usage!r}: choose one of {sorted(table)}")
    return {k: v for k, v in table[dsp_usage].items() if not k.startswith("_")}


def device_budget(part: str) -> dict[str, float]:
    """DSP / BRAM36K / LUT of a Zynq UltraScale+ part (dpu_resources.json "devices")."""
    data = json.loads(resources.files("tvm_dpu.pipeline").joinpath("dpu_resources.json").read_text())
    devices = {k: v for k, v in data["devices"].items() if not k.startswith("_")}
    if part.lower() not in devices:
        raise PlanError(f"part {part!r}: known parts are {sorted(devices)}")
    return devices[part.lower()]


@dataclass
class Candidate:
    """One configuration and its predicted performance on the model."""

    dpu: str  # "B2304"
    cores: int
    freq_mhz: float
    dsp: int
    bram36k: float
    lut: int
    latency_ms: float  # one frame on one core
    fps: float  # all cores, DDR-capped
    gops: float
    ddr_bound: bool  # throughput limited by DDR bandwidth, not by the cores
    ddr_bytes_per_frame: int
    arch: Any = None  # the Arch (name, clock, cores)
    ddr_bus_bytes_per_frame: int = 0  # what the DDR moves per frame, burst overheads included (the DDR cap's unit)

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("arch")
        return d


def algorithm1(dsp: int) -> str | None:
    """The architecture the paper's Algorithm 1 would choose from `dsp` alone: To and Ti doubled in turn while
    To x Ti (two int8 MACs per DSP) <= 2 x dsp, then the largest DPU whose PP x ICP x OCP MACs per cycle fit
    To x Ti. None when not even B512 fits."""
    to = ti = 1
    while True:
        nto, nti = (to * 2, ti) if to <= ti else (to, ti * 2)
        if nto * nti > 2 * dsp:
            break
        to, ti = nto, nti
    macs = to * ti
    fitting = [a for a in ARCHS if int(a[1:]) // 2 <= macs]
    return fitting[-1] if fitting else None


def explore(model: Any, dsp: int, bram36k: float, lut: int | None = None, clocks_mhz: Sequence[float] = (300.0,),
            max_cores: int = 4, dsp_usage: str = "high", ddr_bytes_per_s: float = 17.1e9,
            fusion: str = "optimal") -> list[Candidate]:
    """Every configuration that fits the budget, ranked (see module docstring). `model`: a CompiledModel with
    one DPU subgraph (its quantized graph is recompiled per architecture)."""
    from tvm_dpu.arch import load_arch
    from tvm_dpu.backend.dpu_compile import compile_subgraph
    from tvm_dpu.pipeline.plan import single_subgraph
    from tvm_dpu.timing.simulate import simulate

    if dsp <= 0 or bram36k <= 0:
        raise PlanError(f"budget dsp={dsp}, bram36k={bram36k}: both must be positive")
    table = resource_table(dsp_usage)
    data = json.loads(resources.files("tvm_dpu.pipeline").joinpath("dpu_resources.json").read_text())
    max_cores = min(int(max_cores), int(data["max_cores"]))
    graph = single_subgraph(model).graph
    from tvm_dpu.xgraph.ops import op_macs

    macs = sum(op_macs(op, graph) for op in graph.ops)
    out: list[Candidate] = []
    for name in ARCHS:
        cost = table[name]
        cores_fit = [c for c in range(1, max_cores + 1) if c * cost["dsp"] <= dsp and c * cost["bram36k"] <= bram36k
                     and (lut is None or c * cost["lut"] <= lut)]
        if not cores_fit:
            continue
        base = load_arch(name)
        csg, _ = compile_subgraph(graph, base, fusion)
        for mhz in clocks_mhz:
            arch = dataclasses.replace(base, freq_mhz=float(mhz), ddr_bytes_per_s=float(ddr_bytes_per_s))
            t = simulate(csg.code, arch)
            latency = t.cycles / t.freq_hz
            ddr = int(t.ddr_read_bytes + t.ddr_write_bytes)
            # the cores share the DDR by what it moves, burst overheads included (short strided items cost more
            # than their bytes: e.g. a channel-augmented first layer's overlapping LOAD items)
            bus = int(t.ddr_bus_bytes)
            for c in cores_fit:
                core_fps = c / latency
                ddr_fps = ddr_bytes_per_s / bus if bus else float("inf")
                fps = min(core_fps, ddr_fps)
                ops = 2 * macs if macs else t.total_ops
                out.append(Candidate(name, c, float(mhz), int(c * cost["dsp"]), c * cost["bram36k"],
                                     int(c * cost["lut"]), latency * 1e3, fps, fps * ops / 1e9,
                                     ddr_fps < core_fps, ddr, dataclasses.replace(arch, cores=c), int(bus)))
    if not out:
        raise PlanError(f"no DPU configuration fits dsp={dsp}, bram36k={bram36k}"
                        f"{'' if lut is None else f', lut={lut}'} (the smallest, B512, needs "
                        f"{table['B512']['dsp']} DSP and {table['B512']['bram36k']} BRAM36K per core)")
    out.sort(key=lambda c: (-c.fps, c.latency_ms, c.dsp))
    return out


def table_text(cands: Sequence[Candidate], limit: int = 20) -> str:
    rows = [f"{'rank':>4} {'dpu':<6} {'cores':>5} {'MHz':>5} {'DSP':>5} {'BRAM36K':>8} {'LUT':>7} "
            f"{'latency ms':>10} {'frames/s':>9} {'GOPS':>7}  bound"]
    for i, c in enumerate(cands[:limit]):
        rows.append(f"{i + 1:>4} {c.dpu:<6} {c.cores:>5} {c.freq_mhz:>5.0f} {c.dsp:>5} {c.bram36k:>8.1f} "
                    f"{c.lut:>7} {c.latency_ms:>10.3f} {c.fps:>9.1f} {c.gops:>7.1f}  "
                    f"{'DDR' if c.ddr_bound else 'cores'}")
    return "\n".join(rows)


def choose_boards(model: Any, budgets: Sequence[dict], ddr_bytes: int, clocks_mhz: Sequence[float] = (300.0,),
                  dsp_usage: str = "high", fusion: str = "optimal") -> list:
    """One pipeline board per budget ({"dsp", "bram36k", optionally "lut" and "ddr_bytes_per_s"}), each with the
    single-core configuration of lowest predicted latency on `model` (a pipeline stage runs one frame at a time),
    so a cluster plan can mix boards of different sizes."""
    from tvm_dpu.pipeline.plan import Board

    boards = []
    for i, b in enumerate(budgets):
        cands = [c for c in explore(model, int(b["dsp"]), float(b["bram36k"]), b.get("lut"), clocks_mhz, 1,
                                    dsp_usage, float(b.get("ddr_bytes_per_s", 17.1e9)), fusion)]
        best = min(cands, key=lambda c: (c.latency_ms, c.dsp))
        boards.append(Board(f"board{i}", f"{best.dpu}@{best.freq_mhz:g}MHz", ddr_bytes, spec=best.arch))
    return boards
