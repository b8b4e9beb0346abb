"""Compile-time benchmark: `tvm-dpu compile` of zoo models, each in a fresh process, as a user runs it.

For each model: the ONNX file and a calibration .npz (`--calib-images` random inputs) are written once, then
`python -m tvm_dpu.cli compile` runs `--runs` times. Per run it records the wall time from process start to exit
(Python and TVM imports included; tvm_dpu byte-compiled beforehand, as an installed package is, unless
`--source-imports`), the process's peak RSS (`wait4` rusage), and the phases the CLI writes into
report.json (`build.times_s`; process seconds per phase in `build.cpu_times_s`). Models are built in a
separate process: a child's ru_maxrss starts at its parent's high-water mark, so this process must stay small. The table gives medians with the goals (issues 12, 23) beside them; JSON goes to
benchmarks/results/compile.json by default. The load average at the start is recorded: figures taken while other
jobs run are slower.

    python benchmarks/bench_compile.py                          # ResNet-50 and VGG-16 on zcu102, 3 runs each
    python benchmarks/bench_compile.py --runs resnet50=5,vgg16=1
    python benchmarks/bench_compile.py --quick                  # reduced ResNet-18, 1 run (smoke test)
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "compile.json"
#: Goals: (wall seconds, peak RSS MiB or None) on an idle 2-core machine (issue 12; ResNet-50 <= 8 s: issue 23).
GOALS: dict[str, tuple[float, float | None]] = {"resnet50": (8.0, None), "vgg16": (60.0, 2048.0)}


def prepare(name: str, reduced: bool, images: int, workdir: Path) -> tuple[Path, Path]:
    """The model as an ONNX file and `images` calibration inputs as an .npz named like its input."""
    import onnx

    from tvm_dpu import zoo

    model = zoo.build_model(name, reduced=reduced)
    onnx_path = workdir / f"{name}.onnx"
    onnx.save(model, str(onnx_path))
    calib = np.concatenate([zoo.random_input(model, seed=s) for s in range(images)])
    calib_path = workdir / f"{name}_calib.npz"
    np.savez(calib_path, **{model.graph.input[0].name: calib})
    return onnx_path, calib_path


def prepare_elsewhere(name: str, reduced: bool, images: int, workdir: Path) -> tuple[Path, Path]:
    """`prepare` in a fresh interpreter, so that this process stays small. It must: Linux starts a child's
    ru_maxrss at its parent's own high-water mark (the parent's address space is folded into it at exec), so a
    VGG-16 built here (1.9 GB) was reported as the peak of every compile this process then ran."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(prepare, (name, reduced, images, workdir))


def precompile_package() -> int:
    """Byte-compile the tvm_dpu package the compiles import, as pip does when it installs one; returns how many
    modules were written anew. Without it an editable checkout run with PYTHONDONTWRITEBYTECODE set (as this
    project's sessions are) compiles every imported module from source in every process: about 0.15 s of the
    ResNet-50 compile's imports. Stale bytecode is never used (Python checks the sources' mtimes)."""
    import compileall
    import importlib.util

    (root,) = importlib.util.find_spec("tvm_dpu").submodule_search_locations
    cache = Path(root).rglob("__pycache__/*.pyc")
    before = {p: p.stat().st_mtime_ns for p in cache}
    if not compileall.compile_dir(root, quiet=1):
        raise SystemExit(f"byte-compiling {root} failed")
    return sum(1 for p in Path(root).rglob("__pycache__/*.pyc") if before.get(p) != p.stat().st_mtime_ns)


def compile_once(onnx_path: Path, calib_path: Path, arch: str, outdir: Path) -> dict:
    """One `tvm-dpu compile` in a fresh process: wall seconds, peak RSS (MiB), phases, artifact bytes."""
    cmd = [sys.executable, "-m", "tvm_dpu.cli", "compile", str(onnx_path), "--arch", arch, "--calib",
           str(calib_path), "-o", str(outdir), "-q"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    out, err = proc.stdout.read().decode(), proc.stderr.read().decode()  # type: ignore[union-attr]
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"compile of {onnx_path.name} failed ({proc.returncode}):\n{err[-3000:]}{out[-2000:]}")
    report = json.loads((outdir / "report.json").read_text())
    artifact = next(outdir.glob("*.tvmdpu"))
    # ru_maxrss is in KiB on Linux
    # CPU seconds (user + system) of the compile process: what its wall time is on an idle machine, less its
    # (little) multi-threading; unlike the wall time it hardly moves with the other jobs on a shared machine
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_mib": usage.ru_maxrss / 1024,
            "phases_s": report["build"]["times_s"], "phases_cpu_s": report["build"].get("cpu_times_s", {}),
            "artifact_bytes": artifact.stat().st_size, "dpu_subgraphs": len(report["subgraphs"]),
            "cpu_nodes": sum(1 for n in report["partition"]["nodes"] if n["device"] == "cpu")}


def run_model(name: str, reduced: bool, arch: str, images: int, runs: int) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"bench_compile_{name}_") as tmp:
        work = Path(tmp)
        onnx_path, calib_path = prepare_elsewhere(name, reduced, images, work)
        results = [compile_once(onnx_path, calib_path, arch, work / f"out{i}") for i in range(runs)]
    walls = [r["wall_s"] for r in results]
    rss = [r["peak_rss_mib"] for r in results]
    phases = {k: statistics.median(r["phases_s"].get(k, 0.0) for r in results) for k in results[0]["phases_s"]}
    phases_cpu = {k: statistics.median(r["phases_cpu_s"].get(k, 0.0) for r in results)
                  for k in results[0]["phases_cpu_s"]}
    goal_s, goal_mib = GOALS.get(name, (None, None)) if not reduced else (None, None)
    return {"model": name, "reduced": reduced, "arch": arch, "calibration_images": images, "runs": results,
            "wall_s_median": statistics.median(walls), "wall_s_min": min(walls), "wall_s_max": max(walls),
            "cpu_s_median": statistics.median(r["cpu_s"] for r in results),
            "peak_rss_mib_max": max(rss), "phases_s_median": phases,
            "phases_cpu_s_median": phases_cpu, "goal_wall_s": goal_s, "goal_rss_mib": goal_mib,
            "wall_goal_met": None if goal_s is None else statistics.median(walls) < goal_s,
            "rss_goal_met": None if goal_mib is None else max(rss) < goal_mib}


def _goal(value: float, goal: float | None, unit: str) -> str:
    if goal is None:
        return "-"
    verdict = "met" if value < goal else f"missed by {value - goal:.1f} {unit}"
    return f"< {goal:g} {unit}: {verdict}"


def table(rows: list[dict]) -> str:
    head = (f"{'model':<10} {'arch':<8} {'wall s (med)':>12} {'min':>6} {'goal':<26} {'CPU s':>6} {'peak MiB':>9} "
            f"{'goal':<26} phases (wall/CPU s)")
    lines = [head, "-" * len(head)]
    for r in rows:
        cpu = r.get("phases_cpu_s_median", {})
        ph = ", ".join(f"{k} {v:.1f}" + (f"/{cpu[k]:.1f}" if k in cpu else "")
                       for k, v in r["phases_s_median"].items() if k != "total_after_imports")
        lines.append(f"{r['model']:<10} {r['arch']:<8} {r['wall_s_median']:>12.2f} {r['wall_s_min']:>6.2f} "
                     f"{_goal(r['wall_s_median'], r['goal_wall_s'], 's'):<26} {r['cpu_s_median']:>6.1f} "
                     f"{r['peak_rss_mib_max']:>9.0f} "
                     f"{_goal(r['peak_rss_mib_max'], r['goal_rss_mib'], 'MiB'):<26} {ph}")
    return "\n".join(lines)


def write_results(path: Path, rows: list[dict], load: tuple[float, ...], bytecode: dict | None = None) -> dict:
    """Write {"machine": ..., "rows": rows} as JSON to `path` (the machine and its load average at the start, and
    how tvm_dpu's bytecode was had: `bytecode`)."""
    data = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "loadavg_start": list(load),
                        "bytecode": bytecode},
            "rows": rows}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {path}")
    return data


def _runs_per_model(spec: str, models: list[str], force: int | None) -> dict[str, int]:
    """"3" -> 3 for every model; "resnet50=3,vgg16=1" -> per model (others 1)."""
    if force is not None:
        return {m: force for m in models}
    if "=" not in spec:
        return {m: int(spec) for m in models}
    given = {k.strip(): int(v) for k, v in (item.split("=", 1) for item in spec.split(",") if item.strip())}
    return {m: given.get(m, 1) for m in models}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="resnet50,vgg16")
    ap.add_argument("--arch", default="zcu102")
    ap.add_argument("--calib-images", type=int, default=4)
    ap.add_argument("--runs", default="3", help="runs per model: N, or per model as resnet50=3,vgg16=1")
    ap.add_argument("--quick", action="store_true", help="reduced ResNet-18, one run (smoke test)")
    ap.add_argument("--json", default=str(DEFAULT_JSON))
    ap.add_argument("--source-imports", action="store_true",
                    help="do not byte-compile tvm_dpu first (with PYTHONDONTWRITEBYTECODE set, every compile then "
                         "compiles its modules from source)")
    args = ap.parse_args(argv)
    models = ["resnet18"] if args.quick else [m.strip() for m in args.models.split(",") if m.strip()]
    runs = _runs_per_model(args.runs, models, 1 if args.quick else None)
    written = None if args.source_imports else precompile_package()
    load = os.getloadavg()
    rows = [run_model(m, args.quick, args.arch, args.calib_images, runs[m]) for m in models]
    print(table(rows))
    print(f"load average at start: {load[0]:.2f} (1 min); {os.cpu_count()} cores; tvm_dpu "
          + ("imported from source" if written is None else f"byte-compiled first ({written} modules written)"))
    bytecode = {"precompiled": written is not None, "modules_written": written,
                "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE")}
    write_results(Path(args.json), rows, load, bytecode)
    return 0


if __name__ == "__main__":
    sys.exit(main())
