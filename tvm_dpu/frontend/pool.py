"""``mean`` over the spatial axes of an NCHW tensor (ReduceMean axes [2,3], GlobalAveragePool) -> ``avg_pool2d``
with a kernel covering the whole H x W, followed by a reshape to ``[N, C]`` when ``keepdims`` is false."""
from __future__ import annotations

import tvm
from tvm import relax

from .const_fold import static_shape
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
