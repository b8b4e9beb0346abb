"""Removal of inference no-ops: Dropout (``nn.dropout(x)[0]`` -> ``x``), reshape / broadcast_to to the same shape,
astype to the same dtype, and collapsing ``reshape(reshape(x))`` into one reshape. The names of removed Calls are
recorded as absorbed into the producer of the value that replaces them."""
from __future__ import annotations

import tvm
from tvm import relax

from . import provenance as prov
from .const_fold import static_shape
from .rewrite import Rewriter, op_name, rewrite_module


def rule(rw: Rewriter, var: relax.Var, value: relax.Expr):
    """Rewriter callback of remove_noops (one binding)."""
    if isinstance(value, relax.TupleGetItem) and value.index == 0:
        drop = rw.producer_call(value.tuple_value, "relax.nn.dropout")
        if drop is not None:
            rw.absorb(prov.node_names(drop), drop.args[0])
            return drop.args[0]
        return None
    name = op_name(value)
    if name in ("relax.reshape", "relax.broadcast_to", "relax.squeeze", "relax.expand_dims", "relax.flatten"):
        x = value.args[0]
        shape = static_shape(value)
        if shape is not None and shape == static_shape(x) and isinstance(x, relax.Var):
            return x
        inner = rw.producer_call(x, "relax.reshape")
        if name == "relax.reshape" and inner is not None and rw.single_use(x) and shape is not None:
            src = inner.args[0]
            if static_shape(src) == shape and isinstance(src, relax.Var):
                rw.absorb(prov.node_names(inner), src)
                return src
            return prov.with_nodes(relax.op.reshape(src, shape), prov.merge(inner, rw.cur_names))
        return None
    if name == "relax.astype" and str(value.attrs.dtype) == str(value.args[0].ty.dtype):
        return value.args[0] if isinstance(value.args[0], relax.Var) else None
    return None


def remove_noops(mod: tvm.IRModule) -> tvm.IRModule:
    """Drop Dropout / identity reshapes / same-type casts and merge reshape chains."""
    return rewrite_module(mod, rule)
