"""ONNX input and output names kept end to end: CompiledModel, report, artifact header / meta.json, `run -o`,
`inspect`, the HTML report; `run --verify` counts subgraphs, not calls."""
from __future__ import annotations

import json
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvm_dpu
from tvm_dpu.cli import main


def two_output_model() -> onnx.ModelProto:
    """x -> conv -> relu -> "features" (DPU output) and -> GlobalAveragePool -> Flatten -> Softmax -> "probs";
    the outputs are declared probs first."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")]
    nodes = [helper.make_node("Conv", ["image", "w"], ["c"], name="conv", pads=[1] * 4),
             helper.make_node("Relu", ["c"], ["features"], name="relu"),
             helper.make_node("GlobalAveragePool", ["features"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flat"),
             helper.make_node("Softmax", ["f"], ["probs"], name="softmax", axis=1)]
    graph = helper.make_graph(nodes, "two", [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, 8]),
                               helper.make_tensor_value_info("features", TensorProto.FLOAT, [1, 8, 8, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.fixture(scope="module")
def compiled_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("names")
    onnx.save(two_output_model(), d / "two.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["compile", str(d / "two.onnx"), "--arch", "B4096", "-o", str(d / "out"), "-q"]) == 0
    return d


def test_python_api_keeps_names():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = tvm_dpu.build(two_output_model(), arch="B4096", progress=False)
    assert [s.name for s in m.inputs] == ["image"]
    assert [s.name for s in m.outputs] == ["probs", "features"] == [s.name for s in m.output_specs()]
    report = m.report(timing=False)
    assert [t["name"] for t in report["outputs"]] == ["probs", "features"]
    # "features" leaves a DPU subgraph as is: it has an int8 view; "probs" comes from the CPU's Softmax
    assert "fix_point" in report["outputs"][1] and "fix_point" not in report["outputs"][0]


def test_meta_report_run_and_inspect_use_the_onnx_names(compiled_dir, capsys):
    out = compiled_dir / "out"
    meta = json.loads((out / "meta.json").read_text())
    report = json.loads((out / "report.json").read_text())
    for doc in (meta, report):
        assert [t["name"] for t in doc["inputs"]] == ["image"]
        assert [t["name"] for t in doc["outputs"]] == ["probs", "features"]
    capsys.readouterr()
    assert main(["run", str(out / "two.tvmdpu"), "-o", str(compiled_dir / "y.npz")]) == 0
    text = capsys.readouterr().out
    assert "output 0 (probs)" in text and "output 1 (features)" in text
    saved = np.load(compiled_dir / "y.npz")
    assert saved.files == ["probs", "features"]
    m = tvm_dpu.load(out / "two.tvmdpu")
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    np.testing.assert_array_equal(saved["probs"], m.run(x)[0])
    assert main(["inspect", str(out / "two.tvmdpu")]) == 0
    text = capsys.readouterr().out
    assert "model input: image (1, 3, 8, 8) float32, fix_point" in text
    assert "model output: probs (1, 8) float32\n" in text and "model output: features (1, 8, 8, 8) float32, fix_point" in text


def test_html_report_names_reasons_and_whole_graph(compiled_dir, capsys):
    page = compiled_dir / "r.html"
    assert main(["report", str(compiled_dir / "out" / "two.tvmdpu"), "-o", str(page)]) == 0
    html = page.read_text()
    assert "probs" in html and "features" in html
    assert "<table class='placement'>" in html and "Softmax has no DPU implementation" in html
    assert "max-height" not in html  # the graph is not cut off in a fixed-height box


def test_verify_counts_subgraphs_not_calls(small_artifact, capsys):
    m = tvm_dpu.load(small_artifact)
    n = len(m.runners)
    assert n >= 2
    assert main(["run", str(small_artifact), "--verify", "--runs", "3"]) == 0
    assert f"verify: {n} subgraphs, 3 run(s), {3 * n} subgraph calls, 0 mismatching elements" in capsys.readouterr().out
