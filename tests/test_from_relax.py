"""Float XGraph from Relax DPU partitions (tvm_dpu.xgraph.from_relax).

Numerical reference: the partition function itself, executed by TVM on the CPU. The function is flattened (every
local composite call inlined into one plain Relax function, Codegen / Composite attributes gone) and compiled with
``tvm.compile(target="llvm")``. This runs exactly the Relax ops the XGraph was built from, on arbitrary inputs at
the partition boundary, so every partition (also the ones fed by CPU ops, and multi-input / tuple-output ones) is
checked on its own; running the whole model instead would need the boundary tensors traced out of ``main``.
The float XGraph runs on `tvm_dpu.xgraph.float_ref.run_graph_float`.
"""
from __future__ import annotations

import functools
from collections import Counter

import numpy as np
import onnx
import pytest
import tvm
import tvm_ffi
from tvm import relax

from tvm_dpu import zoo
from tvm_dpu.frontend import from_onnx
from tvm_dpu.frontend.onnx_import import stable_node_names
from tvm_dpu.frontend.provenance import with_nodes
from tvm_dpu.passes import partition_detailed
from tvm_dpu.passes.partition import binding_node_names
from tvm_dpu.passes.report import build_report
from tvm_dpu.xgraph.float_ref import run_graph_float
from tvm_dpu.passes.from_relax import (
    FloatSubgraph,
    FromRelaxError,
    UnsupportedCompositeError,
    build_float_xgraph,
)
from tvm_dpu.xgraph.validate import validate_graph

ARCHS = ("zcu102", "DPUCZDX8G_ISA1_B1152")
RTOL = 1e-4


# ---------------------------------------------------------------------------------------------------------
# TVM reference of one partition function
# ---------------------------------------------------------------------------------------------------------
def flatten_partition(fn: relax.Function) -> tvm.IRModule:
    """An IRModule whose "main" computes `fn` with every local composite call inlined."""
    bb = relax.BlockBuilder()
    params = [relax.Var(str(p.name), p.ty) for p in fn.params]
    env: dict = {}

    def sub(e):
        if isinstance(e, relax.Var):
            return env[e]
        if isinstance(e, relax.Tuple):
            return relax.Tuple([sub(f) for f in e.fields])
        if isinstance(e, relax.TupleGetItem):
            return relax.TupleGetItem(sub(e.tuple_value), e.index)
        return e

    def inline(f: relax.Function, args: list):
        env.update(zip(f.params, args))
        for block in f.body.blocks:
            for b in block.bindings:
                v = b.value
                if isinstance(v, relax.Function):
                    env[b.var] = v
                elif isinstance(v, relax.Call) and isinstance(v.op, relax.Var):
                    env[b.var] = inline(env[v.op], [sub(a) for a in v.args])
                elif isinstance(v, relax.Call):
                    env[b.var] = bb.emit(relax.Call(v.op, [sub(a) for a in v.args], v.attrs, v.ty_args))
                else:
                    env[b.var] = sub(v)
        return sub(f.body.body)

    with bb.function("main", params):
        bb.emit_func_output(inline(fn, params))
    return bb.get()


_EXECUTABLES: dict[int, list] = {}


def _executable(fn: relax.Function):
    """Compiled `fn`, once per structurally distinct function (both archs usually give the same partitions)."""
    bucket = _EXECUTABLES.setdefault(tvm_ffi.structural_hash(fn), [])
    for other, exe in bucket:
        if tvm_ffi.structural_equal(other, fn):
            return exe
    exe = tvm.compile(flatten_partition(fn), target="llvm")
    bucket.append((fn, exe))
    return exe


def run_tvm(fn: relax.Function, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """`fn` on the CPU."""
    vm = relax.VirtualMachine(_executable(fn), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(np.ascontiguousarray(a)) for a in inputs])
    if isinstance(out, tvm.runtime.Tensor):
        return [out.numpy()]
    return [o.numpy() for o in out]


def run_xgraph(fs: FloatSubgraph, inputs: list[np.ndarray]) -> list[np.ndarray]:
    feeds = {n: x.reshape(fs.graph.tensors[n].shape) for n, x in zip(fs.input_names, inputs)}
    res = run_graph_float(fs.graph, feeds)
    return [res[n].reshape(s) for n, s in zip(fs.output_names, fs.output_shapes)]


def check_numerics(fn: relax.Function, fs: FloatSubgraph, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    inputs = [rng.standard_normal(s).astype(np.float32) for s in fs.input_shapes]
    ref = run_tvm(fn, inputs)
    got = run_xgraph(fs, inputs)
    assert len(got) == len(ref)
    for i, (g, r) in enumerate(zip(got, ref)):
        assert g.shape == r.shape, (i, g.shape, r.shape)
        scale = float(np.abs(r).max()) or 1.0
        np.testing.assert_allclose(g, r, rtol=RTOL, atol=RTOL * scale, err_msg=f"output {i} ({fs.output_names[i]})")


# ---------------------------------------------------------------------------------------------------------
# Reduced zoo models
# ---------------------------------------------------------------------------------------------------------
@functools.cache
def _model(name: str) -> onnx.ModelProto:
    return zoo.build_model(name, reduced=True)


@functools.cache
def _partitioned(name: str, arch: str):
    """(partitioned module, report, call names per DPU call site) of a reduced zoo model."""
    mod = from_onnx(_model(name))
    result = partition_detailed(mod, arch)
    call_names = [[binding_node_names(result.infos[t]) for t in sg.tags] for sg in result.placement.subgraphs]
    return result.module, build_report(mod, result), call_names


def dpu_call_sites(pmod: tvm.IRModule) -> list[str]:
    """Names of the DPU functions in the order main calls them (= the report's subgraph ids)."""
    sites = []
    for block in pmod["main"].body.blocks:
        for b in block.bindings:
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.GlobalVar):
                sites.append(b.value.op.name_hint)
    return sites


def expected_op_type(node: onnx.NodeProto) -> str | None:
    """The XGraph op an ONNX node anchors once it runs on the DPU (None: fused into another op or free)."""
    t = node.op_type
    if t == "Conv":
        group = next((a.i for a in node.attribute if a.name == "group"), 1)
        return "depthwise_conv2d" if group > 1 else "conv2d"
    return {"Gemm": "conv2d", "Add": "eltwise_add", "MaxPool": "max_pool2d", "AveragePool": "avg_pool2d",
            "GlobalAveragePool": "avg_pool2d", "Concat": "concat", "ConvTranspose": "conv2d_transpose"}.get(t)


ZOO_DEFAULT = ("mixed_cnn", "resnet18", "vgg16", "mobilenetv2")
ZOO_SLOW = ("resnet50", "googlenet")
ZOO_CASES = [pytest.param(m, a, id=f"{m}-{a}") for m in ZOO_DEFAULT for a in ARCHS] + [
    pytest.param(m, a, id=f"{m}-{a}", marks=pytest.mark.slow) for m in ZOO_SLOW for a in ARCHS]


@pytest.mark.parametrize("name,arch", ZOO_CASES)
def test_zoo_partitions(name, arch):
    model = _model(name)
    pmod, report, call_names = _partitioned(name, arch)
    nodes = dict(zip(stable_node_names(model.graph), model.graph.node))
    sites = dpu_call_sites(pmod)
    assert sites and len(sites) == report.subgraphs == len(call_names)
    for index, fname in enumerate(sites):
        fn = pmod[fname]
        here = {n.name for n in report.dpu_nodes if n.subgraph == index}
        # From the spans alone every op names real ONNX nodes of this subgraph.
        for op in build_float_xgraph(fn, fname).graph.ops:
            assert op.source and set(op.source) <= here, (op.name, op.source)

        fs = build_float_xgraph(fn, fname, call_names[index])
        g = fs.graph
        validate_graph(g)
        assert g.name == fname
        assert all(t.dtype == "float32" and t.fix_point is None for t in g.tensors.values())
        assert fs.input_shapes == [tuple(int(v) for v in p.ty.shape.values) for p in fn.params]
        assert g.inputs == fs.input_names and g.outputs == fs.output_names
        assert len(set(op.name for op in g.ops)) == len(g.ops)
        # With the partitioner's trace, the ops are exactly the anchor nodes of the subgraph, each named once.
        for op in g.ops:
            assert op.source and set(op.source) <= here, (op.name, op.source)
        anchors = {n: expected_op_type(nodes[n]) for n in here if expected_op_type(nodes[n])}
        assert {op.source[0]: op.type for op in g.ops} == anchors
        assert sorted(op.name for op in g.ops) == sorted(anchors)

        check_numerics(fn, fs, seed=index)


def test_spans_of_shared_composites():
    """TVM shares one local function between identical composites; call_names tells them apart."""
    pmod, _, call_names = _partitioned("resnet18", "zcu102")
    (fname,) = dpu_call_sites(pmod)
    adds = [op for op in build_float_xgraph(pmod[fname], fname).graph.ops if op.type == "eltwise_add"]
    traced = [op for op in build_float_xgraph(pmod[fname], fname, call_names[0]).graph.ops
              if op.type == "eltwise_add"]
    assert [op.name for op in traced] == [f"layer{i}.{j}.add" for i in (1, 2, 3, 4) for j in (0, 1)]
    assert [op.source for op in traced] == [[f"layer{i}.{j}.add", f"layer{i}.{j}.relu"]
                                            for i in (1, 2, 3, 4) for j in (0, 1)]
    assert [op.inputs for op in adds] == [op.inputs for op in traced]  # same graph, only the names differ
    with pytest.raises(FromRelaxError, match="call names given"):
        build_float_xgraph(pmod[fname], fname, call_names[0][:-1])
    with pytest.raises(FromRelaxError, match="call names given"):
        build_float_xgraph(pmod[fname], fname, call_names[0] + [["extra"]])


def test_resnet18_structure():
    pmod, _, call_names = _partitioned("resnet18", "zcu102")
    (fname,) = dpu_call_sites(pmod)
    fs = build_float_xgraph(pmod[fname], fname, call_names[0])
    counts = Counter(op.type for op in fs.graph.ops)
    # conv1, 16 block convs, 3 downsample convs, the fc as a 1x1 conv; 8 residual adds (with their relu).
    assert counts == {"conv2d": 21, "eltwise_add": 8, "max_pool2d": 1, "avg_pool2d": 1}
    assert all(op.attrs["act"] == "relu" for op in fs.graph.ops if op.type == "eltwise_add")
    fc = fs.graph.op("fc")
    assert fs.output_names == [fc.outputs[0]] and fs.output_shapes == [(1, 10)]
    assert fs.graph.tensors[fc.outputs[0]].shape == (1, 10, 1, 1)
    assert fs.graph.tensors[fc.params["weights"]].shape[2:] == (1, 1)


def test_mixed_cnn_multi_io():
    pmod, _, _ = _partitioned("mixed_cnn", "zcu102")
    first, second = (build_float_xgraph(pmod[f], f) for f in dpu_call_sites(pmod))
    assert len(first.output_names) == 2 and first.output_shapes == [(1, 16, 16, 16)] * 2
    assert len(second.input_names) == 2 and second.output_shapes == [(1, 10)]
    leaky = first.graph.op("branch_a.conv")
    assert leaky.attrs["act"] == "leaky_relu" and leaky.attrs["alpha"] == pytest.approx(0.1)
    assert leaky.source == ["branch_a.conv", "branch_a.leaky"]
    assert second.graph.ops[0].type == "concat" and second.graph.ops[0].inputs == second.input_names


def test_vgg16_dense_on_2d_tensors():
    pmod, _, _ = _partitioned("vgg16", "zcu102")
    (fname,) = dpu_call_sites(pmod)
    fs = build_float_xgraph(pmod[fname], fname)
    fc7 = fs.graph.op("fc7")
    # fc7 reads the [1, 512] output of fc6 as the 4-D map [1, 512, 1, 1].
    assert fs.graph.tensors[fc7.inputs[0]].shape == (1, 512, 1, 1)
    assert fc7.type == "conv2d" and fc7.attrs["act"] == "relu"


# ---------------------------------------------------------------------------------------------------------
# Hand-built partition functions (exact Relax forms, edge cases)
# ---------------------------------------------------------------------------------------------------------
def T(*shape, dtype="float32"):
    return relax.TensorType(shape, dtype)


def const(rng, *shape):
    return relax.const(rng.standard_normal(shape).astype(np.float32))


def composite(name: str, in_types: list, body) -> relax.Function:
    """A local composite function: body(bb, *params) returns the result expression."""
    bb = relax.BlockBuilder()
    params = [relax.Var(f"p{i}", t) for i, t in enumerate(in_types)]
    with bb.function("f", params, attrs={"Composite": name}, private=True):
        with bb.dataflow():
            out = bb.emit_output(body(bb, *params))
        bb.emit_func_output(out)
    return bb.get()["f"]


def partition_fn(in_types: list, steps) -> relax.Function:
    """A Codegen="dpu" function; steps(call, *params) returns the result, call(composite, *args) binds one."""
    bb = relax.BlockBuilder()
    params = [relax.Var(f"in{i}", t) for i, t in enumerate(in_types)]
    with bb.function("part", params, attrs={"Codegen": "dpu"}, private=True):
        def call(comp, *args):
            return bb.emit(relax.Call(bb.emit(comp), list(args)))
        bb.emit_func_output(steps(call, *params))
    return bb.get()["part"]


def chain(*ops):
    """body for `composite`: apply ops in order, each to the previous result."""
    def body(bb, x):
        for op in ops:
            x = bb.emit(op(x))
        return x
    return body


RNG = np.random.default_rng(7)
nn = relax.op.nn


def _conv_case():
    c = composite("dpu.conv2d_bias_act", [T(1, 4, 9, 9)], chain(
        lambda x: nn.conv2d(x, const(RNG, 6, 4, 3, 3), strides=2, padding=(0, 1, 2, 1)),
        lambda x: relax.op.add(x, const(RNG, 1, 6, 1, 1)),
        lambda x: nn.relu(x)))
    return partition_fn([T(1, 4, 9, 9)], lambda call, x: call(c, x)), {"conv2d": 1}


def _depthwise_dilated_relu6_case():
    dw = composite("dpu.conv2d_bias_act", [T(1, 5, 10, 10)], chain(
        lambda x: nn.conv2d(x, const(RNG, 5, 1, 3, 3), padding=(2, 2, 2, 2), dilation=2, groups=5),
        lambda x: relax.op.add(x, const(RNG, 5, 1, 1)),
        lambda x: relax.op.clip(x, 0.0, 6.0)))
    dil = composite("dpu.conv2d", [T(1, 5, 10, 10)], chain(
        lambda x: nn.conv2d(x, const(RNG, 3, 5, 3, 3), dilation=(2, 1))))
    return partition_fn([T(1, 5, 10, 10)], lambda call, x: call(dil, call(dw, x))), \
        {"depthwise_conv2d": 1, "conv2d": 1}


def _transpose_case():
    c = composite("dpu.conv2d_transpose_bias_act", [T(1, 4, 5, 6)], chain(
        lambda x: nn.conv2d_transpose(x, const(RNG, 4, 3, 3, 3), strides=2, padding=(1, 0, 1, 1), output_padding=1),
        lambda x: relax.op.add(x, const(RNG, 1, 3, 1, 1)),
        lambda x: nn.leakyrelu(x, 0.1)))
    return partition_fn([T(1, 4, 5, 6)], lambda call, x: call(c, x)), {"conv2d_transpose": 1}


def _dense_2d_case():
    d = composite("dpu.dense_bias_reshape_act", [T(1, 12)], chain(
        lambda x: relax.op.reshape(x, (1, 12, 1, 1)),
        lambda x: nn.conv2d(x, const(RNG, 7, 12, 1, 1)),
        lambda x: relax.op.add(x, const(RNG, 1, 7, 1, 1)),
        lambda x: relax.op.reshape(x, (1, 7)),
        lambda x: nn.relu(x)))
    rs = composite("dpu.reshape", [T(1, 7)], chain(lambda x: relax.op.reshape(x, (1, 7, 1, 1))))
    return partition_fn([T(1, 12)], lambda call, x: call(rs, call(d, x))), {"conv2d": 1}


def _pools_case():
    shape = T(1, 3, 9, 9)
    pools = [
        composite("dpu.max_pool2d", [shape], chain(
            lambda x: nn.max_pool2d(x, 3, strides=2, padding=(1, 0, 0, 1), ceil_mode=True))),
        composite("dpu.avg_pool2d", [shape], chain(
            lambda x: nn.avg_pool2d(x, 2, strides=2, ceil_mode=True, count_include_pad=True))),
        composite("dpu.avg_pool2d", [shape], chain(
            lambda x: nn.avg_pool2d(x, 3, strides=2, padding=1, ceil_mode=True, count_include_pad=False))),
        composite("dpu.avg_pool2d", [shape], chain(
            lambda x: nn.avg_pool2d(x, 3, strides=1, padding=(1, 1, 0, 0), count_include_pad=True))),
        composite("dpu.avg_pool2d", [shape], chain(lambda x: nn.avg_pool2d(x, 9))),
        composite("dpu.global_avg_pool", [shape], chain(lambda x: relax.op.mean(x, [2, 3], keepdims=True))),
    ]
    return partition_fn([shape], lambda call, x: relax.Tuple([call(p, x) for p in pools])), \
        {"max_pool2d": 1, "avg_pool2d": 5}


def _add_concat_upsample_leaky_case():
    s = T(1, 3, 4, 5)
    add = composite("dpu.add_relu", [s, s], lambda bb, a, b: bb.emit(nn.relu(bb.emit(relax.op.add(a, b)))))
    add2 = composite("dpu.add", [s, s], lambda bb, a, b: relax.op.add(a, b))
    cat = composite("dpu.concat", [s, s, s], lambda bb, a, b, c: relax.op.concat([a, b, c], axis=-3))
    up1 = composite("dpu.upsample", [T(1, 9, 4, 5)], chain(lambda x: relax.op.image.resize2d(
        x, (8, 15), method="nearest_neighbor", coordinate_transformation_mode="half_pixel",
        rounding_method="round_prefer_ceil")))
    up2 = composite("dpu.upsample", [T(1, 9, 8, 15)], chain(lambda x: relax.op.image.resize2d(
        x, (16, 15), method="nearest_neighbor", coordinate_transformation_mode="asymmetric",
        rounding_method="floor")))
    leaky = composite("dpu.activation", [T(1, 9, 16, 15)], chain(lambda x: nn.leakyrelu(x, 0.2)))

    def steps(call, a, b):
        s1 = call(add, a, b)
        s2 = call(add2, s1, a)
        return relax.Tuple([s2, call(leaky, call(up2, call(up1, call(cat, s1, s2, b))))])
    return partition_fn([s, s], steps), \
        {"eltwise_add": 2, "concat": 1, "upsample_nearest": 2, "activation": 1}


HAND_CASES = {
    "conv_asym_pads": _conv_case,
    "depthwise_dilated_relu6": _depthwise_dilated_relu6_case,
    "conv_transpose_leaky": _transpose_case,
    "dense_2d": _dense_2d_case,
    "pools_ceil_mode": _pools_case,
    "add_concat_upsample_leaky": _add_concat_upsample_leaky_case,
}


@pytest.mark.parametrize("case", sorted(HAND_CASES))
def test_hand_built_numerics(case):
    fn, counts = HAND_CASES[case]()
    fs = build_float_xgraph(fn, case)
    assert Counter(op.type for op in fs.graph.ops) == counts
    check_numerics(fn, fs)


def test_attribute_mapping():
    fn, _ = _conv_case()
    (op,) = build_float_xgraph(fn, "c").graph.ops
    assert op.attrs == {"strides": [2, 2], "pads": [0, 1, 2, 1], "dilations": [1, 1], "groups": 1, "act": "relu"}

    fn, _ = _transpose_case()
    fs = build_float_xgraph(fn, "t")
    (op,) = fs.graph.ops
    assert op.attrs["output_padding"] == [1, 1] and op.attrs["pads"] == [1, 0, 1, 1]
    assert fs.graph.tensors[op.params["weights"]].shape == (4, 3, 3, 3)  # IOHW kept
    assert op.attrs["act"] == "leaky_relu" and op.attrs["alpha"] == pytest.approx(0.1)

    fn, _ = _pools_case()
    fs = build_float_xgraph(fn, "p")
    mx, avg_ceil, avg_ceil_pad, avg_pad, avg_full, mean = fs.graph.ops
    # 9 + 1 + 0 - 3 = 7 -> floor gives 4 rows, ceil 5: one extra row / column of padding at the end.
    assert mx.attrs["pads"] == [1, 0, 1, 2]
    assert avg_ceil.attrs["pads"] == [0, 0, 1, 1] and avg_ceil.attrs["count_include_pad"] is False
    assert avg_pad.attrs["pads"] == [1, 1, 0, 0] and avg_pad.attrs["count_include_pad"] is True
    assert avg_full.attrs["global"] is True and mean.attrs == {"global": True}
    assert fs.output_shapes[-1] == (1, 3, 1, 1)

    fn, _ = _dense_2d_case()
    fs = build_float_xgraph(fn, "d")
    assert fs.input_shapes == [(1, 12)] and fs.graph.tensors[fs.input_names[0]].shape == (1, 12, 1, 1)
    assert fs.output_shapes == [(1, 7, 1, 1)]
    assert fs.graph.tensors[fs.graph.ops[0].params["bias"]].shape == (7,)


def test_provenance_names_and_uniqueness():
    def named(names, expr):
        return with_nodes(expr, names)

    def conv_block(tag):
        return composite("dpu.conv2d_bias_act", [T(1, 2, 4, 4)], chain(
            lambda x: named([tag, f"{tag}_bn"], nn.conv2d(x, const(RNG, 2, 2, 1, 1))),
            lambda x: named([tag + "_bias"], relax.op.add(x, const(RNG, 1, 2, 1, 1))),
            lambda x: named(["act"], nn.relu(x))))

    rs = composite("dpu.reshape", [T(1, 2, 1, 1)], chain(lambda x: named(["flat"], relax.op.reshape(x, (1, 2)))))
    pool = composite("dpu.avg_pool2d", [T(1, 2, 4, 4)], chain(lambda x: nn.avg_pool2d(x, 4)))
    fn = partition_fn([T(1, 2, 4, 4)], lambda call, x: call(rs, call(pool, call(conv_block("c"),
                                                                                  call(conv_block("c"), x)))))
    fs = build_float_xgraph(fn, "prov")
    a, b, p = fs.graph.ops
    assert (a.name, b.name) == ("c", "c_1")
    assert a.source == ["c", "c_bn", "c_bias", "act"] and b.source == a.source
    assert p.source == [p.name, "flat"]  # no provenance on the pool call: named after its var; the reshape merged
    assert len(set(fs.graph.tensors)) == len(fs.graph.tensors) and fs.output_shapes == [(1, 2)]
    check_numerics(fn, fs)


def _single(comp, shape):
    return partition_fn([shape], lambda call, x: call(comp, x))


def test_pool_relu_becomes_pool_then_activation():
    c = composite("dpu.max_pool2d_relu", [T(1, 2, 4, 4)], chain(
        lambda x: with_nodes(nn.max_pool2d(x, 2, strides=2), ["pool7"]), lambda x: with_nodes(nn.relu(x), ["relu7"])))
    fn = _single(c, T(1, 2, 4, 4))
    fs = build_float_xgraph(fn, "g")
    pool, act = fs.graph.ops
    assert (pool.type, pool.source, act.type, act.attrs["mode"], act.source) == (
        "max_pool2d", ["pool7"], "activation", "relu", ["relu7"])
    assert act.inputs == pool.outputs
    check_numerics(fn, fs)


@pytest.mark.parametrize("act", ["relu", "relu6"])
def test_standalone_relu_becomes_activation(act):
    op = (lambda x: nn.relu(x)) if act == "relu" else (lambda x: relax.op.clip(x, 0.0, 6.0))
    c = composite("dpu.activation", [T(1, 2, 4, 4)], chain(lambda x: with_nodes(op(x), ["lonely"])))
    fn = _single(c, T(1, 2, 4, 4))
    fs = build_float_xgraph(fn, "g")
    (a,) = fs.graph.ops
    assert (a.type, a.attrs, a.source) == ("activation", {"mode": act}, ["lonely"])
    check_numerics(fn, fs)


def test_ceil_mode_avg_pool_with_padding_is_rejected():
    c = composite("dpu.avg_pool2d", [T(1, 2, 8, 8)], chain(
        lambda x: nn.avg_pool2d(x, 3, strides=2, padding=1, ceil_mode=True, count_include_pad=True)))
    with pytest.raises(UnsupportedCompositeError, match="ceil_mode avg pool"):
        build_float_xgraph(_single(c, T(1, 2, 8, 8)), "g")


def test_bad_inputs_raise_clear_errors():
    s = T(1, 4, 2, 2)
    bogus = composite("dpu.bogus", [s], chain(nn.relu))
    with pytest.raises(FromRelaxError, match=r"composite 'dpu\.bogus'.*not a DPU pattern"):
        build_float_xgraph(_single(bogus, s), "g")

    reorder = composite("dpu.reshape", [s], chain(lambda x: with_nodes(relax.op.reshape(x, (1, 16)), ["flat3"])))
    with pytest.raises(FromRelaxError, match=r"flat3.*reshape \[1, 4, 2, 2\] -> \[1, 16\] is not free"):
        build_float_xgraph(_single(reorder, s), "g")

    clip = composite("dpu.conv2d_act", [s], chain(lambda x: nn.conv2d(x, const(RNG, 4, 4, 1, 1)),
                                                   lambda x: relax.op.clip(x, 0.0, 4.0)))
    with pytest.raises(FromRelaxError, match=r"clip\(0, 4\) is not ReLU6"):
        build_float_xgraph(_single(clip, s), "g")

    half = composite("dpu.upsample", [s], chain(lambda x: relax.op.image.resize2d(
        x, (4, 4), method="nearest_neighbor", coordinate_transformation_mode="asymmetric",
        rounding_method="round")))
    with pytest.raises(FromRelaxError, match="not an integer nearest upsampling"):
        build_float_xgraph(_single(half, s), "g")

    b2 = T(2, 4, 2, 2)  # a batch: the XGraph is one image, the Relax shapes keep the batch
    conv = composite("dpu.conv2d", [b2], chain(lambda x: nn.conv2d(x, const(RNG, 4, 4, 1, 1))))
    fs = build_float_xgraph(_single(conv, b2), "g")
    assert fs.graph.tensors[fs.graph.inputs[0]].shape == (1, 4, 2, 2)
    assert [tuple(s) for s in fs.input_shapes] == [(2, 4, 2, 2)]

    h = T(1, 4, 2, 2, dtype="float16")
    conv16 = composite("dpu.conv2d", [h], chain(lambda x: nn.conv2d(x, relax.const(np.ones((4, 4, 1, 1), "float16")))))
    with pytest.raises(FromRelaxError, match="float16"):
        build_float_xgraph(_single(conv16, h), "g")

    with pytest.raises(FromRelaxError, match="expects a relax.Function"):
        build_float_xgraph("main", "g")  # type: ignore[arg-type]
