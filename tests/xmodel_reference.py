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


def _bias_act_round(model: XModel, op: XOp, acc: np.ndarray, b: np.ndarray | None, f_acc: int) -> np.ndarray:
    """Bias aligned to the accumulator's fix point f_acc by shift, optional ReLU, one DPURound to the output."""
    if b is not None:
        sb = f_acc - model.op(op.inputs["bias"][0]).output.fix_point
        acc = acc + (b.astype(np.int64) << sb if sb >= 0 else b.astype(np.int64) >> -sb)
    if op.attrs.get("nonlinear", "NONE") not in ("NONE", "RELU"):
        raise Unsupported(f"nonlinear {op.attrs['nonlinear']}")
    if op.attrs.get("nonlinear") == "RELU":
        acc = np.maximum(acc, 0)
    return _round_sat(acc, f_acc - op.output.fix_point)


def _windows(op: XOp, x: np.ndarray, pad_value: int = 0):
    """(i, j, window) per kernel tap: the input (padded with pad_value) sampled at that tap for every output pixel.
    XIR lists kernel, stride and dilation as [w, h] and pad as [left, right, top, bottom]."""
    kh, kw = op.attrs["kernel"][1], op.attrs["kernel"][0]
    sh, sw = op.attrs["stride"][1], op.attrs["stride"][0]
    dh, dw = op.attrs.get("dilation", [1, 1])[1], op.attrs.get("dilation", [1, 1])[0]
    pl, pr, pt, pb = op.attrs.get("pad", [0, 0, 0, 0])
    xp = np.pad(x.astype(np.int64), ((0, 0), (pt, pb), (pl, pr), (0, 0)), constant_values=pad_value)
    _, oh, ow, _ = op.output.shape
    for i in range(kh):
        for j in range(kw):
            yield i, j, xp[:, i * dh:i * dh + (oh - 1) * sh + 1:sh, j * dw:j * dw + (ow - 1) * sw + 1:sw, :]


def _conv(model: XModel, op: XOp, x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    fx = model.op(op.inputs["input"][0]).output.fix_point
    fw = model.op(op.inputs["weights"][0]).output.fix_point
    acc = np.zeros(op.output.shape, np.int64)
    for i, j, win in _windows(op, x):
        acc += np.einsum("nhwc,oc->nhwo", win, w[:, i, j, :].astype(np.int64))
    return _bias_act_round(model, op, acc, b, fx + fw)


def _maxpool(model: XModel, op: XOp, x: np.ndarray) -> np.ndarray:
    if op.attrs.get("type") != "MAX":
        raise Unsupported(f"pool type {op.attrs.get('type')}")
    m = np.full(op.output.shape, -128, np.int64)
    for _, _, win in _windows(op, x, pad_value=-128):
        m = np.maximum(m, win)
    fx = model.op(op.input_ops[0]).output.fix_point
    return _round_sat(m, fx - op.output.fix_point)


def _hsigmoid(op: XOp, x: np.ndarray) -> np.ndarray:
    t = np.minimum(1 << 32, np.maximum(0, x.astype(np.int64) * 2731 + 3 * 2731 * (1 << op.attrs["hsigmoid_in"])))
    return _round_sat(t, op.attrs["shift_hsigmoid"])


def _prelu(x: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    slope = np.resize(alpha.reshape(-1), x.size).reshape(x.shape)
    return np.where(x >= 0, x, x * slope).astype(np.float32)


def _depthwise(model: XModel, op: XOp, x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """Per-channel conv: XIR's weights are (multiplier=1, kh, kw, C); the same wide accumulate, bias alignment and
    one DPURound as conv2d-fix."""
    if w.shape[0] != 1:
        raise Unsupported(f"depthwise channel multiplier {w.shape[0]}")
    fx = model.op(op.inputs["input"][0]).output.fix_point
    fw = model.op(op.inputs["weights"][0]).output.fix_point
    acc = np.zeros(op.output.shape, np.int64)
    for i, j, win in _windows(op, x):
        acc += win * w[0, i, j, :].astype(np.int64)
    return _bias_act_round(model, op, acc, b, fx + fw)


def _eltwise_add(model: XModel, op: XOp, xs: list[np.ndarray]) -> np.ndarray:
    """Inputs aligned to the smallest input fix point plus two fraction bits (an arithmetic shift, truncating, as
    the ELEW read does), summed, then one DPURound to the output fix point."""
    if op.attrs.get("type", "ADD") != "ADD" or op.attrs.get("nonlinear", "NONE") not in ("NONE", "RELU"):
        raise Unsupported(f"eltwise {op.attrs.get('type')} {op.attrs.get('nonlinear')}")
    fixes = [model.op(n).output.fix_point for n in op.input_ops]
    base = min(fixes)
    total = sum((x.astype(np.int64) << 2) >> (f - base) for x, f in zip(xs, fixes))
    if op.attrs.get("nonlinear") == "RELU":
        total = np.maximum(total, 0)
    return _round_sat(total, base + 2 - op.output.fix_point)


def _refix(model: XModel, name: str, x: np.ndarray, fo: int) -> np.ndarray:
    return _round_sat(x.astype(np.int64), model.op(name).output.fix_point - fo)


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


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
        elif t == "depthwise-conv2d-fix":
            b = values[op.inputs["bias"][0]] if "bias" in op.inputs else None
            v = _depthwise(model, op, values[op.inputs["input"][0]], values[op.inputs["weights"][0]], b)
        elif t == "eltwise-fix":
            v = _eltwise_add(model, op, ins)
        elif t == "concat-fix":
            parts = [_refix(model, n, x, op.output.fix_point) for n, x in zip(op.input_ops, ins)]
            v = np.concatenate(parts, axis=op.attrs["axis"])
        elif t == "upsample-fix":
            if op.attrs.get("mode") != "NEAREST":
                raise Unsupported(f"upsample mode {op.attrs.get('mode')}")
            sw, sh = (int(s) for s in op.attrs["scale"])
            v = np.repeat(np.repeat(_refix(model, op.input_ops[0], ins[0], op.output.fix_point), sh, 1), sw, 2)
        elif t == "softmax":
            v = _softmax(ins[0].astype(np.float64), op.attrs.get("axis", -1)).astype(np.float32)
        else:
            raise Unsupported(f"op type {t} ({op.name})")
        values[op.name] = np.asarray(v).reshape(op.output.shape)
    return values
