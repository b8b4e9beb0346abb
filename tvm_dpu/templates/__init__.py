"""The fusion-template registry: one module per template family, each defining the `TemplateDef` of its templates.

A `TemplateDef` says everything the pipeline knows about one fusion template (the `Group.template` of a plan): its
pattern (the query graph Algorithm 1 matches, fusion.templates), its priority in the search, the hooks of the later
stages (the fit test, the emitter, the emission variants, the analytic cost) and its policies (whether the compiler
relocates its parameters, which maps stay on chip, how the search's bank model tiles it, whether it is a resident
chain, whether the builder times the plan without it too). Callers ask the template (`template(name).resident`,
`hook(name, "fits")`), never compare its name: adding a template is one module here plus its code in the stages.

The registry is built like the op registry (tvm_dpu/ops/): every module of this package is imported and its
module-level `TemplateDef` values are collected. It sits below every stage (it imports only the leaves), so a
`TemplateDef` names its hooks as strings ("module:function" in the package of the stage that resolves it,
`HOOK_USERS`), resolved by `hook` in the stage that owns them: codegen resolves the fit test, the variants and the
emitter, timing the analytic cost. tests/test_templates.py checks every template's hooks resolve (or say why it has
none); tests/test_layering.py counts each hook as an import of its module by its user.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Any, Mapping

from tvm_dpu.errors import DPUError
from tvm_dpu.ops import OpRegistryError, collect_defs, lookup, ref_module, resolve
from tvm_dpu.types import SINGLE

#: Hook -> the one module that resolves it (its package holds the hook's module).
HOOK_USERS = {
    # fn(arch, graph, ops: list[Op]) -> bool: whether the group compiles to one fused pipeline on arch
    "fits": "tvm_dpu.codegen.fused",
    # fn(arch, graph, ops) -> tuple[str, ...]: the emission variants worth timing ("wide", the default, first)
    "variants": "tvm_dpu.codegen.fused",
    # fn(prog, params, arch, graph, ops, fmaps, variant) -> None: emit the group as one pipeline
    "emitter": "tvm_dpu.codegen.compiler",
    # fn(members: list[LayerDesc], arch, consumers, graph_outputs) -> cycles: DNNVM's "model" cost of the group
    "cost": "tvm_dpu.timing.analytic",
}
#: Hooks a template may leave out without saying why (None: the group has one emission).
OPTIONAL_HOOKS = ("variants",)

#: Op-type sets the patterns use ("input": a graph input, fusion.opgraph.INPUT).
CONV = frozenset({"conv2d"})
DEPTHWISE = frozenset({"depthwise_conv2d"})
POOL = frozenset({"max_pool2d", "avg_pool2d"})
ADD = frozenset({"eltwise_add"})
ANY = frozenset({"input", "conv2d", "depthwise_conv2d", "conv2d_transpose", "dense", "max_pool2d", "avg_pool2d",
                 "eltwise_add", "eltwise_mul", "concat", "upsample_nearest", "activation"})


class TemplateRegistryError(DPUError, LookupError):
    """A template the registry does not know, or a hook a TemplateDef does not name or that does not resolve."""


@dataclass(frozen=True)
class QueryVertex:
    """One vertex of a pattern: allowed op types and named constraints (fusion.templates.CONSTRAINTS); with
    ``member=False`` it anchors the pattern but is not part of the group (the shared input of a horizontal fusion)."""

    key: str
    types: frozenset[str]
    constraints: tuple[str, ...] = ()
    member: bool = True


def v(key: str, types: frozenset[str], *constraints: str, member: bool = True) -> QueryVertex:
    return QueryVertex(key, types, tuple(constraints), member)


@dataclass(frozen=True)
class Pattern:
    """A template's query graph (DNNVM 4.1, Fig. 3/4): vertices and producer -> consumer edges. `kind`:
    "vertical" (a chain of linear edges), "eltwise" (a chain into an add, a special case at the add's barrier),
    "horizontal" (convs sharing one input)."""

    kind: str
    vertices: tuple[QueryVertex, ...]
    edges: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Tiling:
    """How the search's bank model (fusion.cost.tile_width, DNNVM Eq. 5-6) sees the group: whether a candidate
    whose fit test fails is dropped there (else only by the search's `accept`), how many extra output tiles sit
    beside the output's (conv_add's loaded eltwise operand), and whether the last member tiles like the others
    (an add at the end of a chain adds nothing to its tile)."""

    fit: bool = True
    extra_outputs: int = 0
    last_member: bool = True


@dataclass(frozen=True)
class TemplateDef:
    """Everything the pipeline knows about one fusion template. Hooks are "module:function" references resolved
    by `hook` in the package of their user (`HOOK_USERS`); a hook left None needs its reason in `missing`
    (hook -> why), except the OPTIONAL_HOOKS."""

    name: str
    #: search order: greedy tries templates in ascending priority; ties between candidates at one op go to the lower
    priority: int
    #: the query graph Algorithm 1 matches; None: the template is not found by matching (`resident`, single ops)
    pattern: Pattern | None
    fits: str | None
    emitter: str | None
    cost: str | None
    variants: str | None = None
    missing: Mapping[str, str] = field(default_factory=dict)
    #: the emitter writes its parameters from row 0 of the CONVW / BIAS banks; the compiler moves them into the
    #: half the previous op left free (codegen.compiler.relocated_params)
    relocated: bool = False
    #: every member's output but the last stays in the banks (the DDR plan gives it no place)
    on_chip: bool = True
    tiling: Tiling = Tiling()
    #: a resident chain (codegen.resident): fusion.residency chooses it over runs of the plan's groups
    resident: bool = False
    #: the builder also times the plan searched without this template (backend.dpu_compile.RECHECKED_TEMPLATES)
    recheck: bool = False
    #: the search compares each group of this template in context with the groupings of its ops into smaller
    #: candidates, and keeps the faster (fusion.select._split_in_context)
    split_check: bool = False
    doc: str = ""

    @property
    def horizontal(self) -> bool:
        return self.pattern is not None and self.pattern.kind == "horizontal"

    @property
    def at_barrier(self) -> bool:
        """A special case at an add's barrier (pattern kind "eltwise"): only the add claims a path head."""
        return self.pattern is not None and self.pattern.kind == "eltwise"

    @property
    def fused(self) -> bool:
        """Whether groups of this template are emitted as one pipeline (single ops are not)."""
        return self.emitter is not None


def problems(d: TemplateDef) -> list[str]:
    """What is wrong with `d`: a hook left out without a reason, a reason for a hook it has, a hook that does not
    resolve in its user's package."""
    out = []
    for name, user in HOOK_USERS.items():
        ref = getattr(d, name)
        if ref is None:
            if name not in OPTIONAL_HOOKS and not d.missing.get(name):
                out.append(f"template {d.name!r} has no {name} hook and does not say why (missing)")
            continue
        if name in d.missing:
            out.append(f"template {d.name!r} names a {name} hook and a reason for not having one")
        try:
            resolve(ref, user)
        except OpRegistryError as e:
            out.append(f"template {d.name!r}: {e}")
    return out


@cache
def _registry() -> dict[str, TemplateDef]:
    out = collect_defs(__path__, __name__, TemplateDef, "name", TemplateRegistryError, "fusion template")
    return dict(sorted(out.items(), key=lambda kv: (kv[1].priority, kv[0])))


def registry() -> dict[str, TemplateDef]:
    """Template name -> TemplateDef of every template, in priority order (a fresh dict; the defs are frozen)."""
    return dict(_registry())


def get(name: str) -> TemplateDef:
    """The TemplateDef of `name`; TemplateRegistryError naming the known templates otherwise."""
    return lookup(_registry(), name, TemplateRegistryError, "fusion template")


def matched() -> tuple[TemplateDef, ...]:
    """The templates Algorithm 1 matches (those with a pattern), in priority order."""
    return tuple(d for d in _registry().values() if d.pattern is not None)


def residents() -> tuple[str, ...]:
    """The resident-chain templates, in priority order (the first wins a tie)."""
    return tuple(n for n, d in _registry().items() if d.resident)


def hook(name: str, hook_name: str) -> Any:
    """Hook `hook_name` (one of HOOK_USERS) of template `name`, resolved in its user's package;
    TemplateRegistryError when the template has none (with its reason) or the reference does not resolve."""
    d = get(name)
    ref = getattr(d, hook_name)
    if ref is None:
        why = d.missing.get(hook_name, "it has one emission" if hook_name in OPTIONAL_HOOKS else "no reason given")
        raise TemplateRegistryError(f"fusion template {name!r} has no {hook_name} hook ({why})")
    try:
        return resolve(ref, HOOK_USERS[hook_name])
    except OpRegistryError as e:
        raise TemplateRegistryError(f"fusion template {name!r}: {e}") from None


def hook_module(hook_name: str, ref: str) -> str:
    """The module hook `hook_name`'s reference `ref` lives in."""
    return ref_module(ref, HOOK_USERS[hook_name])


__all__ = ["ADD", "ANY", "CONV", "DEPTHWISE", "HOOK_USERS", "OPTIONAL_HOOKS", "POOL", "SINGLE", "Pattern",
           "QueryVertex", "TemplateDef", "TemplateRegistryError", "Tiling", "hook", "hook_module", "matched",
           "problems", "registry", "residents", "get", "v"]
