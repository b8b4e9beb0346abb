"""Normalization passes: each rewrite checked on the IR it produces and numerically against onnxruntime."""
from __future__ import annotations

import collections
import time

import numpy as np
import pytest
import tvm
import tvm_ffi
from onnx import helper
from tvm import relax

from tvm_dpu.frontend import (
    PASSES,
    batch_norm_to_affine,
    fold_batch_norm,
    fold_constants,
    from_onnx,
    node_names,
    normalize,
    source_nodes,
)
from tvm_dpu.frontend.provenance import referenced_names
from tvm_dpu.frontend.testing import make_model, run_onnxruntime, run_relax

RNG = np.random.default_rng(0)


def rand(*shape, lo=-1.0, hi=1.0):
    return RNG.uniform(lo, hi, size=shape).astype(np.float32)


def bn_params(prefix: str, c: int) -> dict[str, np.ndarray]:
    return {f"{prefix}.s": rand(c, lo=0.5, hi=1.5), f"{prefix}.b": rand(c), f"{prefix}.m": rand(c),
            f"{prefix}.v": rand(c, lo=0.2, hi=2.0)}


def bn_node(name: str, x: str, y: str) -> helper.NodeProto:
    return helper.make_node("BatchNormalization", [x] + [f"{name}.{k}" for k in "sbmv"], [y], name=name,
                            epsilon=1e-3)


def calls(mod) -> list[relax.Call]:
    out = []
    relax.analysis.post_order_visit(mod["main"], lambda e: out.append(e) if isinstance(e, relax.Call) else None)
    return out


def ops(mod) -> collections.Counter:
    return collections.Counter(str(c.op.name) for c in calls(mod) if isinstance(c.op, tvm.ir.Op))


def find(mod, op: str) -> list[relax.Call]:
    return [c for c in calls(mod) if isinstance(c.op, tvm.ir.Op) and c.op.name == op]


def check_provenance(mod, model) -> None:
    graph_names = {n.name for n in model.graph.node}
    for c in calls(mod):
        names = node_names(c)
        assert names, f"Call {c.op} has no provenance"
        assert set(names) <= graph_names, names
    nodes = source_nodes(mod)
    assert [n["name"] for n in nodes] == [n.name for n in model.graph.node]
    ref = referenced_names(mod)
    for n in nodes:
        assert n["name"] in ref or "absorbed_into" in n, f"node {n['name']} neither placed nor absorbed"


def check(model, x_shape, *, rtol=1e-4, atol=1e-4, **kw):
    """Import + normalize, compare with onnxruntime, check provenance; returns the module."""
    x = rand(*x_shape)
    ref = run_onnxruntime(model, {"x": x})[0]
    mod = from_onnx(model, **kw)
    got = run_relax(mod, x)[0]
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol)
    check_provenance(mod, model)
    return mod


X = [1, 4, 8, 8]


def conv_model(extra_nodes, extra_inits, *, bias=False, group=1, out_c=6, pads=(1, 1, 1, 1), out="y", cin=4):
    inits = {"w": rand(out_c, cin // group, 3, 3)}
    ins = ["x", "w"]
    if bias:
        inits["cb"] = rand(out_c)
        ins.append("cb")
    conv = helper.make_node("Conv", ins, ["c"], name="conv", pads=list(pads), group=group)
    inits.update(extra_inits)
    return make_model([conv] + extra_nodes, {"x": [1, cin, 8, 8]}, {out: None}, inits)


# ------------------------------------------------------------------------------------------------ BN folding
@pytest.mark.parametrize("bias", [False, True])
def test_conv_bn_folds_into_conv(bias):
    m = conv_model([bn_node("bn", "c", "t"), helper.make_node("Relu", ["t"], ["y"], name="relu")],
                   bn_params("bn", 6), bias=bias)
    mod = check(m, X)
    assert set(ops(mod)) == {"relax.nn.conv2d", "relax.add", "relax.nn.relu"}
    (conv,) = find(mod, "relax.nn.conv2d")
    assert node_names(conv) == ["conv", "bn"]
    (add,) = find(mod, "relax.add")
    assert [int(v) for v in add.args[1].ty.shape.values] == [1, 6, 1, 1]
    absorbed = {n["name"]: n.get("absorbed_into") for n in source_nodes(mod)}
    assert absorbed["bn"] == "conv"


def test_depthwise_conv_bn():
    m = conv_model([bn_node("bn", "c", "y")], bn_params("bn", 4), group=4, out_c=4)
    mod = check(m, X)
    assert set(ops(mod)) == {"relax.nn.conv2d", "relax.add"}
    assert find(mod, "relax.nn.conv2d")[0].attrs.groups == 4


def test_conv_transpose_bn():
    nodes = [helper.make_node("ConvTranspose", ["x", "w"], ["c"], name="convt", group=2, strides=[2, 2]),
             bn_node("bn", "c", "y")]
    m = make_model(nodes, {"x": X}, {"y": None}, {"w": rand(4, 3, 3, 3), **bn_params("bn", 6)})
    mod = check(m, X)
    assert set(ops(mod)) == {"relax.nn.conv2d_transpose", "relax.add"}


def test_standalone_bn_becomes_multiply_add():
    m = make_model([bn_node("bn", "x", "y")], {"x": X}, {"y": None}, bn_params("bn", 4))
    mod = check(m, X)
    assert set(ops(mod)) == {"relax.multiply", "relax.add"}
    for c in calls(mod):
        assert [int(v) for v in c.args[1].ty.shape.values] == [1, 4, 1, 1]


def test_conv_scale_and_shift_fold():
    nodes = [helper.make_node("Mul", ["c", "s"], ["t"], name="scale"),
             helper.make_node("Add", ["t", "sh"], ["u"], name="shift"),
             helper.make_node("Div", ["u", "d"], ["y"], name="div")]
    m = conv_model(nodes, {"s": rand(1, 6, 1, 1), "sh": rand(6, 1, 1), "d": rand(1, lo=1.0, hi=2.0)}, bias=True)
    mod = check(m, X)
    assert set(ops(mod)) == {"relax.nn.conv2d", "relax.add"}
    assert node_names(find(mod, "relax.nn.conv2d")[0])[0] == "conv"


def test_non_per_channel_scale_is_kept():
    m = conv_model([helper.make_node("Mul", ["c", "s"], ["y"], name="scale")], {"s": rand(1, 6, 8, 8)})
    mod = check(m, X)
    assert "relax.multiply" in ops(mod)


# ------------------------------------------------------------------------------------------------ pad folding
def test_zero_pad_folds_into_conv_padding():
    nodes = [helper.make_node("Pad", ["x", "p"], ["xp"], name="pad"),
             helper.make_node("Conv", ["xp", "w"], ["y"], name="conv", pads=[1, 0, 1, 0])]
    m = make_model(nodes, {"x": X}, {"y": None},
                   {"p": np.array([0, 0, 1, 2, 0, 0, 3, 0], np.int64), "w": rand(6, 4, 3, 3)})
    mod = check(m, X)
    assert "relax.nn.pad" not in ops(mod)
    (conv,) = find(mod, "relax.nn.conv2d")
    assert [int(v) for v in conv.attrs.padding] == [2, 2, 4, 0]  # top, left, bottom, right
    assert node_names(conv) == ["conv", "pad"]


def test_nonzero_pad_is_kept():
    nodes = [helper.make_node("Pad", ["x", "p", "v"], ["xp"], name="pad"),
             helper.make_node("Conv", ["xp", "w"], ["y"], name="conv")]
    m = make_model(nodes, {"x": X}, {"y": None},
                   {"p": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "v": np.array(0.5, np.float32),
                    "w": rand(6, 4, 3, 3)})
    mod = check(m, X)
    assert "relax.nn.pad" in ops(mod)


# ------------------------------------------------------------------------------------------------ dense -> conv
@pytest.mark.parametrize("trans_b,alpha,beta", [(0, 1.0, 1.0), (1, 1.0, 1.0), (1, 0.5, 2.0), (0, 2.0, 0.25)])
def test_gemm_becomes_conv(trans_b, alpha, beta):
    w = rand(10, 16) if trans_b else rand(16, 10)
    node = helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="fc", transB=trans_b, alpha=alpha, beta=beta)
    m = make_model([node], {"x": [2, 16]}, {"y": None}, {"w": w, "b": rand(10)})
    mod = check(m, [2, 16])
    assert "relax.matmul" not in ops(mod)
    (conv,) = find(mod, "relax.nn.conv2d")
    assert [int(v) for v in conv.args[1].ty.shape.values] == [10, 16, 1, 1]


def test_matmul_becomes_conv():
    m = make_model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], {"x": [3, 16]}, {"y": None},
                   {"w": rand(16, 5)})
    mod = check(m, [3, 16])
    assert set(ops(mod)) == {"relax.nn.conv2d", "relax.reshape"}


def test_flatten_gemm_uses_hxw_kernel():
    nodes = [helper.make_node("Flatten", ["x"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "w", "b"], ["y"], name="fc", transB=1)]
    m = make_model(nodes, {"x": X}, {"y": None}, {"w": rand(7, 256), "b": rand(7)})
    mod = check(m, X)
    (conv,) = find(mod, "relax.nn.conv2d")
    assert [int(v) for v in conv.args[1].ty.shape.values] == [7, 4, 8, 8]
    assert conv.args[0].same_as(mod["main"].params[0])
    assert node_names(conv) == ["fc", "flat"]


def test_fully_connected_stack_stays_4d():
    nodes = [helper.make_node("Flatten", ["x"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "w1", "b1"], ["g1"], name="fc1", transB=1),
             helper.make_node("Relu", ["g1"], ["r1"], name="relu1"),
             helper.make_node("Dropout", ["r1"], ["d1"], name="drop1"),
             helper.make_node("Gemm", ["d1", "w2", "b2"], ["y"], name="fc2", transB=1)]
    m = make_model(nodes, {"x": X}, {"y": None}, {"w1": rand(32, 256), "b1": rand(32), "w2": rand(5, 32),
                                                   "b2": rand(5)})
    mod = check(m, X)
    assert ops(mod) == {"relax.nn.conv2d": 2, "relax.add": 2, "relax.nn.relu": 1, "relax.reshape": 1}
    (relu,) = find(mod, "relax.nn.relu")
    assert [int(v) for v in relu.ty.shape.values] == [1, 32, 1, 1]


def test_matmul_with_activation_weight_is_left_alone():
    m = make_model([helper.make_node("MatMul", ["x", "x2"], ["y"], name="mm")], {"x": [3, 4], "x2": [4, 3]},
                   {"y": None})
    mod = from_onnx(m)
    assert "relax.matmul" in ops(mod)


# ------------------------------------------------------------------------------------------------ pooling
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_mean_becomes_avg_pool(keepdims):
    m = make_model([helper.make_node("ReduceMean", ["x"], ["y"], name="mean", axes=[2, 3], keepdims=keepdims)],
                   {"x": X}, {"y": None})
    mod = check(m, X)
    assert "relax.mean" not in ops(mod)
    (pool,) = find(mod, "relax.nn.avg_pool2d")
    assert [int(v) for v in pool.attrs.pool_size] == [8, 8]
    assert ("relax.reshape" in ops(mod)) == (keepdims == 0)


def test_global_average_pool_then_flatten_gemm():
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "w", "b"], ["y"], name="fc", transB=1)]
    m = make_model(nodes, {"x": X}, {"y": None}, {"w": rand(3, 4), "b": rand(3)})
    mod = check(m, X)
    assert set(ops(mod)) == {"relax.nn.avg_pool2d", "relax.nn.conv2d", "relax.add", "relax.reshape"}


# ------------------------------------------------------------------------------------------------ no-ops
def test_dropout_and_identity_removed():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Dropout", ["c"], ["d"], name="drop"),
             helper.make_node("Identity", ["d"], ["i"], name="ident"),
             helper.make_node("Relu", ["i"], ["y"], name="relu")]
    m = make_model(nodes, {"x": X}, {"y": None}, {"w": rand(6, 4, 3, 3)})
    mod = check(m, X)
    assert set(ops(mod)) == {"relax.nn.conv2d", "relax.nn.relu"}
    absorbed = {n["name"]: n.get("absorbed_into") for n in source_nodes(mod)}
    assert absorbed["drop"] == "conv" and absorbed["ident"] == "conv"


# ------------------------------------------------------------------------------------------------ activations
def test_clip_0_6_is_canonical():
    m = conv_model([helper.make_node("Clip", ["c", "lo", "hi"], ["y"], name="clip")],
                   {"lo": np.array(0, np.float32), "hi": np.array(6, np.float32)})
    mod = check(m, X)
    (clip,) = find(mod, "relax.clip")
    assert (float(clip.args[1].value), float(clip.args[2].value)) == (0.0, 6.0)
    assert not any(c.op.name == "relax.call_tir" for c in calls(mod) if isinstance(c.op, tvm.ir.Op))


def test_relu_min6_becomes_clip():
    m = conv_model([helper.make_node("Relu", ["c"], ["r"], name="relu"),
                    helper.make_node("Min", ["r", "six"], ["y"], name="min6")], {"six": np.array(6, np.float32)})
    mod = check(m, X)
    assert set(ops(mod)) == {"relax.nn.conv2d", "relax.clip"}
    (clip,) = find(mod, "relax.clip")
    assert (float(clip.args[1].value), float(clip.args[2].value)) == (0.0, 6.0)


def test_clip_without_max_is_relu_and_old_opset_attr_form():
    m = conv_model([helper.make_node("Clip", ["c", "lo"], ["y"], name="clip")], {"lo": np.array(0, np.float32)})
    mod = check(m, X)
    assert set(ops(mod)) == {"relax.nn.conv2d", "relax.nn.relu"}
    nodes = [helper.make_node("Clip", ["x"], ["y"], name="clip", min=0.0, max=6.0)]
    m6 = make_model(nodes, {"x": X}, {"y": None}, opset=6)
    mod6 = check(m6, X)
    assert set(ops(mod6)) == {"relax.clip"}


# ------------------------------------------------------------------------------------------------ passes
def test_each_pass_runs_alone_and_separate_passes_match():
    m = conv_model([bn_node("bn", "c", "t"), helper.make_node("Relu", ["t"], ["y"], name="relu")],
                   bn_params("bn", 6), bias=True)
    raw = from_onnx(m, normalize=False)
    assert "relax.nn.batch_norm" in ops(raw)
    only_affine = batch_norm_to_affine(raw)
    assert "relax.nn.batch_norm" not in ops(only_affine) and "relax.multiply" in ops(only_affine)
    assert "relax.multiply" not in ops(fold_batch_norm(fold_constants(raw)))
    for _, p in PASSES:
        p(raw)  # each pass accepts the raw import
    x = rand(*X)
    a = run_relax(normalize(raw), x)[0]
    b = run_relax(normalize(raw, separate_passes=True), x)[0]
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert ops(normalize(raw)) == ops(normalize(raw, separate_passes=True))


def test_user_relax_module_gets_var_name_provenance():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 8, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            c = bb.emit(relax.op.nn.conv2d(x, relax.const(rand(6, 4, 3, 3)), padding=1), name_hint="myconv")
            r = bb.emit(relax.op.nn.relu(c), name_hint="myrelu")
            out = bb.emit_output(r)
        bb.emit_func_output(out)
    mod = normalize(bb.get())
    names = sorted(n for call in calls(mod) for n in node_names(call))
    assert names == ["myconv", "myrelu"]
    assert {n["name"] for n in source_nodes(mod)} == {"myconv", "myrelu"}


# ------------------------------------------------------------------------------------------------ zoo networks
def _zoo(name: str, **kw):
    from tvm_dpu import zoo

    return zoo.build_model(name, **kw)


ALLOWED = {"relax.nn.conv2d", "relax.add", "relax.nn.relu", "relax.clip", "relax.nn.leakyrelu",
           "relax.nn.max_pool2d", "relax.nn.avg_pool2d", "relax.concat", "relax.reshape", "relax.nn.softmax"}


def test_reduced_resnet50_normalized_form_and_numerics():
    m = _zoo("resnet50", reduced=True)
    shape = [int(d.dim_value) for d in m.graph.input[0].type.tensor_type.shape.dim]
    x = rand(*shape)
    ref = run_onnxruntime(m, {m.graph.input[0].name: x})[0]
    mod = from_onnx(m)
    assert set(ops(mod)) <= ALLOWED, set(ops(mod)) - ALLOWED
    np.testing.assert_allclose(run_relax(mod, x)[0], ref, rtol=1e-4, atol=1e-4)
    check_provenance(mod, m)


@pytest.mark.slow
def test_resnet50_import_normalize_time():
    m = _zoo("resnet50")
    best = min(_timed(lambda: from_onnx(m)) for _ in range(2))
    assert best < 3.0, f"import+normalize of ResNet-50 took {best:.2f} s"
    mod = from_onnx(m)
    counts = ops(mod)
    assert set(counts) <= ALLOWED and counts["relax.nn.conv2d"] == 54  # 53 convs + the FC as a conv


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def test_renamed_call_keeps_its_type_only_when_the_argument_types_match():
    # The rewriter renames a call's arguments on every sweep; it reuses the call's inferred type instead of inferring
    # it again, which is only right when each new argument has the type of the one it replaces.
    from tvm_dpu.frontend.rewrite import _renamed_call

    x, same, wider = (relax.Var(n, relax.TensorType([1, 3, h, h], "float32")) for n, h in (("x", 8), ("y", 8),
                                                                                             ("z", 10)))
    w = relax.const(rand(4, 3, 3, 3))
    bb = relax.BlockBuilder()
    with bb.function("f", params=[x, same, wider]):
        call = bb.normalize(relax.op.nn.conv2d(x, w))
        kept = _renamed_call(call, call.op, [same, w])
        assert kept.ty is not None and tvm_ffi.structural_equal(kept.ty, call.ty)
        assert bb.normalize(kept).ty.shape[2] == 6
        inferred = bb.normalize(_renamed_call(call, call.op, [wider, w]))
        assert [int(d) for d in inferred.ty.shape] == [1, 4, 8, 8]  # inferred anew, not the 6x6 of `call`
        bb.emit_func_output(x)
