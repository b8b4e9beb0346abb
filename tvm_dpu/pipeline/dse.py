"""Design-space exploration: which DPUCZDX8G configuration to put on a board for a given model.

The PYNQ-cluster paper (shared/seeds/002, Algorithm 1) sizes its own accelerator from the DSP budget alone: it
doubles the output and input channel unrolling factors in turn while To x Ti multipliers (two int8 MACs per DSP)
still fit. On the DPU the design space is the convolution architecture (B512 .. B4096, i.e. PP x ICP x OCP), the
number of cores (1 .. 4) and the clock. `explore` generalises Algorithm 1 to it:

* cost of a configuration = cores x the per-core LUT / BRAM36K / DSP of its architecture (PG338, dpu_resources.json,
  with its source and caveats): DSP and LUT by DSP usage (high: DSPs multiply and accumulate; low: multiply
  only), BRAM36K by RAM usage (PG338 v4.0's low / high table; `ram_usage=None` keeps the v1.2 figures measured
  without depthwise convolution), optionally PG338's extra cost of depthwise convolution, and with the UltraRAM
  option (every size, AMD's recommended bank counts) part of the BRAM36K replaced by URAM; it fits when every
  cost is within the board's budget;
* its predicted single-frame latency comes from the timing model on the model's own programs (every DPU subgraph)
  code-generated for that architecture (the quantized graphs are arch-independent, so they are quantized once), at
  that clock;
* its predicted throughput = min(cores / latency, DDR bandwidth / DDR bytes per frame, 1 / CPU-op time): cores
  run different frames, together they cannot move more bytes than the board's DDR delivers, and the model's CPU
  ops between its DPU subgraphs run on the board's ARM cores (the measured host cost model, the same for every
  configuration) one frame after another (the bound is reported);
* configurations are ranked by throughput, then latency, then DSP used. For comparison `algorithm1` gives the
  architecture the paper's rule would pick from the DSP budget alone.

`explore_part` explores a Zynq UltraScale+ part (tvm_dpu/arch/parts.json) as AMD's boards build it: its PL less the
platform reserve (the shell and the DPU's interconnect, in blocks, each figure sourced), RAM usage low, depthwise
convolution on, both DSP usages, the UltraRAM option where the part has URAM, the DPU clock of the board that
carries the part (presets.json: clock derating) and that board's DDR bandwidth (parts.json).
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


def _resources() -> dict:
    return json.loads(resources.files("tvm_dpu.pipeline").joinpath("dpu_resources.json").read_text())


def device_budget(part: str) -> dict[str, float]:
    """DSP / BRAM36K / LUT / URAM of a Zynq UltraScale+ part (tvm_dpu/arch/parts.json)."""
    from tvm_dpu.arch.parts import part_info
    from tvm_dpu.errors import ArchError

    try:
        info = part_info(part)
    except ArchError as e:
        raise PlanError(str(e)) from None
    return {k: info[k] for k in ("dsp", "bram36k", "lut", "uram")}


def core_costs(dsp_usage: str = "high", ram_usage: str | None = None,
               depthwise: bool = False) -> dict[str, list[dict[str, float]]]:
    """Per architecture, the per-core cost of each way to build it: {"dsp", "lut", "bram36k", "uram"}, without and
    with the UltraRAM option (AMD's recommended bank counts; see the module docstring and dpu_resources.json).
    `depthwise`: add PG338's extra cost of depthwise convolution (every AMD-shipped build has it; the v4.0
    `ram_usage` BRAM36K figures include it already)."""
    from tvm_dpu.arch import load_arch

    data = _resources()
    table = resource_table(dsp_usage)
    if ram_usage is not None and ram_usage not in data["ram_usage_bram36k"]:
        raise PlanError(f"ram_usage {ram_usage!r}: choose low or high")
    banks = {k: v for k, v in data["uram_banks"].items() if not k.startswith("_")}
    extra = data["depthwise_extra"]
    out = {}
    for name, cost in table.items():
        bram = float(data["ram_usage_bram36k"][ram_usage][name]) if ram_usage else float(cost["bram36k"])
        dsp, lut = cost["dsp"], cost["lut"]
        if depthwise:
            dsp, lut = dsp + extra[name]["dsp"], lut + extra[name]["lut"]
            if not ram_usage:
                bram += extra[name]["bram36k"]
        ways = [{"dsp": dsp, "lut": lut, "bram36k": bram, "uram": 0}]
        if name in banks:
            icp = load_arch(name).icp
            n = sum(banks[name].values())
            # a bank is ICP x 8 bits x 2048: one 4K x 72 UltraRAM holds it up to 72 bits, two above; in BRAM36K
            # (2K x 18 per block, 16 data bits) it takes ICP / 2 blocks
            ways.append({"dsp": dsp, "lut": lut, "bram36k": bram - n * icp / 2,
                         "uram": n * (1 if icp * 8 <= 72 else 2)})
        out[name] = ways
    return out


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
    dsp_usage: str = "high"
    uram: int = 0  # UltraRAM blocks (the UltraRAM option), all cores
    cpu_ms: float = 0.0  # the model's CPU ops per frame on the host (host cost model), whatever the DPU
    host_bound: bool = False  # throughput limited by the CPU ops, not by the cores or the DDR

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
            max_cores: int = 4, dsp_usage: str | Sequence[str] = "high", ddr_bytes_per_s: float = 17.1e9,
            fusion: str = "optimal", uram: int = 0, ram_usage: str | None = None,
            cache: dict | None = None, depthwise: bool = False,
            archs: Sequence[str] | None = None) -> list[Candidate]:
    """Every configuration that fits the budget, ranked (see module docstring). `model`: a CompiledModel with
    one or several DPU subgraphs (their quantized graphs are recompiled per architecture). `dsp_usage`: "high",
    "low" or both; `uram`: UltraRAM blocks available (0: the UltraRAM option is not offered); `ram_usage`: "low" /
    "high" (PG338 v4.0 BRAM36K table) or None (the v1.2 figures); `cache`: a dict reused across calls on the same
    model to compile each subgraph for each architecture once; `depthwise`: cost cores with depthwise convolution
    (core_costs); `archs`: explore only these architectures (default all)."""
    from tvm_dpu.arch import load_arch
    from tvm_dpu.backend.dpu_compile import compile_subgraph
    from tvm_dpu.timing.simulate import simulate

    if dsp <= 0 or bram36k <= 0:
        raise PlanError(f"budget dsp={dsp}, bram36k={bram36k}: both must be positive")
    usages = [dsp_usage] if isinstance(dsp_usage, str) else list(dsp_usage)
    ways = {u: core_costs(u, ram_usage, depthwise) for u in usages}
    if archs is not None and not set(archs) <= set(ARCHS):
        raise PlanError(f"archs {sorted(set(archs) - set(ARCHS))}: choose from {list(ARCHS)}")
    table = resource_table(usages[0])
    data = _resources()
    max_cores = min(int(max_cores), int(data["max_cores"]))
    graphs = model_graphs(model)
    from tvm_dpu.xgraph.ops import op_macs

    macs = sum(op_macs(op, g) for g in graphs for op in g.ops)
    cpu_s = model_cpu_seconds(model)
    out: list[Candidate] = []
    for name in (ARCHS if archs is None else [a for a in ARCHS if a in archs]):
        # (cores, dsp usage, per-core cost) of every way to build `name` that fits
        fits = [(c, u, w) for u in usages for w in ways[u][name] for c in range(1, max_cores + 1)
                if c * w["dsp"] <= dsp and c * w["bram36k"] <= bram36k and c * w["uram"] <= uram
                and (lut is None or c * w["lut"] <= lut)]
        if not fits:
            continue
        base = load_arch(name)
        csgs = []
        for graph in graphs:
            key = (id(graph), name, fusion)
            if cache is not None and key in cache:
                csgs.append(cache[key])
                continue
            csg, _ = compile_subgraph(graph, base, fusion)
            if cache is not None:
                cache[key] = csg
            csgs.append(csg)
        for mhz in clocks_mhz:
            arch = dataclasses.replace(base, freq_mhz=float(mhz), ddr_bytes_per_s=float(ddr_bytes_per_s))
            timings = [simulate(csg.code, arch) for csg in csgs]  # a frame runs every DPU subgraph once
            latency = sum(t.cycles for t in timings) / timings[0].freq_hz
            ddr = int(sum(t.ddr_read_bytes + t.ddr_write_bytes for t in timings))
            # the cores share the DDR by what it moves, burst overheads included (short strided items cost more
            # than their bytes: e.g. a channel-augmented first layer's overlapping LOAD items)
            bus = int(sum(t.ddr_bus_bytes for t in timings))
            for c, usage, w in fits:
                core_fps = c / latency
                ddr_fps = ddr_bytes_per_s / bus if bus else float("inf")
                host_fps = 1.0 / cpu_s if cpu_s > 0 else float("inf")
                fps = min(core_fps, ddr_fps, host_fps)
                ops = 2 * macs if macs else sum(t.total_ops for t in timings)
                out.append(Candidate(name, c, float(mhz), int(c * w["dsp"]), c * w["bram36k"],
                                     int(c * w["lut"]), latency * 1e3, fps, fps * ops / 1e9,
                                     ddr_fps < core_fps and ddr_fps <= host_fps, ddr,
                                     dataclasses.replace(arch, cores=c), int(bus), usage, int(c * w["uram"]),
                                     cpu_s * 1e3, host_fps < min(core_fps, ddr_fps)))
    if not out:
        raise PlanError(f"no DPU configuration fits dsp={dsp}, bram36k={bram36k}"
                        f"{'' if lut is None else f', lut={lut}'} (the smallest, B512, needs "
                        f"{table['B512']['dsp']} DSP and {table['B512']['bram36k']} BRAM36K per core)")
    # ties (the same DPU and cores built differently): fewer DSP, then fewer URAM
    out.sort(key=lambda c: (-c.fps, c.latency_ms, c.dsp, c.uram))
    return out


def model_graphs(model: Any) -> list:
    """The quantized XGraph of every DPU subgraph of `model` (a CompiledModel built in this process, or an artifact
    with verification data), in call order; PlanError otherwise."""
    if not model.runners:
        raise PlanError("the model has no DPU subgraph: nothing to explore")
    missing = [sym for sym, r in model.runners.items() if r.graph is None]
    if missing:
        raise PlanError(f"exploring needs the quantized XGraph of every DPU subgraph ({', '.join(missing)} has "
                        "none: an artifact without verification data)")
    return [r.graph for r in model.runners.values()]


def model_cpu_seconds(model: Any) -> float:
    """Seconds of the model's CPU ops per frame on the host (the measured host cost model; 0 without the Relax
    module)."""
    if model.relax_module is None:
        return 0.0
    from tvm_dpu.pipeline.stages import cpu_ops_seconds
    from tvm_dpu.timing.host import load_host_cost

    main = model.relax_module["main"]
    bindings = [b for block in main.body.blocks for b in block.bindings
                if not (hasattr(b.value, "op") and getattr(b.value.op, "name_hint", None) in model.runners)]
    return cpu_ops_seconds(load_host_cost(), bindings)


def part_conditions(part: str, reserve: bool = True) -> dict[str, Any]:
    """What `explore_part` assumes for `part`: the budget (PL less the platform reserve), the DPU clock of the board
    carrying it (presets.json) and that board's DDR bandwidth (parts.json), each sourced in its file."""
    from tvm_dpu.arch import load_arch
    from tvm_dpu.arch.parts import part_ddr, part_info, platform_reserve

    info = device_budget(part)
    board = part_info(part)["board"]
    taken = platform_reserve() if reserve else {}
    budget = {k: max(0.0, info[k] - taken.get(k, 0.0)) for k in ("dsp", "bram36k", "lut", "uram")}
    ddr, _ = part_ddr(part)
    if board is None:
        return {"budget": budget, "board": None, "clock_mhz": 300.0, "ddr_bytes_per_s": ddr or 17.1e9,
                "note": "no board preset carries this part: 300 MHz and the ZCU102 DDR figure assumed"}
    return {"budget": budget, "board": board, "clock_mhz": load_arch(board).freq_mhz, "ddr_bytes_per_s": ddr}


def explore_part(model: Any, part: str, max_cores: int = 4, fusion: str = "optimal", reserve: bool = True,
                 cache: dict | None = None, archs: Sequence[str] | None = None) -> list[Candidate]:
    """Every configuration that fits `part` as AMD's boards build it, ranked (module docstring): RAM usage low,
    depthwise convolution on, both DSP usages, the UltraRAM option where the part has URAM, the platform reserve,
    the carrying board's DPU clock and DDR bandwidth. `archs` restricts the core sizes (e.g. ("B4096",): one core
    size for every board, as AMD's model zoo ships)."""
    cond = part_conditions(part, reserve)
    b = cond["budget"]
    return explore(model, int(b["dsp"]), b["bram36k"], int(b["lut"]), (cond["clock_mhz"],), max_cores,
                   ("high", "low"), cond["ddr_bytes_per_s"], fusion, int(b["uram"]), "low", cache, True, archs)


def table_text(cands: Sequence[Candidate], limit: int = 20) -> str:
    rows = [f"{'rank':>4} {'dpu':<6} {'cores':>5} {'MHz':>5} {'DSP':>5} {'usage':>5} {'BRAM36K':>8} {'URAM':>5} "
            f"{'LUT':>7} {'latency ms':>10} {'frames/s':>9} {'GOPS(2)':>7}  bound"]
    cpu = max((c.cpu_ms for c in cands), default=0.0)
    for i, c in enumerate(cands[:limit]):
        rows.append(f"{i + 1:>4} {c.dpu:<6} {c.cores:>5} {c.freq_mhz:>5.0f} {c.dsp:>5} {c.dsp_usage:>5} "
                    f"{c.bram36k:>8.1f} {c.uram:>5} {c.lut:>7} {c.latency_ms:>10.3f} {c.fps:>9.1f} {c.gops:>7.1f}  "
                    f"{'host' if c.host_bound else 'DDR' if c.ddr_bound else 'cores'}")
    if cpu > 0:
        rows.append(f"CPU ops on the host: {cpu:.3f} ms per frame (host cost model, every configuration)")
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
                                    dsp_usage, float(b.get("ddr_bytes_per_s", 17.1e9)), fusion,
                                    int(b.get("uram", 0)))]
        best = min(cands, key=lambda c: (c.latency_ms, c.dsp))
        boards.append(Board(f"board{i}", f"{best.dpu}@{best.freq_mhz:g}MHz", ddr_bytes, spec=best.arch))
    return boards
