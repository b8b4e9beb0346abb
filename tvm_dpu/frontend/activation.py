"""Canonical clamp-style activations.

The canonical form is: ``relax.nn.relu(x)`` for max(x, 0); ``relax.clip(x, lo, hi)`` (prim-value bounds, e.g.
``R.clip(x, 0, 6)`` for ReLU6 / ``Clip(0, 6)``) for every other clamp; nothing for an unbounded clamp.
Sources normalized to it: ONNX Clip (imported as ``relax.clip``), ``minimum``/``maximum`` with a scalar constant
(ONNX Min/Max, e.g. ``Min(Relu(x), 6)``), and chains of these, e.g. ``clip(relu(x), -inf, 6)`` ->
``clip(x, 0, 6)``. Chains are merged only when the two ranges overlap (otherwise the result is a constant and
we leave it alone). ``leakyrelu`` and other activations are not changed, but relu / clip / leakyrelu applied to a
reshape are moved before it (``act(reshape(y))`` -> ``reshape(act(y))``) so reshape pairs around fully connected
layers cancel.
"""
from __future__ import annotations

import math

import tvm
from tvm import relax

from . import provenance as prov
from .const_fold import const_array
from .rewrite import Rewriter, op_name, rewrite_module


def clamp_of(rw: Rewriter | None, value: relax.Expr) -> tuple[relax.Expr, float, float] | None:
    """(input, lo, hi) if ``value`` is a clamp-like Call."""
    name = op_name(value)
    if name == "relax.nn.relu":
        return value.args[0], 0.0, math.inf
    if name == "relax.clip":
        lo, hi = value.args[1], value.args[2]
        try:
            return value.args[0], float(lo.value), float(hi.value)
        except (AttributeError, TypeError, ValueError):
            return None
    if name in ("relax.minimum", "relax.maximum"):
        a, b = value.args
        ca, cb = const_array(a), const_array(b)
        if (ca is None) == (cb is None):
            return None
        x, c = (b, ca) if ca is not None else (a, cb)
        if c.size != 1 or tuple(value.ty.shape.values) != tuple(x.ty.shape.values):
            return None
        v = float(c.reshape(()))
        return (x, -math.inf, v) if name == "relax.minimum" else (x, v, math.inf)
    return None


def _hoist_over_reshape(rw: Rewriter, value: relax.Expr):
    """act(reshape(y)) -> reshape(act(y)): elementwise ops commute with reshapes, and this keeps a fully connected
    stack (conv 1x1 -> reshape -> relu -> reshape -> conv 1x1) in 4-D so the reshape pairs cancel."""
    if op_name(value) not in ("relax.nn.relu", "relax.clip", "relax.nn.leakyrelu"):
        return None
    x = value.args[0]
    rs = rw.producer_call(x, "relax.reshape")
    if rs is None or not rw.single_use(x):
        return None
    act = rw.emit(relax.Call(value.op, [rs.args[0]] + list(value.args[1:]), value.attrs, value.ty_args),
                  rw.cur_names)
    return prov.with_nodes(relax.op.reshape(act, rs.args[1]), prov.node_names(rs) or rw.cur_names)


def rule(rw: Rewriter, var: relax.Var, value: relax.Expr):
    """Rewriter callback of canonicalize_activations (one binding)."""
    out = _clamp_rule(rw, var, value)
    if out is not None and not isinstance(out, relax.Call):
        return out  # an unbounded clamp: gone
    if isinstance(out, relax.Call):
        out = rw.normalize(prov.with_nodes(out, prov.node_names(out) or rw.cur_names))
        rw.cur_names = prov.node_names(out)
    hoisted = _hoist_over_reshape(rw, out if isinstance(out, relax.Call) else value)
    return hoisted if hoisted is not None else out


def _clamp_rule(rw: Rewriter, var: relax.Var, value: relax.Expr):
    got = clamp_of(rw, value)
    if got is None or not str(value.ty.dtype).startswith("float"):
        return None
    x, lo, hi = got
    names = list(rw.cur_names)
    inner_call = rw.producer(x)
    inner = clamp_of(rw, inner_call) if isinstance(inner_call, relax.Call) and rw.single_use(x) else None
    if inner is not None:
        x2, lo2, hi2 = inner
        nlo, nhi = max(lo, lo2), min(hi, hi2)
        if nlo <= nhi:
            x, lo, hi = x2, nlo, nhi
            names = prov.merge(inner_call, names)
    if lo == 0.0 and hi == math.inf:
        out = relax.op.nn.relu(x)
    elif lo == -math.inf and hi == math.inf:
        if isinstance(x, relax.Var):
            return x
        return None
    else:
        out = relax.op.clip(x, relax.prim_value(float(lo)), relax.prim_value(float(hi)))
    if op_name(value) == op_name(out) and x.same_as(value.args[0]) and not inner:
        return None
    return prov.with_nodes(out, names)


def canonicalize_activations(mod: tvm.IRModule) -> tvm.IRModule:
    """relu / clip / scalar minimum / scalar maximum chains -> relu or clip(x, lo, hi)."""
    return rewrite_module(mod, rule)
