"""The README's measured figures are the ones benchmarks/readme_figures.py renders from the committed JSON."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _mod():
    spec = importlib.util.spec_from_file_location("readme_figures", ROOT / "benchmarks" / "readme_figures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_block_is_generated_from_the_results():
    rf = _mod()
    block = rf.current_block((ROOT / "README.md").read_text())
    assert block == rf.render(), "README figures are stale: run python benchmarks/readme_figures.py --write"
    assert block.count("\n- ") >= 2


def test_goal_misses_are_stated(tmp_path):
    """A figure over its goal is rendered as a miss with the amount, never as met."""
    rf = _mod()
    e2e = {"models": [{"model": "m", "arch": "a", "run_s": {"median": 0.9, "all": [0.9]}, "run_over_onnxruntime": 10.0,
                       "onnxruntime_s": {"median": 0.09}, "goals": {"run_s_median_max": 0.6,
                                                                    "run_over_onnxruntime_max": 5.0}}]}
    (tmp_path / "e2e.json").write_text(json.dumps(e2e))
    text = rf.render(tmp_path)
    assert "goal missed: 0.30 s over" in text and "goal missed: 2.0 times the goal" in text
    e2e["models"][0].update(run_s={"median": 0.5, "all": [0.5]}, run_over_onnxruntime=4.0)
    (tmp_path / "e2e.json").write_text(json.dumps(e2e))
    assert rf.render(tmp_path).count("goal met") == 2
