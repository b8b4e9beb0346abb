"""End-to-end benchmark: build zoo CNNs for a DPU once, then time `model.run` on the emulator device.

For each model: one build, one first run (includes compiling the machine code into the emulator's cached step
list), then `--runs` timed runs. Per run it records the wall time of `model.run` and the emulator's own time
(`EmuStats.seconds`, summed over DPU subgraphs); the table shows median / min / max of both, instructions, MACs
and GMAC/s (MACs / median emulator time). JSON goes to benchmarks/results/e2e.json by default.

    python benchmarks/bench_e2e.py                       # full-size ResNet-50, 5 runs
    python benchmarks/bench_e2e.py --models resnet50,mobilenetv2,googlenet --runs 5
    python benchmarks/bench_e2e.py --quick               # reduced ResNet-50, 2 runs (smoke test)
    python benchmarks/bench_e2e.py --blas-threads 2      # BLAS threads during emulation (0: leave as is)
    TVM_DPU_EMU_GEMM=float32 python benchmarks/bench_e2e.py   # CONV GEMMs on float32 BLAS, not the int8 kernel
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "e2e.json"
DEFAULT_ARCH = "DPUCZDX8G_ISA1_B4096"


def emulator_stats(model) -> list:
    """EmuStats of the last run of every DPU subgraph that ran on the emulator."""
    out = []
    for runner in model.runners.values():
        stats = getattr(runner.device, "last_stats", None)
        if stats is not None:
            out.append(stats)
    return out


def bench_model(name: str, arch: str, runs: int, reduced: bool) -> dict:
    """Build `name` once and time `runs` runs; returns one result row."""
    import tvm_dpu
    from tvm_dpu import zoo

    onnx_model = zoo.build_model(name, reduced=reduced)
    t0 = time.perf_counter()
    model = tvm_dpu.build(onnx_model, arch=arch, calibration=[zoo.random_input(onnx_model, seed=0)],
                          progress=False)
    build_s = time.perf_counter() - t0
    x = zoo.random_input(onnx_model, seed=1)
    t0 = time.perf_counter()
    first = model.run(x)
    first_s = time.perf_counter() - t0
    first_emu = sum(s.seconds for s in emulator_stats(model))
    wall, emu = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        out = model.run(x)
        wall.append(time.perf_counter() - t0)
        emu.append(sum(s.seconds for s in emulator_stats(model)))
        if not all(np.array_equal(a, b) for a, b in zip(first, out)):
            raise SystemExit(f"{name}: outputs differ between runs of the same input")
    stats = emulator_stats(model)
    if not stats:
        raise SystemExit(f"{name}: no DPU subgraph ran on the emulator")
    # onnxruntime float on the same input, timed in this run (interleaving would share the load more evenly,
    # but the emulator runs above are the figure of record; these come right after them).
    import onnxruntime as ort

    sess = ort.InferenceSession(onnx_model.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = {sess.get_inputs()[0].name: x}
    sess.run(None, feed)
    ort_s = []
    for _ in range(runs):
        t0 = time.perf_counter()
        sess.run(None, feed)
        ort_s.append(time.perf_counter() - t0)
    macs = sum(s.macs for s in stats)
    emu_median = statistics.median(emu)
    counts: dict[str, int] = {}
    for s in stats:
        for k, v in s.counts.items():
            counts[k] = counts.get(k, 0) + v
    return {
        "model": name, "reduced": reduced, "arch": arch, "subgraphs": len(stats), "build_s": build_s,
        "first_run_s": first_s, "first_run_emulator_s": first_emu,
        "run_s": {"median": statistics.median(wall), "min": min(wall), "max": max(wall), "all": wall},
        "emulator_s": {"median": emu_median, "min": min(emu), "max": max(emu), "all": emu},
        "instructions": sum(s.instructions for s in stats), "counts": counts, "macs": macs,
        "gmacs_per_s": macs / emu_median / 1e9 if emu_median > 0 else None,
        "onnxruntime_s": {"median": statistics.median(ort_s), "all": ort_s},
        "run_over_onnxruntime": statistics.median(wall) / statistics.median(ort_s),
        "goals": {"run_s_median_max": 0.6, "run_over_onnxruntime_max": 4.0},
    }


def print_table(rows: list[dict]) -> None:
    head = (f"{'model':<14}{'build s':>8}{'1st s':>7}{'run med':>8}{'min':>7}{'max':>7}{'emu med':>8}{'min':>7}"
            f"{'max':>7}{'instrs':>8}{'GMAC':>7}{'GMAC/s':>8}{'ort s':>7}{'x ort':>6}")
    print(head)
    for r in rows:
        run, emu = r["run_s"], r["emulator_s"]
        name = r["model"] + (" (red.)" if r["reduced"] else "")
        print(f"{name:<14}{r['build_s']:>8.1f}{r['first_run_s']:>7.2f}{run['median']:>8.3f}{run['min']:>7.3f}"
              f"{run['max']:>7.3f}{emu['median']:>8.3f}{emu['min']:>7.3f}{emu['max']:>7.3f}"
              f"{r['instructions']:>8}{r['macs'] / 1e9:>7.2f}{r['gmacs_per_s'] or 0:>8.2f}"
              f"{r['onnxruntime_s']['median']:>7.3f}{r['run_over_onnxruntime']:>6.1f}")
    print("goals: full ResNet-50 run median <= 0.6 s (issue 12), and <= 4x onnxruntime float in the same run (issue 23)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50", help="comma-separated zoo names (default resnet50)")
    ap.add_argument("--arch", default=DEFAULT_ARCH)
    ap.add_argument("--runs", type=int, default=None, help="timed runs per model (default 5, 2 with --quick)")
    ap.add_argument("--quick", action="store_true", help="reduced model variants (smoke test of this script)")
    ap.add_argument("--blas-threads", type=int, default=None,
                    help="OpenBLAS threads during emulation (TVM_DPU_EMU_BLAS_THREADS; 0 leaves BLAS as is)")
    ap.add_argument("--json", default=str(DEFAULT_JSON), help=f"output file (default {DEFAULT_JSON})")
    a = ap.parse_args(argv)
    runs = a.runs if a.runs is not None else (2 if a.quick else 5)
    if runs < 1:
        ap.error("--runs must be >= 1")
    if a.blas_threads is not None:
        os.environ["TVM_DPU_EMU_BLAS_THREADS"] = str(a.blas_threads)
    warnings.simplefilter("ignore")
    rows = [bench_model(name.strip(), a.arch, runs, a.quick) for name in a.models.split(",") if name.strip()]
    print_table(rows)
    from tvm_dpu.runtime import emu_gemm

    doc = {"runs": runs, "blas_threads": os.environ.get("TVM_DPU_EMU_BLAS_THREADS", "default"),
           "conv_gemm": "int8 (AVX-512 VNNI kernel)" if emu_gemm.available() else "float32 BLAS",
           "cpu_count": os.cpu_count(), "load_avg": os.getloadavg() if hasattr(os, "getloadavg") else None,
           "python": sys.version.split()[0], "numpy": np.__version__, "machine": platform.machine(), "models": rows}
    print(f"CONV GEMM: {doc['conv_gemm']}; load average {doc['load_avg']}")
    out = Path(a.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
