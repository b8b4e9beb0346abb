"""AMD's XIR (Debian's libxir 2.5) and the VART checker on every xmodel tvm-dpu writes for the zoo (issue 34): per
reduced zoo model and board, and for the README example, whether the export succeeds, whether XIR loads it
(Graph::deserialize checks every op's REQUIRED attributes), whether XIR's shape inference agrees with the file on every
op, how many tensors of the DPU subgraphs carry a DDR place, the XIR check's time, and the findings of the VART checker
(tvm_dpu.xmodel.vart_check: errors, warnings, the rules broken); vai_c's vendored files beside them. JSON to
benchmarks/results/xir.json; a Markdown table on stdout.

    python benchmarks/bench_xir.py                                     # every reduced zoo model on three boards
    python benchmarks/bench_xir.py --models resnet18,unet --archs zcu102
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import tvm_dpu
from tvm_dpu import zoo
from tvm_dpu.errors import DPUError
from tvm_dpu.xmodel.model import read_xmodel
from tvm_dpu.xmodel.vart_check import check_vart
from tvm_dpu.xmodel.xir_judge import XirReport, check_xmodel, xir_unavailable

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "xir.json"
ARCHS = ("zcu102", "ultra96", "dnnvm-zu2")
README_EXAMPLE = "mixed_cnn (README example)"


def _build(name: str, arch: str):
    if name == README_EXAMPLE:
        calib = np.load(ROOT / "examples" / "mixed_cnn_calib.npz")
        return tvm_dpu.build(str(ROOT / "examples" / "mixed_cnn.onnx"), arch=arch, progress=False,
                             calibration=calib[calib.files[0]])
    return tvm_dpu.build(zoo.build_model(name, reduced=True), arch=arch,
                         calibration=[zoo.random_input(name, reduced=True)], progress=False)


def _verdict(path: Path) -> dict:
    """XIR's and the VART checker's verdicts on one file."""
    t0 = time.perf_counter()
    rep = check_xmodel(path)
    t = time.perf_counter() - t0
    findings = check_vart(read_xmodel(path))
    errors = [f for f in findings if f.severity == "error"]
    dpu = [o for o in rep.ops if o.device == "DPU" and o.type != "download"]
    return {"xir_loads": not rep.error, "shape_inference_agrees": rep.ok, "ops": len(rep.ops),
            "mismatches": [f"{o.name} ({o.type}) {o.shape} vs {o.inferred}" for o in rep.mismatches],
            "dpu_tensors": len(dpu), "dpu_tensors_with_ddr": sum(o.reg_id is not None for o in dpu),
            "error": rep.error[:300], "check_s": round(t, 3),
            "vart_errors": len(errors), "vart_warnings": len(findings) - len(errors),
            "vart_rules": sorted({f.rule for f in findings})}


def measure(name: str, arch: str, outdir: Path) -> dict:
    row: dict = {"model": name, "arch": arch}
    try:
        path = _build(name, arch).export(outdir / f"{name.split()[0]}-{arch}.xmodel")
    except DPUError as e:
        return {**row, "exported": False, "error": str(e)[:300]}
    return {**row, "exported": True, "bytes": path.stat().st_size, **_verdict(path)}


def vai_c_rows() -> list[dict]:
    rows = []
    for path in sorted((ROOT / "tests" / "data" / "xmodel").rglob("*.xmodel")):
        rows.append({"model": f"vai_c {path.name}", "arch": "-", "exported": True, "bytes": path.stat().st_size,
                     **_verdict(path)})
    return rows


def table(rows: list[dict]) -> str:
    out = ["| model | board | exported | XIR loads | shape inference agrees | ops | DPU tensors with DDR place | "
           "XIR check s | VART checker errors / warnings (rules) | error |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    yn = {True: "yes", False: "no"}
    for r in rows:
        if not r["exported"]:
            out.append(f"| {r['model']} | {r['arch']} | no | | | | | | | {r['error'][:100]} |")
            continue
        rules = f" ({', '.join(r['vart_rules'])})" if r["vart_rules"] else ""
        out.append(f"| {r['model']} | {r['arch']} | yes | {yn[r['xir_loads']]} | {yn[r['shape_inference_agrees']]} "
                   f"| {r['ops']} | {r['dpu_tensors_with_ddr']} / {r['dpu_tensors']} | {r['check_s']:.2f} | "
                   f"{r['vart_errors']} / {r['vart_warnings']}{rules} | {r['error'][:100]} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join([m for m in zoo.MODELS if m != "mixed_cnn"] + [README_EXAMPLE]),
                    help="comma-separated reduced zoo models (and/or the README example)")
    ap.add_argument("--archs", default=",".join(ARCHS), help="comma-separated boards")
    ap.add_argument("--json", default=str(DEFAULT_JSON))
    args = ap.parse_args(argv)
    why = xir_unavailable()
    if why:
        print(f"bench_xir: {why}", file=sys.stderr)
        return 2
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in zoo.MODELS and m != README_EXAMPLE]
    if unknown:
        print(f"bench_xir: unknown model(s) {unknown}; available: {', '.join(zoo.MODELS)}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        rows = [measure(m, a, Path(tmp)) for m in models for a in args.archs.split(",") if a]
    rows += vai_c_rows()
    ours = [r for r in rows if not r["model"].startswith("vai_c")]
    summary = {"exports": len(ours), "exported": sum(r["exported"] for r in ours),
               "xir_loads": sum(r.get("xir_loads", False) for r in ours),
               "shape_inference_agrees": sum(r.get("shape_inference_agrees", False) for r in ours),
               "vart_clean": sum(r.get("vart_errors", 1) == 0 for r in ours)}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n")
    print(table(rows))
    print(f"\n{summary['exports']} exports: {summary['exported']} written, {summary['xir_loads']} loaded by XIR, "
          f"{summary['shape_inference_agrees']} with XIR's shape inference agreeing on every op, "
          f"{summary['vart_clean']} breaking no rule of the VART checker")
    ok = summary["shape_inference_agrees"] == summary["vart_clean"] == summary["exports"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
