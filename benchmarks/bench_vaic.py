"""tvm-dpu's program against vai_c's on the same quantized network, for every vendored vai_c xmodel (issue 23).

Each DPU subgraph of each ISA1 xmodel under tests/data/xmodel is rebuilt from its int8 numbers as QDQ ONNX and
compiled by tvm-dpu (`tvm_dpu.xmodel.compare`, the `tvm-dpu compare` command); both programs run on the emulator
on the same random int8 inputs. Per subgraph: whether the outputs are equal int8 for int8, both programs' cycles
on the timing model, their instructions, SAVE-engine instructions (SAVEs and the END) and DDR bytes, the engines'
overlap (busy cycles per cycle), the ratio ours / vai_c's with its goal (<= RATIO_MAX, 0.95) and the DDR-bytes
goal (ours, read + write, no more than vai_c's). Where a goal is missed, the row names the miss: the cycles lost
against the goal and where, i.e. the layer groups (xmodel.groups: vai_c's groups beside our kernels, both timed in
their whole programs) that lose the most, and what vai_c's program does that ours does not, computed from the two
programs. The JSON holds every group row. Subgraphs that cannot be rebuilt are listed with the reason.
Subgraphs that cannot be timed (a DPU without a timing model yet: DPUCAHX8H, the U50LV files) or that tvm-dpu
cannot compile for are listed in a table of their own: outputs against tvm-dpu's program where it compiled one
(else its golden reference of the same quantized ops), both programs' instructions and DDR bytes.
JSON goes to benchmarks/results/vaic.json (benchmarks/readme_figures.py renders the README figure from it).

    python benchmarks/bench_vaic.py                      # the vendored xmodels
    python benchmarks/bench_vaic.py --extra DIR --json benchmarks/results/vaic_extra.json   # and those in DIR
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_io import write_results  # noqa: E402  (benchmarks/results_io.py)

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "xmodel"
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "vaic.json"
#: The issue's bar (issue 36): our program at most this fraction of vai_c's cycles on the timing model, on every
#: network, or the miss named with the cycles it loses and where.
RATIO_MAX = 0.95
#: Group rows named per miss, the largest losses first.
MISS_GROUPS = 5


def xmodels(extra: list[Path]) -> list[Path]:
    """The vendored vai_c xmodels (tests/data/xmodel, recursively) and those under `extra`, without duplicates."""
    seen: dict[bytes, Path] = {}
    for d in [DATA, *extra]:
        for p in sorted(d.rglob("*.xmodel")):
            seen.setdefault(p.read_bytes()[:4096] + str(p.stat().st_size).encode(), p)
    return list(seen.values())


def why_behind(vai: dict, ours: dict) -> list[str]:
    """What vai_c's program does that ours does not, from the two programs' figures (empty when we are not
    slower)."""
    out = []
    if vai["instructions"]["SAVE"] < ours["instructions"]["SAVE"] or vai["ddr_write"] < ours["ddr_write"]:
        out.append(f"keeps intermediate maps on chip ({vai['instructions']['SAVE']} SAVE-engine instructions, "
                   f"{vai['ddr_write']} B written vs our {ours['instructions']['SAVE']}, {ours['ddr_write']} B)")
    if vai["ddr_read"] < ours["ddr_read"]:
        out.append(f"reads less DDR ({vai['ddr_read']} vs {ours['ddr_read']} B)")
    if vai["overlap"] is not None and ours["overlap"] is not None and vai["overlap"] > ours["overlap"] + 0.02:
        out.append(f"overlaps its engines more ({vai['overlap']:.2f} vs {ours['overlap']:.2f} busy cycles per "
                   "cycle)")
    for e in ("CONV", "MISC", "LOAD"):
        if vai["engine_busy"].get(e.lower(), 0) < 0.97 * ours["engine_busy"].get(e.lower(), 0):
            out.append(f"keeps its {e} engine busy for less ({vai['engine_busy'][e.lower()]:.0f} vs "
                       f"{ours['engine_busy'][e.lower()]:.0f} cycles)")
    if sum(vai["instructions"].values()) < sum(ours["instructions"].values()):
        out.append(f"fewer instructions ({sum(vai['instructions'].values())} vs {sum(ours['instructions'].values())})")
    return out


def _short(names: list[str], n: int = 2) -> str:
    """A group row's ops, shortened for a table cell: the last part of the first and last op name."""
    tail = [x.rsplit("__", 1)[-1] for x in names]
    return tail[0] if len(tail) == 1 else f"{tail[0]} .. {tail[-1]} ({len(tail)} ops)"


def floor_figures(vai: dict, floor: dict | None) -> dict | None:
    """The row's DDR floor (xmodel.compare.ddr_floor: inputs and weights read once, outputs written once, at the
    arch's DDR rate on the timing model) beside vai_c's cycles: `of_vai_c` = floor / vai_c's cycles, and
    `goal_reachable` False when even the floor is above RATIO_MAX x vai_c's cycles (no program can meet the goal)."""
    if floor is None or not vai["cycles"]:
        return None
    of = floor["cycles"] / vai["cycles"]
    return {**floor, "of_vai_c": of, "goal_reachable": of <= RATIO_MAX}


def miss(vai: dict, ours: dict, groups: list[dict], floor: dict | None = None) -> dict | None:
    """The miss of a row whose ratio is above RATIO_MAX: the cycles it loses against the goal and where (the group
    rows losing the most against RATIO_MAX x vai_c's cycles; what vai_c's program does that ours does not; where
    the DDR floor (`floor_figures`) is above the goal, that the goal is unreachable by construction), or None when
    the goal is met."""
    if ours["cycles"] is None or not vai["cycles"] or ours["cycles"] <= RATIO_MAX * vai["cycles"]:
        return None
    lost = sorted(((g["ours"]["cycles"] - RATIO_MAX * g["vai_c"]["cycles"], g) for g in groups), key=lambda t: -t[0])
    where = [{"ops": _short(g["ops"]), "groups": len(g["groups"]), "cycles_lost": round(c),
              "vai_c_cycles": round(g["vai_c"]["cycles"]), "our_cycles": round(g["ours"]["cycles"])}
             for c, g in lost[:MISS_GROUPS] if c > 0]
    out = {"cycles_lost": round(ours["cycles"] - RATIO_MAX * vai["cycles"]), "where": where,
           "vai_c_does": why_behind(vai, ours)}
    if floor is not None and not floor["goal_reachable"]:
        out["unreachable"] = (f"goal unreachable by construction: the DDR floor ({floor['read_bytes']} B read, "
                              f"{floor['weight_bytes']} B weights, {floor['write_bytes']} B written once, bound by "
                              f"the {floor['bound']}) is {floor['cycles']:.0f} cycles, {floor['of_vai_c']:.3f} of "
                              f"vai_c's; ours is {ours['cycles'] / floor['cycles']:.3f} of the floor")
    return out


def _miss_text(m: dict | None) -> str:
    if m is None:
        return "-"
    where = ", ".join(f"{w['ops']} +{w['cycles_lost']}" for w in m["where"]) or "no one group"
    head = f"{m['unreachable']}; " if m.get("unreachable") else ""
    return head + f"{m['cycles_lost']} cycles over the goal; most lost in: {where}; " + \
        ("; ".join(m["vai_c_does"]) or "-")


def _stats(p) -> dict:
    return {"instructions": dict(p.instructions), "ddr_read": p.ddr_read_bytes, "ddr_write": p.ddr_write_bytes,
            "cycles": p.cycles, "timing_error": p.timing_error, "programs": p.programs,
            "engine_busy": dict(p.engine_busy), "overlap": p.overlap}


def bench(paths: list[Path], seed: int = 0) -> dict:
    """Every DPU subgraph of every xmodel in `paths`: rows (compared) and not_compared (with the reason)."""
    from tvm_dpu.errors import DPUError
    from tvm_dpu.xmodel.compare import compare

    rows, skipped, reference = [], [], []
    for p in paths:
        try:
            rel = str(p.relative_to(ROOT))
        except ValueError:  # an --extra file: its name (the JSON is committed; the directory is the runner's)
            rel = p.name
        t0 = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                c = compare(p, seed=seed)
        except DPUError as e:  # not an xmodel this can compare at all (ISA0, damaged): say why
            skipped.append({"xmodel": rel, "subgraph": None, "why": " ".join(str(e).split())})
            continue
        for s in c.subgraphs:
            vai, ours = _stats(s.vai_c), _stats(s.ours)
            if not s.ours.programs or s.ours.cycles is None or s.vai_c.cycles is None:  # no goals to measure
                reference.append({"xmodel": rel, "arch": c.arch, "subgraph": s.name, "against": s.against,
                                  "outputs_equal": s.outputs_equal, "differing": s.differing, "elements": s.total,
                                  "inputs": s.inputs, "warnings": s.warnings, "layers_equal": s.layers_equal,
                                  "layers": len(s.layers), "vai_c": vai, "ours": ours if s.ours.programs else None,
                                  "notes": s.notes, "seconds": time.perf_counter() - t0})
                continue
            ratio = s.cycle_ratio
            floor = floor_figures(vai, s.ddr_floor)
            ddr_ok = ours["ddr_read"] + ours["ddr_write"] <= vai["ddr_read"] + vai["ddr_write"]
            rows.append({"xmodel": rel, "arch": c.arch, "subgraph": s.name, "outputs_equal": s.outputs_equal,
                         "differing": s.differing, "elements": s.total, "inputs": s.inputs,
                         "warnings": s.warnings, "layers_equal": s.layers_equal, "layers": len(s.layers),
                         "vai_c": vai, "ours": ours,
                         "ratio": ratio, "ratio_goal_met": ratio is not None and ratio <= RATIO_MAX,
                         "ddr_goal_met": ddr_ok,
                         "vai_c_does": why_behind(vai, ours) if ratio is not None and ratio > RATIO_MAX else [],
                         "floor": floor, "miss": miss(vai, ours, s.groups, floor), "groups": s.groups,
                         "groups_error": s.groups_error,
                         "notes": s.notes, "seconds": time.perf_counter() - t0})
        skipped += [{"xmodel": rel, "subgraph": n, "why": w} for n, w in c.not_compared.items()]
    return {"goal_ratio_max": RATIO_MAX, "seed": seed, "rows": rows, "reference_rows": reference,
            "not_compared": skipped}


def _goal(ok: bool, text: str) -> str:
    return f"{text} {'met' if ok else 'MISSED'}"


def table(data: dict) -> str:
    """The Markdown table of a bench result, the goal beside each ratio and equality."""
    lines = ["| xmodel | DPU subgraph | int8 outputs equal (goal: all) | cycles vai_c | cycles ours | "
             f"ratio ours/vai_c (goal <= {RATIO_MAX:.2f}) | instructions vai_c / ours | SAVE engine (SAVEs + END) "
             "vai_c / ours | DDR read B vai_c / ours | DDR write B vai_c / ours | DDR bytes read + write (goal: "
             "ours <= vai_c's) | overlap vai_c / ours | DDR floor cycles (of vai_c's) | the miss: cycles over the goal, "
             "where, what vai_c does |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def cyc(p: dict) -> str:
        return f"{p['cycles']:.0f}" if p["cycles"] is not None else f"n/a ({p['timing_error']})"

    for r in data["rows"]:
        v, o = r["vai_c"], r["ours"]
        ratio = r["ratio"]
        rt = _goal(r["ratio_goal_met"], f"{ratio:.3f}") if ratio is not None else "n/a MISSED"
        if ratio is not None and ratio > RATIO_MAX:
            rt += f" (+{100 * (ratio / RATIO_MAX - 1):.1f}%)"
        ddr = (_goal(r["ddr_goal_met"], f"{v['ddr_read'] + v['ddr_write']} / {o['ddr_read'] + o['ddr_write']}")
               if "ddr_goal_met" in r else "n/a")
        why = _miss_text(r["miss"]) if "miss" in r else ("; ".join(r["vai_c_does"]) or "-")
        ov = lambda p: f"{p['overlap']:.2f}" if p["overlap"] is not None else "n/a"  # noqa: E731
        eq = _goal(r["outputs_equal"], f"{'yes' if r['outputs_equal'] else 'NO'} ({r['differing']} of "
                                       f"{r['elements']} differ)")
        lines.append(
            f"| {Path(r['xmodel']).name} | {r['subgraph']} | {eq} | {cyc(v)} | {cyc(o)} | {rt} | "
            f"{sum(v['instructions'].values())} / {sum(o['instructions'].values())} | "
            f"{v['instructions']['SAVE']} / {o['instructions']['SAVE']} | {v['ddr_read']} / {o['ddr_read']} | "
            f"{v['ddr_write']} / {o['ddr_write']} | {ddr} | {ov(v)} / {ov(o)} | {_floor_text(r.get('floor'))} | "
            f"{why} |")
    for s in data["not_compared"]:
        lines.append(f"| {Path(s['xmodel']).name} | {s['subgraph'] or '-'} | not compared: {s['why']} |"
                     + " |" * 11)
    return "\n".join(lines + reference_table(data.get("reference_rows", [])))


def _floor_text(f: dict | None) -> str:
    return "n/a" if f is None else f"{f['cycles']:.0f} ({f['of_vai_c']:.3f}, {f['bound']})"


def group_table(row: dict) -> str:
    """The Markdown table of one subgraph's group rows (vai_c's layer groups beside our kernels)."""
    lines = [f"{Path(row['xmodel']).name} {row['subgraph']}: per layer group (xmodel.groups)",
             "| ops | vai_c groups / our kernels | cycles vai_c | cycles ours | ratio | SAVE engine vai_c / ours | "
             "DDR read B vai_c / ours | DDR write B vai_c / ours |", "|---|---|---|---|---|---|---|---|"]
    for g in row.get("groups", []):
        v, o = g["vai_c"], g["ours"]
        ratio = f"{g['ratio']:.3f}" if g["ratio"] is not None else "n/a"
        lines.append(f"| {_short(g['ops'])} | {len(g['groups'])} / {len(g['kernels'])} | {v['cycles']:.0f} | "
                     f"{o['cycles']:.0f} | {ratio} | {v['instructions']['SAVE']} / {o['instructions']['SAVE']} | "
                     f"{v['ddr_read']} / {o['ddr_read']} | {v['ddr_write']} / {o['ddr_write']} |")
    return "\n".join(lines)


def reference_table(rows: list[dict]) -> list[str]:
    """vai_c's programs that cannot be timed (a DPU without a timing model: DPUCAHX8H) or that tvm-dpu cannot
    compile for: their outputs against tvm-dpu's program (else its golden reference of the same quantized ops),
    instructions and DDR bytes of vai_c's / tvm-dpu's program."""
    if not rows:
        return []
    lines = ["", "vai_c's programs not timed (no timing model for their DPU yet) or not compiled by tvm-dpu, run on "
             "the emulator against tvm-dpu's program for the same quantized ops (else its golden reference):", "",
             "| xmodel | DPU | DPU subgraph | against | int8 outputs equal (goal: all) | layers equal | "
             "instructions LOAD/SAVE/CONV/MISC vai_c / ours | DDR read / write B vai_c / ours | cycles |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        v, o = r["vai_c"], r.get("ours")
        eq = _goal(r["outputs_equal"], f"{'yes' if r['outputs_equal'] else 'NO'} ({r['differing']} of "
                                       f"{r['elements']} differ)")
        cyc = f"{v['cycles']:.0f}" if v["cycles"] is not None else f"n/a ({v['timing_error']})"
        engines = "/".join(str(v["instructions"][e]) for e in ("LOAD", "SAVE", "CONV", "MISC"))
        ddr = f"{v['ddr_read']} / {v['ddr_write']}"
        if o is not None:
            engines += " / " + "/".join(str(o["instructions"][e]) for e in ("LOAD", "SAVE", "CONV", "MISC"))
            ddr += f" / {o['ddr_read']} / {o['ddr_write']}"
        lines.append(f"| {Path(r['xmodel']).name} | {r['arch']} | {r['subgraph']} | {r['against']} | {eq} | "
                     f"{r['layers'] if r['layers_equal'] else 'NO'} | {engines} | {ddr} | {cyc} |"
                     + ("" if o is not None else f" {why_no_ours(r)} |"))
    return lines


def why_no_ours(row: dict) -> str:
    """Why a reference row has no program of ours: compare's note saying what tvm-dpu cannot compile yet."""
    notes = [n for n in row.get("notes", []) if n.startswith("tvm-dpu compiles no program")]
    return notes[0].split(" (")[0] if notes else "none (no note)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--extra", action="append", default=[], help="another directory of vai_c xmodels")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=str(DEFAULT_JSON))
    ap.add_argument("--from-json", help="skip the runs: print the table of this results file")
    args = ap.parse_args(argv)
    if args.from_json:
        data = json.loads(Path(args.from_json).read_text())
    else:
        data = bench(xmodels([Path(e) for e in args.extra]), args.seed)
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        write_results(args.json, data, indent=1)
    print(table(data))
    for r in data["rows"]:
        if r.get("miss") and len(r.get("groups", [])) > 1:
            print("\n" + group_table(r))
    missed = [r for r in data["rows"] if not (r["ratio_goal_met"] and r["outputs_equal"])]
    ddr = sum(1 for r in data["rows"] if r.get("ddr_goal_met"))
    ref = data.get("reference_rows", [])
    print(f"\n{len(data['rows']) - len(missed)} of {len(data['rows'])} DPU subgraphs meet the cycle and equality "
          f"goals, {ddr} the DDR-bytes goal; " + (f"{sum(r['outputs_equal'] for r in ref)} of {len(ref)} not "
                                                   f"compared on cycles equal their reference; " if ref else "")
          + f"{len(data['not_compared'])} not compared")
    return 0


if __name__ == "__main__":
    sys.exit(main())
