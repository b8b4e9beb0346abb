"""The op registry (tvm_dpu/ops/): built from its modules, complete across the pipeline, and the one source the
stages dispatch through."""
from __future__ import annotations

import ast
import inspect
import json
from pathlib import Path

import numpy as np
import pytest

from tvm_dpu import ops as registry
from tvm_dpu.arch.opdesc import OP_KINDS
from tvm_dpu.ops import HOOK_USERS, NON_OP_PATTERNS, OpDef, OpRegistryError, OpSpec
from tvm_dpu.xgraph import golden
from tvm_dpu.xgraph.graph import Graph, GraphError, Op, Tensor
from tvm_dpu.xgraph.ops import OP_SPECS

LIMITS_JSON = Path(registry.__file__).resolve().parent.parent / "arch" / "limits.json"


def _family(pattern: str, defs: list[OpDef]) -> str | None:
    """The kind whose pattern family is the longest prefix of composite name `pattern`."""
    best = None
    for d in defs:
        for fam in d.patterns:
            if (pattern == fam or pattern.startswith(fam + "_")) and (best is None or len(fam) > len(best[1])):
                best = (d.kind, fam)
    return best[0] if best else None


def _lowered_relax_ops() -> set[str]:
    """The Relax operators passes/from_relax.py's builder dispatches on (read from its source)."""
    from tvm_dpu.passes import from_relax
    names: set[str] = set(from_relax._CONV_OPS) | set(from_relax._ACTS)
    tree = ast.parse(inspect.getsource(from_relax))
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id == "name":
            for c in ast.walk(node.comparators[0]):
                if isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value.startswith("relax."):
                    names.add(c.value)
    return names


def missing_stages(defs: list[OpDef], patterns: list[str], lowered: set[str]) -> list[str]:
    """What each kind without a declared cpu_reason lacks: a pattern, a Relax converter, an emitter."""
    out = []
    for d in defs:
        if d.cpu_reason:
            continue
        if not any(_family(p, [d]) == d.kind for p in patterns):
            out.append(f"{d.kind}: no pattern in the table")
        if not d.relax_ops or any(r not in lowered for r in d.relax_ops):
            out.append(f"{d.kind}: no converter for {[r for r in d.relax_ops if r not in lowered] or 'it'}")
        if d.emitter is None:
            out.append(f"{d.kind}: no emitter")
    return out


def test_registry_is_built_from_the_modules():
    defs = registry.registry()
    assert set(defs) == set(OP_SPECS) == set(golden.EVALUATORS)
    assert {"conv2d", "depthwise_conv2d", "dense", "max_pool2d", "eltwise_mul", "activation"} <= set(defs)
    # the kinds the limits check know are the registry's: each XGraph kind plus its declared special cases (on
    # main: 11 XGraph kinds and 13 limit kinds, two vocabularies kept by hand)
    assert set(OP_KINDS) == set(defs) | {"global_avg_pool", "depthwise_conv2d_transpose"}
    assert len(OP_KINDS) == len(set(OP_KINDS))
    for kind, d in defs.items():
        assert d.kind == kind and OP_SPECS[kind] is d.spec
        assert registry.get(kind) is d


def test_every_limit_kind_has_rules_in_every_profile():
    profiles = json.loads(LIMITS_JSON.read_text())["profiles"]
    for name, prof in profiles.items():
        rules = prof.get("ops", prof)
        lacking = [k for k in OP_KINDS if k not in rules]
        assert not lacking, f"profile {name}: no limit rules for {lacking}"


def test_every_kind_has_a_pattern_a_converter_and_an_emitter():
    from tvm_dpu.passes.patterns import pattern_names
    names = pattern_names()
    defs = list(registry.registry().values())
    assert missing_stages(defs, names, _lowered_relax_ops()) == []
    # the pattern table is keyed by the same kinds: every pattern belongs to exactly one kind or says why not
    orphans = [p for p in names if _family(p, defs) is None and p not in NON_OP_PATTERNS]
    assert orphans == []


def test_a_kind_lacking_a_stage_is_reported_unless_it_says_why():
    planted = OpDef("rot90", OpSpec(), golden="m:f", float_ref="m:f", quant="m:f", fix_points="m:f", cost="m:f",
                    work="m:f", emitter=None, patterns=("dpu.rot90",), relax_ops=("relax.rot90",))
    got = missing_stages([planted], ["dpu.conv2d"], {"relax.nn.conv2d"})
    assert got == ["rot90: no pattern in the table", "rot90: no converter for ['relax.rot90']", "rot90: no emitter"]
    on_cpu = OpDef("rot90", OpSpec(), golden="m:f", float_ref="m:f", quant="m:f", fix_points="m:f", cost="m:f",
                   work="m:f", emitter=None, cpu_reason="the DPU has no rotation")
    assert missing_stages([on_cpu], [], set()) == []


@pytest.mark.parametrize("kind", registry.kinds())
def test_every_hook_resolves_in_the_package_of_its_stage(kind):
    d = registry.get(kind)
    assert d.limit_kinds[0] == kind
    for name, user in HOOK_USERS.items():
        ref = getattr(d, name)
        if ref is None:
            assert d.cpu_reason, f"{kind}: no {name} and no cpu_reason"
            continue
        fn = registry.hook(kind, name)
        assert callable(fn) and fn.__module__ == registry.hook_module(name, ref)
        assert fn.__module__.rpartition(".")[0] == user.rpartition(".")[0], (kind, name, ref)
    assert registry.hook(kind, "golden").__module__.startswith("tvm_dpu.xgraph.golden")


def test_unknown_kind_is_one_clear_error():
    with pytest.raises(OpRegistryError, match="unknown op kind 'rot90'.*known: .*conv2d"):
        registry.get("rot90")
    with pytest.raises(OpRegistryError, match="does not resolve"):
        registry.resolve("golden_misc:no_such_evaluator", "tvm_dpu.xgraph.golden")
    g = Graph("g")
    g.add_tensor(Tensor("x", (1, 1, 2, 2), "int8", 0))
    g.add_tensor(Tensor("y", (1, 1, 2, 2), "int8", 0))
    op = Op("r", "rot90", ["x"], ["y"])
    with pytest.raises(GraphError, match="unsupported op type 'rot90'"):
        golden.run_op(op, g, {"x": np.zeros((1, 1, 2, 2), np.int8)})


def test_codegen_dispatches_through_the_registry(monkeypatch):
    """An op kind's emitter is whatever its OpDef names: point upsample at a spy and the compiler calls it."""
    from tvm_dpu.codegen import compiler
    calls = []
    monkeypatch.setattr(compiler, "emit_spy", lambda prog, arch, graph, op, *rest: calls.append((op.name, op.type)),
                        raising=False)
    d = registry.get("upsample_nearest")
    monkeypatch.setitem(registry._registry(), "upsample_nearest", OpDef(**{**d.__dict__, "emitter": "emit_spy"}))
    g = Graph("g")
    g.add_tensor(Tensor("x", (1, 1, 2, 2), "int8", 0))
    g.add_tensor(Tensor("y", (1, 1, 4, 4), "int8", 0))
    op = Op("u", "upsample_nearest", ["x"], ["y"], attrs={"scale": [2, 2]})
    compiler._emit_op(None, None, g, op, {}, {}, None)
    assert calls == [("u", "upsample_nearest")]
