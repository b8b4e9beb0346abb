"""benchmarks/bench_calibration.py fails when a calibration row leaves the +-25% band."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _row(model: str, err: float) -> dict:
    return {"model": model, "board": "zcu102", "metric": "latency_ms", "published": 4.0,
            "predicted": 4.0 * (1 + err), "relative_error": err}


def test_check_fails_outside_the_band_and_passes_inside(tmp_path):
    path = tmp_path / "calibration.json"
    for rows, code in (([_row("a", 0.1), _row("b", -0.249)], 0), ([_row("a", 0.1), _row("b", -0.32)], 1),
                       ([_row("a", 0.251)], 1)):
        path.write_text(json.dumps({"rows": rows}))
        r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_calibration.py"), "--check", str(path)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == code, r.stdout + r.stderr
        assert ("FAIL: b on zcu102" in r.stdout or "FAIL: a on zcu102" in r.stdout) == bool(code)


def test_timing_model_doc_is_generated_from_the_results():
    """docs/timing-model.md's calibration section is what bench_calibration renders from the committed JSON."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_calibration", ROOT / "benchmarks" / "bench_calibration.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    data = json.loads((ROOT / "benchmarks" / "results" / "calibration.json").read_text())
    text = (ROOT / "docs" / "timing-model.md").read_text()
    block = text.split(bench.BEGIN, 1)[1].split(bench.END, 1)[0].strip("\n")
    assert block == bench.docs_section(data), "run python benchmarks/bench_calibration.py --write-docs"
    assert f"{data['within_25pct']}/{data['n_rows']} rows within 25%" in block


def _bench():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_calibration", ROOT / "benchmarks" / "bench_calibration.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_fit_picks_the_least_squares_point_on_the_fit_rows_only(monkeypatch, fake_fit_grid):
    """The fit minimises the squared relative errors of the fit rows (zoo rows on FIT_BOARDS) over conv_fill x dma
    rows x host term; the other rows only validate: a validation row (here on the KV260, a VALIDATION_BOARDS board)
    that would prefer another point does not move the choice."""
    from types import SimpleNamespace

    bench = fake_fit_grid(_bench())

    def fake_simulate(model, arch, params):
        # DPU-only latency; with the host term the zcu102 row is matched exactly only at (128, 1, 0.3 ms)
        lat_ms = 1.0 + (params.conv_fill_cycles / 128) ** 2 + (params.dma_bank_rows_per_cycle - 1)
        return SimpleNamespace(latency_s=lat_ms * 1e-3, gops=100.0 / lat_ms)

    monkeypatch.setattr(bench, "simulate_model", fake_simulate)
    rows = [{"model": "m", "board": "zcu102", "metric": "latency_ms", "published": 2.3},
            {"model": "m", "board": "kv260", "metric": "latency_ms", "published": 1.2}]
    assert [bench.split_use(r) for r in rows] == ["fit", "validation"]
    fitted = bench.fit({("m", "zcu102"): None, ("m", "kv260"): None}, rows)
    assert fitted["best"] == {"conv_fill_cycles": 128, "dma_bank_rows_per_cycle": 1, "ddr_latency_ns": 200.0,
                              "host_pre_post_ms": 0.3}
    assert fitted["basis"].startswith("our programs")  # no vai_c row given: our rows alone, at params.json's latency
    assert fitted["best_fit"]["max_abs"] < 1e-12 and fitted["best_validation"]["max_abs"] > 0.5
    # params.json's point is far from this fake optimum: not fitted, and the check says so
    assert fitted["shipped_sse"] > fitted["best_sse"] * (1 + bench.FIT_SSE_TOLERANCE)
    assert not fitted["shipped_is_best"] and bench.check_fit(fitted) == 1


def test_check_fails_when_params_json_is_not_the_fitted_point(tmp_path):
    path = tmp_path / "calibration.json"
    fit = {"best": {"conv_fill_cycles": 128}, "shipped": {"conv_fill_cycles": 96}, "shipped_is_best": False}
    path.write_text(json.dumps({"rows": [_row("a", 0.1)], "fit": fit}))
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_calibration.py"), "--check", str(path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "is not the fit's best point" in r.stdout, r.stdout + r.stderr


def test_residuals_are_reported_per_family_and_validation_misses_are_named():
    """The split is declared by board (FIT_BOARDS fit, VALIDATION_BOARDS validate) and the residual table groups
    the rows by network family; a validation row outside VALIDATION_GOAL is named with its error, a fit row never."""
    bench = _bench()
    rows = [dict(_row("mobilenetv2", -0.30), board="zcu102"), dict(_row("mobilenetv2", -0.20), board="kv260"),
            dict(_row("resnet50", 0.05), board="ultra96"), dict(_row("vgg16", 0.02), board="zcu104")]
    vaic_rows = [{"key": "yolox-nano kv260 1 core", "network": "yolox-nano", "use": "fit", "relative_error": 0.04},
                 {"key": "yolox-nano zcu102 3 cores", "network": "yolox-nano", "use": "validation",
                  "relative_error": -0.16},
                 {"key": "mnist e2e", "network": "mnist (DPU-PYNQ)", "use": "bound", "relative_error": -0.7}]
    assert [bench.split_use(r) for r in rows] == ["fit", "validation", "validation", "fit"]
    text = "\n".join(bench.family_section({"rows": rows, "vaic_rows": vaic_rows}))
    lines = {ln.split(" | ")[0].lstrip("| "): ln for ln in text.splitlines() if ln.startswith("| ")}
    assert lines["depthwise / inverted residual"] == \
        "| depthwise / inverted residual | 1 | 30.0% | 30.0% | 1 | 20.0% | 20.0% | 0/1 |"
    assert lines["detection heads"].endswith("| 1 | 16.0% | 16.0% | 0/1 |")
    assert lines["small MNIST-class nets"].endswith("no row |")  # a bound row has no residual
    misses = text.split("Validation rows outside the goal: ", 1)[1]
    assert "mobilenetv2 kv260 (-20.0%" in misses and "vai_c yolox-nano zcu102 3 cores (-16.0%" in misses
    assert "zcu102" not in misses.replace("yolox-nano zcu102", "") and "resnet50" not in misses


def test_validation_figures_come_from_the_published_data_file():
    """Every declared validation figure is found in benchmarks/data/published_figures.json, single thread, on a
    validation board; a figure the declaration names but the file lacks stops the benchmark with its name."""
    bench = _bench()
    figs = bench.validation_zoo()
    declared = sum(len(names) for _, _, names in bench.VALIDATION_ZOO)
    assert len(figs) == declared and {f["board"] for f in figs} == set(bench.VALIDATION_BOARDS)
    kv = {(f["model"], f["release"]): f for f in figs if f["board"] == "kv260"}
    assert kv[("mobilenetv2", "1.4")]["published"] == 3.95  # cf_mobilenetv2, the 1.4 table's latency column
    assert all(f["published"] > 0 and "single-thread" in f["source"] for f in figs)
    import pytest

    bad = (("kv260", "1.4", {"resnet50": "cf_no_such_net"}),)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bench, "VALIDATION_ZOO", bad)
        with pytest.raises(SystemExit, match="cf_no_such_net on kv260"):
            bench.validation_zoo()
