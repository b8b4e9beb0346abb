"""Cold start of `tvm-dpu run` (issue 34 item 6): the wall time of N fresh processes, each running one model once,
on the vendored MNIST xmodel (vai_c's, no TVM needed) and on a small .tvmdpu artifact (the reduced ResNet-18 of
examples/, compiled once here; its CPU library and Relax VM need TVM). Median / min / max per model, the
1-minute load average before and after (the machine may be shared: read the figures beside it), and whether the
process imported TVM. JSON to benchmarks/results/cold_start.json; a table on stdout. Goal: the xmodel under 2 s.

    python benchmarks/bench_cold_start.py              # 7 processes per model
    python benchmarks/bench_cold_start.py --runs 3
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "cold_start.json"
MNIST = ROOT / "tests" / "data" / "xmodel" / "dpu_pynq" / "dpu_mnist_classifier.xmodel"
ARTIFACT_MODEL = ROOT / "examples" / "resnet18_small.onnx"
ARCH = "DPUCZDX8G_ISA1_B4096"
GOAL_S = 2.0
#: Runs `tvm-dpu run` in this process and reports, on stderr's last line, whether TVM got imported.
PROBE = ("import sys; from tvm_dpu.cli import main; code = main(sys.argv[1:]); "
         "print('tvm imported:', 'tvm' in sys.modules, file=sys.stderr); sys.exit(code)")


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT))


def compile_artifact(outdir: Path) -> Path:
    """The reduced ResNet-18 compiled to OUTDIR/resnet18_small.tvmdpu (once, not timed)."""
    subprocess.run([sys.executable, "-m", "tvm_dpu.cli", "compile", str(ARTIFACT_MODEL), "--arch", ARCH, "-o",
                    str(outdir), "-q"], check=True, env=_env(), capture_output=True, text=True)
    return outdir / f"{ARTIFACT_MODEL.stem}.tvmdpu"


def cold_runs(path: Path, runs: int) -> dict:
    """`runs` fresh processes of `tvm-dpu run PATH`: wall seconds each, and whether TVM was imported."""
    times, tvm_loaded = [], set()
    for _ in range(runs):
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-c", PROBE, "run", str(path)], env=_env(), capture_output=True,
                           text=True)
        times.append(time.perf_counter() - t0)
        if r.returncode != 0:
            raise SystemExit(f"tvm-dpu run {path} failed ({r.returncode}): {r.stderr.strip()[-500:]}")
        tvm_loaded.add(r.stderr.strip().splitlines()[-1].endswith("True"))
    return {"file": path.name, "runs": runs, "seconds": times, "median_s": statistics.median(times),
            "min_s": min(times), "max_s": max(times), "imports_tvm": sorted(tvm_loaded) == [True]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=7, help="fresh processes per model (default 7)")
    ap.add_argument("--json", default=str(DEFAULT_JSON), help=f"output file (default {DEFAULT_JSON})")
    a = ap.parse_args(argv)
    if a.runs < 1:
        ap.error("--runs must be >= 1")
    with tempfile.TemporaryDirectory() as tmp:
        artifact = compile_artifact(Path(tmp) / "out")
        load_before = os.getloadavg()
        rows = [dict(model="vai_c MNIST xmodel", **cold_runs(MNIST, a.runs)),
                dict(model="reduced ResNet-18 artifact", **cold_runs(artifact, a.runs))]
        load_after = os.getloadavg()
    print(f"| model | file | median s | min s | max s | imports TVM | ({a.runs} fresh processes each)")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['file']} | {r['median_s']:.2f} | {r['min_s']:.2f} | {r['max_s']:.2f} | "
              f"{'yes' if r['imports_tvm'] else 'no'} |")
    print(f"load average (1, 5, 15 min) before {load_before}, after {load_after}; {os.cpu_count()} cores; "
          f"goal: the xmodel under {GOAL_S} s")
    doc = {"goal_s": GOAL_S, "arch": ARCH, "load_avg_before": load_before, "load_avg_after": load_after,
           "cpu_count": os.cpu_count(), "python": sys.version.split()[0], "rows": rows}
    out = Path(a.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
