"""QDQ models as quantizers write them: a Quark-style file with unsorted nodes compiled from its path, fix_points
through shape-only ops after the last DequantizeLinear, and onnxruntime's float-scale QDQ (rounded to powers of
two with the added error reported, or stripped and calibrated with --requantize), never silently."""
from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvm_dpu
from tvm_dpu.cli import main
from tvm_dpu.errors import QuantizationError
from tvm_dpu.quant.qdq import strip_qdq

ARCH = "B4096"


def classifier(tail: str = "Reshape", sy: float = 2.0 ** -2, sz: float = 2.0 ** -3, sw: float = 2.0 ** -6,
               sx: float = 2.0 ** -4) -> onnx.ModelProto:
    """A TF2-style QDQ classifier: conv -> relu -> QDQ -> conv to (1, 10, 1, 1) -> QDQ -> `tail` -> out (1, 10)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.float32(sx), "sx"), numpy_helper.from_array(np.int8(0), "z8"),
             numpy_helper.from_array(rng.integers(-100, 100, (8, 3, 3, 3)).astype(np.int8), "Wq"),
             numpy_helper.from_array(rng.integers(-100, 100, (10, 8, 4, 4)).astype(np.int8), "W2q"),
             numpy_helper.from_array(np.float32(sw), "sw"), numpy_helper.from_array(np.float32(sy), "sy"),
             numpy_helper.from_array(np.float32(sz), "sz"), numpy_helper.from_array(np.array([1, 10], np.int64), "shape"),
             numpy_helper.from_array(np.array([2, 3], np.int64), "axes")]
    n = [helper.make_node("QuantizeLinear", ["X", "sx", "z8"], ["Xq"], name="qx"),
         helper.make_node("DequantizeLinear", ["Xq", "sx", "z8"], ["Xd"], name="dqx"),
         helper.make_node("DequantizeLinear", ["Wq", "sw", "z8"], ["W"], name="dqw"),
         helper.make_node("DequantizeLinear", ["W2q", "sw", "z8"], ["W2"], name="dqw2"),
         helper.make_node("Conv", ["Xd", "W"], ["Y"], name="conv", pads=[1, 1, 1, 1], strides=[2, 2]),
         helper.make_node("Relu", ["Y"], ["Yr"], name="relu"),
         helper.make_node("QuantizeLinear", ["Yr", "sy", "z8"], ["Yq"], name="qy"),
         helper.make_node("DequantizeLinear", ["Yq", "sy", "z8"], ["Yd"], name="dqy"),
         helper.make_node("Conv", ["Yd", "W2"], ["Z"], name="fc"),
         helper.make_node("QuantizeLinear", ["Z", "sz", "z8"], ["Zq"], name="qz"),
         helper.make_node("DequantizeLinear", ["Zq", "sz", "z8"], ["Zd"], name="dqz")]
    if tail == "Reshape":
        n.append(helper.make_node("Reshape", ["Zd", "shape"], ["out"], name="reshape"))
    elif tail == "Flatten":
        n.append(helper.make_node("Flatten", ["Zd"], ["out"], name="flatten"))
    else:  # Transpose then Squeeze: a chain of shape-only ops
        n += [helper.make_node("Transpose", ["Zd"], ["T"], name="transpose", perm=[0, 1, 3, 2]),
              helper.make_node("Squeeze", ["T", "axes"], ["out"], name="squeeze")]
    g = helper.make_graph(n, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 10])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _build(model, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = tvm_dpu.build(model, arch=ARCH, progress=False, **kw)
    return m, [str(w.message) for w in caught]


def test_unsorted_quark_style_file_compiles_from_its_path(tmp_path, capsys):
    """The checker runs on what is imported (sorted, stripped), not on the file, whose order it rejects."""
    m = classifier()
    nodes = list(m.graph.node)
    del m.graph.node[:]
    m.graph.node.extend(reversed(nodes))
    path = tmp_path / "xint8.onnx"
    onnx.save(m, path)
    with pytest.raises(onnx.checker.ValidationError, match="topologically sorted"):
        onnx.checker.check_model(str(path))
    model, messages = _build(str(path))
    assert not any("no calibration data" in t for t in messages)  # every DPU tensor has its QDQ fix_point
    sorted_model, _ = _build(classifier())
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    np.testing.assert_array_equal(model.run(x)[0], sorted_model.run(x)[0])
    assert main(["compile", str(path), "--arch", ARCH, "-o", str(tmp_path / "out"), "-q"]) == 0
    assert "rejected" not in capsys.readouterr().err


@pytest.mark.parametrize("tail", ["Reshape", "Flatten", "Transpose+Squeeze"])
def test_fix_point_flows_through_shape_only_ops(tail):
    _, fps = strip_qdq(classifier(tail))
    assert fps["out"] == 3 and fps["Z"] == 3
    model, messages = _build(classifier(tail))
    assert not any("no calibration data" in t for t in messages)
    (runner,) = model.runners.values()
    assert [b.fix_point for b in runner.sg.outputs] == [3]  # the QDQ's 2^-3, not a calibrated guess
    assert model.tensor_fix_points()["out"] == 3


def test_float_scales_are_rounded_up_with_the_error_reported():
    model = classifier(sy=0.3, sz=0.1, sw=0.0117)
    with pytest.raises(QuantizationError, match="not a power of two.*requantize"):
        strip_qdq(model)  # the exact mode still refuses
    rounded: list = []
    _, fps = strip_qdq(model, scales="round", rounded=rounded)
    assert fps["Yr"] == 1 and fps["Z"] == 3 and fps["W"] == 6  # 0.3 -> 2^-1, 0.1 -> 2^-3, 0.0117 -> 2^-6
    by_tensor = {r.tensor: r for r in rounded}
    assert by_tensor["Yr"].step_ratio == pytest.approx(0.5 / 0.3)
    assert all(1 <= r.step_ratio < 2 for r in rounded)
    assert 0 < by_tensor["Wq"].constant_error < 0.5  # weights re-quantized at 2^-6: a measured change
    built, messages = _build(model)
    (text,) = [t for t in messages if "not powers of two" in t]
    assert "rounded up to powers of two" in text and "re-quantized, worst error" in text and "--requantize" in text
    assert [b.fix_point for b in next(iter(built.runners.values())).sg.outputs] == [3]


def _ort_qdq(tmp_path, symmetric: bool) -> str:
    """A real onnxruntime quantize_static QDQ model (float scales; uint8 asymmetric activations by default)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    f = classifier()
    float_model, _ = strip_qdq(f)
    src = tmp_path / "float.onnx"
    onnx.save(float_model, src)
    rng = np.random.default_rng(0)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter([{"X": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.items, None)

    dst = tmp_path / ("ort_sym.onnx" if symmetric else "ort.onnx")
    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QInt8 if symmetric else QuantType.QUInt8, weight_type=QuantType.QInt8,
                    extra_options={"ActivationSymmetric": symmetric, "WeightSymmetric": True})
    return str(dst)


def test_onnxruntime_qdq_rounded_or_requantized(tmp_path, capsys):
    sym = _ort_qdq(tmp_path, symmetric=True)
    _, messages = _build(sym)
    assert any("not powers of two" in t for t in messages)  # compiled, and said so
    asym = _ort_qdq(tmp_path, symmetric=False)
    assert main(["compile", asym, "--arch", ARCH, "-o", str(tmp_path / "a"), "-q"]) == 2
    assert "--requantize" in capsys.readouterr().err  # uint8 with zero points: the error names the option
    calib = tmp_path / "c.npz"
    np.savez(calib, X=np.random.default_rng(1).standard_normal((4, 1, 3, 8, 8)).astype(np.float32))
    assert main(["compile", asym, "--arch", ARCH, "-o", str(tmp_path / "b"), "-q", "--requantize",
                 "--calib", str(calib)]) == 0
    assert main(["partition", asym, "--arch", ARCH, "--requantize"]) == 0
    text = capsys.readouterr().out
    assert "on DPU in 1 subgraph, 0 on CPU" in text and "QuantizeLinear " not in text  # Q/DQ stripped
    requant, messages = _build(asym, requantize=True)
    assert any("no calibration data" in t for t in messages)  # calibrated (here on random data, as it says)


def quark_style(pool: str = "MaxPool") -> onnx.ModelProto:
    """As Quark's XINT8 writes a CNN: Q/DQ on the input, int8 weights and bias with their own power-of-two scales,
    none between a Conv and the Relu that alone reads it, and none after a MaxPool (its output is its input's
    values); `pool`="AveragePool" leaves the pool's output (new values) without a scale instead."""
    rng = np.random.default_rng(1)
    c = lambda v, name: numpy_helper.from_array(v, name)  # noqa: E731
    inits = [c(np.float32(2.0 ** -4), "sx"), c(np.int8(0), "z8"), c(np.float32(2.0 ** -7), "sw"),
             c(np.float32(2.0 ** -5), "sb"), c(np.float32(2.0 ** -3), "sy"), c(np.float32(2.0 ** -2), "sz"),
             c(rng.integers(-90, 90, (8, 3, 3, 3)).astype(np.int8), "W1q"),
             c(rng.integers(-90, 90, (8,)).astype(np.int8), "B1q"),
             c(rng.integers(-90, 90, (6, 8, 3, 3)).astype(np.int8), "W2q")]
    n = [helper.make_node("QuantizeLinear", ["X", "sx", "z8"], ["Xq"], name="qx"),
         helper.make_node("DequantizeLinear", ["Xq", "sx", "z8"], ["Xd"], name="dqx"),
         helper.make_node("DequantizeLinear", ["W1q", "sw", "z8"], ["W1"], name="dqw1"),
         helper.make_node("DequantizeLinear", ["B1q", "sb", "z8"], ["B1"], name="dqb1"),
         helper.make_node("DequantizeLinear", ["W2q", "sw", "z8"], ["W2"], name="dqw2"),
         helper.make_node("Conv", ["Xd", "W1", "B1"], ["Y"], name="conv1", pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["Y"], ["Yr"], name="relu1"),
         helper.make_node("QuantizeLinear", ["Yr", "sy", "z8"], ["Yq"], name="qy"),
         helper.make_node("DequantizeLinear", ["Yq", "sy", "z8"], ["Yd"], name="dqy"),
         helper.make_node(pool, ["Yd"], ["P"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
         helper.make_node("Conv", ["P", "W2"], ["Z"], name="conv2", pads=[1, 1, 1, 1]),
         helper.make_node("QuantizeLinear", ["Z", "sz", "z8"], ["Zq"], name="qz"),
         helper.make_node("DequantizeLinear", ["Zq", "sz", "z8"], ["out"], name="dqz")]
    g = helper.make_graph(n, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 6, 8, 8])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_quark_style_model_needs_no_calibration_and_ignores_calibration_data():
    """Every DPU tensor's scale is in the file (the MaxPool's output keeps its input's): no calibration run, no
    warning, and the same program whatever calibration data is passed."""
    _, fps = strip_qdq(quark_style())
    assert fps["P"] == 3 and fps["Yr"] == 3 and fps["Z"] == 2
    plain, messages = _build(quark_style())
    assert messages == []
    assert plain.build_info["calibration_batches"] == 0
    rng = np.random.default_rng(7)
    calib = [5 * rng.standard_normal((1, 3, 16, 16)).astype(np.float32) for _ in range(4)]
    calibrated, messages = _build(quark_style(), calibration=calib)
    assert messages == [] and calibrated.build_info["calibration_batches"] == 0
    for seed in range(5):
        x = np.random.default_rng(seed).standard_normal((1, 3, 16, 16)).astype(np.float32)
        np.testing.assert_array_equal(plain.run(x)[0], calibrated.run(x)[0])


def test_qdq_model_with_a_tensor_without_scale_names_it_and_calibrates_only_it():
    """An AveragePool's output (new values) with no Q/DQ: the one warning names it; the calibration data decides
    its fix_point only, every other tensor keeps the file's."""
    _, messages = _build(quark_style("AveragePool"))
    assert len(messages) == 1, messages
    assert "1 of" in messages[0] and "pool1" in messages[0] and "only these are calibrated" in messages[0]
    assert "random normal inputs" in messages[0]
    rng = np.random.default_rng(7)
    calib = [5 * rng.standard_normal((1, 3, 16, 16)).astype(np.float32) for _ in range(4)]
    model, messages = _build(quark_style("AveragePool"), calibration=calib)
    assert len(messages) == 1 and "on the calibration data given" in messages[0]
    (runner,) = model.runners.values()
    assert [b.fix_point for b in runner.sg.inputs] == [4] and [b.fix_point for b in runner.sg.outputs] == [2]
