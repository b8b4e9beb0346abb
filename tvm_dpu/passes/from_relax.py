"""Float XGraph from a Relax DPU partition function (a function with attr ``Codegen="dpu"``, see passes.partition).

The partition holds local composite functions (attr ``Composite``, the names of `passes.patterns`) bound to vars
and called (TVM binds ONE function object for structurally identical composites). Every composite call becomes at
most one XGraph op; its body is read as a chain of Relax calls:

=============================================  ==================================================================
Relax (normalized form, passes/patterns.py)    XGraph (FLOAT convention: float32 tensors, fix_point None)
=============================================  ==================================================================
conv2d(x, W) [+ add(b)] [+ act]                "conv2d" (or "depthwise_conv2d" when groups == C == O), act fused
conv2d_transpose(x, W IOHW) [+ add] [+ act]    "conv2d_transpose" (weights IOHW as Relax has them)
reshape -> conv2d 1x1 ... -> reshape (dense)   "conv2d" on the 4-D map ([N,K] is viewed as [N,K,1,1])
add(x, y) [+ relu]                             "eltwise_add"
max_pool2d / avg_pool2d                        "max_pool2d" / "avg_pool2d" (ceil_mode -> extra bottom/right pads)
mean(x, [2, 3], keepdims)                      "avg_pool2d" global
concat((...), axis=1)                          "concat"
image.resize2d nearest, integer scale          "upsample_nearest"
leakyrelu / relu / clip(0, 6) alone            "activation" mode leaky_relu / relu / relu6
clip(x*1/6 + 0.5, 0, 1) | clip(x+3, 0, 6)/6    "activation" mode hard_sigmoid (composite dpu.hard_sigmoid*)
multiply(x, y)                                 "eltwise_mul" (y equal-shape or an N x C x 1 x 1 gate, put second)
max_pool2d / avg_pool2d + relu                 the pool, then "activation" mode relu
free reshape [N,K] <-> [N,K,1,1]               no op: the Relax var aliases the XGraph tensor
=============================================  ==================================================================

act = relu | clip(0, 6) (relu6) | leakyrelu(alpha).

Feature maps are 4-D NCHW, one image (a batch runs image by image); a 2-D Relax tensor [N, K] is the same data as
[N, K, 1, 1] and is represented by that 4-D tensor. `FloatSubgraph.input_shapes` / `output_shapes` keep the Relax
shapes (batch included) for the runtime.
Every op records in `Op.source` the ONNX node names of the Relax calls it came from (frontend provenance, or the
partitioner's trace passed as `call_names`, see `build_float_xgraph`); its name is the first of them, made unique.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm
from tvm import relax

from tvm_dpu.errors import DPUError
from tvm_dpu.frontend.const_fold import const_array
from tvm_dpu.frontend.provenance import merge, node_names
from tvm_dpu.passes.patterns import pattern_names
from tvm_dpu.xgraph.graph import Graph, Op, Tensor
from tvm_dpu.xgraph.validate import validate_graph

_ACTS = {"relax.nn.relu": "relu", "relax.clip": "relu6", "relax.nn.leakyrelu": "leaky_relu"}
_CONV_OPS = ("relax.nn.conv2d", "relax.nn.conv2d_transpose")
_CONV_TYPES = ("conv2d", "depthwise_conv2d", "conv2d_transpose")


class FromRelaxError(DPUError, ValueError):
    """A partition function that cannot become a float XGraph (unknown composite, bad shape, ...)."""


class UnsupportedCompositeError(FromRelaxError, NotImplementedError):
    """A composite the DPU patterns accept but this lowering does not handle yet."""


@dataclass
class FloatSubgraph:
    """A DPU partition as a float XGraph.

    `input_names[i]` / `input_shapes[i]`: XGraph tensor and Relax shape of the function's i-th parameter.
    `output_names[i]` / `output_shapes[i]`: XGraph tensor and Relax shape of the i-th returned value (one entry when
    the function does not return a tuple). The XGraph tensors are 4-D; the runtime reshapes to the Relax shapes.
    """

    graph: Graph
    input_names: list[str]
    output_names: list[str]
    input_shapes: list[tuple[int, ...]]
    output_shapes: list[tuple[int, ...]]


def build_float_xgraph(func: relax.Function, name: str,
                       call_names: Sequence[Sequence[str]] | None = None) -> FloatSubgraph:
    """Lower the DPU partition function `func` to a validated float XGraph named `name`.

    `call_names`, when given, are the ONNX node names of every primitive call of `func` in binding order (the
    partition's bindings, each composite's bindings inside), e.g. ``[binding_node_names(infos[t]) for t in
    subgraph.tags]`` from `passes.partition_detailed`. They replace the calls' own spans, which are wrong for
    structurally identical composites: TVM shares one local function between them (e.g. the two residual adds of
    a ResNet stage), so both would carry the first one's names.

    Raises `FromRelaxError` (or its `UnsupportedCompositeError` subclass) naming the composite and its ONNX
    nodes for anything it cannot lower exactly.
    """
    if not isinstance(func, relax.Function):
        raise FromRelaxError(f"build_float_xgraph expects a relax.Function, got {type(func).__name__}")
    builder = _Builder(name, call_names)
    fs = builder.build(func)
    if call_names is not None and builder.n_calls != len(call_names):
        raise FromRelaxError(f"partition {name!r}: {len(call_names)} call names given for {builder.n_calls} calls")
    validate_graph(fs.graph)
    return fs


# ---------------------------------------------------------------------------------------------------------
@dataclass
class _Value:
    """What a Relax var holds: an XGraph tensor (always 4-D) seen with the Relax shape `shape`."""

    tensor: str
    shape: tuple[int, ...]
    op: Op | None = None  # producer in this graph (None for graph inputs)


@dataclass
class _Composite:
    """One composite call being lowered: its name, node names, and the ops it created."""

    kind: str
    names: list[str]
    created: list[Op] = field(default_factory=list)

    def where(self) -> str:
        nodes = ", ".join(self.names) if self.names else "no ONNX provenance"
        return f"composite {self.kind!r} (ONNX: {nodes})"


def _shape(expr: relax.Expr, where: str) -> tuple[int, ...]:
    shape = getattr(expr.ty, "shape", None)
    try:
        return tuple(int(v) for v in shape.values)
    except (AttributeError, TypeError, ValueError):
        raise FromRelaxError(f"{where}: tensor without a static shape ({expr.ty})") from None


def _fmap_shape(shape: tuple[int, ...], where: str) -> tuple[int, int, int, int]:
    """The 4-D NCHW XGraph shape of a Relax tensor shape ([N, K] is [N, K, 1, 1]), for ONE image: the XGraph and its
    program are batch 1, a batch of N runs as N calls (runtime/subgraph_runner.execute_float); the Relax shapes,
    batch included, stay in FloatSubgraph.input_shapes / output_shapes."""
    if len(shape) == 2:
        shape = (shape[0], shape[1], 1, 1)
    if len(shape) != 4:
        raise FromRelaxError(f"{where}: {len(shape)}-D tensor {list(shape)}; DPU feature maps are NCHW")
    if shape[0] < 1:
        raise FromRelaxError(f"{where}: batch {shape[0]}")
    return (1, *shape[1:])  # type: ignore[return-value]


def _ints(values) -> list[int]:
    return [int(v) for v in values]


def _scalar(e: relax.Expr) -> float:
    """A clip bound (a PrimValue, or a scalar tensor constant)."""
    v = getattr(e, "value", e)
    if hasattr(v, "numpy"):
        return float(np.asarray(v.numpy()).reshape(()))
    return float(getattr(v, "value", v))


class _Builder:
    def __init__(self, name: str, call_names: Sequence[Sequence[str]] | None = None):
        self.graph = Graph(name)
        self.op_names: set[str] = set()
        self.call_names = call_names
        self.n_calls = 0  # primitive calls seen so far, in binding order
        # Each constant read once per graph (composites TVM shares read the same ones). Per builder, not per
        # process: a process-wide cache kept every compiled model's float weights alive (VGG-16: 0.5 GB).
        self._arrays: dict[Any, np.ndarray] = {}

    def _const_array(self, c: Any) -> np.ndarray:
        """A constant's values as float32; a float32 constant stays a read-only view of TVM's tensor (no copy: a
        large model's weights are not held twice while it compiles)."""
        if c not in self._arrays:
            self._arrays[c] = np.asarray(const_array(c), dtype=np.float32)
        return self._arrays[c]

    def _names_of(self, call: relax.Call, var: relax.Var) -> list[str]:
        """Node names of the next primitive call (from `call_names`, else its span, else its var)."""
        i = self.n_calls
        self.n_calls += 1
        if self.call_names is None:
            return node_names(call, var)
        if i >= len(self.call_names):
            raise FromRelaxError(f"partition {self.graph.name!r}: only {len(self.call_names)} call names given")
        return [str(n) for n in self.call_names[i]] or [str(var.name)]

    # -- names ------------------------------------------------------------------------------------------
    @staticmethod
    def _unique(base: str, taken) -> str:
        base = base or "t"
        if base not in taken:
            return base
        i = 1
        while f"{base}_{i}" in taken:
            i += 1
        return f"{base}_{i}"

    def _new_tensor(self, base: str, shape, data: np.ndarray | None = None) -> str:
        name = self._unique(base, self.graph.tensors)
        self.graph.add_tensor(Tensor(name, tuple(shape), "float32", None, data))
        return name

    def _new_op(self, comp: _Composite, base: str, type_: str, inputs: list[str], out_shape, attrs: dict,
                source: list[str]) -> Op:
        name = self._unique(base, self.op_names)
        self.op_names.add(name)
        out = self._new_tensor(name, out_shape)
        op = self.graph.add_op(Op(name, type_, list(inputs), [out], attrs, {}, list(source)))
        comp.created.append(op)
        return op

    def _param(self, op: Op, role: str, data: np.ndarray) -> None:
        op.params[role] = self._new_tensor(f"{op.name}.{role}", data.shape, np.ascontiguousarray(data, np.float32))

    # -- the partition function ------------------------------------------------------------------------
    def build(self, func: relax.Function) -> FloatSubgraph:
        params = []
        input_names, input_shapes = [], []
        for p in func.params:
            where = f"partition {self.graph.name!r} parameter {p.name!r}"
            self._check_dtype(p, where)
            shape = _shape(p, where)
            t = self._new_tensor(str(p.name), _fmap_shape(shape, where))
            self.graph.inputs.append(t)
            params.append(_Value(t, shape))
            input_names.append(t)
            input_shapes.append(shape)

        def other(b: relax.Binding) -> None:
            raise FromRelaxError(f"partition {self.graph.name!r}: binding {b.var.name!r} is {_describe(b.value)}, "
                                 "not a call of a composite function")

        ret = walk_function(func, params, resolve=self._resolve, on_local_call=self._composite, on_other=other)
        outs = list(ret) if isinstance(ret, tuple) else [ret]
        for v in outs:
            if not isinstance(v, _Value):
                raise FromRelaxError(f"partition {self.graph.name!r}: returns {_describe(v)}, not a tensor or a "
                                     "tuple of tensors")
        self.graph.outputs = [v.tensor for v in outs]
        return FloatSubgraph(self.graph, input_names, list(self.graph.outputs), input_shapes,
                             [v.shape for v in outs])

    def _resolve(self, env: dict, expr):
        if isinstance(expr, relax.Var):
            if expr not in env:
                raise FromRelaxError(f"partition {self.graph.name!r}: unbound variable {expr.name!r}")
            return env[expr]
        if isinstance(expr, relax.Tuple):
            return tuple(self._resolve(env, f) for f in expr.fields)
        if isinstance(expr, relax.TupleGetItem):
            tup = self._resolve(env, expr.tuple_value)
            if isinstance(tup, tuple):
                return tup[int(expr.index)]
            raise FromRelaxError(f"partition {self.graph.name!r}: item {int(expr.index)} of a non-tuple")
        return expr  # constants, shapes, prim values: read by the op that takes them

    @staticmethod
    def _check_dtype(expr: relax.Expr, where: str) -> None:
        dtype = str(getattr(expr.ty, "dtype", ""))
        if dtype != "float32":
            raise FromRelaxError(f"{where}: dtype {dtype or 'unknown'}; the float XGraph takes float32 tensors")

    # -- one composite ----------------------------------------------------------------------------------
    def _composite(self, fn: relax.Function, args: list) -> _Value:
        kind = str(fn.attrs["Composite"]) if fn.attrs is not None and "Composite" in fn.attrs else "<none>"
        bindings = [b for blk in fn.body.blocks for b in blk.bindings]
        own = {b.var: self._names_of(b.value, b.var) for b in bindings
               if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)}
        comp = _Composite(kind, merge(*own.values()))
        if kind not in _known_composites():
            raise FromRelaxError(f"{comp.where()}: not a DPU pattern this lowering knows")
        if kind.startswith("dpu.hard_sigmoid"):
            return self._hard_sigmoid(comp, fn, args)
        uses = _use_counts(fn)

        def op(var: relax.Var, call: relax.Call, env: dict) -> _Value:
            self._check_dtype(call, comp.where())
            return self._call(comp, var, call, [self._resolve(env, a) for a in call.args], uses, own[var])

        def other(b: relax.Binding) -> None:
            raise FromRelaxError(f"{comp.where()}: binding {b.var.name!r} is {_describe(b.value)}")

        out = walk_function(fn, args, resolve=self._resolve, on_op=op, on_other=other)
        if not isinstance(out, _Value):
            raise FromRelaxError(f"{comp.where()}: does not return one tensor")
        return out

    def _fusable(self, comp: _Composite, x: _Value, var_uses: int) -> Op | None:
        """The op of `comp` that produced `x`, when a point-wise op may be folded into it."""
        if x.op is not None and any(x.op is o for o in comp.created) and var_uses <= 1:
            return x.op
        return None

    def _call(self, comp: _Composite, var: relax.Var, call: relax.Call, args: list, uses: dict,
              own: list[str]) -> _Value:
        name = call.op.name
        where = comp.where()
        out_shape = _shape(call, where)
        base = own[0] if own else str(var.name)
        if name in _CONV_OPS:
            return self._conv(comp, call, args, out_shape, base, own)
        if name == "relax.add":
            return self._add(comp, call, args, out_shape, base, own, uses)
        if name == "relax.multiply":
            return self._mul(comp, args, out_shape, base, own)
        if name in _ACTS:
            return self._act(comp, call, args, out_shape, base, own, uses)
        if name in ("relax.nn.max_pool2d", "relax.nn.avg_pool2d"):
            return self._pool(comp, call, args, out_shape, base, own)
        if name == "relax.mean":
            return self._mean(comp, call, args, out_shape, base, own)
        if name == "relax.concat":
            return self._concat(comp, call, args, out_shape, base, own)
        if name == "relax.image.resize2d":
            return self._upsample(comp, call, args, out_shape, base, own)
        if name == "relax.reshape":
            return self._reshape(comp, args, out_shape, own)
        raise FromRelaxError(f"{where}: Relax op {name} has no XGraph lowering")

    def _data(self, comp: _Composite, args: list, i: int = 0) -> _Value:
        x = args[i]
        if not isinstance(x, _Value):
            raise FromRelaxError(f"{comp.where()}: argument {i} is {_describe(x)}, expected a feature map")
        return x

    def _out(self, op: Op, shape: tuple[int, ...]) -> _Value:
        return _Value(op.outputs[0], shape, op)

    # -- conv family -------------------------------------------------------------------------------------
    def _conv(self, comp, call, args, out_shape, base, own) -> _Value:
        where = comp.where()
        x = self._data(comp, args)
        w = args[1]
        if not isinstance(w, tvm.ir.Constant):
            raise FromRelaxError(f"{where}: conv weights are not a constant")
        a = call.attrs
        transposed = call.op.name == "relax.nn.conv2d_transpose"
        want = "IOHW" if transposed else "OIHW"
        if str(a.data_layout) != "NCHW" or str(a.kernel_layout) != want or str(a.out_layout) not in ("NCHW", ""):
            raise FromRelaxError(f"{where}: layout {a.data_layout}/{a.kernel_layout} (expected NCHW/{want})")
        if len(x.shape) != 4:
            raise FromRelaxError(f"{where}: conv input is {len(x.shape)}-D")
        weights = self._const_array(w)
        groups = int(a.groups)
        c_in, c_out = x.shape[1], out_shape[1]
        attrs: dict = {"strides": _ints(a.strides), "pads": _ints(a.padding), "dilations": _ints(a.dilation)}
        if transposed:
            type_ = "conv2d_transpose"
            attrs["output_padding"] = _ints(a.output_padding)
            attrs["groups"] = groups
        elif groups > 1 and groups == c_in == c_out:
            type_ = "depthwise_conv2d"
        else:
            type_ = "conv2d"
            attrs["groups"] = groups
        attrs["act"] = "none"
        if len(attrs["pads"]) == 2:  # (h, w) symmetric form
            attrs["pads"] = attrs["pads"] * 2
        op = self._new_op(comp, base, type_, [x.tensor], _fmap_shape(out_shape, where), attrs, own)
        self._param(op, "weights", weights)
        return self._out(op, out_shape)

    def _add(self, comp, call, args, out_shape, base, own, uses) -> _Value:
        where = comp.where()
        consts = [i for i, a in enumerate(args) if isinstance(a, tvm.ir.Constant)]
        if len(consts) == 1:
            x = self._data(comp, args, 1 - consts[0])
            var = call.args[1 - consts[0]]
            op = self._fusable(comp, x, uses.get(var, 0))
            if op is None or op.type not in _CONV_TYPES or "bias" in op.params or op.attrs["act"] != "none":
                raise FromRelaxError(f"{where}: add of a constant that is not the bias of a conv")
            bias = _per_channel(self._const_array(args[consts[0]]), out_shape)
            if bias is None or x.shape != out_shape:
                raise FromRelaxError(f"{where}: constant add of shape {list(args[consts[0]].ty.shape.values)} is not "
                                     f"a per-channel bias of {list(out_shape)}")
            self._param(op, "bias", bias)
            op.source = merge(op.source, own)
            return self._out(op, out_shape)
        if consts:
            raise FromRelaxError(f"{where}: add of two constants")
        a, b = self._data(comp, args, 0), self._data(comp, args, 1)
        if a.shape != b.shape or a.shape != out_shape:
            raise FromRelaxError(f"{where}: add with broadcasting {list(a.shape)} + {list(b.shape)}")
        op = self._new_op(comp, base, "eltwise_add", [a.tensor, b.tensor], _fmap_shape(out_shape, where),
                          {"act": "none"}, own)
        return self._out(op, out_shape)

    def _mul(self, comp, args, out_shape, base, own) -> _Value:
        """Two feature maps: equal shapes, or a map times a channel gate (N, C, 1, 1); the gate goes second."""
        where = comp.where()
        a, b = self._data(comp, args, 0), self._data(comp, args, 1)
        if a.shape != out_shape:
            a, b = b, a
        gate = (*out_shape[:2], 1, 1)
        flat = len(out_shape) == 2 and a.shape == b.shape == out_shape  # [N, K]: the view of [N, K, 1, 1]
        if not flat and (a.shape != out_shape or len(out_shape) != 4 or b.shape not in (out_shape, gate)):
            raise FromRelaxError(f"{where}: multiply {list(a.shape)} * {list(b.shape)} is neither element-wise nor "
                                 f"by a channel gate {list(gate)}")
        op = self._new_op(comp, base, "eltwise_mul", [a.tensor, b.tensor], _fmap_shape(out_shape, where),
                          {"act": "none"}, own)
        return self._out(op, out_shape)

    def _hard_sigmoid(self, comp, fn, args) -> _Value:
        """A dpu.hard_sigmoid* composite (the pattern checked its constants): one ALU hard_sigmoid activation."""
        where = comp.where()
        xs = [a for a in args if isinstance(a, _Value)]
        if len(xs) != 1:
            raise FromRelaxError(f"{where}: hard sigmoid needs exactly one feature-map input, got {len(xs)}")
        out_shape = _shape(fn.body.body, where)
        base = comp.names[0] if comp.names else "hard_sigmoid"
        op = self._new_op(comp, base, "activation", [xs[0].tensor], _fmap_shape(out_shape, where),
                          {"mode": "hard_sigmoid"}, comp.names)
        return self._out(op, out_shape)

    def _act(self, comp, call, args, out_shape, base, own, uses) -> _Value:
        where = comp.where()
        x = self._data(comp, args)
        act = _ACTS[call.op.name]
        alpha = None
        if act == "relu6":
            lo, hi = _scalar(call.args[1]), _scalar(call.args[2])
            if (lo, hi) != (0.0, 6.0):
                raise FromRelaxError(f"{where}: clip({lo:g}, {hi:g}) is not ReLU6")
        elif act == "leaky_relu":
            alpha = float(call.attrs.alpha)
        op = self._fusable(comp, x, uses.get(call.args[0], 0))
        if op is not None and op.type in ("max_pool2d", "avg_pool2d"):
            op = None  # pools fuse no activation: pool, then a standalone activation op
        if op is not None and op.attrs.get("act", "none") == "none":
            if op.type in _CONV_TYPES or (op.type == "eltwise_add" and act == "relu"):
                op.attrs["act"] = act
                if alpha is not None:
                    op.attrs["alpha"] = alpha
                op.source = merge(op.source, own)
                return self._out(op, out_shape)
        if op is not None:
            raise FromRelaxError(f"{where}: {act} cannot be fused into {op.type} {op.name!r}")
        attrs: dict = {"mode": act} if alpha is None else {"mode": act, "alpha": alpha}
        op = self._new_op(comp, base, "activation", [x.tensor], _fmap_shape(out_shape, where), attrs, own)
        return self._out(op, out_shape)

    # -- pools -------------------------------------------------------------------------------------------
    def _pool(self, comp, call, args, out_shape, base, own) -> _Value:
        where = comp.where()
        x = self._data(comp, args)
        a = call.attrs
        if str(a.layout) != "NCHW" or str(a.out_layout) not in ("NCHW", "") or len(x.shape) != 4:
            raise FromRelaxError(f"{where}: pool layout {a.layout} (expected NCHW)")
        if any(int(d) != 1 for d in a.dilation):
            raise FromRelaxError(f"{where}: pool dilation {_ints(a.dilation)} (XGraph pools have none)")
        kernel, strides = _ints(a.pool_size), _ints(a.strides)
        pads = _ints(a.padding)
        if len(pads) == 2:
            pads = pads * 2
        is_max = call.op.name == "relax.nn.max_pool2d"
        count_include_pad = bool(a.count_include_pad)
        if bool(a.ceil_mode):
            # Floor-mode windows over extra bottom / right padding give the ceil-mode output size. For max
            # pooling that padding never wins; an average must not count it.
            extra = [(o - 1) * s + k - (n + p0 + p1)
                     for o, s, k, n, p0, p1 in zip(out_shape[2:], strides, kernel, x.shape[2:], pads[:2], pads[2:])]
            if any(e > 0 for e in extra):
                if not is_max and count_include_pad:
                    if any(pads):
                        raise UnsupportedCompositeError(
                            f"{where}: ceil_mode avg pool with padding {pads} and count_include_pad: the divisor of "
                            "the last window has no exact XGraph form")
                    count_include_pad = False  # no padding: the divisor counts the input pixels only
                pads = [pads[0], pads[1], pads[2] + max(extra[0], 0), pads[3] + max(extra[1], 0)]
        attrs: dict = {"kernel": kernel, "strides": strides, "pads": pads}
        if not is_max:
            attrs["count_include_pad"] = count_include_pad
            attrs["global"] = tuple(kernel) == x.shape[2:] and out_shape[2:] == (1, 1) and not any(pads)
        type_ = "max_pool2d" if is_max else "avg_pool2d"
        op = self._new_op(comp, base, type_, [x.tensor], _fmap_shape(out_shape, where), attrs, own)
        return self._out(op, out_shape)

    def _mean(self, comp, call, args, out_shape, base, own) -> _Value:
        where = comp.where()
        x = self._data(comp, args)
        axes = sorted(int(v) % 4 for v in (call.attrs.axis or [])) if len(x.shape) == 4 else []
        if axes != [2, 3] or not bool(call.attrs.keepdims):
            raise FromRelaxError(f"{where}: mean is not over the spatial axes [2, 3] with keepdims")
        op = self._new_op(comp, base, "avg_pool2d", [x.tensor], _fmap_shape(out_shape, where), {"global": True}, own)
        return self._out(op, out_shape)

    # -- data movement -----------------------------------------------------------------------------------
    def _concat(self, comp, call, args, out_shape, base, own) -> _Value:
        where = comp.where()
        parts = args[0]
        if not isinstance(parts, tuple) or not all(isinstance(p, _Value) for p in parts):
            raise FromRelaxError(f"{where}: concat of something other than a tuple of feature maps")
        axis = int(call.attrs.axis) % len(out_shape)
        if axis != 1:
            raise FromRelaxError(f"{where}: concat along axis {axis}; XGraph concatenates channels (axis 1)")
        op = self._new_op(comp, base, "concat", [p.tensor for p in parts], _fmap_shape(out_shape, where),
                          {"axis": 1}, own)
        return self._out(op, out_shape)

    def _upsample(self, comp, call, args, out_shape, base, own) -> _Value:
        where = comp.where()
        x = self._data(comp, args)
        a = call.attrs
        if str(a.layout) != "NCHW" or len(x.shape) != 4:
            raise FromRelaxError(f"{where}: resize layout {a.layout} (expected NCHW)")
        (h, w), (oh, ow) = x.shape[2:], out_shape[2:]
        mode, rounding = str(a.coordinate_transformation_mode), str(a.rounding_method)
        # Same rule as passes.patterns: which nearest resizes are pure pixel replication.
        replicates = mode in ("half_pixel", "pytorch_half_pixel") or (mode == "asymmetric" and rounding == "floor")
        if str(a.method) != "nearest_neighbor" or oh % h or ow % w or not replicates:
            raise FromRelaxError(f"{where}: resize {a.method} {mode}/{rounding or 'default'} {h}x{w} -> {oh}x{ow} "
                                 "is not an integer nearest upsampling")
        op = self._new_op(comp, base, "upsample_nearest", [x.tensor], _fmap_shape(out_shape, where),
                          {"scale": [oh // h, ow // w]}, own)
        return self._out(op, out_shape)

    def _reshape(self, comp, args, out_shape, own) -> _Value:
        where = comp.where()
        x = self._data(comp, args)
        if _fmap_shape(x.shape, where) != _fmap_shape(out_shape, where):
            raise FromRelaxError(f"{where}: reshape {list(x.shape)} -> {list(out_shape)} is not free "
                                 "(only [N,K] <-> [N,K,1,1])")
        if x.op is not None:
            x.op.source = merge(x.op.source, own)
        return _Value(x.tensor, out_shape, x.op)


def _known_composites() -> frozenset[str]:
    return frozenset(pattern_names())


def _per_channel(bias: np.ndarray, out_shape: tuple[int, ...]) -> np.ndarray | None:
    """`bias` as a (C,) vector if, broadcast against `out_shape`, it varies along the channel axis only."""
    if bias.ndim > len(out_shape):
        return None
    full = (1,) * (len(out_shape) - bias.ndim) + bias.shape
    c = out_shape[1]
    if full[1] != c or any(d != 1 for i, d in enumerate(full) if i != 1):
        return None
    return bias.reshape(c)


def walk_function(fn: relax.Function, args: Sequence[Any], *, resolve: Callable[[dict, Any], Any],
                  on_op: Callable[[relax.Var, relax.Call, dict], Any] | None = None,
                  on_local_call: Callable[[relax.Function, list], Any] | None = None,
                  on_other: Callable[[relax.Binding], Any], aliases: tuple[type, ...] = (
                      relax.Var, relax.Tuple, relax.TupleGetItem)) -> Any:
    """The one walk over a Relax function's bindings (a partition, or a composite inside it) that the DPU lowering
    and the plugins' glue share. The params are bound to `args`; then, in order, each binding's var is bound to:
    a local function: recorded (with `on_local_call`), a call of one: `on_local_call(function, resolved args)`;
    a call of a Relax op: `on_op(var, call, env)` (with `on_op`); an alias (`aliases`: a var, tuple or tuple item):
    `resolve(env, value)`; anything else: `on_other(binding)`, which raises. Returns `resolve(env, body)`."""
    env: dict = dict(zip(fn.params, args))
    local: dict = {}
    for block in fn.body.blocks:
        for b in block.bindings:
            val = b.value
            if on_local_call is not None and isinstance(val, relax.Function):
                local[b.var] = val
            elif on_local_call is not None and isinstance(val, relax.Call) and isinstance(val.op, relax.Var) \
                    and val.op in local:
                env[b.var] = on_local_call(local[val.op], [resolve(env, a) for a in val.args])
            elif on_op is not None and isinstance(val, relax.Call) and isinstance(val.op, tvm.ir.Op):
                env[b.var] = on_op(b.var, val, env)
            elif isinstance(val, aliases):
                env[b.var] = resolve(env, val)
            else:
                on_other(b)
    return resolve(env, fn.body.body)


def _use_counts(fn: relax.Function) -> dict:
    """How many times each var of `fn`'s body is read (call arguments, aliases, tuples, the return value)."""
    counts: dict = {}
    reads = [b.value for blk in fn.body.blocks for b in blk.bindings] + [fn.body.body]
    for value in reads:
        for v in _vars_of(value):
            counts[v] = counts.get(v, 0) + 1
    return counts


def _vars_of(e) -> list:
    if isinstance(e, relax.Call):
        return [v for a in e.args for v in _vars_of(a)]
    if isinstance(e, relax.Var):
        return [e]
    if isinstance(e, relax.Tuple):
        return [v for f in e.fields for v in _vars_of(f)]
    if isinstance(e, relax.TupleGetItem):
        return _vars_of(e.tuple_value)
    return []


def _describe(e) -> str:
    if isinstance(e, tuple):
        return "a nested tuple"
    if isinstance(e, relax.Call):
        return f"a call of {getattr(e.op, 'name', None) or getattr(e.op, 'name_hint', e.op)}"
    return f"a {type(e).__name__}"


__all__ = ["FloatSubgraph", "FromRelaxError", "UnsupportedCompositeError", "build_float_xgraph", "walk_function"]
