"""The README's measured figures, rendered from the benchmark JSON in benchmarks/results (never typed).

    python benchmarks/readme_figures.py           # print the block
    python benchmarks/readme_figures.py --write   # replace the block between the README's markers

tests/test_readme_figures.py fails when the README's block differs from what the committed JSON renders, so a
figure cannot go stale without a test saying so. Sources: compile.json (bench_compile.py), e2e.json
(bench_e2e.py; e2e_loaded.json: the same under a stated load), calibration.json (bench_calibration.py),
fusion.json (bench_fusion.py), fc_split.json (bench_fc_split.py), vaic.json (bench_vaic.py), vaic_extra.json
(bench_vaic.py --extra).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from docblock import read_block, write_block  # noqa: E402  (benchmarks/docblock.py)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"
BEGIN, END = "<!-- readme_figures:begin -->", "<!-- readme_figures:end -->"
#: DNNVM's on-board utilisation (Table 3 optimal GOPS over the ZU2 peak) is computed from fusion.json's "paper"
#: column; the four networks the issue compares.
TABLE3 = ("vgg16", "resnet50", "resnet152", "googlenet")
DNNVM_ARCH = "dnnvm-zu2"


def _load(name: str, results: Path) -> dict | list | None:
    p = results / name
    return json.loads(p.read_text()) if p.exists() else None


def _goal(ok: bool | None, miss: str) -> str:
    return "goal met" if ok else f"goal missed: {miss}"


def compile_lines(data: dict) -> list[str]:
    out = []
    for r in data["rows"]:
        if r["reduced"]:
            continue
        wall = r["wall_s_median"]
        text = (f"`tvm-dpu compile` of full {r['model']} ({r['calibration_images']} calibration images, {r['arch']}): "
                f"{wall:.1f} s median wall over {len(r['runs'])} run(s)")
        if r["goal_wall_s"] is not None:
            over = f"{wall - r['goal_wall_s']:.1f} s over"
            text += f" (< {r['goal_wall_s']:g} s: {_goal(r['wall_goal_met'], over)})"
        text += f", peak RSS {r['peak_rss_mib_max']:.0f} MiB"
        if r["goal_rss_mib"] is not None:
            over = r["peak_rss_mib_max"] - r["goal_rss_mib"]
            text += f" (< {r['goal_rss_mib']:g} MiB: {_goal(r['rss_goal_met'], f'{over:.0f} MiB over')})"
        out.append(text)
    if out:
        load = data["machine"]["loadavg_start"][0]
        bytecode = (data["machine"].get("bytecode") or {}).get("precompiled")
        how = ("; tvm_dpu imported from bytecode, as an installed package is (bench_compile --source-imports: "
               "from source)") if bytecode else ("; tvm_dpu imported from source" if bytecode is False else "")
        out[-1] += f"{how}; load average {load:.2f} at the start (`benchmarks/results/compile.json`)."
    return out


def emulator_lines(data: dict, source: str = "e2e.json") -> list[str]:
    out = []
    condition = data.get("condition")  # e2e_loaded.json says what load it ran under
    for m in data["models"]:
        med = m["run_s"]["median"]
        ratio = m.get("run_over_onnxruntime")
        goals = m.get("goals", {})
        text = (f"Emulator, full {m['model']} on {m['arch']}: {med:.2f} s per image median of {len(m['run_s']['all'])}"
                f" runs")
        if "run_s_median_max" in goals:
            cap_s = goals["run_s_median_max"]
            text += f" (<= {cap_s:g} s: {_goal(med <= cap_s, f'{med - cap_s:.2f} s over')})"
        if ratio is not None:
            ort = m["onnxruntime_s"]["median"]
            text += f"; onnxruntime float in the same run {1e3 * ort:.0f} ms, ratio {ratio:.1f}x"
            if "run_over_onnxruntime_max" in goals:
                cap = goals["run_over_onnxruntime_max"]
                text += f" (<= {cap:g}x: {_goal(ratio <= cap, f'{ratio / cap:.1f} times the goal')})"
        if condition:
            text += f"; {condition}"
        out.append(text + f" (`benchmarks/results/{source}`).")
    for x in data.get("xmodels", []):  # bench_e2e --xmodel: a vai_c program's warm runs
        med = x["run_s"]["median"]
        cap_s = x.get("goals", {}).get("run_s_median_max")
        text = (f"Emulator, vai_c's program {x['xmodel']} ({x['instructions']:,} instructions, {x['arch']}): "
                f"{med:.3f} s warm per image median of {len(x['run_s']['all'])} runs, CONV GEMMs on {x['conv_gemm']}")
        if cap_s is not None:
            text += f" (<= {cap_s:g} s: {_goal(med <= cap_s, f'{med - cap_s:.3f} s over')})"
        if condition:
            text += f"; {condition}"
        out.append(text + f" (`benchmarks/results/{source}`).")
    return out


def emulator_loaded_lines(data: dict) -> list[str]:
    return emulator_lines(data, "e2e_loaded.json")


def calibration_lines(data: dict) -> list[str]:
    rows = data["rows"]
    bad = [r for r in rows if abs(r["relative_error"]) > 0.25]
    boards = "/".join(dict.fromkeys(r["board"] for r in rows if r["metric"] == "latency_ms"))
    text = (f"Timing model vs published figures (Vitis AI model zoo end-to-end latency on {boards}, DNNVM Table 3 "
            f"optimized-fusion GOPS of the conv part): {len(rows) - len(bad)}/{len(rows)} rows within 25%")
    misses = [r for r in rows if r.get("use") == "validation" and abs(r["relative_error"]) > 0.15]
    if any("use" in r for r in rows):
        n_val = sum(r.get("use") == "validation" for r in rows)
        text += (f"; validation rows (split declared before fitting) within 15%: {n_val - len(misses)}/{n_val}" +
                 ("" if not misses else " (outside: " + ", ".join(
                     f"{r['model']} on {r['board']} {r.get('release', '')} {100 * r['relative_error']:+.1f}%"
                     for r in misses) + ")"))
    if bad:
        text += "; outside: " + ", ".join(f"{r['model']} on {r['board']} {100 * r['relative_error']:+.1f}%" for r in bad)
    worst = max(rows, key=lambda r: abs(r["relative_error"]))
    text += f"; largest error {100 * worst['relative_error']:+.1f}% ({worst['model']} on {worst['board']})"
    fit = data.get("fit")
    if fit and fit.get("shipped_fit"):
        names = ", ".join(f"{k} = {v:g}" for k, v in fit["shipped"].items())
        text += (f"; params.json ({names}): max |error| {100 * fit['shipped_fit']['max_abs']:.1f}% on the "
                 f"{fit['fit_rows']}, {100 * fit['shipped_validation']['max_abs']:.1f}% on the other rows")
    vrows = data.get("vaic_rows") or []
    if vrows:
        text += "; on vai_c's own programs (" + ", ".join(
            f"{r['key']} {r['use']} {100 * r['relative_error']:+.0f}%" +
            ("" if r["use"] != "bound" else " held" if r["within_bound"] else " EXCEEDED") for r in vrows) + ")"
    if fit and fit.get("vaic_fit_rows"):
        best = ", ".join(f"{k} = {v:g}" for k, v in fit["best"].items())
        text += (f"; the fit on that basis prefers {best}" +
                 ("" if fit["shipped_is_best"] else ", not params.json's point (bench_calibration --check exits 1)"))
    return [text + " (`benchmarks/results/calibration.json`, `docs/timing-model.md`)."]


def fc_split_lines(data: dict) -> list[str]:
    parts = []
    for r in data["rows"]:
        g = r["goals"]
        n = len(r["cpu_nodes_after"])
        met = _goal(n <= g["cpu_nodes_after"], f"{n} left")
        parts.append(f"{r['arch']}: {len(r['cpu_nodes_before'])} -> {n} CPU nodes ({met}), {r['mismatches']} golden/emulator mismatching elements, cosine {r['cosine']:.4f} vs "
                     "onnxruntime float")
    return ["Full vgg16 with its large fully connected layers split over channels on the DPU: " + "; ".join(parts) +
            " (`benchmarks/results/fc_split.json`, `docs/op-coverage.md`)."]


def fusion_lines(data: list) -> list[str]:
    from tvm_dpu.arch import load_arch

    rows = {r["model"]: r for r in data if r["arch"] == DNNVM_ARCH}
    if not rows:
        return []
    a = load_arch(DNNVM_ARCH)
    peak = a.pp * a.icp * a.ocp * 2 * a.freq_mhz / 1e3  # GOPS
    parts, ahead = [], 0
    for name in TABLE3:
        r = rows.get(name)
        if r is None:
            continue
        # the conv part (bench_fusion.TABLE3_SCOPE: DNNVM ran the fully connected layers on the CPU)
        ours = r["table3_optimal"]["utilisation"]
        theirs = r["paper"][2] / peak
        ahead += ours > theirs
        parts.append(f"{name} {100 * ours:.1f}% (DNNVM {100 * theirs:.0f}%)")
    n = sum(int(r.get("subgraphs", 1)) for r in data)
    lost = {m: sum(r.get("sim_lost_to_optimal", {}).get(m, 0) for r in data) for m in ("greedy", "none")}
    return [f"Fusion (`--fusion optimal`, the program the build ships), predicted utilisation on {DNNVM_ARCH} of "
            "the network without its fully connected layers (as DNNVM's Table 3) vs DNNVM's on-board figures: "
            + ", ".join(parts) + f"; ahead on {ahead} of {len(parts)}. On the "
            f"simulator the searched plan lost to greedy's in {lost['greedy']} and to the unfused one in "
            f"{lost['none']} of {n} subgraphs over {len(data)} model/arch rows; the build compiles the unfused plan "
            "beside the searched one and ships the faster (`benchmarks/results/fusion.json`)."]


def _vaic_part(r: dict, cap: float) -> str:
    """One compared subgraph: cycles and ratio against the goal, the DDR-bytes goal, equality and a named miss."""
    stem = re.sub(r"_[0-9a-f]{40}$", "", Path(r["xmodel"]).stem)  # a scratch copy's name ends with its git blob
    name = f"{stem} {r['subgraph'].split('(')[0]}"
    if r["ratio"] is None:
        return f"{name}: no prediction (goal missed)"
    ratio = r["ratio"]
    eq = "outputs equal" if r["outputs_equal"] else f"{r['differing']} int8 outputs DIFFER"
    text = (f"{name} {r['ours']['cycles']:.0f} vs {r['vai_c']['cycles']:.0f} cycles, ratio {ratio:.3f} "
            f"({_goal(ratio <= cap, f'{100 * (ratio / cap - 1):.1f}% over')}")
    if "ddr_goal_met" in r:
        v, o = (r[k]["ddr_read"] + r[k]["ddr_write"] for k in ("vai_c", "ours"))
        text += f"; DDR bytes {o} vs {v}, {_goal(r['ddr_goal_met'], f'{100 * (o / v - 1):.1f}% more')}"
    floor = r.get("floor")
    if floor and not floor["goal_reachable"]:
        text += (f"; goal unreachable by construction: the DDR floor is {floor['of_vai_c']:.3f} of vai_c's cycles, "
                 f"ours {r['ours']['cycles'] / floor['cycles']:.3f} of it")
    where = (r.get("miss") or {}).get("where") or []
    if where:
        text += f"; most lost in {where[0]['ops']} ({where[0]['cycles_lost']} cycles)"
    return text + f"; {eq})"


def vaic_lines(data: dict, source: str = "vaic.json", scope: str = "every vendored vai_c xmodel's") -> list[str]:
    rows = data["rows"]
    if not rows:
        return []
    cap = data["goal_ratio_max"]
    parts = [_vaic_part(r, cap) for r in rows]
    text = (f"tvm-dpu vs vai_c on the same quantized networks ({scope} DPU subgraphs rebuilt "
            f"from their int8 numbers, timing model, goal ratio <= {cap:.2f}): " + "; ".join(parts))
    ref = data.get("reference_rows", [])
    if ref:
        text += (f"; not compared on cycles (no program of ours or no timing model for its DPU), vai_c's "
                 f"programs on the emulator against tvm-dpu's for the same ops (else the golden reference): "
                 f"{sum(r['outputs_equal'] for r in ref)} of {len(ref)} subgraphs equal")
    if data["not_compared"]:
        text += f"; {len(data['not_compared'])} subgraph(s) not compared"
    return [text + f" (`benchmarks/results/{source}`)."]


def vaic_extra_lines(data: dict) -> list[str]:
    """bench_vaic --extra: the larger public vai_c xmodels (not vendored), those the vendored rows do not cover."""
    data = {**data, "rows": [r for r in data["rows"] if not r["xmodel"].startswith("tests/")],
            "not_compared": [r for r in data["not_compared"] if not r["xmodel"].startswith("tests/")],
            "reference_rows": [r for r in data.get("reference_rows", []) if not r["xmodel"].startswith("tests/")]}
    return vaic_lines(data, "vaic_extra.json", "the larger public vai_c xmodels' (bench_vaic --extra, not vendored)")


def render(results: Path = RESULTS) -> str:
    lines: list[str] = []
    for name, fn in (("compile.json", compile_lines), ("e2e.json", emulator_lines),
                     ("e2e_loaded.json", emulator_loaded_lines),
                     ("calibration.json", calibration_lines), ("fusion.json", fusion_lines),
                     ("fc_split.json", fc_split_lines), ("vaic.json", vaic_lines),
                     ("vaic_extra.json", vaic_extra_lines)):
        data = _load(name, results)
        if data is not None:
            lines += fn(data)
    return "\n".join(f"- {line}" for line in lines)


def current_block(text: str) -> str:
    return read_block(text, BEGIN, END)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="write the block into README.md between its markers")
    args = ap.parse_args(argv)
    block = render()
    if args.write:
        write_block(README, BEGIN, END, block)
        print(f"wrote the figures block of {README}")
    else:
        print(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
