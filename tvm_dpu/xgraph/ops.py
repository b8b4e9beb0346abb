"""XGraph op types: attributes (with defaults), parameter roles, shape inference and quantization parameters.

Attribute conventions (all JSON scalars / lists; pairs are (h, w); pads are [top, left, bottom, right]):

=================== ======================================================================================
conv2d              strides=[1,1], pads=[0,0,0,0], dilations=[1,1], groups=1, act="none", alpha (leaky),
                    in_slice=None.
                    params: weights (O, I/groups, kh, kw) int8, bias (O,) int8 optional.
                    in_slice [c0, c] (groups 1): a PARTIAL conv reading only input channels [c0, c0 + c); its
                    weights are (O, c, kh, kw). backend/split_conv.py makes them (a reduction too long for one
                    CONV becomes partial convs summed by eltwise adds); every consumer of the op sees only the
                    slice (`conv_input_slice`).
depthwise_conv2d    as conv2d; weights (C, 1, kh, kw); runs on the ALU (act none/relu/relu6).
conv2d_transpose    strides, pads, dilations, output_padding=[0,0], groups=1, act; weights (I, O/groups, kh, kw)
                    (the ONNX / Relax layout). Computed as a stride-1 conv over the input with (s-1) zeros
                    inserted between pixels, padded by d*(k-1) - pad (plus output_padding at the bottom/right),
                    with the kernel flipped and its in/out axes swapped. groups == C_in == C_out (weights
                    (C, 1, kh, kw)) is a depthwise transposed conv: it runs on the ALU (act none/relu/relu6).
dense               act, in_slice=None; weights (O, C*H*W) or (O, C, H, W): a conv whose kernel covers the whole
                    input; output (N, O, 1, 1). in_slice as conv2d (C is then the slice's channel count).
max_pool2d          kernel (required), strides=[1,1], pads=[0,0,0,0]. Padding value -128.
avg_pool2d          kernel (required unless global), strides=[1,1], pads=[0,0,0,0], global=False,
                    count_include_pad=True. The DPU always divides by kh*kw (count_include_pad semantics);
                    the attr records what the model asked for (see quant.rules.check_avgpool_padding).
eltwise_add         1-4 inputs of equal shape, act none/relu.
eltwise_mul         2 inputs: equal shapes, or (N,C,H,W) times a channel gate (N,C,1,1) broadcast over H x W
                    (squeeze-and-excitation); act none/relu.
concat              axis=1.
upsample_nearest    scale [sh, sw] (required, integers).
activation          mode in leaky_relu / prelu / hard_sigmoid (ALU modes 4 / 1 / 7) or relu / relu6 (ALU mode 6,
                    a 1x1 depthwise conv with the unit weight 2**k and the fused act, quant.rules.relu_params);
                    alpha (leaky); prelu params: alpha (C,) int8 slopes.
=================== ======================================================================================
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tvm_dpu.ops import OpSpec, hook
from tvm_dpu.ops import registry as op_registry
from tvm_dpu.ops.activation import ACTIVATION_MODES
from tvm_dpu.quant import rules
from tvm_dpu.types import LayerDesc, TensorDesc
from tvm_dpu.xgraph.graph import Graph, GraphError, Op, check_jsonable

ACTS = ("none", "relu", "relu6", "leaky_relu")
CONV_TYPES = ("conv2d", "depthwise_conv2d", "conv2d_transpose", "dense")


#: Op type -> its XGraph spec, from the op registry (tvm_dpu/ops/: one module per operator family).
OP_SPECS: dict[str, OpSpec] = {kind: d.spec for kind, d in op_registry().items()}
#: Op types that may carry the in_slice attribute (a partial conv over a slice of input channels).
PARTIAL_TYPES = ("conv2d", "dense")


def spec(op: Op) -> OpSpec:
    try:
        return OP_SPECS[op.type]
    except KeyError:
        raise GraphError(f"{op.where()}: unsupported op type {op.type!r} (known: {', '.join(OP_SPECS)})") from None


def attr(op: Op, key: str) -> Any:
    """Attribute `key` of `op`, or its default; GraphError naming the op when a required one is missing."""
    s = spec(op)
    if key in op.attrs:
        return op.attrs[key]
    if key in s.defaults:
        return s.defaults[key]
    raise GraphError(f"{op.where()}: missing attribute {key!r}")


def _ints(op: Op, key: str, n: int, minimum: int) -> tuple[int, ...]:
    v = attr(op, key)
    if not isinstance(v, (list, tuple)) or len(v) != n or not all(isinstance(x, int) and not isinstance(x, bool)
                                                                  for x in v):
        raise GraphError(f"{op.where()}: attribute {key!r} must be a list of {n} integers, got {v!r}")
    if any(x < minimum for x in v):
        raise GraphError(f"{op.where()}: attribute {key!r} = {list(v)} has a value below {minimum}")
    return tuple(v)


# -- geometry ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Window:
    """Sliding-window geometry of a conv or pool op, in the input's (H, W) frame."""

    kh: int
    kw: int
    sh: int = 1
    sw: int = 1
    dh: int = 1
    dw: int = 1
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)  # top, left, bottom, right

    def out_hw(self, h: int, w: int) -> tuple[int, int]:
        pt, pl, pb, pr = self.pads
        ho = (h + pt + pb - self.dh * (self.kh - 1) - 1) // self.sh + 1
        wo = (w + pl + pr - self.dw * (self.kw - 1) - 1) // self.sw + 1
        return ho, wo


def fmap_shape(graph: Graph, name: str, op: Op) -> tuple[int, int, int, int]:
    t = graph.tensor(name, op.where())
    if len(t.shape) != 4:
        raise GraphError(f"{op.where()}: feature map {name!r} must be 4-D NCHW, got shape {t.shape}")
    return t.shape  # type: ignore[return-value]


def conv_input_slice(op: Op, graph: Graph) -> tuple[int, int] | None:
    """(c0, c) of a partial conv (attr in_slice: it reads input channels [c0, c0 + c) only), None for an op that
    reads its whole input; GraphError naming the op for a slice outside the input or on a grouped conv."""
    if op.type not in PARTIAL_TYPES or attr(op, "in_slice") is None:
        return None
    c0, c = _ints(op, "in_slice", 2, 0)
    cin = fmap_shape(graph, op.inputs[0], op)[1]
    if c < 1 or c0 + c > cin:
        raise GraphError(f"{op.where()}: in_slice [{c0}, {c}] is not a slice of the {cin} input channels")
    if op.type == "conv2d" and attr(op, "groups") != 1:
        raise GraphError(f"{op.where()}: in_slice needs groups 1, got groups {attr(op, 'groups')}")
    return c0, c


def conv_input_shape(op: Op, graph: Graph) -> tuple[int, int, int, int]:
    """The (N, C, H, W) a conv-class op reduces over: its input's, with C narrowed to the in_slice of a partial."""
    n, c, h, w = fmap_shape(graph, op.inputs[0], op)
    sl = conv_input_slice(op, graph)
    return (n, c if sl is None else sl[1], h, w)


def sliced_input(op: Op, graph: Graph, x: Any) -> Any:
    """`x` (an (N, C, H, W) array) restricted to the channels `op` reads (the in_slice of a partial conv)."""
    sl = conv_input_slice(op, graph)
    return x if sl is None else x[:, sl[0]:sl[0] + sl[1]]


def conv_window(op: Op, graph: Graph) -> Window:
    """Window of conv2d / depthwise_conv2d / dense (dense: kernel = whole input, no padding)."""
    w = graph.param(op, "weights")
    assert w is not None
    if op.type == "dense":
        _, _, h, wd = fmap_shape(graph, op.inputs[0], op)
        return Window(h, wd)
    if len(w.shape) != 4:
        raise GraphError(f"{op.where()}: weights {w.name!r} must be 4-D, got shape {w.shape}")
    return Window(w.shape[2], w.shape[3], *_ints(op, "strides", 2, 1), *_ints(op, "dilations", 2, 1),
                  pads=_ints(op, "pads", 4, 0))  # type: ignore[arg-type]


def pool_window(op: Op, graph: Graph) -> Window:
    """Window of max_pool2d / avg_pool2d (global: kernel = input H x W)."""
    if op.type == "avg_pool2d" and attr(op, "global"):
        _, _, h, w = fmap_shape(graph, op.inputs[0], op)
        return Window(h, w)
    if attr(op, "kernel") is None:
        raise GraphError(f"{op.where()}: missing attribute 'kernel'")
    kh, kw = _ints(op, "kernel", 2, 1)
    return Window(kh, kw, *_ints(op, "strides", 2, 1), pads=_ints(op, "pads", 4, 0))  # type: ignore[arg-type]


def dense_weights_shape(op: Op, graph: Graph) -> tuple[int, int, int, int]:
    """Dense weights viewed as (O, C, H, W) over the input feature map."""
    w = graph.param(op, "weights")
    assert w is not None
    _, c, h, wd = conv_input_shape(op, graph)
    if len(w.shape) == 2 and w.shape[1] == c * h * wd:
        return (w.shape[0], c, h, wd)
    if tuple(w.shape[1:]) == (c, h, wd):
        return w.shape  # type: ignore[return-value]
    raise GraphError(f"{op.where()}: dense weights {w.name!r} of shape {w.shape} do not match input (C, H, W) = "
                     f"{(c, h, wd)}")


def op_macs(op: Op, graph: Graph) -> int:
    """Multiply-accumulates of one op (conv2d, dense, depthwise_conv2d; 0 for the others)."""
    if op.type == "dense":
        o, c, h, w = dense_weights_shape(op, graph)
        return int(o * c * h * w)
    if op.type in ("conv2d", "depthwise_conv2d"):
        wshape = graph.param(op, "weights").shape
        _, oc, oh, ow = graph.tensors[op.outputs[0]].shape
        per_out = math.prod(wshape[1:])  # (ic/groups)*kh*kw; depthwise weights are (C, 1, kh, kw)
        return int(oc * oh * ow * per_out)
    return 0


def layer_desc(op: Op, graph: Graph) -> LayerDesc:
    """The cost-model view of `op` (tvm_dpu.types.LayerDesc)."""
    tdesc = lambda n: TensorDesc(n, tuple(graph.tensors[n].shape), graph.tensors[n].is_const)  # noqa: E731
    inputs = [tdesc(n) for n in op.inputs]
    if conv_input_slice(op, graph) is not None:  # a partial conv loads and reduces its slice only
        inputs[0] = TensorDesc(op.inputs[0], conv_input_shape(op, graph))
    win = None
    if op.type in ("conv2d", "depthwise_conv2d", "conv2d_transpose", "dense"):
        win = conv_window(op, graph)
    elif op.type in ("max_pool2d", "avg_pool2d"):
        win = pool_window(op, graph)
    wname = op.params.get("weights")
    return LayerDesc(
        op.name, op.type, tuple(inputs), tuple(tdesc(n) for n in op.outputs),
        window=(win.kh, win.kw, win.sh, win.sw) if win else (1, 1, 1, 1),
        pads=tuple(win.pads) if win else (0, 0, 0, 0),
        groups=int(attr(op, "groups")) if op.type in ("conv2d", "conv2d_transpose") else 1,
        weights=int(graph.tensors[wname].data.size) if wname is not None else 0,
        macs=op_macs(op, graph))


def layer_descs(graph: Graph) -> list[LayerDesc]:
    """`layer_desc` of every op of `graph`, in graph order."""
    return [layer_desc(op, graph) for op in graph.ops]


# -- shape inference ------------------------------------------------------------------------------------
def infer_shape(op: Op, graph: Graph) -> tuple[int, ...]:
    """Output shape of `op` from its inputs, attributes and parameters."""
    t = op.type
    if t in ("conv2d", "depthwise_conv2d", "conv2d_transpose", "dense"):
        return _infer_conv(op, graph)
    x = fmap_shape(graph, op.inputs[0], op)
    n, c, h, w = x
    if t in ("max_pool2d", "avg_pool2d"):
        win = pool_window(op, graph)
        ho, wo = win.out_hw(h, w)
        if ho < 1 or wo < 1:
            raise GraphError(f"{op.where()}: window {win.kh}x{win.kw} does not fit input {h}x{w} with pads "
                             f"{list(win.pads)}")
        return (n, c, ho, wo)
    if t in ("eltwise_add", "eltwise_mul"):
        for i, name in enumerate(op.inputs[1:], 1):
            s = fmap_shape(graph, name, op)
            if s == x or (t == "eltwise_mul" and i == 1 and s == (n, c, 1, 1)):
                continue
            allowed = f"{x} or the channel gate {(n, c, 1, 1)}" if t == "eltwise_mul" else f"{x} (no broadcasting)"
            raise GraphError(f"{op.where()}: input {name!r} has shape {graph.tensors[name].shape}, expected {allowed}")
        return x
    if t == "concat":
        axis = attr(op, "axis")
        if axis not in (1, 2, 3, -1, -2, -3):
            raise GraphError(f"{op.where()}: concat axis {axis!r} must be 1, 2 or 3 (C, H or W)")
        axis %= 4
        total = 0
        for name in op.inputs:
            s = fmap_shape(graph, name, op)
            if any(s[i] != x[i] for i in range(4) if i != axis):
                raise GraphError(f"{op.where()}: input {name!r} of shape {s} does not match {x} outside axis {axis}")
            total += s[axis]
        out = list(x)
        out[axis] = total
        return tuple(out)
    if t == "upsample_nearest":
        sh, sw = _ints(op, "scale", 2, 1)
        return (n, c, h * sh, w * sw)
    if t == "activation":
        mode = attr(op, "mode")
        if mode not in ACTIVATION_MODES:
            raise GraphError(f"{op.where()}: activation mode {mode!r} is not one of {ACTIVATION_MODES}")
        if mode == "prelu":
            a = graph.param(op, "alpha")
            assert a is not None
            if a.shape != (c,):
                raise GraphError(f"{op.where()}: prelu slopes {a.name!r} must have shape ({c},), got {a.shape}")
        return x
    spec(op)
    raise AssertionError(t)


def _infer_conv(op: Op, graph: Graph) -> tuple[int, ...]:
    n, c, h, w = conv_input_shape(op, graph)
    wt = graph.param(op, "weights")
    assert wt is not None
    act = attr(op, "act")
    if act not in ACTS:
        raise GraphError(f"{op.where()}: act {act!r} is not one of {ACTS}")
    if op.type == "dense":
        o = dense_weights_shape(op, graph)[0]
        out: tuple[int, ...] = (n, o, 1, 1)
    elif op.type == "conv2d_transpose":
        if len(wt.shape) != 4:
            raise GraphError(f"{op.where()}: weights {wt.name!r} must be 4-D (I, O/groups, kh, kw), got {wt.shape}")
        g = attr(op, "groups")
        if wt.shape[0] != c or c % g:
            raise GraphError(f"{op.where()}: weights {wt.name!r} of shape {wt.shape} do not match {c} input "
                             f"channels in {g} groups")
        sh, sw = _ints(op, "strides", 2, 1)
        dh, dw = _ints(op, "dilations", 2, 1)
        pt, pl, pb, pr = _ints(op, "pads", 4, 0)
        oph, opw = _ints(op, "output_padding", 2, 0)
        kh, kw = wt.shape[2], wt.shape[3]
        ho = (h - 1) * sh - pt - pb + dh * (kh - 1) + oph + 1
        wo = (w - 1) * sw - pl - pr + dw * (kw - 1) + opw + 1
        if ho < 1 or wo < 1:
            raise GraphError(f"{op.where()}: transposed conv output {ho}x{wo} is empty")
        out = (n, wt.shape[1] * g, ho, wo)
    else:
        win = conv_window(op, graph)
        o = wt.shape[0]
        if op.type == "depthwise_conv2d":
            if wt.shape[1] != 1 or o != c:
                raise GraphError(f"{op.where()}: depthwise weights {wt.name!r} must have shape ({c}, 1, kh, kw), "
                                 f"got {wt.shape}")
        else:
            g = attr(op, "groups")
            if not isinstance(g, int) or g < 1 or c % g or o % g or wt.shape[1] * g != c:
                raise GraphError(f"{op.where()}: weights {wt.name!r} of shape {wt.shape} do not match {c} input "
                                 f"channels in {g} groups")
        ho, wo = win.out_hw(h, w)
        if ho < 1 or wo < 1:
            raise GraphError(f"{op.where()}: kernel {win.kh}x{win.kw} does not fit input {h}x{w} with pads "
                             f"{list(win.pads)}")
        out = (n, o, ho, wo)
    b = graph.param(op, "bias", required=False)
    if b is not None and b.shape != (out[1],):
        raise GraphError(f"{op.where()}: bias {b.name!r} must have shape ({out[1]},), got {b.shape}")
    return out


def check_op(op: Op, graph: Graph) -> None:
    """Structural checks of one op against the graph; raises GraphError naming the op."""
    s = spec(op)
    lo, hi = s.n_inputs
    if not lo <= len(op.inputs) <= hi:
        raise GraphError(f"{op.where()}: takes {lo}..{hi} inputs, got {len(op.inputs)}")
    if len(op.outputs) != 1:
        raise GraphError(f"{op.where()}: must have exactly one output, got {len(op.outputs)}")
    for key, value in op.attrs.items():
        if not isinstance(key, str):
            raise GraphError(f"{op.where()}: attribute name {key!r} is not a string")
        check_jsonable(value, f"{op.where()} attribute {key!r}")
    for key in s.required:
        attr(op, key)
    for role in s.params:
        graph.param(op, role)
    for role in op.params:
        if role not in s.params + s.optional_params:
            raise GraphError(f"{op.where()}: unknown parameter role {role!r}")
    if op.type == "activation" and attr(op, "mode") == "prelu":
        graph.param(op, "alpha")
    declared = graph.tensor(op.outputs[0], op.where()).shape
    inferred = infer_shape(op, graph)
    if tuple(declared) != tuple(inferred):
        raise GraphError(f"{op.where()}: shape mismatch on output {op.outputs[0]!r}: declared {declared}, "
                         f"inferred {inferred}")


# -- quantization parameters ---------------------------------------------------------------------------
def fix_point(graph: Graph, name: str, op: Op) -> int:
    t = graph.tensor(name, op.where())
    if t.dtype != "int8":
        raise GraphError(f"{op.where()}: tensor {name!r} is {t.dtype}; DPU ops take int8 tensors")
    if t.fix_point is None:
        raise GraphError(f"{op.where()}: tensor {name!r} has no fix_point")
    return int(t.fix_point)


def quant_params(op: Op, graph: Graph) -> Any:
    """The `quant.rules` parameters of `op` from the fix_points of its tensors (QuantizationError if the DPU
    cannot do it). Both the golden reference and the code generator call this."""
    spec(op)
    return hook(op.type, "quant")(op, graph)


def is_depthwise(op: Op, graph: Graph) -> bool:
    """Runs on the ALU as a depthwise conv: depthwise_conv2d, or conv2d_transpose with groups == C_in == C_out."""
    if op.type == "depthwise_conv2d":
        return True
    if op.type != "conv2d_transpose":
        return False
    g = attr(op, "groups")
    return g > 1 and g == fmap_shape(graph, op.inputs[0], op)[1] == fmap_shape(graph, op.outputs[0], op)[1]


def quant_conv(op: Op, graph: Graph) -> rules.ConvQuant:
    """Quantization rule of conv2d / depthwise / transposed conv / dense (shifts from the tensors' fix_points)."""
    w = graph.param(op, "weights")
    b = graph.param(op, "bias", required=False)
    assert w is not None
    fp_w = fix_point(graph, w.name, op)
    fp_b = fix_point(graph, b.name, op) if b is not None else None
    engine = "alu" if is_depthwise(op, graph) else "conv"
    return rules.conv_params(op.name, fix_point(graph, op.inputs[0], op), fp_w, fix_point(graph, op.outputs[0], op),
                             fp_b, attr(op, "act"), attr(op, "alpha"), engine)


def quant_eltwise(op: Op, graph: Graph) -> rules.EltwiseQuant:
    """Quantization rule of eltwise_add / eltwise_mul: per-input read shifts and the write shift."""
    kind = "add" if op.type == "eltwise_add" else "mul"
    return rules.eltwise_params(op.name, kind, [fix_point(graph, i, op) for i in op.inputs],
                                fix_point(graph, op.outputs[0], op), attr(op, "act"))


def quant_maxpool(op: Op, graph: Graph) -> rules.MaxPoolQuant:
    """Quantization rule of max_pool2d: the requantizing shift (0 when the fix_point is shared)."""
    return rules.maxpool_params(op.name, fix_point(graph, op.inputs[0], op), fix_point(graph, op.outputs[0], op))


def quant_avgpool(op: Op, graph: Graph) -> rules.AvgPoolQuant:
    """Quantization rule of avg_pool2d: the DPU's kh*kw divisor as a multiply and shift."""
    win = pool_window(op, graph)
    return rules.avgpool_params(op.name, win.kh, win.kw, fix_point(graph, op.inputs[0], op),
                                fix_point(graph, op.outputs[0], op))


def quant_concat(op: Op, graph: Graph) -> rules.ConcatQuant:
    """Quantization rule of concat: which inputs need requantizing into the output fix_point."""
    return rules.concat_params(op.name, [fix_point(graph, i, op) for i in op.inputs],
                               fix_point(graph, op.outputs[0], op))


def quant_upsample(op: Op, graph: Graph) -> None:
    """Quantization rule of upsample_nearest: input and output must share the fix_point (returns None)."""
    rules.same_fix_point(op.name, fix_point(graph, op.inputs[0], op), fix_point(graph, op.outputs[0], op),
                         "nearest upsampling")


def quant_activation(op: Op, graph: Graph) -> rules.PreluQuant | rules.HSigmoidQuant | rules.ReluQuant:
    """Quantization rule of A standalone activation, by mode."""
    fp_in = fix_point(graph, op.inputs[0], op)
    fp_out = fix_point(graph, op.outputs[0], op)
    mode = attr(op, "mode")
    if mode == "leaky_relu":
        return rules.leaky_params(op.name, fp_in, fp_out, attr(op, "alpha"))
    if mode == "prelu":
        a = graph.param(op, "alpha")
        assert a is not None
        return rules.prelu_params(op.name, fp_in, fix_point(graph, a.name, op), fp_out, a.data)
    if mode == "hard_sigmoid":
        return rules.hsigmoid_params(op.name, fp_in, fp_out)
    if mode in ("relu", "relu6"):
        return rules.relu_params(op.name, fp_in, fp_out, mode)
    raise GraphError(f"{op.where()}: activation mode {mode!r} is not one of {ACTIVATION_MODES}")
