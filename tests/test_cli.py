"""The `tvm-dpu` command line: `partition`, argument parsing and user-error handling."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvm_dpu.cli import EXIT_USER_ERROR, main, parse_input_shape, parse_input_shapes
from tvm_dpu.errors import FrontendError


def _tiny_model(path: Path, batch_dim="1") -> Path:
    """input -> Conv 3x3 (+bias) -> Relu -> Softmax: one DPU subgraph and one CPU node."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "conv.w"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "conv.b"),
    ]
    nodes = [
        helper.make_node("Conv", ["input", "conv.w", "conv.b"], ["c"], name="conv", kernel_shape=[3, 3], pads=[1] * 4),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Softmax", ["r"], ["output"], name="softmax", axis=1),
    ]
    dims = [int(batch_dim) if batch_dim.isdigit() else batch_dim, 3, 8, 8]
    graph = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [dims[0], 8, 8, 8])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return _tiny_model(tmp_path_factory.mktemp("cli") / "tiny.onnx")


def test_partition_prints_table_and_writes_json(tiny, tmp_path, capsys):
    out = tmp_path / "report.json"
    assert main(["partition", str(tiny), "--arch", "B4096", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "conv" in text and "Softmax has no DPU implementation" in text
    assert "3 nodes: 2 on DPU in 1 subgraph, 1 on CPU" in text
    data = json.loads(out.read_text())
    assert set(data) == {"arch", "nodes", "subgraphs"}
    assert data["arch"] == "DPUCZDX8G_ISA1_B4096" and data["subgraphs"] == 1
    assert [n["name"] for n in data["nodes"]] == ["conv", "relu", "softmax"]
    assert all(set(n) == {"name", "op", "device", "subgraph", "reason"} for n in data["nodes"])
    assert [n["device"] for n in data["nodes"]] == ["dpu", "dpu", "cpu"]


def test_partition_with_arch_json_and_board(tiny, tmp_path, capsys):
    arch = tmp_path / "arch.json"
    arch.write_text(json.dumps({"target": "DPUCZDX8G_ISA1_B1152"}))
    assert main(["partition", str(tiny), "--arch", str(arch)]) == 0
    assert "(DPUCZDX8G_ISA1_B1152)" in capsys.readouterr().out
    assert main(["partition", str(tiny), "--arch", "zcu102"]) == 0
    assert "(zcu102)" in capsys.readouterr().out


def test_parse_input_shape():
    assert parse_input_shape("input=1,3,224,224") == ("input", [1, 3, 224, 224])
    assert parse_input_shape("a=b=1,2") == ("a=b", [1, 2])
    assert parse_input_shapes(["x=1,3", "y=2"]) == {"x": [1, 3], "y": [2]}
    assert parse_input_shapes([]) is None
    for bad in ("input", "=1,2", "input=1,x", "input=", "input=1,0"):
        with pytest.raises(FrontendError, match="bad --input-shape"):
            parse_input_shape(bad)
    with pytest.raises(FrontendError, match="twice"):
        parse_input_shapes(["x=1", "x=2"])


def test_input_shape_fixes_a_symbolic_batch(tmp_path, capsys):
    model = _tiny_model(tmp_path / "sym.onnx", batch_dim="N")
    assert main(["partition", str(model), "--arch", "B4096"]) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert err.startswith("tvm-dpu: error: ") and err.count("\n") == 1 and "input" in err
    assert main(["partition", str(model), "--arch", "B4096", "--input-shape", "input=1,3,8,8"]) == 0
    assert "on DPU in 1 subgraph" in capsys.readouterr().out


@pytest.mark.parametrize("shape", ["input=1,3,x,8", "input"])
def test_bad_input_shape_is_exit_2(tiny, capsys, shape):
    assert main(["partition", str(tiny), "--arch", "B4096", "--input-shape", shape]) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert err.startswith("tvm-dpu: error: bad --input-shape") and err.count("\n") == 1


def test_bad_arch_lists_known_names(tiny, capsys):
    assert main(["partition", str(tiny), "--arch", "B9999"]) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert err.startswith("tvm-dpu: error: ") and err.count("\n") == 1
    assert "B9999" in err and "DPUCZDX8G_ISA1_B4096" in err and "zcu102" in err
    assert "Traceback" not in err


def test_missing_and_malformed_model_are_exit_2(tmp_path, capsys):
    assert main(["partition", str(tmp_path / "nope.onnx"), "--arch", "B4096"]) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert err == f"tvm-dpu: error: {tmp_path / 'nope.onnx'}: no such file\n"
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a protobuf at all")
    assert main(["partition", str(junk), "--arch", "B4096"]) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert err.startswith("tvm-dpu: error: ") and "junk.onnx" in err and err.count("\n") == 1


def test_unwritable_json_is_exit_2(tiny, tmp_path, capsys):
    assert main(["partition", str(tiny), "--arch", "B4096", "--json", str(tmp_path / "no" / "dir.json")]) == 2
    assert capsys.readouterr().err.startswith("tvm-dpu: error: ")


def test_help_documents_every_option(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    assert "partition" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main(["partition", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for option in ("MODEL.onnx", "--arch", "--input-shape", "--json"):
        assert option in text


def test_missing_command_or_arch_is_usage_error(tiny, capsys):
    for argv in ([], ["partition", str(tiny)]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
    capsys.readouterr()


def test_console_script(tiny):
    script = Path(sys.executable).parent / "tvm-dpu"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "tvm_dpu.cli"]
    ok = subprocess.run(cmd + ["partition", str(tiny), "--arch", "kv260"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "on DPU in 1 subgraph" in ok.stdout
    bad = subprocess.run(cmd + ["partition", str(tiny), "--arch", "nope"], capture_output=True, text=True)
    assert bad.returncode == 2
    assert bad.stderr.startswith("tvm-dpu: error: ") and "Traceback" not in bad.stderr
