"""The cost of a candidate group for the fusion search, and whether its tiles fit the banks.

`cost(group, graph, arch)` is the one function the selection calls; it returns cycles. The `cost_source`
context manager picks the evaluation: "analytic" (the default) is DNNVM's "model" option, the group
view of the one analytic cost model (tvm_dpu.timing.analytic.group_cycles); "simulate" compiles the group alone
(compile_graph_fused) and runs the cycle-level timing model (tvm_dpu.timing.simulate) on it, DNNVM's simulator
option. `tile_width` is Eq. 5-6 generalised to a group (with the fused emitters' own bank budgets); a group with no
width is infeasible.

Simulated pieces (a candidate alone, or a window of groups: `piece_cycles`) are cached per graph on their geometry
(`piece_key`), not on their op names: a network's repeated blocks give isomorphic pieces whose programs differ only
in addresses and quantization shifts, which the timing model does not read, so each geometry is compiled and
simulated once. `TVM_DPU_CHECK_PIECE_KEY=1` compiles every piece anyway and fails if one sharing a key has another
timed program.
"""
from __future__ import annotations

import dataclasses
import os
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Sequence

import numpy as np

import tvm_dpu.templates as tpl
from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.compiler import compile_graph_fused
from tvm_dpu.codegen.fused import emittable, variants_of
from tvm_dpu.codegen.layout import ceil_div
from tvm_dpu.codegen.tiling import FIELD10
from tvm_dpu.errors import DPUError, FusionError
from tvm_dpu.timing.analytic import copy_cycles, group_cycles, weight_rows
from tvm_dpu.timing.simulate import cycles as program_cycles, timing_key
from tvm_dpu.types import FusionPlan, Group, LayerDesc, TensorDesc
from tvm_dpu.xgraph import ops as xops
from tvm_dpu.xgraph.graph import Graph


class _Ctx:
    """Per-graph lookup tables (each op's cost-model view, consumers per tensor), the per-candidate cost cache,
    the simulated pieces by geometry (`piece_key` -> cycles, and the timed program's key when checking), the
    programs of the lone ops compiled as pieces (`lone_program`) and the fastest variant of each group with
    variants (TemplateDef.variants) costed alone (its first op -> variant, `group_variants`)."""

    def __init__(self, graph: Graph, arch: Arch):
        self.graph, self.arch = graph, arch
        self.layers = {op.name: xops.layer_desc(op, graph) for op in graph.ops}
        self.consumers: dict[str, int] = {}
        for op in graph.ops:
            for t in set(op.inputs):
                self.consumers[t] = self.consumers.get(t, 0) + 1
        self.outputs = frozenset(graph.outputs)
        self.cache: dict[tuple[str, ...], float] = {}
        self.pieces: dict[tuple, tuple[float, Any]] = {}
        self.lone: dict[str, np.ndarray] = {}
        #: (template, ops) of a group with variants -> its fastest variant costed alone (keyed by the whole group:
        #: pw_dw_pw and pw_dw_pw_add share their first op, the key FusionPlan.variants uses)
        self.variants: dict[tuple[str, tuple[str, ...]], str] = {}


_CTX: dict[tuple[int, str], _Ctx] = {}


def _ctx(graph: Graph, arch: Arch) -> _Ctx:
    key = (id(graph), arch.name)
    c = _CTX.get(key)
    if c is None or c.graph is not graph or len(c.layers) != len(graph.ops):
        if len(_CTX) > 64:
            _CTX.clear()
        c = _CTX[key] = _Ctx(graph, arch)
    return c


#: "analytic" (timing.analytic.group_cycles: DNNVM's model option, microseconds per candidate) or "simulate"
#: (compile the group alone and run tvm_dpu.timing.simulate on its program: exact for the realised code, including
#: the CONVs a fused emitter's smaller tiles add). A context variable, so concurrent builds in several threads
#: each see their own; the default is the analytic model, the builder searches with "simulate"
#: (fusion.select.compile_with_fusion).
_COST_SOURCE: ContextVar[str] = ContextVar("tvm_dpu_fusion_cost_source", default="analytic")


@contextmanager
def cost_source(source: str):
    """Evaluate candidates with `source` ("analytic" | "simulate") in this block (this thread / context only)."""
    if source not in ("analytic", "simulate"):
        raise ValueError(f"cost source {source!r} is not 'analytic' or 'simulate'")
    token = _COST_SOURCE.set(source)
    try:
        yield
    finally:
        _COST_SOURCE.reset(token)


def cost_source_name() -> str:
    """The cost source in effect ("analytic" | "simulate")."""
    return _COST_SOURCE.get()


def cost(group: Group, graph: Graph, arch: Arch) -> float:
    """Cycles of executing `group` (cached per candidate and cost source)."""
    c = _ctx(graph, arch)
    source = _COST_SOURCE.get()
    key = (source, group.template, group.ops)
    v = c.cache.get(key)
    if v is None:
        # a template without an analytic model (a resident chain: its gain is latency and overlap) is simulated
        analytic = source == "analytic" and tpl.get(group.template).cost is not None
        v = c.cache[key] = group_cycles([c.layers[n] for n in group.ops], group.template, arch, c.consumers,
                                        c.outputs) if analytic else simulated_cost(group, graph, arch)
    return v


def simulated_cost(group: Group, graph: Graph, arch: Arch) -> float:
    """Cycles of the group's own compiled program on the timing simulator (concat alone: 0, its copies are
    charged by the plan, as in the analytic model)."""
    if len(group.ops) == 1 and graph.op(group.ops[0]).type == "concat":
        return 0.0
    if tpl.get(group.template).variants is not None:
        return _fastest_variant(graph, arch, group)
    return piece_cycles(graph, arch, [group])


def _fastest_variant(graph: Graph, arch: Arch, group: Group) -> float:
    """Cycles of `group` alone in its fastest variant (its template's variants hook, those that differ, the default
    "wide" first; ties: the earlier), which every later piece and the plan holding the group use
    (`group_variants`). Variants are keyed in FusionPlan.variants by the group's first op."""
    c = _ctx(graph, arch)
    first, variants = group.ops[0], variants_of(group, graph, arch)
    timed = {v: piece_cycles(graph, arch, [group], {first: v}) for v in variants}
    best = min(variants, key=lambda v: (timed[v], variants.index(v)))
    c.variants[(group.template, group.ops)] = best
    return timed[best]


def group_variants(graph: Graph, arch: Arch, groups: Sequence[Group]) -> dict[str, str]:
    """The variants (FusionPlan.variants) of the groups with variants among `groups` whose fastest variant, costed
    alone, is not the default "wide"."""
    chosen = _ctx(graph, arch).variants
    return {g.ops[0]: chosen[(g.template, g.ops)] for g in groups
            if tpl.get(g.template).variants is not None and chosen.get((g.template, g.ops), "wide") != "wide"}


#: Set to 1 to compile and simulate every piece even when one of the same geometry was (a debug check of
#: `piece_key`: a piece whose timed program differs from the one its key shares raises FusionError).
CHECK_ENV = "TVM_DPU_CHECK_PIECE_KEY"


def piece_cycles(graph: Graph, arch: Arch, groups: Sequence[Group], variants: dict[str, str] | None = None
                 ) -> float:
    """Simulated cycles of `groups` (some of the ops of `graph`, grouped) extracted and compiled together as one
    program: a candidate alone, or a plan's neighbourhood. `variants` (FusionPlan.variants) default to the
    fastest of each group with variants (TemplateDef.variants) costed alone (`group_variants`). Pieces of one geometry
    (`piece_key`, with the variants by op position) are compiled and simulated once per graph."""
    c = _ctx(graph, arch)
    if variants is None:
        variants = group_variants(graph, arch, groups)
    variants = {n: v for n, v in variants.items() if v != "wide"}
    sub = graph.extract([n for g in groups for n in g.ops])
    key = piece_key(sub, groups)
    if key is not None and variants:
        index = {op.name: i for i, op in enumerate(sub.ops)}
        key = (*key, tuple(sorted((index[n], v) for n, v in variants.items())))
    check = os.environ.get(CHECK_ENV, "") not in ("", "0")
    hit = c.pieces.get(key) if key is not None else None
    if hit is not None and not check:
        return hit[0]
    code = compile_graph_fused(sub, arch, FusionPlan("piece", list(groups), variants=variants),
                               keep_params=False).code
    if len(sub.ops) == 1 and not variants:
        c.lone[sub.ops[0].name] = code
    value = program_cycles(code, arch)
    timed = timing_key(code, arch.instruction_set) if check else None
    if hit is not None and hit[1] is not None and (timed != hit[1] or value != hit[0]):
        raise FusionError(f"piece key: groups {[list(g.ops) for g in groups]} share a geometry key with a piece "
                          f"compiled before but their timed programs differ ({value:.0f} vs {hit[0]:.0f} cycles)")
    if key is not None and (hit is None or hit[1] is None):
        c.pieces[key] = (value, timed)
    return value


def lone_program(graph: Graph, arch: Arch, op: str) -> np.ndarray | None:
    """The program of op `op` compiled alone (no parameters, its default variant) if a piece of this graph
    compiled it, else None."""
    return _ctx(graph, arch).lone.get(op)


#: What the code generator reads of an op's quantization parameters (quant.rules) beyond instruction field values
#: that the timing model ignores: the values an INIT instruction (CONVINIT / ALUINIT) carries, in this order, 0 where
#: a kind of parameters has none (the emitters write 0 there). Program.emit drops an INIT equal to the one in force,
#: so whether two INITs carry equal values decides how many instructions a piece has. Each entry: the parameter
#: names that fill one INIT field, the first a kind of parameters has (a conv's shift_bias field is shift_bias_isa,
#: a hard sigmoid's is shift_bias).
_INIT_QUANT = (("act_type",), ("shift_cut",), ("shift_bias_isa", "shift_bias"), ("multi_factor",), ("shift_prelu_p",),
               ("shift_prelu_n",))


def piece_key(sub: Graph, groups: Sequence[Group]) -> tuple | None:
    """A key of what the program of `sub` (an extracted graph, every op in one of `groups`) compiled alone
    depends on; two pieces with one key have programs the timing model cannot tell apart (same instructions,
    dependency masks and timed fields; tests/test_piece_key.py). The key holds the structure with tensors
    numbered in order of use (op types, attributes, which tensors each op reads, writes and binds as parameters,
    which enter and leave the piece), every tensor's shape and dtype, the grouping, and of the quantization only
    what the code generator branches on: its strings (the eltwise kind), which concat inputs need requantizing,
    and which ops' INIT values (`_INIT_QUANT`) are equal to each other or all 0, since an INIT equal to the one in
    force is not emitted again. Names, fix points and the shifts themselves are left out: they only reach
    addresses and field values, which the timing model does not read (timing.cost.TIMED_FIELDS). None when an
    op's quantization parameters cannot be computed (the piece is then compiled on its own)."""
    ref: dict[str, int] = {}

    def r(t: str) -> int:
        return ref.setdefault(t, len(ref))

    inputs = tuple(r(t) for t in sub.inputs)
    index = {op.name: i for i, op in enumerate(sub.ops)}
    classes: dict[tuple[int, ...], int] = {(0,) * len(_INIT_QUANT): 0}
    ops = []
    for op in sub.ops:
        try:
            q = xops.quant_params(op, sub)
        except DPUError:  # not quantizable: no key (the compile reports it where it matters)
            return None
        ops.append((op.type, repr(sorted(op.attrs.items())), tuple(r(t) for t in op.inputs),
                    tuple((role, r(op.params[role])) for role in sorted(op.params)), tuple(r(t) for t in op.outputs),
                    _quant_shape(q, classes)))
    outputs = tuple(r(t) for t in sub.outputs)
    tensors = tuple(_tensor_shape(sub.tensors[t]) for t in ref)
    grouping = tuple(sorted((tuple(index[n] for n in g.ops), g.template) for g in groups))
    return inputs, tuple(ops), outputs, tensors, grouping


def _tensor_shape(t: Any) -> tuple:
    data = t.data
    return t.shape, t.dtype, None if data is None else (data.shape, str(data.dtype))


def _quant_shape(q: Any, classes: dict[tuple[int, ...], int]) -> Any:
    """What `piece_key` keeps of quantization parameters `q`: their kind, the class of their INIT values (equal
    values, equal class; all 0: class 0), their strings, and the same of the parameters they hold (a concat's
    per-input requantization, None where an input needs none)."""
    if q is None:
        return None
    if not dataclasses.is_dataclass(q) or isinstance(q, type):
        return object()  # parameters of a kind not audited here: equal to nothing, so the piece is not shared
    init = tuple(next((int(getattr(q, n)) for n in names if hasattr(q, n)), 0) for names in _INIT_QUANT)
    out: list[Any] = [type(q).__name__, classes.setdefault(init, len(classes))]
    for f in dataclasses.fields(q):
        v = getattr(q, f.name)
        if isinstance(v, str):
            out.append((f.name, v))
        elif isinstance(v, tuple) and any(x is None or dataclasses.is_dataclass(x) for x in v):
            out.append((f.name, tuple(_quant_shape(x, classes) for x in v)))
    return tuple(out)


def copy_cost(graph: Graph, arch: Arch, tensor: str) -> float:
    """Cycles of copying one concat input into its slice (LOAD + SAVE through a bank, plan "none")."""
    return copy_cycles(TensorDesc(tensor, tuple(graph.tensors[tensor].shape)).nbytes, arch)


def tile_width(members: tuple[str, ...], template: str, graph: Graph, arch: Arch) -> int | None:
    """Widest output tile Tw of the group such that every tiled input, intermediate and the parameters fit their
    banks (DNNVM Eq. 5-6 with Th = PP, Toc = OCP, Tic = ICP, generalised to a group, as its template's Tiling
    says); None if no Tw fits."""
    d = tpl.get(template)
    ops = [graph.op(n) for n in members]
    layers = [_ctx(graph, arch).layers[n] for n in members]
    if not _params_fit(layers, d, arch):
        return None
    if d.horizontal:
        wins = {(tuple(xops.attr(o, "strides")), tuple(xops.attr(o, "pads")), lo.window[:2])
                for o, lo in zip(ops, layers)}
        if len(wins) != 1:
            return None  # one input tile serves every member only with one window geometry
    if d.tiling.fit and d.fits is not None and not emittable(Group(template, members), graph, arch):
        return None
    if not d.tiling.last_member:
        layers = layers[:-1]
    _, _, w_out = layers[-1].outputs[0].chw
    for tw in range(min(w_out, FIELD10), 0, -1):
        if _fits(layers, d, arch, tw, arch.bank_depth // 2):
            return tw
    return None


def _params_fit(layers: list[LayerDesc], d: tpl.TemplateDef, arch: Arch) -> bool:
    """Whether the group's parameters fit their banks: every CONV-engine member's weights fully resident when an
    intermediate feeds a conv (not in a horizontal group: its members read the group's input), else at least one
    output-channel group of each; every depthwise member's window of one channel group."""
    conv_ops = [o for o in layers if o.type in ("conv2d", "dense")]
    feeds_conv = not d.horizontal and any(o.type in ("conv2d", "dense") and i > 0 for i, o in enumerate(layers))
    rows = 0
    for o in conv_ops:
        r, g = weight_rows(o, arch)
        rows += r * (g if feeds_conv else 1)
    if rows > arch.bank_depth:
        return False
    for o in layers:
        if o.type == "depthwise_conv2d":
            kh, kw, _, _ = o.window
            if kh * kw * ceil_div(o.outputs[0].chw[0], arch.icp) > arch.bank_depth:
                return False
    return True


def _fits(ops: list[LayerDesc], d: tpl.TemplateDef, arch: Arch, tw: int, half: int) -> bool:
    cols = tw
    # output tile (Eq. 6 line 1): one OCP group of Tw pixels per row (per member of a horizontal group), plus the
    # loaded eltwise operand
    out_groups = len(ops) if d.horizontal else 1 + d.tiling.extra_outputs
    if cols * out_groups > half:
        return False
    chain = [ops[0]] if d.horizontal else ops
    for i in range(len(chain) - 1, -1, -1):
        op = chain[i]
        kh, kw, sh, sw = op.window
        in_cols = (cols - 1) * sw + kw  # F^-1(Tw)
        cin = op.inputs[0].chw[0]
        cg = ceil_div(cin, arch.icp) if op.type in ("conv2d", "dense") else 1
        n_rows = (arch.pp - 1) * sh + kh
        wraps = ((n_rows - 1) // sh) // arch.pp + 1
        if in_cols * cg * wraps * sh > half or in_cols > FIELD10:
            return False
        cols = in_cols
    return True
