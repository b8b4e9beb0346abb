"""Golden reference of element-wise ops (ELEW, isa1-semantics.md 8.3), concat, nearest upsampling and the
standalone ALU activations (modes 4 leaky, 1 prelu, 7 hard-sigmoid, 6 for relu / relu6)."""
from __future__ import annotations

import numpy as np

from tvm_dpu.quant.fixpoint import HSIGMOID_MUL, saturate_int8, shift_round
from tvm_dpu.quant.rules import EltwiseQuant, HSigmoidQuant, PreluQuant
from tvm_dpu.xgraph.golden_conv import requantize
from tvm_dpu.xgraph.golden_pool import maxpool
from tvm_dpu.xgraph.graph import Graph, Op
from tvm_dpu.xgraph.ops import Window, attr, quant_params


def eltwise(xs: list[np.ndarray], q: EltwiseQuant) -> np.ndarray:
    """a_i = floor(4 x_i / 2**shift_read_i) (arithmetic shift, truncating); add: t = sum(a) * 2**e / 4;
    mul: t = a_0 * a_1 * 2**e / 16; relu on t; DPURound."""
    a = [(x.astype(np.int64) << np.int64(2)) >> np.int64(sr) for x, sr in zip(xs, q.shift_read)]
    if q.kind == "add":
        total, frac_bits = sum(a[1:], a[0]), 2
    else:
        total, frac_bits = a[0] * a[1], 4
    if q.act == "relu":
        total = np.maximum(total, 0)
    return saturate_int8(shift_round(total, frac_bits - q.write_exp))


def eval_eltwise(op: Op, graph: Graph, *xs: np.ndarray) -> np.ndarray:
    return eltwise(list(xs), quant_params(op, graph))


def eval_concat(op: Op, graph: Graph, *xs: np.ndarray) -> np.ndarray:
    """Inputs with the output fix_point are copied; others go through a 1x1 requantizing ALU maxpool."""
    q = quant_params(op, graph)
    parts = [x if r is None else maxpool(x, Window(1, 1), r) for x, r in zip(xs, q.requant)]
    return np.concatenate(parts, axis=int(attr(op, "axis")))


def eval_upsample_nearest(op: Op, graph: Graph, x: np.ndarray) -> np.ndarray:
    quant_params(op, graph)
    sh, sw = attr(op, "scale")
    return x.repeat(sh, axis=2).repeat(sw, axis=3)


def prelu(x: np.ndarray, slope: np.ndarray | int, q: PreluQuant) -> np.ndarray:
    """ALU modes 1 / 4: v = x * slope for x < 0, else x; divide by 2**shift_n if v < 0 else 2**shift_p (the sign
    test is on v, after the slope), DPURound."""
    x = x.astype(np.int64)
    v = np.where(x < 0, x * np.asarray(slope, dtype=np.int64), x)
    return saturate_int8(np.where(v < 0, shift_round(v, q.shift_n), shift_round(v, q.shift_p)))


def hsigmoid(x: np.ndarray, q: HSigmoidQuant) -> np.ndarray:
    """ALU mode 7: min(2**32, max(0, x*2731 + 3*2731*2**shift_bias)) / 2**shift_cut, DPURound."""
    v = x.astype(np.int64) * HSIGMOID_MUL + 3 * HSIGMOID_MUL * (np.int64(1) << np.int64(q.shift_bias))
    return saturate_int8(shift_round(np.clip(v, 0, np.int64(1) << np.int64(32)), q.shift_cut))


def eval_activation(op: Op, graph: Graph, x: np.ndarray) -> np.ndarray:
    q = quant_params(op, graph)
    mode = attr(op, "mode")
    if mode in ("relu", "relu6"):
        return requantize(x.astype(np.int64) * q.weight, None, q)
    if mode == "leaky_relu":
        return prelu(x, q.multi_factor, q)
    if mode == "prelu":
        slopes = graph.param(op, "alpha").data  # type: ignore[union-attr]
        return prelu(x, slopes.astype(np.int64)[None, :, None, None], q)
    return hsigmoid(x, q)
