"""Bad input gets one clear error (the project's type, CLI exit 2, no traceback); quantizers' ONNX is accepted."""
from __future__ import annotations

import pickle
import random
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvm_dpu
from tvm_dpu import zoo
from tvm_dpu.cli import main
from tvm_dpu.errors import ArchError, DPUError, FrontendError, InputError
from tvm_dpu.serving.feeds import check_array, load_npz
from tvm_dpu.quant.fixpoint import avgpool_factor

ARCH = "zcu102"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    d = tmp_path_factory.mktemp("h")
    assert main(["compile", "examples/mixed_cnn.onnx", "--arch", ARCH, "--calib", "examples/mixed_cnn_calib.npz",
                 "-o", str(d), "-q"]) == 0
    return d / "mixed_cnn.tvmdpu"


def _bad_npz_files(d):
    x = np.zeros((1, 3, 64, 64), np.float32)
    files = {}
    (d / "empty.npz").write_bytes(b"")
    files["empty"] = (d / "empty.npz", "the file is empty")
    (d / "text.npz").write_text("input = [1, 2, 3]\n")
    files["text"] = (d / "text.npz", "not an .npz archive")
    np.save(d / "single.npy", x)
    (d / "single.npy").rename(d / "renamed.npz")
    files["npy renamed"] = (d / "renamed.npz", "single-array .npy file, not an .npz archive")
    np.savez(d / "objects.npz", input=np.array([x, None], dtype=object))
    files["object array"] = (d / "objects.npz", "holds Python objects")
    (d / "pickled.npz").write_bytes(pickle.dumps({"input": x}))
    files["pickled payload"] = (d / "pickled.npz", "not an .npz archive")
    files["missing"] = (d / "nope.npz", "cannot read")
    return files


def test_bad_npz_files_one_clear_error_each(tmp_path, compiled, capsys):
    for label, (path, message) in _bad_npz_files(tmp_path).items():
        with pytest.raises(InputError, match=message):
            load_npz(path, "--input")
        assert main(["run", str(compiled), "--input", str(path)]) == 2, label
        err = capsys.readouterr().err
        assert err.startswith("tvm-dpu: error: --input") and "Traceback" not in err and message in err, label
        assert main(["compile", "examples/mixed_cnn.onnx", "--arch", ARCH, "--calib", str(path), "-o",
                     str(tmp_path / "o"), "-q"]) == 2, label
        err = capsys.readouterr().err
        assert ("calibration file" in err or "--calib" in err) and "Traceback" not in err, label


def test_cli_error_is_one_line_without_traceback(tmp_path, compiled):
    (tmp_path / "t.npz").write_text("hello")
    out = subprocess.run([sys.executable, "-m", "tvm_dpu.cli", "run", str(compiled), "--input",
                          str(tmp_path / "t.npz")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("dtype,ok", [(np.float32, True), (np.float64, True), (np.float16, True), (np.uint8, True),
                                      (np.bool_, False), (np.complex64, False), (object, False), ("U3", False)])
def test_input_dtypes(dtype, ok):
    a = np.zeros((2, 2), dtype=dtype)
    if ok:
        assert check_array("x", a, (2, 2)).dtype == np.float32
    else:
        with pytest.raises(InputError, match="dtype"):
            check_array("x", a, (2, 2))


def test_nan_inf_extra_and_missing_inputs(compiled):
    m = tvm_dpu.load(compiled)
    x = zoo.random_input(zoo.build_model("mixed_cnn"), seed=0)
    bad = x.copy()
    bad[0, 0, 0, :3] = [np.nan, np.inf, -np.inf]
    with pytest.raises(InputError, match="3 NaN/Inf"):
        m.run(bad)
    with pytest.raises(InputError, match=r"unexpected \['extra'\]"):
        m.run({"input": x, "extra": x})
    with pytest.raises(InputError, match=r"missing \['input'\]"):
        m.run({"other": x})
    with pytest.raises(InputError, match="shape"):
        m.run(x[:, :, :32])


def test_bad_calibration_data():
    model = zoo.build_model("mixed_cnn")
    x = zoo.random_input(model, seed=0)
    with pytest.raises(InputError, match="NaN/Inf"):
        tvm_dpu.build(model, arch=ARCH, calibration=[x * np.nan], progress=False)
    with pytest.warns(UserWarning, match="is all zero"):
        tvm_dpu.build(model, arch=ARCH, calibration=[np.zeros_like(x)] * 2, progress=False)
    with pytest.raises(InputError, match="unexpected"):
        tvm_dpu.build(model, arch=ARCH, calibration={"input": x, "junk": x}, progress=False)


def test_isa0_and_huge_shapes_refused(tmp_path):
    model = zoo.build_model("mixed_cnn")
    with pytest.raises(ArchError, match="ISA0 DPU: tvm-dpu generates DPUV2 and DPUV3E code only"):
        tvm_dpu.build(model, arch=0x100000056010407, calibration=[zoo.random_input(model, seed=0)], progress=False)
    dyn = onnx.load("examples/mixed_cnn.onnx")
    dims = dyn.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_param, dims[3].dim_param = "H", "W"
    del dyn.graph.value_info[:]
    onnx.save(dyn, tmp_path / "dyn.onnx")
    with pytest.raises(InputError, match=r"as float32, and compiling it needs about 8x that"):
        tvm_dpu.build(str(tmp_path / "dyn.onnx"), arch=ARCH, shapes={"input": [1, 3, 100000, 100000]},
                      progress=False)


def test_verify_with_no_dpu_subgraph_fails(tmp_path, capsys):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    g = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], name="sm", axis=1)], "g", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, tmp_path / "cpu_only.onnx")
    assert main(["compile", str(tmp_path / "cpu_only.onnx"), "--arch", ARCH, "-o", str(tmp_path / "o"), "-q"]) == 0
    capsys.readouterr()
    assert main(["run", str(tmp_path / "o" / "cpu_only.tvmdpu"), "--verify"]) == 2
    assert "no DPU subgraph, so there is nothing to verify" in capsys.readouterr().err


def test_unsorted_graph_and_outputs_without_shapes_compile(tmp_path):
    """AMD Quark writes XINT8 models whose nodes are not topologically sorted, and outputs without shapes."""
    model = zoo.build_model("resnet18", reduced=True)
    shuffled = onnx.ModelProto()
    shuffled.CopyFrom(model)
    nodes = list(model.graph.node)
    random.Random(1).shuffle(nodes)
    del shuffled.graph.node[:]
    shuffled.graph.node.extend(nodes)
    for o in shuffled.graph.output:
        o.type.tensor_type.ClearField("shape")
    del shuffled.graph.value_info[:]
    calib = [zoo.random_input(model, seed=s) for s in range(2)]
    x = zoo.random_input(model, seed=5)
    a = tvm_dpu.build(model, arch=ARCH, calibration=calib, progress=False).run(x)[0]
    b = tvm_dpu.build(shuffled, arch=ARCH, calibration=calib, progress=False).run(x)[0]
    np.testing.assert_array_equal(a, b)


def test_cycle_and_checker_messages_are_whole():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    nodes = [helper.make_node("Add", ["x", "b"], ["a"], name="n1"), helper.make_node("Relu", ["a"], ["b"], name="n2"),
             helper.make_node("Relu", ["a"], ["y"], name="n3")]
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(FrontendError, match=r"has a cycle: node\(s\) \['n1', 'n2', 'n3'\] wait on each other"):
        tvm_dpu.from_onnx(m)
    bad = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="r", bogus=1)], "g", [x],
                                              [y]), opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(FrontendError) as e:
        tvm_dpu.from_onnx(bad)
    # The whole checker message, its context lines included (it used to stop after the first line).
    assert "onnx.checker rejected the model: Unrecognized attribute: bogus" in str(e.value)
    assert "Name: r OpType: Relu" in str(e.value)


def _quark_style_model(c):
    """conv -> GlobalAveragePool -> Mul(c) -> flatten -> Gemm, 7x7 spatial (Quark's model of the DPU avg pool)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array(c, np.float32), "c"),
             numpy_helper.from_array(rng.standard_normal((10, 8)).astype(np.float32), "fw")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["t0"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["t0"], ["t1"], name="relu"),
             helper.make_node("GlobalAveragePool", ["t1"], ["t2"], name="gap"),
             helper.make_node("Mul", ["t2", "c"], ["t3"], name="gap_scale"),
             helper.make_node("Flatten", ["t3"], ["t4"], name="flat"),
             helper.make_node("Gemm", ["t4", "fw"], ["y"], name="fc", transB=1)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 7, 7])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_quark_avgpool_scale_runs_on_the_dpu():
    m, s = avgpool_factor(7, 7)
    dpu_scale = 49 * m / 2 ** s
    _, report = tvm_dpu.partition(tvm_dpu.from_onnx(_quark_style_model(dpu_scale)), ARCH)
    assert report.node("gap_scale").device == "dpu" and report.subgraphs == 1
    _, other = tvm_dpu.partition(tvm_dpu.from_onnx(_quark_style_model(1.5)), ARCH)
    assert other.node("gap_scale").device == "cpu"  # a real Mul is not absorbed


def test_partition_reports_what_compile_does_for_qdq(tmp_path, capsys):
    from test_qdq import _model as qdq_model  # the QDQ test model of tests/test_qdq.py

    path = tmp_path / "q.onnx"
    onnx.save(qdq_model(), path)
    assert main(["partition", str(path), "--arch", ARCH]) == 0
    text = capsys.readouterr().out
    assert "DequantizeLinear has no DPU implementation" not in text and " dpu " in text


def test_unsorted_qdq_model_compiles_like_the_sorted_one():
    """Quark's XINT8 models are QDQ *and* not topologically sorted. QDQ stripping prunes in reverse topological
    order, so a Constant listed after the node that reads it must not be dropped as unused."""
    from test_qdq import _grid_inputs
    from test_qdq import _model as qdq_model

    def with_offset(model, constant_last):
        m = onnx.ModelProto()
        m.CopyFrom(model)
        const = helper.make_node("Constant", [], ["off"], name="off_const",
                                 value=numpy_helper.from_array(np.full((1, 2, 1, 1), 0.25, np.float32), "off"))
        add = helper.make_node("Add", ["Zd", "off"], ["Out"], name="add_off")
        m.graph.node.extend([add, const] if constant_last else [const, add])
        del m.graph.output[:]
        m.graph.output.extend([helper.make_tensor_value_info("Out", TensorProto.FLOAT, [1, 2, 5, 5])])
        return m

    x = _grid_inputs(1)[0].astype(np.float32)
    a = tvm_dpu.build(with_offset(qdq_model(), False), arch=ARCH, progress=False).run(x)[0]
    b = tvm_dpu.build(with_offset(qdq_model(), True), arch=ARCH, progress=False).run(x)[0]
    np.testing.assert_array_equal(a, b)


def test_memory_guard_counts_maps_inside_partitions_and_the_real_peak(monkeypatch):
    """The guard sees the feature maps inside DPU partitions (not only main's) and charges the measured peak per
    map byte: a shape whose largest map fits a quarter of memory but whose compile would not is refused before
    anything is allocated."""
    from tvm_dpu.backend import dpu_compile

    model = zoo.build_model("vgg16", reduced=True)
    # reduced VGG-16 at 64 px: the largest map is a first-block conv's 8 x 64 x 64 floats inside the partition
    # (the input is 3 x 64 x 64).
    largest = 8 * 64 * 64 * 4
    monkeypatch.setattr(dpu_compile, "available_memory_bytes", lambda: 6 * largest)
    with pytest.raises(InputError, match=r"largest feature map \(.* in fused_.*\).*needs about 8x"):
        tvm_dpu.build(model, arch=ARCH, calibration=[zoo.random_input(model, seed=0)], progress=False)


def test_reservoir_in_pieces_draws_what_one_pass_draws(monkeypatch):
    from tvm_dpu.quant import calibration

    values = np.random.default_rng(1).standard_normal(50_000).astype(np.float32)
    whole = calibration.TensorStats("t", capacity=1000, seed=3)
    whole.add(values)
    monkeypatch.setattr(calibration, "CHUNK", 777)
    pieces = calibration.TensorStats("t", capacity=1000, seed=3)
    pieces.add(values[:20_000])
    pieces.add(values[20_000:])
    assert np.array_equal(whole.samples, pieces.samples) and whole.count == pieces.count
