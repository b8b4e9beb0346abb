"""The DPU pattern table: coarse DPU ops = one intrinsic op plus the point-wise ops fused into it (DNNVM).

Patterns match the NORMALIZED Relax form produced by `tvm_dpu.frontend` (see frontend/normalize.py):

====================  ==========================================================================================
pattern family        matched Relax (``[..]`` optional, each optional part is a separate, lower-priority variant)
====================  ==========================================================================================
dense                 reshape -> conv2d(x, const W) [-> add(const bias)] -> reshape, with an optional act
                      before or after the last reshape (Gemm as 1x1 conv; reshapes must be free, see below)
conv2d                conv2d(x, const W OIHW) [-> add(const bias [1,O,1,1])] [-> act], or
                      conv2d [-> add(bias)] -> reshape -> act (a Gemm the frontend turned into an HxW conv)
                      (groups 1 -> "conv2d", groups == C == O -> "depthwise_conv2d", else rejected by the limits)
conv2d_transpose      conv2d_transpose(x, const W IOHW) [-> add(const bias)] [-> act]
add                   add(x, y) of two activations of the same shape [-> relu]
max_pool2d            max_pool2d [-> relu]
avg_pool2d            avg_pool2d [-> relu]   (kernel == input H x W with a 1x1 output -> "global_avg_pool")
global_avg_pool       mean(x, axis=[2, 3], keepdims=True)  (un-normalized modules)
concat                concat((x1, ..., xn), axis=1)
upsample              image.resize2d nearest with an integer scale factor
activation            relu | clip(0, 6) | leakyrelu on its own, on an NCHW or [N,K] tensor (ALU engine; the
                      arch's ALU activation list, leaky only with dw_leaky: checked here, OpDesc has no kind for
                      it); low priority, so an activation is matched alone only when it could not be fused into
                      the op before it (then the lone-op rule of the partitioner usually sends it to the CPU)
reshape               a free reshape ([N,K] <-> [N,K,1,1]: no data movement in the DPU's channel-last layout);
                      the codegen treats it as an alias
====================  ==========================================================================================

act = relu | clip(x, 0, 6) (ReLU6) | nn.leakyrelu(alpha).

Priority: bigger patterns first (dense before conv, each family from its largest variant to the bare op).
`dpu_patterns(arch)` returns the table high -> low priority (the order `FuseOpsByPattern` expects) with every
check bound to `arch`; the same table is registered globally under the prefix "dpu" (with the registry's
low -> high order) with checks that use the arch of the running `partition` call, or DPUCZDX8G_ISA1_B4096 when
called outside one.

Every check converts the match into an `OpDesc` and asks `tvm_dpu.arch.check_op(arch, desc)`; the arch's limits
decide. The checks here add only what is not an arch limit: float32 only, NCHW / OIHW (IOHW for transposed conv)
layouts, static shapes, one batch size per match (the DPU runs one image per core: a DPU subgraph is compiled
for one image and a batch of N runs as N calls of it, runtime/subgraph_runner.execute_float), per-channel bias,
ReLU6 given as clip(0, 6) exactly, free reshapes only, no broadcasting in eltwise add, concat along channels only,
nearest resize that is a pure pixel replication.

Rejections are recorded in the active `CheckSession` against every binding of the match, keeping for each
binding the reason of the LARGEST structurally matched variant (the most specific one): a conv+bias+leaky whose
leaky slope the DPU cannot do reports the slope, even though conv+bias alone is accepted afterwards.
"""
from __future__ import annotations

import contextvars
import dataclasses
import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Iterator

import tvm
from tvm import relax
from tvm.relax.dpl import DFPattern, is_const, is_op, wildcard

from ..arch import check_op, load_arch
from ..arch.limits import placement_note
from ..arch.opdesc import OpDesc
from ..frontend.activation import HARD_SIGMOID_FORMS, close
from ..frontend.const_fold import const_array
from ..frontend.const_fold import static_shape as _frontend_static_shape
from .tags import tag_of

DEFAULT_ARCH = "DPUCZDX8G_ISA1_B4096"

# Composite-name prefixes of the conv-class coarse ops (conv2d incl. depthwise, transposed conv, dense): the
# ops that do the heavy lifting, which the lone-op rule of the partitioner looks for.
CONV_CLASS_FAMILIES = ("dpu.dense", "dpu.conv2d", "dpu.conv2d_transpose")


# ---------------------------------------------------------------------------------------------------------
# Check session: where rejections go
# ---------------------------------------------------------------------------------------------------------
@dataclass
class CheckSession:
    """State shared by the pattern checks during one `partition` run.

    `rejections`: tag -> (size of the largest rejected variant, reason). `excluded`: tags the partitioner has
    put back on the CPU (lone-op rule); any match touching them is refused. `names`: tag -> model node names,
    used in OpDesc.name for messages.
    """

    arch: object | None = None
    rejections: dict[int, tuple[int, str]] = field(default_factory=dict)
    excluded: dict[int, str] = field(default_factory=dict)
    names: dict[int, list[str]] = field(default_factory=dict)
    notes: dict[int, str] = field(default_factory=dict)  # tag -> how an accepted op is mapped (limits.placement_note)

    def record(self, tags: list[int | None], size: int, reason: str) -> None:
        for t in tags:
            if t is None:
                continue
            old = self.rejections.get(t)
            if old is None or size > old[0]:
                self.rejections[t] = (size, reason)


_SESSION: contextvars.ContextVar[CheckSession | None] = contextvars.ContextVar("tvm_dpu_check_session", default=None)


@contextmanager
def check_session(session: CheckSession) -> Iterator[CheckSession]:
    """Make `session` the target of every DPU pattern check run inside the `with` block."""
    token = _SESSION.set(session)
    try:
        yield session
    finally:
        _SESSION.reset(token)


_default_arch_cache: list = []


def _resolve_arch(arch):
    if arch is not None:
        return arch
    session = _SESSION.get()
    if session is not None and session.arch is not None:
        return session.arch
    if not _default_arch_cache:
        _default_arch_cache.append(load_arch(DEFAULT_ARCH))
    return _default_arch_cache[0]


# ---------------------------------------------------------------------------------------------------------
# Small expression helpers
# ---------------------------------------------------------------------------------------------------------
class _Reject(Exception):
    """A match the DPU cannot run; carries the reason text."""


def static_shape(expr: relax.Expr) -> tuple[int, ...]:
    """Static shape of a tensor expression; `_Reject` if it is unknown or symbolic."""
    shape = _frontend_static_shape(expr)
    if shape is None:
        dims = getattr(getattr(getattr(expr, "ty", None), "shape", None), "values", None)
        what = f"symbolic shape [{', '.join(_dim_str(d) for d in dims)}]" if dims is not None else "unknown shape"
        raise _Reject(f"{what}: the DPU needs static shapes")
    return tuple(shape)


def _dim_str(d) -> str:
    try:
        return str(int(d))
    except (TypeError, ValueError):
        return str(d)


def _shape_str(shape) -> str:
    return "x".join(str(d) for d in shape)


def _ints(arr) -> tuple[int, ...]:
    return tuple(int(v) for v in arr)


def _is_const(expr) -> bool:
    return isinstance(expr, tvm.ir.Constant)


def _float(v) -> float:
    return float(getattr(v, "value", v))


def _op_name(call) -> str:
    return call.op.name if isinstance(call.op, tvm.ir.Op) else str(call.op)


def _short(op_name: str) -> str:
    return op_name.split(".")[-1]


def _check_float32_batch(calls: list) -> None:
    """float32 only; every op of a match (and its data inputs) on the same batch size, which the subgraph then runs
    image by image."""
    for c in calls:
        dtype = str(getattr(c.ty, "dtype", ""))
        if dtype and dtype != "float32":
            raise _Reject(f"{_short(_op_name(c))} has dtype {dtype}: only float32 models are partitioned")
    batches = set()
    for c in calls:
        for e in [c] + [a for a in c.args if not _is_const(a) and hasattr(getattr(a, "ty", None), "shape")]:
            shape = static_shape(e)
            if len(shape) >= 1:
                batches.add(int(shape[0]))
    if len(batches) > 1:
        raise _Reject(f"batch sizes {sorted(batches)} mixed in one op: a DPU subgraph runs image by image")


def _activation(act) -> tuple[str | None, float | None]:
    """(OpDesc activation name, alpha) of a matched activation call (or None)."""
    if act is None:
        return None, None
    name = _op_name(act)
    if name == "relax.nn.relu":
        return "relu", None
    if name == "relax.nn.leakyrelu":
        return "leaky_relu", float(act.attrs.alpha)
    if name == "relax.sigmoid":
        return "sigmoid", None  # matched only so that the limits say why it stays on the CPU
    if name == "relax.clip":
        lo, hi = _float(act.args[1]), _float(act.args[2])
        if lo == 0.0 and hi == 6.0:
            return "relu6", None
        raise _Reject(f"clip({lo:g}, {hi:g}) is not ReLU6 (clip(0, 6)), the only clip the DPU implements")
    raise _Reject(f"{_short(name)} is not a DPU activation")


def _names_of(ctx_calls: list, session: CheckSession | None) -> str:
    if session is None:
        return ""
    names: list[str] = []
    for c in ctx_calls:
        for n in session.names.get(tag_of(c), []):
            if n not in names:
                names.append(n)
    return ",".join(names)


def _has_leaking_intermediate(ctx) -> bool:
    """True if a non-root binding of the match is used outside it (then it cannot be fused away)."""
    defined = list(ctx.matched_bindings.keys())
    root_var = ctx.value_to_bound_var.get(ctx.matched_expr) if ctx.value_to_bound_var is not None else None
    for v in defined:
        if root_var is not None and v.same_as(root_var):
            continue
        if not isinstance(v, relax.DataflowVar):
            return True
        for user in ctx.var_usages.get(v, []):
            if not any(user.same_as(d) for d in defined):
                return True
    return False


# ---------------------------------------------------------------------------------------------------------
# Match -> OpDesc
# ---------------------------------------------------------------------------------------------------------
def _describe_conv(ctx) -> OpDesc:
    ann = ctx.annotated_expr
    conv = ann["conv"]
    attrs = conv.attrs
    transposed = _op_name(conv) == "relax.nn.conv2d_transpose"
    data = conv.args[0]
    in_shape = static_shape(data)
    out_shape = static_shape(conv)
    w_shape = static_shape(ann["weight"])
    want_kernel = "IOHW" if transposed else "OIHW"
    if len(in_shape) != 4:
        raise _Reject(f"{_short(_op_name(conv))} input is {len(in_shape)}-D, not NCHW")
    if str(attrs.data_layout) != "NCHW" or str(attrs.kernel_layout) != want_kernel or str(attrs.out_layout) not in ("NCHW", ""):
        raise _Reject(
            f"layout {attrs.data_layout}/{attrs.kernel_layout}->{attrs.out_layout}: the partitioner takes "
            f"NCHW/{want_kernel} only"
        )
    groups = int(attrs.groups)
    c_in, c_out = in_shape[1], out_shape[1]
    depthwise = groups > 1 and groups == c_in == c_out
    for key in ("reshape_in", "reshape_out"):
        if key in ann:
            _check_free_reshape(static_shape(ann[key].args[0]), static_shape(ann[key]))
    if "reshape_in" in ann:
        kind = "dense"
    elif transposed:
        kind = "depthwise_conv2d_transpose" if depthwise else "conv2d_transpose"
    else:
        kind = "depthwise_conv2d" if depthwise else "conv2d"
    if "bias" in ann:
        b_shape = static_shape(ann["bias"])
        if math.prod(b_shape) != c_out or b_shape not in ((1, c_out, 1, 1), (c_out, 1, 1)):
            raise _Reject(f"bias shape {list(b_shape)} is not per output channel [1,{c_out},1,1]")
    act, alpha = _activation(ann.get("act"))
    return OpDesc(
        kind=kind,
        in_shape=in_shape,
        out_shape=out_shape,
        kernel=(w_shape[2], w_shape[3]),
        stride=_ints(attrs.strides),
        dilation=_ints(attrs.dilation),
        pad=_ints(attrs.padding),
        groups=groups,
        activation=act,
        alpha=alpha,
    )


def _check_free_reshape(src: tuple[int, ...], dst: tuple[int, ...]) -> None:
    """Only [N,K] <-> [N,K,1,1] is free: any other reshape reorders the DPU's channel-last feature map."""

    def squeeze(s):
        return tuple(s[:2]) if len(s) == 4 and s[2] == 1 and s[3] == 1 else tuple(s)

    if not (len(src) in (2, 4) and len(dst) in (2, 4) and squeeze(src) == squeeze(dst)):
        raise _Reject(
            f"reshape {_shape_str(src)} -> {_shape_str(dst)} reorders the DPU feature map "
            f"(only [N,K] <-> [N,K,1,1] is free)"
        )


def _describe_pool(ctx) -> OpDesc:
    ann = ctx.annotated_expr
    pool = ann["pool"]
    attrs = pool.attrs
    in_shape = static_shape(pool.args[0])
    out_shape = static_shape(pool)
    if str(attrs.layout) != "NCHW" or len(in_shape) != 4:
        raise _Reject(f"pool layout {attrs.layout}: the partitioner takes NCHW only")
    if any(d != 1 for d in _ints(attrs.dilation)):
        raise _Reject(f"pool dilation {list(_ints(attrs.dilation))}: the DPU pools have no dilation")
    kernel = _ints(attrs.pool_size)
    pad = _ints(attrs.padding)
    is_max = _op_name(pool) == "relax.nn.max_pool2d"
    kind = "max_pool2d" if is_max else "avg_pool2d"
    if not is_max and kernel == in_shape[2:] and out_shape[2:] == (1, 1) and not any(pad):
        kind = "global_avg_pool"
    act, alpha = _activation(ann.get("act"))
    return OpDesc(
        kind=kind,
        in_shape=in_shape,
        out_shape=out_shape,
        kernel=kernel,
        stride=_ints(attrs.strides),
        pad=pad,
        activation=act,
        alpha=alpha,
        ceil_mode=bool(attrs.ceil_mode),
        count_include_pad=bool(attrs.count_include_pad),
    )


def _describe_mean(ctx) -> OpDesc:
    mean = ctx.annotated_expr["root"]
    in_shape = static_shape(mean.args[0])
    axes = sorted(int(a) % 4 for a in (mean.attrs.axis or [])) if len(in_shape) == 4 else []
    if axes != [2, 3] or not bool(mean.attrs.keepdims):
        raise _Reject("mean is not a global average pool (axis [2,3], keepdims) of an NCHW tensor")
    return OpDesc(
        kind="global_avg_pool",
        in_shape=in_shape,
        out_shape=static_shape(mean),
        kernel=(in_shape[2], in_shape[3]),
        stride=(in_shape[2], in_shape[3]),
    )


def _describe_add(ctx) -> OpDesc:
    ann = ctx.annotated_expr
    add = ann["add"]
    a, b = add.args
    if _is_const(a) or _is_const(b):
        raise _Reject("add of a constant: only a bias add fused into a conv runs on the DPU")
    sa, sb, so = static_shape(a), static_shape(b), static_shape(add)
    if sa != sb:
        raise _Reject(f"add with broadcasting ({_shape_str(sa)} + {_shape_str(sb)}) is not a DPU eltwise op")
    if len(sa) != 4:
        raise _Reject(f"add of {len(sa)}-D tensors: the DPU eltwise engine takes NCHW feature maps")
    act, alpha = _activation(ann.get("act"))
    return OpDesc(kind="eltwise_add", in_shape=sa, out_shape=so, num_inputs=2, activation=act, alpha=alpha)


def _describe_mul(ctx) -> OpDesc:
    """multiply of two feature maps: equal shapes (also [N, K]), or a map times an N x C x 1 x 1 channel gate (either
    order)."""
    mul = ctx.annotated_expr["root"]
    a, b = mul.args
    if _is_const(a) or _is_const(b):
        raise _Reject("multiply by a constant: only a scale folded into a conv or pool runs on the DPU")
    sa, sb, so = static_shape(a), static_shape(b), static_shape(mul)
    if len(so) == 2 and sa == sb == so:  # [N, K] is the free view of [N, K, 1, 1] (a hard swish after a Gemm)
        sa = sb = so = tuple(so) + (1, 1)
    if len(so) != 4:
        raise _Reject(f"multiply of {len(so)}-D tensors: the DPU eltwise engine takes NCHW feature maps")
    other = sb if sa == so else sa
    return OpDesc(kind="eltwise_mul", in_shape=so, out_shape=so, num_inputs=2,
                  in_shape2=None if other == so else other)


# The constants a dpu.hard_sigmoid* match annotates, in the order of frontend.activation.HARD_SIGMOID_FORMS.
_HSIG_KEYS = {"dpu.hard_sigmoid": ("mul_add_clip", ("alpha", "beta", "lo", "hi")),
              "dpu.hard_sigmoid_div": ("add_clip_div", ("three", "lo", "hi", "six"))}


def _const_scalar(expr) -> float | None:
    """A scalar tensor constant or prim value as a float, else None."""
    v = const_array(expr)
    if v is not None:
        return float(v.reshape(-1)[0]) if v.size == 1 else None
    try:
        return _float(expr)
    except (TypeError, ValueError):
        return None


def _describe_hard_sigmoid(ctx) -> OpDesc:
    """relu6(x + 3) / 6 in one of the HARD_SIGMOID_FORMS (constants checked to float32 precision): ALU mode 7."""
    ann = ctx.annotated_expr
    root = ann["root"]
    form, keys = _HSIG_KEYS["dpu.hard_sigmoid" if "alpha" in ann else "dpu.hard_sigmoid_div"]
    wants = [w for _, consts in HARD_SIGMOID_FORMS[form] for w in consts]
    for key, want in zip(keys, wants):
        got = _const_scalar(ann[key])
        if not close(got, want):
            raise _Reject(f"not a hard sigmoid relu6(x + 3) / 6: {key} = {got} instead of {want:g}")
    shape = static_shape(root)
    if len(shape) not in (2, 4):
        raise _Reject(f"hard sigmoid on a {len(shape)}-D tensor: the ALU engine takes NCHW feature maps")
    shape4 = tuple(shape) + (1, 1) if len(shape) == 2 else tuple(shape)
    return OpDesc(kind="activation", in_shape=shape4, out_shape=shape4, activation="hard_sigmoid")


def _hard_sigmoid_specs() -> list[_Spec]:
    alpha, beta = is_const(), is_const()
    x = wildcard()
    mul = is_op("relax.multiply")(x, alpha) | is_op("relax.multiply")(alpha, x)
    lo, hi = wildcard(), wildcard()
    a = is_op("relax.clip")(is_op("relax.add")(mul, beta), lo, hi)
    three, six, lo2, hi2 = is_const(), is_const(), wildcard(), wildcard()
    b = is_op("relax.divide")(is_op("relax.clip")(is_op("relax.add")(wildcard(), three), lo2, hi2), six)
    return [
        _Spec("dpu.hard_sigmoid", a, {"alpha": alpha, "beta": beta, "lo": lo, "hi": hi, "root": a},
              _describe_hard_sigmoid),
        _Spec("dpu.hard_sigmoid_div", b, {"three": three, "six": six, "lo": lo2, "hi": hi2, "root": b},
              _describe_hard_sigmoid),
    ]


def _describe_concat(ctx) -> OpDesc:
    cat = ctx.annotated_expr["root"]
    tup = cat.args[0]
    if not isinstance(tup, relax.Tuple):
        raise _Reject("concat of a tuple variable (not a literal tuple of tensors)")
    shapes = [static_shape(f) for f in tup.fields]
    out_shape = static_shape(cat)
    axis = cat.attrs.axis
    axis = int(axis) % len(out_shape) if axis is not None else None
    if len(out_shape) != 4 or axis != 1:
        raise _Reject(f"concat along axis {axis} of {len(out_shape)}-D tensors: the DPU concatenates channels of NCHW maps")
    return OpDesc(kind="concat", in_shape=shapes[0], out_shape=out_shape, num_inputs=len(shapes))


def _describe_upsample(ctx) -> OpDesc:
    rs = ctx.annotated_expr["root"]
    attrs = rs.attrs
    in_shape = static_shape(rs.args[0])
    out_shape = static_shape(rs)
    if str(attrs.layout) != "NCHW" or len(in_shape) != 4:
        raise _Reject(f"resize layout {attrs.layout}: the partitioner takes NCHW only")
    if str(attrs.method) != "nearest_neighbor":
        raise _Reject(f"resize method {attrs.method}: the DPU upsamples with nearest neighbour only")
    (h, w), (oh, ow) = in_shape[2:], out_shape[2:]
    if oh % h or ow % w:
        raise _Reject(f"resize {h}x{w} -> {oh}x{ow} is not an integer upsampling")
    mode, rounding = str(attrs.coordinate_transformation_mode), str(attrs.rounding_method)
    # With an integer scale, half-pixel coordinates land strictly inside (i-0.5, i+0.5): every rounding gives
    # pure replication. Asymmetric coordinates replicate only with floor rounding.
    replicates = mode in ("half_pixel", "pytorch_half_pixel") or (mode == "asymmetric" and rounding == "floor")
    if not replicates:
        raise _Reject(
            f"nearest resize with coordinate mode {mode} and rounding {rounding or 'default'} is not a pure "
            f"pixel replication"
        )
    return OpDesc(kind="upsample_nearest", in_shape=in_shape, out_shape=out_shape, scale=(oh // h, ow // w))


def _describe_activation(ctx) -> OpDesc:
    """A lone activation (the ALU's on ISA1); an [N, K] tensor is the free view of [N, K, 1, 1]."""
    act_call = ctx.annotated_expr["root"]
    shape = static_shape(act_call)
    if len(shape) not in (2, 4):
        raise _Reject(f"{_short(_op_name(act_call))} on a {len(shape)}-D tensor: the ALU engine takes NCHW feature "
                      "maps")
    shape4 = tuple(shape) + (1, 1) if len(shape) == 2 else tuple(shape)
    act, alpha = _activation(act_call)
    return OpDesc(kind="activation", in_shape=shape4, out_shape=shape4, activation=act, alpha=alpha)


def _target(arch) -> str:
    return str(getattr(arch, "target_label", None) or arch.dpu_name)


# ---------------------------------------------------------------------------------------------------------
# The check wrapper
# ---------------------------------------------------------------------------------------------------------
Describer = Callable[..., OpDesc]

# Matches checked here rather than by the arch limits (OpDesc has no kind for them).
_FREE_RESHAPE = "free_reshape"


def _matched_calls(ctx) -> list:
    """The op calls of a match in dataflow order (tags are binding indices; the Map's own order is not stable)."""
    calls = [v for v in ctx.matched_bindings.values() if isinstance(v, relax.Call)]
    return sorted(calls, key=lambda c: (tag_of(c) is None, tag_of(c) or 0))


def _run_check(arch, describe: Describer | str, ctx) -> bool:
    """The check of every DPU pattern: refuse (and record why) or accept the match."""
    session = _SESSION.get()
    calls = _matched_calls(ctx)
    tags = [tag_of(c) for c in calls]
    if session is not None and any(t in session.excluded for t in tags if t is not None):
        return False
    if _has_leaking_intermediate(ctx):
        return False  # structural: a smaller variant will match instead; not a DPU limit
    arch = _resolve_arch(arch)
    try:
        _check_float32_batch(calls)
        if describe is _FREE_RESHAPE:
            root = ctx.annotated_expr["root"]
            _check_free_reshape(static_shape(root.args[0]), static_shape(root))
            reasons = []
        else:
            desc = describe(ctx)
            name = _names_of(calls, session)
            if name:
                desc = dataclasses.replace(desc, name=name)
            reasons = list(check_op(arch, desc))
            note = placement_note(arch, desc) if not reasons and session is not None else None
            if note:
                session.notes.update({t: note for t in tags[:1] if t is not None})  # the conv call of the match
    except _Reject as err:
        reasons = [str(err)]
    if reasons and session is not None:
        session.record(tags, len(calls), "; ".join(reasons))
    return not reasons


# ---------------------------------------------------------------------------------------------------------
# Pattern table
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Spec:
    name: str
    pattern: DFPattern
    annotations: dict
    describe: Describer | str


def _act_pattern(inner: DFPattern) -> DFPattern:
    return (
        is_op("relax.nn.relu")(inner)
        | is_op("relax.clip")(inner, wildcard(), wildcard())
        | is_op("relax.nn.leakyrelu")(inner)
    )


# Conv-class variants, high -> low priority: stages after the conv. "reshape_out" is a free reshape
# ([N,K,1,1] -> [N,K], the dense form); an activation may sit before or after it.
_CONV_VARIANTS: dict[str, list[tuple[str, ...]]] = {
    "dense": [
        ("bias", "reshape_out", "act"),
        ("bias", "act", "reshape_out"),
        ("reshape_out", "act"),
        ("act", "reshape_out"),
        ("bias", "reshape_out"),
        ("reshape_out",),
    ],
    "conv2d": [
        ("bias", "reshape_out", "act"),
        ("reshape_out", "act"),
        ("bias", "act"),
        ("bias",),
        ("act",),
        (),
    ],
    "conv2d_transpose": [("bias", "act"), ("bias",), ("act",), ()],
}


def _conv_specs(op_name: str, family: str) -> list[_Spec]:
    specs = []
    dense = family == "dense"
    for stages in _CONV_VARIANTS[family]:
        w = is_const()
        ann: dict = {"weight": w}
        data = wildcard()
        if dense:
            data = is_op("relax.reshape")(data, wildcard())
            ann["reshape_in"] = data
        y = is_op(op_name)(data, w)
        ann["conv"] = y
        for stage in stages:
            if stage == "bias":
                b = is_const()
                y = is_op("relax.add")(y, b)
                ann["bias"] = b
            elif stage == "act":
                y = _act_pattern(y)
                ann["act"] = y
            else:
                y = is_op("relax.reshape")(y, wildcard())
                ann["reshape_out"] = y
        ann["root"] = y
        suffix = "".join("_" + s.replace("reshape_out", "reshape") for s in stages)
        specs.append(_Spec(f"dpu.{family}{suffix}", y, ann, _describe_conv))
    return specs


def _pool_specs(op_name: str, family: str) -> list[_Spec]:
    out = []
    for with_act in (True, False):
        pool = is_op(op_name)(wildcard())
        ann = {"pool": pool}
        root = pool
        if with_act:
            root = is_op("relax.nn.relu")(pool)
            ann["act"] = root
        ann["root"] = root
        out.append(_Spec(f"dpu.{family}{'_relu' if with_act else ''}", root, ann, _describe_pool))
    return out


def _specs() -> list[_Spec]:
    """Every DPU pattern, high -> low priority."""
    specs: list[_Spec] = []
    specs += _conv_specs("relax.nn.conv2d", "dense")
    specs += _conv_specs("relax.nn.conv2d", "conv2d")
    specs += _conv_specs("relax.nn.conv2d_transpose", "conv2d_transpose")
    add = is_op("relax.add")(wildcard(), wildcard())
    add_relu = is_op("relax.nn.relu")(add)
    specs.append(_Spec("dpu.add_relu", add_relu, {"add": add, "act": add_relu, "root": add_relu}, _describe_add))
    add2 = is_op("relax.add")(wildcard(), wildcard())
    specs.append(_Spec("dpu.add", add2, {"add": add2, "root": add2}, _describe_add))
    specs += _hard_sigmoid_specs()
    mul = is_op("relax.multiply")(wildcard(), wildcard())
    specs.append(_Spec("dpu.mul", mul, {"root": mul}, _describe_mul))
    specs += _pool_specs("relax.nn.max_pool2d", "max_pool2d")
    specs += _pool_specs("relax.nn.avg_pool2d", "avg_pool2d")
    mean = is_op("relax.mean")(wildcard())
    specs.append(_Spec("dpu.global_avg_pool", mean, {"root": mean}, _describe_mean))
    cat = is_op("relax.concat")(wildcard())
    specs.append(_Spec("dpu.concat", cat, {"root": cat}, _describe_concat))
    up = is_op("relax.image.resize2d")(wildcard(), wildcard())
    specs.append(_Spec("dpu.upsample", up, {"root": up}, _describe_upsample))
    sig = is_op("relax.sigmoid")(wildcard())  # never accepted: checked so the report quotes the limit
    specs.append(_Spec("dpu.sigmoid", sig, {"root": sig}, _describe_activation))
    act = _act_pattern(wildcard())
    specs.append(_Spec("dpu.activation", act, {"root": act}, _describe_activation))
    rs = is_op("relax.reshape")(wildcard(), wildcard())
    specs.append(_Spec("dpu.reshape", rs, {"root": rs}, _FREE_RESHAPE))
    return specs


def dpu_patterns(arch=None) -> list[tuple]:
    """The DPU pattern table, high -> low priority, as `FuseOpsByPattern` takes it.

    Each entry is ``(name, pattern, annotations, check)``. With `arch` (an `Arch` or anything
    `tvm_dpu.arch.load_arch` accepts) every check uses that arch; with None, the arch of the running
    `partition` call (or DPUCZDX8G_ISA1_B4096 outside one).
    """
    if arch is not None:
        arch = load_arch(arch)
    return [(s.name, s.pattern, s.annotations, partial(_run_check, arch, s.describe)) for s in _specs()]


def pattern_names() -> list[str]:
    """Names of the DPU patterns, high -> low priority."""
    return [s.name for s in _specs()]


_REGISTERED: list[bool] = []


def register_dpu_patterns() -> None:
    """Register the table with TVM's pattern registry under the prefix "dpu" (idempotent).

    The registry gives LATER entries HIGHER priority, so the high -> low table is registered reversed;
    `get_patterns_with_prefix("dpu")` then returns it high -> low again.
    """
    if _REGISTERED:
        return
    from tvm.relax.backend.pattern_registry import register_patterns

    register_patterns(list(reversed(dpu_patterns(None))))
    _REGISTERED.append(True)


register_dpu_patterns()
