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


# Hard sigmoid relu6(x + 3) / 6 as TVM's ONNX importer writes it: HardSigmoid(alpha=1/6, beta=0.5) is
# clip(x * 1/6 + 0.5, 0, 1) ("mul_add_clip"); HardSwish's gate is clip(x + 3, 0, 6) / 6 ("add_clip_div").
# Per form: the chain's ops and the constant of each (the clip's two bounds at the clip).
HARD_SIGMOID_FORMS: dict[str, tuple[tuple[str, tuple[float, ...]], ...]] = {
    "mul_add_clip": (("relax.multiply", (1 / 6,)), ("relax.add", (0.5,)), ("relax.clip", (0.0, 1.0))),
    "add_clip_div": (("relax.add", (3.0,)), ("relax.clip", (0.0, 6.0)), ("relax.divide", (6.0,))),
}


def close(got: float | None, want: float) -> bool:
    """A model constant equal to `want` up to float32 rounding."""
    return got is not None and abs(got - want) <= 1e-6 * max(1.0, abs(want))


def _scalar_operand(call: relax.Call) -> list[float] | None:
    """The constant operands of a hard-sigmoid chain op: the scalar of x*c / x+c / x/c, the bounds of a clip."""
    if op_name(call) == "relax.clip":
        try:
            return [float(call.args[1].value), float(call.args[2].value)]
        except (AttributeError, TypeError, ValueError):
            return None
    consts = [c for c in (const_array(a) for a in call.args) if c is not None]
    if len(consts) != 1 or consts[0].size != 1:
        return None
    if op_name(call) == "relax.divide" and const_array(call.args[1]) is None:  # c / x is not x / c
        return None
    return [float(consts[0].reshape(-1)[0])]


def starts_hard_sigmoid(rw: Rewriter, var: relax.Var, value: relax.Expr) -> bool:
    """Whether the binding `var = value` (input graph) is the first op of a hard-sigmoid chain whose inner ops have
    one consumer each. The affine fold must leave such an op alone: folded into the producing conv, the chain
    would lose the shape the DPU runs as one ALU hard-sigmoid (mode 7). The clip may be a chain of clamps that
    canonicalize_activations merges (torch.export writes clip(clip(x, 0, inf), -inf, 6))."""

    def next_of(v):
        users = rw.old_consumers.get(v, [])
        nxt = rw.old_single_consumer(v)
        return (users[0], nxt) if nxt is not None and len(users) == 1 else (None, None)

    for chain in HARD_SIGMOID_FORMS.values():
        v, e, ok = var, value, True
        for i, (name, consts) in enumerate(chain):
            if not isinstance(e, relax.Call):
                ok = False
                break
            if name == "relax.clip" and clamp_of(rw, e) is not None:
                lo, hi = -math.inf, math.inf
                while True:  # the clamps up to the chain's next op, intersected
                    _, a, b = clamp_of(rw, e)
                    lo, hi = max(lo, a), min(hi, b)
                    nv, ne = next_of(v) if i + 1 < len(chain) else (None, None)
                    if ne is None or clamp_of(rw, ne) is None:
                        break
                    v, e = nv, ne
                got = [lo, hi]
            elif op_name(e) == name:
                got = _scalar_operand(e)
            else:
                got = None
            if got is None or len(got) != len(consts) or not all(close(g, w) for g, w in zip(got, consts)):
                ok = False
                break
            if i + 1 < len(chain):
                v, e = next_of(v)
                if e is None:
                    ok = False
                    break
        if ok:
            return True
    return False


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


def _hard_swish_gate_first(rw: Rewriter, value: relax.Expr):
    """(x * clip(x + 3, 0, 6)) / 6 -> x * (clip(x + 3, 0, 6) / 6): the hard swish torch.export's decomposition
    writes, put in the order of TVM's importers (a hard-sigmoid gate, then an eltwise multiply), which the DPU runs
    as ALU mode 7 and an eltwise multiply. The two differ by float rounding only."""
    if op_name(value) != "relax.divide":
        return None
    six = const_array(value.args[1])
    if six is None or six.size != 1 or not close(float(six.reshape(-1)[0]), 6.0):
        return None
    mul = rw.producer_call(value.args[0], "relax.multiply")
    if mul is None or not rw.single_use(value.args[0]):
        return None
    for x, gate in ((mul.args[0], mul.args[1]), (mul.args[1], mul.args[0])):
        clip = rw.producer_call(gate, "relax.clip")
        add = rw.producer_call(clip.args[0], "relax.add") if clip is not None else None
        if add is None or _scalar_operand(clip) != [0.0, 6.0] or not add.args[0].same_as(x):
            continue
        three = _scalar_operand(add)
        if three is not None and close(three[0], 3.0):
            g = rw.emit(relax.op.divide(gate, value.args[1]), prov.node_names(mul) or rw.cur_names)
            return prov.with_nodes(relax.op.multiply(x, g), rw.cur_names)
    return None


def rule(rw: Rewriter, var: relax.Var, value: relax.Expr):
    """Rewriter callback of canonicalize_activations (one binding)."""
    swish = _hard_swish_gate_first(rw, value)
    if swish is not None:
        return swish
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
