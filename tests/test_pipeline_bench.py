"""benchmarks/bench_pipeline.py runs end to end on the reduced model and its docs section renders from its JSON."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_pipeline_quick(tmp_path):
    out = tmp_path / "pipeline.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_pipeline.py"), "--quick", "--archs",
                        "zcu102", "--links", "serial-8.5g,gbe", "--max-boards", "4", "--runs", "3", "--json",
                        str(out)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(out.read_text())
    rows = data["rows"]
    assert [(r["link"], r["boards"]) for r in rows] == [(l, n) for l in ("serial-8.5g", "gbe") for n in (1, 2, 3, 4)]
    for r in rows:
        assert 0 < r["efficiency"] <= 1.0 + 1e-9 and r["speedup"] >= 1.0 - 1e-9
    serial = [r["fps"] for r in rows if r["link"] == "serial-8.5g"]
    assert serial == sorted(serial)  # more boards never predict fewer frames/s (the plan may leave one idle-ish)
    assert all(o["bit_identical"] for o in data["executor_overhead"])
    # planner (per-op cycles attributed inside the whole program) vs each stage compiled and simulated alone: a
    # stage alone starts on idle engines and may fuse differently at its ends, so its program differs; with the
    # double-buffered tokens and cross-op fusion the reduced ResNet-50 stages landed within -14%..+1% (was 5% before
    # ops overlapped across their boundaries); with vai_c's token discipline (own-engine tokens: each LOAD/SAVE waits
    # for its predecessor's completion, docs/dependency-protocol.md) the last of 4 stages reads -15.6%, the others
    # within +-1.3% (docs/pipeline.md prints each stage's error)
    assert all(abs(s["error_pct"]) < 18 for s in data["stage_check"]["stages"])

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_pipeline
    finally:
        sys.path.pop(0)
    text = bench_pipeline.docs_section(data)
    assert "| zcu102 | gbe | 4 |" in text and "stage 0" in text
