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
