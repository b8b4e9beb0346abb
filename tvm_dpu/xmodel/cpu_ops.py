"""XIR's common CPU ops, run on the host with numpy (what VART's CPU runner does for a vai_c CPU subgraph).

Fixed-point tensors (xint8) are int8 arrays with value = q * 2**-fix_point; float tensors are float32. Rounding
modes are XIR's: DPU_ROUND (round half toward +inf, the DPU's; quant/fixpoint.dpu_round), PY3_ROUND (half to
even) and STD_ROUND (half away from zero), each saturating to int8.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..errors import XModelError
from ..quant.fixpoint import HSIGMOID_MUL, saturate_int8
from ..runtime.subgraph_runner import dequantize_tensor as dequantize
from ..runtime.subgraph_runner import quantize_tensor
from .model import XModel, XOp

#: XIR's quant_out_round_mode codes (Vitis AI's rounding_mode enum: 0 STD_ROUND, 1 DPU_ROUND, 2 PY3_ROUND).
_ROUND_MODES = {0: "STD_ROUND", 1: "DPU_ROUND", 2: "PY3_ROUND"}
#: The hard sigmoid's integer form saturates at 2**32 before its shift (VART cpu-runner hsigmoid_fix.cpp).
_HSIGMOID_CLAMP = float(1 << 32)

#: XIR float dtypes of `const` ops' data attribute.
_CONST_DTYPES = {"float32": np.float32, "float64": np.float64, "int8": np.int8, "XINT8": np.int8,
                 "int32": np.int32, "int64": np.int64}


def quantize(x: np.ndarray, fix_point: int, round_mode: str = "DPU_ROUND") -> np.ndarray:
    """float -> int8, q = round(x * 2**fix_point) in XIR's `round_mode`, saturated."""
    if round_mode == "DPU_ROUND":
        return quantize_tensor(x, fix_point)
    t = np.asarray(x, np.float64) * 2.0 ** fix_point
    if round_mode == "PY3_ROUND":
        return saturate_int8(np.round(t))
    if round_mode == "STD_ROUND":
        return saturate_int8(np.sign(t) * np.floor(np.abs(t) + 0.5))
    raise XModelError(f"round_mode {round_mode!r}: expected DPU_ROUND, PY3_ROUND or STD_ROUND")


def _fix_point(op: XOp, model: XModel) -> int:
    fp = op.attrs.get("fix_point")
    if fp is None:
        fp = op.output.fix_point
    if fp is None and op.input_ops:
        fp = model.op(op.input_ops[0]).output.fix_point
    if fp is None:
        raise XModelError(f"{model.source}: op {op.name!r} ({op.type}) has no fix_point")
    return int(fp)


def _one(op: XOp, inputs: list[np.ndarray]) -> np.ndarray:
    if len(inputs) != 1:
        raise XModelError(f"op {op.name!r} ({op.type}) takes one input, has {len(inputs)}")
    return inputs[0]


def _fix2float(op, inputs, model):
    return dequantize(_one(op, inputs), _fix_point(op, model))


def _float2fix(op, inputs, model):
    return quantize(_one(op, inputs), _fix_point(op, model), str(op.attrs.get("round_mode", "DPU_ROUND")))


def _fix(op, inputs, model):
    fp = _fix_point(op, model)
    return dequantize(quantize(_one(op, inputs), fp, str(op.attrs.get("round_mode", "DPU_ROUND"))), fp)


def _reshape(op, inputs, model):
    return np.asarray(inputs[0]).reshape(op.output.shape)


def _identity(op, inputs, model):
    return np.asarray(_one(op, inputs))


def _concat(op, inputs, model):
    return np.concatenate(inputs, axis=int(op.attrs.get("axis", -1)))


def _transpose(op, inputs, model):
    return np.transpose(_one(op, inputs), [int(a) for a in op.attrs["order"]])


def _softmax(op, inputs, model):
    x = np.asarray(_one(op, inputs), np.float32)
    axis = int(op.attrs.get("axis", -1))
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return (e / e.sum(axis=axis, keepdims=True)).astype(np.float32)


def _const(op, inputs, model):
    dtype = _CONST_DTYPES.get(str(op.attrs.get("data_type", "float32")))
    data = op.attrs.get("data", b"")
    if dtype is None or not isinstance(data, bytes):
        raise XModelError(f"{model.source}: const op {op.name!r}: data_type {op.attrs.get('data_type')!r} "
                          f"is not one of {sorted(_CONST_DTYPES)}")
    n = int(np.prod(op.output.shape))
    if len(data) != n * np.dtype(dtype).itemsize:
        raise XModelError(f"{model.source}: const op {op.name!r} holds {len(data)} bytes for {n} "
                          f"{np.dtype(dtype).name} values of shape {list(op.output.shape)}")
    return np.frombuffer(data, dtype).reshape(op.output.shape).copy()


def _conv2d(op, inputs, model):
    """XIR's float conv2d: input NHWC, weights OHWI ([out, kh, kw, in / group]), optional bias; kernel, stride and
    dilation listed (w, h), pad [left, right, top, bottom]; out[b, oh, ow, oc] = sum over (kh, kw, ic) of
    in[b, sh*oh + dh*kh, sw*ow + dw*kw, ic] * w[oc, kh, kw, ic] (XIR's op definition)."""
    x, w = np.asarray(inputs[0], np.float32), np.asarray(inputs[1], np.float32)
    a = op.attrs
    sw, sh = (int(v) for v in a.get("stride", [1, 1]))
    dw, dh = (int(v) for v in a.get("dilation", [1, 1]))
    left, right, top, bottom = (int(v) for v in a.get("pad", [0, 0, 0, 0]))
    groups = int(a.get("group", 1))
    x = np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)))
    oc, kh, kw, icg = w.shape
    _, oh, ow, _ = op.output.shape
    ocg = oc // groups
    out = np.zeros((x.shape[0], oh, ow, oc), np.float32)
    for i in range(kh):
        for j in range(kw):
            tap = x[:, i * dh: i * dh + (oh - 1) * sh + 1: sh, j * dw: j * dw + (ow - 1) * sw + 1: sw, :]
            for g in range(groups):
                out[..., g * ocg:(g + 1) * ocg] += tap[..., g * icg:(g + 1) * icg] @ w[g * ocg:(g + 1) * ocg, i, j].T
    if len(inputs) > 2:
        out += np.asarray(inputs[2], np.float32)
    return out


def _elementwise(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> "CpuOp":
    """XIR's add/sub/mul/div: its inputs combined left to right with numpy broadcasting."""
    def run(op, inputs, model):
        out = np.asarray(inputs[0], np.float32)
        for x in inputs[1:]:
            out = fn(out, np.asarray(x, np.float32))
        return out
    return run


def _strided_slice(op, inputs, model):
    a = op.attrs
    return np.asarray(_one(op, inputs))[tuple(slice(int(b), int(e), int(s)) for b, e, s in
                                              zip(a["begin"], a["end"], a["strides"]))]


def _leaky_relu(op, inputs, model):
    x = np.asarray(_one(op, inputs), np.float32)
    return np.where(x >= 0, x, np.float32(op.attrs["alpha"]) * x)


def _hard_sigmoid_fix(op, inputs, model):
    """XIR's hard-sigmoid-fix on int8 x (VART's cpu-runner): min(2**32, max(0, x * 2731 + 3 * 2731 *
    2**hsigmoid_in)) / 2**shift_hsigmoid, rounded in quant_out_round_mode (the DPU's hard sigmoid, run on the host
    where the target has none, as vai_c places it for DPUCAHX8H)."""
    a = op.attrs
    x = np.asarray(_one(op, inputs), np.float64)  # exact: int8 values times small integers
    t = np.clip(x * HSIGMOID_MUL + 3 * HSIGMOID_MUL * 2.0 ** int(a["hsigmoid_in"]), 0.0, _HSIGMOID_CLAMP)
    mode = _ROUND_MODES.get(int(a.get("quant_out_round_mode", 1)))
    if mode is None:
        raise XModelError(f"{model.source}: hard-sigmoid-fix op {op.name!r}: quant_out_round_mode "
                          f"{a['quant_out_round_mode']!r} is not one of {sorted(_ROUND_MODES)}")
    return quantize(t / 2.0 ** int(a["shift_hsigmoid"]), 0, mode)


def _unary(fn: Callable[[np.ndarray], np.ndarray]) -> "CpuOp":
    return lambda op, inputs, model: fn(np.asarray(_one(op, inputs), np.float32)).astype(np.float32)


CpuOp = Callable[[XOp, list[np.ndarray], XModel], np.ndarray]

#: XIR op type -> host implementation.
CPU_OPS: dict[str, CpuOp] = {
    "fix2float": _fix2float, "float2fix": _float2fix, "fix": _fix,
    "reshape": _reshape, "reshape-fix": _reshape, "flatten": _reshape, "squeeze": _reshape,
    "identity": _identity, "concat": _concat, "concat-fix": _concat, "transpose": _transpose,
    "softmax": _softmax, "const": _const, "const-fix": _const, "conv2d": _conv2d,
    "add": _elementwise(np.add), "sub": _elementwise(np.subtract), "mul": _elementwise(np.multiply),
    "div": _elementwise(np.divide), "relu": _unary(lambda x: np.maximum(x, 0)),
    "sigmoid": _unary(lambda x: 1 / (1 + np.exp(-x))), "tanh": _unary(np.tanh), "leaky-relu": _leaky_relu,
    "strided_slice": _strided_slice, "hard-sigmoid-fix": _hard_sigmoid_fix,
}


def run_cpu_op(op: XOp, inputs: list[np.ndarray], model: XModel, plugin_runner: Any = None) -> np.ndarray:
    """The value of `op` from its inputs' values: a built-in op, else `plugin_runner` (a plugin's `cpu`), else
    XModelError naming the op type and name."""
    fn = CPU_OPS.get(op.type)
    if fn is not None:
        try:
            out = fn(op, inputs, model)
        except (TypeError, ValueError, KeyError, IndexError) as e:  # numpy AxisError is a ValueError
            raise XModelError(f"{model.source}: {op.type} op {op.name!r}: its attributes or inputs do not fit "
                              f"(attributes {sorted(op.attrs)}, input shapes {[np.shape(x) for x in inputs]}): "
                              f"{type(e).__name__}: {e}") from None
    elif plugin_runner is not None:
        out = plugin_runner(op.type, op.name, dict(op.attrs), list(inputs), tuple(op.output.shape))
    else:
        raise XModelError(f"{model.source}: CPU op {op.name!r} has type {op.type!r}, which tvm-dpu does not run "
                          f"(built in: {', '.join(sorted(CPU_OPS))}); a plugin with `cpu_ops = ({op.type!r},)` "
                          "and a `cpu` runner can supply it (docs/plugins.md)")
    out = np.asarray(out)
    if out.size != int(np.prod(op.output.shape)):
        raise XModelError(f"{model.source}: op {op.name!r} ({op.type}) computed {out.size} values for a tensor of "
                          f"shape {list(op.output.shape)}")
    return out.reshape(op.output.shape)
