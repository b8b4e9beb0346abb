"""Invalid ONNX models get one clear FrontendError naming the node (or input/output) and the rule of the ONNX
operator spec they break, instead of being imported into something else or failing deep inside TVM."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import tvm_dpu
from tvm_dpu.errors import FrontendError
from tvm_dpu.frontend import from_onnx


def _conv(pads=(1, 1, 1, 1), dilations=(1, 1), kernel=(3, 3), strides=(1, 1), group=1, w=(8, 3, 3, 3),
          out=(1, 8, 8, 8), op="Conv"):
    W = nh.from_array(np.random.default_rng(0).standard_normal(w).astype(np.float32), "W")
    attrs = dict(pads=list(pads), dilations=list(dilations), strides=list(strides), group=group)
    if kernel is not None:
        attrs["kernel_shape"] = list(kernel)
    inputs = ["x", "W"] if op == "Conv" else ["x"]
    if op != "Conv":
        attrs.pop("group")
        attrs.pop("dilations")
    g = h.make_graph([h.make_node(op, inputs, ["y"], name="c1", **attrs)], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 8, 8])],
                     [h.make_tensor_value_info("y", T.FLOAT, list(out))], [W] if op == "Conv" else [])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


@pytest.mark.parametrize("model, message", [
    (_conv(pads=(-1, -1, -1, -1), out=(1, 8, 4, 4)), r"node 'c1' \(Conv\): pads \[-1, -1, -1, -1\] has a negative"),
    (_conv(dilations=(0, 0)), r"dilations \[0, 0\] has a value below 1"),
    (_conv(strides=(0, 1)), r"strides \[0, 1\] has a value below 1"),
    (_conv(kernel=(5, 5)), r"kernel_shape \[5, 5\] contradicts the weight 'W' of shape \[8, 3, 3, 3\]"),
    (_conv(pads=(1, 1)), r"pads \[1, 1\] has 2 values; 4 expected"),
    (_conv(group=3, w=(8, 1, 3, 3)), "8 output channels are not divisible by group 3"),
    (_conv(op="MaxPool", pads=(0, 0, -2, 0), out=(1, 3, 6, 8)), r"\(MaxPool\): pads .* negative"),
    (_conv(out=(1, 5)), r"output 'y' is declared with shape \[1, 5\] but the model computes \[1, 8, 8, 8\]"),
])
def test_spec_violations_name_the_node_and_rule(model, message):
    with pytest.raises(FrontendError, match=message):
        from_onnx(model)


def test_a_valid_conv_still_imports_and_an_unknown_output_dim_is_fine():
    from_onnx(_conv())
    from_onnx(_conv(out=(1, 8, 0, 0)))  # 0 = unknown in an older exporter's declaration: not a clash


def _graph(nodes, inputs, outputs):
    return h.make_model(h.make_graph(nodes, "g", inputs, outputs), opset_imports=[h.make_opsetid("", 17)])


def test_integer_inputs_and_outputs_are_refused_at_import():
    m = _graph([h.make_node("Cast", ["x"], ["xf"], to=T.FLOAT), h.make_node("Relu", ["xf"], ["y"])],
               [h.make_tensor_value_info("x", T.INT64, [1, 3, 8, 8])],
               [h.make_tensor_value_info("y", T.FLOAT, [1, 3, 8, 8])])
    with pytest.raises(FrontendError, match="input 'x' has element type int64"):
        tvm_dpu.build(m, progress=False)
    m = _graph([h.make_node("ArgMax", ["x"], ["y"], axis=1)], [h.make_tensor_value_info("x", T.FLOAT, [1, 10])],
               [h.make_tensor_value_info("y", T.INT64, [1, 1])])
    with pytest.raises(FrontendError, match="output 'y' has element type int64"):
        tvm_dpu.build(m, progress=False)


def test_data_dependent_shapes_are_one_clear_error():
    m = _graph([h.make_node("NonZero", ["x"], ["nz"]), h.make_node("Cast", ["nz"], ["y"], to=T.FLOAT)],
               [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 8, 8])], [h.make_tensor_value_info("y", T.FLOAT, [4, None])])
    with pytest.raises(FrontendError, match="shape depends on the input data.*NonZero"):
        tvm_dpu.build(m, progress=False)


def test_a_model_without_inputs_is_refused():
    c = nh.from_array(np.ones((1, 4), np.float32), "c")
    m = h.make_model(h.make_graph([h.make_node("Relu", ["c"], ["y"])], "g", [],
                                  [h.make_tensor_value_info("y", T.FLOAT, [1, 4])], [c]),
                     opset_imports=[h.make_opsetid("", 17)])
    with pytest.raises(FrontendError, match="has no inputs"):
        tvm_dpu.build(m, progress=False)
