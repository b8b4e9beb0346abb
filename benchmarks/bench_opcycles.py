"""Where the simulated cycles of the per-op (unfused) programs go: per network and arch, the CONV engine's busy
time split into compute (kh*kw*cg*L) and per-instruction fill (conv_fill_cycles per CONV), the time the CONV
engine idles, and per op type the cycles the op adds to the total (timing.simulate OpTiming.cycles) against its
CONV / MISC busy time.

    python benchmarks/bench_opcycles.py --cache /tmp/uxg [--models googlenet] [--archs dnnvm-zu2] [--mode none]

The XGraphs come from bench_fusion.xgraphs (same --cache files). --mode picks the fusion plan compiled
(none = every op alone: the per-op code generator's programs).
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def breakdown(graphs, arch, mode: str) -> dict:
    """Totals over the model's DPU subgraphs (see module docstring)."""
    from tvm_dpu.codegen.compiler import compile_graph_fused
    from tvm_dpu.codegen.isa import decode_program
    from tvm_dpu.fusion.select import plan_fusion
    from tvm_dpu.timing.analytic import graph_ops
    from tvm_dpu.timing.params import machine
    from tvm_dpu.timing.simulate import simulate
    from tvm_dpu.xgraph.ops import layer_descs

    fill = machine(arch).params.conv_fill_cycles
    tot = defaultdict(float)
    per_type: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for g in graphs:
        cs = compile_graph_fused(g, arch, plan_fusion(g, arch, mode), keep_params=False)
        r = simulate(cs.code, arch, op_ranges=cs.op_ranges)
        n_conv = sum(1 for n in r.names if n == "CONV")
        tot["cycles"] += r.cycles
        tot["ops"] += graph_ops(layer_descs(g))
        tot["conv_instrs"] += n_conv
        tot["instrs"] += len(r.names)
        tot["conv_fill"] += n_conv * fill
        for e, b in r.engine_busy.items():
            tot[f"busy_{e}"] += b
        types = {op.name: op.type for op in g.ops}
        for ot in r.ops:
            t = "+".join(sorted({types.get(n, "?") for n in ot.name.split("+")}))
            d = per_type[t]
            d["n"] += 1
            d["cycles"] += ot.cycles
            d["conv_busy"] += ot.busy.get("conv", 0.0)
            d["misc_busy"] += ot.busy.get("misc", 0.0)
            d["load_busy"] += ot.busy.get("load", 0.0)
            d["save_busy"] += ot.busy.get("save", 0.0)
    tot["conv_compute"] = tot["busy_conv"] - tot["conv_fill"]
    tot["conv_idle"] = tot["cycles"] - tot["busy_conv"]
    hz = arch.freq_mhz * 1e6
    tot["util"] = tot["ops"] / (tot["cycles"] / hz) / (arch.pp * arch.icp * arch.ocp * 2 * hz)
    return {"total": dict(tot), "per_type": {k: dict(v) for k, v in per_type.items()}}


def _print(name: str, an: str, b: dict) -> None:
    t = b["total"]
    c = t["cycles"]
    print(f"{name} @ {an}: {c / 1e6:.2f} Mcycles, utilisation {t['util']:.1%}, {int(t['instrs'])} instrs, "
          f"{int(t['conv_instrs'])} CONV")
    print(f"  CONV engine: compute {t['conv_compute'] / c:.1%}  fill {t['conv_fill'] / c:.1%}  idle "
          f"{t['conv_idle'] / c:.1%} | busy LOAD {t['busy_load'] / c:.1%} SAVE {t['busy_save'] / c:.1%} "
          f"MISC {t['busy_misc'] / c:.1%}")
    print(f"  {'op type':<24}{'n':>5}{'cycles':>8}{'conv':>7}{'misc':>7}{'load':>7}{'save':>7}  (share of total)")
    for k, d in sorted(b["per_type"].items(), key=lambda kv: -kv[1]["cycles"]):
        print(f"  {k:<24}{int(d['n']):>5}{d['cycles'] / c:>8.1%}{d['conv_busy'] / c:>7.1%}"
              f"{d['misc_busy'] / c:>7.1%}{d['load_busy'] / c:>7.1%}{d['save_busy'] / c:>7.1%}")


def main(argv=None) -> int:
    from bench_fusion import xgraphs
    from tvm_dpu.arch import load_arch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["vgg16", "resnet50", "resnet152", "googlenet"])
    ap.add_argument("--archs", nargs="+", default=["dnnvm-zu2"])
    ap.add_argument("--mode", default="none")
    ap.add_argument("--cache", type=Path, default=None)
    a = ap.parse_args(argv)
    for name in a.models:
        for an in a.archs:
            graphs, _ = xgraphs(name, an, a.cache)
            _print(name, an, breakdown(graphs, load_arch(an), a.mode))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
