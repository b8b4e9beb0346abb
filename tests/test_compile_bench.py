"""benchmarks/bench_compile.py compiles a model in a fresh process and reports wall time, peak RSS and phases."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_compile_quick(tmp_path):
    out = tmp_path / "compile.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_compile.py"), "--quick", "--json", str(out)],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["model"] == "resnet18" and row["reduced"] and len(row["runs"]) == 1
    run = row["runs"][0]
    assert run["wall_s"] > sum(v for k, v in run["phases_s"].items() if k != "total_after_imports") > 0
    assert run["peak_rss_mib"] > 50 and run["artifact_bytes"] > 0 and run["dpu_subgraphs"] >= 1
    assert "resnet18" in r.stdout and "wall s" in r.stdout
    # tvm_dpu was byte-compiled before the timed process (as an installed package is): its modules have bytecode
    bytecode = json.loads(out.read_text())["machine"]["bytecode"]
    assert bytecode["precompiled"] and bytecode["modules_written"] >= 0
    # where the bench's interpreter finds tvm_dpu (from tmp_path: an installed package in CI, the checkout when
    # installed editable), not necessarily this checkout
    where = subprocess.run([sys.executable, "-c", "import tvm_dpu, os; print(os.path.dirname(tvm_dpu.__file__))"],
                           capture_output=True, text=True, cwd=tmp_path, check=True).stdout.strip()
    assert (Path(where) / "__pycache__" / f"cli.{sys.implementation.cache_tag}.pyc").is_file()
