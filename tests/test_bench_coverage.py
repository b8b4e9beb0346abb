"""benchmarks/bench_coverage.py on two small zoo models: the numbers it reports are the ones the stack produces."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_coverage.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_coverage", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_coverage_on_squeezenet_and_shufflenet(tmp_path, capsys):
    bench = _bench()
    out = tmp_path / "coverage.json"
    assert bench.main(["--models", "squeezenet1_1,shufflenetv2", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["reduced"] and [r["model"] for r in doc["models"]] == ["squeezenet1_1", "shufflenetv2"]
    for row in doc["models"]:
        assert row["golden_vs_emulator_mismatches"] == 0
        assert row["cosine_vs_onnxruntime"] > 0.99
        assert all(c["reason"] for c in row["cpu_nodes"]), "every CPU node has a reason"
        assert row["dpu_macs"] <= row["macs"] and row["dpu_nodes"] <= row["nodes"]
    squeeze, shuffle = doc["models"]
    assert squeeze["mac_share"] == 1.0 and squeeze["subgraphs"] == 1 and not squeeze["cpu_nodes"]
    # ShuffleNetV2: the convs run on the DPU; the channel split and shuffle (Split, 5-D Reshape, Transpose) do not
    assert shuffle["mac_share"] == 1.0 and shuffle["subgraphs"] > 1
    assert {c["op"] for c in shuffle["cpu_nodes"]} == {"Split", "Reshape", "Transpose"}
    table = capsys.readouterr().out
    assert "squeezenet1_1" in table and "Transpose has no DPU implementation" in table


def test_bench_coverage_rejects_unknown_model():
    with pytest.raises(SystemExit):
        _bench().main(["--models", "alexnet"])
