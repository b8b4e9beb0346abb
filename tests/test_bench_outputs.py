"""Benchmarks write only where they are told, and every results file records the host's load average."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from conftest import load_bench

ROOT = Path(__file__).resolve().parents[1]


def test_dse_boards_with_json_elsewhere_leaves_the_docs_alone(tmp_path, monkeypatch):
    docs = ROOT / "docs" / "pipeline.md"
    before = docs.read_bytes()
    out = tmp_path / "dse.json"
    bench = load_bench("bench_dse_boards")
    monkeypatch.setattr(sys, "argv", ["bench_dse_boards.py", "--quick", "--parts", "zu9eg", "--json", str(out)])
    assert bench.main() == 0
    assert docs.read_bytes() == before
    host = json.loads(out.read_text())["host"]
    assert len(host["load_average_start"]) == 3 and len(host["load_average_end"]) == 3
    assert host["cpus"] >= 1


def test_every_benchmark_with_a_json_output_records_the_load_average():
    """Each benchmark script that writes a results file does it through results_io.write_results (or records
    os.getloadavg itself)."""
    missing = []
    for path in sorted((ROOT / "benchmarks").glob("bench_*.py")):
        text = path.read_text()
        if not re.search(r"json\.dumps?\(", text):
            continue
        if "write_results(" not in text and "getloadavg" not in text:
            missing.append(path.name)
    assert missing == []
