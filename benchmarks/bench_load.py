"""Serving load: many threads running several loaded artifacts at once, every output checked.

Each model is compiled once for zcu102 with `cores` DPU cores, exported, loaded back (`tvm_dpu.load`, the path a
deployment takes) and run once alone for its expected output. Then `--threads` threads each pick models round robin
and run them on the same input for `--seconds`; every output is compared with the expected one. The figures: runs,
runs per second, mismatching outputs and errors (any exception) per model, and the load average at start and end.
Exit status 1 when any output mismatches or any run raises.

    python benchmarks/bench_load.py                                   # 16 threads x 4 models, cores=3, 120 s
    python benchmarks/bench_load.py --threads 4 --seconds 10 --models mixed_cnn   # quick check of the script
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
import warnings
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_io import write_results  # noqa: E402  (benchmarks/results_io.py)

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "load.json"
DEFAULT_MODELS = "mixed_cnn,resnet18,mobilenetv2,squeezenet1_1"


def _prepare(names: list[str], arch: str, cores: int, d: Path) -> dict[str, tuple]:
    import tvm_dpu
    from tvm_dpu import zoo

    out = {}
    for name in names:
        model = zoo.build_model(name) if name == "mixed_cnn" else zoo.build_model(name, reduced=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled = tvm_dpu.build(model, arch=arch, calibration=[zoo.random_input(model, seed=s) for s in range(2)],
                                     progress=False, cores=cores)
        art = compiled.export(d / f"{name}.tvmdpu")
        loaded = tvm_dpu.load(art)
        x = zoo.random_input(model, seed=7)
        out[name] = (loaded, x, loaded.run(x)[0])
    return out


def run_load(models: dict[str, tuple], threads: int, seconds: float) -> dict[str, dict]:
    runs: Counter = Counter()
    wrong: Counter = Counter()
    errors: Counter = Counter()
    first_error: dict[str, str] = {}
    lock = threading.Lock()
    names = sorted(models)
    deadline = time.monotonic() + seconds

    def worker(k: int) -> None:
        i = k
        while time.monotonic() < deadline:
            name = names[i % len(names)]
            i += 1
            loaded, x, expected = models[name]
            try:
                same = np.array_equal(loaded.run(x)[0], expected)
                err = None
            except Exception as e:  # a serving run must never raise: counted, first one kept
                same, err = False, f"{type(e).__name__}: {e}"
            with lock:
                runs[name] += 1
                if err is not None:
                    errors[name] += 1
                    first_error.setdefault(name, err)
                elif not same:
                    wrong[name] += 1

    pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    t0 = time.monotonic()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    took = time.monotonic() - t0
    return {n: {"runs": runs[n], "runs_per_s": runs[n] / took, "mismatching": wrong[n], "errors": errors[n],
                "first_error": first_error.get(n, "")} for n in names}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--models", default=DEFAULT_MODELS, help="zoo models (reduced; mixed_cnn is the README example)")
    ap.add_argument("--arch", default="zcu102")
    ap.add_argument("--cores", type=int, default=3)
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = ap.parse_args(argv)
    names = [m for m in args.models.split(",") if m]
    with tempfile.TemporaryDirectory() as d:
        models = _prepare(names, args.arch, args.cores, Path(d))
        rows = run_load(models, args.threads, args.seconds)
    print(f"| model | runs | runs/s | mismatching | errors |  ({args.threads} threads, {args.seconds:g} s, "
          f"{args.arch}, cores={args.cores})")
    print("|---|---|---|---|---|")
    for n, r in rows.items():
        print(f"| {n} | {r['runs']} | {r['runs_per_s']:.1f} | {r['mismatching']} | {r['errors']} |")
        if r["first_error"]:
            print(f"  first error of {n}: {r['first_error']}")
    total = {k: sum(r[k] for r in rows.values()) for k in ("runs", "mismatching", "errors")}
    print(f"total: {total['runs']} runs, {total['mismatching']} mismatching, {total['errors']} errors")
    write_results(args.json, {"threads": args.threads, "seconds": args.seconds, "arch": args.arch,
                              "cores": args.cores, "rows": rows, "total": total})
    return 1 if total["mismatching"] or total["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
