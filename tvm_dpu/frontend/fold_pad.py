"""Fold a constant-zero ``nn.pad`` into the padding of the ``conv2d`` that consumes it.

Only conv2d (NCHW) is handled: folding into max_pool is only valid for a -inf pad value (or a non-negative input)
and into avg_pool only with count_include_pad semantics, so those pads stay as they are (CPU, or a later pass).
Conditions: pad mode "constant", pad value 0, no padding on N and C, non-negative pads, the pad's only user is the
conv. The conv keeps its strides/dilation/groups and gets padding ``[top, left, bottom, right]`` increased.
"""
from __future__ import annotations

import tvm
from tvm import relax

from . import provenance as prov
from .rewrite import Rewriter, op_name, rewrite_module


def rule(rw: Rewriter, var: relax.Var, value: relax.Expr):
    """Rewriter callback of fold_pad (one binding)."""
    if op_name(value) != "relax.nn.conv2d" or value.attrs.data_layout != "NCHW":
        return None
    src = value.args[0]
    pad = rw.producer_call(src, "relax.nn.pad")
    if pad is None or not rw.single_use(src):
        return None
    a = pad.attrs
    width = [int(v) for v in a.pad_width]
    if str(a.pad_mode) != "constant" or float(a.pad_value) != 0.0 or len(width) != 8:
        return None
    if any(width[:4]) or any(v < 0 for v in width):
        return None
    hb, ha, wb, wa = width[4:]
    c = value.attrs
    top, left, bottom, right = (int(v) for v in c.padding)
    new = relax.op.nn.conv2d(pad.args[0], value.args[1], strides=[int(s) for s in c.strides],
                             padding=[top + hb, left + wb, bottom + ha, right + wa],
                             dilation=[int(d) for d in c.dilation], groups=int(c.groups),
                             data_layout=str(c.data_layout), kernel_layout=str(c.kernel_layout),
                             out_layout=str(c.out_layout), out_dtype=c.out_dtype)
    return prov.with_nodes(new, prov.merge(rw.cur_names, pad))


def fold_pad(mod: tvm.IRModule) -> tvm.IRModule:
    """Constant-zero Pad followed by conv2d -> conv2d with larger padding."""
    return rewrite_module(mod, rule)
