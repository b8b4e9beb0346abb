"""A small seeded part of benchmarks/bench_reliability.py in every test run: bad artifacts and bad inputs give the
project's error or the original output; no other exception, crash, hang or wrong output."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_reliability.py"


def test_reliability_campaigns_small(tmp_path):
    out = tmp_path / "rel.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--cases", "4", "--seed", "7", "--json", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["bad_total"] == 0
    results = data["results"]
    assert results["program"]["clean"] == results["program"]["cases"] == 4  # the header's digest catches each
    assert results["bytes"]["clean"] == 4 and results["npz"]["clean"] == results["npz"]["cases"]
    assert results["threads"]["same"] == results["threads"]["cases"] == 160
    # round three (issue 40): each of these must be refused, none may run
    for name in ("streams", "trust_files", "runner_args", "cli_args"):
        assert results[name]["clean"] == results[name]["cases"] > 0, name
    vendored = list((BENCH.parents[1] / "tests" / "data" / "xmodel").rglob("*.xmodel"))  # ISA1 and U50LV files
    assert results["xmodel"]["cases"] == 4 * len(vendored) and results["xmodel"]["wrong"] == 0
