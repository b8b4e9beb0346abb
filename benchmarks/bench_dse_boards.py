"""DSE picks against the DPU configurations AMD ships (tvm_dpu/arch/parts.json "shipped"): for each part, the
top configuration of `explore_part` on ResNet-50 (full size; the timing model, DDR-capped), with the platform
reserve, restricted to the core sizes AMD ships there (AMD's objective: one core size across boards), and without
the reserve, beside what AMD ships on the board carrying the part, and whether they match (same DPU size among the
shipped ones, same core count).

    python benchmarks/bench_dse_boards.py                  # -> results/dse_boards.json (or --json PATH), nothing else
    python benchmarks/bench_dse_boards.py --write-docs     # only rewrite the block in docs/pipeline.md from --json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "dse_boards.json"
DOCS = ROOT / "docs" / "pipeline.md"
BEGIN, END = "<!-- bench_dse_boards:begin -->", "<!-- bench_dse_boards:end -->"
PARTS = ("zu3eg", "zu5ev", "zu7ev", "zu9eg")


def matches(pick: dict, shipped: dict) -> bool:
    return pick["dpu"] in shipped["dpu"] and pick["cores"] in shipped["cores"]


def run(model_name: str, reduced: bool, parts: list[str]) -> dict:
    import tvm_dpu
    from tvm_dpu import zoo
    from tvm_dpu.arch.parts import shipped
    from tvm_dpu.pipeline.dse import explore_part, part_conditions

    proto = zoo.build_model(model_name, reduced=reduced)
    model = tvm_dpu.build(proto, arch="B4096", calibration=[zoo.random_input(proto, seed=0)], progress=False)
    cache: dict = {}
    rows = []
    for part in parts:
        row = {"part": part, "shipped": shipped(part), "conditions": part_conditions(part)}
        ship = shipped(part)
        for key, reserve, archs in (("pick", True, None), ("pick_amd_sizes", True, ship["dpu"]),
                                    ("pick_no_reserve", False, None)):
            cands = explore_part(model, part, reserve=reserve, cache=cache, archs=archs)
            best = cands[0].to_json()
            row[key] = best
            row[key + "_top"] = [c.to_json() for c in cands[:5]]
        for key in ("pick", "pick_amd_sizes", "pick_no_reserve"):
            row[key.replace("pick", "match")] = matches(row[key], row["shipped"])
        rows.append(row)
    return {"model": model_name, "reduced": reduced, "rows": rows}


def _cfg(p: dict) -> str:
    uram = f", {p['uram']} URAM" if p["uram"] else ""
    return (f"{p['cores']} x {p['dpu']} ({p['dsp_usage']} DSP{uram}) @ {p['freq_mhz']:.0f} MHz: {p['fps']:.1f} "
            f"frames/s")


def docs_section(data: dict) -> str:
    from tvm_dpu.arch.parts import platform_reserve

    res = platform_reserve()
    lines = [f"Generated from `benchmarks/results/dse_boards.json` (`python benchmarks/bench_dse_boards.py`): "
             f"`explore_part` on {data['model']} ({'reduced' if data['reduced'] else 'full size'}), the top "
             "configuration per part against what AMD ships there (tvm_dpu/arch/parts.json, with sources); "
             "'AMD's core sizes' restricts the search to the sizes AMD ships on that board; the platform reserve is "
             f"{res['lut']:.0f} LUT, {res['bram36k']:.0f} BRAM36K, {res['dsp']:.0f} DSP, {res['uram']:.0f} URAM "
             "(shell upper bound plus the DPU's Vitis interconnect).", "",
             "| part (board) | AMD ships | our pick | match | AMD's core sizes only | match | without the platform "
             "reserve | match |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    yes = {True: "yes", False: "NO"}
    for r in data["rows"]:
        s = r["shipped"]
        ship = " or ".join(f"{c} x {d}" for d in s["dpu"] for c in s["cores"])
        lines.append(f"| {r['part']} ({r['conditions']['board']}) | {ship} | {_cfg(r['pick'])} | {yes[r['match']]} | "
                     f"{_cfg(r['pick_amd_sizes'])} | {yes[r['match_amd_sizes']]} | {_cfg(r['pick_no_reserve'])} | "
                     f"{yes[r['match_no_reserve']]} |")
    lines += ["", "Where a pick differs, why:"]
    lines += [f"- {r['part']}: {explain(r)}" for r in data["rows"]
              if not (r["match"] and r["match_no_reserve"])]
    close = [f"- {r['part']}: {n}" for r in data["rows"] if (n := ddr_note(r))]
    if close:
        lines += ["", "Where the DDR decides the pick:"] + close
    return "\n".join(lines)


def ddr_note(r: dict) -> str:
    """The runner-up (another DPU or core count) when its cores would beat the pick but the DDR caps it."""
    p = r["pick"]
    for q in r["pick_top"]:
        if (q["dpu"], q["cores"]) == (p["dpu"], p["cores"]):
            continue
        cores_fps = q["cores"] * 1e3 / q["latency_ms"]
        if q["ddr_bound"] and cores_fps > p["fps"]:
            return (f"{_short(q)}'s cores would run {cores_fps:.1f} frames/s, more than {_short(p)}'s "
                    f"{p['fps']:.1f}, but the board's DDR ({r['conditions']['ddr_bytes_per_s'] / 1e9:.2f} GB/s) "
                    f"caps it at {q['fps']:.1f}")
        return ""
    return ""


def _short(p: dict) -> str:
    return f"{p['cores']} x {p['dpu']}"


def explain(r: dict) -> str:
    p, a, q = r["pick"], r["pick_amd_sizes"], r["pick_no_reserve"]
    why = []
    if not r["match"]:
        gain = 100.0 * (p["fps"] / a["fps"] - 1.0)
        amd = ("restricted to AMD's core size it picks AMD's core count, " if r["match_amd_sizes"] else
               f"restricted to AMD's core sizes it picks {_short(a)}, ")
        objective = ("AMD ships one core size (B4096) on ZCU102, ZCU104 and KV260 so that one Model Zoo build "
                     "runs on all three (parts.json shipped._objective)" if "B4096" in r["shipped"]["dpu"] else
                     "AMD's choice weighs more than this one model's predicted frames/s")
        why.append(f"we pick {_short(p)} ({p['fps']:.1f} frames/s predicted), {gain:.1f}% more than {_short(a)} "
                   f"({a['fps']:.1f}) on this one model; {amd}so the difference is the objective: {objective}, "
                   f"and {_short(a)} has the lower single-frame latency ({a['latency_ms']:.2f} ms against "
                   f"{p['latency_ms']:.2f} ms)")
    if r["match"] and not r["match_no_reserve"]:
        why.append(f"without the platform reserve {_short(q)} fits ({q['lut']} LUT, {q['bram36k']:.0f} BRAM36K, "
                   f"{q['dsp']} DSP) and is predicted faster ({q['fps']:.1f} frames/s); it is the shell's LUT "
                   "figure, an upper bound taken from a K26 video platform, that leaves it out")
    elif not r["match_no_reserve"]:
        why.append(f"without the platform reserve the pick is {_short(q)} ({q['fps']:.1f} frames/s)")
    return "; ".join(why) if why else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--quick", action="store_true", help="reduced model (checks the script; picks differ)")
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON)
    ap.add_argument("--write-docs", action="store_true", help="only rewrite the docs block from --json")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from docblock import write_block  # benchmarks/docblock.py
    from results_io import load_average, write_results  # benchmarks/results_io.py

    if not args.write_docs:
        load = load_average()
        t0 = time.perf_counter()
        data = run(args.model, args.quick, [p for p in args.parts.split(",") if p])
        data["seconds"] = time.perf_counter() - t0
        print(f"wrote {write_results(args.json, data, load)}")
    data = json.loads(args.json.read_text())
    text = docs_section(data)
    print(text)
    if args.write_docs:  # a run writes only --json: the docs change when asked
        write_block(DOCS, BEGIN, END, text)
        print(f"wrote the block in {DOCS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
