"""Golden reference of the conv family: conv2d (groups, dilation), depthwise_conv2d, conv2d_transpose, dense.

acc = sum over taps and input channels of x * w (zero padding, exact integers); then, with the parameters of
`quant.rules.conv_params`, t = (acc + bias * 2**shift_bias) / 2**shift_cut, the activation on the unrounded t and
one DPURound, computed with exact integer shifts (isa1-semantics.md 6.4 "Exact integer equivalents").
"""
from __future__ import annotations

import numpy as np

from tvm_dpu.arch.arch import LEAKY_NUM, LEAKY_SHIFT
from tvm_dpu.quant.fixpoint import RELU6_MAX, saturate_int8, shift_round
from tvm_dpu.quant.rules import ConvQuant
from tvm_dpu.xgraph.graph import Graph, Op
from tvm_dpu.xgraph.ops import Window, attr, conv_window, dense_weights_shape, quant_params, sliced_input

#: Below this many terms per output an int8 x int8 sum is exact in float64 (|acc| < 2**53), so the
#: accumulation can use BLAS: 2**53 / 2**14.
_EXACT_TERMS = 1 << 39


def pad_or_crop(x: np.ndarray, top: int, left: int, bottom: int, right: int, value: int = 0) -> np.ndarray:
    """Pad (positive amounts) or crop (negative amounts) the last two axes; x itself when all are 0."""
    if top == left == bottom == right == 0:
        return x
    x = x[..., max(0, -top): x.shape[-2] - max(0, -bottom), max(0, -left): x.shape[-1] - max(0, -right)]
    pads = [(0, 0)] * (x.ndim - 2) + [(max(0, top), max(0, bottom)), (max(0, left), max(0, right))]
    return np.pad(x, pads, constant_values=value)


def windows(x: np.ndarray, win: Window, value: int = 0) -> np.ndarray:
    """(N, C, Ho, Wo, kh, kw) view of the padded input under each (dilated, strided) window."""
    pt, pl, pb, pr = win.pads
    xp = pad_or_crop(x, pt, pl, pb, pr, value)
    eh, ew = win.dh * (win.kh - 1) + 1, win.dw * (win.kw - 1) + 1
    ho, wo = win.out_hw(x.shape[2], x.shape[3])
    v = np.lib.stride_tricks.sliding_window_view(xp, (eh, ew), axis=(2, 3))
    return v[:, :, : (ho - 1) * win.sh + 1: win.sh, : (wo - 1) * win.sw + 1: win.sw, :: win.dh, :: win.dw]


def conv_accumulate(x: np.ndarray, w: np.ndarray, win: Window, groups: int = 1) -> np.ndarray:
    """Exact int64 sum of x * w over taps and the input channels of each group. x (N, C, H, W), w (O, C/g, kh, kw)."""
    n, c, _, _ = x.shape
    o, cg, kh, kw = w.shape
    assert cg * groups == c and o % groups == 0 and (kh, kw) == (win.kh, win.kw)
    if cg * kh * kw >= _EXACT_TERMS:
        raise ValueError(f"conv reduction of {cg * kh * kw} terms is too long for exact float64 accumulation")
    v = windows(x.astype(np.float64), win)  # N, C, Ho, Wo, kh, kw
    ho, wo = v.shape[2], v.shape[3]
    v = v.reshape(n, groups, cg, ho, wo, kh, kw)
    wg = w.astype(np.float64).reshape(groups, o // groups, cg, kh, kw)
    acc = np.einsum("ngchwij,gocij->ngohw", v, wg, optimize=True)
    return np.rint(acc).astype(np.int64).reshape(n, o, ho, wo)


def requantize(acc: np.ndarray, bias: np.ndarray | None, q: ConvQuant) -> np.ndarray:
    """int8 output of the CONV datapath from the exact accumulator (N, O, H, W)."""
    v = np.asarray(acc, dtype=np.int64)
    n = q.shift_cut
    if bias is not None:
        b = bias.astype(np.int64)[None, :, None, None]
        if q.shift_bias >= 0:
            v = v + (b << np.int64(q.shift_bias))
        else:  # a bias finer than the accumulator (shift_bias -1): t = (2*acc + bias) / 2**(shift_cut + 1)
            k = -q.shift_bias
            v, n = (v << np.int64(k)) + b, n + k
    if q.act == "leaky_relu":
        # t < 0 -> t * 26/256: one rounding of 26*v / 2**(n+8), not a rounding of the rounded t.
        r = np.where(v < 0, shift_round(v * LEAKY_NUM, n + LEAKY_SHIFT), shift_round(v, n))
    else:
        r = shift_round(v, n)
        if q.act == "relu":
            r = np.maximum(r, 0)
        elif q.act == "relu6":
            # 96 is an integer, so clamping after the rounding equals clamping t before it.
            r = np.clip(r, 0, RELU6_MAX)
        else:
            assert q.act == "none", q.act
    return saturate_int8(r)


def _bias(op: Op, graph: Graph) -> np.ndarray | None:
    b = graph.param(op, "bias", required=False)
    return None if b is None else b.data


def eval_conv2d(op: Op, graph: Graph, x: np.ndarray) -> np.ndarray:
    """conv2d (a partial one over its in_slice) and depthwise_conv2d."""
    x = sliced_input(op, graph, x)
    w = graph.param(op, "weights").data  # type: ignore[union-attr]
    groups = x.shape[1] if op.type == "depthwise_conv2d" else int(attr(op, "groups"))
    acc = conv_accumulate(x, w, conv_window(op, graph), groups)
    return requantize(acc, _bias(op, graph), quant_params(op, graph))


def eval_dense(op: Op, graph: Graph, x: np.ndarray) -> np.ndarray:
    """Dense = conv whose kernel covers the whole (C, H, W) input (of its in_slice); flattening order C, H, W."""
    x = sliced_input(op, graph, x)
    w = graph.param(op, "weights").data.reshape(dense_weights_shape(op, graph))  # type: ignore[union-attr]
    acc = conv_accumulate(x, w, conv_window(op, graph))
    return requantize(acc, _bias(op, graph), quant_params(op, graph))


def transposed_as_conv(x: np.ndarray, w: np.ndarray, strides: tuple[int, int], pads: tuple[int, int, int, int],
                       dilations: tuple[int, int], output_padding: tuple[int, int], groups: int
                       ) -> tuple[np.ndarray, np.ndarray, Window]:
    """Rewrite a transposed conv as a stride-1 conv: (zero-inserted, padded input, flipped kernel, window).

    Input pixels are spread `stride` apart with zeros in between; each side is padded by d*(k-1) - pad (a
    negative amount crops), plus output_padding at the bottom / right; the kernel (I, O/g, kh, kw) is flipped
    spatially and its in/out axes swapped per group to (O, I/g, kh, kw).
    """
    n, c, h, wd = x.shape
    sh, sw = strides
    dh, dw = dilations
    ci, og, kh, kw = w.shape
    xu = np.zeros((n, c, (h - 1) * sh + 1, (wd - 1) * sw + 1), dtype=x.dtype)
    xu[:, :, ::sh, ::sw] = x
    pt, pl, pb, pr = pads
    eh, ew = dh * (kh - 1), dw * (kw - 1)
    xp = pad_or_crop(xu, eh - pt, ew - pl, eh - pb + output_padding[0], ew - pr + output_padding[1])
    cg = ci // groups
    wf = w[:, :, ::-1, ::-1].reshape(groups, cg, og, kh, kw).transpose(0, 2, 1, 3, 4).reshape(groups * og, cg, kh, kw)
    return xp, np.ascontiguousarray(wf), Window(kh, kw, 1, 1, dh, dw)


def eval_conv2d_transpose(op: Op, graph: Graph, x: np.ndarray) -> np.ndarray:
    w = graph.param(op, "weights").data  # type: ignore[union-attr]
    xp, wf, win = transposed_as_conv(x, w, tuple(attr(op, "strides")), tuple(attr(op, "pads")),
                                     tuple(attr(op, "dilations")), tuple(attr(op, "output_padding")),
                                     int(attr(op, "groups")))
    acc = conv_accumulate(xp, wf, win, int(attr(op, "groups")))
    return requantize(acc, _bias(op, graph), quant_params(op, graph))
