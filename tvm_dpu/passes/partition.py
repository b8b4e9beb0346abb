"""DPU / CPU partitioning of a normalized Relax module.

`partition(mod, arch)` runs ``FuseOpsByPattern(dpu_patterns(arch), bind_constants=True,
annotate_codegen=False)`` and ``MergeCompositeFunctions``: every DPU subgraph becomes a function with the
attribute ``Codegen="dpu"`` called from ``main`` (RunCodegen comes later, with the codegen). Many subgraphs per
model are normal: each op the DPU cannot run splits the model.

Lone-op rule. A DPU subgraph whose coarse ops (composite functions) include no conv-class op (conv2d,
depthwise conv2d, transposed conv2d, dense) and number at most `LONE_OP_MAX` is put back on the CPU, with the
reason "lone <ops> between CPU ops: not worth a DPU round trip". Such ops (pool, eltwise add, concat,
activation, upsample, free reshape) are memory bound: on the DPU they cost about as much as moving their
inputs and outputs across the DPU boundary (DDR transfer plus int8 <-> float32 conversion), so a subgraph of
one or two of them saves nothing; their MAC count does not change that, so the rule counts ops only. The rule
is applied by re-running the fusion with the lone subgraph's bindings excluded, until no lone subgraph remains.

Which original binding ended where is traced through the partitioned module by following the dataflow from
``main``'s parameters (TVM de-duplicates structurally equal partitions, so one function may stand for several
places of the model); per-binding tags (see tags.py) make the trace and the rejection bookkeeping exact, and the
original spans (ONNX provenance) are restored before the module is returned.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from ..errors import PartitionError
from .patterns import CONV_CLASS_FAMILIES, CheckSession, check_session, dpu_patterns
from .report import PartitionReport, build_report
from .tags import make_tag_span, tag_of

# A DPU subgraph without a conv-class op and with at most this many coarse ops stays on the CPU.
LONE_OP_MAX = 2

_MAX_ROUNDS = 20


@dataclass
class BindingInfo:
    """One Call binding of the original ``main`` (before partitioning)."""

    tag: int
    var: relax.Var
    call: relax.Call  # the tagged call
    op: str  # Relax op name, e.g. "relax.nn.conv2d"
    span: tvm.ir.Span | None  # the original span (provenance)
    orig_call: relax.Call  # the call as it was in the input module


@dataclass
class SubgraphInfo:
    """One DPU (or plugin) call site in the partitioned ``main`` (ids follow main's topological order)."""

    index: int
    function: str  # GlobalVar name of the Codegen="dpu" (or plugin codegen) function
    tags: list[int] = field(default_factory=list)  # original bindings it computes, in its order
    composites: list[str] = field(default_factory=list)  # Composite names of its coarse ops
    has_conv: bool = False
    codegen: str = "dpu"


@dataclass
class Placement:
    """Where every original binding ended up."""

    device: dict[int, str]  # tag -> "dpu" | "cpu" | a plugin's device name
    subgraph: dict[int, int]  # tag -> subgraph index (dpu tags: in `subgraphs`; plugin tags: in `plugin_subgraphs`)
    subgraphs: list[SubgraphInfo]
    plugin_subgraphs: list[SubgraphInfo] = field(default_factory=list)


@dataclass
class ExternalClaim:
    """Bindings of main claimed before DPU partitioning (a custom-IP plugin): they become functions with
    Codegen=`codegen` (compiled by `relax.ext.<codegen>`), shown in reports as running on `device`."""

    codegen: str
    device: str
    tags: set[int]


#: A claimer sees the tagged module, its bindings and the tags already claimed by earlier claimers, and returns
#: its claim (plugins/ builds one per enabled plugin; passes/ knows nothing else of plugins).
Claimer = Callable[[tvm.IRModule, "list[BindingInfo]", set], ExternalClaim]


# ---------------------------------------------------------------------------------------------------------
# Tagging
# ---------------------------------------------------------------------------------------------------------
def _main_function(mod: tvm.IRModule) -> relax.Function:
    if not isinstance(mod, tvm.IRModule):
        raise PartitionError(f"partition expects a tvm.IRModule, got {type(mod).__name__}")
    names = [gv.name_hint for gv in mod.get_global_vars()]
    if "main" not in names:
        raise PartitionError(f"the module has no 'main' function (functions: {', '.join(sorted(names)) or 'none'})")
    fn = mod["main"]
    if not isinstance(fn, relax.Function):
        raise PartitionError("'main' is not a Relax function")
    return fn


def _ensure_dataflow(mod: tvm.IRModule) -> tvm.IRModule:
    blocks = _main_function(mod).body.blocks
    if not any(isinstance(b, relax.DataflowBlock) for b in blocks):
        # FuseOpsByPattern only looks inside dataflow blocks.
        mod = relax.transform.ConvertToDataflow()(mod)
    return mod


def _tag_main(mod: tvm.IRModule) -> tuple[tvm.IRModule, list[BindingInfo]]:
    """Stamp a unique tag span on every Op call bound in main; return the module and the bindings."""
    fn = _main_function(mod)
    infos: list[BindingInfo] = []
    new_blocks = []
    for block in fn.body.blocks:
        bindings = []
        for b in block.bindings:
            val = b.value
            if isinstance(b, relax.VarBinding) and isinstance(val, relax.Call) and isinstance(val.op, tvm.ir.Op):
                tag = len(infos)
                call = relax.Call(val.op, val.args, val.attrs, val.ty_args, make_tag_span(tag), ret_ty=val.ty)
                infos.append(BindingInfo(tag, b.var, call, val.op.name, val.span, val))
                b = relax.VarBinding(b.var, call, b.span)
            bindings.append(b)
        cls = relax.DataflowBlock if isinstance(block, relax.DataflowBlock) else relax.BindingBlock
        new_blocks.append(cls(bindings, block.span))
    body = relax.SeqExpr(new_blocks, fn.body.body, fn.body.span)
    new_fn = relax.Function(fn.params, body, fn.ret_ty, fn.is_pure, fn.attrs, fn.span)
    out = mod.clone()  # IRModule.__setitem__ mutates in place: never touch the caller's module
    out["main"] = new_fn
    return out, infos


@mutator
class _RestoreSpans(PyExprMutator):
    """Put the original spans back in place of the tags."""

    def __init__(self, spans: dict[int, tvm.ir.Span | None]):
        super().__init__()
        self.spans = spans

    def visit_call_(self, call):
        call = super().visit_call_(call)
        t = tag_of(call)
        if t is None:
            return call
        return relax.Call(call.op, call.args, call.attrs, call.ty_args, self.spans.get(t), ret_ty=call.ty)


def _restore_spans(mod: tvm.IRModule, infos: list[BindingInfo]) -> tvm.IRModule:
    spans = {i.tag: i.span for i in infos}
    updated = {}
    for gv, fn in mod.functions.items():
        if isinstance(fn, relax.Function):
            updated[gv] = _RestoreSpans(spans).visit_expr(fn)
    out = mod
    for gv, fn in updated.items():
        out[gv] = fn
    return out


# ---------------------------------------------------------------------------------------------------------
# Tracing the partitioned module back to the original bindings
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Item:
    """Origin of ``t[index]`` where ``t`` is an atom (a tuple-valued binding such as batch_norm)."""

    base: object
    index: int

    def __eq__(self, other) -> bool:
        return isinstance(other, _Item) and self.index == other.index and _same(self.base, other.base)

    def __hash__(self) -> int:
        return hash((self.base.__hash__(), self.index))


def _same(a, b) -> bool:
    """Equality of origins: Vars by identity, items and tuples structurally; None is a constant/leaf."""
    if isinstance(a, tuple) or isinstance(b, tuple):
        return isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, _Item) or isinstance(b, _Item):
        return a == b
    if a is None or b is None:
        return a is None and b is None
    return a.same_as(b)


def _base(origin):
    return origin.base if isinstance(origin, _Item) else origin


class _Tracer:
    """Follows the dataflow of the partitioned main and maps each op it meets to an original binding.

    Values are described by their origin in the ORIGINAL main: an original Var bound to an op call (or a
    parameter), an `_Item` of one, a Python tuple of origins, or None (constants and other leaves).
    """

    def __init__(self, orig_main: relax.Function, infos: list[BindingInfo]):
        self.infos = infos
        self.orig_params = list(orig_main.params)
        self.var_of_tag = {i.tag: i.var for i in infos}
        self.canon: dict = {p: p for p in orig_main.params}
        for block in orig_main.body.blocks:
            for b in block.bindings:
                val = b.value
                if isinstance(val, relax.Call) and isinstance(val.op, tvm.ir.Op):
                    self.canon[b.var] = b.var
                elif isinstance(val, (relax.Var, relax.TupleGetItem, relax.Tuple)):
                    self.canon[b.var] = self.resolve(self.canon, val)
                else:
                    self.canon[b.var] = b.var
        self.consumers: dict = {}  # base origin -> consumer tags
        self.arg_origins: dict[int, list] = {}
        for i in infos:
            origins = [self.resolve(self.canon, a) for a in i.call.args]
            self.arg_origins[i.tag] = origins
            for o in self._flat(origins):
                if o is not None:
                    self.consumers.setdefault(_base(o), []).append(i.tag)
        self.used: set[int] = set()

    @staticmethod
    def _flat(origins) -> list:
        out = []
        for o in origins:
            out += _Tracer._flat(o) if isinstance(o, tuple) else [o]
        return out

    def _matches(self, tag: int, call: relax.Call, origins: list) -> bool:
        info = self.infos[tag]
        if info.op != call.op.name or len(info.call.args) != len(origins):
            return False
        if not all(_same(a, o) for a, o in zip(self.arg_origins[tag], origins)):
            return False
        return tvm_ffi.structural_equal(info.call.attrs, call.attrs)

    def identify(self, call: relax.Call, origins: list) -> int:
        hint = tag_of(call)
        if hint is not None and hint not in self.used and self._matches(hint, call, origins):
            return hint
        for o in self._flat(origins):
            if o is None:
                continue
            for t in self.consumers.get(_base(o), []):
                if t not in self.used and self._matches(t, call, origins):
                    return t
        raise PartitionError(
            f"internal error: cannot trace {call.op.name} (tag {hint}) of the partitioned module back to the model"
        )

    def resolve(self, env: dict, expr):
        if isinstance(expr, relax.Var):
            if expr in env:
                return env[expr]
            raise PartitionError(f"internal error: unbound variable {expr.name} while tracing")
        if isinstance(expr, relax.Tuple):
            return tuple(self.resolve(env, f) for f in expr.fields)
        if isinstance(expr, relax.TupleGetItem):
            tup = self.resolve(env, expr.tuple_value)
            if isinstance(tup, tuple):
                return tup[expr.index]
            return None if tup is None else _Item(tup, int(expr.index))
        return None  # constants and other leaves

    def run_function(self, fn: relax.Function, arg_origins: list, found: list[int], composites: list[str]):
        env = dict(zip(fn.params, arg_origins))
        local_fns: dict = {}
        body = fn.body
        for block in body.blocks:
            for b in block.bindings:
                val = b.value
                if isinstance(val, relax.Function):
                    local_fns[b.var] = val
                    continue
                env[b.var] = self.eval(env, val, local_fns, found, composites)
        return self.resolve(env, body.body)

    def eval(self, env, val, local_fns, found, composites):
        if isinstance(val, relax.Call) and isinstance(val.op, tvm.ir.Op):
            origins = [self.resolve(env, a) for a in val.args]
            t = self.identify(val, origins)
            self.used.add(t)
            found.append(t)
            return self.var_of_tag[t]
        if isinstance(val, relax.Call) and isinstance(val.op, relax.Var) and val.op in local_fns:
            inner = local_fns[val.op]
            if inner.attrs is not None and "Composite" in inner.attrs:
                composites.append(str(inner.attrs["Composite"]))
            return self.run_function(inner, [self.resolve(env, a) for a in val.args], found, composites)
        return self.resolve(env, val)


def _is_dpu_function(fn) -> bool:
    return isinstance(fn, relax.Function) and fn.attrs is not None and "Codegen" in fn.attrs and str(fn.attrs["Codegen"]) == "dpu"


def trace_placement(partitioned: tvm.IRModule, orig_main: relax.Function, infos: list[BindingInfo],
                    plugin_devices: dict[str, str] | None = None) -> Placement:
    """Map every original binding of `orig_main` to "dpu" (with its subgraph), a plugin's device (functions whose
    Codegen is a key of `plugin_devices`) or "cpu"."""
    plugin_devices = plugin_devices or {}
    plugin_subgraphs: list[SubgraphInfo] = []
    tracer = _Tracer(orig_main, infos)
    main = partitioned["main"]
    env = dict(zip(main.params, tracer.orig_params))
    device: dict[int, str] = {}
    subgraph: dict[int, int] = {}
    subgraphs: list[SubgraphInfo] = []
    for block in main.body.blocks:
        for b in block.bindings:
            val = b.value
            if isinstance(val, relax.Call) and isinstance(val.op, tvm.ir.GlobalVar):
                fn = partitioned[val.op]
                codegen = str(fn.attrs["Codegen"]) if isinstance(fn, relax.Function) and fn.attrs is not None \
                    and "Codegen" in fn.attrs else None
                if codegen in plugin_devices:
                    psg = SubgraphInfo(len(plugin_subgraphs), val.op.name_hint, codegen=codegen)
                    env[b.var] = tracer.run_function(fn, [tracer.resolve(env, a) for a in val.args], psg.tags,
                                                     psg.composites)
                    for t in psg.tags:
                        device[t] = plugin_devices[codegen]
                        subgraph[t] = psg.index
                    plugin_subgraphs.append(psg)
                    continue
                if not _is_dpu_function(fn):
                    raise PartitionError(
                        f"main calls the function {val.op.name_hint}: only modules whose main holds Relax op calls "
                        f"directly can be partitioned (inline it first)"
                    )
                sg = SubgraphInfo(len(subgraphs), val.op.name_hint)
                env[b.var] = tracer.run_function(fn, [tracer.resolve(env, a) for a in val.args], sg.tags, sg.composites)
                sg.has_conv = any(c.startswith(CONV_CLASS_FAMILIES) for c in sg.composites)
                for t in sg.tags:
                    device[t] = "dpu"
                    subgraph[t] = sg.index
                subgraphs.append(sg)
            else:
                found: list[int] = []
                env[b.var] = tracer.eval(env, val, {}, found, [])
                for t in found:
                    device[t] = "cpu"
    missing = [i.tag for i in infos if i.tag not in device]
    if missing:
        # Bindings dead in the original (never reached from main's output) stay on the CPU side.
        for t in missing:
            device[t] = "cpu"
    return Placement(device, subgraph, subgraphs, plugin_subgraphs)


# ---------------------------------------------------------------------------------------------------------
# Partition
# ---------------------------------------------------------------------------------------------------------
def _lone_label(sg: SubgraphInfo, infos: list[BindingInfo]) -> str:
    ops = []
    for t in sg.tags:
        info = infos[t]
        name = info.op.split(".")[-1]
        if name == "clip":
            name = "relu6"
        ops.append(name)
    return "+".join(ops)


def lone_reason(sg: SubgraphInfo, infos: list[BindingInfo]) -> str:
    n = len(sg.composites)
    return (
        f"lone {_lone_label(sg, infos)} between CPU ops: not worth a DPU round trip "
        f"(no conv-class op and {n} coarse op{'s' if n != 1 else ''}; the rule keeps <= {LONE_OP_MAX} on the CPU)"
    )


def is_lone(sg: SubgraphInfo) -> bool:
    """The lone-op rule: no conv-class coarse op and at most LONE_OP_MAX coarse ops."""
    return not sg.has_conv and len(sg.composites) <= LONE_OP_MAX


@dataclass
class PartitionResult:
    """Everything `partition` learnt; `report` is the user-facing summary."""

    module: tvm.IRModule
    placement: Placement
    infos: list[BindingInfo]
    session: CheckSession


def _claim_patterns(claims: Sequence[ExternalClaim], infos: list[BindingInfo]) -> list[tuple]:
    """One pattern per (claim, op type) that matches exactly the claimed bindings (by tag), for FuseOpsByPattern.
    Adjacent claimed bindings of one claim merge into one function (MergeCompositeFunctions, cycle-free)."""
    from tvm.relax.dpl import is_op, wildcard

    out = []
    for claim in claims:
        by_op: dict[tuple[str, int], set[int]] = {}
        for t in sorted(claim.tags):
            info = infos[t]
            by_op.setdefault((info.op, len(info.call.args)), set()).add(t)
        for (op, nargs), tags in sorted(by_op.items()):
            root = is_op(op)(*[wildcard() for _ in range(nargs)])
            out.append((f"{claim.codegen}.{op.replace('.', '_')}_{nargs}", root, {"root": root},
                        lambda ctx, tags=frozenset(tags): tag_of(ctx.annotated_expr["root"]) in tags))
    return out


def partition_detailed(mod: tvm.IRModule, arch, claimers: Sequence[Claimer] = ()) -> PartitionResult:
    """`partition` returning the internal placement too (used by the report and by tests). `claimers` (custom-IP
    plugins, in order) claim bindings before DPU partitioning."""
    from ..arch import load_arch

    arch = load_arch(arch)
    mod = _ensure_dataflow(mod)
    tagged, infos = _tag_main(mod)
    names = {i.tag: binding_node_names(i) for i in infos}
    claims: list[ExternalClaim] = []
    claimed: set[int] = set()
    for claimer in claimers:
        claim = claimer(tagged, infos, set(claimed))
        if claim.tags & claimed:
            raise PartitionError(f"plugin {claim.device!r} claims ops an earlier plugin claimed")
        claims.append(claim)
        claimed |= claim.tags
    plugin_devices = {c.codegen: c.device for c in claims}
    extra = _claim_patterns(claims, infos)
    excluded: dict[int, str] = {t: f"claimed by plugin {c.device}" for c in claims for t in c.tags}
    for _ in range(_MAX_ROUNDS):
        session = CheckSession(arch=arch, excluded=dict(excluded), names=names)
        with check_session(session):
            fused = relax.transform.FuseOpsByPattern(
                extra + dpu_patterns(arch), bind_constants=True, annotate_codegen=False
            )(tagged)
            merged = relax.transform.MergeCompositeFunctions()(fused)
        placement = trace_placement(merged, tagged["main"], infos, plugin_devices)
        lone = [sg for sg in placement.subgraphs if is_lone(sg)]
        if not lone:
            break
        for sg in lone:
            reason = lone_reason(sg, infos)
            for t in sg.tags:
                excluded[t] = reason
    else:  # pragma: no cover - the excluded set grows every round, so this needs > _MAX_ROUNDS lone layers
        raise PartitionError(f"lone-op rule did not converge in {_MAX_ROUNDS} rounds")
    result_mod = _restore_spans(merged, infos)
    return PartitionResult(result_mod, placement, infos, session)


def partition(mod: tvm.IRModule, arch, normalize: bool = True) -> tuple[tvm.IRModule, PartitionReport]:
    """Partition `mod` for the DPU `arch` (an Arch, preset name or arch.json path), exactly as `partition_for_dpu`,
    the "dpu" pipeline and `tvm_dpu.build` do (so the report says what compiles): tvm-dpu's normalization first
    (a no-op on a module from `tvm_dpu.from_onnx`; `normalize=False` skips it for a module normalized already).

    Returns the partitioned module (functions with attr ``Codegen="dpu"`` called from main; RunCodegen not
    applied) and a `PartitionReport` listing every model node with its device, subgraph and, for CPU nodes, the
    exact reason.
    """
    if normalize:
        from ..frontend import normalize as normalize_mod

        mod = normalize_mod(mod)
    result = partition_detailed(mod, arch)
    report = build_report(mod, result)
    return result.module, report


def partition_for_dpu(mod: tvm.IRModule, arch, normalize: bool = True) -> tvm.IRModule:
    """The BYOC entry for TVM users: normalize `mod` (tvm-dpu's frontend passes: BN/scale/pad folding, dense ->
    conv, ...; a no-op on a module from `tvm_dpu.from_onnx`) and partition it for `arch`; returns the module
    (see `partition`), ready for `tvm.compile(p, target="dpu", relax_pipeline=relax.get_pipeline("dpu", ...))`."""
    if normalize:
        from ..frontend import normalize as normalize_mod

        mod = normalize_mod(mod)
    return partition_detailed(mod, arch).module


def binding_node_names(info: BindingInfo) -> list[str]:
    """Model node names of an original binding (frontend provenance), or [] without provenance."""
    try:
        from ..frontend.provenance import node_names
    except ImportError:  # frontend not available: no provenance
        return []
    try:
        return [str(n) for n in node_names(info.orig_call)]
    except Exception:  # a foreign span that is not provenance
        return []


__all__ = [
    "LONE_OP_MAX",
    "partition",
    "partition_for_dpu",
    "partition_detailed",
    "trace_placement",
    "is_lone",
]
