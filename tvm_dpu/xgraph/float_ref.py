"""Float reference of the XGraph ops: the real-valued function each op stands for, in float64 numpy.

This is what the quantizer calibrates on and what a quantized graph is measured against. It is the model's
semantics, not the DPU's: average pooling divides by the true window count (``count_include_pad`` honoured, 1/9
not 7/64), LeakyReLU uses the op's own ``alpha``, hard-sigmoid is relu6(x + 3) / 6, and nothing is rounded.

Constants are read as float: float32 data as is, integer data with a fix_point as q * 2**-fix_point, so the same
evaluator runs a float graph or the dequantized view of an int8 graph. Feature maps are (N, C, H, W); the batch
size N of the feeds may differ from the one the graph declares (calibration runs whole batches at once).

One evaluator per op type (`FLOAT_EVALUATORS`, the `float_ref` hooks of the op registry tvm_dpu/ops/), each
``fn(op, graph, *inputs) -> output array``.
"""
from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from tvm_dpu.ops import HookTable
from tvm_dpu.quant.fixpoint import LEAKY_ALPHA
from tvm_dpu.xgraph.graph import Graph, GraphError, Op, Tensor
from tvm_dpu.xgraph.ops import Window, attr, conv_window, dense_weights_shape, pool_window, sliced_input
from tvm_dpu.xgraph.validate import run_ops, validate_feeds

FloatEvaluator = Callable[..., np.ndarray]


def const_value(t: Tensor, user: str = "") -> np.ndarray:
    """The real value of constant `t` as float64: float data as is, integer data times 2**-fix_point."""
    if t.data is None:
        raise GraphError(f"{user or 'float reference'}: tensor {t.name!r} has no data")
    if t.data.dtype.kind == "f":
        return t.data.astype(np.float64)
    if t.fix_point is None:
        raise GraphError(f"{user or 'float reference'}: integer constant {t.name!r} has no fix_point")
    return t.data.astype(np.float64) * 2.0 ** -int(t.fix_point)


def _param(op: Op, graph: Graph, role: str, required: bool = True) -> np.ndarray | None:
    t = graph.param(op, role, required)
    return None if t is None else const_value(t, op.where())


def _windows(x: np.ndarray, win: Window, value: float = 0.0) -> np.ndarray:
    # Imported here: golden_conv imports tvm_dpu.quant, whose package may be importing this module.
    from tvm_dpu.xgraph.golden_conv import windows
    return windows(x, win, value)


def apply_act(y: np.ndarray, act: str, alpha: float | None, where: str, out: np.ndarray | None = None) -> np.ndarray:
    """Fused activation of a conv / eltwise op on float values. alpha None means the DPU's 26/256. `out`: where
    relu / relu6 write their result (y itself for an array the caller owns)."""
    if act == "none":
        return y
    if act == "relu":
        return np.maximum(y, 0.0, out=out)
    if act == "relu6":
        return np.clip(y, 0.0, 6.0, out=out)
    if act == "leaky_relu":
        a = LEAKY_ALPHA if alpha is None else float(alpha)
        return np.where(y < 0, a * y, y)
    raise GraphError(f"{where}: unknown activation {act!r}")


def _conv(x: np.ndarray, w: np.ndarray, win: Window, groups: int) -> np.ndarray:
    n, c, _, _ = x.shape
    o, cg, kh, kw = w.shape
    if cg * groups != c or o % groups:
        raise GraphError(f"float reference: weights {w.shape} do not match {c} input channels in {groups} groups")
    v = _windows(x, win)  # N, C, Ho, Wo, kh, kw
    ho, wo = v.shape[2], v.shape[3]
    # A band of output rows at a time: the windows it reads are gathered into one float64 array, which for a
    # whole layer is large (VGG-16's conv1_2: 231 MB per image). Each output value is the same sum either way.
    rows = max(1, _CONV_CHUNK // max(1, n * wo * c * kh * kw))
    out = np.empty((n, o, ho, wo), dtype=np.result_type(x, w))
    if groups == 1:
        _conv_gemm(v, np.ascontiguousarray(w).reshape(o, c * kh * kw), rows, out)
        return out
    wg = w.reshape(groups, o // groups, cg, kh, kw)
    for lo in range(0, ho, rows):
        band = v[:, :, lo:lo + rows]
        band = band.reshape(n, groups, cg, band.shape[2], wo, kh, kw)
        out[:, :, lo:lo + rows] = np.einsum("ngchwij,gocij->ngohw", band, wg, optimize=True).reshape(
            n, o, band.shape[3], wo)
    return out


def _conv_gemm(v: np.ndarray, wm: np.ndarray, rows: int, out: np.ndarray) -> None:
    """Ungrouped conv of the windows `v` (N, C, Ho, Wo, kh, kw) with weights `wm` (O, C*kh*kw) into `out`
    (N, O, Ho, Wo), `rows` output rows per band: one product wm @ cols per band, cols (C*kh*kw, N*rows*Wo) in
    (c, i, j) x (n, h, w) order.

    That is the dgemm (shapes, operand order, reduction order c, i, j) numpy's einsum("ngchwij,gocij->ngohw")
    makes of the same band, so every value is bit for bit the einsum's (the calibration fix points, hence the
    artifacts, depend on these bits; tests/test_float_ref.py checks it). Gathering the windows in (c, i, j, n, h,
    w) order copies whole rows (the einsum's (h, w, c, i, j) order copies kw values at a time), an unpadded 1x1
    stride-1 band of one whole image is the input itself (no copy), and the product of a whole-image band is
    written straight into `out`.
    """
    n, _, ho, wo = v.shape[:4]
    o, k = wm.shape
    for lo in range(0, ho, rows):
        band = v[:, :, lo:lo + rows]
        r = band.shape[2]
        cols = np.ascontiguousarray(band.transpose(1, 4, 5, 0, 2, 3)).reshape(k, n * r * wo)
        if n == 1 and r == ho:
            np.matmul(wm, cols, out=out.reshape(o, ho * wo))
        else:
            out[:, :, lo:lo + r] = np.matmul(wm, cols).reshape(o, n, r, wo).transpose(1, 0, 2, 3)


def _finish_conv(op: Op, graph: Graph, y: np.ndarray) -> np.ndarray:
    """Bias and activation of a conv-class op, in place in its freshly computed sums `y`."""
    b = _param(op, graph, "bias", required=False)
    if b is not None:
        y += b[None, :, None, None]
    return apply_act(y, attr(op, "act"), attr(op, "alpha"), op.where(), out=y)


#: Weights above this many elements (VGG-16's fc6: 103 M) are made float64 a slice of output channels at a time,
#: so the reference never holds a float64 copy of the whole tensor; `_conv` gathers at most this many window
#: values at a time.
_CONV_CHUNK = 1 << 22


def eval_conv2d(op: Op, graph: Graph, x: np.ndarray) -> np.ndarray:
    """conv2d (groups, dilations, pads, strides; a partial one over its in_slice) and depthwise_conv2d (groups =
    channels)."""
    x = sliced_input(op, graph, x)
    groups = x.shape[1] if op.type == "depthwise_conv2d" else int(attr(op, "groups"))
    t = graph.param(op, "weights")
    assert t is not None
    win = conv_window(op, graph)
    if groups == 1 and t.data is not None and t.data.size > _CONV_CHUNK:
        step = max(1, _CONV_CHUNK // max(1, t.data[0].size))
        parts = []
        for lo in range(0, t.shape[0], step):
            piece = Tensor(t.name, t.data[lo:lo + step].shape, t.dtype, t.fix_point, t.data[lo:lo + step])
            parts.append(_conv(x, const_value(piece, op.where()), win, 1))
        return _finish_conv(op, graph, np.concatenate(parts, axis=1))
    return _finish_conv(op, graph, _conv(x, const_value(t, op.where()), win, groups))


def eval_conv2d_transpose(op: Op, graph: Graph, x: np.ndarray) -> np.ndarray:
    """Transposed conv, through the same stride-1 rewrite the golden reference documents."""
    from tvm_dpu.xgraph.golden_conv import transposed_as_conv
    w = _param(op, graph, "weights")
    assert w is not None
    groups = int(attr(op, "groups"))
    xp, wf, win = transposed_as_conv(x, w, tuple(attr(op, "strides")), tuple(attr(op, "pads")),
                                     tuple(attr(op, "dilations")), tuple(attr(op, "output_padding")), groups)
    return _finish_conv(op, graph, _conv(xp, wf, win, groups))


def eval_dense(op: Op, graph: Graph, x: np.ndarray) -> np.ndarray:
    """Dense over the (C, H, W) input (of its in_slice) flattened in C, H, W order; output (N, O, 1, 1)."""
    x = sliced_input(op, graph, x)
    w = _param(op, graph, "weights")
    assert w is not None
    w = w.reshape(dense_weights_shape(op, graph))
    y = np.einsum("nchw,ochw->no", x, w, optimize=True)[:, :, None, None]
    return _finish_conv(op, graph, y)


def eval_max_pool2d(op: Op, graph: Graph, x: np.ndarray) -> np.ndarray:
    """Window max; padded positions never win (-inf)."""
    v = _windows(x, pool_window(op, graph), -np.inf)
    # A running maximum over the kh * kw taps, each a strided (N, C, Ho, Wo) view: the values of
    # v.max(axis=(-2, -1)) (a max is exact in any order), without reducing over two short inner axes.
    out = v[..., 0, 0].copy()
    for i in range(v.shape[-2]):
        for j in range(v.shape[-1]):
            if i or j:
                np.maximum(out, v[..., i, j], out=out)
    return out


def eval_avg_pool2d(op: Op, graph: Graph, x: np.ndarray) -> np.ndarray:
    """Window mean; with count_include_pad=False the divisor counts only the positions inside the input."""
    win = pool_window(op, graph)
    s = _windows(x, win).sum(axis=(-2, -1))
    if attr(op, "count_include_pad") or attr(op, "global") or not any(win.pads):
        return s / (win.kh * win.kw)
    ones = np.ones((1, 1) + x.shape[2:], dtype=np.float64)
    return s / _windows(ones, win).sum(axis=(-2, -1))


def eval_eltwise(op: Op, graph: Graph, *xs: np.ndarray) -> np.ndarray:
    if op.type == "eltwise_add":
        y = xs[0] + xs[1] if len(xs) > 1 else xs[0].copy()
        for more in xs[2:]:
            y += more
    else:
        y = xs[0] * xs[1]
    return apply_act(y, attr(op, "act"), None, op.where(), out=y)  # y is this op's own array


def eval_concat(op: Op, graph: Graph, *xs: np.ndarray) -> np.ndarray:
    return np.concatenate(xs, axis=int(attr(op, "axis")))


def eval_upsample_nearest(op: Op, graph: Graph, x: np.ndarray) -> np.ndarray:
    sh, sw = attr(op, "scale")
    return x.repeat(sh, axis=2).repeat(sw, axis=3)


def eval_activation(op: Op, graph: Graph, x: np.ndarray) -> np.ndarray:
    """leaky_relu (the op's alpha), prelu (per-channel slopes), hard_sigmoid = relu6(x + 3) / 6, relu, relu6."""
    mode = attr(op, "mode")
    if mode == "leaky_relu":
        return apply_act(x, "leaky_relu", attr(op, "alpha"), op.where())
    if mode == "prelu":
        a = _param(op, graph, "alpha")
        assert a is not None
        return np.where(x < 0, x * a[None, :, None, None], x)
    if mode == "hard_sigmoid":
        return np.clip(x + 3.0, 0.0, 6.0) / 6.0
    if mode in ("relu", "relu6"):
        return apply_act(x, mode, None, op.where())
    raise GraphError(f"{op.where()}: activation mode {mode!r} has no float reference")


#: Op type -> float evaluator, from the op registry (each OpDef's `float_ref` hook, defined above).
FLOAT_EVALUATORS: Mapping[str, FloatEvaluator] = HookTable("float_ref")


def run_op_float(op: Op, graph: Graph, env: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Compute one op in float64. Inputs come from `env` (by name) or, for constants, from the graph.

    Returns {output name: float64 array}. Raises GraphError for an unknown op type, a missing input, or an input
    whose (C, H, W) differs from the declared shape.
    """
    fn = FLOAT_EVALUATORS.get(op.type)
    if fn is None:
        raise GraphError(f"{op.where()}: unsupported op type {op.type!r} (float reference knows: "
                         f"{', '.join(FLOAT_EVALUATORS)})")
    args = []
    for name in op.inputs:
        t = graph.tensor(name, op.where())
        x = env[name] if name in env else (const_value(t, op.where()) if t.is_const else None)
        if x is None:
            raise GraphError(f"{op.where()}: no value for input {name!r}")
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != len(t.shape) or tuple(x.shape[1:]) != tuple(t.shape[1:]):
            raise GraphError(f"{op.where()}: input {name!r} has shape {tuple(x.shape)}, expected (N,) + "
                             f"{tuple(t.shape[1:])}")
        args.append(x)
    out = fn(op, graph, *args)
    expected = graph.tensor(op.outputs[0], op.where()).shape
    assert tuple(out.shape[1:]) == tuple(expected[1:]), (op.name, out.shape, expected)
    return {op.outputs[0]: out}


def run_graph_float(graph: Graph, feeds: dict[str, np.ndarray], keep_all: bool = False) -> dict[str, np.ndarray]:
    """Run `graph` in float64 on real-valued `feeds` (one per graph input, any batch size N).

    Returns the graph outputs by name, or every computed tensor (inputs included) with keep_all=True.
    """
    validate_feeds(graph, feeds)
    env: dict[str, np.ndarray] = {}
    batch = None
    for name, value in feeds.items():
        v = np.asarray(value, dtype=np.float64)
        t = graph.tensors[name]
        if v.ndim != len(t.shape) or tuple(v.shape[1:]) != tuple(t.shape[1:]):
            raise GraphError(f"graph {graph.name!r}: feed {name!r} has shape {tuple(v.shape)}, expected (N,) + "
                             f"{tuple(t.shape[1:])}")
        if batch is not None and v.shape[0] != batch:
            raise GraphError(f"graph {graph.name!r}: feed {name!r} has batch {v.shape[0]}, other feeds {batch}")
        batch = v.shape[0]
        env[name] = v
    return run_ops(graph, env, run_op_float, keep_all)
