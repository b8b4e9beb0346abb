"""Float XGraph -> int8 XGraph: power-of-two fix_points for every tensor, int8 constants, DPU constraints enforced.

Order of decisions (each step only narrows what the previous one chose):

1. Feature maps: fp from the calibration statistics (`calibration.choose_fix_point`, method "mse" or "minmax"),
   or from `overrides` (tensor name -> fp, e.g. the fix_points of a QDQ model), which are never changed.
2. Pins: a ReLU6 output has fp 4 (the DPU clamps at 96 = 6 * 2**4); a hard-sigmoid output fp 7
   (`rules.HSIGMOID_FIX_POINT`). An override that contradicts a pin is an error.
3. Shared fix_points: nearest upsampling keeps the fp (hard: a conflict is an error); max pool keeps it and a
   concat takes one fp for its inputs and output, so the concat is free (the producers write into place). These
   two are soft: tensors are merged into one group unless their pins differ, in which case the max pool / concat
   requantizes (the rules allow it), and likewise when a pinned fp would saturate the calibrated range of an
   unpinned branch (e.g. a ReLU6 branch concatenated with a wider one). Graph inputs keep their own fp and are
   never merged into a concat group. An unpinned group gets the fp chosen on the union of its members' samples.
4. Constants: weights, biases, PReLU slopes and constant inputs get their own per-tensor fp from their values.
5. Conv-class ops (conv2d, depthwise_conv2d, conv2d_transpose, dense), with shift_cut = fp_in + fp_w - fp_out in
   [0, 16]:
   * shift_cut > 16 (tiny weights): fp_w is lowered to fp_out - fp_in + 16 (the smallest weights lose precision;
     nothing saturates).
   * shift_cut < 0: the output group's fp is lowered to fp_in + fp_w (coarser output, nothing saturates); this may
     lower fp_in of the consumers, so the pass repeats until nothing changes (fps only decrease, so it ends).
     When the output fp is pinned (ReLU6, override), fp_w is raised instead and large weights saturate; the
     report says how many.
   * bias: fp_bias is clamped into [fp_in + fp_w - 19, fp_in + fp_w] (shift_bias >= 0, ISA field <= 20); a given
     (overridden) fp_bias may be fp_in + fp_w + 1 (ISA field 0, rules.SHIFT_BIAS_MIN).
6. LeakyReLU slopes within `rules.LEAKY_ALPHA_TOLERANCE` of 26/256 become exactly 26/256, others are rejected;
   average pools with padding and count_include_pad=False are rejected (`rules.check_avgpool_padding`).
7. The int8 graph is validated and `xgraph.ops.quant_params` is evaluated for every op, so a graph this returns
   is one the golden reference and the code generator accept.
"""
from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

import numpy as np

from tvm_dpu.errors import DPUError, QuantizationError
from tvm_dpu.quant import rules
from tvm_dpu.quant.calibration import (
    METHODS,
    CalibrationStats,
    collect_stats,
    choose_fix_point,
    search_fix_point,
    minmax_fix_point,
    quantize_counting,
    sqnr_db,
)
from tvm_dpu.ops import hook as op_hook
from tvm_dpu.quant.fixpoint import LEAKY_ALPHA, RELU6_FIX_POINT
from tvm_dpu.quant.threads import map_threads
from tvm_dpu.xgraph import ops as opspec
from tvm_dpu.xgraph.graph import Graph, Op, Tensor
from tvm_dpu.xgraph.validate import validate_graph

#: Largest shift_bias = fp_in + fp_w - fp_bias (its ISA field is shift_bias + 1 <= 20).
MAX_SHIFT_BIAS = rules.SHIFT_BIAS_ISA_MAX - 1
_MAX_ROUNDS = 1000


@dataclass(frozen=True)
class FixPointRule:
    """What an op's output fix_point is tied to (an OpDef's `fix_points` hook returns one): `pin` (fp, reason)
    fixes it outright; `tie` "same" must share the input's fix_point (an error if pins disagree), "share" shares
    it when free (the op is then exact), "share_inputs" shares it with each input that may (concat)."""

    pin: tuple[int, str] | None = None
    tie: Literal["same", "share", "share_inputs"] | None = None
    why: str = ""  # what the op is, for the error when a "same" tie meets two pins
    #: A conv-class op: its weights and bias take the shift_cut / bias-shift constraints (step 5).
    weighted: bool = False
    #: The largest fix_point the op's input may have, and why (lowered to it unless an override fixes it).
    input_max: tuple[int, str] | None = None
    #: The op applies LeakyReLU: its slope becomes exactly 26/256 (step 6).
    leaky: bool = False
    #: A parameter role whose fix_point must be 0 when it holds negative values (PReLU slopes on the ALU).
    signed_param: str | None = None
    #: A check of the op's attributes the DPU's arithmetic needs (raises QuantizationError naming the op).
    check: Callable[[Op], None] | None = None


def fp_free(op: Op) -> FixPointRule:
    """The output fix_point is chosen from statistics (eltwise, avg pool, ...)."""
    return FixPointRule()


def fp_conv(op: Op) -> FixPointRule:
    """A conv-class op: relu6 pins the output (clip at 6 is exact only at RELU6_FIX_POINT); the weights and bias
    follow shift_cut."""
    act = opspec.attr(op, "act")
    return FixPointRule((RELU6_FIX_POINT, "relu6") if act == "relu6" else None, weighted=True,
                        leaky=act == "leaky_relu")


def fp_max_pool(op: Op) -> FixPointRule:
    """max pool keeps the scale: sharing the fix_point makes it exact."""
    return FixPointRule(tie="share")


def fp_avg_pool(op: Op) -> FixPointRule:
    """avg pool rescales (chosen from statistics); padding must be counted in the divisor."""
    return FixPointRule(check=lambda o: rules.check_avgpool_padding(
        o.name, opspec.attr(o, "pads"), bool(opspec.attr(o, "count_include_pad"))))


def fp_upsample(op: Op) -> FixPointRule:
    """Nearest upsampling copies pixels: it cannot rescale."""
    return FixPointRule(tie="same", why="nearest upsampling")


def fp_concat(op: Op) -> FixPointRule:
    """concat shares the output fix_point with the inputs that may (no requantization for those)."""
    return FixPointRule(tie="share_inputs")


def fp_activation(op: Op) -> FixPointRule:
    """relu6 and hard_sigmoid pin their output (hard sigmoid also bounds its input's fix_point: the ALU's shift
    field); relu keeps the scale (weight 1, shift 0 when shared); PReLU slopes that go negative need fp 0."""
    mode = opspec.attr(op, "mode")
    if mode == "relu6":
        return FixPointRule((RELU6_FIX_POINT, "relu6"))
    if mode == "hard_sigmoid":
        return FixPointRule((rules.HSIGMOID_FIX_POINT, "hard_sigmoid"),
                            input_max=(rules.SHIFT_BIAS_ISA_MAX, f"hard-sigmoid {op.name!r}"))
    if mode == "relu":
        return FixPointRule(tie="share")
    return FixPointRule(leaky=mode == "leaky_relu", signed_param="alpha" if mode == "prelu" else None)


@dataclass
class TensorFix:
    """How one tensor's fix_point was chosen. `chosen` is the fp before constraints (None if pinned outright);
    `reason` names what decided the final one ("stats", "override", "relu6", "hard_sigmoid", "group", "shift_cut",
    "bias_shift", "prelu_sign", ...); `sqnr_db` is the round-trip SQNR over the constant's values or the
    feature map's samples; `saturated` counts constant values clipped to int8."""

    name: str
    kind: str  # input | fmap | weights | bias | alpha | const
    fix_point: int
    chosen: int | None
    reason: str
    sqnr_db: float | None = None
    saturated: int = 0


@dataclass
class QuantReport:
    """Fix_points of every tensor of the int8 graph and the constraint adjustments made on the way."""

    graph_name: str
    method: str
    tensors: dict[str, TensorFix] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    requantizing: list[str] = field(default_factory=list)  # concat / max pool ops that are not free

    @property
    def fix_points(self) -> dict[str, int]:
        return {n: t.fix_point for n, t in self.tensors.items()}

    def format(self) -> str:
        """A human-readable table."""
        lines = [f"quantization of {self.graph_name!r} (method {self.method})",
                 f"{'tensor':40s} {'kind':8s} {'fp':>4s} {'stats':>5s} {'SQNR dB':>8s}  reason"]
        for t in self.tensors.values():
            s = "" if t.sqnr_db is None else ("inf" if math.isinf(t.sqnr_db) else f"{t.sqnr_db:.1f}")
            c = "" if t.chosen is None else str(t.chosen)
            lines.append(f"{t.name:40s} {t.kind:8s} {t.fix_point:4d} {c:>5s} {s:>8s}  {t.reason}"
                         + (f" ({t.saturated} saturated)" if t.saturated else ""))
        lines += [f"note: {n}" for n in self.notes]
        lines += [f"requantizing: {n}" for n in self.requantizing]
        return "\n".join(lines)


@dataclass
class QuantResult:
    graph: Graph
    report: QuantReport


class _Groups:
    """Union-find over feature maps that share one fix_point, with an optional pin per group."""

    def __init__(self, names: list[str]):
        self.parent = {n: n for n in names}
        self.pin: dict[str, tuple[int, str]] = {}  # root -> (fp, why)

    def find(self, n: str) -> str:
        while self.parent[n] != n:
            self.parent[n] = self.parent[self.parent[n]]
            n = self.parent[n]
        return n

    def members(self, root: str) -> list[str]:
        return [n for n in self.parent if self.find(n) == root]

    def union(self, a: str, b: str) -> bool:
        """Merge when the pins agree; False (nothing merged) when they differ."""
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return True
        pa, pb = self.pin.get(ra), self.pin.get(rb)
        if pa is not None and pb is not None and pa[0] != pb[0]:
            return False
        self.parent[rb] = ra
        if pa is None and pb is not None:
            self.pin[ra] = pb
        self.pin.pop(rb, None)
        return True


def quantize_graph(graph_f: Graph, stats: CalibrationStats | None, *, method: str = "mse",
                   overrides: Mapping[str, int] | None = None) -> Graph:
    """The int8 XGraph of float XGraph `graph_f` (see the module docstring for every rule applied).

    `stats` comes from `calibration.collect_stats` on `graph_f`; it may be None when `overrides` gives the fp of
    every feature map (a QDQ model). `overrides`: tensor name -> fp forced (feature maps or constants).
    Raises QuantizationError naming the op or tensor when the DPU cannot run the graph with any fix_points.
    Use `quantize_with_report` to get the chosen fix_points and the adjustments too.
    """
    return quantize_with_report(graph_f, stats, method=method, overrides=overrides).graph


def quantize_with_report(graph_f: Graph, stats: CalibrationStats | None, *, method: str = "mse",
                         overrides: Mapping[str, int] | None = None) -> QuantResult:
    """As `quantize_graph`, returning the int8 graph and its `QuantReport`."""
    return _Quantizer(graph_f, stats, method, dict(overrides or {})).run()


class _Quantizer:
    def __init__(self, g: Graph, stats: CalibrationStats | None, method: str, overrides: dict[str, int]):
        if method not in METHODS:
            raise QuantizationError(f"unknown fix_point method {method!r} (use one of {', '.join(METHODS)})")
        self.g, self.stats, self.method = g, stats, method
        self.report = QuantReport(g.name, method)
        validate_graph(g)
        for name, fp in overrides.items():
            if name not in g.tensors:
                raise QuantizationError(f"override for tensor {name!r}: graph {g.name!r} has no such tensor")
            if isinstance(fp, bool) or not isinstance(fp, (int, np.integer)):
                raise QuantizationError(f"override for tensor {name!r}: fix_point {fp!r} is not an integer")
        self.overrides = {k: int(v) for k, v in overrides.items()}
        self.producer = g.producers()
        self.fmaps = list(g.inputs) + [o for op in g.ops for o in op.outputs]
        for name in self.fmaps:
            t = g.tensors[name]
            if t.dtype != "float32":
                raise QuantizationError(f"tensor {name!r} is {t.dtype}; quantize_graph takes a float32 graph")
        self.groups = _Groups(self.fmaps)
        self.chosen: dict[str, int | None] = {}
        self.reason: dict[str, str] = {}
        self.const_fp: dict[str, int] = {}
        self.const_pinned: set[str] = set()
        self.const_search: dict[str, int] = {}  # fix_point searches done ahead (in parallel) for `_const`
        # quant_mse the fix_point searches computed, per tensor whose values the SQNR of the report reads (a
        # feature map's own samples, a constant's data): the report's noise at fps searched is not computed again
        self.mse: dict[str, dict[int, float]] = {}

    def _where(self, name: str) -> str:
        op = self.producer.get(name)
        return f"tensor {name!r}" + (f" (output of {op.where()})" if op else " (graph input)")

    # -- steps 1-3: feature maps --------------------------------------------------------------------------
    def _stats_fp(self, names: list[str]) -> int:
        if self.stats is None:
            raise QuantizationError(f"{self._where(names[0])}: no fix_point override and no calibration stats; "
                                    "calibrate the graph (collect_stats) or override every feature map")
        for n in names:
            if n not in self.stats:
                raise QuantizationError(f"{self._where(n)}: no calibration statistics (were the stats collected on "
                                        "this graph?)")
        if len(names) == 1:
            found = self.stats[names[0]].search(self.method)
            self.mse[names[0]] = found.mse
            return found.fix_point
        ts = [self.stats[n] for n in names]
        return choose_fix_point(np.concatenate([t.samples for t in ts]), self.method,
                                vmin=min(t.min for t in ts), vmax=max(t.max for t in ts))

    def _pin(self, name: str, fp: int, why: str, op: Op) -> None:
        over = self.overrides.get(name)
        if over is not None and over != fp:
            raise QuantizationError(f"{op.where()}: output {name!r} must have fix_point {fp} ({why}), but the "
                                    f"override gives {over}")
        self.groups.pin[self.groups.find(name)] = (fp, why)

    def _feature_maps(self) -> None:
        g, groups = self.g, self.groups
        for name, fp in self.overrides.items():
            if name in groups.parent:
                groups.pin[name] = (fp, "override")
        # each kind's `fix_points` hook (tvm_dpu/ops/) says what its output's fix_point is tied to
        self.rules = {op.name: op_hook(op.type, "fix_points")(op) for op in g.ops}
        fp_rules = [(op, self.rules[op.name]) for op in g.ops]
        for op, rule in fp_rules:
            if rule.pin is not None:
                self._pin(op.outputs[0], *rule.pin, op)
        for op, rule in fp_rules:  # hard edges first
            if rule.tie == "same" and not groups.union(op.inputs[0], op.outputs[0]):
                raise QuantizationError(f"{op.where()}: {rule.why} keeps the fix_point, but its input and "
                                        f"output are pinned to different ones "
                                        f"({groups.pin[groups.find(op.inputs[0])]} vs "
                                        f"{groups.pin[groups.find(op.outputs[0])]})")
        inputs = set(g.inputs)
        for op, rule in fp_rules:
            if rule.tie == "share":
                groups.union(op.inputs[0], op.outputs[0])
            elif rule.tie == "share_inputs":
                for i in op.inputs:
                    if i not in inputs and i in groups.parent and self._may_share(op.outputs[0], i):
                        groups.union(op.outputs[0], i)
        self.group_fp: dict[str, int] = {}
        roots = sorted({groups.find(n) for n in self.fmaps}, key=self.fmaps.index)
        free = [r for r in roots if r not in groups.pin]
        searched = dict(zip(free, map_threads(lambda r: self._stats_fp(groups.members(r)), free)))
        for root in roots:
            members = groups.members(root)
            if root in groups.pin:
                fp, why = groups.pin[root]
                self.group_fp[root] = fp
                for m in members:
                    self.reason[m] = why if m in self.overrides or len(members) == 1 else f"group ({why})"
                    self.chosen[m] = None
            else:
                fp = searched[root]
                self.group_fp[root] = fp
                for m in members:
                    self.reason[m] = "stats" if len(members) == 1 else "group"
                    self.chosen[m] = fp

    def _may_share(self, a: str, b: str) -> bool:
        """A pinned fix_point is imposed on an unpinned group only if it does not saturate the group's calibrated
        range (a ReLU6 branch must not clip a wider branch of the same concat); otherwise the concat requantizes."""
        ra, rb = self.groups.find(a), self.groups.find(b)
        pa, pb = self.groups.pin.get(ra), self.groups.pin.get(rb)
        if (pa is None) == (pb is None) or self.stats is None:
            return True
        pinned_fp, free = (pa[0], rb) if pa is not None else (pb[0], ra)  # type: ignore[index]
        ts = [self.stats[m] for m in self.groups.members(free) if m in self.stats]
        if not ts:
            return True
        return pinned_fp <= minmax_fix_point(min(t.min for t in ts), max(t.max for t in ts))

    def fp(self, name: str) -> int:
        return self.group_fp[self.groups.find(name)]

    # -- step 4: constants --------------------------------------------------------------------------------
    def _const(self, name: str, kind: str) -> int:
        """Preferred fp of a constant (override, else from its values)."""
        if name in self.overrides:
            self.const_pinned.add(name)
            self.reason[name] = "override"
            self.chosen[name] = None
            return self.overrides[name]
        t = self.g.tensors[name]
        if t.data is None or t.data.dtype.kind != "f":
            raise QuantizationError(f"constant {name!r} ({kind}) must hold float data, got "
                                    f"{None if t.data is None else t.data.dtype}")
        fp = self.const_search[name] if name in self.const_search else self._search_const(name)
        self.reason[name] = "stats"
        self.chosen[name] = fp
        return fp

    def _search_const(self, name: str) -> int:
        found = search_fix_point(self.g.tensors[name].data, self.method)
        self.mse[name] = found.mse
        return found.fix_point

    def _set_const(self, name: str, fp: int, reason: str, user: Op) -> None:
        old = self.const_fp.get(name)
        if old is not None and old != fp:
            raise QuantizationError(f"{user.where()}: constant {name!r} is shared with another op that needs "
                                    f"fix_point {old}, this one needs {fp}")
        if name in self.const_pinned and self.overrides[name] != fp:
            raise QuantizationError(f"{user.where()}: constant {name!r} must have fix_point {fp} ({reason}), but "
                                    f"the override gives {self.overrides[name]}")
        if fp != self.chosen.get(name) and name not in self.const_pinned:
            self.reason[name] = reason
        self.const_fp[name] = fp

    # -- step 5: conv constraints -------------------------------------------------------------------------
    def _lower_group(self, name: str, fp: int, why: str) -> None:
        root = self.groups.find(name)
        old = self.group_fp[root]
        self.group_fp[root] = fp
        for m in self.groups.members(root):
            self.reason[m] = why
        self.report.notes.append(f"{self._where(name)}: fix_point lowered {old} -> {fp} ({why})")

    def _conv_constraints(self) -> dict[str, int]:
        """fp_w per conv op after the shift_cut rule (may lower feature-map groups)."""
        convs = [op for op in self.g.ops if self.rules[op.name].weighted]
        weights = [op.params["weights"] for op in convs]
        searchable = [w for w in dict.fromkeys(weights) if w not in self.overrides and self.g.tensors[w].data is not None
                      and self.g.tensors[w].data.dtype.kind == "f"]
        self.const_search.update(zip(searchable, map_threads(self._search_const, searchable)))
        pref = {op.name: self._const(op.params["weights"], "weights") for op in convs}
        fw: dict[str, int] = {}
        for _ in range(_MAX_ROUNDS):
            changed = False
            for op in convs:
                wname = op.params["weights"]
                fi, fo, p = self.fp(op.inputs[0]), self.fp(op.outputs[0]), pref[op.name]
                lo, hi = fo - fi + rules.SHIFT_CUT_MIN, fo - fi + rules.SHIFT_CUT_MAX
                pinned_w = wname in self.const_pinned
                out_pinned = self.groups.find(op.outputs[0]) in self.groups.pin
                if lo <= p <= hi:
                    fw[op.name] = p
                elif p > hi and not pinned_w:
                    fw[op.name] = hi
                elif p < lo and not out_pinned:
                    self._lower_group(op.outputs[0], fi + p, f"shift_cut of {op.name!r} >= 0")
                    fw[op.name] = p
                    changed = True
                elif p < lo and not pinned_w:
                    fw[op.name] = lo
                else:
                    raise QuantizationError(
                        f"{op.where()}: shift_cut = fp_in + fp_w - fp_out = {fi} + {p} - {fo} = {fi + p - fo} is "
                        f"outside [{rules.SHIFT_CUT_MIN}, {rules.SHIFT_CUT_MAX}] and the fix_points involved are "
                        "all fixed (overrides / relu6)")
            for op in self.g.ops:
                bound = self.rules[op.name].input_max
                if bound is not None and self.fp(op.inputs[0]) > bound[0]:
                    if self.groups.find(op.inputs[0]) in self.groups.pin:
                        raise QuantizationError(f"{op.where()}: input fix_point {self.fp(op.inputs[0])} > "
                                                f"{bound[0]} ({bound[1]}) is fixed by an override")
                    self._lower_group(op.inputs[0], *bound)
                    changed = True
            if not changed:
                break
        else:  # pragma: no cover - fps only decrease, so this cannot loop forever
            raise QuantizationError(f"graph {self.g.name!r}: fix_point constraints did not converge")
        for op in convs:
            wname = op.params["weights"]
            if fw[op.name] != pref[op.name]:
                self.report.notes.append(
                    f"{op.where()}: weights {wname!r} fix_point {pref[op.name]} -> {fw[op.name]} so that shift_cut "
                    f"= {self.fp(op.inputs[0])} + {fw[op.name]} - {self.fp(op.outputs[0])} is in "
                    f"[{rules.SHIFT_CUT_MIN}, {rules.SHIFT_CUT_MAX}]")
            self._set_const(wname, fw[op.name], "shift_cut", op)
            bname = op.params.get("bias")
            if bname is not None:
                top = self.fp(op.inputs[0]) + fw[op.name]
                pb = self._const(bname, "bias")
                # A given fix_point (QDQ scale, override) may be one bit finer than the accumulator: the datapath
                # adds the bias to 2*acc (rules.SHIFT_BIAS_MIN), as vai_c's programs do. A calibrated bias stops at
                # fp_in + fp_w: a finer bit lies below the output's rounding anyway.
                low = rules.SHIFT_BIAS_MIN if bname in self.const_pinned else 0
                fb = min(max(pb, top - MAX_SHIFT_BIAS), top - low)
                if fb != pb:
                    self.report.notes.append(f"{op.where()}: bias {bname!r} fix_point {pb} -> {fb} (bias shift "
                                             f"fp_in + fp_w - fp_bias must be in [{low}, {MAX_SHIFT_BIAS}])")
                self._set_const(bname, fb, "bias_shift", op)
        return fw

    def _other_constants(self) -> None:
        for op in self.g.ops:
            role = self.rules[op.name].signed_param
            if role is not None:
                aname = op.params[role]
                fp = self._const(aname, role)
                if np.any(self.g.tensors[aname].data < 0) and fp != 0:
                    self.report.notes.append(f"{op.where()}: {role} {aname!r} fix_point {fp} -> 0 (negative values "
                                             "need fix_point 0 on the ALU)")
                    fp = 0
                self._set_const(aname, fp, "prelu_sign", op)
            for name in op.inputs:
                t = self.g.tensors[name]
                if t.is_const and name not in self.const_fp:
                    self._set_const(name, self._const(name, "const"), "stats", op)

    # -- steps 6-7: build and check ----------------------------------------------------------------------
    def _op(self, op: Op) -> Op:
        attrs = copy.deepcopy(op.attrs)
        rule = self.rules[op.name]
        if rule.leaky:
            alpha = opspec.attr(op, "alpha")
            rules.check_leaky_alpha(op.name, alpha)
            if alpha is not None and float(alpha) != LEAKY_ALPHA:
                self.report.notes.append(f"{op.where()}: LeakyReLU alpha {alpha} -> {LEAKY_ALPHA} (26/256)")
            attrs["alpha"] = LEAKY_ALPHA
        if rule.check is not None:
            rule.check(op)
        return Op(op.name, op.type, list(op.inputs), list(op.outputs), attrs, dict(op.params), list(op.source))

    def _kind(self, name: str) -> str:
        if name in self.g.inputs:
            return "input"
        if name in self.producer:
            return "fmap"
        for op in self.g.ops:
            for role, pname in op.params.items():
                if pname == name:
                    return role
        return "const"

    def run(self) -> QuantResult:
        g = self.g
        self._feature_maps()
        self._conv_constraints()
        self._other_constants()
        out = Graph(g.name, inputs=list(g.inputs), outputs=list(g.outputs), root=copy.deepcopy(g.root))
        report = self.report

        def sqnr_of(name: str) -> float | None:
            s = self.stats.tensors.get(name) if self.stats is not None else None
            if s is None or not s.count:
                return None
            fp = self.fp(name)
            return sqnr_db(s.samples, fp, self.mse.get(name, {}).get(fp))

        def quantize_const(name: str) -> tuple[np.ndarray, int, float]:
            fp, data = self.const_fp[name], g.tensors[name].data
            q, saturated = quantize_counting(data, fp)
            return q, saturated, sqnr_db(data, fp, self.mse.get(name, {}).get(fp))

        fmaps = [n for n in g.tensors if n in self.groups.parent]
        consts = [n for n in g.tensors if n not in self.groups.parent and n in self.const_fp]
        sqnrs = dict(zip(fmaps, map_threads(sqnr_of, fmaps)))
        quantized = dict(zip(consts, map_threads(quantize_const, consts)))
        for name, t in g.tensors.items():
            if name in self.groups.parent:
                fp = self.fp(name)
                out.add_tensor(Tensor(name, t.shape, "int8", fp))
                report.tensors[name] = TensorFix(name, self._kind(name), fp, self.chosen.get(name),
                                                 self.reason.get(name, "stats"), sqnrs[name])
            elif name in self.const_fp:
                fp = self.const_fp[name]
                q, sat, sqnr = quantized[name]
                out.add_tensor(Tensor(name, t.shape, "int8", fp, q))
                report.tensors[name] = TensorFix(name, self._kind(name), fp, self.chosen.get(name),
                                                 self.reason.get(name, "stats"), sqnr, sat)
                if sat:
                    report.notes.append(f"constant {name!r}: {sat} of {q.size} values saturate at fix_point {fp}")
        for op in g.ops:
            out.add_op(self._op(op))
        self._check(out)
        return QuantResult(out, report)

    def _check(self, out: Graph) -> None:
        try:
            validate_graph(out)
        except DPUError as e:
            raise QuantizationError(f"quantized graph {out.name!r} is invalid: {e}") from None
        for op in out.ops:
            q = opspec.quant_params(op, out)  # QuantizationError names the op
            if op.type == "concat" and not q.free:
                self.report.requantizing.append(
                    f"{op.where()}: inputs {[i for i, r in zip(op.inputs, q.requant) if r is not None]} are "
                    f"requantized to fix_point {out.tensors[op.outputs[0]].fix_point}")
            if op.type == "max_pool2d" and q.exponent != 0:
                self.report.requantizing.append(f"{op.where()}: requantizes by 2**{q.exponent}")


__all__ = ["QuantReport", "QuantResult", "TensorFix", "quantize_graph", "quantize_with_report"]


def calibrate(graph_f: Graph, batches: Iterable[Any], method: str = "mse", progress: bool = True,
              overrides: Mapping[str, int] | None = None) -> Graph:
    """Float XGraph + calibration batches -> int8 XGraph (`calibration.collect_stats` then `quantize_graph`)."""
    stats = collect_stats(graph_f, batches, progress=progress)
    return quantize_graph(graph_f, stats, method=method, overrides=overrides)
