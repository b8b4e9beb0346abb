"""Numpy constant folding (no LLVM JIT: ``relax.transform.FoldConstant`` compiles every op it folds, ~4 s on
ResNet-50). Folds Calls whose tensor arguments are all constants, for the elementwise and layout ops the ONNX
importer emits around weights (reshape of a bias, permute_dims of a Gemm weight, Clip-bound sanitising, ...).
A folded constant keeps the provenance of the Calls it replaces on its span."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tvm
from tvm import relax

from . import provenance as prov
from .rewrite import Rewriter, rewrite_module

# Folding must not turn a tiny constant into a huge one (broadcast_to of a scalar to an activation shape);
# folds whose result is no larger than their largest input are always allowed.
MAX_FOLD_ELEMENTS = 1 << 22


def const_array(e: relax.Expr) -> np.ndarray | None:
    """The numpy value of a constant expression, else None: a read-only view of TVM's tensor (DLPack) where the
    dtype allows, so folding a large model's weights does not copy each one first."""
    if isinstance(e, tvm.ir.GenericConst):
        try:
            view = np.from_dlpack(e.value)
        except (TypeError, ValueError, RuntimeError, BufferError):  # dtypes numpy's DLPack import does not take
            return e.value.numpy()
        view.flags.writeable = False
        return view
    return None


def static_shape(e: relax.Expr) -> list[int] | None:
    """Static shape of a tensor-typed expression, else None."""
    ty = getattr(e, "ty", None)
    shape = getattr(ty, "shape", None)
    if shape is None or not hasattr(shape, "values"):
        return None
    try:
        return [int(v) for v in shape.values]
    except (TypeError, ValueError):
        return None


def make_const(arr: np.ndarray, names: list[str] | None = None, dtype: str | None = None) -> tvm.ir.GenericConst:
    """A GenericConst of ``arr`` (cast to ``dtype``) carrying ``names`` as provenance. The values are written
    straight into TVM's tensor (whatever the strides of ``arr``, e.g. a transposed weight matrix), with no
    contiguous numpy copy in between."""
    arr = np.asarray(arr)
    out_dtype = np.dtype(dtype) if dtype is not None else arr.dtype
    try:
        tensor = tvm.runtime.empty(arr.shape, str(out_dtype))
        np.from_dlpack(tensor)[...] = arr
    except (TypeError, ValueError, RuntimeError, BufferError):  # a dtype numpy's DLPack does not take
        c = relax.const(np.ascontiguousarray(arr.astype(out_dtype, copy=False)), str(out_dtype))
    else:
        c = relax.const(tensor)
    return prov.const_with_nodes(c, names or [])


def _out(call: relax.Call) -> tuple[list[int] | None, str]:
    return static_shape(call), str(call.ty.dtype)


def _attr(call: relax.Call, name: str):
    v = getattr(call.attrs, name)
    return None if v is None else [int(i) for i in v] if not isinstance(v, (int, str)) else v


def _to_shape(call: relax.Call, a: list[np.ndarray]) -> np.ndarray:
    shape, _ = _out(call)
    return np.reshape(a[0], shape)


def _broadcast(call: relax.Call, a: list[np.ndarray]) -> np.ndarray:
    shape, _ = _out(call)
    return np.broadcast_to(a[0], shape)


def _permute(call: relax.Call, a: list[np.ndarray]) -> np.ndarray:
    axes = _attr(call, "axes")
    return np.transpose(a[0], axes)


_BINARY: dict[str, Callable] = {
    "relax.add": np.add, "relax.subtract": np.subtract, "relax.multiply": np.multiply,
    "relax.divide": np.divide, "relax.power": np.power, "relax.maximum": np.maximum, "relax.minimum": np.minimum,
    "relax.floor_divide": np.floor_divide,
}
_UNARY: dict[str, Callable] = {
    "relax.sqrt": np.sqrt, "relax.rsqrt": lambda x: 1.0 / np.sqrt(x), "relax.negative": np.negative,
    "relax.exp": np.exp, "relax.log": np.log, "relax.abs": np.abs, "relax.isnan": np.isnan,
    "relax.reciprocal": lambda x: 1.0 / x,
}
FOLDERS: dict[str, Callable[[relax.Call, list[np.ndarray]], np.ndarray]] = {
    "relax.reshape": _to_shape, "relax.expand_dims": _to_shape, "relax.squeeze": _to_shape,
    "relax.flatten": _to_shape, "relax.broadcast_to": _broadcast, "relax.permute_dims": _permute,
    "relax.astype": lambda c, a: a[0].astype(str(c.attrs.dtype)),
    "relax.where": lambda c, a: np.where(a[0], a[1], a[2]),
    "relax.concat": lambda c, a: np.concatenate(a, axis=int(c.attrs.axis) if c.attrs.axis is not None else 0),
    **{k: (lambda f: lambda c, a: f(a[0], a[1]))(f) for k, f in _BINARY.items()},
    **{k: (lambda f: lambda c, a: f(a[0]))(f) for k, f in _UNARY.items()},
}


def fold_call(call: relax.Call, names: list[str]) -> tvm.ir.GenericConst | None:
    """Numpy value of ``call`` as a constant if all its tensor arguments are constants and the op is known."""
    if not isinstance(call.op, tvm.ir.Op) or call.op.name not in FOLDERS:
        return None
    args = list(call.args)
    if call.op.name == "relax.concat":
        if not isinstance(args[0], relax.Tuple):
            return None
        args = list(args[0].fields)
    elif call.op.name in ("relax.reshape", "relax.broadcast_to"):
        args = args[:1]
    arrays = [const_array(a) for a in args]
    if any(a is None for a in arrays):
        return None
    shape, dtype = _out(call)
    if shape is None:
        return None
    n_out = int(np.prod(shape, dtype=np.int64))
    # Layout ops (permute_dims of a VGG fc weight: 10^8 elements) never grow a constant; only expansion is capped.
    if n_out > MAX_FOLD_ELEMENTS and n_out > max(a.size for a in arrays):
        return None
    with np.errstate(all="ignore"):
        res = np.asarray(FOLDERS[call.op.name](call, arrays))
    if list(res.shape) != shape:
        return None
    merged = prov.merge(names, *[a for a in args if isinstance(a, tvm.ir.GenericConst)])
    return make_const(res.astype(dtype, copy=False), merged)


def rule(rw: Rewriter, var: relax.Var, value: relax.Expr):
    """Rewriter callback of fold_constants (one binding)."""
    if isinstance(value, relax.Call):
        return fold_call(value, rw.cur_names)
    if isinstance(value, relax.TupleGetItem) and isinstance(value.tuple_value, relax.Tuple):
        field = value.tuple_value.fields[value.index]
        if isinstance(field, tvm.ir.GenericConst):
            return field
    return None


def fold_constants(mod: tvm.IRModule) -> tvm.IRModule:
    """Fold constant subexpressions in numpy (see :data:`FOLDERS` for the ops handled)."""
    return rewrite_module(mod, rule)
