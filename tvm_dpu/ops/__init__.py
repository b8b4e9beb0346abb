"""The operator registry: one module per operator family, each defining the `OpDef` of its XGraph op kinds.

An `OpDef` says everything the pipeline knows about one op kind: its attribute / parameter spec (the XGraph shape
check), the names the DPU limit checks use for it, the Relax patterns and Relax ops that lower to it, and one hook
per stage (golden evaluator, float reference, quantization rule, fix_point rule, analytic cost, code emitter).

The registry is built from the package's modules (as onnx/reference's ``_op_list.py`` builds its list): every
module of this package is imported and its module-level `OpDef` values are collected. Nothing else keeps a list of
kinds: `xgraph.ops.OP_SPECS`, `arch.opdesc.OP_KINDS`, the golden and float evaluators, the quantization rules, the
analytic cost model and the code generator all read this registry.

Layering: the registry sits below every stage (this package imports nothing of the project), so an `OpDef` names
its hooks as strings, and only the stage that owns a hook resolves it (`hook`), within its own package: the golden
reference resolves ``golden`` (an xgraph module), the code generator ``emitter`` (a codegen module), and so on.
No stage is imported by another through the registry; tests/test_ops_registry.py checks that each hook lives in
the layer that owns it (the golden reference in xgraph, never the emulator): tests/test_layering.py adds every
hook as an import arrow from its user (`HOOK_USERS`).
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Iterator, Mapping

from tvm_dpu.errors import DPUError

#: Hook -> the one module that resolves it. tests/test_layering.py counts each resolution as an import of the
#: hook's module by this module, so a hook outside the resolving stage's layer (a golden evaluator in the
#: emulator, an emitter reached from xgraph) fails the layering test like a plain import would.
HOOK_USERS = {
    "golden": "tvm_dpu.xgraph.golden",
    "float_ref": "tvm_dpu.xgraph.float_ref",
    "quant": "tvm_dpu.xgraph.ops",
    "fix_points": "tvm_dpu.quant.quantize",
    "cost": "tvm_dpu.timing.analytic",
    "work": "tvm_dpu.timing.analytic",
    "emitter": "tvm_dpu.codegen.compiler",
}


#: Relax patterns that lower to no op kind, with the reason (every other pattern belongs to one OpDef).
NON_OP_PATTERNS = {"dpu.reshape": "a free reshape ([N,K] <-> [N,K,1,1]): the lowering aliases its input"}


class OpRegistryError(DPUError, LookupError):
    """An op kind the registry does not know, or a hook an OpDef does not name."""


@dataclass(frozen=True)
class OpSpec:
    """Static XGraph description of one op kind: attributes (with defaults), inputs and parameter roles."""

    defaults: dict[str, Any] = field(default_factory=dict)
    required: tuple[str, ...] = ()
    n_inputs: tuple[int, int] = (1, 1)
    params: tuple[str, ...] = ()  # required roles
    optional_params: tuple[str, ...] = ()


@dataclass(frozen=True)
class OpDef:
    """Everything the pipeline knows about one XGraph op kind (its serialized `Op.type`).

    Hooks are references resolved by the stage that owns them (`hook`, `HOOK_USERS`): ``"function"`` in the
    user module itself, ``"module:function"`` in a sibling module of the user's package:
    golden ``fn(op, graph, *int8 inputs) -> int8 array`` (xgraph), float_ref the same in float64 (xgraph),
    quant ``fn(op, graph) -> quant.rules parameters`` (xgraph), fix_points ``fn(op) -> FixPointRule`` (what the
    quantizer ties the output fix_point to, quant.quantize), cost ``fn(machine, LayerDesc) -> LayerEstimate``
    (timing.analytic), emitter ``fn(prog, arch, graph, op, fmaps, alias, params, variant)`` (codegen).
    """

    kind: str
    spec: OpSpec
    golden: str
    float_ref: str
    quant: str
    fix_points: str
    cost: str
    work: str
    emitter: str | None  # None: the code generator has no emitter; `cpu_reason` must say why
    #: Names of this op in the DPU limit checks (arch.opdesc.OpDesc.kind): the kind itself plus the special cases
    #: the limits table checks separately (global average pooling, depthwise transposed conv).
    limit_kinds: tuple[str, ...] = ()
    #: Relax composite families (passes/patterns.py names, without a variant suffix) that lower to this kind.
    patterns: tuple[str, ...] = ()
    #: Relax operators passes/from_relax.py converts into this kind.
    relax_ops: tuple[str, ...] = ()
    #: Why this kind has no pattern / converter / emitter and stays on the CPU (None: it has all three).
    cpu_reason: str | None = None
    doc: str = ""
    #: The code emitter of each further instruction set ((set, hook reference) pairs, codegen.isa.ISA_FILES names):
    #: `emitter` serves DPUV2 (DPUCZDX8G ISA1); a set not named here has no lowering of this kind, and the
    #: family's limits profile keeps the kind on the CPU.
    isa_emitters: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in self.limit_kinds:
            object.__setattr__(self, "limit_kinds", (self.kind,) + tuple(self.limit_kinds))


def collect_defs(path: Any, package: str, cls: type, key: str, error: type[Exception], what: str) -> dict[str, Any]:
    """The module-level `cls` values of every module of package `package` (at `path`), keyed by their `key`
    attribute, modules in name order: how a registry is built from its modules. `error` when a key is defined
    twice."""
    out: dict[str, Any] = {}
    for info in sorted(pkgutil.iter_modules(path), key=lambda m: m.name):
        mod = importlib.import_module(f"{package}.{info.name}")
        for value in vars(mod).values():
            if isinstance(value, cls):
                name = getattr(value, key)
                if name in out and out[name] is not value:
                    raise error(f"{what} {name!r} is defined twice ({info.name} and another module)")
                out[name] = value
    return out


def lookup(table: Mapping[str, Any], name: str, error: type[Exception], what: str) -> Any:
    """`table[name]`; `error` naming the known names otherwise."""
    try:
        return table[name]
    except KeyError:
        raise error(f"unknown {what} {name!r} (known: {', '.join(table)})") from None


@cache
def _registry() -> dict[str, OpDef]:
    return collect_defs(__path__, __name__, OpDef, "kind", OpRegistryError, "op kind")


def registry() -> dict[str, OpDef]:
    """Op kind -> OpDef of every op the project knows (a fresh dict; the OpDefs are frozen)."""
    return dict(_registry())


def kinds() -> tuple[str, ...]:
    """Every registered XGraph op kind."""
    return tuple(_registry())


def get(kind: str) -> OpDef:
    """The OpDef of `kind`; OpRegistryError naming the known kinds otherwise."""
    return lookup(_registry(), kind, OpRegistryError, "op kind")


def limit_kinds() -> tuple[str, ...]:
    """Every kind name the DPU limit checks know (OpDesc.kind), each once."""
    return tuple(dict.fromkeys(k for d in _registry().values() for k in d.limit_kinds))


@cache
def resolve(ref: str, user: str) -> Any:
    """The object hook reference `ref` names for module `user` (imported on first use): ``"function"`` lives in
    `user` itself, ``"module:function"`` in a module of `user`'s package. A hook cannot name a module outside its
    user's package: that is what keeps the registry from creating an import across stages."""
    module, _, attr = ref.rpartition(":")
    package = user.rpartition(".")[0]
    target = f"{package}.{module}" if module else user
    try:
        return getattr(importlib.import_module(target), attr)
    except (ImportError, AttributeError) as e:
        raise OpRegistryError(f"hook {ref!r} (in {target}) does not resolve: {e}") from None


def ref_module(ref: str, user: str) -> str:
    """The module hook reference `ref`, resolved for module `user` (`resolve`), lives in."""
    module = ref.rpartition(":")[0]
    return f"{user.rpartition('.')[0]}.{module}" if module else user


def hook_module(name: str, ref: str) -> str:
    """The module hook `name`'s reference `ref` lives in."""
    return ref_module(ref, HOOK_USERS[name])


def hook(kind: str, name: str) -> Any:
    """Hook `name` (one of HOOK_USERS) of `kind`, resolved; OpRegistryError when the kind has none."""
    ref = getattr(get(kind), name)
    if ref is None:
        raise OpRegistryError(f"op kind {kind!r} has no {name} ({get(kind).cpu_reason or 'no reason given'})")
    return resolve(ref, HOOK_USERS[name])


def isa_emitter(kind: str, isa: str) -> Any:
    """The code emitter of `kind` for instruction set `isa` other than DPUV2 (OpDef.isa_emitters), resolved like
    the `emitter` hook; OpRegistryError naming the set when the kind has none for it."""
    ref = dict(get(kind).isa_emitters).get(isa)
    if ref is None:
        raise OpRegistryError(f"op kind {kind!r} has no {isa} emitter")
    return resolve(ref, HOOK_USERS["emitter"])


class HookTable(Mapping[str, Any]):
    """Op kind -> its resolved `name` hook, resolved on first access (so a stage's table never imports another
    stage's modules, and a hook that does not resolve fails where it is used, with its name)."""

    def __init__(self, name: str) -> None:
        if name not in HOOK_USERS:
            raise OpRegistryError(f"unknown hook {name!r} (known: {', '.join(HOOK_USERS)})")
        self.name = name

    def __getitem__(self, kind: str) -> Any:
        if kind not in _registry():
            raise KeyError(kind)
        return hook(kind, self.name)

    def __iter__(self) -> Iterator[str]:
        return iter(_registry())

    def __len__(self) -> int:
        return len(_registry())
