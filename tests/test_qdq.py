"""QDQ ONNX import: power-of-two fix_points extracted, Q/DQ removed or folded, the float model computes exactly what
the QDQ model computes on values the quantization represents exactly; bad scales and zero points are named."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvm_dpu.errors import QuantizationError
from tvm_dpu.quant.qdq import strip_qdq

IR = {13: 7, 21: 10}


def _init(name: str, v) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(v), name)


def _qdq(x: str, scale: str, zp: str, out: str, tag: str) -> list[onnx.NodeProto]:
    return [helper.make_node("QuantizeLinear", [x, scale, zp], [f"{x}_q"], name=f"Q_{tag}"),
            helper.make_node("DequantizeLinear", [f"{x}_q", scale, zp], [out], name=f"DQ_{tag}")]


def _model(opset: int = 13, sy: float = 2.0 ** -10, w_scale=2.0 ** -6, zx=0, zdtype=np.int8,
           scale_as_constant: bool = True) -> onnx.ModelProto:
    """X -QDQ-> Conv(W = DQ(int8), B = DQ(int32)) -> Y -QDQ-> Relu -> Z -QDQ-> Zd (graph output)."""
    rng = np.random.default_rng(0)
    wq = rng.integers(-3, 4, (2, 1, 3, 3)).astype(np.int8)
    bq = rng.integers(-20, 21, (2,)).astype(np.int32)
    w_scale = np.asarray(w_scale, np.float32)
    inits = [_init("sx", np.float32(2.0 ** -4)), _init("zx", np.asarray(zx, zdtype)),
             _init("W_q", wq), _init("sw", w_scale), _init("zw", np.zeros(w_scale.shape, np.int8)),
             _init("B_q", bq), _init("sb", np.float32(2.0 ** -10)), _init("zb", np.int32(0)),
             _init("zy", np.int8(0))]
    nodes = _qdq("X", "sx", "zx", "Xd", "x")
    nodes += [helper.make_node("DequantizeLinear", ["W_q", "sw", "zw"], ["W"], name="DQ_w",
                               **({"axis": 0} if w_scale.size > 1 else {})),
              helper.make_node("DequantizeLinear", ["B_q", "sb", "zb"], ["B"], name="DQ_b"),
              helper.make_node("Conv", ["Xd", "W", "B"], ["Y"], name="conv", pads=[1, 1, 1, 1])]
    if scale_as_constant:
        nodes.append(helper.make_node("Constant", [], ["sy"], name="sy_const",
                                      value=numpy_helper.from_array(np.float32(sy), "sy")))
    else:
        inits.append(_init("sy", np.float32(sy)))
    nodes += _qdq("Y", "sy", "zy", "Yd", "y")
    nodes.append(helper.make_node("Relu", ["Yd"], ["Z"], name="relu"))
    nodes += _qdq("Z", "sy", "zy", "Zd", "z")
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 1, 5, 5])],
                              [helper.make_tensor_value_info("Zd", TensorProto.FLOAT, [1, 2, 5, 5])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR[opset])


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"X": x.astype(np.float32)})[0]


def _grid_inputs(n: int = 4) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [rng.integers(-3, 4, (1, 1, 5, 5)) * 2.0 ** -4 for _ in range(n)]


@pytest.mark.parametrize("opset", [13, 21])
def test_strip_extracts_fix_points_and_is_exact(opset):
    model = _model(opset)
    before = model.SerializeToString()
    fmodel, fps = strip_qdq(model)
    assert model.SerializeToString() == before  # input untouched
    onnx.checker.check_model(fmodel)
    assert fps == {"X": 4, "W": 6, "Y": 10, "Z": 10, "Zd": 10}  # B is int32: folded without a fix_point
    assert [n.op_type for n in fmodel.graph.node] == ["Conv", "Relu", "Identity"]
    conv = fmodel.graph.node[0]
    assert list(conv.input) == ["X", "W", "B"] and conv.name == "conv"  # original names kept
    inits = {i.name: numpy_helper.to_array(i) for i in fmodel.graph.initializer}
    assert set(inits) == {"W", "B"} and inits["W"].dtype == np.float32
    names = {"X"} | {o for n in fmodel.graph.node for o in n.output} | set(inits)
    assert set(fps) <= names
    for x in _grid_inputs():
        np.testing.assert_array_equal(_run(fmodel, x), _run(model, x))
    # off-grid inputs: the QDQ model rounds, the float model does not
    x = np.random.default_rng(2).standard_normal((1, 1, 5, 5)) * 0.1
    assert not np.array_equal(_run(fmodel, x), _run(model, x))


def test_fake_quantized_float_weights_are_folded():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((3, 1, 2, 2)).astype(np.float32)
    inits = [_init("sx", np.float32(2.0 ** -4)), _init("z8", np.int8(0)), _init("Wf", w),
             _init("sw", np.float32(2.0 ** -5))]
    nodes = _qdq("X", "sx", "z8", "Xd", "x") + _qdq("Wf", "sw", "z8", "W", "w")
    nodes.append(helper.make_node("Conv", ["Xd", "W"], ["Y"], name="conv"))
    graph = helper.make_graph(nodes, "fq", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 1, 5, 5])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 3, 4, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)
    fmodel, fps = strip_qdq(model)
    assert fps == {"X": 4, "W": 5}
    folded = numpy_helper.to_array(next(i for i in fmodel.graph.initializer if i.name == "W"))
    np.testing.assert_array_equal(folded, np.clip(np.rint(w * 32), -128, 127) / 32)
    assert [n.op_type for n in fmodel.graph.node] == ["Conv"]
    for x in _grid_inputs():
        np.testing.assert_array_equal(_run(fmodel, x), _run(model, x))


def test_non_power_of_two_scale_names_tensor_and_node():
    with pytest.raises(QuantizationError, match=r"tensor 'Y' \(QuantizeLinear node 'Q_y'\): scale 0\.02.* not a "
                                                r"power of two.*power-of-two.*calibrate"):
        strip_qdq(_model(sy=0.02, scale_as_constant=False))


def test_per_channel_scales():
    with pytest.raises(QuantizationError, match=r"tensor 'W_q' \(DequantizeLinear node 'DQ_w'\): per-channel "
                                                r"scales.*differ"):
        strip_qdq(_model(w_scale=[2.0 ** -6, 2.0 ** -5]))
    fmodel, fps = strip_qdq(_model(w_scale=[2.0 ** -6, 2.0 ** -6]))
    assert fps["W"] == 6
    x = _grid_inputs(1)[0]
    np.testing.assert_array_equal(_run(fmodel, x), _run(_model(), x))


def test_nonzero_zero_point_and_uint8_are_rejected():
    with pytest.raises(QuantizationError, match=r"tensor 'X' \(QuantizeLinear node 'Q_x'\): zero point \[3\] is "
                                                r"not 0"):
        strip_qdq(_model(zx=3))
    with pytest.raises(QuantizationError, match=r"tensor 'X'.*quantized to UINT8"):
        strip_qdq(_model(zdtype=np.uint8))


def test_dequantize_of_a_non_qdq_tensor_is_rejected():
    nodes = [helper.make_node("Cast", ["X"], ["Xi"], name="cast", to=TensorProto.INT8),
             helper.make_node("DequantizeLinear", ["Xi", "s"], ["Y"], name="dq")]
    graph = helper.make_graph(nodes, "bad", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 2])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 2])],
                              [_init("s", np.float32(0.5))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)
    with pytest.raises(QuantizationError, match="tensor 'Xi' \\(DequantizeLinear node 'dq'\\).*neither a constant"):
        strip_qdq(model)
