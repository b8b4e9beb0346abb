"""Golden reference vs independent float computations (dequantize, compute in float64 / onnxruntime, requantize
with dpu_round), plus hand-computed cases for rounding ties, saturation, relu6, leaky, avg-pool factors and
element-wise ops with different fix_points.

Exact agreement is required wherever the DPU arithmetic is exact (all conv-class ops, max pool, power-of-two
avg pools, element-wise ops whose reads do not truncate, concat, upsample, leaky / prelu). Where the hardware
approximates (avg-pool multipliers such as 7/64 for 1/9, hard-sigmoid's 2731/2**14, truncating ELEW reads),
the test states the bound.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_dpu.errors import QuantizationError
from tvm_dpu.quant import rules
from tvm_dpu.quant.fixpoint import dpu_round
from tvm_dpu.xgraph import Graph, GraphError, Op, Tensor, infer_shape, run_graph, run_op

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


# -- helpers ---------------------------------------------------------------------------------------
def i8(rng: np.random.Generator, shape, lo: int = -128, hi: int = 127) -> np.ndarray:
    return rng.integers(lo, hi + 1, size=shape).astype(np.int8)


def single(op_type: str, inputs, fp_out: int, attrs=None, params=None):
    """A one-op graph: inputs = [(int8 array, fix_point)], params = {role: (array, fix_point)}."""
    g = Graph("t")
    feeds, names = {}, []
    for i, (x, fp) in enumerate(inputs):
        name = f"x{i}"
        g.add_tensor(Tensor(name, x.shape, "int8", fp))
        g.inputs.append(name)
        feeds[name] = x
        names.append(name)
    roles = {}
    for role, (a, fp) in (params or {}).items():
        g.add_tensor(Tensor(f"p_{role}", a.shape, str(a.dtype), fp, a))
        roles[role] = f"p_{role}"
    op = Op("op", op_type, names, ["y"], dict(attrs or {}), roles)
    g.add_tensor(Tensor("y", (1, 1, 1, 1), "int8", fp_out))
    g.add_op(op)
    g.tensors["y"].shape = infer_shape(op, g)
    g.outputs = ["y"]
    return g, feeds


def run1(*args, **kw) -> np.ndarray:
    g, feeds = single(*args, **kw)
    return run_graph(g, feeds)["y"]


def deq(q: np.ndarray, fp: int) -> np.ndarray:
    return q.astype(np.float64) * 2.0 ** -fp


def act_float(t: np.ndarray, act: str) -> np.ndarray:
    if act == "relu":
        return np.maximum(t, 0)
    if act == "relu6":
        return np.clip(t, 0, 96)
    if act == "leaky_relu":
        return np.where(t < 0, t * 26 / 256, t)
    return t


def ort_run(node, inputs: dict[str, np.ndarray], inits: dict[str, np.ndarray]) -> np.ndarray:
    """Run one ONNX node in float32 (all values here are dyadic and small, so float32 is exact)."""
    g = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape) for k, v in inputs.items()],
        [helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {k: v.astype(np.float32) for k, v in inputs.items()})[0].astype(np.float64)


def naive_conv(x: np.ndarray, w: np.ndarray, stride, pads, dil, groups) -> np.ndarray:
    """Direct float64 loop convolution, NCHW / OIHW, written independently of the golden's einsum."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    pt, pl, pb, pr = pads
    xp = np.zeros((n, c, h + pt + pb, wd + pl + pr))
    xp[:, :, pt:pt + h, pl:pl + wd] = x
    ho = (h + pt + pb - dil[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (wd + pl + pr - dil[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, o, ho, wo))
    og = o // groups
    for oc in range(o):
        g = oc // og
        for i in range(ho):
            for j in range(wo):
                for a in range(kh):
                    for b in range(kw):
                        patch = xp[:, g * cg:(g + 1) * cg, i * stride[0] + a * dil[0], j * stride[1] + b * dil[1]]
                        out[:, oc, i, j] += patch @ w[oc, :, a, b]
    return out


def conv_reference(x, fp_in, w, fp_w, b, fp_b, fp_out, act, **geom) -> np.ndarray:
    y = naive_conv(deq(x, fp_in), deq(w, fp_w), geom.get("strides", (1, 1)), geom.get("pads", (0, 0, 0, 0)),
                   geom.get("dilations", (1, 1)), geom.get("groups", 1))
    if b is not None:
        y = y + deq(b, fp_b)[None, :, None, None]
    return dpu_round(act_float(y * 2.0 ** fp_out, act))


# -- conv family -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("act", ["none", "relu", "leaky_relu"])
def test_conv2d_matches_onnxruntime(act):
    rng = np.random.default_rng(1)
    x, w, b = i8(rng, (2, 3, 9, 8)), i8(rng, (5, 3, 3, 3)), i8(rng, (5,))
    attrs = {"strides": [2, 1], "pads": [1, 1, 1, 0], "act": act}
    y = run1("conv2d", [(x, 5)], 3, attrs, {"weights": (w, 7), "bias": (b, 6)})
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], strides=[2, 1], pads=[1, 1, 1, 0])
    yf = ort_run(node, {"x": deq(x, 5)}, {"w": deq(w, 7), "b": deq(b, 6)})
    np.testing.assert_array_equal(y, dpu_round(act_float(yf * 2.0 ** 3, act)))


def test_conv2d_shift_zero_is_plain_integer_conv():
    rng = np.random.default_rng(2)
    x, w = i8(rng, (1, 4, 5, 5), -3, 3), i8(rng, (2, 4, 3, 3), -2, 2)  # |acc| <= 216: no saturation
    y = run1("conv2d", [(x, 0)], 0, {"pads": [1, 1, 1, 1]}, {"weights": (w, 0)})
    ref = naive_conv(x.astype(np.float64), w.astype(np.float64), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    assert np.abs(ref).max() <= 127
    np.testing.assert_array_equal(y, ref.astype(np.int8))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), k=st.sampled_from([(1, 1), (3, 3), (2, 3), (1, 5)]), s=st.integers(1, 3),
       d=st.integers(1, 2), groups=st.sampled_from([1, 2]),
       act=st.sampled_from(["none", "relu", "relu6", "leaky_relu"]), fp_in=st.integers(0, 7),
       fp_w=st.integers(0, 7), bias=st.booleans())
def test_conv2d_random_geometry_exact(seed, k, s, d, groups, act, fp_in, fp_w, bias):
    """Random shapes, strides, dilations, pads, groups and valid fix_points: bit-exact vs float64."""
    rng = np.random.default_rng(seed)
    acc_fp = fp_in + fp_w
    fp_out = 4 if act == "relu6" and acc_fp >= 4 else int(rng.integers(max(0, acc_fp - 16), acc_fp + 1))
    if act == "relu6" and acc_fp < 4:
        act = "relu"
    fp_b = int(rng.integers(max(0, acc_fp - 19), acc_fp + 1))
    c = o = 2 * groups
    h = int(rng.integers(d * (k[0] - 1) + 1, d * (k[0] - 1) + 6))
    wd = int(rng.integers(d * (k[1] - 1) + 1, d * (k[1] - 1) + 6))
    pads = [int(v) for v in rng.integers(0, 3, 4)]
    x, w, b = i8(rng, (1, c, h, wd)), i8(rng, (o, c // groups, *k)), i8(rng, (o,))
    attrs = {"strides": [s, s], "pads": pads, "dilations": [d, d], "groups": groups, "act": act}
    params = {"weights": (w, fp_w)}
    if bias:
        params["bias"] = (b, fp_b)
    y = run1("conv2d", [(x, fp_in)], fp_out, attrs, params)
    ref = conv_reference(x, fp_in, w, fp_w, b if bias else None, fp_b, fp_out, act, strides=(s, s), pads=pads,
                         dilations=(d, d), groups=groups)
    np.testing.assert_array_equal(y, ref)


def naive_conv_transpose(x, w, stride, pads, dil, out_pad, groups):
    """Scatter definition: every input pixel adds x * w at (i*s - pad + a*d); independent of zero insertion."""
    n, c, h, wd = x.shape
    _, og, kh, kw = w.shape
    cg = c // groups
    ho = (h - 1) * stride[0] - pads[0] - pads[2] + dil[0] * (kh - 1) + out_pad[0] + 1
    wo = (wd - 1) * stride[1] - pads[1] - pads[3] + dil[1] * (kw - 1) + out_pad[1] + 1
    out = np.zeros((n, og * groups, ho, wo))
    for ci in range(c):
        g = ci // cg
        for i in range(h):
            for j in range(wd):
                for a in range(kh):
                    for b in range(kw):
                        r, q = i * stride[0] - pads[0] + a * dil[0], j * stride[1] - pads[1] + b * dil[1]
                        if 0 <= r < ho and 0 <= q < wo:
                            out[:, g * og:(g + 1) * og, r, q] += x[:, ci, i, j, None] * w[ci, :, a, b]
    return out


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), k=st.sampled_from([(1, 1), (2, 2), (3, 3), (4, 3)]), s=st.integers(1, 3),
       d=st.integers(1, 2), groups=st.sampled_from([1, 2]), act=st.sampled_from(["none", "relu", "leaky_relu"]))
def test_conv2d_transpose_random_exact(seed, k, s, d, groups, act):
    rng = np.random.default_rng(seed)
    pads = [int(rng.integers(0, d * (k[i % 2] - 1) // 2 + 1)) for i in range(4)]  # output stays non-empty
    out_pad = [int(rng.integers(0, s)), int(rng.integers(0, s))]
    x, w = i8(rng, (1, 2 * groups, 3, 4)), i8(rng, (2 * groups, 2, *k))
    b = i8(rng, (2 * groups,))
    geom = {"strides": [s, s], "pads": pads, "dilations": [d, d], "output_padding": out_pad, "groups": groups}
    g, feeds = single("conv2d_transpose", [(x, 4)], 3, dict(geom, act=act), {"weights": (w, 6), "bias": (b, 5)})
    y = run_graph(g, feeds)["y"]
    yf = naive_conv_transpose(deq(x, 4), deq(w, 6), (s, s), pads, (d, d), out_pad, groups)
    yf = yf + deq(b, 5)[None, :, None, None]
    np.testing.assert_array_equal(y, dpu_round(act_float(yf * 8, act)))


def test_depthwise_conv_exact():
    rng = np.random.default_rng(3)
    x, w, b = i8(rng, (1, 6, 7, 7)), i8(rng, (6, 1, 3, 3)), i8(rng, (6,))
    y = run1("depthwise_conv2d", [(x, 4)], 4, {"pads": [1, 1, 1, 1], "strides": [2, 2], "act": "relu6"},
             {"weights": (w, 6), "bias": (b, 5)})
    ref = conv_reference(x, 4, w, 6, b, 5, 4, "relu6", pads=(1, 1, 1, 1), strides=(2, 2), groups=6)
    np.testing.assert_array_equal(y, ref)


def test_depthwise_leaky_rejected_on_alu():
    rng = np.random.default_rng(3)
    x, w = i8(rng, (1, 2, 3, 3)), i8(rng, (2, 1, 3, 3))
    with pytest.raises(QuantizationError, match="'op'.*leaky_relu.*alu"):
        run1("depthwise_conv2d", [(x, 4)], 4, {"act": "leaky_relu"}, {"weights": (w, 6)})


@pytest.mark.parametrize("geom", [
    dict(strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1], groups=1),
    dict(strides=[3, 2], pads=[0, 2, 1, 0], output_padding=[0, 1], groups=1, dilations=[1, 2]),
    dict(strides=[2, 2], pads=[0, 0, 0, 0], output_padding=[0, 0], groups=2),
])
def test_conv2d_transpose_matches_onnxruntime(geom):
    rng = np.random.default_rng(4)
    x, w, b = i8(rng, (1, 4, 4, 5)), i8(rng, (4, 3, 3, 3)), i8(rng, (3 * geom["groups"],))
    y = run1("conv2d_transpose", [(x, 3)], 2, dict(geom, act="relu"), {"weights": (w, 6), "bias": (b, 4)})
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=geom["strides"], pads=[
        geom["pads"][0], geom["pads"][1], geom["pads"][2], geom["pads"][3]], output_padding=geom["output_padding"],
        group=geom["groups"], dilations=geom.get("dilations", [1, 1]))
    yf = ort_run(node, {"x": deq(x, 3)}, {"w": deq(w, 6), "b": deq(b, 4)})
    assert yf.shape == y.shape
    np.testing.assert_array_equal(y, dpu_round(np.maximum(yf * 4, 0)))


@pytest.mark.parametrize("wshape", [(7, 24), (7, 6, 2, 2)])
def test_dense_is_conv_over_whole_input(wshape):
    rng = np.random.default_rng(5)
    x, w, b = i8(rng, (2, 6, 2, 2)), i8(rng, wshape), i8(rng, (7,))
    y = run1("dense", [(x, 6)], 1, {"act": "none"}, {"weights": (w, 7), "bias": (b, 5)})
    ref = deq(x, 6).reshape(2, -1) @ deq(w, 7).reshape(7, -1).T + deq(b, 5)
    np.testing.assert_array_equal(y.reshape(2, 7), dpu_round(ref * 2.0))


# -- hand-computed conv cases ----------------------------------------------------------------------------
def conv1x1(xvals, fp_in, fp_out, act="none", wval=1, fp_w=0, bias=None, fp_b=0):
    x = np.array(xvals, dtype=np.int8).reshape(1, 1, 1, -1)
    params = {"weights": (np.array([[[[wval]]]], dtype=np.int8), fp_w)}
    if bias is not None:
        params["bias"] = (np.array([bias], dtype=np.int8), fp_b)
    return run1("conv2d", [(x, fp_in)], fp_out, {"act": act}, params).ravel().tolist()


def test_rounding_ties_go_up():
    # fp_in 1 -> fp_out 0: x / 2. -2.5 -> -2, 2.5 -> 3, -1.5 -> -1, 1.5 -> 2, -0.5 -> 0, 0.5 -> 1
    assert conv1x1([-5, 5, -3, 3, -1, 1], 1, 0) == [-2, 3, -1, 2, 0, 1]


def test_saturation():
    assert conv1x1([127, -128, 100], 0, 0, wval=127) == [127, -128, 127]
    assert conv1x1([-128], 0, 0, wval=-128) == [127]


def test_bias_alignment():
    # acc = 3 (fp 2+0), bias 5 at fp 1 -> 5 * 2**1 = 10 at fp 2; (3 + 10) / 2**2 = 3.25 -> 3
    assert conv1x1([3], 2, 0, bias=5, fp_b=1) == [3]
    # one fraction bit finer than the accumulator: the datapath's 2*acc + bias, (2*3 + 5) / 2**3 = 1.375 -> 1;
    # ties round up: acc 1, bias -1 at fp 3: (2 - 1) / 2**3 = 0.125 -> 0, bias 3: (2 + 3) / 8 -> 1 (0.625)
    assert conv1x1([3], 2, 0, bias=5, fp_b=3) == [1]
    assert conv1x1([1, 2], 2, 0, bias=-1, fp_b=3) == [0, 0]
    assert conv1x1([2], 2, 0, bias=-4, fp_b=3) == [0]  # (4 - 4) / 8
    assert conv1x1([3], 2, 1, bias=-2, fp_b=3) == [1]  # (6 - 2) / 4 = 1.0
    assert conv1x1([3], 2, 1, bias=-4, fp_b=3) == [1]  # (6 - 4) / 4 = 0.5 -> 1 (tie up)
    # two bits finer: beyond the ISA field (>= 0)
    with pytest.raises(QuantizationError, match="bias shift"):
        conv1x1([3], 2, 0, bias=5, fp_b=4)


def test_relu6_clamps_at_96():
    assert conv1x1([100, 96, 95, -3, 127], 4, 4, act="relu6") == [96, 96, 95, 0, 96]
    with pytest.raises(QuantizationError, match="relu6"):
        conv1x1([1], 5, 5, act="relu6")


def test_leaky_negative_values_single_rounding():
    # t = x / 4 (fp_in 2 -> fp_out 0); leaky on the unrounded t, then one rounding.
    xs = list(range(-128, 128))
    y = conv1x1(xs, 2, 0, act="leaky_relu")
    exact = [int(np.floor((x / 4 * 26 / 256 if x < 0 else x / 4) + 0.5)) for x in xs]
    assert y == exact
    # integer formula of isa1-semantics 6.4 with N = sc + 1 = 3 and V = 2 * acc
    integer = [((26 * 2 * x + (1 << 10)) >> 11) if x < 0 else ((2 * x + 4) >> 3) for x in xs]
    assert y == integer
    # rounding before the slope would differ somewhere: the golden must not do that
    double = [int(np.floor(np.floor(x / 4 + 0.5) * 26 / 256 + 0.5)) if x < 0 else e for x, e in zip(xs, exact)]
    assert double != y
    # hand value: x = -128 -> t = -32 -> -3.25 -> -3
    assert conv1x1([-128], 2, 0, act="leaky_relu") == [-3]


# -- pooling --------------------------------------------------------------------------------------------
def test_maxpool_matches_onnxruntime_and_pads_with_min():
    rng = np.random.default_rng(6)
    x = i8(rng, (1, 3, 7, 7))
    x[0, 0] = -128  # an all-(-128) channel: padding must not win with 0
    for fp_out, shift in ((5, 0), (3, -2), (7, 2)):
        y = run1("max_pool2d", [(x, 5)], fp_out, {"kernel": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]})
        node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
        yf = ort_run(node, {"x": deq(x, 5)}, {})
        np.testing.assert_array_equal(y, dpu_round(yf * 2.0 ** fp_out))
    assert (run1("max_pool2d", [(x, 5)], 5, {"kernel": [3, 3], "pads": [1, 1, 1, 1]})[0, 0] == -128).all()


@pytest.mark.parametrize("k", [2, 4])
def test_avgpool_power_of_two_exact(k):
    rng = np.random.default_rng(7)
    x = i8(rng, (1, 3, 8, 8))
    y = run1("avg_pool2d", [(x, 4)], 4, {"kernel": [k, k], "strides": [k, k]})
    node = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[k, k], strides=[k, k])
    yf = ort_run(node, {"x": deq(x, 4)}, {})
    np.testing.assert_array_equal(y, dpu_round(yf * 16))


@pytest.mark.parametrize("k", [3, 5, 7, 14])
def test_avgpool_factor_vs_true_mean(k):
    rng = np.random.default_rng(8)
    x = i8(rng, (1, 4, k + 2, k + 2))
    attrs = {"kernel": [k, k], "pads": [1, 1, 1, 1], "count_include_pad": True}
    y = run1("avg_pool2d", [(x, 3)], 3, attrs)
    mf, s = rules.avgpool_params("p", k, k, 3, 3).multi_factor, rules.avgpool_factor(k, k)[1]
    node = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[k, k], pads=[1, 1, 1, 1],
                            count_include_pad=1)
    mean = ort_run(node, {"x": deq(x, 3)}, {})
    # exactly the DPU formula: window sum * mf / 2**s, one rounding (the sum is an integer at fp 3; ORT's
    # float32 mean is only rounded back to it)
    window_sum = np.rint(mean * k * k * 8)
    np.testing.assert_array_equal(y, dpu_round(window_sum * mf / 2.0 ** s))
    # against the true mean the error is bounded by |sum| * |mf/2**s - 1/k^2| + rounding
    bound = (k * k * 128) * abs(mf / 2 ** s - 1 / (k * k)) + 1
    assert np.abs(y.astype(np.float64) - dpu_round(mean * 8)).max() <= bound


def naive_pool(x, k, stride, pads, kind):
    n, c, h, wd = x.shape
    fill = -np.inf if kind == "max" else 0.0
    xp = np.full((n, c, h + pads[0] + pads[2], wd + pads[1] + pads[3]), fill)
    xp[:, :, pads[0]:pads[0] + h, pads[1]:pads[1] + wd] = x
    ho, wo = (xp.shape[2] - k[0]) // stride[0] + 1, (xp.shape[3] - k[1]) // stride[1] + 1
    out = np.zeros((n, c, ho, wo))
    for i in range(ho):
        for j in range(wo):
            win = xp[:, :, i * stride[0]:i * stride[0] + k[0], j * stride[1]:j * stride[1] + k[1]]
            out[:, :, i, j] = win.max(axis=(2, 3)) if kind == "max" else win.sum(axis=(2, 3))
    return out


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), k=st.sampled_from([(1, 1), (2, 2), (3, 3), (2, 3), (5, 5)]),
       s=st.integers(1, 3), fp_in=st.integers(-2, 8), dfp=st.integers(-3, 3))
def test_pools_random_exact(seed, k, s, fp_in, dfp):
    """Max pool is exact; avg pool equals window sum * multi_factor / 2**s with one rounding."""
    rng = np.random.default_rng(seed)
    pads = [int(rng.integers(0, k[i % 2])) for i in range(4)]
    x = i8(rng, (1, 3, k[0] + int(rng.integers(0, 5)), k[1] + int(rng.integers(0, 5))))
    attrs = {"kernel": list(k), "strides": [s, s], "pads": pads}
    fp_out = fp_in + dfp
    y = run1("max_pool2d", [(x, fp_in)], fp_out, attrs)
    np.testing.assert_array_equal(y, dpu_round(naive_pool(deq(x, fp_in), k, (s, s), pads, "max") * 2.0 ** fp_out))
    y = run1("avg_pool2d", [(x, fp_in)], fp_out, attrs)
    mf, sh = rules.avgpool_factor(*k)
    total = naive_pool(x.astype(np.float64), k, (s, s), pads, "sum")
    np.testing.assert_array_equal(y, dpu_round(total * mf / 2.0 ** sh * 2.0 ** dfp))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 4), fps=st.lists(st.integers(-2, 9), min_size=4, max_size=4),
       dout=st.integers(-4, 2), act=st.sampled_from(["none", "relu"]))
def test_eltwise_add_random(seed, n, fps, dout, act):
    """Exact when the rules say so; otherwise within 1 LSB when fp_out <= min(fp_in) (documented bound)."""
    rng = np.random.default_rng(seed)
    fps = fps[:n]
    fp_out = min(fps) + dout
    xs = [i8(rng, (1, 2, 3, 5)) for _ in range(n)]
    q = rules.eltwise_params("e", "add", fps, fp_out, act)
    y = run1("eltwise_add", [(x, f) for x, f in zip(xs, fps)], fp_out, {"act": act}).astype(np.int64)
    ref = dpu_round(act_float(sum(deq(x, f) for x, f in zip(xs, fps)) * 2.0 ** fp_out, act)).astype(np.int64)
    if q.exact:
        np.testing.assert_array_equal(y, ref)
    elif fp_out <= min(fps):
        assert np.abs(y - ref).max() <= 1
    else:
        assert np.abs(y - ref).max() <= n * 2 ** (q.write_exp - 2) + 1


def test_avgpool_hand_values():
    def pool(vals, k):
        x = np.array(vals, dtype=np.int8).reshape(1, 1, k, k)
        return int(run1("avg_pool2d", [(x, 0)], 0, {"kernel": [k, k]}).ravel()[0])

    assert pool([1, 2, 3, 4], 2) == 3  # 10/4 = 2.5 -> 3
    assert pool([-1, -2, -3, -4], 2) == -2  # -2.5 -> -2
    assert pool([1] * 9, 3) == 1  # 9 * 7/64 = 0.98 -> 1
    assert pool([127] * 9, 3) == 125  # 1143 * 7/64 = 125.02: the DPU's 7/64 is below 1/9
    assert pool([100] * 49, 7) == 100  # 4900 * 21/1024 = 100.49
    assert pool([127] * 49, 7) == 127  # 127.6 -> 128 saturates
    assert pool([-128] * 49, 7) == -128  # -128.6 -> -129 saturates


def test_global_avgpool_and_float32_product():
    rng = np.random.default_rng(9)
    x = i8(rng, (1, 2, 6, 6))
    y = run1("avg_pool2d", [(x, 2)], 2, {"global": True})
    mf, s = rules.avgpool_factor(6, 6)
    ref = dpu_round(x.astype(np.int64).sum(axis=(2, 3), keepdims=True) * mf / 2.0 ** s)
    np.testing.assert_array_equal(y, ref)
    # 120x120 window, multi_factor 73 / 2**20: the window sum 265735 gives an exact product 19398655, just below
    # the tie 18.5 * 2**20, but the ALU multiplies in float32, which rounds it up to 19398656 = the tie -> 19.
    q = rules.avgpool_params("p", 120, 120, 0, 0)
    assert (q.multi_factor, q.exponent) == (73, -20)
    x = np.full(120 * 120, 18, dtype=np.int8)
    x[:6535] = 19
    assert int(x.astype(np.int64).sum()) == 265735
    assert int(dpu_round(265735 * 73 / 2.0 ** 20)) == 18  # what exact integer arithmetic would give
    y = run1("avg_pool2d", [(x.reshape(1, 1, 120, 120), 0)], 0, {"global": True})
    assert int(y.ravel()[0]) == 19


def test_avgpool_count_include_pad_recorded():
    rng = np.random.default_rng(9)
    x = i8(rng, (1, 1, 4, 4))
    g, feeds = single("avg_pool2d", [(x, 0)], 0, {"kernel": [3, 3], "pads": [1, 1, 1, 1],
                                                   "count_include_pad": False})
    assert g.ops[0].attrs["count_include_pad"] is False
    with pytest.raises(QuantizationError, match="count_include_pad"):
        rules.check_avgpool_padding("op", g.ops[0].attrs["pads"], g.ops[0].attrs["count_include_pad"])
    # the golden computes what the DPU does: divide by the full window
    y = run_graph(g, feeds)["y"]
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    assert int(y[0, 0, 0, 0]) == int(dpu_round(xp[0, 0, :3, :3].sum() * 7 / 64))


# -- element-wise --------------------------------------------------------------------------------------
def test_eltwise_add_equal_fix_points_exact_with_relu():
    rng = np.random.default_rng(10)
    a, b = i8(rng, (1, 3, 4, 4)), i8(rng, (1, 3, 4, 4))
    for act in ("none", "relu"):
        y = run1("eltwise_add", [(a, 5), (b, 5)], 4, {"act": act})
        node = helper.make_node("Add", ["a", "b"], ["y"])
        yf = ort_run(node, {"a": deq(a, 5), "b": deq(b, 5)}, {})
        np.testing.assert_array_equal(y, dpu_round(act_float(yf * 16, act)))


def test_eltwise_add_different_fix_points_hand():
    # x0 = 5 at fp 3 (0.625), x1 = 3 at fp 1 (1.5): 2.125 at fp 1 -> 4.25 -> 4
    x0 = np.array([5, -5, 7], dtype=np.int8).reshape(1, 1, 1, 3)
    x1 = np.array([3, -3, 0], dtype=np.int8).reshape(1, 1, 1, 3)
    q = rules.eltwise_params("e", "add", [3, 1], 1)
    assert q.shift_read == (2, 0) and q.write_exp == 0 and q.exact
    y = run1("eltwise_add", [(x0, 3), (x1, 1)], 1).ravel().tolist()
    # -0.625 - 1.5 = -2.125 -> -4.25 -> -4; 0.875 -> 1.75 -> 2
    assert y == [4, -4, 2]


def test_eltwise_add_exact_when_spread_at_most_two():
    rng = np.random.default_rng(11)
    a, b, c = i8(rng, (1, 2, 5, 5)), i8(rng, (1, 2, 5, 5)), i8(rng, (1, 2, 5, 5))
    for fps, fp_out in (((4, 2, 3), 2), ((6, 6, 5), 3), ((1, 3, 2), 0)):
        assert rules.eltwise_params("e", "add", fps, fp_out).exact
        y = run1("eltwise_add", [(a, fps[0]), (b, fps[1]), (c, fps[2])], fp_out)
        ref = (deq(a, fps[0]) + deq(b, fps[1]) + deq(c, fps[2])) * 2.0 ** fp_out
        np.testing.assert_array_equal(y, dpu_round(ref))


def test_eltwise_add_truncating_reads_within_one_lsb():
    # fix_points 6, 5, 0 -> out 0: reads shift 6 and 5 bits (> 2 guard bits) and floor: within 1 LSB
    q = rules.eltwise_params("e", "add", [6, 5, 0], 0)
    assert q.shift_read == (6, 5, 0) and not q.exact
    rng = np.random.default_rng(12)
    xs = [i8(rng, (1, 4, 16, 16)) for _ in range(3)]
    y = run1("eltwise_add", [(xs[0], 6), (xs[1], 5), (xs[2], 0)], 0).astype(np.int64)
    ref = dpu_round(deq(xs[0], 6) + deq(xs[1], 5) + deq(xs[2], 0)).astype(np.int64)
    diff = np.abs(y - ref)
    assert diff.max() == 1  # the truncation shows, and stays within 1 LSB
    # and it is exactly the ELEW formula
    a = [(x.astype(np.int64) * 4) // 2 ** sr for x, sr in zip(xs, q.shift_read)]
    np.testing.assert_array_equal(y, dpu_round(sum(a) / 4.0))


def test_eltwise_mul():
    rng = np.random.default_rng(13)
    a, b = i8(rng, (1, 2, 4, 4)), i8(rng, (1, 2, 4, 4))
    for fps, fp_out in (((4, 5), 6), ((7, 7), 7), ((2, 3), 5)):
        q = rules.eltwise_params("m", "mul", fps, fp_out)
        y = run1("eltwise_mul", [(a, fps[0]), (b, fps[1])], fp_out)
        ref = dpu_round(deq(a, fps[0]) * deq(b, fps[1]) * 2.0 ** fp_out)
        if q.exact:
            np.testing.assert_array_equal(y, ref)
    # 7 + 7 - 0 = 14 fractional bits to drop: fits the write shift, exact
    assert rules.eltwise_params("m", "mul", [7, 7], 0).exact


# -- concat, upsample ------------------------------------------------------------------------------------
def test_concat_free_and_requantized():
    rng = np.random.default_rng(14)
    a, b = i8(rng, (1, 2, 3, 3)), i8(rng, (1, 3, 3, 3))
    y = run1("concat", [(a, 4), (b, 4)], 4, {"axis": 1})
    np.testing.assert_array_equal(y, np.concatenate([a, b], axis=1))
    assert rules.concat_params("c", [4, 4], 4).free
    y = run1("concat", [(a, 6), (b, 4)], 4, {"axis": 1})
    assert not rules.concat_params("c", [6, 4], 4).free
    np.testing.assert_array_equal(y[:, :2], dpu_round(deq(a, 6) * 16))
    np.testing.assert_array_equal(y[:, 2:], b)


def test_upsample_nearest():
    rng = np.random.default_rng(15)
    x = i8(rng, (1, 2, 3, 4))
    y = run1("upsample_nearest", [(x, 3)], 3, {"scale": [2, 3]})
    np.testing.assert_array_equal(y, np.kron(x, np.ones((1, 1, 2, 3), dtype=np.int8)))
    with pytest.raises(QuantizationError, match="keeps the fix_point"):
        run1("upsample_nearest", [(x, 3)], 2, {"scale": [2, 2]})


# -- standalone activations -----------------------------------------------------------------------------
def test_standalone_leaky_exact_vs_float():
    x = np.arange(-128, 128, dtype=np.int8).reshape(1, 1, 16, 16)
    for fp_in, fp_out in ((3, 3), (4, 2), (2, 5)):
        y = run1("activation", [(x, fp_in)], fp_out, {"mode": "leaky_relu", "alpha": 0.1})
        t = deq(x, fp_in)
        np.testing.assert_array_equal(y, dpu_round(np.where(t < 0, t * 26 / 256, t) * 2.0 ** fp_out))
        # the model's alpha = 0.1 differs from 26/256 by 0.0015625: the gap grows with |x|, plus 1 rounding LSB
        bound = 128 * 2.0 ** -fp_in * (26 / 256 - 0.1) * 2.0 ** fp_out + 1
        assert np.abs(y - dpu_round(np.where(t < 0, t * 0.1, t) * 2.0 ** fp_out).astype(int)).max() <= bound
    with pytest.raises(QuantizationError, match="alpha"):
        run1("activation", [(x, 3)], 3, {"mode": "leaky_relu", "alpha": 0.01})


def test_standalone_prelu():
    rng = np.random.default_rng(16)
    x = i8(rng, (1, 4, 5, 5))
    slopes = np.array([3, 64, 0, 127], dtype=np.int8)
    y = run1("activation", [(x, 4)], 3, {"mode": "prelu"}, {"alpha": (slopes, 7)})
    t = deq(x, 4)
    ref = np.where(t < 0, t * deq(slopes, 7)[None, :, None, None], t)
    np.testing.assert_array_equal(y, dpu_round(ref * 8))
    with pytest.raises(QuantizationError, match="negative slopes"):
        run1("activation", [(x, 4)], 3, {"mode": "prelu"}, {"alpha": (np.array([1, -2, 3, 4], np.int8), 7)})


def test_hard_sigmoid():
    x = np.arange(-128, 128, dtype=np.int8).reshape(1, 1, 16, 16)
    for fp_in in (2, 4, 5):
        y = run1("activation", [(x, fp_in)], 7, {"mode": "hard_sigmoid"})
        t = deq(x, fp_in)
        # the DPU formula exactly: (x + 3) * 2731 / 2**14, no upper clamp but int8 saturation
        np.testing.assert_array_equal(y, dpu_round(np.maximum(t + 3, 0) * 2731 / 2 ** 14 * 128))
        # the model's relu6(x + 3) / 6: 2731 / 2**14 is 1.0001 / 6, within 1 LSB
        ref = dpu_round(np.clip(t + 3, 0, 6) / 6 * 128).astype(int)
        assert np.abs(y.astype(int) - ref).max() <= 1
    assert run1("activation", [(x, 4)], 7, {"mode": "hard_sigmoid"}).max() == 127
    with pytest.raises(QuantizationError, match="fix_point must be 7"):
        run1("activation", [(x, 4)], 6, {"mode": "hard_sigmoid"})


# -- graph-level ---------------------------------------------------------------------------------------
def test_run_graph_chain_and_keep_all():
    rng = np.random.default_rng(17)
    g = Graph("chain")
    g.add_tensor(Tensor("in", (1, 3, 8, 8), "int8", 6))
    g.inputs = ["in"]
    g.add_tensor(Tensor("w", (4, 3, 3, 3), "int8", 7, i8(rng, (4, 3, 3, 3))))
    g.add_tensor(Tensor("b", (4,), "int8", 6, i8(rng, (4,))))
    g.add_tensor(Tensor("c", (1, 4, 8, 8), "int8", 5))
    g.add_tensor(Tensor("p", (1, 4, 4, 4), "int8", 5))
    g.add_tensor(Tensor("s", (1, 4, 4, 4), "int8", 4))
    g.add_op(Op("conv", "conv2d", ["in"], ["c"], {"pads": [1, 1, 1, 1], "act": "relu"}, {"weights": "w", "bias": "b"}))
    g.add_op(Op("pool", "max_pool2d", ["c"], ["p"], {"kernel": [2, 2], "strides": [2, 2]}))
    g.add_op(Op("add", "eltwise_add", ["p", "p"], ["s"]))
    g.outputs = ["s"]
    x = i8(rng, (1, 3, 8, 8))
    out = run_graph(g, {"in": x})
    assert set(out) == {"s"}
    env = run_graph(g, {"in": x}, keep_all=True)
    step = run_op(g.ops[1], g, {"c": env["c"]})
    np.testing.assert_array_equal(step["p"], env["p"])
    np.testing.assert_array_equal(out["s"], dpu_round(deq(env["p"], 5) * 2 * 16))


def test_run_errors_name_the_op():
    rng = np.random.default_rng(18)
    x = i8(rng, (1, 1, 2, 2))
    g, feeds = single("max_pool2d", [(x, 0)], 0, {"kernel": [1, 1]})
    with pytest.raises(GraphError, match="no feed"):
        run_graph(g, {})
    with pytest.raises(GraphError, match="feed 'x0'"):
        run_graph(g, {"x0": x.astype(np.int16)})
    bad = Op("mystery", "softmax", ["x0"], ["y"])
    with pytest.raises(GraphError, match="'mystery'.*unsupported op type 'softmax'"):
        run_op(bad, g, feeds)
    with pytest.raises(GraphError, match="'op'.*missing attribute 'kernel'"):
        del g.ops[0].attrs["kernel"]
        run_op(g.ops[0], g, feeds)
    g2, feeds2 = single("conv2d", [(x, 9)], 0, {}, {"weights": (np.ones((1, 1, 1, 1), np.int8), 9)})
    with pytest.raises(QuantizationError, match="'op'.*shift_cut.*18"):
        run_graph(g2, feeds2)


# -- against AMD's ISA1 simulator (conformance mini-layers) -------------------------------------------------
#: The vectors ship with the tests (a copy of the project's shared/conformance/isa1, see test_isa1_conformance).
CONFORMANCE = Path(__file__).resolve().parent / "data" / "isa1_conformance"


def _listing(case) -> list[tuple[str, dict[str, int]]]:
    out = []
    for line in str(case["listing"]).splitlines():
        name, *fields = line.split()
        out.append((name, {k: int(v) for k, v in (f.split("=") for f in fields) if k not in ("dpdon", "dpdby")}))
    return out


@pytest.mark.parametrize("arch", ["b4096", "b1152"])
@pytest.mark.parametrize("kind", ["pool", "resadd"])
def test_golden_matches_simulator_mini_layers(arch, kind):
    """conv 3x3 pad 1 relu -> maxpool 2x2 (or -> residual ELEW add with relu), as the AMD simulator ran it.

    The fix_points are chosen so that quant.rules gives the vector's shift fields; the inputs, weights and bias are
    read from the DDR images, and the golden must reproduce the saved output bit for bit.
    """
    import json

    case = np.load(CONFORMANCE / f"mini_{arch}_{kind}.npz")
    icp = json.loads(str(case["arch"]))["icp"]
    prog = _listing(case)
    loads_ = [f for n, f in prog if n == "LOAD"]
    rows = sorted((f for f in loads_ if f["reg_id"] == 0), key=lambda f: f["ddr_addr"])
    h, w, c = len(rows), rows[0]["length"], rows[0]["channel"]
    x_hwc = case["reg0_in"][: h * w * c].view(np.int8).reshape(h, w, c)
    init = next(f for n, f in prog if n == "CONVINIT")
    kh, kw = init["kernel_h"], init["kernel_w"]
    wl = [f for f in loads_ if f["reg_id"] == 2 and f["length"] == kh * kw]
    reg2 = case["reg2_in"].view(np.int8)
    wts = np.stack([reg2[f["ddr_addr"]: f["ddr_addr"] + kh * kw * icp].reshape(kh, kw, icp)[:, :, :c] for f in wl])
    bl = next(f for f in loads_ if f["reg_id"] == 2 and f["length"] == 1)
    bias = reg2[bl["ddr_addr"]: bl["ddr_addr"] + icp].copy()
    o = len(wl)
    assert o == icp and init["act_type"] == 1

    fp_in, fp_w, fp_out = init["shift_cut"], 0, 0
    fp_b = fp_in + fp_w - (init["shift_bias"] - 1)
    g = Graph(f"mini_{kind}")
    g.add_tensor(Tensor("x", (1, c, h, w), "int8", fp_in))
    g.add_tensor(Tensor("w", (o, c, kh, kw), "int8", fp_w, np.ascontiguousarray(wts.transpose(0, 3, 1, 2))))
    g.add_tensor(Tensor("b", (o,), "int8", fp_b, bias))
    g.add_tensor(Tensor("c", (1, o, h, w), "int8", fp_out))
    g.inputs = ["x"]
    g.add_op(Op("conv", "conv2d", ["x"], ["c"], {"pads": [1, 1, 1, 1], "act": "relu"}, {"weights": "w", "bias": "b"}))
    from tvm_dpu.xgraph import quant_params
    q = quant_params(g.ops[0], g)
    assert (q.shift_cut, q.shift_bias_isa) == (init["shift_cut"], init["shift_bias"])
    feeds = {"x": np.ascontiguousarray(x_hwc.transpose(2, 0, 1))[None]}
    if kind == "pool":
        g.add_tensor(Tensor("y", (1, o, h // 2, w // 2), "int8", fp_out))
        g.add_op(Op("pool", "max_pool2d", ["c"], ["y"], {"kernel": [2, 2], "strides": [2, 2]}))
        n_out = (h // 2) * (w // 2) * o
        expected = case["reg1_out"][:n_out].view(np.int8).reshape(h // 2, w // 2, o)
    else:
        inits = [f for n, f in prog if n == "ELEWINIT"][:2]
        assert [i["shift_read"] for i in inits] == [0, 1]
        g.add_tensor(Tensor("r", (1, o, h, w), "int8", fp_out + 1))  # shift_read 1 = one more fractional bit
        g.add_tensor(Tensor("y", (1, o, h, w), "int8", fp_out))
        g.inputs.append("r")
        g.add_op(Op("add", "eltwise_add", ["c", "r"], ["y"], {"act": "relu"}))
        assert quant_params(g.ops[1], g).shift_read == (0, 1)
        feeds["r"] = np.ascontiguousarray(case["reg3_in"][: h * w * o].view(np.int8).reshape(h, w, o)
                                          .transpose(2, 0, 1))[None]
        expected = case["reg1_out"][: h * w * o].view(np.int8).reshape(h, w, o)
    g.outputs = ["y"]
    y = run_graph(g, feeds)["y"]
    np.testing.assert_array_equal(y[0].transpose(1, 2, 0), expected)
