"""``mean`` over the spatial axes of an NCHW tensor (ReduceMean axes [2,3], GlobalAveragePool) -> ``avg_pool2d``
with a kernel covering the whole H x W, followed by a reshape to ``[N, C]`` when ``keepdims`` is false."""
from __future__ import annotations

import tvm
from tvm import relax

from ..quant.fixpoint import avgpool_factor
from .const_fold import const_array, static_shape
from .rewrite import Rewriter, op_name, rewrite_module


def rule(rw: Rewriter, var: relax.Var, value: relax.Expr):
    """Rewriter callback of mean_to_avg_pool (one binding)."""
    if op_name(value) != "relax.mean":
        return None
    x = value.args[0]
    shape = static_shape(x)
    if shape is None or len(shape) != 4 or value.attrs.axis is None:
        return None
    axes = sorted(int(a) % 4 for a in value.attrs.axis)
    if axes != [2, 3] or not str(x.ty.dtype).startswith("float"):
        return None
    n, c, h, w = shape
    pooled = relax.op.nn.avg_pool2d(x, pool_size=(h, w), strides=(1, 1), padding=(0, 0, 0, 0),
                                    layout="NCHW")
    if bool(value.attrs.keepdims):
        return pooled
    return relax.op.reshape(rw.emit(pooled), [n, c])


def mean_to_avg_pool(mod: tvm.IRModule) -> tvm.IRModule:
    """Spatial mean -> global avg_pool2d (+ reshape)."""
    return rewrite_module(mod, rule)


def dpu_scale_rule(rw: Rewriter, var: relax.Var, value: relax.Expr):
    """``multiply(avg_pool2d(x), c)`` with the scalar c = kh*kw * m / 2**s of the DPU's average-pool factor m / 2**s
    -> ``avg_pool2d(x)``. AMD Quark writes this pair for the DPU's average pool (the exact mean times the DPU's
    rounding of 1/(kh*kw)); the DPU's own average pool computes exactly that product, so the Mul is absorbed and the
    pool stays on the DPU. Any other constant is a real Mul and is left alone."""
    if op_name(value) != "relax.multiply":
        return None
    a, b = value.args
    for pooled, const in ((a, b), (b, a)):
        pool = rw.producer_call(pooled, "relax.nn.avg_pool2d")
        c = const_array(const)
        if pool is None or c is None or c.size != 1 or not rw.single_use(pooled):
            continue
        kh, kw = (int(k) for k in pool.attrs.pool_size)
        m, sh = avgpool_factor(kh, kw)
        dpu = kh * kw * m / 2.0 ** sh
        if abs(float(c.reshape(())) - dpu) <= 1e-6 * dpu and static_shape(value) == static_shape(pooled):
            rw.absorb(rw.cur_names, pooled)
            return pooled
    return None


def absorb_dpu_avgpool_scale(mod: tvm.IRModule) -> tvm.IRModule:
    """Quark's avg_pool + Mul(DPU factor) -> avg_pool (see dpu_scale_rule)."""
    return rewrite_module(mod, dpu_scale_rule)
