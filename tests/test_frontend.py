"""ONNX import: module structure, provenance bookkeeping and the user-facing errors."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from tvm_dpu.errors import FrontendError
from tvm_dpu.frontend import (
    from_onnx,
    merge,
    node_names,
    parse_input_shapes,
    source_nodes,
    supported_opsets,
    with_nodes,
)
from tvm_dpu.frontend.provenance import SOURCE_NODES_ATTR, make_span, referenced_names
from tvm_dpu.frontend.testing import make_model, run_onnxruntime, run_relax

RNG = np.random.default_rng(1)
X = [1, 3, 8, 8]


def small_cnn(**names) -> onnx.ModelProto:
    """Conv(bias) -> BN -> Relu -> MaxPool -> Identity -> Conv -> Add(const from a Constant node)."""
    n = {"conv1": "conv1", "bn1": "bn1", "relu1": "relu1", "pool": "pool", "ident": "ident", "conv2": "conv2",
         "k": "k", "add": "add", **names}
    c = 8
    inits = {"w1": RNG.standard_normal((c, 3, 3, 3)).astype(np.float32),
             "b1": RNG.standard_normal(c).astype(np.float32),
             "s": RNG.uniform(0.5, 1.5, c).astype(np.float32), "b": RNG.standard_normal(c).astype(np.float32),
             "m": RNG.standard_normal(c).astype(np.float32), "v": RNG.uniform(0.5, 2, c).astype(np.float32),
             "w2": RNG.standard_normal((c, c, 1, 1)).astype(np.float32)}
    const = numpy_helper.from_array(np.full((1, c, 1, 1), 0.25, np.float32))
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name=n["conv1"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c1", "s", "b", "m", "v"], ["bn"], name=n["bn1"]),
             helper.make_node("Relu", ["bn"], ["r"], name=n["relu1"]),
             helper.make_node("MaxPool", ["r"], ["p"], name=n["pool"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Identity", ["p"], ["pi"], name=n["ident"]),
             helper.make_node("Conv", ["pi", "w2"], ["c2"], name=n["conv2"]),
             helper.make_node("Constant", [], ["kc"], name=n["k"], value=const),
             helper.make_node("Add", ["c2", "kc"], ["y"], name=n["add"])]
    return make_model(nodes, {"x": X}, {"y": None}, inits)


def all_calls(mod):
    out = []
    relax.analysis.post_order_visit(mod["main"], lambda e: out.append(e) if isinstance(e, relax.Call) else None)
    return out


# ------------------------------------------------------------------------------------------------ structure
def test_import_without_normalize_keeps_importer_form():
    mod = from_onnx(small_cnn(), normalize=False)
    main = mod["main"]
    assert len(main.params) == 1 and main.params[0].name == "x"
    assert isinstance(main.body.blocks[0], relax.DataflowBlock)
    ops = {str(c.op.name) for c in all_calls(mod) if isinstance(c.op, tvm.ir.Op)}
    assert "relax.nn.batch_norm" in ops and "relax.nn.conv2d" in ops
    weights = [a for c in all_calls(mod) for a in c.args if isinstance(a, tvm.ir.GenericConst)]
    assert any(tuple(w.value.numpy().shape) == (8, 3, 3, 3) for w in weights)


def test_import_matches_onnxruntime_from_file(tmp_path):
    model = small_cnn()
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    x = RNG.standard_normal(X).astype(np.float32)
    ref = run_onnxruntime(model, {"x": x})[0]
    for normalize in (False, True):
        got = run_relax(from_onnx(str(path), normalize=normalize), x)[0]
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------------------------ provenance
def test_every_call_names_its_onnx_nodes():
    mod = from_onnx(small_cnn(), normalize=False)
    for c in all_calls(mod):
        assert node_names(c), c
    by_op = {}
    for c in all_calls(mod):
        if isinstance(c.op, tvm.ir.Op):
            by_op.setdefault(str(c.op.name), set()).update(node_names(c))
    assert by_op["relax.nn.conv2d"] == {"conv1", "conv2"}
    assert by_op["relax.nn.batch_norm"] == {"bn1"}
    assert by_op["relax.nn.max_pool2d"] == {"pool"}


def test_source_nodes_record_absorbed_nodes():
    model = small_cnn()
    mod = from_onnx(model, normalize=False)
    nodes = source_nodes(mod)
    assert [n["name"] for n in nodes] == [n.name for n in model.graph.node]
    assert nodes[0] == {"name": "conv1", "op": "Conv", "inputs": ["x", "w1", "b1"], "outputs": ["c1"]}
    by = {n["name"]: n for n in nodes}
    assert by["ident"]["absorbed_into"] == "pool"       # pass-through -> its producer
    assert by["k"]["absorbed_into"] == "add"            # Constant -> its consumer
    assert "absorbed_into" not in by["bn1"]
    json.loads(str(mod.attrs[SOURCE_NODES_ATTR]))       # stored as a JSON string attribute

    norm = from_onnx(model)
    by = {n["name"]: n for n in source_nodes(norm)}
    assert by["bn1"]["absorbed_into"] == "conv1"        # folded into the conv
    placed = referenced_names(norm)
    assert all(n["name"] in placed or "absorbed_into" in n for n in source_nodes(norm))


def test_unnamed_nodes_get_stable_generated_names():
    model = small_cnn(conv1="", relu1="", conv2="")
    mod = from_onnx(model)
    names = [n["name"] for n in source_nodes(mod)]
    assert names[0] == "Conv_0" and names[2] == "Relu_2" and names[5] == "Conv_5"
    assert model.graph.node[0].name == ""               # the caller's model is not modified
    assert {"Conv_0", "Relu_2", "Conv_5"} <= referenced_names(mod)
    assert names == [n["name"] for n in source_nodes(from_onnx(model))]


def test_provenance_helpers():
    x = relax.Var("x", relax.TensorType((1, 4), "float32"))
    call = relax.op.nn.relu(x)
    assert node_names(call) == [] and node_names(call, relax.Var("lv3", None)) == ["lv3"]
    tagged = with_nodes(call, ["a", "b"])
    assert node_names(tagged) == ["a", "b"] and tagged.op.same_as(call.op)
    assert merge(tagged, ["b", "c"], with_nodes(call, ["d"])) == ["a", "b", "c", "d"]
    assert str(make_span(["n1"]).source_name.name) == '["n1"]'


# ------------------------------------------------------------------------------------------------ errors
def test_not_a_protobuf_names_the_path(tmp_path):
    bad = tmp_path / "garbage.onnx"
    bad.write_bytes(b"\x00\xffnot an onnx model at all" * 10)
    with pytest.raises(FrontendError, match="garbage.onnx"):
        from_onnx(str(bad))
    with pytest.raises(FrontendError, match="not found"):
        from_onnx(str(tmp_path / "missing.onnx"))


def test_checker_failure():
    model = small_cnn()
    model.graph.node[1].input[0] = "undefined_tensor"
    with pytest.raises(FrontendError, match="onnx.checker"):
        from_onnx(model)


def test_opset_out_of_range():
    lo, hi = supported_opsets()
    model = small_cnn()
    model.opset_import[0].version = hi + 1
    with pytest.raises(FrontendError, match=rf"opset {hi + 1}.*{lo}\.\.{hi}"):
        from_onnx(model)


def test_unsupported_ops_listed_with_node_names():
    nodes = [helper.make_node("Celu", ["x"], ["c"], name="celu_a"),
             helper.make_node("Celu", ["c"], ["d"], name="celu_b"),
             helper.make_node("LpNormalization", ["d"], ["y"], name="lpn")]
    model = make_model(nodes, {"x": X}, {"y": X})
    with pytest.raises(FrontendError) as err:
        from_onnx(model)
    msg = str(err.value)
    assert "Celu" in msg and "'celu_a'" in msg and "'celu_b'" in msg and "LpNormalization" in msg and "'lpn'" in msg


def dynamic_model():
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu")]
    return make_model(nodes, {"x": ["N", 3, "H", 8]}, {"y": ["N", 3, "H", 8]})


def test_dynamic_input_needs_shapes():
    with pytest.raises(FrontendError) as err:
        from_onnx(dynamic_model())
    msg = str(err.value)
    assert "'x'" in msg and "[N, 3, H, 8]" in msg and "--input-shape x=1,3,1,8" in msg and "shapes=" in msg
    mod = from_onnx(dynamic_model(), shapes={"x": (2, 3, 5, 8)})
    assert [int(v) for v in mod["main"].params[0].ty.shape.values] == [2, 3, 5, 8]


def test_parse_input_shapes_cli_form():
    assert parse_input_shapes(["x=1,3,224,224", "a.b=2,5"]) == {"x": [1, 3, 224, 224], "a.b": [2, 5]}
    for bad in ("x", "x=", "x=1,a", "=1,2", "x=1,0"):
        with pytest.raises(FrontendError, match="--input-shape"):
            parse_input_shapes([bad])


def test_bad_shapes_arguments():
    with pytest.raises(FrontendError, match=r"not model inputs.*\['x'\]"):
        from_onnx(dynamic_model(), shapes={"x": [1, 3, 4, 8], "image": [1, 3, 4, 8]})
    with pytest.raises(FrontendError, match="rank"):
        from_onnx(dynamic_model(), shapes={"x": [1, 3, 8]})
    with pytest.raises(FrontendError, match="differs at dim"):
        from_onnx(dynamic_model(), shapes={"x": [1, 4, 4, 8]})


def test_importer_conversion_failure_names_the_node():
    # Pad with run-time pads: TVM's converter raises ("Dynamic pads are not supported yet").
    # (The pads come from a float input: an int64 graph input is refused before the importer runs.)
    nodes = [helper.make_node("Cast", ["pads_f"], ["pads"], to=TensorProto.INT64),
             helper.make_node("Pad", ["x", "pads"], ["y"], name="dyn_pad")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, X),
                                       helper.make_tensor_value_info("pads_f", TensorProto.FLOAT, [8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b", "c", "d"])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with pytest.raises(FrontendError, match=r"ONNX node 'dyn_pad' \(Pad\).*Dynamic pads"):
        from_onnx(model, normalize=False)
