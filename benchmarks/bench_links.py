"""Link model for Ray's object store (the Ray pipeline executor's transport), measured on loopback and scaled to GbE.

A stage actor returns its output tensors; the next stage's actor receives them as an ObjectRef argument, so every
cut's bytes go through Ray's object store: serialised by the sender, stored, fetched by the receiver's node and
deserialised. On one machine (loopback) the fetch is a shared-memory read, so what this measures is Ray's own cost
per transfer: the task round trip, (de)serialisation and the object store, as a line t = a + b x bytes over
payloads of 1 KiB .. 16 MiB (median of repeated calls, one int8 array per call, as the wire sends it), less the
same call pair moving one byte (the actor calls themselves are the executor's cost, not the link's). Between two
boards the bytes also cross the network: the `ray-gbe` link adds GbE's wire time (links.json "gbe": 0.94 Gbit/s of
TCP payload, 100 us switch + stack) to the measured per-byte and per-transfer cost:

    latency_us   = a + gbe.latency_us
    gbit_per_s   = 8 / (b + 8 / (gbe.gbit_per_s * 1e9)) / 1e9

This is a model, not a two-machine measurement: the object store's transfer between nodes (chunked gRPC pulls)
may cost more than loopback plus the wire.

    python benchmarks/bench_links.py            # measure -> results/links.json
    python benchmarks/bench_links.py --write    # ... and write the ray-gbe entry of tvm_dpu/pipeline/links.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_io import write_results  # noqa: E402  (benchmarks/results_io.py)

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "links.json"
LINKS = ROOT / "tvm_dpu" / "pipeline" / "links.json"


def measure(reps: int) -> dict:
    import ray

    import tempfile

    # address="local": always a new instance of our own, never a cluster someone else started
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             _temp_dir=tempfile.mkdtemp(prefix="rayl", dir="/tmp"))
    try:
        @ray.remote(num_cpus=0)
        class Stage:
            def produce(self, nbytes: int) -> dict:
                return {"t": np.zeros(nbytes, np.int8)}

            def consume(self, payload: dict) -> int:
                return int(payload["t"].nbytes)

        a, b = Stage.remote(), Stage.remote()
        ray.get([a.consume.remote({"t": np.zeros(1, np.int8)}), b.consume.remote({"t": np.zeros(1, np.int8)})])
        rows = []
        for nbytes in (1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22, 1 << 24):
            # baseline: the same two calls with nothing to move, so what remains is the payload's transfer
            times, base = [], []
            for _ in range(reps):
                t0 = time.perf_counter()
                assert ray.get(b.consume.remote(a.produce.remote(nbytes))) == nbytes
                times.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                ray.get(b.consume.remote(a.produce.remote(1)))
                base.append(time.perf_counter() - t0)
            rows.append({"bytes": nbytes, "median_s": statistics.median(times), "empty_median_s": statistics.median(base)})
    finally:
        ray.shutdown()
    # what the payload adds to the same call pair with one byte: the transfer through the object store
    xs = np.array([r["bytes"] for r in rows], float)
    ys = np.array([r["median_s"] - r["empty_median_s"] for r in rows], float)
    slope, intercept = np.polyfit(xs, ys, 1)
    return {"rows": rows, "fit": {"latency_s": max(0.0, float(intercept)), "s_per_byte": max(0.0, float(slope))}}


def with_entry(text: str, name: str, entry: dict) -> str:
    """links.json's text with the one-line entry `name` set (replaced, or added as the last link), the rest of the
    file as written by hand."""
    line = f'    "{name}": {json.dumps(entry)}'
    lines = text.split("\n")
    lines = [ln for ln in lines if not ln.startswith(f'    "{name}": ')]
    end = next(i for i, ln in enumerate(lines) if ln.startswith('  "board_ddr_bytes"')) - 1  # the links' "},"
    if not lines[end - 1].rstrip().endswith(","):
        lines[end - 1] = lines[end - 1].rstrip() + ","
    lines.insert(end, line)
    out = "\n".join(lines)
    json.loads(out)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON)
    ap.add_argument("--write", action="store_true", help="write the ray-gbe entry of tvm_dpu/pipeline/links.json")
    args = ap.parse_args()
    m = measure(args.reps)
    doc = json.loads(LINKS.read_text())
    gbe = doc["links"]["gbe"]
    a, b = m["fit"]["latency_s"], m["fit"]["s_per_byte"]
    latency_us = a * 1e6 + float(gbe["latency_us"])
    gbit = 8 / (b + 8 / (float(gbe["gbit_per_s"]) * 1e9)) / 1e9
    loop_gbit = 8 / b / 1e9 if b > 0 else float("inf")
    print("Ray object store on loopback (two actors, one int8 array per call; median of "
          f"{args.reps}):")
    for r in m["rows"]:
        print(f"  {r['bytes']:>9} B: {r['median_s'] * 1e3:8.3f} ms (empty call pair {r['empty_median_s'] * 1e3:.3f} ms)")
    print(f"  fit: {a * 1e6:.0f} us per transfer + {b * 1e9:.3f} ns per byte ({loop_gbit:.1f} Gbit/s on loopback)")
    print(f"ray-gbe link model: latency {latency_us:.0f} us, {gbit:.3f} Gbit/s (GbE {gbe['gbit_per_s']} Gbit/s, "
          f"{gbe['latency_us']} us, plus Ray's measured cost); the paper's serial link: "
          f"{doc['links']['serial-8.5g']['gbit_per_s']} Gbit/s, {doc['links']['serial-8.5g']['latency_us']} us")
    out = {"loopback": m, "ray_gbe": {"latency_us": latency_us, "gbit_per_s": gbit},
           "loopback_gbit_per_s": loop_gbit, "serial": doc["links"]["serial-8.5g"], "gbe": gbe}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    write_results(args.json, out)
    print(f"wrote {args.json}")
    if args.write:
        entry = {
            "gbit_per_s": round(gbit, 4), "latency_us": round(latency_us, 1), "overlap": True,
            "source": (f"benchmarks/bench_links.py, {time.strftime('%Y-%m-%d', time.gmtime())}: Ray's object store "
                       f"measured on loopback ({a * 1e6:.0f} us per transfer, {b * 1e9:.3f} ns per byte beyond an "
                       "empty actor call) plus the gbe link's wire time and latency; a model of two boards, not "
                       "measured between two machines. The default link of the Ray executor.")}
        LINKS.write_text(with_entry(LINKS.read_text(), "ray-gbe", entry))
        print(f"wrote {LINKS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
