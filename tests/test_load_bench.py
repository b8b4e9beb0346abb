"""benchmarks/bench_load.py: threads running loaded artifacts at once, every output checked."""
from __future__ import annotations

import json

import numpy as np


def test_load_bench_counts_runs_and_checks_every_output(tmp_path):
    from conftest import load_bench

    bench = load_bench("bench_load")
    out = tmp_path / "load.json"
    assert bench.main(["--threads", "3", "--seconds", "2", "--models", "mixed_cnn", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    row = doc["rows"]["mixed_cnn"]
    assert row["runs"] > 3 and row["mismatching"] == 0 and row["errors"] == 0 and "host" in doc


def test_load_bench_counts_a_wrong_output_and_an_error():
    """The counting itself: a model whose output differs from the expected one, and one that raises."""
    from conftest import load_bench

    bench = load_bench("bench_load")

    class Fixed:
        def __init__(self, y):
            self.y = y

        def run(self, x):
            return [self.y]

    class Broken:
        def run(self, x):
            raise RuntimeError("device lost")

    x = np.zeros(1)
    rows = bench.run_load({"wrong": (Fixed(np.ones(2)), x, np.zeros(2)), "broken": (Broken(), x, np.zeros(2)),
                           "right": (Fixed(np.zeros(2)), x, np.zeros(2))}, threads=3, seconds=0.2)
    assert rows["wrong"]["mismatching"] == rows["wrong"]["runs"] > 0
    assert rows["broken"]["errors"] == rows["broken"]["runs"] > 0 and "device lost" in rows["broken"]["first_error"]
    assert rows["right"]["mismatching"] == rows["right"]["errors"] == 0
