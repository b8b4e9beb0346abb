"""vai_c-style CLI for deployment: compile -n/--options/meta.json, inspect, report (HTML, headless Chromium)."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tvm_dpu.cli import main, parse_vai_options
from tvm_dpu.errors import FrontendError

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "examples" / "mixed_cnn.onnx"
CALIB = ROOT / "examples" / "mixed_cnn_calib.npz"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("c")
    rc = main(["compile", str(MODEL), "--arch", "zcu102", "-o", str(out), "-n", "net", "--calib", str(CALIB),
               "-q", "--png", "--options", '{"input_shape": "1,3,64,64"}'])
    assert rc == 0
    return out


def test_compile_writes_artifact_meta_and_report(compiled):
    meta = json.loads((compiled / "meta.json").read_text())
    report = json.loads((compiled / "report.json").read_text())
    # artifact, meta, report and one engine timeline per DPU subgraph (Chrome trace, and with --png a PNG)
    ids = [s["id"] for s in report["subgraphs"]]
    expected = {"meta.json", "net.tvmdpu", "report.json"} | {f"net.sg{i}.trace.json" for i in ids}
    expected |= {f"net.sg{i}.png" for i in ids}  # matplotlib is a base dependency
    assert {p.name for p in compiled.iterdir()} == expected
    times = report["build"]["times_s"]  # where the compile's time went, phase by phase
    assert {"import_normalize", "calibration", "quantize_codegen", "export", "timelines"} <= set(times)
    assert 0 < sum(v for k, v in times.items() if k != "total_after_imports") <= times["total_after_imports"] + 1e-6
    cpu = report["build"]["cpu_times_s"]  # the same phases in process seconds (the machine may be shared)
    assert set(cpu) == set(times) and cpu["quantize_codegen"] > 0
    assert sum(v for k, v in cpu.items() if k != "total_after_imports") <= cpu["total_after_imports"] + 1e-6
    trace = json.loads((compiled / f"net.sg{ids[0]}.trace.json").read_text())
    assert trace["traceEvents"]
    for s in report["subgraphs"]:  # timing model figures per subgraph
        t = s["timing"]
        assert t["cycles"] > 0 and 0 < t["peak_utilisation"] <= 1 and t["ddr_read_bytes"] > 0
    assert report["timing"]["latency_ms"] > 0 and report["timing"]["cpu_time_included"] is False
    assert meta["artifact"] == "net.tvmdpu" and meta["arch"]["name"] == "zcu102"
    assert meta["arch"]["fingerprint"] == report["fingerprint"]
    # The model's own names; an input the first DPU subgraph reads directly carries its fix_point (int8 I/O).
    read = {b["name"]: b["fix_point"] for s in meta["subgraphs"] for b in s["inputs"]}
    assert meta["inputs"] == [{"name": "input", "shape": [1, 3, 64, 64], "dtype": "float32",
                               "fix_point": read["input"]}]
    assert meta["outputs"] == [{"name": "output", "shape": [1, 10], "dtype": "float32"}]  # Softmax on the CPU
    assert [s["id"] for s in meta["subgraphs"]] == [s["id"] for s in report["subgraphs"]]
    for m, r in zip(meta["subgraphs"], report["subgraphs"]):
        assert m["inputs"] == r["inputs"] and m["outputs"] == r["outputs"]  # names, shapes, fix_points
        assert m["instructions"] == r["instructions"] and m["code_bytes"] == r["code_bytes"]
    assert meta["artifact_bytes"] == (compiled / "net.tvmdpu").stat().st_size


def test_parse_vai_options():
    assert parse_vai_options('{"input_shape": "1,3,8,8;1,4"}', ["a", "b"]) == ({"a": [1, 3, 8, 8], "b": [1, 4]}, [])
    assert parse_vai_options('{"output_ops": "x, y"}', ["a"]) == ({}, ["x", "y"])
    for text, pattern in [("{", "not valid JSON"), ("[1]", "JSON object"), ('{"foo": 1}', "unknown key"),
                          ('{"input_shape": "1,3;1,2"}', "2 shapes but the model has 1"),
                          ('{"input_shape": "1,x"}', "comma-separated integers")]:
        with pytest.raises(FrontendError, match=pattern):
            parse_vai_options(text, ["a"])


def test_output_ops_cut_the_model(tmp_path, capsys):
    rc = main(["compile", str(MODEL), "--arch", "zcu102", "-o", str(tmp_path), "-q",
               "--options", '{"output_ops": "layer1.0.relu"}'])
    assert rc == 0, capsys.readouterr().err
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["outputs"][0]["shape"] == [1, 16, 16, 16]
    assert not list(tmp_path.glob("*.png"))  # PNG timelines only with --png
    assert len(meta["subgraphs"]) == 1
    assert main(["run", str(tmp_path / "mixed_cnn.tvmdpu"), "--verify"]) == 0


@pytest.mark.parametrize("options, message", [
    ('{"output_ops": "nope"}', "neither a node nor a tensor"),
    ('{"bogus": 1}', "unknown key"),
    ("not json", "not valid JSON"),
])
def test_bad_options_are_exit_2_without_traceback(tmp_path, capsys, options, message):
    assert main(["compile", str(MODEL), "--arch", "zcu102", "-o", str(tmp_path), "-q", "--options", options]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tvm-dpu: error: ") and message in err and "Traceback" not in err


def test_inspect_text_json_and_disasm(compiled, capsys):
    art = str(compiled / "net.tvmdpu")
    assert main(["inspect", art]) == 0
    text = capsys.readouterr().out
    assert "arch: zcu102" in text and "fix_point" in text and "model output: output (1, 10)" in text
    assert main(["inspect", art, "--json", "--disasm"]) == 0
    data = json.loads(capsys.readouterr().out)
    meta = json.loads((compiled / "meta.json").read_text())
    assert data["subgraphs"][0]["inputs"] == meta["subgraphs"][0]["inputs"]
    # Subgraph inputs carry the names a user knows (model input, producing ONNX node or DPU output), not the
    # partition parameters' Relax names (lv2): the head reads branch_a's DPU output and branch_b's CPU sigmoid.
    inputs = [i["name"] for sg in data["subgraphs"] for i in sg["inputs"]]
    assert inputs == ["input", "branch_a.conv", "branch_b.sigmoid"]
    assert data["subgraphs"][1]["inputs"][0]["name"] in [o["name"] for o in data["subgraphs"][0]["outputs"]]
    for sg in data["subgraphs"]:
        assert len(sg["listing"]) == sg["instructions"]
        assert sg["listing"][-1].split()[2] == "END"
    from tvm_dpu.util.toolchains import host_machine

    assert data["format_sections"][f"lib.{host_machine()}"] > 0
    assert main(["inspect", art, "--disasm"]) == 0
    assert " LOAD dpdon=" in capsys.readouterr().out


def test_inspect_and_report_of_a_damaged_file_are_exit_2(compiled, tmp_path, capsys):
    data = bytearray((compiled / "net.tvmdpu").read_bytes())
    data[-5] ^= 1
    bad = tmp_path / "bad.tvmdpu"
    bad.write_bytes(bytes(data))
    for argv in (["inspect", str(bad)], ["report", str(bad), "-o", str(tmp_path / "r.html")],
                 ["run", str(bad)], ["inspect", str(tmp_path / "none.tvmdpu")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("tvm-dpu: error: ") and "Traceback" not in err
    assert not (tmp_path / "r.html").exists()


def test_help_documents_the_new_options(capsys):
    for cmd, options in [("compile", ["-n", "--options", "--cross", "--no-verify-data", "meta.json", "input_shape", "output_ops"]),
                         ("run", ["--device", "--bitfile", "--timeout", "--verify"]),
                         ("inspect", ["--disasm", "--json", "ARTIFACT"]), ("report", ["-o", "ARTIFACT"])]:
        with pytest.raises(SystemExit) as exc:
            main([cmd, "--help"])
        assert exc.value.code == 0
        text = capsys.readouterr().out
        for o in options:
            assert o in text, (cmd, o)


def test_report_html_is_self_contained(compiled, tmp_path, capsys):
    out = tmp_path / "report.html"
    assert main(["report", str(compiled / "net.tvmdpu"), "-o", str(out)]) == 0
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    for external in ("<script", "http://", "https://", "<link", "src="):
        assert external not in page.replace("http://www.w3.org/2000/svg", "")
    meta = json.loads((compiled / "meta.json").read_text())
    report = json.loads((compiled / "report.json").read_text())
    nodes = report["partition"]["nodes"]
    assert page.count("<rect") >= len(nodes)  # one box per node
    for n in nodes:
        if n["device"] == "cpu" and n["reason"]:
            assert n["reason"][:30].replace("&", "&amp;").replace("'", "&#x27;").replace('"', "&quot;")[:20] \
                in page
    for sg in meta["subgraphs"]:
        assert f"DPU subgraph {sg['id']}" in page
    assert ("Engine timeline" in page) and ("timing model" in page or "cycles" in page)


def test_report_renders_in_headless_chromium(compiled, tmp_path):
    if not any(shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome")):
        pytest.skip("no chromium installed (Debian: apt-get install chromium)")
    html = tmp_path / "report.html"
    assert main(["report", str(compiled / "net.tvmdpu"), "-o", str(html)]) == 0
    png = tmp_path / "report.png"
    r = subprocess.run([str(ROOT / "scripts" / "screenshot_report.sh"), str(html), str(png), "1000x900"],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (w, h) == (1000, 900)
    assert len(data) > 20_000  # a rendered page, not a blank canvas


def test_run_output_matches_python_api(compiled, tmp_path, capsys):
    out = tmp_path / "y.npz"
    inp = ROOT / "examples" / "mixed_cnn_input.npz"
    assert main(["run", str(compiled / "net.tvmdpu"), "--input", str(inp), "-o", str(out), "--verify"]) == 0
    assert "verify: 2 subgraphs, 1 run(s), 2 subgraph calls, 0 mismatching elements" in capsys.readouterr().out
    from tvm_dpu.runtime.artifact import load

    x = np.load(inp)["input"]
    np.testing.assert_array_equal(np.load(out)["output"], load(compiled / "net.tvmdpu").run(x)[0])


def test_no_verify_data_artifact_is_smaller_and_refuses_verify(compiled, tmp_path, capsys):
    assert main(["compile", str(MODEL), "--arch", "zcu102", "-o", str(tmp_path), "-n", "lean", "--calib",
                 str(CALIB), "-q", "--no-verify-data"]) == 0
    lean = tmp_path / "lean.tvmdpu"
    assert lean.stat().st_size < (compiled / "net.tvmdpu").stat().st_size
    capsys.readouterr()
    assert main(["run", str(lean), "--verify"]) == 2
    captured = capsys.readouterr()
    assert "no verification data" in captured.err and captured.out == ""
    assert main(["run", str(lean)]) == 0
