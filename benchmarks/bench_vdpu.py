"""Multi-tenant virtual DPUs: several models on the cores of one device (zcu102: 3 x B4096) at once vs one after
another on one core.

Two views, side by side:
* predicted DPU time from the timing model: one after another = sum of the models' latencies; on separate cores
  = the slowest model (DDR contention between cores is NOT modelled yet, so this is the ideal bound);
* measured on this machine: wall time of `runs` runs per model through `tvm_dpu.serve` (each model pinned to its
  own emulated core, all from their own threads) vs the same runs one model after another on one core. The
  emulator runs on the host CPU (2 cores here), so this measures the runtime's concurrency, not the DPU's.

    python benchmarks/bench_vdpu.py                    # reduced zoo models -> results/vdpu.json
    python benchmarks/bench_vdpu.py --full --runs 3    # full-size models (slow)
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "vdpu.json"
MODELS = ("googlenet", "resnet50", "mobilenetv2")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--board", default="zcu102")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--full", action="store_true", help="full-size models (default: reduced)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = ap.parse_args()

    import tvm_dpu
    from tvm_dpu import zoo
    from tvm_dpu.runtime.cores import VirtualDPU, serve
    from tvm_dpu.runtime.device import EmulatorDevice

    names = args.models.split(",")
    cores = tvm_dpu.devices(args.board)
    if len(cores) < len(names):
        print(f"{args.board} has {len(cores)} cores for {len(names)} models", file=sys.stderr)
        return 2
    compiled, inputs, latency = [], [], []
    for name, core in zip(names, cores):
        model = zoo.build_model(name, reduced=not args.full)
        c = tvm_dpu.build(model, arch=args.board, device=core, progress=False,
                          calibration=[zoo.random_input(model, seed=s) for s in range(2)])
        compiled.append(c)
        inputs.append(zoo.random_input(model, seed=1))
        latency.append(c.timing().latency_s * 1e3)
    for c, x in zip(compiled, inputs):  # first runs: link the library, compile the programs into the emulator
        c.run(x)
    concurrent, _ = serve(compiled, inputs, args.runs, names)
    # The same work one model after another on a single core.
    single = VirtualDPU(EmulatorDevice(cores[0].arch), 0)
    for c in compiled:
        c.device = single
        for r in c.runners.values():
            r.device = single
    t0 = time.perf_counter()
    for c, x in zip(compiled, inputs):
        for _ in range(args.runs):
            c.run(x)
    sequential_s = time.perf_counter() - t0
    pred_seq, pred_conc = sum(latency), max(latency)
    rows = [("", "one core, in turn", f"{len(names)} cores, at once", "gain")]
    rows.append(("predicted DPU ms per round", f"{pred_seq:.3f}", f"{pred_conc:.3f}", f"{pred_seq / pred_conc:.2f}x"))
    rows.append(("measured emulator s (all runs)", f"{sequential_s:.2f}", f"{concurrent.seconds:.2f}",
                 f"{sequential_s / concurrent.seconds:.2f}x"))
    w = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(r)))
    print(concurrent.table())
    print("(predicted: DDR contention between cores not modelled; measured: emulator on a "
          f"{__import__('os').cpu_count()}-core host)")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "board": args.board, "models": names, "reduced": not args.full, "runs": args.runs,
        "predicted_latency_ms": dict(zip(names, latency)), "predicted_sequential_ms": pred_seq,
        "predicted_concurrent_ms": pred_conc, "measured_sequential_s": sequential_s,
        "measured_concurrent_s": concurrent.seconds, "per_model": concurrent.models, "per_core": concurrent.cores,
    }, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
