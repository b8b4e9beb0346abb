"""Large FC / conv layers on the DPU by splitting (issue 12): VGG-16 per arch, before and after.

Per arch: the CPU nodes of the partition without the split (the profile's "split" rule off: what the limits
rejected before) and with it; then one `tvm-dpu compile` in a fresh process (bench_compile.compile_once: wall
seconds, peak RSS), the artifact loaded and run on one random image on the emulator with the golden reference
beside every DPU subgraph call (mismatching int8 values), and the output compared with onnxruntime float
(cosine). DPU MACs are the MACs of the compiled DPU XGraphs (the partial convs included). Goals beside each
figure. JSON goes to benchmarks/results/fc_split.json; --write-docs rewrites the generated table of
docs/op-coverage.md from it.

    python benchmarks/bench_fc_split.py                                   # vgg16 on dnnvm-zu2 and B4096
    python benchmarks/bench_fc_split.py --archs dnnvm-zu2 --json /tmp/fc.json
    python benchmarks/bench_fc_split.py --write-docs --from-json benchmarks/results/fc_split.json
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_compile import GOALS, compile_once, prepare_elsewhere, write_results  # noqa: E402  (bench_compile.py)
from bench_coverage import cosine  # noqa: E402  (benchmarks/bench_coverage.py)
from docblock import write_block  # noqa: E402  (benchmarks/docblock.py)

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "fc_split.json"
DOC = ROOT / "docs" / "op-coverage.md"
BEGIN, END = "<!-- bench_fc_split:begin -->", "<!-- bench_fc_split:end -->"
ARCHS = ("dnnvm-zu2", "DPUCZDX8G_ISA1_B4096")
#: Goals: no CPU node, bit-exact, the end-to-end tests' cosine bound, and bench_compile's VGG-16 goals.
COSINE_MIN = 0.99
WALL_MAX_S, RSS_MAX_MIB = GOALS["vgg16"]


@contextlib.contextmanager
def split_disabled(arch: str) -> Iterator[None]:
    """The arch's limits profile with the conv2d / dense "split" rule off (the partition before the split)."""
    from tvm_dpu.arch import load_arch
    from tvm_dpu.arch.limits import profile_rules

    rules = profile_rules(load_arch(arch))  # the cached profile: restored on exit
    saved = {k: rules[k].get("split") for k in ("conv2d", "dense")}
    try:
        for k in saved:
            rules[k]["split"] = False
        yield
    finally:
        for k, v in saved.items():
            rules[k]["split"] = v


def cpu_nodes(onnx_path: Path, arch: str) -> list[str]:
    """Names of the ONNX nodes the partition of `arch` leaves on the CPU."""
    from tvm_dpu.frontend import from_onnx
    from tvm_dpu.passes import partition

    return [n.name for n in partition(from_onnx(str(onnx_path)), arch)[1].cpu_nodes]


def bench(model: str, archs: list[str], reduced: bool, images: int) -> list[dict]:
    """One row per arch: CPU nodes before/after, compile wall and peak RSS, DPU MACs, mismatches, cosine.

    The model is built in a spawned process and every compile runs first (as bench_compile does): a child's peak
    RSS starts at this process's own high-water mark, so building VGG-16 here, or compiling after loading a compiled
    VGG-16 and an onnxruntime session, would report this process's memory too."""
    with tempfile.TemporaryDirectory(prefix=f"bench_fc_split_{model}_") as tmp:
        work = Path(tmp)
        onnx_path, calib_path = prepare_elsewhere(model, reduced, images, work)
        runs = {a: compile_once(onnx_path, calib_path, a, work / a) for a in archs}
        return [_check(model, reduced, a, onnx_path, runs[a], work / a) for a in archs]


def _check(model: str, reduced: bool, arch: str, onnx_path: Path, run: dict, outdir: Path) -> dict:
    """The row of `arch` from its compile `run`: the partitions with and without the split, and the artifact in
    `outdir` run once with verification against onnxruntime."""
    import onnx
    import onnxruntime as ort

    import tvm_dpu
    from tvm_dpu import zoo
    from tvm_dpu.xgraph.ops import op_macs

    with split_disabled(arch):
        before = cpu_nodes(onnx_path, arch)
    after = cpu_nodes(onnx_path, arch)
    compiled = tvm_dpu.load(str(next(outdir.glob("*.tvmdpu"))))
    graphs = [r.graph for r in compiled.runners.values()]
    macs = sum(op_macs(op, g) for g in graphs for op in g.ops)
    parts = sorted({op.name.rsplit("/part", 1)[0] for g in graphs for op in g.ops if op.attrs.get("in_slice")})
    onnx_model = onnx.load(str(onnx_path))
    x = zoo.random_input(onnx_model, seed=1)
    compiled.set_verify(True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y = compiled.run(x)[0]
    results = compiled.verify_results()
    sess = ort.InferenceSession(onnx_model.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    return {"model": model, "reduced": reduced, "arch": arch, "cpu_nodes_before": before, "cpu_nodes_after": after,
            "split_ops": parts, "dpu_macs": int(macs), "verified_calls": len(results),
            "mismatches": int(sum(r.mismatches for r in results)), "cosine": cosine(y, ref),
            "compile_wall_s": run["wall_s"], "peak_rss_mib": run["peak_rss_mib"], "phases_s": run["phases_s"],
            "goals": {"cpu_nodes_after": 0, "mismatches": 0, "cosine_min": COSINE_MIN,
                      "compile_wall_s_max": WALL_MAX_S, "peak_rss_mib_max": RSS_MAX_MIB}}


def _goal(ok: bool, text: str) -> str:
    return f"{text} {'met' if ok else 'MISSED'}"


def table(rows: list[dict], load: float | None = None) -> str:
    """The Markdown table of `rows` (one per model and arch), goals beside each figure."""
    lines = ["| model | arch | CPU nodes before | CPU nodes after (goal 0) | split ops | DPU GMACs | "
             "golden != emulator (goal 0) | cosine vs onnxruntime (goal > 0.99) | compile s (goal < 60) | "
             "peak MiB (goal < 2048) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        before = len(r["cpu_nodes_before"])
        after = len(r["cpu_nodes_after"])
        cos, wall, rss = f"{r['cosine']:.4f}", f"{r['compile_wall_s']:.1f}", f"{r['peak_rss_mib']:.0f}"
        lines.append(
            f"| {r['model']}{' (reduced)' if r['reduced'] else ''} | {r['arch']} | {before} | "
            f"{_goal(after == 0, str(after))} | {', '.join(r['split_ops']) or '-'} | {r['dpu_macs'] / 1e9:.2f} | "
            f"{_goal(r['mismatches'] == 0, str(r['mismatches']))} | "
            f"{_goal(r['cosine'] > COSINE_MIN, cos)} | {_goal(r['compile_wall_s'] < WALL_MAX_S, wall)} | "
            f"{_goal(r['peak_rss_mib'] < RSS_MAX_MIB, rss)} |")
    if load is not None:
        lines.append("")
        lines.append(f"Compile figures: one `tvm-dpu compile` in a fresh process per arch, load average {load:.2f} "
                     f"at the start on {os.cpu_count()} cores (other jobs make them slower); before = the same "
                     "partitioner with the limits profile's split rule off.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="vgg16")
    ap.add_argument("--archs", default=",".join(ARCHS))
    ap.add_argument("--reduced", action="store_true", help="the reduced zoo model (smoke test)")
    ap.add_argument("--calib-images", type=int, default=4)
    ap.add_argument("--json", default=str(DEFAULT_JSON))
    ap.add_argument("--from-json", help="skip the runs: read the rows from this results file")
    ap.add_argument("--write-docs", action="store_true", help=f"rewrite the generated table of {DOC.name}")
    args = ap.parse_args(argv)
    if args.from_json:
        data = json.loads(Path(args.from_json).read_text())
    else:
        load = os.getloadavg()
        rows = bench(args.model, [a.strip() for a in args.archs.split(",") if a.strip()], args.reduced,
                     args.calib_images)
        data = write_results(Path(args.json), rows, load)
    text = table(data["rows"], data["machine"]["loadavg_start"][0])
    print(text)
    if args.write_docs:
        write_block(DOC, BEGIN, END, text)
        print(f"wrote the generated table of {DOC}")
    ok = all(not r["cpu_nodes_after"] and r["mismatches"] == 0 and r["cosine"] > COSINE_MIN for r in data["rows"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
