"""The fusion-template registry (tvm_dpu/templates/): every template complete (each hook resolves in its user's
package, or the template says why it has none), the views the stages read built from it, and the stages asking the
template rather than its name (a template registered under a new name compiles like the one whose hooks it names)."""
from __future__ import annotations

import inspect
from dataclasses import replace

import numpy as np
import pytest

import tvm_dpu.templates as tpl
from tvm_dpu.arch import load_arch
from tvm_dpu.codegen.compiler import compile_graph_fused
from tvm_dpu.codegen.fused import FUSED_EMITTERS, emittable
from tvm_dpu.fusion.cost import cost, tile_width
from tvm_dpu.fusion.templates import CONSTRAINTS, TEMPLATES
from tvm_dpu.ops import kinds as op_kinds
from tvm_dpu.templates import HOOK_USERS, TemplateDef, TemplateRegistryError, problems
from tvm_dpu.types import SINGLE, FusionPlan, Group
from test_fusion import _conv_pool_graph

#: Positional arguments each hook is called with (codegen.fused, codegen.compiler, timing.analytic).
HOOK_ARITY = {"fits": 3, "variants": 3, "emitter": 7, "cost": 4}


def test_every_template_is_complete():
    defs = tpl.registry()
    assert {"single", "conv_add", "hconv2", "hconv3", "dw_pw", "conv_conv", "conv_pool", "pw_dw", "pw_dw_pw",
            "pw_dw_pw_add", "resident", "resident_seq"} <= set(defs)
    bad = [p for d in defs.values() for p in problems(d)]
    assert not bad, "\n".join(bad)
    for name, d in defs.items():
        assert d.name == name and tpl.get(name) is d
        for hook in HOOK_USERS:
            if getattr(d, hook) is not None:
                fn = tpl.hook(name, hook)
                inspect.signature(fn).bind(*range(HOOK_ARITY[hook]))  # callable the way its user calls it


def test_checker_fails_on_a_missing_or_unresolved_hook():
    """The completeness check itself: a template missing a hook without a reason, or naming a hook that does not
    resolve (no function, no module, a module outside its user's package), is reported."""
    good = tpl.get("conv_pool")
    assert problems(good) == []
    missing = problems(replace(good, name="probe", emitter=None))
    assert len(missing) == 1 and "probe" in missing[0] and "no emitter hook" in missing[0]
    assert problems(replace(good, emitter=None, missing={"emitter": "emitted by its ops"})) == []
    for ref in ("fused_conv_pool:no_such_emitter", "no_such_module:emit_group", "emit_group"):
        found = problems(replace(good, name="probe", emitter=ref))
        assert len(found) == 1 and "does not resolve" in found[0] and ref in found[0], ref
    both = problems(replace(good, name="probe", fits="fused_conv_pool:group_fits", missing={"fits": "why"}))
    assert both and "reason" in both[0]


def test_unknown_names_and_absent_hooks_are_clear_errors():
    with pytest.raises(TemplateRegistryError, match="unknown fusion template 'nope'.*conv_add"):
        tpl.get("nope")
    with pytest.raises(TemplateRegistryError, match="'single' has no emitter hook .*its op's emitter"):
        tpl.hook(SINGLE, "emitter")
    with pytest.raises(TemplateRegistryError, match="'resident' has no cost hook .*simulator"):
        tpl.hook("resident", "cost")


def test_stage_views_come_from_the_registry():
    """The search's templates, the emitters it may choose and the resident chains are the registry's, in priority
    order, and every pattern uses known op types and constraints."""
    defs = tpl.registry()
    assert [t.name for t in TEMPLATES] == [d.name for d in defs.values() if d.pattern is not None]
    assert [d.priority for d in defs.values()] == sorted({d.priority for d in defs.values()})  # unique, ordered
    assert set(FUSED_EMITTERS) == {t.name for t in TEMPLATES}
    assert tpl.residents() == ("resident", "resident_seq")
    for t in TEMPLATES:
        for vertex in t.vertices:
            assert vertex.types <= set(op_kinds()) | {"input"}, (t.name, vertex.key)
            assert set(vertex.constraints) <= set(CONSTRAINTS), (t.name, vertex.key)
        keys = {vertex.key for vertex in t.vertices}
        assert all(a in keys and b in keys for a, b in t.edges), t.name
    for d in defs.values():
        assert (d.pattern is None) == (d.resident or d.name == SINGLE), d.name


def test_a_new_registration_is_all_a_template_needs(monkeypatch):
    """Registered under another name with conv_pool's hooks and policies, a template is matched, costed, fitted
    and compiled like conv_pool, to the same bytes: no stage dispatches on the name."""
    g = _conv_pool_graph(16, 20, 18, 16, 3, 1, 1, "max_pool2d", 2, 2, 0, seed=1)
    arch = load_arch("DPUCZDX8G_ISA1_B1152")
    members = tuple(op.name for op in g.ops)
    monkeypatch.setitem(tpl._registry(), "my_conv_pool", replace(tpl.get("conv_pool"), name="my_conv_pool",
                                                                 priority=55))
    mine, theirs = Group("my_conv_pool", members), Group("conv_pool", members)
    assert emittable(mine, g, arch) and emittable(theirs, g, arch)
    assert tile_width(members, "my_conv_pool", g, arch) == tile_width(members, "conv_pool", g, arch) is not None
    assert cost(mine, g, arch) == cost(theirs, g, arch)
    a = compile_graph_fused(g, arch, FusionPlan("manual", [mine]))
    b = compile_graph_fused(g, arch, FusionPlan("manual", [theirs]))
    assert np.array_equal(a.code, b.code) and a.instr_counts == b.instr_counts
    # and a policy change is honoured: without its on-chip map the conv's output gets a DDR place
    monkeypatch.setitem(tpl._registry(), "my_conv_pool", replace(tpl.get("my_conv_pool"), on_chip=False))
    assert g.ops[0].outputs[0] in compile_graph_fused(g, arch, FusionPlan("manual", [mine])).places
    assert g.ops[0].outputs[0] not in b.places


def test_templatedef_is_frozen_data():
    d = tpl.get("conv_add")
    assert isinstance(d, TemplateDef)
    with pytest.raises(AttributeError):
        d.name = "x"  # type: ignore[misc]
