"""An independent integer reference for vai_c .xmodel graphs, for the tests: every op evaluated in numpy from the
XIR op graph (types, attributes, fix points), with constants read from the CONST region at their ddr_addr.

It shares nothing with the emulator, the project's golden reference (xgraph) or the xmodel runner's CPU ops: the
fixed-point arithmetic is written out here from dpu-facts.md / isa1-semantics.md (CONV: wide accumulate, bias
aligned by shift, one DPURound = floor(v + 0.5) then saturate; maxpool; ALU hsigmoid mode 7).
"""
from __future__ import annotations

import numpy as np

from tvm_dpu.xmodel.model import XModel, XOp


def _round_sat(num: np.ndarray, shift: int) -> np.ndarray:
    """floor(num / 2**shift + 0.5) for integer num (any sign of shift), saturated to int8, exactly."""
    num = np.asarray(num, dtype=object if abs(shift) > 40 else np.int64)
    if shift > 0:
        v = (num + (1 << (shift - 1))) >> shift
    else:
        v = num << (-shift)
    return np.clip(np.asarray(v, np.int64), -128, 127).astype(np.int8)


class Unsupported(Exception):
    """An op type this reference does not compute."""


def _const_fix(model: XModel, op: XOp) -> np.ndarray:
    t = op.output
    for d in model.dpu_subgraphs():
        if op.name in d.subgraph.all_ops():
            data = d.regions[t.reg_id].data
            n = int(np.prod(t.shape))
            return np.frombuffer(data, np.int8, n, t.ddr_addr).reshape(t.shape)
    raise Unsupported(f"const-fix {op.name} outside a DPU subgraph")


def _conv(model: XModel, op: XOp, x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    fx = model.op(op.inputs["input"][0]).output.fix_point
    fw = model.op(op.inputs["weights"][0]).output.fix_point
    fo = op.output.fix_point
    kh, kw = op.attrs["kernel"][1], op.attrs["kernel"][0]  # XIR: kernel [w, h]
    sh, sw = op.attrs["stride"][1], op.attrs["stride"][0]
    dh, dw = op.attrs.get("dilation", [1, 1])[1], op.attrs.get("dilation", [1, 1])[0]
    pl, pr, pt, pb = op.attrs.get("pad", [0, 0, 0, 0])
    xp = np.pad(x.astype(np.int64), ((0, 0), (pt, pb), (pl, pr), (0, 0)))
    n, oh, ow, oc = op.output.shape
    acc = np.zeros((n, oh, ow, oc), np.int64)
    for i in range(kh):
        for j in range(kw):
            win = xp[:, i * dh:i * dh + (oh - 1) * sh + 1:sh, j * dw:j * dw + (ow - 1) * sw + 1:sw, :]
            acc += np.einsum("nhwc,oc->nhwo", win, w[:, i, j, :].astype(np.int64))
    if b is not None:
        fb = model.op(op.inputs["bias"][0]).output.fix_point
        sb = fx + fw - fb
        acc = acc + (b.astype(np.int64) << sb if sb >= 0 else b.astype(np.int64) >> -sb)
    if op.attrs.get("nonlinear", "NONE") not in ("NONE", "RELU"):
        raise Unsupported(f"nonlinear {op.attrs['nonlinear']}")
    if op.attrs.get("nonlinear") == "RELU":
        acc = np.maximum(acc, 0)
    return _round_sat(acc, fx + fw - fo)


def _maxpool(model: XModel, op: XOp, x: np.ndarray) -> np.ndarray:
    if op.attrs.get("type") != "MAX":
        raise Unsupported(f"pool type {op.attrs.get('type')}")
    kh, kw = op.attrs["kernel"][1], op.attrs["kernel"][0]
    sh, sw = op.attrs["stride"][1], op.attrs["stride"][0]
    pl, pr, pt, pb = op.attrs.get("pad", [0, 0, 0, 0])
    xp = np.pad(x.astype(np.int64), ((0, 0), (pt, pb), (pl, pr), (0, 0)), constant_values=-128)
    n, oh, ow, c = op.output.shape
    m = np.full((n, oh, ow, c), -128, np.int64)
    for i in range(kh):
        for j in range(kw):
            m = np.maximum(m, xp[:, i:i + (oh - 1) * sh + 1:sh, j:j + (ow - 1) * sw + 1:sw, :])
    fx = model.op(op.input_ops[0]).output.fix_point
    return _round_sat(m, fx - op.output.fix_point)


def _hsigmoid(op: XOp, x: np.ndarray) -> np.ndarray:
    t = np.minimum(1 << 32, np.maximum(0, x.astype(np.int64) * 2731 + 3 * 2731 * (1 << op.attrs["hsigmoid_in"])))
    return _round_sat(t, op.attrs["shift_hsigmoid"])


def _prelu(x: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    slope = np.resize(alpha.reshape(-1), x.size).reshape(x.shape)
    return np.where(x >= 0, x, x * slope).astype(np.float32)


def reference_values(model: XModel, image: np.ndarray) -> dict[str, np.ndarray]:
    """op name -> value (int8 for fixed-point tensors, float32 otherwise) for a float input image."""
    values: dict[str, np.ndarray] = {}
    pending = list(model.ops)
    while pending:
        op = next(o for o in pending if all(n in values for n in o.input_ops))
        pending.remove(op)
        ins = [values[n] for n in op.input_ops]
        t = op.type
        if t == "data-fix":
            v = np.clip(np.floor(image.astype(np.float64) * 2.0 ** op.output.fix_point + 0.5), -128, 127)
            v = v.astype(np.int8)
        elif t in ("upload", "download", "reshape-fix"):
            v = ins[0].reshape(op.output.shape)
        elif t == "const-fix":
            v = _const_fix(model, op)
        elif t == "const":
            v = np.frombuffer(op.attrs["data"], np.float32).reshape(op.output.shape)
        elif t == "conv2d-fix":
            b = values[op.inputs["bias"][0]] if "bias" in op.inputs else None
            v = _conv(model, op, values[op.inputs["input"][0]], values[op.inputs["weights"][0]], b)
        elif t == "pool-fix":
            v = _maxpool(model, op, ins[0])
        elif t == "hard-sigmoid-fix":
            v = _hsigmoid(op, ins[0])
        elif t == "fix2float":
            v = ins[0].astype(np.float32) * np.float32(2.0 ** -model.op(op.input_ops[0]).output.fix_point)
        elif t == "float2fix":
            v = np.clip(np.floor(ins[0].astype(np.float64) * 2.0 ** op.attrs["fix_point"] + 0.5), -128, 127)
            v = v.astype(np.int8)
        elif t == "Mylayer":
            v = _prelu(ins[0], ins[1])
        else:
            raise Unsupported(f"op type {t} ({op.name})")
        values[op.name] = np.asarray(v).reshape(op.output.shape)
    return values
