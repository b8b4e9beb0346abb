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
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibration_vaic as vaic  # noqa: E402  (benchmarks/calibration_vaic.py)
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
FIT_GRID = {"conv_fill_cycles": (96, 160, 224, 288), "dma_issue_cycles": (16, 32, 64), "ddr_efficiency": (0.5, 0.7, 0.9)}


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


def our_program(network: str, board: str) -> tuple[Callable[[TimingParams, float], float] | None, str | None]:
    """The hook for tvm-dpu's own DPUCAHX8H programs: (ms per frame at params and clock, None) once the family
    compiles, else (None, why not)."""
    fam = families()[FAMILY]
    if not fam.compile:
        return None, f"tvm-dpu compiles no {FAMILY} program yet ({fam.missing})"
    import tvm_dpu
    from tvm_dpu import zoo
    from tvm_dpu.runtime.model_timing import simulate_model

    m = zoo.build_model(network)
    model = tvm_dpu.build(m, arch=board, calibration=[zoo.random_input(m, seed=0)], progress=False)
    return (lambda p, mhz: simulate_model(model, arch=board_at(board, mhz), params=p).latency_s * 1e3), None


def vaic_ms(path: Path, arch, params: TimingParams | None = None) -> tuple[float, int]:
    """(ms per frame of every DPU subgraph of the xmodel on `arch`, instructions)."""
    total, n = 0.0, 0
    for d in read_xmodel(path).dpu_subgraphs():
        r = simulate(np.frombuffer(d.mc_code, "<u4").astype(np.uint32), arch, params)
        total += r.latency_s * 1e3
        n += len(r.names)
    return total, n


def vaic_records() -> list[dict]:
    """VAIC_U50 timed on their cards (and the DPUCZDX8G twin on its board): missing files are listed, not dropped."""
    out = []
    for v in VAIC_U50:
        path = vaic.find_xmodel(v.xmodel)
        rec = {"key": v.key, "xmodel": Path(v.xmodel).name, "board": v.board, "note": v.note, "published": None}
        if path is None:
            out.append({**rec, "available": False, "why": f"not found in {', '.join(map(str, vaic.xmodel_dirs()))}"})
            continue
        ms, n = vaic_ms(path, load_arch(v.board))
        rec.update(available=True, instructions=n, dpu_ms=ms, engine_fps=1e3 / ms,
                   card_fps=load_arch(v.board).cores * 1e3 / ms)
        twin = vaic.find_xmodel(v.twin) if v.twin else None
        if twin is not None:
            tms, tn = vaic_ms(twin, load_arch(v.twin_board))
            rec["twin"] = {"xmodel": v.twin, "board": v.twin_board, "dpu_ms": tms, "instructions": tn,
                           "ratio": ms / tms}
        out.append(rec)
    return out


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
               "source": r.source, "program": "ours" if prog else None, "why_no_program": why}
        if prog is not None:
            rec["_predict"] = prog
        out.append(rec)
    return out


def predict_all(records: list[dict], params: TimingParams) -> None:
    for rec in records:
        if "_predict" in rec:
            rec["predicted_ms"] = rec["_predict"](params, rec["freq_mhz"])
            rec["relative_error"] = (rec["predicted_ms"] - rec["engine_ms"]) / rec["engine_ms"]


def fit(records: list[dict], base: TimingParams, grid: dict = FIT_GRID) -> dict | None:
    """Least squares of the fit rows' relative errors over FIT_GRID; None when no fit row has a program."""
    rows = [r for r in records if r["use"] == "fit" and "_predict" in r]
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
    return {"n": len(errs), "mean_abs": float(np.mean(np.abs(errs))), "max_abs": float(np.max(np.abs(errs)))} \
        if errs else None


def run() -> dict:
    base = load_params("u50")
    records = published_records(load_published())
    fitted = fit(records, base)
    predict_all(records, base.replace(**fitted["change"]) if fitted else base)
    errs = {u: [r["relative_error"] for r in records if r["use"] == u and "relative_error" in r]
            for u in ("fit", "validation")}
    for r in records:
        r.pop("_predict", None)
    return {"family": FAMILY, "split": {f"{k[0]} {k[1]}": v for k, v in SPLIT.items()}, "fit_grid": FIT_GRID,
            "params": dataclasses.asdict(base), "fitted": fitted, "rows": records, "vaic": vaic_records(),
            "error": {u: _stats(e) for u, e in errs.items()},
            "rows_with_program": sum(r["program"] is not None for r in records)}


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}%"


def table(data: dict) -> str:
    lines = [f"DPUCAHX8H calibration: {len(data['rows'])} published rows of tvm_dpu networks "
             f"({sum(r['use'] == 'fit' for r in data['rows'])} fit / "
             f"{sum(r['use'] == 'validation' for r in data['rows'])} validation, declared split), "
             f"{data['rows_with_program']} with a program",
             "| release | board | zoo name | network | use | engines | MHz | fps (card) | ms per engine | implied "
             "utilisation | predicted ms | error | program |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        u = r["implied_utilisation"]
        pred = f"{r['predicted_ms']:.2f}" if "predicted_ms" in r else "-"
        lines.append(f"| {r['release']} | {r['board']} | {r['zoo_name']} | {r['network']} | {r['use']} | "
                     f"{r['engines']} | {r['freq_mhz']:g} | {r['fps']:g} | {r['engine_ms']:.2f} | "
                     f"{'n/a' if u is None else f'{100 * u:.0f}%'} | {pred} | {_pct(r.get('relative_error'))} | "
                     f"{r['program'] or 'none: ' + r['why_no_program'].split(' (')[0]} |")
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
    f = data["fitted"]
    lines.append("")
    lines.append(f"fit: {f['change']} on {f['fit_rows']} rows (mse {f['mse']:.4f})" if f else
                 "fit: not run (no fit row has a DPUCAHX8H program); parameters stay params_dpucahx8h.json's "
                 "(DPUCZDX8G-derived, see its _doc)")
    for u, s in data["error"].items():
        lines.append(f"{u} error: " + (f"mean |e| {100 * s['mean_abs']:.1f}%, max {100 * s['max_abs']:.1f}% "
                                       f"over {s['n']} rows" if s else "no row predicted"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=str(DEFAULT_JSON))
    args = ap.parse_args(argv)
    data = run()
    write_results(args.json, data, indent=1)
    print(table(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
