"""DNNVM Table 3 equivalent: fusion search cost and speedup (none / greedy / optimal) on full-size zoo models.

For each model and arch the quantized DPU XGraphs come from `tvm_dpu.build` (one random calibration batch:
fix_points do not change the schedule); with --cache DIR they are saved/loaded as DIR/<model>@<arch>_<i>.xg
(tvm_dpu.xgraph.save, no pickle), so "graph ms" is measured on the first run only.
Per arch and mode, three throughputs (GOPS = the graph's 2*MACs / time): the cost model's for the plan over all
templates (the search the paper times; its median time over --repeat runs is "search ms"), the cost model's for
the plan restricted to groups with a fused emitter (FUSED_EMITTERS + emittable), and tvm_dpu.timing.simulate on
the program the builder ships: the plan searched as fusion.select.compile_with_fusion searches it (candidates
costed by BUILD_COST_SOURCE, the simulator), kept unless a simpler plan the build compares it with
(backend.dpu_compile.fallback_modes: none, and greedy where the search did not settle its regions in context)
simulates faster ("sim_fallbacks_<mode>" counts those per subgraph; "sim_lost_to_<mode>" counts the subgraphs where
each simpler plan, greedy included, simulates faster than the searched one); "opt/sim" is the simulated
throughput of the searched optimal plan before that check. The DNNVM Table 3 comparison (printed last,
"table3_<mode>" in the JSON) counts the conv part only (TABLE3_SCOPE: fully connected layers excluded from ops
and cycles, as DNNVM ran them on the CPU).

    python benchmarks/bench_fusion.py [--models vgg16 resnet50 ...] [--archs dnnvm-zu2 DPUCZDX8G_ISA1_B4096]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from table3 import TABLE3_SCOPE, is_fully_connected, table3  # noqa: E402  (benchmarks/table3.py)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_io import write_results  # noqa: E402  (benchmarks/results_io.py)

PAPER = {"vgg16": (325.5, 331.5, 334.0, 1.03), "resnet50": (195.4, 221.9, 228.7, 1.17),
         "resnet152": (212.5, 233.0, 244.1, 1.15), "googlenet": (183.1, 204.6, 231.5, 1.26)}
MODELS = ("vgg16", "resnet50", "resnet152", "googlenet", "mobilenetv2")
ARCHS = ("dnnvm-zu2", "DPUCZDX8G_ISA1_B4096")


def xgraphs(name: str, arch: str, cache: Path | None) -> tuple[list, float]:
    """The model's quantized DPU XGraphs for `arch` and the graph generation time (import + partition + XGraph)
    in s."""
    from tvm_dpu.xgraph import load, save

    files = sorted(cache.glob(f"{name}@{arch}_*.xg")) if cache else []
    meta = cache / f"{name}@{arch}.json" if cache else None
    if files and meta and meta.exists():
        return [load(f) for f in files], json.loads(meta.read_text())["t_graph"]
    import tvm_dpu
    from tvm_dpu import zoo

    model = tvm_dpu.build(zoo.build_model(name), arch=arch, calibration=[zoo.random_input(name)], progress=False)
    t = model.build_info["times_s"]
    # the build reports partitioning together with the CPU part's TVM compile
    t_graph = t["import_normalize"] + t["partition_and_cpu_compile"] + t["xgraph"]
    graphs = [r.graph for r in model.runners.values()]
    if cache:
        cache.mkdir(parents=True, exist_ok=True)
        for i, g in enumerate(graphs):
            save(g, cache / f"{name}@{arch}_{i}.xg")
        meta.write_text(json.dumps({"t_graph": t_graph}))
    return graphs, t_graph


def _simulator():
    try:
        from tvm_dpu.timing.simulate import simulate
        return simulate
    except Exception:  # the timing model is not there (yet)
        return None


def run(models, archs, cache, repeat) -> list[dict]:
    from tvm_dpu.arch import load_arch
    from tvm_dpu.codegen.tiling import CodegenError
    from tvm_dpu.codegen.compiler import compile_graph_fused
    from tvm_dpu.codegen.fused import FUSED_EMITTERS, emittable
    from tvm_dpu.fusion.cost import cost_source
    from tvm_dpu.fusion.select import BUILD_COST_SOURCE, compile_with_fusion
    from tvm_dpu.backend.dpu_compile import fallback_modes
    from tvm_dpu.timing.analytic import graph_ops
    from tvm_dpu.xgraph.ops import layer_descs
    from tvm_dpu.fusion.select import MODES, plan_fusion

    simulate = _simulator()
    rows = []
    for name in models:
        for an in archs:
            graphs, t_graph = xgraphs(name, an, cache)
            arch = load_arch(an)
            row = {"model": name, "arch": an, "nodes": sum(len(g.ops) for g in graphs),
                   "t_graph_ms": None if t_graph is None else t_graph * 1e3}
            search = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                plans = [plan_fusion(g, arch, "optimal") for g in graphs]
                search.append(time.perf_counter() - t0)
            row["t_search_ms"] = statistics.median(search) * 1e3
            row["t_isomorphism_ms"] = sum(p.stats["t_isomorphism"] for p in plans) * 1e3
            row["t_selection_ms"] = sum(p.stats["t_selection"] for p in plans) * 1e3
            row["fallbacks"] = sum(p.stats.get("fallback", 0) for p in plans)
            row["subgraphs"] = len(graphs)
            work = sum(graph_ops(layer_descs(g)) for g in graphs)
            hz = arch.freq_mhz * 1e6
            sims_by_mode = {}
            for mode in MODES:
                # every template (the search the paper times) -> cost model only
                row[f"gops_modelall_{mode}"] = work / (sum(plan_fusion(g, arch, mode).cost for g in graphs) / hz) / 1e9
                # the templates with a fused emitter: the cost model's plan, and the plan the builder compiles
                # (candidates costed as fusion.select.compile_with_fusion costs them), compiled and simulated
                row[f"gops_model_{mode}"] = work / (sum(plan_fusion(g, arch, mode, FUSED_EMITTERS, emittable).cost
                                                        for g in graphs) / hz) / 1e9
                t0 = time.perf_counter()
                try:  # as the builder plans and compiles it (the plan's conv_add tilings included)
                    pairs = [compile_with_fusion(g, arch, mode) for g in graphs]
                    compiled, ps = [c for c, _ in pairs], [p for _, p in pairs]
                except CodegenError as e:  # the code generator cannot map some op on this arch
                    with cost_source(BUILD_COST_SOURCE):
                        ps = [plan_fusion(g, arch, mode, FUSED_EMITTERS, emittable) for g in graphs]
                    compiled = None
                    row["codegen_error"] = str(e)
                row[f"t_compile_{mode}_s"] = time.perf_counter() - t0
                row[f"fused_{mode}"] = sum(len(p.fused()) for p in ps)
                if simulate is not None and compiled is not None:
                    sims = [simulate(c.code, arch, op_ranges=c.op_ranges) for c in compiled]
                    searched = sims
                    simpler = [m for m in ({"optimal": ("greedy", "none"), "greedy": ("none",)}.get(mode, ()))
                               if m in sims_by_mode]
                    if simpler:
                        # how often a simpler plan (greedy, none) simulates faster than the searched one, and what
                        # tvm_dpu.backend.dpu_compile.compile_subgraph ships: the searched plan unless one of the
                        # simpler plans it compares (fallback_modes) is faster for that subgraph
                        row[f"gops_sim_{mode}_searched"] = work / (sum(r.cycles for r in sims) / hz) / 1e9
                        row[f"sim_lost_to_{mode}"] = {m: sum(o.cycles < r.cycles for r, o in zip(sims, sims_by_mode[m]))
                                                      for m in simpler}
                        picked, kept = [], []
                        for i, (r, p) in enumerate(zip(sims, ps)):
                            alts = [(sims_by_mode[m][i], m) for m in fallback_modes(p, len(graphs[i].ops))
                                    if m in sims_by_mode]
                            best = min([(r, None)] + alts, key=lambda a: a[0].cycles)  # ties: the searched plan
                            picked.append(best[0])
                            if best[1] is not None:
                                kept.append(best[1])
                        row[f"sim_fallbacks_{mode}"] = {m: kept.count(m) for m in simpler}
                        if mode == "optimal":
                            row["sim_fallbacks"] = len(kept)
                        sims = picked
                    sims_by_mode[mode] = searched
                    row[f"gops_sim_{mode}"] = work / (sum(r.cycles for r in sims) / hz) / 1e9
                    row[f"table3_{mode}"] = table3(graphs, sims, arch)
                    row[f"sim_{mode}"] = {
                        "cycles": sum(r.cycles for r in sims),
                        "ddr_bytes": sum(r.ddr_read_bytes + r.ddr_write_bytes for r in sims),
                        "engine_busy": {e: sum(r.engine_busy.get(e, 0.0) for r in sims) for e in sims[0].engine_busy}}
            # Algorithm 2 with the simulator as the cost of every candidate (DNNVM's simulator evaluation)
            t0 = time.perf_counter()
            with cost_source("simulate"):
                ps = [plan_fusion(g, arch, "optimal", FUSED_EMITTERS, emittable) for g in graphs]
            row["t_search_simcost_s"] = time.perf_counter() - t0
            if simulate is not None and row.get("codegen_error") is None:
                cyc = sum(simulate(compile_graph_fused(g, arch, p).code, arch).cycles for g, p in zip(graphs, ps))
                row["gops_sim_optimal_simcost"] = work / (cyc / hz) / 1e9
            for src in ("modelall", "model", "sim"):
                if f"gops_{src}_none" in row:
                    row[f"speedup_{src}"] = row[f"gops_{src}_optimal"] / row[f"gops_{src}_none"]
            row["paper"] = PAPER.get(name)
            rows.append(row)
            print(_fmt(row), flush=True)
    return rows


_COLS = f"{'none':>7}{'greedy':>7}{'optim':>7}{'speedup':>8}"
HEADER = (f"{'model':<12}{'arch':<22}{'nodes':>6}{'graph ms':>10}{'iso ms':>8}{'sel ms':>8}{'search ms':>10}"
          f"{'compile s':>10} | {_COLS} model, all templates | {_COLS} model, emitted | "
          f"{_COLS} simulated {'opt/sim':>7} | "
          "paper none/greedy/opt speedup   (GOPS)")


def _fmt(r: dict) -> str:
    def cols(src: str) -> str:
        g = "".join(f"{r.get(f'gops_{src}_{m}', float('nan')):7.1f}" for m in ("none", "greedy", "optimal"))
        return f"{g}{r.get(f'speedup_{src}', float('nan')):>7.2f}x"

    paper = " ".join(str(x) for x in r["paper"]) if r["paper"] else "-"
    t_graph = r["t_graph_ms"] if r["t_graph_ms"] is not None else float("nan")
    return (f"{r['model']:<12}{r['arch']:<22}{r['nodes']:>6}{t_graph:>10.1f}{r['t_isomorphism_ms']:>8.1f}"
            f"{r['t_selection_ms']:>8.1f}{r['t_search_ms']:>10.1f}{r['t_compile_optimal_s']:>10.2f} | "
            f"{cols('modelall')} | {cols('model')} | {cols('sim')} "
            f"{r.get('gops_sim_optimal_simcost', float('nan')):7.1f} | {paper}")


def table3_lines(rows: list[dict], arch_name: str = "dnnvm-zu2") -> list[str]:
    """The DNNVM Table 3 comparison on `arch_name`: utilisation of the shipped plan (conv part, TABLE3_SCOPE) vs
    DNNVM's on-board optimal GOPS over the same peak, with the none/greedy/optimal GOPS of the conv part."""
    from tvm_dpu.arch import load_arch

    out = [f"Table 3 on {arch_name} ({TABLE3_SCOPE}):",
           f"  {'model':<12}{'none':>8}{'greedy':>8}{'optim':>8}{'speedup':>8}{'util':>8}{'DNNVM':>8}  FC on the DPU"]
    for r in rows:
        if r["arch"] != arch_name or not r["paper"] or "table3_optimal" not in r:
            continue
        arch = load_arch(arch_name)
        peak = arch.pp * arch.icp * arch.ocp * 2 * arch.freq_mhz / 1e3
        g = {m: r[f"table3_{m}"]["gops"] for m in ("none", "greedy", "optimal")}
        t = r["table3_optimal"]
        out.append(f"  {r['model']:<12}{g['none']:8.1f}{g['greedy']:8.1f}{g['optimal']:8.1f}"
                   f"{g['optimal'] / g['none']:7.2f}x{100 * t['utilisation']:7.1f}%{100 * r['paper'][2] / peak:7.0f}%"
                   f"  {', '.join(t['fc_on_dpu']) or '-'}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--archs", nargs="+", default=list(ARCHS))
    ap.add_argument("--cache", type=Path, default=None)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "fusion.json")
    a = ap.parse_args(argv)
    print(HEADER)
    rows = run(a.models, a.archs, a.cache, a.repeat)
    fb = sum(r["fallbacks"] for r in rows)
    n = sum(r["subgraphs"] for r in rows)
    print(f"search (analytic cost): optimal fell back to greedy in {fb} of {n} subgraph searches")
    lost = {m: sum(r.get("sim_lost_to_optimal", {}).get(m, 0) for r in rows) for m in ("greedy", "none")}
    kept = {m: sum(r.get("sim_fallbacks_optimal", {}).get(m, 0) for r in rows) for m in ("greedy", "none")}
    print(f"simulator: the searched optimal plan lost to greedy's in {lost['greedy']} and to the unfused plan in "
          f"{lost['none']} of {n} subgraphs; the build fell back to greedy in {kept['greedy']} and to none in "
          f"{kept['none']}")
    for line in table3_lines(rows):
        print(line)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    write_results(a.out, rows, indent=1)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
