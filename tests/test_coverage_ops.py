"""Ops added for full DPU coverage (transposed conv, dilated conv / depthwise, standalone relu / relu6):
emulator == golden bit for bit through compile_graph, on both ISA1 presets."""
from __future__ import annotations

import numpy as np
import pytest

from test_codegen import ARCHS, _B, _check


def _tconv(b: _B, x: str, cout: int, k: int, s: int, p: int, op_pad: int = 0, groups: int = 1,
           act: str = "relu", fp_out: int = 2) -> str:
    _, c, h, w = b.shape(x)
    ho = (h - 1) * s - 2 * p + k + op_pad
    wo = (w - 1) * s - 2 * p + k + op_pad
    params = {"weights": b.const((c, cout // groups, k, k), 7), "bias": b.const((cout,), 5)}
    return b.op("conv2d_transpose", [x], (1, cout, ho, wo), fp_out, params, strides=[s, s], pads=[p] * 4,
                output_padding=[op_pad, op_pad], groups=groups, act=act)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("k,s,p,op_pad", [(4, 2, 1, 0), (3, 2, 1, 1), (3, 1, 1, 0), (5, 3, 2, 2), (2, 2, 0, 0),
                                         (3, 2, 0, 1), (2, 3, 1, 2)])
def test_conv2d_transpose(arch, k, s, p, op_pad):
    """(3, 2, 0, 1) and (2, 3, 1, 2) have outputs whose window holds only padding (act(bias) fills)."""
    b = _B(k * 10 + s)
    x = b.input(20, 7, 6)
    _tconv(b, x, 24, k, s, p, op_pad)
    _check(b.g, arch)


@pytest.mark.parametrize("arch", ARCHS)
def test_conv2d_transpose_rectangular_and_into_concat(arch):
    b = _B(5)
    x = b.input(8, 5, 9)
    _, c, h, w = b.shape(x)
    params = {"weights": b.const((c, 12, 3, 4), 7)}
    t = b.op("conv2d_transpose", [x], (1, 12, (h - 1) * 2 - 1 + 3, (w - 1) * 3 - 2 + 4), 2, params,
             strides=[2, 3], pads=[1, 1, 0, 1], act="none")
    other = b.op("max_pool2d", [b.input(7, *b.shape(t)[2:], fp=2)], (1, 7, *b.shape(t)[2:]), 2, kernel=[1, 1])
    b.op("concat", [t, other], (1, 19, *b.shape(t)[2:]), 2, axis=1)
    _check(b.g, arch)


@pytest.mark.parametrize("arch", ARCHS)
def test_depthwise_conv2d_transpose(arch):
    b = _B(6)
    x = b.input(40, 6, 5)
    t = _tconv(b, x, 40, 4, 2, 1, groups=40, act="relu6", fp_out=4)
    _tconv(b, t, 40, 3, 2, 0, op_pad=1, groups=40, act="none", fp_out=3)
    _check(b.g, arch)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("k,s,d,p", [(3, 1, 2, 2), (3, 1, 3, 1), (3, 2, 2, 2), (2, 2, 3, 0), (3, 3, 2, 1)])
def test_dilated_conv2d(arch, k, s, d, p):
    b = _B(k + 7 * s + 31 * d)
    x = b.input(18, 13, 11)
    _, c, h, w = b.shape(x)
    ho, wo = (h + 2 * p - d * (k - 1) - 1) // s + 1, (w + 2 * p - d * (k - 1) - 1) // s + 1
    params = {"weights": b.const((20, c, k, k), 7), "bias": b.const((20,), 5)}
    b.op("conv2d", [x], (1, 20, ho, wo), 2, params, strides=[s, s], pads=[p] * 4, dilations=[d, d], act="relu")
    _check(b.g, arch)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("s,d", [(1, 2), (2, 3)])
def test_dilated_depthwise(arch, s, d):
    b = _B(s * 5 + d)
    x = b.input(36, 12, 14)
    k, p = 3, d
    _, c, h, w = b.shape(x)
    ho, wo = (h + 2 * p - d * (k - 1) - 1) // s + 1, (w + 2 * p - d * (k - 1) - 1) // s + 1
    params = {"weights": b.const((c, 1, k, k), 7), "bias": b.const((c,), 6)}
    b.op("depthwise_conv2d", [x], (1, c, ho, wo), 4, params, strides=[s, s], pads=[p] * 4, dilations=[d, d],
         act="relu6")
    _check(b.g, arch)


def _gconv(b: _B, x: str, cout: int, k: int, groups: int, s: int = 1, p: int = 0, d: int = 1, act: str = "relu",
           fp_out: int = 3) -> str:
    _, c, h, w = b.shape(x)
    ho, wo = (h + 2 * p - d * (k - 1) - 1) // s + 1, (w + 2 * p - d * (k - 1) - 1) // s + 1
    params = {"weights": b.const((cout, c // groups, k, k), 7), "bias": b.const((cout,), 5)}
    return b.op("conv2d", [x], (1, cout, ho, wo), fp_out, params, strides=[s, s], pads=[p] * 4,
                dilations=[d, d], groups=groups, act=act)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("cin,cout,groups,k,s,p,d", [
    (64, 64, 32, 3, 1, 1, 1),  # ResNeXt 32x4d-style: 2 channels in and out per group
    (48, 96, 4, 3, 2, 1, 1),  # 12 -> 24 per group: the slices straddle ICP/OCP boundaries on B4096
    (40, 20, 2, 1, 1, 0, 1),  # pointwise group conv (ShuffleNet v1)
    (24, 36, 3, 3, 1, 2, 2),  # dilated: each group split into phases
])
def test_grouped_conv2d(arch, cin, cout, groups, k, s, p, d):
    """groups > 1, not depthwise: one conv per group on channel slices of the input and output maps."""
    b = _B(cin + cout + groups)
    x = b.input(cin, 9, 11)
    _gconv(b, x, cout, k, groups, s, p, d)
    _check(b.g, arch)


@pytest.mark.parametrize("arch", ARCHS)
def test_grouped_conv2d_between_convs_and_into_concat(arch):
    """A grouped conv whose output is a concat slice (two levels of channel views) and whose input is a slice."""
    b = _B(12)
    x = b.input(16, 8, 8)
    c1 = b.conv(x, 32, 1, fp_out=3)
    g = _gconv(b, c1, 32, 3, 8, p=1, fp_out=3)
    other = b.conv(x, 8, 1, fp_out=3)
    cat = b.op("concat", [other, g], (1, 40, 8, 8), 3, axis=1)
    _gconv(b, cat, 20, 1, 4, act="none", fp_out=2)
    _check(b.g, arch)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("c,h,w,fps,fp_out,act", [
    (40, 9, 11, (4, 7), 4, "none"),  # SE: map times a hard-sigmoid gate (fix_point 7)
    (16, 3, 5, (3, 7), 2, "relu"),
    (300, 2, 3, (5, 6), 6, "none"),  # more channel groups than one chunk of the tile
    (24, 10, 7, (2, 2), 0, "none"),
])
def test_eltwise_mul_channel_gate(arch, c, h, w, fps, fp_out, act):
    """(N,C,H,W) * (N,C,1,1): the gate is broadcast by the ELEW engine itself (share_pp, jump_read 0)."""
    b = _B(c + h)
    x = b.input(c, h, w, fp=fps[0])
    g = b.input(c, 1, 1, fp=fps[1])
    b.op("eltwise_mul", [x, g], (1, c, h, w), fp_out, act=act)
    _check(b.g, arch)


@pytest.mark.parametrize("arch", ARCHS)
def test_se_block_and_hard_swish(arch):
    """Squeeze-and-excitation: global avg pool -> 1x1 conv relu -> 1x1 conv -> hard sigmoid (ALU mode 7) ->
    channel-gate multiply; then hard swish x * hard_sigmoid(x) as ALU mode 7 + an equal-shape ELEW multiply."""
    b = _B(77)
    x = b.input(48, 7, 9, fp=4)
    p = b.op("avg_pool2d", [x], (1, 48, 1, 1), 4, kernel=[7, 9], strides=[1, 1])
    r = b.conv(p, 12, 1, fp_out=4)
    e = b.conv(r, 48, 1, fp_out=4, act="none")
    gate = b.op("activation", [e], (1, 48, 1, 1), 7, mode="hard_sigmoid")
    se = b.op("eltwise_mul", [x, gate], (1, 48, 7, 9), 4)
    hs = b.op("activation", [se], (1, 48, 7, 9), 7, mode="hard_sigmoid")
    b.op("eltwise_mul", [se, hs], (1, 48, 7, 9), 4)
    _check(b.g, arch)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("mode,fp_in,fp_out", [("relu", 3, 3), ("relu", 5, 2), ("relu", 1, 6), ("relu6", 6, 4),
                                               ("relu6", 2, 4)])
def test_standalone_relu(arch, mode, fp_in, fp_out):
    b = _B(fp_in * 8 + fp_out)
    x = b.input(37, 9, 10, fp=fp_in)
    b.op("activation", [x], (1, 37, 9, 10), fp_out, mode=mode)
    _check(b.g, arch)


@pytest.mark.parametrize("arch", ARCHS)
def test_pool_then_relu_between_convs(arch):
    b = _B(9)
    x = b.input(16, 12, 12)
    c = b.conv(x, 24, 3, 1, 1, fp_out=3, act="none")
    p = b.op("max_pool2d", [c], (1, 24, 6, 6), 3, kernel=[2, 2], strides=[2, 2])
    r = b.op("activation", [p], (1, 24, 6, 6), 3, mode="relu")
    r6 = b.op("activation", [b.conv(r, 8, 1, fp_out=2, act="none")], (1, 8, 6, 6), 4, mode="relu6")
    b.conv(r6, 8, 1, fp_out=3)
    _check(b.g, arch)


def test_relu_rules():
    from tvm_dpu.errors import QuantizationError
    from tvm_dpu.quant.rules import relu_params

    q = relu_params("r", 1, 6, "relu")
    assert (q.weight, q.shift_cut) == (32, 0)
    q = relu_params("r", 7, 4, "relu6")
    assert (q.weight, q.shift_cut, q.act) == (1, 3, "relu6")
    with pytest.raises(QuantizationError, match="relu6 clamps"):
        relu_params("r", 4, 3, "relu6")
    with pytest.raises(QuantizationError, match="beyond int8"):
        relu_params("r", 0, 7, "relu")


# -- end to end: small ONNX models through tvm_dpu.build vs onnxruntime ---------------------------------------
def _onnx_model(nodes, inits, in_shape, out_name="Y"):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    g = helper.make_graph(nodes, "cov", [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(in_shape))],
                          [helper.make_tensor_value_info(out_name, TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    g.output[0].CopyFrom(helper.make_tensor_value_info(out_name, TensorProto.FLOAT, ["n", "c", "h", "w"]))
    m = onnx.shape_inference.infer_shapes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)],
                                                            ir_version=8), strict_mode=True)
    onnx.checker.check_model(m)
    return m


def _w(rng, *shape):
    fan_in = int(np.prod(shape[1:]))
    return rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)


def _e2e_models():
    from onnx import helper

    rng = np.random.default_rng(0)
    mk = helper.make_node
    conv_in = [mk("Conv", ["X", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]), mk("Relu", ["c0"], ["r0"])]
    head = {"w0": _w(rng, 8, 3, 3, 3), "b0": rng.standard_normal(8) * 0.1}
    models = {}
    models["convtranspose_k4_s2_p1"] = _onnx_model(conv_in + [
        mk("ConvTranspose", ["r0", "wt", "bt"], ["t"], kernel_shape=[4, 4], strides=[2, 2], pads=[1, 1, 1, 1]),
        mk("Relu", ["t"], ["rt"]), mk("Conv", ["rt", "w1"], ["Y"])],
        {**head, "wt": _w(rng, 8, 6, 4, 4) / 2, "bt": rng.standard_normal(6) * 0.1, "w1": _w(rng, 4, 6, 1, 1)},
        (1, 3, 10, 12))
    models["convtranspose_k3_s2_outpad1"] = _onnx_model(conv_in + [
        mk("ConvTranspose", ["r0", "wt"], ["t"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
           output_padding=[1, 1]),
        mk("Conv", ["t", "w1", "b1"], ["Y"], pads=[1, 1, 1, 1])],
        {**head, "wt": _w(rng, 8, 6, 3, 3), "w1": _w(rng, 4, 6, 3, 3), "b1": rng.standard_normal(4) * 0.1},
        (1, 3, 9, 11))
    models["depthwise_convtranspose"] = _onnx_model(conv_in + [
        mk("ConvTranspose", ["r0", "wt"], ["t"], kernel_shape=[4, 4], strides=[2, 2], pads=[1, 1, 1, 1], group=8),
        mk("Relu", ["t"], ["rt"]), mk("Conv", ["rt", "w1"], ["Y"])],
        {**head, "wt": _w(rng, 8, 1, 4, 4), "w1": _w(rng, 4, 8, 1, 1)}, (1, 3, 8, 9))
    models["dilated_3x3_d2"] = _onnx_model(conv_in + [
        mk("Conv", ["r0", "wd", "bd"], ["d"], pads=[2, 2, 2, 2], dilations=[2, 2]), mk("Relu", ["d"], ["rd"]),
        mk("Conv", ["rd", "wdw"], ["dw"], pads=[2, 2, 2, 2], dilations=[2, 2], group=8),
        mk("Conv", ["dw", "w1"], ["Y"])],
        {**head, "wd": _w(rng, 8, 8, 3, 3), "bd": rng.standard_normal(8) * 0.1, "wdw": _w(rng, 8, 1, 3, 3),
         "w1": _w(rng, 4, 8, 1, 1)},
        (1, 3, 13, 14))
    models["grouped_conv"] = _onnx_model(conv_in + [
        mk("Conv", ["r0", "w1", "b1"], ["c1"]), mk("Relu", ["c1"], ["r1"]),  # 8 -> 32
        mk("Conv", ["r1", "wg", "bg"], ["g"], pads=[1, 1, 1, 1], strides=[2, 2], group=8, name="gconv"),
        mk("Relu", ["g"], ["rg"]),
        mk("Conv", ["rg", "wp"], ["Y"], group=4, name="gpw")],  # pointwise group conv 32 -> 8
        {**head, "w1": _w(rng, 32, 8, 1, 1), "b1": rng.standard_normal(32) * 0.1, "wg": _w(rng, 32, 4, 3, 3),
         "bg": rng.standard_normal(32) * 0.1, "wp": _w(rng, 8, 8, 1, 1)}, (1, 3, 12, 13))
    se_w = {"ws1": _w(rng, 4, 8, 1, 1), "bs1": rng.standard_normal(4) * 0.1, "ws2": _w(rng, 8, 4, 1, 1),
            "bs2": rng.standard_normal(8) * 0.1, "w1": _w(rng, 4, 8, 1, 1)}
    se = [mk("GlobalAveragePool", ["r0"], ["p"]), mk("Conv", ["p", "ws1", "bs1"], ["s1"]), mk("Relu", ["s1"], ["s1r"]),
          mk("Conv", ["s1r", "ws2", "bs2"], ["s2"])]
    models["se_hard_sigmoid"] = _onnx_model(conv_in + se + [  # MobileNetV3 SE: gate = HardSigmoid(1/6, 0.5)
        mk("HardSigmoid", ["s2"], ["g"], alpha=1 / 6, beta=0.5, name="hsig"), mk("Mul", ["r0", "g"], ["m"], name="se"),
        mk("Conv", ["m", "w1"], ["Y"])], {**head, **se_w}, (1, 3, 11, 11))
    models["se_gate_first"] = _onnx_model(conv_in + se + [  # Mul(gate, x): the gate goes second in the XGraph
        mk("HardSigmoid", ["s2"], ["g"], alpha=1 / 6, beta=0.5), mk("Mul", ["g", "r0"], ["m"]),
        mk("Conv", ["m", "w1"], ["Y"])], {**head, **se_w}, (1, 3, 9, 9))
    models["conv_hard_swish"] = _onnx_model([  # MobileNetV3 stem: conv -> HardSwish (x * relu6(x + 3) / 6)
        mk("Conv", ["X", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]), mk("HardSwish", ["c0"], ["h"], name="hswish"),
        mk("Conv", ["h", "w1"], ["Y"])], {**head, "w1": _w(rng, 4, 8, 1, 1)}, (1, 3, 10, 9))
    models["maxpool_relu"] = _onnx_model([
        mk("Conv", ["X", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
        mk("MaxPool", ["c0"], ["p"], kernel_shape=[2, 2], strides=[2, 2]), mk("Relu", ["p"], ["rp"]),
        mk("Conv", ["rp", "w1"], ["Y"])],
        {**head, "w1": _w(rng, 4, 8, 1, 1)}, (1, 3, 12, 12))
    models["lone_relu6"] = _onnx_model([
        mk("Conv", ["X", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
        mk("MaxPool", ["c0"], ["p"], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]),
        mk("Clip", ["p", "lo", "hi"], ["r6"]), mk("Conv", ["r6", "w1"], ["Y"])],
        {**head, "w1": _w(rng, 4, 8, 1, 1), "lo": np.float32(0), "hi": np.float32(6)}, (1, 3, 12, 12))
    return models


_E2E = _e2e_models()


@pytest.mark.parametrize("name", sorted(_E2E))
def test_build_small_onnx_models(name):
    import onnxruntime as ort

    import tvm_dpu

    model = _E2E[name]
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    rng = np.random.default_rng(1)
    calib = [rng.standard_normal(shape).astype(np.float32) for _ in range(4)]
    compiled = tvm_dpu.build(model, arch=ARCHS[0], calibration=calib, progress=False)
    rep = compiled.partition_report
    assert not rep.cpu_nodes, [(n.name, n.op, getattr(n, "reason", None)) for n in rep.cpu_nodes]
    x = rng.standard_normal(shape).astype(np.float32)
    compiled.set_verify(True)
    y = compiled.run(x)[0]
    assert sum(r.mismatches for r in compiled.verify_results()) == 0
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"X": x})[0]
    assert y.shape == ref.shape
    cos = float(np.dot(y.ravel(), ref.ravel()) / (np.linalg.norm(y) * np.linalg.norm(ref)))
    assert cos > 0.99, cos


def test_hard_sigmoid_on_the_alu_is_the_rounded_exact_value():
    """ALU mode 7 computes (x + 3) * 2731 / 2**14 (2731/2**14 ~ 1/6) at output fix_point 7: for every int8 input
    at input fix_points 0..11 that equals DPURound(relu6(x + 3) / 6 * 128), saturated at 127 (1.0 -> 127/128),
    so the only error against the float hard sigmoid is the output quantization (at most 1 LSB = 1/128, at 1.0)."""
    import math
    from fractions import Fraction

    from tvm_dpu.quant.rules import hsigmoid_params
    from tvm_dpu.xgraph.golden_misc import hsigmoid

    x = np.arange(-128, 128)
    for fp in range(12):
        got = hsigmoid(x, hsigmoid_params("h", fp, 7))
        exact = [min(127, math.floor(min(max(Fraction(int(v), 2 ** fp) + 3, 0), 6) / 6 * 128 + Fraction(1, 2)))
                 for v in x]
        assert got.tolist() == exact, fp
        ref = np.clip(x / 2.0 ** fp + 3, 0, 6) / 6
        assert np.abs(got / 128 - ref).max() <= 1 / 128


def test_se_report_places_gate_and_multiply_on_the_dpu():
    import tvm_dpu

    model = _E2E["se_hard_sigmoid"]
    calib = [np.random.default_rng(3).standard_normal((1, 3, 11, 11)).astype(np.float32)]
    rep = tvm_dpu.build(model, arch=ARCHS[0], calibration=calib, progress=False).partition_report
    assert rep.node("hsig").device == rep.node("se").device == "dpu" and rep.subgraphs == 1


def test_grouped_conv_report_says_decomposed():
    import tvm_dpu

    model = _E2E["grouped_conv"]
    calib = [np.random.default_rng(2).standard_normal((1, 3, 12, 13)).astype(np.float32)]
    compiled = tvm_dpu.build(model, arch=ARCHS[0], calibration=calib, progress=False)
    rep = compiled.partition_report
    g, pw = rep.node("gconv"), rep.node("gpw")
    assert g.device == pw.device == "dpu" and g.reason is None
    assert g.note == "grouped conv decomposed into 8 group convs (4 -> 4 channels each) on the CONV engine"
    assert pw.note == "grouped conv decomposed into 4 group convs (8 -> 2 channels each) on the CONV engine"
    assert rep.to_json()["nodes"][[n.name for n in rep.nodes].index("gconv")]["note"] == g.note
    assert "decomposed into 8 group convs" in rep.table()


# -- QDQ models through tvm_dpu.build ---------------------------------------------------------------------
def _qdq_model(scale_out: float = 2.0 ** -3):
    """X -QDQ(2**-5)-> Conv(W: int8 2**-6, B: int32) -> Relu -QDQ(2**-4)-> MaxPool -QDQ(2**-4)->
    Conv(W2: int8 2**-7) -QDQ(scale_out)-> Y."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(4)
    mk = helper.make_node
    inits = {"s5": np.float32(2.0 ** -5), "s4": np.float32(2.0 ** -4), "s6": np.float32(2.0 ** -6),
             "s7": np.float32(2.0 ** -7), "so": np.float32(scale_out), "sb": np.float32(2.0 ** -11),
             "z": np.int8(0), "zb": np.int32(0),
             "Wq": rng.integers(-60, 61, (8, 3, 3, 3)).astype(np.int8),
             "Bq": rng.integers(-300, 301, (8,)).astype(np.int32),
             "W2q": rng.integers(-80, 81, (4, 8, 1, 1)).astype(np.int8)}

    def qdq(x, s, out):
        return [mk("QuantizeLinear", [x, s, "z"], [x + "_q"], name="Q_" + x),
                mk("DequantizeLinear", [x + "_q", s, "z"], [out], name="DQ_" + x)]

    nodes = qdq("X", "s5", "Xd") + [
        mk("DequantizeLinear", ["Wq", "s6", "z"], ["W"], name="DQ_W"),
        mk("DequantizeLinear", ["Bq", "sb", "zb"], ["B"], name="DQ_B"),
        mk("Conv", ["Xd", "W", "B"], ["C"], name="conv1", pads=[1, 1, 1, 1]),
        mk("Relu", ["C"], ["R"], name="relu1")] + qdq("R", "s4", "Rd") + [
        mk("MaxPool", ["Rd"], ["P"], name="pool", kernel_shape=[2, 2], strides=[2, 2])] + qdq("P", "s4", "Pd") + [
        mk("DequantizeLinear", ["W2q", "s7", "z"], ["W2"], name="DQ_W2"),
        mk("Conv", ["Pd", "W2"], ["O"], name="conv2")] + qdq("O", "so", "Y")
    g = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 3, 10, 10])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 4, 5, 5])],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)
    onnx.checker.check_model(m)
    return m


def test_build_qdq_model_uses_its_fix_points_without_calibration():
    import warnings

    import onnxruntime as ort

    import tvm_dpu

    model = _qdq_model()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "random calibration" warning: nothing is calibrated
        compiled = tvm_dpu.build(model, arch=ARCHS[0], progress=False)
    assert compiled.build_info["qdq"] is True and compiled.build_info["calibration_batches"] == 0
    (runner,) = compiled.runners.values()
    g = runner.graph
    fps = {t.name: t.fix_point for t in g.tensors.values()}
    conv1, pool, conv2 = g.ops
    assert fps[g.inputs[0]] == 5
    assert (fps[conv1.outputs[0]], fps[pool.outputs[0]], fps[conv2.outputs[0]]) == (4, 4, 3)
    assert (fps[conv1.params["weights"]], fps[conv2.params["weights"]]) == (6, 7)
    x = np.random.default_rng(5).standard_normal((1, 3, 10, 10)).astype(np.float32)
    compiled.set_verify(True)
    y = compiled.run(x)[0]
    assert sum(r.mismatches for r in compiled.verify_results()) == 0
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"X": x})[0]
    # the QDQ model and the DPU compute on the same grid; they differ only in rounding (half-even vs half-up,
    # bias requantization)
    assert np.max(np.abs(y - ref)) <= 4 * 2.0 ** -3, np.max(np.abs(y - ref))


def test_build_qdq_model_with_non_power_of_two_scale_names_the_tensor():
    """A float-scale QDQ model compiles with its scales rounded up to powers of two, never silently: the warning
    names the tensor, its scale and the step the DPU takes instead (issue 25)."""
    import tvm_dpu

    with pytest.warns(UserWarning, match=r"not powers of two.*tensor 'O': 0\.1 -> 2\^-3.*requantize"):
        model = tvm_dpu.build(_qdq_model(scale_out=0.1), arch=ARCHS[0], progress=False)
    # scale 0.1 rounded up to 2**-3: the DPU subgraph's output has fix_point 3
    assert [o["fix_point"] for o in model.report()["subgraphs"][0]["outputs"]] == [3]


def test_qdq_fix_points_reach_a_subgraph_fed_by_a_cpu_op():
    """X -> Conv+Relu (DPU) -QDQ 2**-4-> Sigmoid (CPU) -QDQ 2**-7-> Conv (DPU) -QDQ 2**-5-> Y: the second
    subgraph's input gets the Sigmoid output's fix_point through the call site in main."""
    from onnx import TensorProto, helper, numpy_helper

    import tvm_dpu

    rng = np.random.default_rng(6)
    mk = helper.make_node
    arrays = {f"s{k}": np.float32(2.0 ** -k) for k in (4, 5, 6, 7)}
    arrays.update({"z": np.int8(0), "Wq": rng.integers(-60, 61, (6, 3, 3, 3)).astype(np.int8),
                   "W2q": rng.integers(-60, 61, (5, 6, 1, 1)).astype(np.int8)})

    def qdq(x, s, out):
        return [mk("QuantizeLinear", [x, s, "z"], [x + "_q"], name="Q_" + x),
                mk("DequantizeLinear", [x + "_q", s, "z"], [out], name="DQ_" + x)]

    nodes = qdq("X", "s5", "Xd") + [
        mk("DequantizeLinear", ["Wq", "s6", "z"], ["W"], name="DQ_W"),
        mk("Conv", ["Xd", "W"], ["C"], name="conv1", pads=[1, 1, 1, 1]), mk("Relu", ["C"], ["R"], name="relu1")
    ] + qdq("R", "s4", "Rd") + [mk("Sigmoid", ["Rd"], ["S"], name="sig")] + qdq("S", "s7", "Sd") + [
        mk("DequantizeLinear", ["W2q", "s6", "z"], ["W2"], name="DQ_W2"),
        mk("Conv", ["Sd", "W2"], ["O"], name="conv2")] + qdq("O", "s5", "Y")
    g = helper.make_graph(nodes, "qdq2", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 5, 8, 8])],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in arrays.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)
    compiled = tvm_dpu.build(model, arch=ARCHS[0], progress=False)
    assert compiled.build_info["calibration_batches"] == 0
    graphs = sorted((r.graph for r in compiled.runners.values()), key=lambda gr: gr.ops[0].source)
    first, second = graphs
    assert [first.tensors[n].fix_point for n in (first.inputs[0], first.outputs[0])] == [5, 4]
    assert [second.tensors[n].fix_point for n in (second.inputs[0], second.outputs[0])] == [7, 5]


# -- zoo models that need the new coverage (reduced variants) ---------------------------------------------------
@pytest.mark.parametrize("name", ["resnext50_32x4d", "mobilenetv3_small"])
def test_zoo_grouped_and_se_models_run_wholly_on_the_dpu(name):
    """Reduced ResNeXt-50 (grouped 3x3 convs) and MobileNetV3-Small (SE gates, hard sigmoid / swish, also after
    the classifier's Gemm): one DPU subgraph, golden == emulator, cosine > 0.99 vs onnxruntime."""
    import onnxruntime as ort

    import tvm_dpu
    from tvm_dpu import zoo

    model = zoo.build_model(name, reduced=True)
    compiled = tvm_dpu.build(model, arch=ARCHS[0], calibration=[zoo.random_input(model, seed=0)], progress=False)
    rep = compiled.partition_report
    assert not rep.cpu_nodes and rep.subgraphs == 1, [(n.name, n.reason) for n in rep.cpu_nodes]
    if name == "resnext50_32x4d":
        assert rep.node("layer1.0.conv2").note == ("grouped conv decomposed into 4 group convs (4 -> 4 channels "
                                                   "each) on the CONV engine")
    x = zoo.random_input(model, seed=1)
    compiled.set_verify(True)
    y = compiled.run(x)[0]
    assert sum(r.mismatches for r in compiled.verify_results()) == 0
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"input": x})[0]
    cos = float(np.dot(y.ravel(), ref.ravel()) / (np.linalg.norm(y) * np.linalg.norm(ref)))
    assert cos > 0.99, cos


# -- batch > 1 ---------------------------------------------------------------------------------------------------
def test_batch_runs_on_the_dpu_image_by_image():
    """A batch-3 model: every node on the DPU, the program computes one image and runs three times; golden ==
    emulator for every image, outputs equal the batch-1 build's per image, cosine > 0.99 vs onnxruntime."""
    import onnxruntime as ort

    import tvm_dpu
    from tvm_dpu import zoo

    model = zoo.build_model("squeezenet1_1", reduced=True, batch=3)
    single = zoo.build_model("squeezenet1_1", reduced=True)
    x = zoo.random_input(model, seed=1)
    calib = [zoo.random_input(single, seed=0)]
    compiled = tvm_dpu.build(model, arch=ARCHS[0], calibration=[np.concatenate([calib[0]] * 3)], progress=False)
    rep = compiled.partition_report
    assert not rep.cpu_nodes and rep.subgraphs == 1
    compiled.set_verify(True)
    y = compiled.run(x)[0]
    results = compiled.verify_results()
    assert sum(r.mismatches for r in results) == 0 and sum(r.elements for r in results) > 0
    assert y.shape == (3, 10)
    one = tvm_dpu.build(single, arch=ARCHS[0], calibration=calib, progress=False)
    for i in range(3):
        np.testing.assert_array_equal(y[i:i + 1], one.run(x[i:i + 1])[0])
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"input": x})[0]
    cos = float(np.dot(y.ravel(), ref.ravel()) / (np.linalg.norm(y) * np.linalg.norm(ref)))
    assert cos > 0.99, cos


@pytest.mark.parametrize("arch", ARCHS)
def test_pool_window_wraps_limit_matches_codegen(arch):
    """limits.json window_wraps_max: a global average pool of 4*PP rows compiles (bit-exact), 4*PP+1 rows is
    refused by the limits and cannot be emitted either (full-size MobileNetV3's 56x56 SE pool)."""
    from tvm_dpu.arch import OpDesc, check_op, load_arch
    from tvm_dpu.codegen.compiler import compile_graph
    from tvm_dpu.codegen.tiling import CodegenError

    a = load_arch(arch)
    for k, ok in ((4 * a.pp, True), (4 * a.pp + 1, False)):
        assert (check_op(a, OpDesc("global_avg_pool", (1, 8, k, k), (1, 8, 1, 1))) == []) is ok
        b = _B(k)
        x = b.input(8, k, k)
        b.op("avg_pool2d", [x], (1, 8, 1, 1), 4, kernel=[k, k], strides=[1, 1])
        if ok:
            _check(b.g, arch)
        else:
            b.g.outputs = [b.g.ops[-1].outputs[0]]
            with pytest.raises(CodegenError, match="bank wraps"):
                compile_graph(b.g, a)
