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
