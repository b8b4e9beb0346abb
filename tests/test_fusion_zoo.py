"""Fusion on every REDUCED zoo model (resnet152 only with -m slow): Algorithm 1 == networkx VF2 on each DPU
XGraph, none >= greedy >= optimal in the cost model, and the programs of all three plans bit-exact against the
golden reference on B4096 and B1152."""
from __future__ import annotations

import warnings

import pytest

import tvm_dpu
from tvm_dpu import zoo
from tvm_dpu.arch import load_arch
from tvm_dpu.codegen.fused import FUSED_EMITTERS, emittable
from tvm_dpu.fusion import TEMPLATES, OpGraph, embeddings_vf2, find_embeddings
from tvm_dpu.fusion.select import MODES, plan_fusion
from conftest import emulator_vs_golden

ARCHS = ["DPUCZDX8G_ISA1_B4096", "DPUCZDX8G_ISA1_B1152"]


# resnet152 repeats resnet50's blocks (same templates, 3x the ops): full coverage runs with -m slow.
_MODELS = [pytest.param(m, marks=pytest.mark.slow) if m == "resnet152" else m for m in zoo.MODELS]


@pytest.fixture(scope="module", params=_MODELS)
def xgraphs(request):
    """The quantized DPU XGraphs of one reduced zoo model, as tvm_dpu.build makes them."""
    name = request.param
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = tvm_dpu.build(zoo.build_model(name, reduced=True), arch=ARCHS[0],
                              calibration=[zoo.random_input(name, reduced=True)], progress=False)
    graphs = [r.graph for r in model.runners.values()]
    assert graphs, f"{name}: no DPU subgraph"
    return name, graphs


def test_algorithm1_equals_vf2(xgraphs):
    name, graphs = xgraphs
    for g in graphs:
        og = OpGraph.of(g)
        nxg = og.to_networkx()
        for t in TEMPLATES:
            mine = sorted(tuple(sorted(e.items())) for e in find_embeddings(t, og))
            ref = sorted(tuple(sorted(e.items())) for e in embeddings_vf2(t, og, nxg))
            assert mine == ref, f"{name}/{g.name}: template {t.name}"


@pytest.mark.parametrize("arch_name", ARCHS)
def test_plans_ordered_and_bit_exact(xgraphs, arch_name):
    name, graphs = xgraphs
    arch = load_arch(arch_name)
    for g in graphs:
        compiled_plans = set()
        # all templates (non-emitted groups run member by member) and the plans compile_with_fusion makes
        for templates, accept in ((None, None), (FUSED_EMITTERS, emittable)):
            plans = {m: plan_fusion(g, arch, m, templates, accept) for m in MODES}
            assert plans["none"].cost >= plans["greedy"].cost >= plans["optimal"].cost, name
            for m, p in plans.items():
                key = (tuple(sorted(p.groups, key=lambda gr: gr.ops)), p.concat_fused)
                if key in compiled_plans:
                    continue  # greedy and optimal often agree: compile and run each distinct plan once
                compiled_plans.add(key)
                assert emulator_vs_golden(g, arch, p, seed=7).bad == 0, \
                    f"{name}/{g.name} on {arch_name}, plan {m} (templates {templates})"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50", "googlenet", "mobilenetv2"])
def test_full_size_optimal_bit_exact(name):
    """Full-size models: the optimal plan's program (fused emitters) equals the golden reference on B4096."""
    from tvm_dpu.fusion.select import compile_with_fusion

    arch = load_arch(ARCHS[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = tvm_dpu.build(zoo.build_model(name), arch=ARCHS[0], calibration=[zoo.random_input(name)],
                              progress=False)
    for r in model.runners.values():
        _, plan = compile_with_fusion(r.graph, arch, "optimal")
        assert plan.fused()
        assert emulator_vs_golden(r.graph, arch, plan, seed=7).bad == 0, f"{name}/{r.graph.name}"


@pytest.mark.parametrize("arch_name", ARCHS)
@pytest.mark.parametrize("tname", ["conv_pool", "pw_dw", "dw_pw", "conv_conv_pool"])
def test_every_conv_window_group_fused_bit_exact(xgraphs, arch_name, tname):
    """Every conv+pool (pointwise+depthwise, depthwise+pointwise, conv+conv+pool) of the model that the fused
    emitter accepts, all fused at once (whether or not the search picks them), is bit-exact: covers the strips /
    circular window buffer and dw_pw's several depthwise passes per tile on real layer shapes."""
    from tvm_dpu.types import SINGLE, FusionPlan, Group

    name, graphs = xgraphs
    arch = load_arch(arch_name)
    template = next(t for t in TEMPLATES if t.name == tname)
    for g in graphs:
        og = OpGraph.of(g)
        groups, used = [], set()
        for emb in find_embeddings(template, og):
            members = tuple(emb[v.key] for v in template.vertices)
            group = Group(tname, members)
            if used.isdisjoint(members) and emittable(group, g, arch):
                groups.append(group)
                used.update(members)
        if not groups:
            continue
        groups += [Group(SINGLE, (op.name,)) for op in g.ops if op.name not in used]
        assert emulator_vs_golden(g, arch, FusionPlan("manual", groups), seed=7).bad == 0, \
            f"{name}/{g.name} on {arch_name}"
