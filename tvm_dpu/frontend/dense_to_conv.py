"""Gemm / MatMul with a constant weight on a 2-D ``[N, K]`` input -> 1x1 (or HxW) ``conv2d``.

Run after :func:`.fold_bn.fold_affine`, which has already folded Gemm's ``alpha``/``beta``/``transB`` (the
importer emits them as multiply / permute_dims of constants) so the input here is ``matmul(x, W[K, M])``
optionally followed by ``add(., b)`` with a per-output constant. Rewrites:

* ``x = reshape(t, [N, C*H*W])`` of a 4-D ``t`` (Flatten): ``conv2d(t, W^T as [M, C, H, W])`` - kernel HxW over
  the unflattened tensor, no layout change needed;
* otherwise: ``reshape(x, [N, K, 1, 1])`` -> ``conv2d(., W^T as [M, K, 1, 1])``;
then ``add(., b as [1, M, 1, 1])`` if there is a bias, and ``reshape(., [N, M])``. Anything else (non-constant
weight, batched 3-D matmul, integer types) is left alone.
"""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from . import provenance as prov
from .const_fold import const_array, make_const, static_shape
from .fold_bn import as_affine, per_channel
from .rewrite import Rewriter, op_name, rewrite_module


def _dense(rw: Rewriter, e: relax.Expr, *, need_single_use: bool) -> relax.Call | None:
    mm = rw.producer_call(e, "relax.matmul") if isinstance(e, relax.Var) else e
    if op_name(mm) != "relax.matmul" or (need_single_use and not rw.single_use(e)):
        return None
    return mm if _legal(rw, mm) else None


def transposed_weight(rw: Rewriter, e: relax.Expr) -> np.ndarray | None:
    """W^T as a view when `e` is ``permute_dims(W)`` of a 2-D constant W (Gemm's transB): the fold is left to
    this pass (const_fold.rule skips it), so a large fc weight is not copied into W^T first and back after."""
    p = rw.producer_call(e, "relax.permute_dims") if isinstance(e, relax.Var) else None
    if p is None:
        return None
    w = const_array(p.args[0])
    axes = p.attrs.axes
    if w is None or w.ndim != 2 or (axes is not None and [int(a) for a in axes] != [1, 0]):
        return None
    return w.T


def _weight(rw: Rewriter, e: relax.Expr) -> np.ndarray | None:
    w = const_array(e)
    return w if w is not None else transposed_weight(rw, e)


def keeps_weight_transpose(rw: Rewriter, var: relax.Var, value: relax.Expr) -> bool:
    """Whether the binding `var = value` is a permute_dims of a constant whose only consumer is a matmul this pass
    rewrites: normalize() then leaves it unfolded and this pass reads the transpose as a view (folding it first
    would copy a VGG fc6 weight, 411 MB, once more)."""
    if op_name(value) != "relax.permute_dims" or const_array(value.args[0]) is None:
        return False
    mm = rw.old_single_consumer(var)
    return op_name(mm) == "relax.matmul" and mm.args[1].same_as(var) and _legal(rw, mm, need_weight=False)


def _legal(rw: Rewriter, mm: relax.Call, need_weight: bool = True) -> bool:
    x, w = mm.args
    xs, ws = static_shape(x), static_shape(w)
    return ((not need_weight or _weight(rw, w) is not None) and xs is not None and ws is not None and len(xs) == 2
            and len(ws) == 2 and str(mm.ty.dtype).startswith("float") and str(w.ty.dtype) == str(mm.ty.dtype))


def _bias_of(value: relax.Expr, m: int) -> np.ndarray | None:
    aff = as_affine(value) if isinstance(value, relax.Call) else None
    if aff is None or aff[0] != "add":
        return None
    return per_channel(aff[2], [1, m], 1)


def _kernel(rw: Rewriter, w_expr: relax.Expr, w: np.ndarray, kshape: list[int], dtype: str) -> relax.Expr:
    """The conv kernel W^T as `kshape`. When W^T is Gemm's own weight (transB: `w_expr` is permute_dims of a
    constant already in [M, K] order) the kernel is a TVM view of that constant's tensor, so a large fc weight
    (VGG-16's fc6: 411 MB) is not copied; otherwise W^T is copied once into a new constant."""
    p = rw.producer_call(w_expr, "relax.permute_dims") if isinstance(w_expr, relax.Var) else None
    if p is not None and transposed_weight(rw, w_expr) is not None and str(p.args[0].ty.dtype) == dtype:
        return relax.const(p.args[0].value._create_view(tuple(kshape)))
    return make_const(w.T.reshape(kshape), dtype=dtype)


def _emit_conv(rw: Rewriter, mm: relax.Call, bias: np.ndarray | None, names: list[str]) -> relax.Expr:
    x, w_expr = mm.args
    n, k = static_shape(x)
    w = _weight(rw, w_expr)
    m = w.shape[1]
    dtype = str(mm.ty.dtype)
    flat = rw.producer_call(x, "relax.reshape")
    src_shape = static_shape(flat.args[0]) if flat is not None else None
    if flat is not None and rw.single_use(x) and src_shape and len(src_shape) == 4 and src_shape[0] == n \
            and int(np.prod(src_shape[1:])) == k:
        data = flat.args[0]
        kshape = [m] + src_shape[1:]
        names = prov.merge(names, flat)
    else:
        data = rw.emit(relax.op.reshape(x, [n, k, 1, 1]), names)
        kshape = [m, k, 1, 1]
    weight = _kernel(rw, w_expr, w, kshape, dtype)
    out = rw.emit(relax.op.nn.conv2d(data, weight, strides=(1, 1), padding=(0, 0, 0, 0)), names)
    if bias is not None:
        out = rw.emit(relax.op.add(out, make_const(bias.reshape(1, m, 1, 1), dtype=dtype)), names)
    return prov.with_nodes(relax.op.reshape(out, [n, m]), names)


def rule(rw: Rewriter, var: relax.Var, value: relax.Expr):
    """Rewriter callback of dense_to_conv (one binding)."""
    name = op_name(value)
    if name == "relax.matmul":
        if not _legal(rw, value):
            return None
        m = static_shape(value.args[1])[1]
        user = rw.old_single_consumer(var)
        if user is not None and _bias_of(user, m) is not None:
            return None  # the bias add rewrites the pair
        return _emit_conv(rw, value, None, rw.cur_names)
    if name == "relax.add":
        aff = as_affine(value)
        if aff is None or aff[0] != "add":
            return None
        mm = _dense(rw, aff[1], need_single_use=True)
        if mm is None:
            return None
        m = static_shape(mm.args[1])[1]
        bias = per_channel(aff[2], [1, m], 1)
        if bias is None or static_shape(value) != static_shape(mm):
            return None
        return _emit_conv(rw, mm, bias, prov.merge(mm, rw.cur_names))
    return None


def dense_to_conv(mod: tvm.IRModule) -> tvm.IRModule:
    """matmul(x[N,K], const W) (+ bias) -> conv2d + reshape (see module docstring)."""
    return rewrite_module(mod, rule)
