"""End-to-end benchmark: build zoo CNNs for a DPU once, then time `model.run` on the emulator device.

For each model: one build, one first run (includes compiling the machine code into the emulator's cached step
list), then `--runs` timed runs. Per run it records the wall time of `model.run` and the emulator's own time
(`EmuStats.seconds`, summed over DPU subgraphs); the table shows median / min / max of both, instructions, MACs
and GMAC/s (MACs / median emulator time). JSON goes to benchmarks/results/e2e.json by default.

    python benchmarks/bench_e2e.py                       # full-size ResNet-50, 5 runs
    python benchmarks/bench_e2e.py --models resnet50,mobilenetv2,googlenet --runs 5
    python benchmarks/bench_e2e.py --quick               # reduced ResNet-50, 2 runs (smoke test)
    python benchmarks/bench_e2e.py --blas-threads 2      # BLAS threads during emulation (0: leave as is)
    python benchmarks/bench_e2e.py --models mobilenetv2,resnet50 --busy 2 --json results/e2e_loaded.json
    python benchmarks/bench_e2e.py --xmodel /path/to/mobilenetv2_kv260.xmodel --xmodel-goal 0.3   # vai_c's program

--busy N starts N CPU-bound busy-loop processes (at the benchmark's priority) BUSY_LEAD_S before the first build and
stops them at the end; the JSON's "condition" says so. --xmodel PATH (repeatable) times a vai_c .xmodel's warm
runs on the emulator as `tvm-dpu run` does (load_xmodel, random normal input, seed 0): one first run (it compiles
the program), then --runs timed runs; those rows go under "xmodels", with --xmodel-goal as their median goal.
    TVM_DPU_EMU_GEMM=float32 python benchmarks/bench_e2e.py   # CONV GEMMs on float32 BLAS, not the int8 kernel
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_io import write_results  # noqa: E402  (benchmarks/results_io.py)

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "e2e.json"
DEFAULT_ARCH = "DPUCZDX8G_ISA1_B4096"
#: Seconds the --busy processes run before the first measurement (the machine is loaded from the start).
BUSY_LEAD_S = 5.0


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


def _spread(times: list[float]) -> dict:
    return {"median": statistics.median(times), "min": min(times), "max": max(times), "all": times}


def bench_xmodel(path: str, runs: int, goal_s: float | None) -> dict:
    """Time `runs` warm runs of a vai_c .xmodel on the emulator (after one first run, which compiles it)."""
    from tvm_dpu.emulator import gemm as emu_gemm
    from tvm_dpu.xmodel.runner import load_xmodel

    model = load_xmodel(path)
    rng = np.random.default_rng(0)
    feeds = {s.name: rng.standard_normal(s.shape).astype(np.float32) for s in model.inputs}
    t0 = time.perf_counter()
    first = model.run(feeds)
    first_s = time.perf_counter() - t0
    wall, emu = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        out = model.run(feeds)
        wall.append(time.perf_counter() - t0)
        emu.append(sum(s.seconds for s in model.last_stats.values()))
        if not all(np.array_equal(a, b) for a, b in zip(first, out)):
            raise SystemExit(f"{path}: outputs differ between runs of the same input")
    stats = list(model.last_stats.values())
    counts: dict[str, int] = {}
    for st in stats:
        for k, v in st.counts.items():
            counts[k] = counts.get(k, 0) + v
    return {"xmodel": Path(path).name, "arch": model.arch.name, "subgraphs": len(stats), "first_run_s": first_s,
            "run_s": _spread(wall), "emulator_s": _spread(emu), "instructions": sum(counts.values()),
            "counts": counts, "macs": sum(st.macs for st in stats),
            "conv_gemm": "int8 (AVX-512 VNNI kernel)" if emu_gemm.available() else "float32 BLAS",
            "goals": {} if goal_s is None else {"run_s_median_max": goal_s}}


def print_xmodel_table(rows: list[dict]) -> None:
    print(f"{'vai_c xmodel':<44}{'1st s':>7}{'run med':>8}{'min':>7}{'max':>7}{'emu med':>8}{'instrs':>8}  goal")
    for r in rows:
        run = r["run_s"]
        goal = r["goals"].get("run_s_median_max")
        verdict = "" if goal is None else f"<= {goal:g} s: {'met' if run['median'] <= goal else 'missed'}"
        print(f"{r['xmodel'][:43]:<44}{r['first_run_s']:>7.2f}{run['median']:>8.3f}{run['min']:>7.3f}"
              f"{run['max']:>7.3f}{r['emulator_s']['median']:>8.3f}{r['instructions']:>8}  {verdict}")


def start_busy(n: int) -> list[subprocess.Popen]:
    """n CPU-bound busy-loop processes (this process's priority), given BUSY_LEAD_S to load the machine."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    if procs:
        time.sleep(BUSY_LEAD_S)
    return procs


def stop_busy(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
        p.wait()


def busy_condition(n: int) -> str:
    return (f"loaded: {n} CPU-bound busy-loop processes (python -c 'while True: pass', at the benchmark's priority) "
            f"ran throughout, started {BUSY_LEAD_S:g} s before; the load average above lags them")


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
    ap.add_argument("--models", default=None,
                    help="comma-separated zoo names (default resnet50, none when --xmodel is given)")
    ap.add_argument("--arch", default=DEFAULT_ARCH)
    ap.add_argument("--runs", type=int, default=None, help="timed runs per model (default 5, 2 with --quick)")
    ap.add_argument("--quick", action="store_true", help="reduced model variants (smoke test of this script)")
    ap.add_argument("--blas-threads", type=int, default=None,
                    help="OpenBLAS threads during emulation (TVM_DPU_EMU_BLAS_THREADS; 0 leaves BLAS as is)")
    ap.add_argument("--xmodel", action="append", default=[], metavar="PATH",
                    help="also time the warm runs of this vai_c .xmodel (repeatable)")
    ap.add_argument("--xmodel-goal", type=float, default=None, metavar="S",
                    help="goal for the --xmodel rows' median run time in seconds (recorded in the JSON)")
    ap.add_argument("--busy", type=int, default=0, metavar="N",
                    help="run N busy-loop processes throughout (a loaded measurement; recorded as its condition)")
    ap.add_argument("--json", default=str(DEFAULT_JSON), help=f"output file (default {DEFAULT_JSON})")
    a = ap.parse_args(argv)
    runs = a.runs if a.runs is not None else (2 if a.quick else 5)
    if runs < 1:
        ap.error("--runs must be >= 1")
    if a.busy < 0:
        ap.error("--busy must be >= 0")
    missing = [p for p in a.xmodel if not Path(p).is_file()]
    if missing:
        ap.error(f"--xmodel: no such file: {', '.join(missing)}")
    if a.blas_threads is not None:
        os.environ["TVM_DPU_EMU_BLAS_THREADS"] = str(a.blas_threads)
    warnings.simplefilter("ignore")
    names = a.models if a.models is not None else ("" if a.xmodel else "resnet50")
    busy = start_busy(a.busy)
    try:
        # vai_c programs first: before a build imports TVM, their CONVs run as `tvm-dpu run` runs them
        xrows = [bench_xmodel(p, runs, a.xmodel_goal) for p in a.xmodel]
        rows = [bench_model(name.strip(), a.arch, runs, a.quick) for name in names.split(",") if name.strip()]
        load_end = os.getloadavg() if hasattr(os, "getloadavg") else None
    finally:
        stop_busy(busy)
    if rows:
        print_table(rows)
    if xrows:
        print_xmodel_table(xrows)
    from tvm_dpu.emulator import gemm as emu_gemm

    doc = {"runs": runs, "blas_threads": os.environ.get("TVM_DPU_EMU_BLAS_THREADS", "default"),
           "conv_gemm": "int8 (AVX-512 VNNI kernel)" if emu_gemm.available() else "float32 BLAS",
           "cpu_count": os.cpu_count(), "load_avg": load_end,
           "python": sys.version.split()[0], "numpy": np.__version__, "machine": platform.machine(), "models": rows}
    if xrows:
        doc["xmodels"] = xrows
    if a.busy:
        doc["condition"] = busy_condition(a.busy)
    print(f"CONV GEMM: {doc['conv_gemm']}; load average {doc['load_avg']}")
    print(f"wrote {write_results(a.json, doc)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
