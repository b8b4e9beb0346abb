"""Host cost model (tvm_dpu/timing/host.py): measure what the host spends around the DPU on this machine and fit
the model's coefficients, each a least-squares line over several sizes (median of repeated timings per size):

* quant_s_per_elem / dequant_s_per_elem: `quantize_tensor` (float32 -> int8, no float64 step) and
  `dequantize_tensor` on 64 Ki .. 1 Mi elements;
* region_s_per_byte: `CompiledSubgraph.new_regions` (fresh zeroed DDR regions, weights copied in) over 1 .. 64
  MiB of weights, per weight byte: what writing a program's weights into device memory costs, once per loaded
  program (the runtime keeps them resident; runtime/device.py);
* dpu_call_s and dma_s_per_byte: `run_int8` of a one-conv DPU program on a device that does no DPU work (its input
  and output regions, the device call, the int8 layout copy in and out), over feature maps of 4 Ki .. 256 Ki
  bytes: intercept = driver, slope = DMA per byte (in + out);
* call_s and vm_s_per_elem: `CompiledModel.run` of the same models on that device: its slope less the conversions
  and DMA above is the VM's copies of the float tensors in and out (per element each way), the median of what is
  left the VM call and the Python around it;
* cpu_fixed_s / cpu_s_per_elem: TVM-compiled CPU ops (add, multiply, relu, softmax, mean) run by the Relax VM,
  each alone in a function, on 1 Ki .. 256 Ki elements; cpu_s_per_mac: TVM-compiled matmul and conv2d beyond
  that, per multiply-accumulate;
* int8_call_s: a pipeline stage passing int8 through (no Relax VM) on the one-conv models, less `run_int8` of the
  same inputs;
* segment_s: per segment, a partition of reduced GoogLeNet on 3 virtual cores that do no DPU work against the
  same partition as one program (threads, dependency events; the segments share one feature-map region, so
  nothing is copied between them).

    python benchmarks/bench_host.py            # measure -> results/host.json
    python benchmarks/bench_host.py --write    # ... and write the fitted model to tvm_dpu/timing/host_cost.json
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_io import write_results  # noqa: E402  (benchmarks/results_io.py)

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "host.json"
MODEL_FILE = ROOT / "tvm_dpu" / "timing" / "host_cost.json"


def best_of(fn, reps: int) -> float:
    """The median of `reps` timed calls after one untimed call: what a call typically costs on this (shared)
    host; the minimum would hide the page faults and cache misses a user pays."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line, both clamped at 0 (a cost is never negative)."""
    slope, intercept = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return max(0.0, float(intercept)), max(0.0, float(slope))


class NoWork:
    """A DPU that does no work: a call through it times only the host around the DPU."""

    def __init__(self, arch):
        self.arch = arch

    def execute(self, sg, regions) -> None:
        pass


def conversions(reps: int) -> dict:
    from tvm_dpu.runtime.subgraph_runner import dequantize_tensor, quantize_tensor

    sizes = [1 << 16, 1 << 18, 1 << 20]
    rng = np.random.default_rng(0)
    q_t, d_t = [], []
    for n in sizes:
        x = (rng.integers(-128, 128, n) * 2.0 ** -4).astype(np.float32)
        q = quantize_tensor(x, 4)
        q_t.append(best_of(lambda: quantize_tensor(x, 4), reps))
        d_t.append(best_of(lambda: dequantize_tensor(q, 4), reps))
    return {"sizes": sizes, "quant_s": q_t, "dequant_s": d_t, "quant_fit": fit(sizes, q_t),
            "dequant_fit": fit(sizes, d_t)}


def regions(reps: int) -> dict:
    """`CompiledSubgraph.new_regions` (fresh zeroed DDR regions, weights copied in) over 1 .. 64 MiB of weights:
    the copy into freshly mapped pages (every page faults in), per weight byte - a program's upload, paid once."""
    from types import SimpleNamespace

    from tvm_dpu.types import REG_PARAMS, CompiledSubgraph

    sizes = [1 << 20, 1 << 22, 1 << 24, 1 << 26]
    times = []
    for n in sizes:
        fake = SimpleNamespace(region_sizes={REG_PARAMS: n}, params=np.ones(n, np.uint8))
        times.append(best_of(lambda: CompiledSubgraph.new_regions(fake), reps))
    return {"sizes": sizes, "s": times, "fit": fit(sizes, times)}


def one_conv(res: int, ch: int):
    from tvm_dpu.zoo.graph_builder import GraphBuilder

    b = GraphBuilder(graph_name=f"hostcost_{res}", seed=0)
    x = b.input("input", (1, ch, res, res))
    return b.build(b.relu(b.conv(x, "conv", ch, 1, 1, 0), "relu"))


def driver_and_call(reps: int) -> dict:
    import tvm_dpu
    from tvm_dpu.runtime.subgraph_runner import quantize_tensor, run_int8

    ch, rows = 16, []
    for res in (16, 32, 64, 128):
        proto = one_conv(res, ch)
        x = np.random.default_rng(1).standard_normal((1, ch, res, res)).astype(np.float32)
        m = tvm_dpu.build(proto, arch="zcu102", calibration=[x], progress=False)
        (r,) = m.runners.values()
        dev = NoWork(m.arch)
        qin = [quantize_tensor(x, b.fix_point) for b in r.sg.inputs]
        t_int8 = best_of(lambda: run_int8(r.sg, dev, qin), reps)
        m.pin(dev)
        t_run = best_of(lambda: m.run(x), reps)
        rows.append({"elems": ch * res * res, "run_int8_s": t_int8, "model_run_s": t_run})
    return {"rows": rows}


def int8_call(reps: int) -> dict:
    """A pipeline stage that passes int8 through (`stages.DpuOnly.run`: int8 in, run_int8, int8 out, no Relax VM)
    on a device that does no DPU work, over the same one-conv models, against `run_int8` of the same inputs timed
    beside it (driver, regions and DMA, charged by their own terms): the difference is the int8 path's own call
    overhead (`int8_call_s`, the median over sizes)."""
    import tvm_dpu
    from tvm_dpu.pipeline.stages import StageSpec, dpu_only
    from tvm_dpu.runtime.subgraph_runner import quantize_tensor, run_int8

    ch, rows = 16, []
    for res in (16, 32, 64, 128):
        proto = one_conv(res, ch)
        x = np.random.default_rng(1).standard_normal((1, ch, res, res)).astype(np.float32)
        m = tvm_dpu.build(proto, arch="zcu102", calibration=[x], progress=False)
        path = dpu_only(m)
        if path is None:
            raise SystemExit("the one-conv model is not a single DPU call: cannot time the int8 path")
        (r,) = m.runners.values()
        m.pin(NoWork(m.arch))
        name_in, out = m.inputs[0].name, m.output_specs()[0].name
        fin, fout = int(r.sg.inputs[0].fix_point), int(r.sg.outputs[0].fix_point)
        spec = StageSpec(1, "b", "zcu102", [], [name_in], [out], {out: fout})
        payload = {name_in: quantize_tensor(x, fin)}
        dev = m.dpu_device()
        t = best_of(lambda: path.run(m, payload, {name_in: fin}, spec), reps)
        t_int8 = best_of(lambda: run_int8(r.sg, dev, [payload[name_in]]), reps)
        rows.append({"elems": ch * res * res, "s": t, "run_int8_s": t_int8, "own_s": t - t_int8})
    return {"rows": rows, "int8_call_s": max(0.0, float(np.median([r["own_s"] for r in rows])))}


def cpu_macs(reps: int, fixed: float, per_elem: float) -> dict:
    """TVM-compiled conv2d and matmul (TVM's default CPU schedules, as the model's CPU part compiles) run by the
    Relax VM: per call, less the per-op and per-output-element costs fitted on the elementwise ops, per MAC (the
    median over sizes): `cpu_s_per_mac`."""
    import tvm
    from tvm import relax

    def make(kind: str, n: int):
        bb = relax.BlockBuilder()
        if kind == "matmul":
            shapes = [(n, n), (n, n)]
        else:
            shapes = [(1, n, 16, 16), (n, n, 3, 3)]
        xs = [relax.Var(f"x{i}", relax.TensorType(list(sh), "float32")) for i, sh in enumerate(shapes)]
        with bb.function("main", xs):
            with bb.dataflow():
                y = relax.op.matmul(*xs) if kind == "matmul" else relax.op.nn.conv2d(*xs, padding=1)
                out = bb.emit_output(y)
            bb.emit_func_output(out)
        ex = tvm.compile(bb.get(), target="llvm")
        vm = relax.VirtualMachine(ex, tvm.cpu())
        rng = np.random.default_rng(0)
        args = [tvm.runtime.tensor(rng.standard_normal(sh).astype(np.float32)) for sh in shapes]
        elems = n * n if kind == "matmul" else n * 16 * 16
        macs = n * n * n if kind == "matmul" else n * 16 * 16 * n * 9
        return (lambda: vm["main"](*args)), elems, macs

    rows = []
    for kind, sizes in (("matmul", (32, 64, 128)), ("conv2d", (8, 16, 32))):
        for n in sizes:
            fn, elems, macs = make(kind, n)
            t = best_of(fn, reps)
            rows.append({"op": kind, "n": n, "elems": elems, "macs": macs, "s": t,
                         "per_mac_s": max(0.0, t - fixed - per_elem * elems) / macs})
    return {"rows": rows, "cpu_s_per_mac": float(np.median([r["per_mac_s"] for r in rows]))}


def cpu_ops(reps: int) -> dict:
    import tvm
    from tvm import relax

    def make(kind: str, n: int):
        bb = relax.BlockBuilder()
        x = relax.Var("x", relax.TensorType([n // 64, 64], "float32"))
        with bb.function("main", [x]):
            with bb.dataflow():
                if kind == "add":
                    y = relax.op.add(x, x)
                elif kind == "multiply":
                    y = relax.op.multiply(x, x)
                elif kind == "relu":
                    y = relax.op.nn.relu(x)
                elif kind == "softmax":
                    y = relax.op.nn.softmax(x, axis=-1)
                else:
                    y = relax.op.mean(x, axis=[1], keepdims=True)
                out = bb.emit_output(y)
            bb.emit_func_output(out)
        ex = tvm.compile(bb.get(), target="llvm")
        vm = relax.VirtualMachine(ex, tvm.cpu())
        arg = tvm.runtime.tensor(np.random.default_rng(0).standard_normal((n // 64, 64)).astype(np.float32)) \
            if hasattr(tvm.runtime, "tensor") else tvm.nd.array(
                np.random.default_rng(0).standard_normal((n // 64, 64)).astype(np.float32))
        return lambda: vm["main"](arg)

    sizes = [1 << 10, 1 << 14, 1 << 16, 1 << 18]
    kinds = ["add", "multiply", "relu", "softmax", "mean"]
    rows = []
    for kind in kinds:
        for n in sizes:
            rows.append({"op": kind, "elems": n, "s": best_of(make(kind, n), reps)})
    _, slope = fit([r["elems"] for r in rows], [r["s"] for r in rows])
    fixed = max(0.0, float(np.median([r["s"] - slope * r["elems"] for r in rows])))
    return {"rows": rows, "fit": (fixed, slope)}


def segments(reps: int) -> dict:
    import tvm_dpu
    from tvm_dpu import zoo
    from tvm_dpu.runtime.cores import VirtualDPU
    from tvm_dpu.runtime.subgraph_runner import quantize_tensor, run_int8, run_segments

    proto = zoo.build_model("googlenet", reduced=True)
    m = tvm_dpu.build(proto, arch="zcu102", calibration=[zoo.random_input(proto, seed=0)], progress=False, cores=3,
                      segments="always")
    r = max((r for r in m.runners.values() if r.multicore is not None), key=lambda r: len(r.multicore.segments))
    rng = np.random.default_rng(0)
    qin = [quantize_tensor(rng.standard_normal(b.shape).astype(np.float32), b.fix_point) for b in r.sg.inputs]
    cores = [VirtualDPU(NoWork(m.arch), c) for c in range(3)]
    whole = best_of(lambda: run_int8(r.sg, cores[0], qin), reps)
    segs = best_of(lambda: run_segments(r.sg, r.multicore, cores, qin), reps)
    return {"segments": len(r.multicore.segments), "one_program_s": whole, "segments_s": segs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON)
    ap.add_argument("--write", action="store_true", help=f"write the fitted model to {MODEL_FILE.relative_to(ROOT)}")
    ap.add_argument("--only", default="", help="with --write: update only these comma-separated keys of the model "
                    "file (the others keep their recorded values; the measurements they depend on still run)")
    args = ap.parse_args()

    conv = conversions(args.reps)
    q, dq = conv["quant_fit"][1], conv["dequant_fit"][1]
    reg = regions(args.reps)
    region = reg["fit"][1]
    drv = driver_and_call(args.reps)
    el = [2 * r["elems"] for r in drv["rows"]]  # int8 bytes in + out of the one-conv program
    # run_int8 = driver + DMA in and out (the weights stay resident: no region set-up per call)
    _, dma = fit(el, [r["run_int8_s"] for r in drv["rows"]])
    # the intercept as the median residual: one noisy large size would otherwise push the line below zero
    dpu_call_s = max(0.0, float(np.median([r["run_int8_s"] - dma * b for r, b in zip(drv["rows"], el)])))
    # model.run = VM call + driver + DMA + quantize (in) + dequantize (out) + the VM's own copies of the float
    # tensors in and out (vm_s_per_elem each way)
    run_fixed, run_slope = fit([r["elems"] for r in drv["rows"]], [r["model_run_s"] for r in drv["rows"]])
    vm = max(0.0, (run_slope - q - dq - 2 * dma) / 2)
    per = [r["model_run_s"] - dpu_call_s - (q + dq + 2 * dma + 2 * vm) * r["elems"] for r in drv["rows"]]
    call_s = max(0.0, float(np.median(per)))
    cpu = cpu_ops(args.reps)
    seg = segments(args.reps)
    segment_s = max(0.0, (seg["segments_s"] - seg["one_program_s"]) / seg["segments"])
    i8 = int8_call(args.reps)
    macs = cpu_macs(args.reps, cpu["fit"][0], cpu["fit"][1])
    cost = {"call_s": call_s, "dpu_call_s": dpu_call_s, "quant_s_per_elem": q, "dequant_s_per_elem": dq,
            "dma_s_per_byte": dma, "vm_s_per_elem": vm, "region_s_per_byte": region, "cpu_fixed_s": cpu["fit"][0],
            "cpu_s_per_elem": cpu["fit"][1], "cpu_s_per_mac": macs["cpu_s_per_mac"], "segment_s": segment_s,
            "int8_call_s": i8["int8_call_s"]}
    host = f"{platform.machine()} {platform.processor() or platform.platform()}, python {platform.python_version()}"
    source = (f"benchmarks/bench_host.py on {host}, {time.strftime('%Y-%m-%d', time.gmtime())}: median of "
              f"{args.reps} timings per size, least-squares lines (see the script)")
    print(f"host cost model ({host}):")
    for k, v in cost.items():
        unit = "ns" if "per" in k else "us"
        print(f"  {k:<20} {v * (1e9 if unit == 'ns' else 1e6):>10.3f} {unit}")
    big = 802816
    print(f"  -> to_wire of {big:,} elements: {q * big * 1e3:.2f} ms (was 33.9 ms through float64, issue 27)")
    doc = {"source": source, "cost": cost,
           "measured": {"conversions": conv, "regions": reg, "driver_and_call": drv, "cpu_ops": cpu,
                        "segments": seg, "int8_call": i8, "cpu_macs": macs}}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    write_results(args.json, doc)
    print(f"wrote {args.json}")
    if args.write:
        only = [k for k in args.only.split(",") if k]
        unknown = sorted(set(only) - set(cost))
        if unknown:
            raise SystemExit(f"--only {unknown}: not keys of the model ({sorted(cost)})")
        if only:  # the other keys keep their recorded values and source
            old = json.loads(MODEL_FILE.read_text())
            cost = {**old["cost"], **{k: cost[k] for k in only}}
            source = f"{old['source']}; {', '.join(only)}: {source}"
        MODEL_FILE.write_text(json.dumps({"_doc": "Host cost model, read by tvm_dpu.timing.host; written by "
                                                  "benchmarks/bench_host.py --write. Seconds.",
                                          "source": source, "cost": cost}, indent=2) + "\n")
        print(f"wrote {MODEL_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
