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


def test_fit_picks_the_least_squares_point_on_the_fit_rows_only(monkeypatch):
    """The fit minimises the squared relative errors of the zcu102 zoo rows over conv_fill x dma rows x host term;
    the other rows only validate: a validation row that would prefer another point does not move the choice."""
    from types import SimpleNamespace

    bench = _bench()

    def fake_simulate(model, arch, params):
        # DPU-only latency; with the host term the zcu102 row is matched exactly only at (128, 1, 0.3 ms)
        lat_ms = 1.0 + (params.conv_fill_cycles / 128) ** 2 + (params.dma_bank_rows_per_cycle - 1)
        return SimpleNamespace(latency_s=lat_ms * 1e-3, gops=100.0 / lat_ms)

    monkeypatch.setattr(bench, "simulate_model", fake_simulate)
    rows = [{"model": "m", "board": "zcu102", "metric": "latency_ms", "published": 2.3},
            {"model": "m", "board": "zcu104", "metric": "latency_ms", "published": 1.2}]
    fitted = bench.fit({("m", "zcu102"): None, ("m", "zcu104"): None}, rows)
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
