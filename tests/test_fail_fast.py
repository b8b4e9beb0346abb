"""Argument, file, arch and input-shape mistakes are reported before any heavy import (TVM, onnx): the test
checks which modules the failing command imported, not how long it took."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODEL = str(ROOT / "examples" / "mixed_cnn.onnx")
HEAVY = ("tvm", "tvm_ffi", "onnx", "onnxruntime", "torch")

_PROBE = """
import sys
from tvm_dpu.cli import main
try:
    rc = main(sys.argv[1:])
except SystemExit as e:
    rc = e.code
print("RC", rc, sorted({m.split(".")[0] for m in sys.modules if m.split(".")[0] in %r}), file=sys.stderr)
""" % (HEAVY,)


def _cli(*argv: str, cwd: Path) -> tuple[int, list[str], str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, env=env, cwd=cwd,
                       timeout=120)
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("RC "), r.stderr
    rc, mods = last[3:].split(" ", 1)
    return int(rc), eval(mods), r.stderr  # noqa: S307 - our own repr of a list of str


CASES = [
    (["compile", "missing.onnx", "--arch", "zcu102", "-o", "out"], "missing.onnx: no such file"),
    (["compile", "notonnx.onnx", "--arch", "zcu102", "-o", "out"], "notonnx.onnx: not a readable ONNX model"),
    (["compile", MODEL, "--arch", "zcu10", "-o", "out"], "did you mean 'zcu104' or 'zcu102'?"),
    (["compile", MODEL, "--arch", "zcu102", "--calib", "calibdir", "-o", "out"],
     "--calib calibdir: is a directory; --calib takes one .npz file"),
    (["compile", MODEL, "--arch", "zcu102", "--calib", "missing.npz", "-o", "out"], "--calib takes one .npz file"),
    (["compile", MODEL, "--arch", "zcu102", "--input-shape", "input=1,3,32,32", "-o", "out"],
     "input 'input' is declared [1, 3, 64, 64]; the given shape [1, 3, 32, 32] differs at dim(s) [2, 3]"),
    (["compile", MODEL, "--arch", "zcu102", "--input-shape", "image=1,3,64,64", "-o", "out"],
     "shapes given for ['image'], which are not model inputs (the inputs are ['input'])"),
    (["partition", MODEL, "--arch", "B4069"], "did you mean 'B4096'?"),
    (["run", "missing.tvmdpu"], "missing.tvmdpu: no such file"),
    (["run", "missing.tvmdpu", "--input", "missing.npz"], "missing.tvmdpu: no such file"),
    (["benchmark", "missing.xmodel"], "missing.xmodel: no such file"),
    (["inspect", "missing.tvmdpu"], "missing.tvmdpu: no such file"),
    (["report", "missing.tvmdpu", "-o", "r.html"], "missing.tvmdpu: no such file"),
    (["pipeline", "missing.onnx", "--arch", "zcu102", "--boards", "2", "-o", "out"], "missing.onnx: no such file"),
    (["compile", MODEL, "--arch", "zcu102", "--calb", "c.npz", "-o", "out"], "(did you mean '--calib'?)"),
    (["compil", MODEL], "invalid choice: 'compil' (did you mean 'compile'"),
]


@pytest.mark.parametrize("argv, message", CASES, ids=[" ".join(Path(a).name for a in c[0][:3]) for c in CASES])
def test_mistakes_are_reported_before_any_heavy_import(tmp_path, argv, message):
    (tmp_path / "calibdir").mkdir()
    (tmp_path / "notonnx.onnx").write_text("not a protobuf: tag byte '#' is wire type 3\n")
    rc, heavy, stderr = _cli(*argv, cwd=tmp_path)
    assert rc == 2, stderr
    assert message in " ".join(stderr.split()), stderr
    assert heavy == [], f"imported {heavy} before reporting: {stderr}"
    assert "Traceback" not in stderr


def test_a_good_command_line_gets_past_the_preflight(tmp_path):
    """The same checks pass on correct arguments: the command goes on to its heavy part (here the compile reads
    the model with onnx), so the preflight is not refusing everything."""
    from tvm_dpu.cli import build_parser, preflight

    args = build_parser().parse_args(["compile", MODEL, "--arch", "zcu102", "--input-shape", "input=1,3,64,64",
                                      "--calib", str(ROOT / "examples" / "mixed_cnn_calib.npz"), "-o", "out"])
    preflight(args)  # raises on any problem


def test_onnx_inputs_read_without_onnx_agree_with_onnx(tmp_path):
    """The protobuf walk finds the inputs (not the initializers) and their dims exactly as onnx does."""
    import onnx
    from onnx import TensorProto, helper

    from tvm_dpu.onnx_inputs import read_inputs

    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 3, 3], [0.0] * 108)
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="conv")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 32, 32]),
                           helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 3, 3, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g), path)
    (x,) = read_inputs(path)
    assert (x.name, x.dims, x.is_tensor) == ("x", ["batch", 3, 32, 32], True)
    (path.with_suffix(".bad")).write_bytes(path.read_bytes()[:-7])
    with pytest.raises(Exception, match="not a readable ONNX model .* at byte offset"):
        read_inputs(path.with_suffix(".bad"))
