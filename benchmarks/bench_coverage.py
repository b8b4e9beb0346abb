"""Operator coverage of the zoo models on the DPU: how much of each model runs there, whether it is bit-exact, how
accurate it is, and why every other op stays on the CPU.

Per model (reduced variants by default, `--full` for full size), built for one arch with one calibration input:

* MAC share on the DPU: multiply-accumulates of the ONNX Conv / Gemm / MatMul nodes the partition report places
  on the DPU, over those of all nodes (shapes from ONNX shape inference);
* op share: DPU nodes / all nodes of the partition report (ONNX nodes, so a folded BatchNormalization counts with
  the conv it was folded into);
* DPU subgraphs;
* golden == emulator: elements where the emulator's output differs from the golden reference, summed over the DPU
  subgraphs of one verified run (0 = bit-exact);
* cosine similarity of the model output against onnxruntime on the same input;
* for every node left on the CPU: its op and the partition report's reason.

    python benchmarks/bench_coverage.py                                   # every zoo model, reduced
    python benchmarks/bench_coverage.py --models resnext50_32x4d,mobilenetv3_small
    python benchmarks/bench_coverage.py --full --models squeezenet1_1     # full size (slow on the emulator)

JSON goes to benchmarks/results/coverage.json (coverage_full.json with --full) unless --json says otherwise.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_io import write_results  # noqa: E402  (benchmarks/results_io.py)

DEFAULT_ARCH = "DPUCZDX8G_ISA1_B4096"
RESULTS = Path(__file__).resolve().parent / "results"


def node_macs(model) -> dict[str, int]:
    """Multiply-accumulates of every Conv / Gemm / MatMul node of an ONNX model (batch included)."""
    import onnx
    from onnx import numpy_helper

    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
              for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output)}
    shapes.update({t.name: list(t.dims) for t in model.graph.initializer})
    macs: dict[str, int] = {}
    for n in model.graph.node:
        if n.op_type == "Conv":
            w, out = shapes[n.input[1]], shapes.get(n.output[0])
            if out:
                macs[n.name] = int(np.prod(out)) * int(np.prod(w[1:]))  # out elements x (C/g) * kh * kw
        elif n.op_type in ("Gemm", "MatMul"):
            a, out = shapes.get(n.input[0]), shapes.get(n.output[0])
            if a and out:
                macs[n.name] = int(np.prod(out)) * int(a[-1])
    return macs


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    den = np.linalg.norm(a) * np.linalg.norm(b)
    return float(a @ b / den) if den else float("nan")


def bench_model(name: str, arch: str, reduced: bool) -> dict:
    """Build zoo model `name`, run it once with verification, compare with onnxruntime; one result row."""
    import onnxruntime as ort

    import tvm_dpu
    from tvm_dpu import zoo

    model = zoo.build_model(name, reduced=reduced)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = tvm_dpu.build(model, arch=arch, calibration=[zoo.random_input(model, seed=0)], progress=False)
    build_s = time.perf_counter() - t0
    rep = compiled.partition_report
    x = zoo.random_input(model, seed=1)
    compiled.set_verify(True)
    t0 = time.perf_counter()
    y = compiled.run(x)[0]
    run_s = time.perf_counter() - t0
    mismatches = int(sum(r.mismatches for r in compiled.verify_results()))
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"input": x})[0]
    macs = node_macs(model)
    on_dpu = {n.name for n in rep.dpu_nodes}
    total = sum(macs.values())
    return {
        "model": name, "reduced": reduced, "arch": arch,
        "nodes": len(rep.nodes), "dpu_nodes": len(on_dpu),
        "op_share": len(on_dpu) / len(rep.nodes),
        "macs": total, "dpu_macs": sum(v for k, v in macs.items() if k in on_dpu),
        "mac_share": sum(v for k, v in macs.items() if k in on_dpu) / total if total else 0.0,
        "subgraphs": rep.subgraphs,
        "golden_vs_emulator_mismatches": mismatches,
        "cosine_vs_onnxruntime": cosine(y, ref),
        "cpu_nodes": [{"node": n.name, "op": n.op, "reason": n.reason} for n in rep.cpu_nodes],
        "notes": sorted({n.note for n in rep.dpu_nodes if n.note}),
        "build_s": build_s, "run_s": run_s,
    }


def table(rows: list[dict]) -> str:
    head = ("model", "MACs on DPU", "ops on DPU", "subgraphs", "golden!=emu", "cosine")
    lines = [f"{head[0]:<20} {head[1]:>12} {head[2]:>12} {head[3]:>9} {head[4]:>11} {head[5]:>9}"]
    for r in rows:
        lines.append(f"{r['model']:<20} {100 * r['mac_share']:>11.2f}% {r['dpu_nodes']:>5}/{r['nodes']:<4} "
                     f"{r['subgraphs']:>11} {r['golden_vs_emulator_mismatches']:>11} "
                     f"{r['cosine_vs_onnxruntime']:>9.5f}")
    for r in rows:
        if r["cpu_nodes"]:
            lines.append(f"\n{r['model']}: on the CPU")
            reasons: dict[tuple[str, str], list[str]] = {}
            for c in r["cpu_nodes"]:  # nodes with the same op and reason are listed once
                reasons.setdefault((c["op"], c["reason"] or ""), []).append(c["node"])
            for (op, reason), names in reasons.items():
                more = f" (+{len(names) - 1} more)" if len(names) > 1 else ""
                lines.append(f"  {op:<18} {names[0]}{more}: {reason}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from tvm_dpu import zoo

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(zoo.MODELS), help="comma-separated zoo names")
    ap.add_argument("--full", action="store_true", help="full-size variants (default: reduced)")
    ap.add_argument("--arch", default=DEFAULT_ARCH)
    ap.add_argument("--json", type=Path, default=None, help="output file (default benchmarks/results/coverage*.json)")
    args = ap.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in zoo.MODELS]
    if unknown:
        ap.error(f"unknown zoo model(s) {', '.join(unknown)}; available: {', '.join(zoo.MODELS)}")
    rows = []
    for name in names:
        rows.append(bench_model(name, args.arch, reduced=not args.full))
        print(f"{name}: done in {rows[-1]['build_s'] + rows[-1]['run_s']:.1f} s", file=sys.stderr)
    print(table(rows))
    out = args.json or RESULTS / ("coverage_full.json" if args.full else "coverage.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": "coverage", "arch": args.arch, "reduced": not args.full, "python": platform.python_version(),
           "models": rows}
    write_results(out, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
