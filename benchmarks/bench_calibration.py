"""Calibration report of the timing model: predicted single-core latency / GOPS of our compiled full-size zoo
models vs the published numbers of shared/docs/dpu-facts.md.

Rows:
* Vitis AI model zoo v1.4 single-thread latency (ms) on ZCU102 (3 x B4096 @ 281 MHz) and ZCU104 (2 x B4096 @
  300 MHz); one image on one core. The published figures include pre/post-processing on the ARM; ours are DPU only.
* DNNVM Table 3 (ZU2 @ 330 MHz, B1152-class) "optimized fusion" GOPS for VGG, ResNet-50, ResNet-152 and
  GoogLeNet on the `dnnvm-zu2` preset, against our fused program's conv part (benchmarks/table3.py: DNNVM ran the
  fully connected layers on the CPU). Not the "baseline" column: DNNVM's baseline is its code "without pipeline
  optimizations" (seed 000, section 6.2), while our per-op code double-buffers LOAD/CONV/SAVE, so the two programs
  are not alike and the row would measure the code generators, not the timing model.

* vai_c-program rows (benchmarks/calibration_vaic.py): our simulator on the DPU subgraphs vai_c itself compiled
  (public xmodels: YOLOX-nano, PointPillars, DPU-PYNQ's MNIST), against published Vitis AI model-zoo / DPU-PYNQ
  figures; no code of ours in the loop, so these rows anchor the fit (FIT_GRID, `fit`) and our rows only break
  the tie within what they allow. The xmodels over 1 MB are found through $TVM_DPU_XMODELS.

One timing parameter set per board (tvm_dpu/timing/params.json); nothing is tuned per network. The model-zoo rows
and the DNNVM rows are compiled with our default fusion ("optimal"; Vitis AI's compiler and DNNVM's optimized column
fuse too). The model-zoo figures are end to end (dpu-facts.md: "include pre/post-processing on the ARM cores"), so
those rows add `host_pre_post_ms` to the simulated DPU time. Also prints the analytic (DNNVM Eq. 1-10) estimate
beside the
simulator and its deviation.

    python benchmarks/bench_calibration.py [--models resnet50,googlenet] [--boards zcu102,dnnvm-zu2]
                                           [--json benchmarks/results/calibration.json] [--trace-dir DIR]
    python benchmarks/bench_calibration.py --check benchmarks/results/calibration.json

Exits 1 (after writing the JSON) when any zoo/DNNVM row or vai_c fit/validation row leaves +-25% of the published
figure, when a simulated DPU time exceeds a published end-to-end time it bounds, or when params.json is not the
fit's point.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibration_vaic as vaic  # noqa: E402  (benchmarks/calibration_vaic.py)
from docblock import write_block  # noqa: E402  (benchmarks/docblock.py)
from table3 import table3  # noqa: E402  (benchmarks/table3.py)
from tvm_dpu.arch import load_arch
from tvm_dpu.timing.analytic import analytic_estimate
from tvm_dpu.timing.params import load_params
from tvm_dpu.runtime.model_timing import simulate_model
from tvm_dpu.xgraph.ops import layer_descs

#: Vitis AI model zoo v1.4 single-thread latency in ms (dpu-facts.md "Measured performance").
ZOO_MS = {
    "zcu102": {"resnet50": 13.75, "resnet18": 5.46, "googlenet": 5.57, "mobilenetv2": 4.0, "vgg16": 49.75},
    "zcu104": {"resnet50": 12.89, "resnet18": 5.16, "googlenet": 5.27, "mobilenetv2": 3.8, "vgg16": 46.68},
}
#: DNNVM Table 3 "optimized fusion" GOPS on ZU2 @ 330 MHz (seed 000, Table 3; the fully connected layers on the CPU).
DNNVM_GOPS = {"dnnvm-zu2": {"vgg16": 334.0, "resnet50": 228.7, "resnet152": 244.1, "googlenet": 231.5}}
ZOO_NAME = {"resnet50": "cf_resnet50", "resnet18": "cf_resnet18", "googlenet": "cf_inceptionv1",
            "mobilenetv2": "cf_mobilenetv2", "vgg16": "tf_vgg16", "resnet152": "ResNet-152"}
#: The validation rows' figures (benchmarks/data/published_figures.json, read by benchmarks/published.py), declared
#: with the split before fitting: the single-thread end-to-end time (latency, else 1/fps; it includes the ARM's
#: pre/post-processing like the fit rows) of our zoo networks on the single-core boards: KV260 in Vitis AI 1.4 (the
#: fit rows' release and zoo names) and 2.5 (the first ISA1 release, TF/MLPerf names), Ultra96 in the AI SDK 2.0.4
#: tables (its only published figures: 1 x B1600 @ 287 MHz, DPU IP v1.4.0). Per (board, release): network -> the
#: zoo name the figure is published under (its prefix before "_imagenet_").
VALIDATION_ZOO = (("kv260", "1.4", {n: ZOO_NAME[n] for n in ("resnet50", "resnet18", "googlenet", "mobilenetv2",
                                                              "vgg16")}),
                  ("kv260", "2.5", {"resnet50": "tf_mlperf_resnet50", "googlenet": "tf_inceptionv1",
                                    "mobilenetv2": "tf_mobilenetv2_1.0", "vgg16": "tf_vgg16"}),
                  ("ultra96", "ai-sdk-2.0.4", {n: ZOO_NAME[n] for n in ("resnet50", "resnet18", "googlenet",
                                                                         "mobilenetv2")}))


def validation_zoo(path: Path | None = None) -> list[dict]:
    """The VALIDATION_ZOO figures: one dict per (board, release, network) with the published single-thread
    end-to-end ms and its source row; a declared figure missing from the file is an error naming it."""
    from published import PUBLISHED, load_published, select  # benchmarks/published.py

    rows = load_published(path or PUBLISHED)
    out = []
    for board, release, names in VALIDATION_ZOO:
        for net, zoo in names.items():
            cand = [r for r in select(rows, board=board, release=release, threads="single",
                                      metric=("latency_ms", "fps"))
                    if r.zoo_name.startswith(zoo + "_imagenet_")]
            cand.sort(key=lambda r: r.metric != "latency_ms")  # the printed latency before 1/fps
            if not cand:
                raise SystemExit(f"published_figures.json has no single-thread figure of {zoo} on {board} "
                                 f"(release {release}), which VALIDATION_ZOO declares")
            r = cand[0]
            out.append({"board": board, "model": net, "release": release, "zoo_name": r.zoo_name,
                        "published": r.dpu_ms_upper, "dpu": r.dpu, "bound": r.bound,
                        "source": f"{r.source} ({r.zoo_name}, {r.threads}-thread {r.metric} {r.value:g})"})
    return out


def _build(name: str, board: str, fusion: str):
    import tvm_dpu
    from tvm_dpu import zoo

    m = zoo.build_model(name)
    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = tvm_dpu.build(m, arch=board, calibration=[zoo.random_input(m, seed=0)], progress=False,
                              fusion=fusion)
    return model, time.perf_counter() - t


def predict(model, board: str, metric: str, params=None):
    """(prediction, ModelTiming) of one row: end-to-end latency in ms (simulated DPU time plus the host's
    pre/post-processing, host_pre_post_ms) for a model-zoo row, the conv part's GOPS (table3) for a DNNVM row."""
    p = params if params is not None else load_params(board)
    mt = simulate_model(model, arch=board, params=p)
    if metric == "latency_ms":
        return mt.latency_s * 1e3 + p.host_pre_post_ms, mt
    syms = list(mt.subgraphs)
    return table3([model.runners[k].graph for k in syms], [mt.subgraphs[k] for k in syms], load_arch(board))["gops"], mt


def _analytic(model, board: str) -> float:
    cycles = 0.0
    for r in model.runners.values():
        if getattr(r, "graph", None) is not None:
            cycles += analytic_estimate(layer_descs(r.graph), board).cycles
    return cycles / (load_arch(board).freq_mhz * 1e6)


#: The calibration bar: every row's prediction within this relative error of the published figure.
TOLERANCE = 0.25


def out_of_band(rows: list[dict], tolerance: float = TOLERANCE) -> list[dict]:
    """The rows whose relative error leaves +-tolerance."""
    return [r for r in rows if abs(r["relative_error"]) > tolerance]


def check(rows: list[dict], tolerance: float = TOLERANCE) -> int:
    """Print every row outside the band; 1 if there is one (the benchmark fails), else 0."""
    bad = out_of_band(rows, tolerance)
    for r in bad:
        print(f"FAIL: {r['model']} on {r['board']}: predicted {r['predicted']:.2f} vs published {r['published']:.2f} "
              f"{r['metric']} ({100 * r['relative_error']:+.1f}%, outside +-{100 * tolerance:.0f}%)")
    print(f"{len(rows) - len(bad)}/{len(rows)} rows within {100 * tolerance:.0f}%")
    return 1 if bad else 0


def check_vaic(records: list[dict], tolerance: float = TOLERANCE) -> int:
    """Print every vai_c-program row that fails: a fit or validation row outside +-tolerance, a bound row whose
    simulated DPU time exceeds the published end-to-end time. 1 if there is one, else 0."""
    bad = 0
    for r in records:
        if r["use"] == "bound" and not r["within_bound"]:
            print(f"FAIL: vai_c {r['key']}: simulated DPU time {r['predicted']:.2f} ms exceeds the published "
                  f"end-to-end {r['published']:.2f} ms ({100 * r['relative_error']:+.1f}%)")
            bad += 1
        elif r["use"] != "bound" and abs(r["relative_error"]) > tolerance:
            print(f"FAIL: vai_c {r['key']} ({r['use']}): predicted {r['predicted']:.2f} vs published "
                  f"{r['published']:.2f} ({100 * r['relative_error']:+.1f}%, outside +-{100 * tolerance:.0f}%)")
            bad += 1
    if records:
        print(f"{len(records) - bad}/{len(records)} vai_c-program rows pass (fit/validation within "
              f"{100 * tolerance:.0f}%, bounds held)")
    return 1 if bad else 0


def check_fit(fitted: dict | None) -> int:
    """1 (and a FAIL line) when params.json does not hold the fit's best point, else 0."""
    if fitted and not fitted["shipped_is_best"]:
        at = [p for p in fitted.get("points", []) if p["change"] == fitted["shipped"]]
        why = (f"outside the band of the vai_c fit rows {fitted['vaic_fit_rows']}"
               if fitted.get("vaic_fit_rows") and at and not at[0].get("in_band", True)
               else f"nor within {100 * fitted.get('sse_tolerance', 0):.0f}% of its squared error")
        print(f"FAIL: params.json {fitted['shipped']} is not the fit's best point {fitted['best']} ({why})")
        return 1
    return 0


#: One physical parameter changed at a time (zcu102 rows): what each assumption does to every network, to show
#: which mechanisms could close a row's error and what they do to the others.
SENSITIVITY = ({"conv_fill_cycles": 96}, {"conv_fill_cycles": 160}, {"conv_fill_cycles": 384},
               {"host_pre_post_ms": 0.0}, {"host_pre_post_ms": 1.0}, {"alu_fill_cycles": 64},
               {"dma_issue_cycles": 16}, {"burst_overhead_beats": 8}, {"ddr_latency_ns": 400.0},
               {"dma_bank_rows_per_cycle": 1}, {"dma_issue_cycles": 4}, {"burst_overhead_beats": 4})
SENSITIVITY_BOARD = "zcu102"

#: The values chosen against published figures (the declared fit set: FIT_BOARDS' rows and the vai_c fit rows).
#: `dma_issue_cycles` and `burst_overhead_beats` are in the grid since vai_c's MobileNetV2 program joined the fit
#: rows (docs/timing-model.md, "Per-engine review"): a LOAD/SAVE's fixed cost against its per-burst cost is what
#: separates that program (10,518 LOADs, nearly all one-burst weight rows) from YOLOX-nano's (many short strided
#: bursts). `ddr_latency_ns` (200) and `dma_bank_rows_per_cycle` (2) left the grid: under dma_own_token
#: "transfer_end" the vai_c rows move by under 1% between 0 and 200 ns, and 1 bank row per cycle fit every row
#: markedly worse (the previous calibration's fit tables, in git history).
FIT_GRID = {"conv_fill_cycles": (64, 96, 128, 160, 192, 224),
            "dma_issue_cycles": (4.0, 16.0, 24.0, 32.0, 40.0),
            "burst_overhead_beats": (0.0, 1.0, 2.0, 4.0),
            "host_pre_post_ms": tuple(round(0.1 * i, 1) for i in range(21))}
#: Our rows' own scan (the fit "our programs alone" would make): these keys over the grid, the others at params.json.
OURS_SCAN_KEYS = ("conv_fill_cycles", "dma_issue_cycles")
#: The fit/validation split, declared before fitting (issue 35) and applied by `split_use` to every row: our
#: programs' model-zoo latency rows on FIT_BOARDS (the multi-core boards the zoo has published longest) and the
#: vai_c rows of use "fit" may move the fitted parameters; every row on VALIDATION_BOARDS (the single-core KV260
#: and Ultra96, whose zoo figures the fit never sees), the DNNVM rows and the other vai_c rows only validate.
#: Our rows break the tie between the points the vai_c fit rows cannot tell apart (and make the whole fit when no
#: vai_c xmodel is at hand).
FIT_BOARDS = ("zcu102", "zcu104")
VALIDATION_BOARDS = ("kv260", "ultra96")
#: The network families the residuals are reported by (issue 35): what each network stresses in the DPU.
FAMILY = {"vgg16": "plain conv", "googlenet": "plain conv", "resnet50": "residual", "resnet18": "residual",
          "resnet152": "residual", "mobilenetv2": "depthwise / inverted residual",
          "yolox-nano": "detection heads", "pointpillars": "detection heads",
          "mnist (DPU-PYNQ)": "small MNIST-class nets"}
FAMILIES = ("plain conv", "residual", "depthwise / inverted residual", "detection heads", "small MNIST-class nets")
#: The goal for a validation row (issue 35): within this relative error of its published figure.
VALIDATION_GOAL = 0.15
#: The minimum over our rows is flat: params.json counts as fitted when its squared error on them is within this
#: fraction of the best point's (and, with vai_c rows, when it lies in their band).
FIT_SSE_TOLERANCE = 0.05


def split_use(row: dict) -> str:
    """"fit" for a model-zoo latency row of our programs on a FIT_BOARDS board, else "validation"."""
    return "fit" if row["board"] in FIT_BOARDS and row["metric"] == "latency_ms" else "validation"


_SIM_KEYS = [k for k in FIT_GRID if k != "host_pre_post_ms"]  # the host term adds to a simulation, no rerun


def _err_stats(errs: list[float]) -> dict:
    return {"n": len(errs), "max_abs": max(map(abs, errs)) if errs else None,
            "rms": (sum(e * e for e in errs) / len(errs)) ** 0.5 if errs else None}


def _our_points(built: dict, rows: list[dict], change: dict) -> list[dict]:
    """Our programs' rows re-simulated at one simulated point: one entry per host term, with the squared error on
    the tie-break rows (split_use "fit": FIT_BOARDS' zoo latency rows) and the error statistics of those and of the others."""
    dpu_only = [predict(built[(r["model"], r["board"])], r["board"], r["metric"],
                        load_params(r["board"]).replace(**change, host_pre_post_ms=0.0))[0] for r in rows]
    out = []
    for host in FIT_GRID["host_pre_post_ms"]:
        fit_errs, val_errs = [], []
        for r, pred in zip(rows, dpu_only):
            pred = pred + host if r["metric"] == "latency_ms" else pred
            e = (pred - r["published"]) / r["published"]
            (fit_errs if split_use(r) == "fit" else val_errs).append(e)
        out.append({"change": {**change, "host_pre_post_ms": host}, "sse_fit": sum(e * e for e in fit_errs),
                    "fit": _err_stats(fit_errs), "validation": _err_stats(val_errs)})
    return out


def _vaic_records(vrows: Sequence[vaic.VaicRow], programs: vaic.VaicPrograms, change: dict | None) -> list[dict]:
    """Every vai_c row's record at params.json plus `change` (None: params.json as it is)."""
    recs = []
    for r in vrows:
        p = load_params(r.board).replace(**(change or {}))
        recs.append(vaic.row_record(r, programs.predict(r, p), programs.dpu_ms(r, p)))
    return recs


def fit(built: dict[tuple[str, str], object], rows: list[dict], vaic_rows: Sequence[vaic.VaicRow] = (),
        programs: vaic.VaicPrograms | None = None) -> dict:
    """Grid fit of FIT_GRID.

    With vai_c rows (`vaic_rows` of use "fit", simulated by `programs`, a calibration_vaic.VaicPrograms): first
    the vai_c basis, our simulator on vai_c's own programs, which no change of our code generator moves: the band
    of grid points whose vai_c fit rows all lie within VAIC_BAND of the grid's best for them. Then, among the
    band only, least squares of the relative errors of our programs' fit rows (split_use: FIT_BOARDS' zoo rows) (re-simulated; compiled
    once with params.json, so the fusion plan's own dependence on the parameters is left out) picks the point and
    the host term, which vai_c's DPU-only figures do not constrain. Without vai_c rows: that second step alone
    over our rows' own scan (OURS_SCAN_KEYS; the fit before vai_c rows existed). Reports both the chosen
    point and the best point of our rows alone (`ours_only`), to show what the vai_c basis changes."""
    import itertools

    vfit = [r for r in vaic_rows if r.use == "fit"]
    shipped = {k: getattr(load_params(FIT_BOARDS[0]), k) for k in FIT_GRID}
    shipped_sim = {k: shipped[k] for k in _SIM_KEYS}
    sims = [dict(zip(_SIM_KEYS, v)) for v in itertools.product(*(FIT_GRID[k] for k in _SIM_KEYS))]
    vpoints = []
    if vfit:
        for change in sims:
            errs = [vaic.relative_error(r, programs.predict(r, load_params(r.board).replace(**change))) for r in vfit]
            vpoints.append({"change": change, "sse": sum(e * e for e in errs), "stats": _err_stats(errs),
                            "errors": {r.key: e for r, e in zip(vfit, errs)}})
        best_max = min(p["stats"]["max_abs"] for p in vpoints)
        band = [p["change"] for p in vpoints if p["stats"]["max_abs"] <= best_max + vaic.VAIC_BAND]
    else:
        band = None
    ours_scan = [c for c in sims if all(c[k] == shipped[k] for k in _SIM_KEYS if k not in OURS_SCAN_KEYS)]
    if band is None:
        band = ours_scan
    todo = band + [c for c in ours_scan + [shipped_sim] if c not in band]
    points = []
    for change in todo:
        for pt in _our_points(built, rows, change):
            pt["in_band"] = change in band
            points.append(pt)

    def argmin(pts):
        return min(pts, key=lambda p: (round(p["sse_fit"], 12), tuple(p["change"].values())))

    best = argmin([p for p in points if p["in_band"]])
    ours_only = argmin([p for p in points if {k: p["change"][k] for k in _SIM_KEYS} in ours_scan])
    at_shipped = [p for p in points if p["change"] == shipped]
    shipped_sse = at_shipped[0]["sse_fit"] if at_shipped else None
    ok = (shipped_sse is not None and at_shipped[0]["in_band"]
          and shipped_sse <= best["sse_fit"] * (1 + FIT_SSE_TOLERANCE))
    out = {"grid": {k: list(v) for k, v in FIT_GRID.items()},
           "basis": "vai_c programs" if vfit else "our programs (no vai_c xmodel at hand)",
           "vaic_fit_rows": [r.key for r in vfit], "vaic_band": vaic.VAIC_BAND if vfit else None,
           "vaic_points": vpoints, "band": band,
           "fit_rows": f"{'/'.join(FIT_BOARDS)} model-zoo latency rows", "points": points, "best": best["change"],
           "best_sse": best["sse_fit"], "shipped": shipped, "shipped_sse": shipped_sse,
           "sse_tolerance": FIT_SSE_TOLERANCE, "shipped_is_best": ok,
           "best_fit": best["fit"], "best_validation": best["validation"],
           "shipped_fit": at_shipped[0]["fit"] if at_shipped else None,
           "shipped_validation": at_shipped[0]["validation"] if at_shipped else None,
           "ours_only": {"best": ours_only["change"], "sse": ours_only["sse_fit"], "fit": ours_only["fit"],
                         "validation": ours_only["validation"]}}
    if vfit:
        best_sim = {k: best["change"][k] for k in _SIM_KEYS}
        out["vaic_at_best"] = _vaic_records(vaic_rows, programs, best_sim)
        out["vaic_at_ours_only"] = _vaic_records(vaic_rows, programs,
                                                 {k: ours_only["change"][k] for k in _SIM_KEYS})
    return out


DOCS = Path(__file__).resolve().parents[1] / "docs" / "timing-model.md"
BEGIN, END = "<!-- bench_calibration:begin -->", "<!-- bench_calibration:end -->"


def sensitivity(models: dict[str, object], board: str = SENSITIVITY_BOARD) -> list[dict]:
    """Predicted latency of each compiled model on `board` under each SENSITIVITY change, with its error against
    the published figure."""
    base = load_params(board)
    out = []
    for change in SENSITIVITY:
        p = base.replace(**change)
        row = {"change": change, "models": {}}
        for name, model in models.items():
            ms = predict(model, board, "latency_ms", p)[0]
            pub = ZOO_MS[board][name]
            row["models"][name] = {"latency_ms": ms, "relative_error": (ms - pub) / pub}
        out.append(row)
    return out


def vaic_sensitivity(vrows: Sequence[vaic.VaicRow], programs: vaic.VaicPrograms) -> list[dict]:
    """The vai_c fit rows' error under each SENSITIVITY change (and two DDR latencies): which constants vai_c's
    programs depend on."""
    vfit = [r for r in vrows if r.use == "fit"]
    out = []
    for change in ({},) + SENSITIVITY + ({"ddr_latency_ns": 100.0}, {"ddr_latency_ns": 0.0}):
        recs = _vaic_records(vfit, programs, change)
        out.append({"change": change, "rows": {r["key"]: r["relative_error"] for r in recs}})
    return out if vfit else []


def docs_section(data: dict) -> str:
    """The calibration section of docs/timing-model.md, from calibration.json."""
    rows = data["rows"]
    lines = ["| board | model | release | use | metric | published | predicted | rel. error | GOPS | % of peak | "
             "analytic | analytic vs sim |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['board']} | {r['model']} | {r.get('release', '-')} | {r.get('use', split_use(r))} | "
                     f"{r['metric']} | {r['published']:.2f} | {r['predicted']:.2f} | "
                     f"{100 * r['relative_error']:+.1f}% | {r['pred_gops']:.1f} | {100 * r['peak_utilisation']:.1f}% | "
                     f"{r['analytic_latency_ms']:.2f} ms | {100 * r['analytic_vs_sim']:+.1f}% |")
    bad = out_of_band(rows)
    lines += ["", f"Generated from `benchmarks/results/calibration.json` by `python benchmarks/bench_calibration.py "
              f"--write-docs`: {len(rows) - len(bad)}/{len(rows)} rows within {100 * TOLERANCE:.0f}% with one "
              "parameter set (params.json defaults, no board overrides); zoo rows compiled with fusion optimal, "
              "DNNVM rows against DNNVM's optimized-fusion GOPS over the conv part; zoo rows add host_pre_post_ms."]
    if bad:
        lines[-1] += " Outside the band (the benchmark exits 1): " + ", ".join(
            f"{r['model']} on {r['board']} ({100 * r['relative_error']:+.1f}%)" for r in bad) + "."
    lines += vaic_section(data)
    lines += published_section(data)
    lines += family_section(data)
    lines += fit_section(data.get("fit"))
    sens = data.get("sensitivity")
    if sens:
        names = list(sens[0]["models"])
        base = {r["model"]: r["relative_error"] for r in rows if r["board"] == SENSITIVITY_BOARD}
        lines += ["", f"One parameter changed at a time ({SENSITIVITY_BOARD}, error against the published latency; "
                  "the first line is params.json as it is):", "",
                  "| change | " + " | ".join(names) + " | rows within 25% |", "|---|" + "---|" * (len(names) + 1)]
        lines.append("| (none) | " + " | ".join(f"{100 * base[n]:+.0f}%" for n in names if n in base) +
                     f" | {sum(abs(base[n]) <= TOLERANCE for n in names if n in base)}/{len(names)} |")
        for s in sens:
            ch = ", ".join(f"{k} = {v:g}" for k, v in s["change"].items())
            errs = [s["models"][n]["relative_error"] for n in names]
            lines.append(f"| {ch} | " + " | ".join(f"{100 * e:+.0f}%" for e in errs) +
                         f" | {sum(abs(e) <= TOLERANCE for e in errs)}/{len(names)} |")
    return "\n".join(lines)


def residual_rows(data: dict) -> list[dict]:
    """Every row with a relative error to report by family: zoo/DNNVM rows and the vai_c fit/validation rows (a
    bound row bounds the DPU time, it has no residual)."""
    out = [{"key": f"{r['model']} {r['board']}" + (f" {r['release']}" if r.get("release") else ""), "family": r.get("family", FAMILY.get(r["model"], "other")),
            "use": r.get("use", split_use(r)), "relative_error": r["relative_error"]} for r in data["rows"]]
    out += [{"key": f"vai_c {r['key']}", "family": FAMILY.get(r["network"], "other"), "use": r["use"],
             "relative_error": r["relative_error"]} for r in data.get("vaic_rows") or [] if r["use"] != "bound"]
    return out


def published_section(data: dict) -> list[str]:
    """Every published figure the calibration compares with, what it bounds on the DPU time and its source."""
    out = ["", "Published figures the calibration compares with (model-zoo rows from ZOO_MS and benchmarks/data/"
           "published_figures.json, DNNVM's Table 3, the vai_c rows' figures); `bound` says what each gives on one "
           "core's DPU time per frame:", "", "| use | family | network | board | release | figure | bound | source |",
           "|---|---|---|---|---|---|---|---|"]
    bound = {"latency_ms": "upper: end to end, single thread (ARM included: rows add host_pre_post_ms)",
             "gops": "DNNVM's simulated/measured conv-part throughput (not a bound)"}
    for r in data["rows"]:
        unit = "ms" if r["metric"] == "latency_ms" else "GOPS"
        out.append(f"| {r.get('use', split_use(r))} | {r.get('family', FAMILY.get(r['model'], 'other'))} | "
                   f"{r['model']} | {r['board']} | {r.get('release', '-')} | {r['published']:.2f} {unit} | "
                   f"{bound[r['metric']]} | {r['source']} |")
    vbound = {"fit": "per-frame DPU time (1/fps multi-thread, single core: upper, equal when DPU-bound)",
              "validation": "cores/fps multi-thread (shared DDR): upper per core, equal when DPU-bound",
              "bound": "upper: end to end (ARM included)"}
    for r in data.get("vaic_rows") or []:
        unit = "fps" if r["metric"] == "fps" else "ms"
        out.append(f"| {r['use']} (vai_c) | {FAMILY.get(r['network'], 'other')} | {r['network']} | {r['board']} | "
                   f"- | {r['published']:.2f} {unit} | {vbound[r['use']]} | {r['source']} |")
    return out


def family_section(data: dict) -> list[str]:
    """The fit/validation residual table per network family, and the validation rows that miss VALIDATION_GOAL."""
    res = residual_rows(data)
    fams = list(FAMILIES) + sorted({r["family"] for r in res} - set(FAMILIES))
    out = ["", f"Residuals by network family (split declared before fitting: fit = our {'/'.join(FIT_BOARDS)} "
           f"model-zoo rows and the vai_c fit rows; validation = everything else, {'/'.join(VALIDATION_BOARDS)} "
           f"included; goal: every validation row within {100 * VALIDATION_GOAL:.0f}%):", "",
           "| family | fit rows | fit max abs | fit rms | validation rows | validation max abs | validation rms | "
           f"validation rows within {100 * VALIDATION_GOAL:.0f}% |", "|---|---|---|---|---|---|---|---|"]
    for fam in fams:
        f = _err_stats([r["relative_error"] for r in res if r["family"] == fam and r["use"] == "fit"])
        v = _err_stats([r["relative_error"] for r in res if r["family"] == fam and r["use"] != "fit"])
        if not f["n"] and not v["n"]:
            out.append(f"| {fam} | 0 | - | - | 0 | - | - | no row |")
            continue
        ok = sum(abs(r["relative_error"]) <= VALIDATION_GOAL for r in res if r["family"] == fam and r["use"] != "fit")
        out.append(f"| {fam} | {f['n']} | {_abs(f['max_abs'])} | {_abs(f['rms'])} | {v['n']} | {_abs(v['max_abs'])} | "
                   f"{_abs(v['rms'])} | {ok}/{v['n']} |")
    miss = [r for r in res if r["use"] != "fit" and abs(r["relative_error"]) > VALIDATION_GOAL]
    out += ["", "Validation rows outside the goal: " + (", ".join(
        f"{r['key']} ({_pct(r['relative_error'])}, {r['family']})" for r in miss) if miss else "none") + "."]
    return out


def _abs(e: float | None) -> str:
    return "-" if e is None else f"{100 * e:.1f}%"


def _pct(e: float | None) -> str:
    return "-" if e is None else f"{100 * e:+.1f}%"


def vaic_section(data: dict) -> list[str]:
    """The vai_c-program rows: published figure, prediction at params.json and at the fit's point, and use."""
    recs = data.get("vaic_rows") or []
    fitted = data.get("fit") or {}
    at_best = {r["key"]: r for r in fitted.get("vaic_at_best") or []}
    out = []
    if recs:
        out += ["", "vai_c-program rows (`benchmarks/calibration_vaic.py`): our simulator on the DPU subgraphs vai_c "
                "compiled (public xmodels), DPU from the fingerprint, clock and DDR from the board preset. A fit "
                "row is a per-frame DPU time; a validation row is held out; a bound row is an end-to-end time that "
                "also covers ARM work, which the simulated DPU time must not exceed (implied ARM time = published "
                "- predicted):", "",
                "| vai_c program, board | use | metric | published | predicted (params.json) | error | "
                "predicted (fit) | error (fit) | source |", "|---|---|---|---|---|---|---|---|---|"]
        for r in recs:
            b = at_best.get(r["key"])
            mark = "" if r["use"] != "bound" else (" (held)" if r["within_bound"] else " (EXCEEDED)")
            bmark = "" if not b or r["use"] != "bound" else (" (held)" if b["within_bound"] else " (EXCEEDED)")
            out.append(f"| {r['key']} | {r['use']} | {r['metric']} | {r['published']:.2f} | {r['predicted']:.2f} | "
                       f"{_pct(r['relative_error'])}{mark} | " +
                       (f"{b['predicted']:.2f} | {_pct(b['relative_error'])}{bmark}" if b else "- | -") +
                       f" | {r['source']} |")
        out += ["", "Why each row has its use:", ""]
        out += [f"* {r['key']}: {r['why']}." for r in recs]
    for m in data.get("vaic_missing") or []:
        out += ["", f"vai_c row {m['key']} not run: {m['xmodel']} {m['why']}."]
    sens = data.get("vaic_sensitivity") or []
    if sens:
        keys = list(sens[0]["rows"])
        out += ["", "What the vai_c fit rows depend on (one constant changed at a time from params.json):", "",
                "| change | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
        for srow in sens:
            ch = ", ".join(f"{k} = {v:g}" for k, v in srow["change"].items()) or "(none)"
            out.append(f"| {ch} | " + " | ".join(_pct(srow["rows"][k]) for k in keys) + " |")
    return out


def fit_section(fitted: dict | None) -> list[str]:
    """The fit table of the calibration section: the band's and our rows' errors at every simulated point."""
    if not fitted:
        return []
    names = list(fitted["grid"])
    vaic_err = {tuple(p["change"].values()): p["stats"]["max_abs"] for p in fitted.get("vaic_points") or []}
    if fitted.get("vaic_fit_rows"):
        head = (f"Fit of {', '.join(f'`{n}`' for n in names)} on the vai_c basis: first the band of grid points "
                f"whose vai_c fit rows ({', '.join(fitted['vaic_fit_rows'])}) lie within "
                f"{100 * fitted['vaic_band']:.0f} points of the grid's best for them; then, within the band only, "
                f"least squares of the relative errors of our programs' {fitted['fit_rows']} (compiled once with "
                "params.json and re-simulated) picks the point and the host term, which DPU-only figures do not "
                "constrain. Every other row validates. Points simulated: the band, params.json's point and our "
                "rows' own scan (OURS_SCAN_KEYS over the grid); one line each, with its best host term:")
    else:
        head = (f"Fit of {', '.join(f'`{n}`' for n in names)} on our programs' {fitted['fit_rows']} only (no vai_c "
                "xmodel at hand; least squares over our rows' own scan, OURS_SCAN_KEYS), validated on every "
                "other row; one line per simulated point, with its best host term:")
    out = ["", head, "", "| " + " | ".join(names) + " | in band | vai_c fit max abs | our fit rows max abs | "
           "our fit rows rms | validation max abs | validation rms |", "|" + "---|" * (len(names) + 6)]
    best_per: dict[tuple, dict] = {}  # one line per simulated point: its best host term
    for pt in fitted["points"]:
        k = tuple(v for n, v in pt["change"].items() if n != "host_pre_post_ms")
        if k not in best_per or pt["sse_fit"] < best_per[k]["sse_fit"]:
            best_per[k] = pt
    for k, pt in best_per.items():
        mark = "**" if pt["change"] == fitted["best"] else ""
        f, v = pt["fit"], pt["validation"]
        ve = vaic_err.get(k)
        out.append("| " + " | ".join(f"{mark}{pt['change'][n]:g}{mark}" for n in names) +
                   f" | {'yes' if pt.get('in_band', True) else 'no'} | "
                   f"{'-' if ve is None else f'{100 * ve:.1f}%'} | {100 * f['max_abs']:.1f}% | "
                   f"{100 * f['rms']:.1f}% | {100 * v['max_abs']:.1f}% | {100 * v['rms']:.1f}% |")
    out += ["", f"Best point (bold): {fitted['best']}, squared error on our fit rows {fitted['best_sse']:.5f}; "
            f"params.json holds {fitted['shipped']}, squared error " +
            (f"{fitted['shipped_sse']:.5f}" if fitted["shipped_sse"] is not None else "(off the grid)") +
            (" (in the band and within "
             f"{100 * fitted['sse_tolerance']:.0f}% of the best: taken as fitted)." if fitted["shipped_is_best"]
             else ": NOT the fit (the benchmark exits 1).")]
    sf, sv = fitted.get("shipped_fit"), fitted.get("shipped_validation")
    if sf and sv:
        out[-1] += (f" At params.json: our fit rows max |error| {100 * sf['max_abs']:.1f}% (rms "
                    f"{100 * sf['rms']:.1f}%), validation rows max |error| {100 * sv['max_abs']:.1f}% (rms "
                    f"{100 * sv['rms']:.1f}%).")
    bf, bv = fitted["best_fit"], fitted["best_validation"]
    out[-1] += (f" At the best point: our fit rows max |error| {100 * bf['max_abs']:.1f}% (rms {100 * bf['rms']:.1f}%), "
                f"validation rows max |error| {100 * bv['max_abs']:.1f}% (rms {100 * bv['rms']:.1f}%).")
    oo = fitted.get("ours_only")
    if oo and fitted.get("vaic_fit_rows"):
        at = {r["key"]: r for r in fitted.get("vaic_at_ours_only") or []}
        out += ["", f"Our programs' rows alone (the fit before vai_c rows) would pick {oo['best']} (our fit rows max "
                f"|error| {100 * oo['fit']['max_abs']:.1f}%); there the vai_c fit rows read " +
                ", ".join(f"{k} {_pct(at[k]['relative_error'])}" for k in fitted["vaic_fit_rows"] if k in at) + "."]
    return out


def write_docs(data: dict, path: Path = DOCS) -> None:
    write_block(path, BEGIN, END, docs_section(data))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", metavar="JSON", help="only check an existing results file against the +-25%% bar "
                    "(exit 1 when a row leaves it)")
    ap.add_argument("--models", default="", help="comma-separated subset of the zoo models (default: all rows)")
    ap.add_argument("--boards", default=",".join(FIT_BOARDS + VALIDATION_BOARDS + ("dnnvm-zu2",)))
    ap.add_argument("--json", default=str(Path(__file__).parent / "results" / "calibration.json"))
    ap.add_argument("--trace-dir", default="", help="also write a Chrome trace + PNG Gantt per model and board")
    ap.add_argument("--write-docs", action="store_true",
                    help="also write the calibration section of docs/timing-model.md from the results")
    ap.add_argument("--no-sensitivity", action="store_true", help="skip the one-parameter-at-a-time table")
    ap.add_argument("--no-fit", action="store_true", help="skip the grid fit of the fitted parameters")
    ap.add_argument("--no-vaic", action="store_true",
                    help="leave out the vai_c-program rows (xmodels looked up in $TVM_DPU_XMODELS, tests/data/xmodel)")
    args = ap.parse_args(argv)
    if args.check:
        data = json.loads(Path(args.check).read_text())
        return check(data["rows"]) | check_vaic(data.get("vaic_rows", [])) | check_fit(data.get("fit"))
    boards = [b for b in args.boards.split(",") if b]
    only = {m for m in args.models.split(",") if m}
    rows = []
    # every published figure a row compares with: (model, board) -> [(metric, published, source, release)]
    figures: dict[tuple[str, str], list[tuple[str, float, str, str]]] = {}
    for b in boards:
        for name, pub in ZOO_MS.get(b, {}).items():
            figures.setdefault((name, b), []).append(
                ("latency_ms", pub, "Vitis AI model zoo v1.4, single thread (includes ARM pre/post-processing)", "1.4"))
        for name, pub in DNNVM_GOPS.get(b, {}).items():
            figures.setdefault((name, b), []).append(
                ("gops", pub, "DNNVM Table 3 optimized fusion, ZU2 @ 330 MHz, conv part (FC on the CPU)", "DNNVM"))
    for v in validation_zoo() if set(boards) & set(VALIDATION_BOARDS) else []:
        if v["board"] in boards:
            figures.setdefault((v["model"], v["board"]), []).append(
                ("latency_ms", v["published"], v["source"] + ", single thread end to end (includes the ARM)",
                 v["release"]))
    # one build per (model, DPU): the code depends on the DPU configuration, not on the board clock
    jobs: dict[tuple[str, str, str], list[str]] = {}
    for (name, b) in figures:
        if not only or name in only:
            jobs.setdefault((name, load_arch(b).dpu_name, "optimal"), []).append(b)
    zoo_models: dict[str, object] = {}
    built: dict[tuple[str, str], object] = {}
    for (name, dpu, fusion), bs in jobs.items():
        model, build_s = _build(name, bs[0], fusion)
        if SENSITIVITY_BOARD in bs:
            zoo_models[name] = model
        print(f"built {name} for {bs[0]} ({dpu}, fusion {fusion}) in {build_s:.1f} s", file=sys.stderr, flush=True)
        for b in bs:
            built[(name, b)] = model
            t = time.perf_counter()
            mt = simulate_model(model, arch=b)
            sim_s = time.perf_counter() - t
            ana_s = _analytic(model, b)
            for metric, pub, source, release in figures[(name, b)]:
                predicted = predict(model, b, metric)[0]
                row = {"board": b, "model": name, "published_as": ZOO_NAME.get(name, name), "release": release,
                       "dpu": dpu, "fusion": fusion, "freq_mhz": load_arch(b).freq_mhz,
                       "pred_latency_ms": mt.latency_s * 1e3, "pred_gops": mt.gops,
                       "peak_utilisation": mt.peak_utilisation, "ddr_mbytes": mt.ddr_bytes / 1e6,
                       "analytic_latency_ms": ana_s * 1e3,
                       "analytic_vs_sim": (ana_s - mt.latency_s) / mt.latency_s if mt.latency_s else None,
                       "simulate_seconds": sim_s, "engine_utilisation": {
                           k: v for r in mt.subgraphs.values() for k, v in r.utilisation.items()}
                       if len(mt.subgraphs) == 1 else None,
                       "metric": metric, "published": pub, "predicted": predicted, "source": source,
                       "relative_error": (predicted - pub) / pub}
                row.update(use=split_use(row), family=FAMILY.get(name, "other"))
                rows.append(row)
            if args.trace_dir:
                from tvm_dpu.timing.trace import write_chrome_trace, write_gantt_png

                d = Path(args.trace_dir)
                d.mkdir(parents=True, exist_ok=True)
                for i, r in enumerate(mt.subgraphs.values()):
                    write_chrome_trace(r, d / f"{name}_{b}_{i}.trace.json")
                    write_gantt_png(r, d / f"{name}_{b}_{i}.png", title=f"{name} on {b}")
    hdr = f"{'board':10} {'model':12} {'metric':10} {'published':>9} {'predicted':>9} {'rel.err':>8} " \
          f"{'GOPS':>7} {'%peak':>6} {'analytic':>9} {'ana-sim':>8}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(f"{r['board']:10} {r['model']:12} {r['metric']:10} {r['published']:9.2f} {r['predicted']:9.2f} "
              f"{100 * r['relative_error']:7.1f}% {r['pred_gops']:7.1f} {100 * r['peak_utilisation']:5.1f}% "
              f"{r['analytic_latency_ms']:8.2f}ms {100 * r['analytic_vs_sim']:7.1f}%")
    within = len(rows) - len(out_of_band(rows))
    params = {b: vars(load_params(b)) for b in boards}
    programs = vaic.VaicPrograms()
    vrows = [] if args.no_vaic or only else [r for r in vaic.VAIC_ROWS if programs.available(r)]
    missing = [] if args.no_vaic or only else [
        {"key": r.key, "xmodel": r.xmodel, "why": f"not found in {', '.join(map(str, vaic.xmodel_dirs()))} "
         "(set TVM_DPU_XMODELS; tests/data/xmodel/PUBLIC_NETWORKS.txt)"}
        for r in vaic.VAIC_ROWS if not programs.available(r)]
    vrecs = _vaic_records(vrows, programs, None)
    if vrecs:
        print(f"{'vai_c program, board':34} {'use':10} {'metric':7} {'published':>9} {'predicted':>9} {'rel.err':>8}")
        for r in vrecs:
            print(f"{r['key']:34} {r['use']:10} {r['metric']:7} {r['published']:9.2f} {r['predicted']:9.2f} "
                  f"{100 * r['relative_error']:7.1f}%")
    for m in missing:
        print(f"vai_c row {m['key']}: {m['why']}", file=sys.stderr)
    sens = sensitivity(zoo_models) if zoo_models and not args.no_sensitivity else []
    vsens = vaic_sensitivity(vrows, programs)
    fitted = (fit(built, rows, vrows, programs) if not args.no_fit and not only and set(FIT_BOARDS) <= set(boards)
              else None)
    if fitted:
        bf, bv = fitted["best_fit"], fitted["best_validation"]
        print(f"fit ({fitted['basis']}) of {', '.join(FIT_GRID)}: best {fitted['best']} "
              f"(tie-break rows: max |err| {100 * bf['max_abs']:.1f}%, rms {100 * bf['rms']:.1f}%; validation rows: "
              f"max |err| {100 * bv['max_abs']:.1f}%, rms {100 * bv['rms']:.1f}%); params.json holds "
              f"{fitted['shipped']}" + ("" if fitted["shipped_is_best"] else " -- NOT the best point"))
        if fitted.get("vaic_at_best"):
            print("vai_c rows at the best point: " + "; ".join(
                f"{r['key']} {100 * r['relative_error']:+.1f}%" for r in fitted["vaic_at_best"]))
        print(f"our programs alone would pick {fitted['ours_only']['best']}")
    out = {"rows": rows, "params": params, "within_25pct": within, "n_rows": len(rows), "sensitivity": sens,
           "vaic_rows": vrecs, "vaic_missing": missing, "vaic_sensitivity": vsens, "fit": fitted,
           "notes": ["predicted = DPU time only (CPU parts and ARM pre/post-processing left out)",
                     "model-zoo rows compiled with fusion 'optimal', DNNVM baseline rows with fusion 'none'",
                     "one parameter set per board (tvm_dpu/timing/params.json), none per network",
                     "vai_c-program rows: our simulator on the DPU subgraphs of public vai_c xmodels, DPU from the "
                     "fingerprint, clock and DDR from the board preset (benchmarks/calibration_vaic.py)"]}
    p = Path(args.json)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(out, indent=1))
    print(f"wrote {p}")
    if args.write_docs:
        write_docs(out)
        print(f"wrote the calibration section of {DOCS}")
    # a row outside the band, a vai_c row failing, or an unfitted shipped value fails
    return check(rows) | check_vaic(vrecs) | check_fit(fitted)


if __name__ == "__main__":
    sys.exit(main())
