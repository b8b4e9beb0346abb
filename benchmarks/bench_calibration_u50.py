"""Calibration of the DPUCAHX8H timing model (tvm_dpu/timing/params_dpucahx8h.json) against AMD's published Alveo
U50 / U50LV / U280 figures (benchmarks/data/published_figures.json, issue 39), following bench_calibration's method:
a declared fit / validation split, programs timed at each figure's own board and clock, nothing tuned per network.

The split, declared before any prediction (SPLIT): fit = the U50 rows of Vitis AI 1.4 (6 engines at the overlay's
300 MHz: the clock the parameters were written for) and the U50lv rows of 2.0; validation = everything else (U280
1.4, U50lv 1.4 / 2.5, the U50lv DWC tables of 2.0 / 2.5). A row is predicted when a DPUCAHX8H program of its network
is at hand:

* vai_c's programs (`VAIC_U50`): the model zoo publishes no U50 figure for a network of vai_c's public U50 programs
  (PointPillars-KITTI has no U50 / U50lv / U280 row in 1.4, 2.0 or 2.5; tf2_custom_op is a demo): they are timed and
  listed, matched to no figure. PointPillars is compared with vai_c's DPUCZDX8G program of the same network on the
  DPUCZDX8G model (same conv array, PP 8 x ICP 16 x OCP 16): a cross-family consistency figure, not a calibration.
* ours: `our_program` is the hook: now that the family compiles (families.json 'compile'), each fit / validation
  row with a tvm_dpu network is compiled for the row's board and timed, the fit (FIT_GRID) runs on the fit rows and
  the validation rows report their error (not run yet on this tree: it builds every published network).

Every row also gives the utilisation its figure implies: the network's GOP (from the zoo name) over one engine's
peak (4096 ops per clock at the row's clock) for the per-engine time engines/fps: the band a prediction must fall in.

    python benchmarks/bench_calibration_u50.py [--json benchmarks/results/calibration_u50.json]
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import pickle
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibration_vaic as vaic  # noqa: E402  (benchmarks/calibration_vaic.py)
from docblock import write_block  # noqa: E402  (benchmarks/docblock.py)
from published import PublishedRow, load_published  # noqa: E402  (benchmarks/published.py)
from results_io import write_results  # noqa: E402  (benchmarks/results_io.py)
from tvm_dpu.arch import load_arch
from tvm_dpu.arch.arch import families
from tvm_dpu.timing.params import TimingParams, load_params
from tvm_dpu.timing.simulate import simulate
from tvm_dpu.xmodel.model import read_xmodel

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "calibration_u50.json"
FAMILY = "DPUCAHX8H"
#: The declared split: (release, board) -> use.
SPLIT = {("1.4", "u50"): "fit", ("2.0", "u50lv"): "fit", ("1.4", "u280"): "validation",
         ("1.4", "u50lv"): "validation", ("2.5", "u50lv"): "validation", ("2.0", "u50lv-dwc"): "validation",
         ("2.5", "u50lv-dwc"): "validation"}
#: The fit's grid (the DPUCZDX8G-derived parameters the figures could move): every combination is simulated.
#: The DPUCZDX8G fit's values (224, 32, 0.7) are inside; the grid reaches below them because our DPUV3E programs are
#: unfused (more instructions per frame than vai_c's, each paying a fill and an issue).
FIT_GRID = {"conv_fill_cycles": (0, 16, 32, 64, 128, 224), "dma_issue_cycles": (4, 8, 16, 32),
            "ddr_efficiency": (0.5, 0.7, 0.9)}


class VaicU50(NamedTuple):
    """A vai_c DPUCAHX8H program: its file, the card it is timed on and the DPUCZDX8G program of the same network."""

    key: str
    xmodel: str
    board: str
    twin: str | None  # vai_c's DPUCZDX8G xmodel of the same network (calibration_vaic names), or None
    twin_board: str | None
    note: str


VAIC_U50 = (
    VaicU50("pointpillars u50lv", "pointpillars_custom_op_u50lv_cd437d4143a38734bb3aba509dc6b4cc5111ddd9.xmodel",
            "u50lv", vaic.POINTPILLARS_VAI25, "kv260",
            "Vitis AI 2.5's PointPillars custom-op example for U50LV (xcompiler 2.5.0, Xilinx/Vitis-AI c26eae36; "
            "2 MB, found through $TVM_DPU_XMODELS); the model zoo publishes no U50 figure for PointPillars-KITTI"),
    VaicU50("pointpillars u50lv-dwc", "pointpillars_custom_op_u50lv-dwc_59a2ba1f015add2c7539062c5bf0d6742c0c2e00.xmodel",
            "u50lv-dwc", vaic.POINTPILLARS_VAI25, "kv260", "the same network for the U50LV-DWC overlay"),
    VaicU50("tf2_custom_op u50lv", "dpucahx8h/tf2_custom_op_vai2.5_u50lv.xmodel", "u50lv", None, None,
            "Vitis AI 2.5's TF2 custom-op demo (vendored): no published figure"),
)


def gop(zoo_name: str) -> float | None:
    """The network's GOP from its zoo name (..._7.7G, ..._602M), None when the name gives none."""
    m = re.search(r"_([0-9.]+)([GM])$", zoo_name)
    return None if m is None else float(m.group(1)) * (1.0 if m.group(2) == "G" else 1e-3)


def implied_utilisation(row: PublishedRow) -> float | None:
    """GOP / (one engine's peak at the row's clock x its per-engine time): what the figure says one engine achieves."""
    g = gop(row.zoo_name)
    if g is None:
        return None
    peak = load_arch(row.board).ops_per_clock * row.freq_mhz * 1e6
    return g * 1e9 / (peak * row.dpu_ms_upper * 1e-3)


def board_at(board: str, freq_mhz: float):
    """The board preset at a row's own DPU clock (the zoo scaled the U50lv / U280 clocks down)."""
    return dataclasses.replace(load_arch(board), freq_mhz=freq_mhz)


#: Where each network's compiled DPUCAHX8H program is kept between runs (never in the repository): full-size compiles
#: take minutes, the fit simulates each program many times.
CACHE_DIR = Path(os.environ.get("TVM_DPU_U50_CACHE", "/tmp/tvm_dpu_u50_programs"))
#: The preset a row's program is compiled for: one program per target (ISA2 / DWC), timed at every card's clock.
COMPILE_BOARD = {"DPUCAHX8H_ISA2": "u50", "DPUCAHX8H_ISA2_DWC": "u50lv-dwc"}


class Program(NamedTuple):
    """One compiled network for one DPUCAHX8H target: each DPU subgraph's (code, op_ranges, real ops)."""

    network: str
    target: str
    subgraphs: tuple[tuple[np.ndarray, list, float | None], ...]
    words: int  # 32-bit code words over every DPU subgraph

    def ms(self, arch, params: TimingParams) -> float:
        """One frame on one engine of `arch`: every DPU subgraph back to back."""
        return sum(simulate(c, arch, params, r, o).latency_s for c, r, o in self.subgraphs) * 1e3


def compile_program(network: str, target: str, cache: Path = CACHE_DIR, reduced: bool = False) -> Program:
    """tvm-dpu's full-size (or `reduced`: tests) `network` compiled for `target` (COMPILE_BOARD's preset), from the
    cache when there."""
    path = cache / f"{network}{'.reduced' if reduced else ''}.{target}.pkl"
    if path.is_file():
        try:
            return Program(*pickle.loads(path.read_bytes()))  # our own cache file (a plain tuple), written below
        except (pickle.UnpicklingError, TypeError, AttributeError, EOFError, ImportError):
            pass  # a cache of an older layout: compiled again
    import tvm_dpu
    from tvm_dpu import zoo
    from tvm_dpu.timing.analytic import graph_ops
    from tvm_dpu.xgraph.ops import layer_descs

    m = zoo.build_model(network, reduced=reduced)
    model = tvm_dpu.build(m, arch=COMPILE_BOARD[target], calibration=[zoo.random_input(m, seed=0)], progress=False)
    sgs = []
    for runner in model.runners.values():
        g = getattr(runner, "graph", None)
        sgs.append((np.asarray(runner.sg.code, np.uint32), list(runner.sg.op_ranges),
                    graph_ops(layer_descs(g)) if g is not None else None))
    prog = Program(network, target, tuple(sgs), sum(len(c) for c, _, _ in sgs))
    cache.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(tuple(prog)))
    return prog


def our_program(network: str, board: str) -> tuple[Program | None, str | None]:
    """tvm-dpu's own program of `network` for the card's target: (Program, None), else (None, why not)."""
    fam = families()[FAMILY]
    if not fam.compile:
        return None, f"tvm-dpu compiles no {FAMILY} program yet ({fam.missing})"
    target = load_arch(board).target
    try:
        return compile_program(network, target), None
    except Exception as e:  # noqa: BLE001  (a network the family cannot build is a row without prediction)
        return None, f"{network} does not compile for {target}: {type(e).__name__}: {str(e).splitlines()[0][:160]}"


def vaic_ms(path: Path, arch, params: TimingParams | None = None) -> tuple[float, int]:
    """(ms per frame of every DPU subgraph of the xmodel on `arch`, instructions)."""
    total, n = 0.0, 0
    for d in read_xmodel(path).dpu_subgraphs():
        r = simulate(np.frombuffer(d.mc_code, "<u4").astype(np.uint32), arch, params)
        total += r.latency_s * 1e3
        n += len(r.names)
    return total, n


def side_by_side(path: Path) -> list[dict]:
    """`tvm-dpu compare` of a vai_c DPUCAHX8H xmodel: per DPU subgraph, vai_c's and our program's cycles on the
    model at params_dpucahx8h.json's values (ours compiled from the xmodel's own quantized network), or why the
    subgraph was not compared."""
    from tvm_dpu.xmodel.compare import compare

    c = compare(path, inputs=1)
    out = [{"subgraph": s.name, "vai_c_cycles": s.vai_c.cycles, "ours_cycles": s.ours.cycles,
            "vai_c_instructions": s.vai_c.instructions, "ours_instructions": s.ours.instructions,
            "ratio": s.cycle_ratio, "outputs_equal": s.outputs_equal} for s in c.subgraphs]
    return out + [{"subgraph": k, "not_compared": v} for k, v in c.not_compared.items()]


def vaic_records(compare_programs: bool = False, params: TimingParams | None = None) -> list[dict]:
    """VAIC_U50 timed on their cards (and the DPUCZDX8G twin on its board), with `compare_programs` also beside our
    program of the same network: missing files are listed, not dropped."""
    out = []
    for v in VAIC_U50:
        path = vaic.find_xmodel(v.xmodel)
        rec = {"key": v.key, "xmodel": Path(v.xmodel).name, "board": v.board, "note": v.note, "published": None}
        if path is None:
            out.append({**rec, "available": False, "why": f"not found in {', '.join(map(str, vaic.xmodel_dirs()))}"})
            continue
        ms, n = vaic_ms(path, load_arch(v.board), params)
        rec.update(available=True, instructions=n, dpu_ms=ms, engine_fps=1e3 / ms,
                   card_fps=load_arch(v.board).cores * 1e3 / ms)
        twin = vaic.find_xmodel(v.twin) if v.twin else None
        if twin is not None:
            tms, tn = vaic_ms(twin, load_arch(v.twin_board))
            rec["twin"] = {"xmodel": v.twin, "board": v.twin_board, "dpu_ms": tms, "instructions": tn,
                           "ratio": ms / tms}
        if compare_programs:
            rec["ours"] = side_by_side(path)
        out.append(rec)
    return out


#: A row's figure measures our network's work when the zoo model is the same one (match "same") or its GOP (from the
#: zoo name) is within this fraction of our program's: the fit and the error statistics use only those rows (e.g.
#: cf_squeezenet is SqueezeNet 1.0 at 0.76 GOP, our squeezenet1_1 does 0.35). Declared with the split.
SAME_WORK_TOLERANCE = 0.15
_MEMO: dict = {}


def _predictor(prog: Program, board: str) -> Callable[[TimingParams, float], float]:
    """ms per frame of `prog` on one engine of `board` at (params, clock), each point simulated once."""
    def predict(p: TimingParams, mhz: float) -> float:
        key = (prog.network, prog.target, board, mhz, p)
        if key not in _MEMO:
            _MEMO[key] = prog.ms(board_at(board, mhz), p)
        return _MEMO[key]
    return predict


def same_work(row: PublishedRow, prog: Program | None) -> bool | None:
    """Whether the row's model does our program's work (SAME_WORK_TOLERANCE); None without a program."""
    if prog is None:
        return None
    ours = sum(o or 0.0 for _, _, o in prog.subgraphs) / 1e9
    g = gop(row.zoo_name)
    return row.match == "same" or (g is not None and abs(ours / g - 1) <= SAME_WORK_TOLERANCE)


def published_records(rows: Sequence[PublishedRow]) -> list[dict]:
    """One record per DPUCAHX8H figure of a tvm_dpu network: its use, implied utilisation and program (or why none)."""
    out, ours = [], {}
    for r in rows:
        if not r.arch.startswith(FAMILY) or r.network is None:
            continue
        use = SPLIT.get((r.release, r.board), "validation")
        key = (r.network, r.board)
        if key not in ours:
            ours[key] = our_program(r.network, r.board)
        prog, why = ours[key]
        rec = {"zoo_name": r.zoo_name, "network": r.network, "match": r.match, "release": r.release,
               "board": r.board, "engines": r.cores, "freq_mhz": r.freq_mhz, "fps": r.value,
               "engine_ms": r.dpu_ms_upper, "use": use, "implied_utilisation": implied_utilisation(r),
               "source": r.source, "program": f"ours ({prog.target})" if prog else None, "why_no_program": why,
               "same_work": same_work(r, prog)}
        if prog is not None:
            rec.update(our_gop=sum(o or 0.0 for _, _, o in prog.subgraphs) / 1e9, words=prog.words,
                       _predict=_predictor(prog, r.board))
        out.append(rec)
    return out


def predict_all(records: list[dict], params: TimingParams) -> None:
    for rec in records:
        if "_predict" in rec:
            rec["predicted_ms"] = rec["_predict"](params, rec["freq_mhz"])
            rec["relative_error"] = (rec["predicted_ms"] - rec["engine_ms"]) / rec["engine_ms"]


def fit(records: list[dict], base: TimingParams, grid: dict = FIT_GRID) -> dict | None:
    """Least squares of the fit rows' relative errors over FIT_GRID (rows of the same work only); None when no fit
    row has a program."""
    rows = [r for r in records if r["use"] == "fit" and "_predict" in r and r.get("same_work", True)]
    if not rows:
        return None
    best = None
    for values in itertools.product(*grid.values()):
        change = dict(zip(grid, values))
        p = base.replace(**change)
        err = [(r["_predict"](p, r["freq_mhz"]) - r["engine_ms"]) / r["engine_ms"] for r in rows]
        score = float(np.mean(np.square(err)))
        if best is None or score < best["mse"]:
            best = {"change": change, "mse": score, "fit_rows": len(rows)}
    return best


def _stats(errs: list[float]) -> dict | None:
    """Median and worst |pred / published - 1| (and the signed mean: a bias the fit could not remove)."""
    if not errs:
        return None
    a = np.abs(errs)
    return {"n": len(errs), "median_abs": float(np.median(a)), "max_abs": float(np.max(a)),
            "mean": float(np.mean(errs))}


def error_stats(records: list[dict]) -> dict:
    """Per split, over the rows of the same work and over every predicted row."""
    out = {}
    for u in ("fit", "validation"):
        rows = [r for r in records if r["use"] == u and "relative_error" in r]
        out[u] = _stats([r["relative_error"] for r in rows if r["same_work"]])
        out[f"{u}_all_rows"] = _stats([r["relative_error"] for r in rows])
    return out


def run(fit_grid: dict = FIT_GRID, compare_programs: bool = False) -> dict:
    base = load_params("u50")
    records = published_records(load_published())
    # "before the fit": the fitted keys at DPUCZDX8G's values (params.json), where this family's values came from
    zcu = load_params("zcu102")
    before_params = base.replace(**{k: getattr(zcu, k) for k in fit_grid})
    predict_all(records, before_params)
    before = error_stats(records)
    fitted = fit(records, base, fit_grid)
    final = base.replace(**fitted["change"]) if fitted else base
    predict_all(records, final)
    for r in records:
        r.pop("_predict", None)
    return {"family": FAMILY, "date": time.strftime("%Y-%m-%d", time.gmtime()), "split": {f"{k[0]} {k[1]}": v
            for k, v in SPLIT.items()}, "fit_grid": fit_grid, "same_work_tolerance": SAME_WORK_TOLERANCE,
            "params": dataclasses.asdict(final), "before_fit": {k: getattr(before_params, k) for k in fit_grid},
            "fitted": fitted, "rows": records, "vaic": vaic_records(compare_programs, final),
            "error": error_stats(records),
            "error_before_fit": before, "rows_with_program": sum(r["program"] is not None for r in records)}


def _side_by_side_text(subs: list[dict]) -> str:
    parts = []
    for s in subs:
        name = s["subgraph"][:48]
        if "not_compared" in s:
            parts.append(f"{name}: not compared ({s['not_compared'].split(' (')[0]})")
        elif s["ours_cycles"] is None or s["vai_c_cycles"] is None:
            parts.append(f"{name}: no timing")
        else:
            parts.append(f"{name}: vai_c {s['vai_c_cycles']:,.0f} cycles, ours {s['ours_cycles']:,.0f} "
                         f"(x{s['ratio']:.3f}), outputs {'equal' if s['outputs_equal'] else 'DIFFER'}")
    return "; ".join(parts)


_YES_NO = {True: "yes", False: "no", None: "-"}


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}%"


def table(data: dict) -> str:
    lines = [f"DPUCAHX8H calibration: {len(data['rows'])} published rows of tvm_dpu networks "
             f"({sum(r['use'] == 'fit' for r in data['rows'])} fit / "
             f"{sum(r['use'] == 'validation' for r in data['rows'])} validation, declared split), "
             f"{data['rows_with_program']} with a program",
             "| release | board | zoo name | network | use | engines | MHz | fps (card) | ms per engine | implied "
             "utilisation | predicted ms | error | same work | program |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        u = r["implied_utilisation"]
        pred = f"{r['predicted_ms']:.2f}" if "predicted_ms" in r else "-"
        lines.append(f"| {r['release']} | {r['board']} | {r['zoo_name']} | {r['network']} | {r['use']} | "
                     f"{r['engines']} | {r['freq_mhz']:g} | {r['fps']:g} | {r['engine_ms']:.2f} | "
                     f"{'n/a' if u is None else f'{100 * u:.0f}%'} | {pred} | {_pct(r.get('relative_error'))} | "
                     f"{_YES_NO[r['same_work']]} | {r['program'] or 'none: ' + r['why_no_program'].split(' (')[0]} |")
    lines += ["", "vai_c's DPUCAHX8H programs (no published figure matches them):",
              "| program | board | instructions | DPU ms per frame (one engine) | card fps (all engines) | "
              "vai_c's DPUCZDX8G program of the same network | ratio |", "|---|---|---|---|---|---|---|"]
    for v in data["vaic"]:
        if not v["available"]:
            lines.append(f"| {v['key']} | {v['board']} | not available: {v['why']} | | | | |")
            continue
        t = v.get("twin")
        tw = f"{t['dpu_ms']:.2f} ms on {t['board']} ({t['instructions']} instr)" if t else "-"
        ratio = f"{t['ratio']:.2f}" if t else "-"
        lines.append(f"| {v['key']} | {v['board']} | {v['instructions']} | {v['dpu_ms']:.2f} | {v['card_fps']:.1f} "
                     f"| {tw} | {ratio} |")
    lines += [f"{v['key']} beside tvm-dpu's program of the same network: {_side_by_side_text(v['ours'])}"
              for v in data["vaic"] if v.get("ours")]
    f = data["fitted"]
    lines.append("")
    lines.append(f"fit: {f['change']} on {f['fit_rows']} rows (mse {f['mse']:.4f})" if f else
                 "fit: not run (no fit row has a DPUCAHX8H program); parameters stay params_dpucahx8h.json's "
                 "(DPUCZDX8G-derived, see its _doc)")
    for u, s in data["error"].items():
        lines.append(f"{u} |pred/published - 1|: " + (f"median {100 * s['median_abs']:.1f}%, worst "
                                                       f"{100 * s['max_abs']:.1f}%, mean signed "
                                                       f"{100 * s['mean']:+.1f}% over {s['n']} rows"
                                                       if s else "no row predicted"))
    return "\n".join(lines)


DOCS = ROOT / "docs" / "timing-model.md"
BEGIN, END = "<!-- bench_calibration_u50:begin -->", "<!-- bench_calibration_u50:end -->"
PARAMS_FILE = ROOT / "tvm_dpu" / "timing" / "params_dpucahx8h.json"


def docs_section(data: dict) -> str:
    """The docs/timing-model.md block: per network and split, our program's predicted engine time against AMD's."""
    f, e, b = data["fitted"], data["error"], data["error_before_fit"]
    lines = ["| release | board | zoo name | MHz | AMD ms / engine | ours predicted ms | pred/published - 1 |",
             "|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        if r.get("same_work") and "predicted_ms" in r:
            lines.append(f"| {r['release']} | {r['board']} ({r['use']}) | {r['zoo_name']} | {r['freq_mhz']:g} | "
                         f"{r['engine_ms']:.2f} | {r['predicted_ms']:.2f} | {_pct(r['relative_error'])} |")

    def stat(s: dict | None) -> str:
        return "no row" if s is None else (f"median {100 * s['median_abs']:.1f}%, worst {100 * s['max_abs']:.1f}%, "
                                           f"mean signed {100 * s['mean']:+.1f}% ({s['n']} rows)")
    before = ", ".join(f"{k} {v:g}" for k, v in data["before_fit"].items())
    lines += ["", f"Generated by benchmarks/bench_calibration_u50.py ({data['date']}): {data['rows_with_program']} of "
              f"{len(data['rows'])} published rows have a program of ours; the table lists those doing the same work "
              f"(match 'same', or zoo GOP within {100 * data['same_work_tolerance']:.0f}% of ours). "
              + (f"Fit {f['change']} on {f['fit_rows']} fit rows." if f else "No fit ran."),
              f"|pred/published - 1| before the fit (DPUCZDX8G's values: {before}): fit split {stat(b['fit'])}; "
              "validation "
              f"{stat(b['validation'])}.",
              f"After the fit: fit split {stat(e['fit'])}; validation {stat(e['validation'])}; every predicted "
              f"validation row (other work included) {stat(e['validation_all_rows'])}."]
    lines += [f"vai_c's {v['key']} program ({v['xmodel']}, no published figure) beside ours compiled from its "
              f"quantized network (`tvm-dpu compare`): {_side_by_side_text(v['ours'])}."
              for v in data["vaic"] if v.get("ours")]
    return "\n".join(lines)


def write_params(data: dict, path: Path = PARAMS_FILE) -> None:
    """The fitted values into params_dpucahx8h.json's defaults, with their source (this benchmark and its date)."""
    f = data["fitted"]
    if f is None:
        raise SystemExit("no fit ran: params_dpucahx8h.json left as it is")
    doc = json.loads(path.read_text())
    d = doc["defaults"]
    for k, v in f["change"].items():
        d[k] = v
    edge = [k for k, v in f["change"].items() if v in (min(data["fit_grid"][k]), max(data["fit_grid"][k]))]
    d["_fitted_on_u50"] = (f"{', '.join(f'{k} {v}' for k, v in f['change'].items())}: fitted by "
                           f"benchmarks/bench_calibration_u50.py on {data['date']} (results/calibration_u50.json) "
                           f"over FIT_GRID on the {f['fit_rows']} fit rows of the same work (U50 1.4, U50lv 2.0): "
                           "tvm-dpu's own DPUCAHX8H programs timed against AMD's measured engine time of vai_c's "
                           "programs, so the values absorb the code-quality difference as well as the model's "
                           "error (ours are unfused); validation error in docs/timing-model.md (DPUCAHX8H)."
                           + (f" {' and '.join(edge)} on the grid's edge: the fit rows ask for less than a physical "
                              "pipeline can give, the sign of code-quality difference, not of a measured constant."
                              if edge else ""))
    path.write_text(json.dumps(doc, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=str(DEFAULT_JSON))
    ap.add_argument("--write-docs", action="store_true", help="also write the DPUCAHX8H block of docs/timing-model.md")
    ap.add_argument("--write-params", action="store_true",
                    help="also write the fitted values into tvm_dpu/timing/params_dpucahx8h.json")
    ap.add_argument("--compare-vaic", action="store_true",
                    help="also compile each vai_c program's network with tvm-dpu and time both (tvm-dpu compare)")
    args = ap.parse_args(argv)
    data = run(compare_programs=args.compare_vaic)
    write_results(args.json, data, indent=1)
    print(table(data))
    if args.write_docs:
        write_block(DOCS, BEGIN, END, docs_section(data))
    if args.write_params:
        write_params(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
