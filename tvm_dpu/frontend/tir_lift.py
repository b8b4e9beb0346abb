"""Lift TE-lowered importer ops back to plain Relax ops.

TVM's own importers (``tvm.relax.frontend.onnx.from_onnx``; ``from_exported_program`` for some ops) lower a few
ONNX ops to ``call_tir`` of a TE PrimFunc at import time (``bb.emit_te``): Clip becomes
``call_tir(maximum)`` + ``call_tir(minimum)``, a constant Pad ``call_tir(pad)``. An opaque ``call_tir`` cannot be
pattern-matched, so every Clip (ReLU6) of a MobileNetV2 would split the DPU partition. tvm-dpu's own importer
avoids this at import (onnx_import._override); this rule repairs a module imported by TVM's importer.

A call is lifted only when its PrimFunc is *exactly* the one TE generates for the candidate Relax op: the
candidate's PrimFunc is regenerated with ``te.create_prim_func`` for the call's shapes (and the constants read off
the PrimFunc) and compared with ``structural_equal``. Anything else is left as it was.

Lifted forms:

* ``topi.maximum`` / ``topi.minimum`` of a tensor and a tensor (any broadcast) -> ``relax.maximum`` / ``minimum``;
  with an immediate (ONNX Clip before opset 11): the immediate becomes a scalar constant;
* ``topi.nn.pad`` (constant mode) -> ``relax.nn.pad``;
* ONNX Min/Max with several inputs, which the importer writes as ``max(stack(broadcast_to(a), broadcast_to(b)),
  axis=0)``, -> ``maximum(a, b)`` (chained for more inputs).

The lifted ops then go through the rest of normalization (``maximum(minimum(x, 6), 0)`` -> ``clip(x, 0, 6)``).
"""
from __future__ import annotations

import itertools
from collections.abc import Callable

import tvm
import tvm_ffi
from tvm import relax

from . import provenance as prov
from .const_fold import const_array
from .rewrite import Rewriter, op_name, rewrite_module

_CALL_TIR = "relax.call_tir"
#: Pads with more split candidates than this are not searched (real pads have a handful).
_MAX_PAD_CANDIDATES = 256


def _static_shape(e: relax.Expr) -> list[int] | None:
    try:
        return [int(v) for v in e.ty.shape.values]
    except (AttributeError, TypeError, ValueError):
        return None


def _float_imms(func: tvm.tirx.PrimFunc) -> list[float]:
    """The distinct float immediates of `func`'s body, in order of appearance (a walk over the reflected fields
    of the TIR objects: TVM 0.27 has no Python TIR visitor)."""
    found: list[float] = []
    stack: list = [func.body]
    while stack:
        node = stack.pop()
        if isinstance(node, tvm.tirx.FloatImm):
            if float(node.value) not in found:
                found.append(float(node.value))
        elif isinstance(node, (list, tuple, tvm_ffi.Array)):
            stack.extend(reversed(list(node)))
        elif isinstance(node, tvm_ffi.Object):
            info, fields = type(node).__tvm_ffi_type_info__, []
            while info is not None:
                fields += [getattr(node, f.name, None) for f in info.fields]
                info = getattr(info, "parent_type_info", None)
            stack.extend(reversed(fields))
    return found


def _same_te(func: tvm.tirx.PrimFunc, build: Callable[[], list]) -> bool:
    """True if `func` is the PrimFunc TE generates for the tensors `build()` returns (inputs, then output)."""
    from tvm import te

    try:
        candidate = te.create_prim_func(build(), index_dtype_override="int64")
    except Exception:  # the candidate op does not accept these shapes: not this op
        return False
    candidate = candidate.without_attr("global_symbol")
    return bool(tvm_ffi.structural_equal(candidate, func.without_attr("global_symbol")))


def _placeholder(e: relax.Expr, name: str):
    from tvm import te

    return te.placeholder(_static_shape(e), str(e.ty.dtype), name=name)


def _lift_binary(func, args: list[relax.Expr], out_dtype: str) -> relax.Expr | None:
    from tvm import topi

    pairs = (("maximum", topi.maximum, relax.op.maximum), ("minimum", topi.minimum, relax.op.minimum))
    if len(args) == 2:
        for _, te_op, relax_op in pairs:
            if _same_te(func, lambda: (lambda a, b: [a, b, te_op(a, b)])(_placeholder(args[0], "a"),
                                                                          _placeholder(args[1], "b"))):
                return relax_op(args[0], args[1])
        return None
    if len(args) != 1:
        return None
    for value in _float_imms(func):
        for _, te_op, relax_op in pairs:
            if _same_te(func, lambda: (lambda a: [a, te_op(a, value)])(_placeholder(args[0], "a"))):
                return relax_op(args[0], relax.const(value, out_dtype))
    return None


def _lift_pad(func, args: list[relax.Expr], out_shape: list[int]) -> relax.Expr | None:
    from tvm import topi

    if len(args) != 1:
        return None
    in_shape = _static_shape(args[0])
    if in_shape is None or len(in_shape) != len(out_shape):
        return None
    totals = [o - i for o, i in zip(out_shape, in_shape)]
    if any(t < 0 for t in totals) or not any(totals):
        return None
    n = 1
    for t in totals:
        n *= t + 1
    if n > _MAX_PAD_CANDIDATES:
        return None
    for value in _float_imms(func) or [0.0]:
        for before in itertools.product(*[range(t + 1) for t in totals]):
            after = [t - b for t, b in zip(totals, before)]
            if _same_te(func, lambda: (lambda a: [a, topi.nn.pad(a, list(before), after, value)])(
                    _placeholder(args[0], "a"))):
                width = [q for b, a in zip(before, after) for q in (b, a)]
                return relax.op.nn.pad(args[0], width, "constant", float(value))
    return None


def _lift_call_tir(mod: tvm.IRModule, value: relax.Call) -> relax.Expr | None:
    gv, packed = value.args[0], value.args[1]
    if not isinstance(gv, tvm.ir.GlobalVar) or not isinstance(packed, relax.Tuple) or len(value.args) > 2:
        return None
    func = mod.functions.get(gv) if gv in mod.functions else None
    if not isinstance(func, tvm.tirx.PrimFunc):
        return None
    args = list(packed.fields)
    out_shape = _static_shape(value)
    if out_shape is None or any(_static_shape(a) is None for a in args):
        return None
    out_dtype = str(value.ty.dtype)
    if any(str(a.ty.dtype) != out_dtype for a in args):
        return None
    out = _lift_binary(func, args, out_dtype)
    return out if out is not None else _lift_pad(func, args, out_shape)


def _lift_stack_reduce(rw: Rewriter, value: relax.Call) -> relax.Expr | None:
    """max|min(stack(broadcast_to(a, S), broadcast_to(b, S), ...), axis=0) -> maximum|minimum(a, b, ...)."""
    attrs = value.attrs
    axis = [int(a) for a in attrs.axis] if attrs.axis is not None else None
    if axis != [0] or bool(attrs.keepdims):
        return None
    stack = rw.producer_call(value.args[0], "relax.stack")
    if stack is None or int(stack.attrs.axis) != 0 or not isinstance(stack.args[0], relax.Tuple):
        return None
    out_shape = _static_shape(value)
    operands = []
    for f in stack.args[0].fields:
        b = rw.producer_call(f, "relax.broadcast_to")
        c = const_array(f)
        if b is not None:
            f = b.args[0]
        elif c is not None and c.size and (c == c.reshape(-1)[0]).all():  # a broadcast constant, folded already
            f = relax.const(c.reshape(-1)[0], str(f.ty.dtype))
        operands.append(f)
    if len(operands) < 2:
        return None
    binary = relax.op.maximum if op_name(value) == "relax.max" else relax.op.minimum
    out = operands[0]
    for nxt in operands[1:-1]:
        out = rw.emit(binary(out, nxt))
    out = binary(out, operands[-1])
    if _static_shape(rw.normalize(out)) != out_shape:
        return None
    return out


def rule_for(mod: tvm.IRModule) -> Callable[[Rewriter, relax.Var, relax.Expr], relax.Expr | None]:
    """The Rewriter rule lifting `mod`'s TE-lowered importer ops (it reads the PrimFuncs of `mod`)."""

    def rule(rw: Rewriter, var: relax.Var, value: relax.Expr) -> relax.Expr | None:
        name = op_name(value)
        if name == _CALL_TIR:
            out = _lift_call_tir(mod, value)
        elif name in ("relax.max", "relax.min"):
            out = _lift_stack_reduce(rw, value)
        else:
            return None
        if out is None:
            return None
        return prov.with_nodes(out, rw.cur_names) if isinstance(out, relax.Call) else out

    return rule


def lift_tir(mod: tvm.IRModule) -> tvm.IRModule:
    """Every call of `mod` that lifts to a plain Relax op (see module docstring) replaced by that op; the
    PrimFuncs no longer called are left for ``normalize`` to drop."""
    return rewrite_module(mod, rule_for(mod))


__all__ = ["lift_tir", "rule_for"]
