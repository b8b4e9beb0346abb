"""Which operators the selected DPU can run: `check_op(arch, op)` returns the reasons it cannot.

The numbers live in limits.json, one profile per family + ISA ("DPUCZDX8G_ISA1", "DPUCZDX8G_ISA0"); this module
holds the rule logic and the messages. Every message names the rule, the value, the allowed range and the target
("on DPUCZDX8G_ISA1_B4096 (zcu102)"), so the partition report can quote it as is.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from tvm_dpu.arch.arch import LEAKY_NUM, LEAKY_SHIFT, Arch, require_support
from tvm_dpu.arch.opdesc import OP_KINDS, OpDesc
from tvm_dpu.errors import ArchError

LIMITS_FILE = Path(__file__).with_name("limits.json")

_SIDES = (("top", "h"), ("left", "w"), ("bottom", "h"), ("right", "w"))  # OpDesc.pad order
_PAD_MAX = {  # limits.json pad.max expression -> (value(k, d), text for the message)
    "(k-1)*d": (lambda k, d: (k - 1) * d, "(kernel_{a}-1)*dilation_{a}"),
    "k-1": (lambda k, d: k - 1, "kernel_{a}-1"),
}


@lru_cache(maxsize=1)
def _profiles() -> dict[str, dict[str, Any]]:
    return json.loads(LIMITS_FILE.read_text())["profiles"]


def profile_name(arch: Arch) -> str:
    """The limits profile of an Arch, derived from family + ISA: "DPUCZDX8G_ISA1"."""
    return f"{arch.family}_ISA{arch.isa}"


def profile_rules(arch: Arch) -> dict[str, Any]:
    """The op-kind -> rules table of the arch's profile; ArchError if limits.json has none."""
    name = profile_name(arch)
    try:
        return _profiles()[name]
    except KeyError:
        require_support(arch, "compile")  # a family tvm-dpu cannot compile for yet: say so, and what is missing
        raise ArchError(
            f"no operator limits for {name} ({arch.target_label}) in {LIMITS_FILE.name}; "
            f"known profiles: {', '.join(_profiles())}"
        ) from None


def _range(label: str, value: Any, text: str, lo: float, hi: float, target: str) -> list[str]:
    """One message if any of `value` (a number or a tuple) leaves [lo, hi]."""
    values = value if isinstance(value, tuple) else (value,)
    if max(values) > hi:
        return [f"{label} {text} exceeds [{lo},{hi}] on {target}"]
    if min(values) < lo:
        return [f"{label} {text} is below [{lo},{hi}] on {target}"]
    return []


def _pair(label: str, hw: tuple[int, int], bounds: list[int], target: str) -> list[str]:
    return _range(label, tuple(hw), f"{hw[0]}x{hw[1]}", bounds[0], bounds[1], target)


def _shape(s: tuple[int, ...]) -> str:
    return "x".join(str(int(d)) for d in s)


def _fmt(x: float) -> str:
    return f"{x:g}"


def _grouped(op: OpDesc, rules_by_kind: dict[str, Any]) -> int:
    """G when `op` is a grouped conv2d (1 < groups, not depthwise) that the profile runs as G group convs
    (conv2d rule "grouped": "per_group"), else 0."""
    g, ic, oc = op.groups, op.in_channels, op.out_channels
    if op.kind != "conv2d" or g <= 1 or g == ic == oc:
        return 0
    return g if rules_by_kind.get("conv2d", {}).get("grouped") == "per_group" else 0


def _resolve_kind(op: OpDesc, target: str, per_group: bool = False) -> tuple[OpDesc, list[str]]:
    """Map grouped convs to their depthwise kind (or, `per_group`, to one group's conv2d) and global pooling to an
    avg pool; report bad groupings."""
    ic, oc, g = op.in_channels, op.out_channels, op.groups
    depthwise = g == ic == oc and g > 1
    if op.kind in ("conv2d", "conv2d_transpose"):
        if g == 1:
            return op, []
        if depthwise:
            return replace(op, kind=f"depthwise_{op.kind}"), []
        if per_group:
            if ic % g or oc % g:
                return op, [f"groups {g} do not divide in_channels {ic} and out_channels {oc} on {target}"]
            n, _, h, w = op.in_shape
            return replace(op, in_shape=(n, ic // g, h, w), out_shape=(op.out_shape[0], oc // g, *op.out_shape[2:]),
                           groups=1), []
        return op, [
            f"groups {g} not supported on {target}: {op.kind} needs groups == 1, or groups == in_channels == "
            f"out_channels for depthwise (in_channels {ic}, out_channels {oc})"
        ]
    if op.kind in ("depthwise_conv2d", "depthwise_conv2d_transpose") and not g == ic == oc:
        return op, [
            f"depthwise needs groups == in_channels == out_channels, got groups {g}, in_channels {ic}, "
            f"out_channels {oc} on {target}"
        ]
    if op.kind == "global_avg_pool":
        h, w = int(op.in_shape[2]), int(op.in_shape[3])
        return replace(op, kind="avg_pool2d", kernel=(h, w), stride=(1, 1), pad=(0, 0, 0, 0)), []
    return op, []


def placement_note(arch: Arch, op: OpDesc) -> str | None:
    """How a supported `op` is mapped when that is not one-to-one (for the partition report), else None: a grouped
    conv2d runs as G group convs; a split conv as partial convs over input-channel slices summed by ELEW adds,
    and/or as several CONV chunks of output channels."""
    g = _grouped(op, profile_rules(arch))
    if g:
        return (f"grouped conv decomposed into {g} group convs ({op.in_channels // g} -> {op.out_channels // g} "
                f"channels each) on the CONV engine")
    if not _splits(op, profile_rules(arch)):
        return None
    notes = []
    slices = input_channel_chunks(arch, op)
    if len(slices) > 1:
        notes.append(f"input channels split into {len(slices)} slices of at most {max(c for _, c in slices)}: "
                     f"{len(slices)} partial convs summed by ELEW add")
    # out_channels_max_per_cp is the output-channel groups of one CONV chunk (codegen.tiling.OUT_GROUPS_MAX)
    per_chunk = profile_rules(arch)[op.kind].get("out_channels_max_per_cp")
    n_out = math.ceil(op.out_channels / arch.channel_parallel)
    if per_chunk and n_out > per_chunk:
        notes.append(f"output channels in {math.ceil(n_out / per_chunk)} CONV chunks of at most {per_chunk} "
                     f"channel groups")
    return "; ".join(notes) or None


def _splits(op: OpDesc, rules_by_kind: dict[str, Any]) -> bool:
    """Whether the profile splits `op` where it exceeds a per-instruction field (rule "split": true; an ungrouped
    conv2d or a dense)."""
    return op.kind in ("conv2d", "dense") and op.groups == 1 and bool(rules_by_kind.get(op.kind, {}).get("split"))


def _reduction(op: OpDesc) -> tuple[int, int, int, int]:
    """(input channels, kh, kw, dilation) of the reduction one CONV does for `op`, as the in-size rules see it (a
    dense is a 1x1 conv over its flattened features)."""
    if op.kind == "dense":
        return math.prod(int(d) for d in op.in_shape[1:]), 1, 1, 1
    return op.in_channels, op.kernel[0], op.kernel[1], max(op.dilation)


def _reduction_reasons(arch: Arch, rules: dict[str, Any], ic: int, kh: int, kw: int, d: int,
                       target: str) -> dict[str, list[str]]:
    """Why one CONV instruction cannot reduce `ic` input channels over a kh x kw kernel, by rule: "dilation"
    (dilation*input_channels) and "in_size"."""
    reasons: dict[str, list[str]] = {"dilation": [], "in_size": []}
    cp = arch.channel_parallel
    if "dilation_x_ic_max_per_cp" in rules:
        n = rules["dilation_x_ic_max_per_cp"]
        if d * ic > n * cp:
            reasons["dilation"].append(
                f"dilation*input_channels = {d}*{ic} = {d * ic} exceeds {n}*{cp}={n * cp} on {target}"
            )
    if rules.get("in_size"):
        rows, depth = kw * kh * math.ceil(ic / cp), in_size_depth(arch, rules)
        if rows > depth:
            reasons["in_size"].append(
                f"kw*kh*ceil(ic/cp) = {kw}*{kh}*ceil({ic}/{cp}) = {rows} exceeds bank_depth {depth} on {target}"
            )
    return reasons


def in_size_depth(arch: Arch, rules: dict[str, Any], rule: str = "in_size") -> int:
    """The bank depth the in_size (or in_size_phase) rule bounds the weight rows by: the image banks' (true) or a
    named group's."""
    name = rules.get(rule)
    return arch.bank_group(name).depth if isinstance(name, str) else arch.bank_depth


def input_channel_chunks(arch: Arch, op: OpDesc) -> list[tuple[int, int]]:
    """The input-channel slices [(c0, c), ...] `op` runs as, one partial conv each: [(0, ic)] when one CONV
    reduces all its input channels, else the fewest near-equal slices of whole channel groups (cp channels) that
    each pass the in-size and dilation*input_channels rules (the profile's conv2d / dense "split"); [] when no
    slicing helps (one channel group alone exceeds them) or the profile does not split `op`."""
    rules_by_kind = profile_rules(arch)
    rules = rules_by_kind.get(op.kind, {})
    ic, kh, kw, d = _reduction(op)
    if not any(_reduction_reasons(arch, rules, ic, kh, kw, d, "").values()):
        return [(0, ic)]
    if not _splits(op, rules_by_kind):
        return []
    cp = arch.channel_parallel
    cap = in_size_depth(arch, rules) // (kh * kw) if rules.get("in_size") else 1 << 30
    if "dilation_x_ic_max_per_cp" in rules:
        cap = min(cap, rules["dilation_x_ic_max_per_cp"] // d)
    if cap < 1:
        return []
    total = math.ceil(ic / cp)
    k = math.ceil(total / cap)
    base, extra = divmod(total, k)
    out, g0 = [], 0
    for i in range(k):
        g = base + (1 if i < extra else 0)
        out.append((g0 * cp, min(g * cp, ic - g0 * cp)))
        g0 += g
    return out


def _allowed_activations(arch: Arch, source: str | list[str]) -> tuple[str, ...]:
    if isinstance(source, list):
        return tuple(source)
    acts, leaky = {
        "conv": (arch.conv_activations, arch.conv_leaky),
        "alu": (arch.alu_activations, arch.dw_leaky),
        "elew": (arch.elew_activations, False),
    }[source]
    return tuple(a for a in acts if a != "leaky_relu" or leaky)


def _check_activation(arch: Arch, op: OpDesc, kind: str, rules: dict[str, Any], target: str) -> list[str]:
    if op.activation is None:
        return []
    allowed = _allowed_activations(arch, rules["activations"]) + tuple(rules.get("alu_modes", ()))
    if op.activation not in allowed:
        why = rules.get("why_not", {}).get(op.activation)
        return [
            f"activation {op.activation} not supported for {kind} on {target} "
            f"(supported: {', '.join(allowed) or 'none'})" + (f": {why}" if why else "")
        ]
    if op.activation == "leaky_relu":
        den = 1 << LEAKY_SHIFT
        if op.alpha is None:
            return [f"LeakyReLU alpha unknown, cannot check that it quantizes to {LEAKY_NUM}/{den} on {target}"]
        q = math.floor(op.alpha * den + 0.5)  # DPURound, as the quantizer rounds
        if q != LEAKY_NUM:
            return [
                f"LeakyReLU alpha {_fmt(op.alpha)} quantizes to {q}/{den}, DPU supports only {LEAKY_NUM}/{den} "
                f"on {target}"
            ]
    return []


def _upsample_scale(op: OpDesc, target: str) -> tuple[tuple[float, float], list[str]]:
    if op.scale is not None:
        sh, sw = op.scale
    else:
        (ih, iw), (oh, ow) = op.in_shape[2:4], op.out_shape[2:4]
        sh, sw = oh / ih, ow / iw
    if sh != int(sh) or sw != int(sw):
        return (sh, sw), [f"upsample scale {_fmt(sh)}x{_fmt(sw)} is not an integer factor on {target}"]
    return (int(sh), int(sw)), []


def _validate(op: OpDesc) -> None:
    """Malformed descriptions are a caller bug, not a hardware limit."""
    who = f"OpDesc {op.name or op.kind}"
    rank = 2 if op.kind == "dense" else 4
    if len(op.in_shape) < rank or (rank == 4 and len(op.in_shape) != 4) or len(op.out_shape) < 2:
        raise ValueError(f"{who}: shapes in {op.in_shape} / out {op.out_shape} are not NCHW")
    if len(op.kernel) != 2 or len(op.stride) != 2 or len(op.dilation) != 2 or len(op.pad) != 4:
        raise ValueError(f"{who}: kernel/stride/dilation need 2 values and pad 4 (top, left, bottom, right)")


@dataclass(frozen=True)
class _Check:
    """One op against one rule set: what every rule family of check_op reads."""
    arch: Arch
    op: OpDesc
    rules: dict
    rules_by_kind: dict
    target: str
    kind: str
    groups: int
    split: bool
    ic: int
    kh: int
    kw: int
    sh: int
    sw: int
    dh: int
    dw: int


def _window_rules(c: _Check) -> list[str]:
    """kernel, stride, kernel/stride and dilation."""
    rules, target, reasons = c.rules, c.target, []
    if "kernel" in rules:
        reasons += _pair("kernel", (c.kh, c.kw), rules["kernel"], target)
    if "kernel_in" in rules:
        reasons += [f"kernel_{axis} {k} is not one of {rules['kernel_in']} on {target}"
                    for axis, k in (("h", c.kh), ("w", c.kw)) if k not in rules["kernel_in"]]
    if "kernel_fits" in rules:  # a dense's CONV kernel is its input's H x W
        reasons += [f"input {axis} {n} exceeds the {rules['kernel_fits']} a CONV kernel covers on {target}"
                    for axis, n in zip("HW", c.op.in_shape[2:4]) if n > rules["kernel_fits"]]
    if rules.get("kernel_square") and c.kh != c.kw:
        reasons.append(f"kernel {c.kh}x{c.kw} is not square (w == h required) on {target}")
    if "stride" in rules:
        reasons += _pair("stride", (c.sh, c.sw), rules["stride"], target)
    if "kernel_over_stride" in rules:
        lo, hi = rules["kernel_over_stride"]
        for axis, k, s in (("h", c.kh, c.sh), ("w", c.kw, c.sw)):
            if s < 1:
                reasons.append(f"stride_{axis} {s} is below 1 on {target}")
            else:
                reasons += _range(f"kernel_{axis}/stride_{axis} =", k / s, f"{k}/{s}", lo, hi, target)
    if "dilation" in rules:
        reasons += _pair("dilation", (c.dh, c.dw), rules["dilation"], target)
    return reasons


def _reduction_rules(c: _Check, reasons: list[str]) -> dict[str, list[str]]:
    """The reduction limits' reasons by rule; none when the conv splits over input-channel slices instead (partial
    convs summed by ELEW adds, backend/split_conv.py), whose activation the ELEW add must then support (appended
    to `reasons`)."""
    reduction = _reduction_reasons(c.arch, c.rules, c.ic, c.kh, c.kw, max(c.dh, c.dw), c.target)
    if any(reduction.values()) and c.split and input_channel_chunks(c.arch, c.op):
        elew = _allowed_activations(c.arch, "elew")
        if c.op.activation is not None and c.op.activation not in elew:
            reasons.append(f"activation {c.op.activation} of a conv split over input channels (too many for one "
                           f"CONV) is applied by the ELEW add summing the partial convs, which supports "
                           f"{', '.join(elew) or 'none'} on {c.target}")
        return {}
    return reduction


def _pad_rules(c: _Check) -> list[str]:
    """pad, the ALU pad field and the wraps of an ALU window."""
    rules, target, op, reasons = c.rules, c.target, c.op, []
    if "pad" in rules:
        lo = rules["pad"]["min"]
        fn, text = _PAD_MAX[rules["pad"]["max"]]
        dims = {"h": (c.kh, c.dh), "w": (c.kw, c.dw)}
        for (side, axis), p in zip(_SIDES, op.pad):
            hi = fn(*dims[axis])
            if p > hi:
                reasons.append(f"pad_{side} {p} exceeds [{lo},{hi}] ({text.format(a=axis)}) on {target}")
            elif p < lo:
                reasons.append(f"pad_{side} {p} is below [{lo},{hi}] on {target}")
    if "engine_pad_max" in rules:
        for (side, _), p in zip(_SIDES, op.pad):
            hi = rules["engine_pad_max"][side]
            if p > hi:
                reasons.append(f"pad_{side} {p} exceeds the ALU pad field [0,{hi}] on {target}")
    if "window_wraps_max" in rules and c.sh >= 1:
        n, pp = rules["window_wraps_max"], c.arch.pp
        wraps = ((c.kh - 1) // c.sh) // pp + 1  # of the rows one output row fetches (codegen.tiling.max_valid_rows)
        if wraps > n:
            reasons.append(f"kernel_h {c.kh} with stride_h {c.sh}: one output row's window spans {wraps} wraps of "
                           f"the PP={pp} image banks, more than the {n} base addresses of an ALU fetch on {target}")
    return reasons


def _channel_rules(c: _Check) -> list[str]:
    """Weights of one output phase in a bank, and the channel counts."""
    rules, target, cp, ic, reasons = c.rules, c.target, c.arch.channel_parallel, c.ic, []
    if rules.get("in_size_phase"):
        sub_h, sub_w = math.ceil(c.kh / max(c.sh, 1)), math.ceil(c.kw / max(c.sw, 1))
        rows, depth = sub_h * sub_w * math.ceil(ic / cp), in_size_depth(c.arch, rules, "in_size_phase")
        if rows > depth:
            reasons.append(
                f"ceil(kh/sh)*ceil(kw/sw)*ceil(ic/cp) = {sub_h}*{sub_w}*ceil({ic}/{cp}) = {rows} (weights of one "
                f"output phase) exceeds bank_depth {depth} on {target}"
            )
    if "out_channels_max_per_cp" in rules and not c.split:  # split: several CONV chunks of output channels
        n = rules["out_channels_max_per_cp"]
        if c.op.out_channels > n * cp:
            reasons.append(f"output channels {c.op.out_channels} exceed {n}*{cp}={n * cp} on {target}")
    if "in_channels_max_per_cp" in rules:
        n = rules["in_channels_max_per_cp"]
        if ic > n * cp:
            reasons.append(f"input channels {ic} exceed {n}*{cp}={n * cp} on {target}")
    return reasons


def _operand_rules(c: _Check) -> list[str]:
    """Operand shapes, input counts, upsample scales and the fused activation."""
    rules, target, op, reasons = c.rules, c.target, c.op, []
    if op.in_shape2 is not None and tuple(op.in_shape2) != tuple(op.in_shape):
        gate = (*op.in_shape[:2], 1, 1)
        if not (rules.get("broadcast") == "channel_gate" and tuple(op.in_shape2) == gate):
            allowed = f"equal shapes or a channel gate {_shape(gate)}" if rules.get("broadcast") else "equal shapes"
            reasons.append(f"operand shapes {_shape(op.in_shape)} and {_shape(op.in_shape2)}: {op.kind} takes "
                           f"{allowed} on {target}")
    if "inputs" in rules:
        lo, hi = rules["inputs"]
        reasons += _range("num_inputs", op.num_inputs, str(op.num_inputs), lo, hi, target)
    if "scale" in rules:
        scale, bad = _upsample_scale(op, target)
        reasons += bad or _pair("upsample scale", scale, rules["scale"], target)
    if "activations" in rules:
        reasons += _check_activation(c.arch, op, c.kind, rules, target)
    return reasons


def check_op(arch: Arch, op: OpDesc) -> list[str]:
    """The reasons `arch` cannot run `op`, in a fixed rule order; [] means supported.

    Follows the Vitis AI limits table (DPUCZDX8G column) with the ISA1 ALU limits for pooling, as recorded in
    limits.json. Dtype and layout (float32, NCHW) are the caller's concern.
    """
    target = arch.target_label
    rules_by_kind = profile_rules(arch)
    if op.kind not in OP_KINDS or op.kind not in rules_by_kind:
        return [f"op kind {op.kind!r} not supported on {target}"]
    _validate(op)
    orig_kind = op.kind
    groups = _grouped(op, rules_by_kind)
    op, reasons = _resolve_kind(op, target, per_group=bool(groups))
    kind = op.kind if op.kind == orig_kind else f"{orig_kind} (as {op.kind})"
    if groups:
        if reasons:  # groups that do not divide the channels: there are no group convs to check
            return reasons
        kind = f"grouped conv2d (each of its {groups} group convs)"
    rules = rules_by_kind[op.kind]
    if "as" in rules:
        rules = rules_by_kind[rules["as"]]
    if rules.get("supported", True) is False:
        why = rules.get("why")
        return reasons + [f"{op.kind} not supported on {target}" + (f": {why}" if why else "")]
    dense = op.kind == "dense"
    c = _Check(arch, op, rules, rules_by_kind, target, kind, groups, not groups and _splits(op, rules_by_kind),
               math.prod(int(d) for d in op.in_shape[1:]) if dense else op.in_channels,
               *((1, 1) if dense else op.kernel), *op.stride, *op.dilation)
    reasons += _window_rules(c)
    reduction = _reduction_rules(c, reasons)
    reasons += reduction.get("dilation", [])
    reasons += _pad_rules(c)
    reasons += reduction.get("in_size", [])
    reasons += _channel_rules(c) + _operand_rules(c)
    if groups and reasons:  # the numbers above are those of one group conv
        reasons = [f"each of the {groups} group convs: {r}" if not r.startswith("activation") else r
                   for r in reasons]
    return reasons
