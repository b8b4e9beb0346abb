"""The dependency checker and the timing model on vai_c's own programs (issue 22): per DPU subgraph of every
xmodel given, the instruction count, per-pair posts/waits and program-order depth, min capacity, run-ahead, races
(from the emulator's exact access sets), problems and the timing model's cycles. JSON to
benchmarks/results/depcheck.json; a Markdown table on stdout.

    python benchmarks/bench_depcheck.py                                  # tests/data/xmodel (vendored)
    python benchmarks/bench_depcheck.py --dir /work/scratch/xmodels      # plus a directory of larger xmodels
    python benchmarks/bench_depcheck.py --from-json benchmarks/results/depcheck.json --write-docs
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tvm_dpu.errors import XModelError
from tvm_dpu.runtime.dep_check import check_code
from tvm_dpu.timing.depcheck import min_capacity
from tvm_dpu.timing.simulate import simulate
from tvm_dpu.xmodel.runner import load_xmodel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_io import write_results  # noqa: E402  (benchmarks/results_io.py)

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "depcheck.json"
DOC = ROOT / "docs" / "dependency-protocol.md"
BEGIN, END = "<!-- bench_depcheck:begin -->", "<!-- bench_depcheck:end -->"


def measure(path: Path) -> list[dict]:
    """One row per DPU subgraph of the xmodel at `path` (one row with the error when it is refused)."""
    try:
        runner = load_xmodel(path)
    except XModelError as e:
        return [{"file": path.name, "error": str(e)[:300]}]
    rows = []
    for name, prog in runner.programs.items():
        t0 = time.perf_counter()
        rep = check_code(prog.sg.code, runner.arch, prog.new_regions())
        sim = simulate(prog.sg.code, runner.arch)
        rows.append({"file": path.name, "subgraph": name, "arch": runner.arch.name, **rep.summary(),
                     "min_capacity": min_capacity(rep), "sim_cycles": sim.cycles,
                     "sim_latency_ms": sim.latency_s * 1e3, "seconds": time.perf_counter() - t0})
    return rows


def table(rows: list[dict]) -> str:
    out = ["| program | instr | per-pair posts/waits (depth) | max depth | min capacity | run-ahead | races | "
           "problems | sim cycles |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['file']} | refused: {r['error'][:80]} | | | | | | | |")
            continue
        pairs = ", ".join(f"{k} {v['posts']}/{v['waits']} ({v['depth']})" for k, v in r["pairs"].items())
        out.append(f"| {r['file'][:40]} `{r['subgraph'][:50]}` | {r['instructions']} | {pairs} | "
                   f"{r['max_cross_depth']} | {r['min_capacity']} | {r['max_runahead']} | {len(r['races'])} | "
                   f"{len(r['problems'])} | {r['sim_cycles']:.0f} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", action="append", default=[], help="another directory of .xmodel files")
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON)
    ap.add_argument("--from-json", type=Path, help="render this JSON instead of measuring")
    ap.add_argument("--write-docs", action="store_true", help=f"rewrite the table in {DOC.name}")
    args = ap.parse_args()
    if args.from_json:
        rows = json.loads(args.from_json.read_text())
    else:
        rows = run(args)
    print(table(rows))
    if args.write_docs:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from docblock import write_block  # benchmarks/docblock.py
        write_block(DOC, BEGIN, END, table(rows))


def run(args: argparse.Namespace) -> list[dict]:
    paths = sorted((ROOT / "tests" / "data" / "xmodel").rglob("*.xmodel"))
    for d in args.dir:
        paths += sorted(Path(d).glob("*.xmodel"))
    rows = [row for p in paths for row in measure(p)]
    write_results(args.json, rows, indent=1)
    return rows


if __name__ == "__main__":
    main()
