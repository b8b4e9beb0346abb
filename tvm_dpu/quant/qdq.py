"""Pre-quantized ONNX QDQ models (QuantizeLinear / DequantizeLinear pairs, as Vitis AI's ONNX quantizer emits).

`strip_qdq(model)` returns the float model the QDQ model annotates plus the fix_point of every annotated tensor,
for `quantize.quantize_graph(..., overrides=...)` once the frontend has mapped the names:

* activation pair ``x -> QuantizeLinear -> DequantizeLinear -> x'``: removed; every use of x' reads x again, and x
  (the float tensor the pair annotates, with its original name, so the frontend's provenance still maps) gets the
  fix_point. When x' is a graph output, an Identity x -> x' keeps the model's interface and x' gets it too.
* constant ``DequantizeLinear(int initializer)`` (or ``DequantizeLinear(QuantizeLinear(float initializer))``):
  folded into a float32 initializer named after the DequantizeLinear output (the name its consumers already use).
  For power-of-two scales and int8 data the fold is exact. int8 constants (weights) get their fix_point under that
  name; wider ones (an int32 bias with scale s_in * s_w) are folded without a fix_point, because the DPU's bias
  is int8 with its own fix_point, which the quantizer chooses.

Every scale must be 2**-fp with zero point 0 and int8 data (the DPU's per-tensor power-of-two int8); per-channel
scales are accepted only when they are all equal. Anything else is a QuantizationError naming the tensor and the
node and saying what to do. Two modes relax this for float-scale (onnxruntime-style) models, never silently:

* ``scales="round"``: a symmetric int8 scale s that is not a power of two is rounded up to the next one
  (fix_point floor(-log2 s): the range stays covered, the step is at most 2x coarser); int8 constants are folded
  with their true scale and re-quantized by the compiler. Each rounding is appended to `rounded`
  (`ScaleRounding`: tensor, scale, fix_point, and for a constant the re-quantization error) for the caller to
  report.
* ``scales="float"`` (``--requantize``): every Q/DQ pair is removed and every constant dequantized exactly
  ((q - zero_point) * scale, per channel too); no fix_points are returned: the float model is calibrated.

Fix_points then flow forward through ops whose output holds only values of their input (`VALUE_KEEPING_OPS`:
Reshape, Flatten, Transpose, ..., MaxPool, Relu, a zero Pad, Slice, nearest Resize): the output has its input's
fix_point (a TF2 classifier's Reshape after the last DequantizeLinear, or a MaxPool a quantizer left without its
own Q/DQ, would otherwise leave a tensor to calibration).
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tvm_dpu.errors import QuantizationError

_ADVICE = ("re-export with power-of-two scales (e.g. Vitis AI's vai_q_onnx with power-of-two quantization, "
           "int8, symmetric), or strip the Q/DQ nodes and calibrate the float model (requantize=True, "
           "tvm-dpu --requantize)")
_INT_TYPES = {TensorProto.INT8: np.int8, TensorProto.INT16: np.int16, TensorProto.INT32: np.int32}
#: Ops whose output holds their (first) input's values rearranged: the output keeps the input's fix_point.
SHAPE_ONLY_OPS = frozenset({"Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity"})
#: Ops whose output holds only values of their input (a maximum, a max(x, 0), a slice, a zero pad, a nearest
#: neighbour): on the DPU the output keeps the input's fix_point too, exactly, so a quantizer that annotates only
#: the input (Quark leaves out the Q/DQ it would repeat) leaves nothing to calibrate. Concat: when its inputs agree.
VALUE_KEEPING_OPS = SHAPE_ONLY_OPS | {"MaxPool", "GlobalMaxPool", "Relu", "Pad", "Slice", "Split", "Concat",
                                     "Resize", "Upsample", "DepthToSpace", "SpaceToDepth"}
SCALE_MODES = ("exact", "round", "float")


@dataclass(frozen=True)
class ScaleRounding:
    """A QDQ scale that is not a power of two, rounded up to 2**-fix_point (strip_qdq(scales="round"))."""

    tensor: str
    node: str
    scale: float
    fix_point: int
    #: For a constant: max |requantized - original| / max |original| (the re-quantization error); else None.
    constant_error: float | None = None

    @property
    def step_ratio(self) -> float:
        """How much coarser the DPU's step is than the quantizer's (1 to 2)."""
        return 2.0 ** -self.fix_point / self.scale


def _where(tensor: str, node: onnx.NodeProto) -> str:
    return f"tensor {tensor!r} ({node.op_type} node {node.name or '<unnamed>'!r})"


def _constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    consts = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.output:
            for a in node.attribute:
                if a.name == "value":
                    consts[node.output[0]] = numpy_helper.to_array(a.t)
    return consts


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _scale_fix_point(node: onnx.NodeProto, tensor: str, consts: dict[str, np.ndarray],
                     rounded: list[ScaleRounding] | None = None) -> int:
    """fix_point of the node's scale input (per-tensor, power of two; with `rounded`, any positive scale, rounded
    up to a power of two and recorded there)."""
    if len(node.input) < 2 or node.input[1] not in consts:
        raise QuantizationError(f"{_where(tensor, node)}: the scale is not a constant; {_ADVICE}")
    if _attr(node, "block_size", 0):
        raise QuantizationError(f"{_where(tensor, node)}: blocked quantization (block_size) is not supported: the "
                                f"DPU has one scale per tensor; {_ADVICE}")
    raw = np.asarray(consts[node.input[1]]).ravel()
    scale = raw.astype(np.float64)
    if scale.size == 0:
        raise QuantizationError(f"{_where(tensor, node)}: empty scale")
    if scale.size > 1 and not np.all(scale == scale[0]):
        raise QuantizationError(f"{_where(tensor, node)}: per-channel scales {scale[:4].tolist()}"
                                f"{'...' if scale.size > 4 else ''} differ; the DPU has one power-of-two scale per "
                                f"tensor; {_ADVICE}")
    s, shown = float(scale[0]), str(raw[0])  # shown in the file's precision: 0.02, not 0.0199999995
    if not (math.isfinite(s) and s > 0):
        raise QuantizationError(f"{_where(tensor, node)}: scale {shown} is not a positive finite number")
    mant, exp = math.frexp(s)
    if mant != 0.5:
        if rounded is None:
            raise QuantizationError(f"{_where(tensor, node)}: scale {shown} is not a power of two (the DPU's scales "
                                    f"are 2**-fix_point); {_ADVICE}")
        fp = -exp  # s = mant * 2**exp with 0.5 < mant < 1: 2**exp is the next power of two up
        if not any(r.tensor == tensor and r.node == node.name for r in rounded):
            rounded.append(ScaleRounding(tensor, node.name, s, fp))
        return fp
    return 1 - exp  # s = 2**(exp - 1) = 2**-fp


def _int_type(node: onnx.NodeProto, tensor: str, consts: dict[str, np.ndarray], data_type: int | None) -> int:
    """ONNX element type of the quantized side of the node; checks a zero zero point."""
    zp = consts.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if len(node.input) > 2 and node.input[2] and zp is None:
        raise QuantizationError(f"{_where(tensor, node)}: the zero point is not a constant; {_ADVICE}")
    if zp is not None and np.any(np.asarray(zp) != 0):
        raise QuantizationError(f"{_where(tensor, node)}: zero point {np.asarray(zp).ravel()[:4].tolist()} is not "
                                f"0; the DPU quantizes symmetrically; {_ADVICE}")
    if zp is not None:
        return helper.np_dtype_to_tensor_dtype(np.asarray(zp).dtype)
    if data_type is not None:
        return data_type
    out_dtype = _attr(node, "output_dtype", 0)
    return int(out_dtype) if out_dtype else TensorProto.UINT8  # ONNX default without a zero point


class _Stripper:
    """The state of one `strip_qdq`: the copy being rewritten and what each DequantizeLinear became."""

    def __init__(self, out: onnx.ModelProto, rounding: list[ScaleRounding] | None, floating: bool) -> None:
        self.g = out.graph
        self.rounding, self.floating = rounding, floating
        self.consts = _constants(self.g)
        self.producer = {o: n for n in self.g.node for o in n.output}
        self.graph_outputs = {o.name for o in self.g.output}
        self.fix_points: dict[str, int] = {}
        self.alias: dict[str, str] = {}  # DequantizeLinear output -> the float tensor it stands for
        self.folded: dict[str, np.ndarray] = {}  # DequantizeLinear output -> float constant
        self.drop: set[int] = set()  # ids of nodes to remove
        self.identities: dict[int, onnx.NodeProto] = {}  # id(DQ node) -> Identity replacing it

    def record(self, name: str, fp: int, node: onnx.NodeProto) -> None:
        old = self.fix_points.get(name)
        if old is not None and old != fp:
            raise QuantizationError(f"{_where(name, node)}: annotated with fix_point {fp} here and {old} elsewhere; "
                                    f"one tensor has one scale on the DPU; {_ADVICE}")
        self.fix_points[name] = fp

    def resolve(self, name: str) -> str:
        seen = set()
        while name in self.alias and name not in seen:
            seen.add(name)
            name = self.alias[name]
        return name

    def alias_float(self, node: onnx.NodeProto, y: str, x: str) -> bool:
        """DQ output `y` stands for float tensor `x`: the DQ goes, or becomes an Identity when `y` is a graph
        output. True when it became an Identity."""
        self.alias[y] = x
        if y in self.graph_outputs:
            self.identities[id(node)] = helper.make_node("Identity", [x], [y], name=node.name or f"{y}_identity")
            return True
        self.drop.add(id(node))
        return False

    def fold(self, node: onnx.NodeProto, y: str, value: np.ndarray) -> None:
        self.folded[y] = value
        self.drop.add(id(node))

    def not_a_pair(self, xq: str, node: onnx.NodeProto) -> QuantizationError:
        return QuantizationError(f"{_where(xq, node)}: DequantizeLinear input is neither a constant nor the output "
                                 "of a QuantizeLinear; only QDQ pairs around float tensors can be stripped")

    def dequantize_float(self, node: onnx.NodeProto) -> None:
        """scales="float": a DQ becomes the float value it stands for (no fix_points)."""
        xq, y = node.input[0], node.output[0]
        q, consts = self.producer.get(xq), self.consts
        if xq in consts:
            return self.fold(node, y, _dequantize(node, consts[xq], consts))
        if q is None or q.op_type != "QuantizeLinear":
            raise self.not_a_pair(xq, node)
        x = self.resolve(q.input[0])
        if x in consts:  # fake-quantized float constant: its quantized value, in float
            return self.fold(node, y, _dequantize(node, _quantize(q, consts[x], consts), consts))
        self.alias_float(node, y, x)

    def dequantize_constant(self, node: onnx.NodeProto) -> None:
        """A DQ of an integer constant (weight / bias): folded to float, an int8 one annotated."""
        xq, y = node.input[0], node.output[0]
        data = self.consts[xq]
        dtype = _int_type(node, xq, self.consts, helper.np_dtype_to_tensor_dtype(data.dtype))
        if dtype not in _INT_TYPES:
            raise QuantizationError(f"{_where(xq, node)}: constant of type {TensorProto.DataType.Name(dtype)}; "
                                    f"expected int8 (or int16 / int32 for a bias); {_ADVICE}")
        # A wider constant (an int32 bias) gets no fix_point: its scale's rounding is not reported.
        rounding = self.rounding if dtype == TensorProto.INT8 or self.rounding is None else []
        fp = _scale_fix_point(node, xq, self.consts, rounding)
        self.fold(node, y, (data.astype(np.float64) * _scale_of(node, self.consts)).astype(np.float32))
        if dtype == TensorProto.INT8:
            self.record(y, fp, node)
            _note_constant_error(self.rounding, xq, node, self.folded[y], fp)

    def dequantize_pair(self, node: onnx.NodeProto, q: onnx.NodeProto | None) -> None:
        """A DQ of a QuantizeLinear's output: the pair goes, the float tensor it wraps gets its fix_point."""
        xq, y = node.input[0], node.output[0]
        consts, rounding = self.consts, self.rounding
        fp = _scale_fix_point(node, xq, consts, rounding)
        if q is None or q.op_type != "QuantizeLinear":
            raise self.not_a_pair(xq, node)
        x = self.resolve(q.input[0])  # a chain DQ -> Q -> DQ annotates the first float tensor
        fp_q = _scale_fix_point(q, x, consts, rounding)
        dtype_q = _int_type(q, x, consts, None)
        _int_type(node, xq, consts, dtype_q)
        if fp_q != fp:
            raise QuantizationError(f"{_where(x, q)}: QuantizeLinear scale 2**-{fp_q} and DequantizeLinear "
                                    f"{node.name!r} scale 2**-{fp} differ; a QDQ pair must use one scale")
        if dtype_q != TensorProto.INT8:
            raise QuantizationError(f"{_where(x, q)}: quantized to {TensorProto.DataType.Name(dtype_q)}; the DPU "
                                    f"runs int8 (give an int8 zero point); {_ADVICE}")
        if x in consts:  # fake-quantized float constant: fold DQ(Q(w))
            step = _scale_of(node, consts)
            qv = np.clip(np.rint(np.asarray(consts[x], dtype=np.float64) / step), -128, 127)  # rounds half to even
            self.fold(node, y, (qv * step).astype(np.float32))
            self.record(y, fp, node)
            _note_constant_error(rounding, y, node, self.folded[y], fp)
            return
        self.record(x, fp, q)
        if self.alias_float(node, y, x):
            self.record(y, fp, node)

    def dequantize(self, node: onnx.NodeProto) -> None:
        if self.floating:
            return self.dequantize_float(node)
        q = self.producer.get(node.input[0])
        if q is not None and q.op_type == "QuantizeLinear":
            _scale_fix_point(q, q.input[0], self.consts, self.rounding)  # a bad pair: under the float tensor's name
        if node.input[0] in self.consts:
            return self.dequantize_constant(node)
        self.dequantize_pair(node, q)

    def rewrite_nodes(self) -> list[onnx.NodeProto]:
        """The graph's nodes without the dropped DQs (Identities for those that were outputs), inputs resolved."""
        kept: list[onnx.NodeProto] = []
        for node in self.g.node:
            if id(node) in self.identities:
                ident = self.identities[id(node)]
                ident.input[0] = self.resolve(ident.input[0])
                kept.append(ident)
                continue
            if id(node) in self.drop:
                continue
            for i, name in enumerate(node.input):
                if name in self.alias:
                    node.input[i] = self.resolve(name)
            kept.append(node)
        # QuantizeLinear nodes and scale / zero-point Constants nobody reads any more go too (reverse topological
        # order: every consumer is seen before its producer).
        used = {o.name for o in self.g.output}
        final: list[onnx.NodeProto] = []
        for node in reversed(kept):
            if node.op_type in ("QuantizeLinear", "Constant") and not any(o in used for o in node.output):
                continue
            if node.op_type == "QuantizeLinear":
                raise QuantizationError(f"{_where(node.output[0], node)}: QuantizeLinear output is used by something "
                                        "other than a DequantizeLinear; the model computes on integers and is not a "
                                        "QDQ model")
            final.append(node)
            used.update(i for i in node.input if i)
        final.reverse()
        return final

    def prune(self, final: list[onnx.NodeProto]) -> set[str]:
        """Replace the graph's nodes by `final`; drop the inputs, initializers and value infos nothing uses any
        more, add the folded constants. The names still used."""
        g, folded = self.g, self.folded
        del g.node[:]
        g.node.extend(final)
        used = _used_names(final, g.output)
        inits = [i for i in g.initializer if i.name in used and i.name not in folded]
        gone = {i.name for i in g.initializer} - {i.name for i in inits}
        ins = [i for i in g.input if i.name not in gone]  # old IRs list initializers among the inputs
        del g.input[:]
        g.input.extend(ins)
        del g.initializer[:]
        g.initializer.extend(inits)
        g.initializer.extend(numpy_helper.from_array(v, name) for name, v in folded.items() if name in used)
        vi = [v for v in g.value_info if v.name in used and v.name not in folded]
        del g.value_info[:]
        g.value_info.extend(vi)
        return used

    def propagated_fix_points(self, final: list[onnx.NodeProto], used: set[str]) -> dict[str, int]:
        fix_points = self.fix_points
        for node in final:  # in topological order: a chain of value-keeping ops passes the fix_point along
            fp = _kept_fix_point(node, fix_points, self.consts)
            if fp is not None:
                for out_name in node.output[:len(node.output) if node.op_type == "Split" else 1]:
                    fix_points.setdefault(out_name, fp)
        inputs = {i.name for i in self.g.input}
        return {k: v for k, v in fix_points.items() if k in used or k in inputs}


def strip_qdq(model: onnx.ModelProto | str, scales: str = "exact",
              rounded: list[ScaleRounding] | None = None) -> tuple[onnx.ModelProto, dict[str, int]]:
    """(float model, fix_points) of a QDQ ONNX model (or a path to one); see the module docstring.

    `fix_points` maps tensor names of the returned float model to fix_points (value = q * 2**-fp).
    The input model is not modified. With `scales="exact"` (default) raises QuantizationError for a
    non-power-of-two scale, a nonzero zero point, non-int8 activations, differing per-channel scales, or Q/DQ
    nodes that are not pairs around a float tensor. `scales="round"` rounds scales up to powers of two and
    appends each rounding to `rounded`; `scales="float"` removes the quantization altogether (no fix_points).
    """
    if scales not in SCALE_MODES:
        raise QuantizationError(f"scales={scales!r}: expected one of {SCALE_MODES}")
    rounding: list[ScaleRounding] | None = (rounded if rounded is not None else []) if scales == "round" else None
    src = onnx.load(model) if isinstance(model, str) else model
    out = onnx.ModelProto()
    out.CopyFrom(src)
    st = _Stripper(out, rounding, scales == "float")
    for node in st.g.node:
        if node.op_type == "DequantizeLinear" and node.domain in ("", "ai.onnx"):
            st.dequantize(node)
    final = st.rewrite_nodes()
    return out, st.propagated_fix_points(final, st.prune(final))


def _kept_fix_point(node: onnx.NodeProto, fix_points: dict[str, int], consts: dict[str, np.ndarray]) -> int | None:
    """The fix_point `node`'s output keeps from its input (VALUE_KEEPING_OPS), or None."""
    if node.op_type not in VALUE_KEEPING_OPS or node.domain not in ("", "ai.onnx") or not node.input:
        return None
    if node.op_type == "Concat":
        fps = {fix_points.get(i) for i in node.input}
        return fps.pop() if len(fps) == 1 else None
    if node.op_type in ("Resize", "Upsample") and _attr(node, "mode", b"nearest") not in (b"nearest", "nearest"):
        return None
    if node.op_type == "Pad" and _attr(node, "mode", b"constant") in (b"constant", "constant"):
        value = node.input[2] if len(node.input) > 2 and node.input[2] else None
        if _attr(node, "value", 0.0) != 0.0 or (value is not None and (value not in consts or np.any(consts[value]))):
            return None  # a nonzero pad value need not be a multiple of the step
    return fix_points.get(node.input[0])


def _scale_of(node: onnx.NodeProto, consts: dict[str, np.ndarray]) -> float:
    """The node's (checked, per-tensor) scale value."""
    return float(np.asarray(consts[node.input[1]], dtype=np.float64).ravel()[0])


def _note_constant_error(rounding: list[ScaleRounding] | None, tensor: str, node: onnx.NodeProto,
                         value: np.ndarray, fp: int) -> None:
    """Record what re-quantizing a constant at its rounded fix_point changes (max error / max magnitude)."""
    if not rounding:
        return
    for i, r in enumerate(rounding):
        if r.node == node.name and r.tensor == tensor:
            v = value.astype(np.float64)
            requant = np.clip(np.rint(v * 2.0 ** fp), -128, 127) * 2.0 ** -fp
            peak = float(np.max(np.abs(v))) if v.size else 0.0
            err = float(np.max(np.abs(requant - v))) / peak if peak else 0.0
            rounding[i] = ScaleRounding(r.tensor, r.node, r.scale, r.fix_point, err)


def _axis_shaped(node: onnx.NodeProto, v: np.ndarray, ndim: int) -> np.ndarray:
    """A per-channel scale or zero point reshaped to broadcast along the node's axis (default 1)."""
    v = np.asarray(v)
    if v.ndim == 0 or v.size == 1:
        return v.reshape(())
    if _attr(node, "block_size", 0):
        raise QuantizationError(f"{_where(node.input[0], node)}: blocked quantization (block_size) is not supported")
    shape = [1] * ndim
    shape[int(_attr(node, "axis", 1)) % ndim] = -1
    return v.reshape(shape)


def _scale_zero(node: onnx.NodeProto, consts: dict[str, np.ndarray], ndim: int) -> tuple[np.ndarray, np.ndarray]:
    if len(node.input) < 2 or node.input[1] not in consts:
        raise QuantizationError(f"{_where(node.input[0], node)}: the scale is not a constant")
    scale = _axis_shaped(node, np.asarray(consts[node.input[1]], np.float64), ndim)
    zp = consts.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if len(node.input) > 2 and node.input[2] and zp is None:
        raise QuantizationError(f"{_where(node.input[0], node)}: the zero point is not a constant")
    zero = np.zeros((), np.float64) if zp is None else _axis_shaped(node, np.asarray(zp, np.float64), ndim)
    return scale, zero


def _dequantize(node: onnx.NodeProto, data: np.ndarray, consts: dict[str, np.ndarray]) -> np.ndarray:
    """DequantizeLinear of a constant, exactly as ONNX defines it: (q - zero_point) * scale."""
    scale, zero = _scale_zero(node, consts, np.ndim(data))
    return ((np.asarray(data, np.float64) - zero) * scale).astype(np.float32)


def _quantize(node: onnx.NodeProto, w: np.ndarray, consts: dict[str, np.ndarray]) -> np.ndarray:
    """QuantizeLinear of a constant (round half to even, saturate to the zero point's type, uint8 without one)."""
    scale, zero = _scale_zero(node, consts, np.ndim(w))
    zp = consts.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    info = np.iinfo(np.asarray(zp).dtype if zp is not None else np.uint8)
    return np.clip(np.rint(np.asarray(w, np.float64) / scale) + zero, info.min, info.max)


def _used_names(nodes: Iterable[onnx.NodeProto], outputs: Iterable[onnx.ValueInfoProto]) -> set[str]:
    used = {o.name for o in outputs}
    for n in nodes:
        used.update(i for i in n.input if i)
    return used
