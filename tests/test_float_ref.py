"""Float reference of every XGraph op type against onnxruntime on one-op ONNX graphs (relative error 1e-5)."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvm_dpu.quant.fixpoint import LEAKY_ALPHA
from tvm_dpu.xgraph import Graph, GraphError, Op, Tensor
from tvm_dpu.xgraph.float_ref import const_value, run_graph_float

RNG = np.random.default_rng(0)


def _ort(nodes, inputs: dict[str, np.ndarray], inits: dict[str, np.ndarray], out_name: str,
         opset: int = 17) -> np.ndarray:
    graph = helper.make_graph(
        nodes, "t",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, v.shape) for n, v in inputs.items()],
        [helper.make_tensor_value_info(out_name, TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v.astype(np.float32), n) for n, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run([out_name], {n: v.astype(np.float32) for n, v in inputs.items()})[0]


def _xgraph(type_: str, inputs: dict[str, np.ndarray], out_shape, params: dict[str, np.ndarray] | None = None,
            **attrs) -> Graph:
    g = Graph("f")
    for n, v in inputs.items():
        g.add_tensor(Tensor(n, v.shape, "float32"))
        g.inputs.append(n)
    roles = {}
    for role, v in (params or {}).items():
        roles[role] = g.add_tensor(Tensor(f"p_{role}", v.shape, "float32", None, v.astype(np.float32))).name
    g.add_tensor(Tensor("y", out_shape, "float32"))
    g.add_op(Op("op", type_, list(inputs), ["y"], attrs, roles))
    g.outputs = ["y"]
    return g


def _compare(g: Graph, inputs: dict[str, np.ndarray], expected: np.ndarray) -> None:
    got = run_graph_float(g, inputs)["y"]
    assert got.shape == expected.shape
    scale = max(1.0, float(np.abs(expected).max()))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * scale)


def _x(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


ACT_NODES = {
    "none": [],
    "relu": [helper.make_node("Relu", ["c"], ["y"])],
    "relu6": [helper.make_node("Clip", ["c", "lo", "hi"], ["y"])],
    "leaky_relu": [helper.make_node("LeakyRelu", ["c"], ["y"], alpha=0.1)],
}


def _with_act(act: str, node_out_inits: dict) -> tuple[str, dict]:
    """Name the conv output 'c' and append the ONNX activation; returns (conv output name, extra inits)."""
    if act == "none":
        return "y", node_out_inits
    extra = dict(node_out_inits)
    if act == "relu6":
        extra.update(lo=np.array(0.0, np.float32), hi=np.array(6.0, np.float32))
    return "c", extra


@pytest.mark.parametrize("act", ["none", "relu", "relu6", "leaky_relu"])
@pytest.mark.parametrize("groups,strides,pads,dil", [
    (1, [1, 1], [1, 1, 1, 1], [1, 1]),
    (2, [2, 1], [0, 2, 1, 0], [1, 1]),
    (1, [1, 2], [2, 1, 2, 0], [2, 3]),
])
def test_conv2d(act, groups, strides, pads, dil):
    x = _x(2, 4, 9, 11)
    w = _x(6, 4 // groups, 3, 2)
    b = _x(6)
    out, inits = _with_act(act, {"w": w, "b": b})
    onnx_pads = [pads[0], pads[1], pads[2], pads[3]]  # ONNX: [top, left, bottom, right] as ours
    nodes = [helper.make_node("Conv", ["x", "w", "b"], [out], group=groups, strides=strides, pads=onnx_pads,
                              dilations=dil)] + ACT_NODES[act]
    exp = _ort(nodes, {"x": x}, inits, "y")
    g = _xgraph("conv2d", {"x": x}, exp.shape, {"weights": w, "bias": b}, groups=groups, strides=strides,
                pads=pads, dilations=dil, act=act, alpha=0.1 if act == "leaky_relu" else None)
    _compare(g, {"x": x}, exp)


def test_depthwise_conv2d():
    x = _x(1, 5, 8, 7)
    w = _x(5, 1, 3, 3)
    b = _x(5)
    exp = _ort([helper.make_node("Conv", ["x", "w", "b"], ["y"], group=5, strides=[2, 2], pads=[1, 1, 1, 1])],
               {"x": x}, {"w": w, "b": b}, "y")
    g = _xgraph("depthwise_conv2d", {"x": x}, exp.shape, {"weights": w, "bias": b}, strides=[2, 2],
                pads=[1, 1, 1, 1])
    _compare(g, {"x": x}, exp)


@pytest.mark.parametrize("groups,strides,pads,dil,opad", [
    (1, [2, 2], [1, 1, 1, 1], [1, 1], [1, 1]),
    (2, [3, 2], [0, 1, 2, 0], [1, 2], [0, 1]),
    (1, [1, 1], [0, 0, 0, 0], [1, 1], [0, 0]),
])
def test_conv2d_transpose(groups, strides, pads, dil, opad):
    x = _x(1, 4, 5, 6)
    w = _x(4, 6 // groups, 3, 4)
    b = _x(6)
    exp = _ort([helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], group=groups, strides=strides,
                                 pads=pads, dilations=dil, output_padding=opad)], {"x": x}, {"w": w, "b": b}, "y")
    g = _xgraph("conv2d_transpose", {"x": x}, exp.shape, {"weights": w, "bias": b}, groups=groups,
                strides=strides, pads=pads, dilations=dil, output_padding=opad)
    _compare(g, {"x": x}, exp)


@pytest.mark.parametrize("layout", ["flat", "4d"])
def test_dense(layout):
    x = _x(3, 4, 2, 3)
    w = _x(7, 24)
    b = _x(7)
    y = _ort([helper.make_node("Flatten", ["x"], ["f"]),
              helper.make_node("Gemm", ["f", "w", "b"], ["c"], transB=1),
              helper.make_node("Relu", ["c"], ["y"])], {"x": x}, {"w": w, "b": b}, "y")
    exp = y.reshape(3, 7, 1, 1)
    wx = w if layout == "flat" else w.reshape(7, 4, 2, 3)
    g = _xgraph("dense", {"x": x}, (3, 7, 1, 1), {"weights": wx, "bias": b}, act="relu")
    _compare(g, {"x": x}, exp)


@pytest.mark.parametrize("kernel,strides,pads", [([3, 3], [2, 2], [1, 1, 1, 1]), ([2, 3], [1, 2], [0, 1, 1, 0])])
def test_max_pool(kernel, strides, pads):
    x = _x(1, 3, 9, 8) - 3.0  # all-negative windows would expose a zero padding value
    exp = _ort([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=kernel, strides=strides, pads=pads)],
               {"x": x}, {}, "y")
    g = _xgraph("max_pool2d", {"x": x}, exp.shape, kernel=kernel, strides=strides, pads=pads)
    _compare(g, {"x": x}, exp)


@pytest.mark.parametrize("cip", [True, False])
@pytest.mark.parametrize("kernel,strides,pads", [([3, 3], [2, 2], [1, 1, 1, 1]), ([2, 3], [1, 1], [1, 0, 0, 2]),
                                                 ([2, 2], [2, 2], [0, 0, 0, 0])])
def test_avg_pool(cip, kernel, strides, pads):
    x = _x(2, 3, 7, 8)
    exp = _ort([helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=kernel, strides=strides, pads=pads,
                                 count_include_pad=int(cip))], {"x": x}, {}, "y")
    g = _xgraph("avg_pool2d", {"x": x}, exp.shape, kernel=kernel, strides=strides, pads=pads,
                count_include_pad=cip)
    _compare(g, {"x": x}, exp)


def test_global_avg_pool():
    x = _x(1, 5, 6, 7)
    exp = _ort([helper.make_node("GlobalAveragePool", ["x"], ["y"])], {"x": x}, {}, "y")
    g = _xgraph("avg_pool2d", {"x": x}, exp.shape, **{"global": True})
    _compare(g, {"x": x}, exp)


@pytest.mark.parametrize("n", [2, 3])
def test_eltwise_add_relu(n):
    xs = {f"x{i}": _x(1, 4, 5, 5) for i in range(n)}
    nodes, acc = [], "x0"
    for i in range(1, n):
        nodes.append(helper.make_node("Add", [acc, f"x{i}"], [f"s{i}"]))
        acc = f"s{i}"
    nodes.append(helper.make_node("Relu", [acc], ["y"]))
    exp = _ort(nodes, xs, {}, "y")
    _compare(_xgraph("eltwise_add", xs, exp.shape, act="relu"), xs, exp)


def test_eltwise_mul():
    xs = {"a": _x(1, 4, 5, 5), "b": _x(1, 4, 5, 5)}
    exp = _ort([helper.make_node("Mul", ["a", "b"], ["y"])], xs, {}, "y")
    _compare(_xgraph("eltwise_mul", xs, exp.shape), xs, exp)


@pytest.mark.parametrize("axis", [1, 2, 3])
def test_concat(axis):
    xs = {"a": _x(1, 3, 4, 5), "b": _x(1, 3, 4, 5), "c": _x(1, 3, 4, 5)}
    exp = _ort([helper.make_node("Concat", ["a", "b", "c"], ["y"], axis=axis)], xs, {}, "y")
    _compare(_xgraph("concat", xs, exp.shape, axis=axis), xs, exp)


def test_upsample_nearest():
    x = _x(1, 3, 4, 5)
    scales = np.array([1, 1, 2, 3], np.float32)
    exp = _ort([helper.make_node("Resize", ["x", "", "s"], ["y"], mode="nearest",
                                 coordinate_transformation_mode="asymmetric", nearest_mode="floor")],
               {"x": x}, {"s": scales}, "y")
    _compare(_xgraph("upsample_nearest", {"x": x}, exp.shape, scale=[2, 3]), {"x": x}, exp)


def test_activation_leaky_prelu_hard_sigmoid():
    x = _x(1, 4, 5, 6) * 4
    exp = _ort([helper.make_node("LeakyRelu", ["x"], ["y"], alpha=0.2)], {"x": x}, {}, "y")
    _compare(_xgraph("activation", {"x": x}, exp.shape, mode="leaky_relu", alpha=0.2), {"x": x}, exp)

    slope = _x(4)
    exp = _ort([helper.make_node("PRelu", ["x", "a"], ["y"])], {"x": x}, {"a": slope.reshape(4, 1, 1)}, "y")
    _compare(_xgraph("activation", {"x": x}, exp.shape, {"alpha": slope}, mode="prelu"), {"x": x}, exp)

    exp = _ort([helper.make_node("HardSigmoid", ["x"], ["y"], alpha=1 / 6, beta=0.5)], {"x": x}, {}, "y")
    _compare(_xgraph("activation", {"x": x}, exp.shape, mode="hard_sigmoid"), {"x": x}, exp)


def test_multi_op_graph_and_keep_all():
    """conv -> maxpool -> concat with a branch, batch 3 although the graph declares 1."""
    x = _x(3, 2, 6, 6)
    w = _x(4, 2, 3, 3)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("MaxPool", ["x"], ["q"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Concat", ["p", "q"], ["y"], axis=1)]
    exp = _ort(nodes, {"x": x}, {"w": w}, "y")
    g = Graph("m")
    g.add_tensor(Tensor("x", (1, 2, 6, 6), "float32"))
    g.inputs = ["x"]
    g.add_tensor(Tensor("w", w.shape, "float32", None, w))
    for n, s in {"r": (1, 4, 6, 6), "p": (1, 4, 3, 3), "q": (1, 2, 3, 3), "y": (1, 6, 3, 3)}.items():
        g.add_tensor(Tensor(n, s, "float32"))
    g.add_op(Op("conv", "conv2d", ["x"], ["r"], {"pads": [1, 1, 1, 1], "act": "relu"}, {"weights": "w"}))
    g.add_op(Op("p1", "max_pool2d", ["r"], ["p"], {"kernel": [2, 2], "strides": [2, 2]}))
    g.add_op(Op("p2", "max_pool2d", ["x"], ["q"], {"kernel": [2, 2], "strides": [2, 2]}))
    g.add_op(Op("cat", "concat", ["p", "q"], ["y"]))
    g.outputs = ["y"]
    _compare(g, {"x": x}, exp)
    env = run_graph_float(g, {"x": x}, keep_all=True)
    assert set(env) == {"x", "r", "p", "q", "y"}
    assert np.all(env["r"] >= 0)


def test_int8_constants_are_dequantized_and_alpha_none_is_dpu_slope():
    t = Tensor("w", (3,), "int8", 5, np.array([-128, 1, 64], np.int8))
    np.testing.assert_array_equal(const_value(t), np.array([-4.0, 1 / 32, 2.0]))
    x = np.array([-2.0, 3.0]).reshape(1, 2, 1, 1)
    g = _xgraph("activation", {"x": x}, (1, 2, 1, 1), mode="leaky_relu")
    np.testing.assert_array_equal(run_graph_float(g, {"x": x})["y"].ravel(), [-2 * LEAKY_ALPHA, 3.0])


def test_bad_feeds_are_named():
    x = _x(1, 3, 4, 5)
    g = _xgraph("max_pool2d", {"x": x}, (1, 3, 4, 5), kernel=[1, 1])
    with pytest.raises(GraphError, match="no feed for input"):
        run_graph_float(g, {})
    with pytest.raises(GraphError, match="feed 'x' has shape"):
        run_graph_float(g, {"x": x[:, :2]})


# -- bit-exactness of the fast paths --------------------------------------------------------------------------
def _einsum_conv(x: np.ndarray, w: np.ndarray, win, groups: int, chunk: int) -> np.ndarray:
    """The float reference's former conv: windows and weights contracted by numpy's einsum, band by band."""
    from tvm_dpu.xgraph.golden_conv import windows

    n, c = x.shape[:2]
    o, cg, kh, kw = w.shape
    v = windows(x, win)
    ho, wo = v.shape[2], v.shape[3]
    wg = w.reshape(groups, o // groups, cg, kh, kw)
    rows = max(1, chunk // max(1, n * wo * c * kh * kw))
    out = np.empty((n, o, ho, wo))
    for lo in range(0, ho, rows):
        band = v[:, :, lo:lo + rows].reshape(n, groups, cg, -1, wo, kh, kw)
        out[:, :, lo:lo + rows] = np.einsum("ngchwij,gocij->ngohw", band, wg, optimize=True).reshape(
            n, o, band.shape[3], wo)
    return out


@pytest.mark.parametrize("seed", range(2))
def test_conv_gemm_is_bit_for_bit_the_einsum(monkeypatch, seed):
    # Calibration fix points (hence artifacts) depend on the float reference's low-order bits: the wm @ cols
    # product must be the very dgemm numpy's einsum made of each band (same shapes, operands and reduction order),
    # over batch sizes, kernels, strides, dilations, pads, band splits and non-contiguous weights.
    import tvm_dpu.xgraph.float_ref as fr
    from tvm_dpu.xgraph.ops import Window

    rng = np.random.default_rng(seed)
    for trial in range(30):
        n, c, o = int(rng.integers(1, 4)), int(rng.integers(1, 40)), int(rng.integers(1, 40))
        k = int(rng.choice([1, 2, 3, 5, 7]))
        s, d, p = int(rng.integers(1, 3)), int(rng.integers(1, 3)) if k > 1 else 1, int(rng.integers(0, k))
        lo = max(1, (k - 1) * d + 1 - 2 * p)
        x = rng.standard_normal((n, c, int(rng.integers(lo, 24)), int(rng.integers(lo, 24))))
        w = rng.standard_normal((o, c, k, k))
        if trial % 4 == 0:
            w = np.ascontiguousarray(w[:, :, ::-1, ::-1])[:, :, ::-1, ::-1]
        if trial % 3 == 0:
            x = np.maximum(x, 0.0)
        chunk = int(rng.choice([1 << 22, 2000, 8000]))
        monkeypatch.setattr(fr, "_CONV_CHUNK", chunk)
        win = Window(k, k, s, s, d, d, (p, p, p, p))
        got = fr._conv(x, w, win, 1)
        want = _einsum_conv(x, w, win, 1, chunk)
        assert got.shape == want.shape
        assert np.array_equal(got, want), (n, c, o, k, s, d, p, x.shape, chunk)


def test_max_pool_running_maximum_is_the_window_reduction():
    from tvm_dpu.xgraph.golden_conv import windows
    from tvm_dpu.xgraph.ops import Window

    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 11, 10))
    x[0, 1, 4, 4] = np.nan
    for k, s, p in ((3, 2, 1), (2, 2, 0), (3, 1, 1), (5, 3, 2)):
        win = Window(k, k, s, s, 1, 1, (p, p, p, p))
        g = _xgraph("max_pool2d", {"x": x}, (2, 3) + win.out_hw(11, 10), kernel=[k, k], strides=[s, s],
                    pads=[p] * 4)
        got = run_graph_float(g, {"x": x})["y"]
        want = windows(x, win, -np.inf).max(axis=(-2, -1))
        np.testing.assert_array_equal(got, want)  # NaN where a window holds it, as the reduction gives
        assert np.isnan(got).any()
