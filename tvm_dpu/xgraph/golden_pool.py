"""Golden reference of pooling as the ISA1 ALU computes it (isa1-semantics.md 9.2).

max_pool2d (mode 3): window max with -128 padding, then DPURound(m * 2**exponent).
avg_pool2d (mode 2): s = window sum with zero padding (divisor always kh*kw, i.e. count_include_pad=True);
t = float32(s * multi_factor) * 2**exponent, DPURound. The simulator multiplies in single precision: the sum
itself is exact (|s| <= 2**23 for windows up to 256x256) but s * multi_factor is rounded to float32 once it
exceeds 2**24, and the golden reproduces that rounding.
"""
from __future__ import annotations

import numpy as np

from tvm_dpu.quant.fixpoint import INT8_MIN, saturate_int8, shift_round
from tvm_dpu.quant.rules import AvgPoolQuant, MaxPoolQuant
from tvm_dpu.xgraph.golden_conv import windows
from tvm_dpu.xgraph.graph import Graph, Op
from tvm_dpu.xgraph.ops import Window, pool_window, quant_params


def maxpool(x: np.ndarray, win: Window, q: MaxPoolQuant) -> np.ndarray:
    m = windows(x.astype(np.int64), win, value=INT8_MIN).max(axis=(-2, -1))
    return saturate_int8(shift_round(m, -q.exponent))


def avgpool(x: np.ndarray, win: Window, q: AvgPoolQuant) -> np.ndarray:
    s = windows(x.astype(np.int64), win, value=0).sum(axis=(-2, -1))
    p = (s.astype(np.float32) * np.float32(q.multi_factor)).astype(np.int64)  # float32 product, integer valued
    return saturate_int8(shift_round(p, -q.exponent))


def eval_max_pool2d(op: Op, graph: Graph, x: np.ndarray) -> np.ndarray:
    return maxpool(x, pool_window(op, graph), quant_params(op, graph))


def eval_avg_pool2d(op: Op, graph: Graph, x: np.ndarray) -> np.ndarray:
    return avgpool(x, pool_window(op, graph), quant_params(op, graph))
