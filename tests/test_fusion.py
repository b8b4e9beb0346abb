"""Kernel fusion: templates found by Algorithm 1 == networkx VF2, plans none <= greedy <= optimal in the cost
model, and every plan's program is bit-exact against the golden reference on the emulator."""
from __future__ import annotations

import numpy as np
import pytest

from tvm_dpu.arch import load_arch
from tvm_dpu.codegen.compiler import compile_graph_fused
from tvm_dpu.codegen.fused import emittable
from tvm_dpu.fusion.cost import cost, tile_width
from tvm_dpu.fusion.isomorphism import embeddings_vf2, find_embeddings
from tvm_dpu.fusion.opgraph import OpGraph
from tvm_dpu.errors import FusionError
from tvm_dpu.fusion.select import MODES, plan_fusion
from tvm_dpu.types import SINGLE, FusionPlan, Group
from tvm_dpu.fusion.templates import TEMPLATES
from tvm_dpu.xgraph import Graph
from tvm_dpu.xgraph.validate import validate_graph
from conftest import emulator_vs_golden
from test_codegen import _B

ARCHS = ["DPUCZDX8G_ISA1_B4096", "DPUCZDX8G_ISA1_B1152"]


def _block() -> Graph:
    """Every template at least once: conv+pool, conv+conv, a residual add, convs sharing an input, a concat."""
    b = _B(3)
    x = b.input(16, 20, 18)
    c1 = b.conv(x, 24, 3, p=1)
    c2 = b.conv(c1, 24, 3, p=1, act="none")
    s = b.conv(x, 24, 1, act="none")
    a = b.op("eltwise_add", [c2, s], b.shape(c2), 2, act="relu")
    p = b.op("max_pool2d", [b.conv(a, 16, 3, p=1)], (1, 16, 10, 9), 3, kernel=[2, 2], strides=[2, 2])
    h1 = b.conv(p, 8, 1)
    h2 = b.conv(p, 8, 1)
    out = b.op("concat", [h1, h2], (1, 16, 10, 9), 3)
    b.g.outputs = [out]
    validate_graph(b.g)
    return b.g


def test_algorithm1_equals_vf2_on_block():
    og = OpGraph.of(_block())
    found = 0
    for t in TEMPLATES:
        mine = sorted(tuple(sorted(e.items())) for e in find_embeddings(t, og))
        ref = sorted(tuple(sorted(e.items())) for e in embeddings_vf2(t, og))
        assert mine == ref, t.name
        found += bool(mine)
    assert found >= 4  # conv_pool, conv_conv, conv_add, hconv2 all occur


@pytest.mark.parametrize("arch_name", ARCHS)
def test_block_plans_bit_exact_and_ordered(arch_name):
    g, arch = _block(), load_arch(arch_name)
    plans = {m: plan_fusion(g, arch, m) for m in MODES}
    assert plans["none"].cost >= plans["greedy"].cost >= plans["optimal"].cost
    assert plans["optimal"].fused(), "no fusion chosen on a block made of templates"
    assert {gr.template for gr in plans["optimal"].fused()} & {"conv_add", "conv_pool", "conv_conv"}
    for m, p in plans.items():
        assert emulator_vs_golden(g, arch, p).bad == 0, m


def test_none_plan_is_the_unfused_compiler_and_aliases_concats():
    """The "none" baseline is what the unfused compiler emits, concat inputs saved into their slices (no copy):
    a baseline paying copies the compiler never makes would inflate every fusion speedup."""
    from tvm_dpu.codegen.compiler import compile_graph

    g, arch = _block(), load_arch(ARCHS[0])
    plan = plan_fusion(g, arch, "none")
    assert plan.concat_fused and not plan.fused()
    none = compile_graph_fused(g, arch, plan)
    assert np.array_equal(none.code, compile_graph(g, arch).code)
    opt = compile_graph_fused(g, arch, plan_fusion(g, arch, "optimal"))
    assert none.instr_counts["SAVE"] > opt.instr_counts["SAVE"]  # the fused groups keep intermediates on chip


def test_conv_add_fused_keeps_intermediate_on_chip():
    b = _B(5)
    x = b.input(16, 12, 12)
    c = b.conv(x, 16, 3, p=1, act="none")
    a = b.op("eltwise_add", [x, c], b.shape(c), 2, act="relu")  # the conv is the add's SECOND operand
    b.g.outputs = [a]
    arch = load_arch(ARCHS[1])
    fused = Group("conv_add", tuple(op.name for op in b.g.ops))
    plan = FusionPlan("manual", [fused])
    compiled = compile_graph_fused(b.g, arch, plan)
    assert compiled.instr_counts.get("ELEW", 0) > 0
    assert emulator_vs_golden(b.g, arch, plan, seed=1).bad == 0
    unfused = compile_graph_fused(b.g, arch, plan_fusion(b.g, arch, "none"))
    assert compiled.instr_counts["SAVE"] < unfused.instr_counts["SAVE"]  # the conv's output is never saved


def test_cost_model_rewards_fusion_and_tiling_rejects_oversize():
    g, arch = _block(), load_arch(ARCHS[0])
    conv, add = [op.name for op in g.ops if op.type in ("conv2d", "eltwise_add")][1], \
        next(op.name for op in g.ops if op.type == "eltwise_add")
    alone = cost(Group(SINGLE, (conv,)), g, arch) + cost(Group(SINGLE, (add,)), g, arch)
    assert cost(Group("conv_add", (conv, add)), g, arch) < alone
    assert tile_width((conv, add), "conv_add", g, arch) is not None
    b = _B(1)
    x = b.input(1024, 4, 4)
    b.conv(b.conv(x, 512, 3, p=1), 512, 3, p=1)
    names = tuple(op.name for op in b.g.ops)
    assert tile_width(names, "conv_conv", b.g, arch) is None  # 2 x 3x3x1024 weights cannot both stay resident


def test_bad_plans_are_rejected():
    g, arch = _block(), load_arch(ARCHS[0])
    with pytest.raises(FusionError, match="mode"):
        plan_fusion(g, arch, "fastest")
    half = FusionPlan("manual", [Group(SINGLE, (g.ops[0].name,))])
    with pytest.raises(FusionError, match="in no group"):
        compile_graph_fused(g, arch, half)


def _manual(graph: Graph, template: str, names: list[str]) -> FusionPlan:
    rest = [Group(SINGLE, (op.name,)) for op in graph.ops if op.name not in names]
    return FusionPlan("manual", [Group(template, tuple(names))] + rest)


@pytest.mark.parametrize("arch_name", ARCHS)
def test_hconv3_loads_input_once_and_is_exact(arch_name):
    b = _B(11)
    x = b.input(20, 14, 13)
    outs = [b.conv(x, co, 1, act=act) for co, act in ((8, "relu"), (24, "none"), (40, "relu"))]
    b.g.outputs = outs
    arch = load_arch(arch_name)
    plan = _manual(b.g, "hconv3", [op.name for op in b.g.ops])
    fused = compile_graph_fused(b.g, arch, plan)
    alone = compile_graph_fused(b.g, arch, plan_fusion(b.g, arch, "none"))
    # bytes, not LOAD instructions: the lone 1x1 convs' raster-order tiles take fewer, longer LOADs
    from tvm_dpu.timing.simulate import simulate
    assert simulate(fused.code, arch).ddr_read_bytes < simulate(alone.code, arch).ddr_read_bytes
    assert emulator_vs_golden(b.g, arch, plan, seed=2).bad == 0


@pytest.mark.parametrize("arch_name", ARCHS)
def test_dw_pw_keeps_depthwise_output_on_chip(arch_name):
    b = _B(13)
    x = b.input(30, 17, 15)
    dw = b.op("depthwise_conv2d", [x], (1, 30, 9, 8), 4,
              {"weights": b.const((30, 1, 3, 3), 6), "bias": b.const((30,), 4)},
              strides=[2, 2], pads=[1, 1, 1, 1], act="relu6")
    pw = b.conv(dw, 20, 1, act="none")
    b.g.outputs = [pw]
    validate_graph(b.g)
    arch = load_arch(arch_name)
    plan = _manual(b.g, "dw_pw", [op.name for op in b.g.ops])
    fused = compile_graph_fused(b.g, arch, plan)
    alone = compile_graph_fused(b.g, arch, plan_fusion(b.g, arch, "none"))
    assert fused.instr_counts["SAVE"] < alone.instr_counts["SAVE"]
    assert emulator_vs_golden(b.g, arch, plan, seed=3).bad == 0


def test_optimal_falls_back_to_greedy_when_the_search_is_worse(monkeypatch):
    from tvm_dpu.fusion import select

    g, arch = _block(), load_arch(ARCHS[0])
    greedy = plan_fusion(g, arch, "greedy")
    # a search that fuses nothing is worse than greedy on this block: the plan must be greedy's, counted
    monkeypatch.setattr(select._Search, "run", lambda self: ([Group(SINGLE, (op.name,)) for op in g.ops], 1))
    plan = plan_fusion(g, arch, "optimal")
    assert plan.stats["fallback"] == 1
    assert plan.cost == greedy.cost and plan.groups == greedy.groups


@pytest.mark.parametrize("arch_name", ARCHS)
def test_singles_with_legal_concats_reproduce_compile_graph(arch_name):
    from tvm_dpu.codegen.compiler import compile_graph
    from tvm_dpu.codegen.compiler import concat_fusions

    g, arch = _block(), load_arch(arch_name)
    plan = FusionPlan("manual", [Group(SINGLE, (op.name,)) for op in g.ops], concat_fusions(g))
    a, b = compile_graph(g, arch), compile_graph_fused(g, arch, plan)
    assert np.array_equal(a.code, b.code) and np.array_equal(a.params, b.params)
    assert a.region_sizes == b.region_sizes


@pytest.mark.parametrize("arch_name", ARCHS)
def test_conv_then_pointwise_keeps_intermediate_on_chip(arch_name):
    b = _B(17)
    x = b.input(24, 15, 19)
    mid = b.conv(x, 28, 3, s=2, p=1)
    out = b.conv(mid, 36, 1, act="none")
    b.g.outputs = [out]
    arch = load_arch(arch_name)
    names = [op.name for op in b.g.ops]
    plan = _manual(b.g, "conv_conv", names)
    fused = compile_graph_fused(b.g, arch, plan)
    alone = compile_graph_fused(b.g, arch, plan_fusion(b.g, arch, "none"))
    assert fused.instr_counts["SAVE"] < alone.instr_counts["SAVE"]
    assert emulator_vs_golden(b.g, arch, plan, seed=4).bad == 0
    from tvm_dpu.codegen.fused import emittable

    assert emittable(plan.groups[0], b.g, arch)


def _conv_conv_graph(cin: int, h: int, w: int, cmid: int, ka: int, sa: int, pa: int, cout: int, kb: int, sb: int,
                     pb: int, seed: int) -> Graph:
    b = _B(seed)
    x = b.input(cin, h, w)
    out = b.conv(b.conv(x, cmid, ka, s=sa, p=pa), cout, kb, s=sb, p=pb, act="none")
    b.g.outputs = [out]
    validate_graph(b.g)
    return b.g


CONV_WINDOW_CASES = [  # (cin, h, w, cmid, A k, s, pad, cout, B k, s, pad)
    (16, 20, 18, 24, 3, 1, 1, 24, 3, 1, 1),  # VGG: 3x3 after 3x3
    (40, 14, 14, 16, 1, 1, 0, 16, 3, 1, 1),  # ResNet bottleneck: 1x1 reduce -> 3x3
    (24, 15, 13, 40, 1, 1, 0, 20, 5, 1, 2),  # GoogLeNet: 1x1 reduce -> 5x5
    (8, 37, 19, 28, 3, 1, 1, 36, 3, 2, 1),  # tall (the buffer wraps), B strided, channels over several groups
    (12, 21, 23, 20, 3, 2, 1, 16, 3, 2, 0),  # both strided, B unpadded
    (24, 9, 130, 16, 1, 1, 0, 20, 3, 1, 1),  # wide: several column strips with halo columns
    (8, 26, 17, 20, 3, 1, 0, 12, 7, 1, 3),  # 7x7 second conv: each window reads 3 wraps
    (16, 100, 120, 24, 3, 1, 1, 16, 3, 1, 1),  # tall and wide: the circular buffer wraps around
    (8, 90, 100, 28, 3, 1, 1, 36, 3, 2, 1),  # ... with a strided B
    (256, 12, 64, 16, 1, 1, 0, 16, 3, 1, 1),  # A's input window too wide for VB0: A in column pieces
    (128, 10, 90, 16, 3, 1, 1, 16, 3, 1, 1),  # ... pieces of a 3x3 A (input halo columns per piece)
    (3, 20, 30, 16, 3, 1, 1, 16, 3, 1, 1),  # VGG conv1_1 + conv1_2: A channel-augmented (3 channels)
    (3, 17, 41, 24, 7, 2, 3, 16, 3, 1, 1),  # 7x7/2 over 3 channels, augmented
]


@pytest.mark.parametrize("arch_name", ARCHS)
@pytest.mark.parametrize("case", range(len(CONV_WINDOW_CASES)))
def test_conv_then_windowed_conv_keeps_intermediate_on_chip(arch_name, case):
    """emit_conv_window: bit-exact against the golden reference (as the unfused program is), and A's output is
    neither saved nor reloaded: the fused program moves only x, the weights and B's output."""
    g, arch = _conv_conv_graph(*CONV_WINDOW_CASES[case], seed=40 + case), load_arch(arch_name)
    plan = _manual(g, "conv_conv", [op.name for op in g.ops])
    assert emittable(plan.groups[0], g, arch)
    fused = compile_graph_fused(g, arch, plan)
    unfused_plan = plan_fusion(g, arch, "none")
    unfused = compile_graph_fused(g, arch, unfused_plan)
    assert emulator_vs_golden(g, arch, plan, seed=case).bad == 0
    assert emulator_vs_golden(g, arch, unfused_plan, seed=case).bad == 0
    mid = g.ops[0].outputs[0]
    assert mid not in {b.name for b in fused.outputs}
    from tvm_dpu.codegen.isa import decode_program
    from tvm_dpu.types import REG_PARAMS

    instrs = decode_program(fused.code)
    _, cout, ho, wo = g.tensors[g.outputs[0]].shape
    # every SAVE writes B's output, each pixel once
    assert sum(i["length"] * i["channel"] for i in instrs if i.name == "SAVE") == ho * wo * cout
    assert {i["reg_id"] for i in instrs if i.name == "SAVE"} == {fused.outputs[0].fmap.reg_id}
    # every image LOAD reads x
    assert {i["reg_id"] for i in instrs if i.name == "LOAD"} - {REG_PARAMS} == {fused.inputs[0].fmap.reg_id}
    assert fused.instr_counts["SAVE"] < unfused.instr_counts["SAVE"]


def test_windowed_conv_conv_needs_both_weights_resident():
    """The template matches 3x3 after 3x3 at any width, but the emitter keeps both convs' weights in CONVW: too
    many channels and it is not emittable (compiled member by member, same values)."""
    g = _conv_conv_graph(256, 6, 6, 256, 3, 1, 1, 256, 3, 1, 1, seed=5)
    arch = load_arch(ARCHS[1])
    plan = _manual(g, "conv_conv", [op.name for op in g.ops])
    assert not emittable(plan.groups[0], g, arch)
    assert emulator_vs_golden(g, arch, plan).bad == 0


def _conv_pool_graph(cin: int, h: int, w: int, cout: int, k: int, s: int, p: int, pool: str, pk: int, ps: int,
                     pp: int, seed: int) -> Graph:
    b = _B(seed)
    x = b.input(cin, h, w)
    c = b.conv(x, cout, k, s=s, p=p)
    _, _, hc, wc = b.shape(c)
    ho, wo = (hc + 2 * pp - pk) // ps + 1, (wc + 2 * pp - pk) // ps + 1
    out = b.op(pool, [c], (1, cout, ho, wo), 3, kernel=[pk, pk], strides=[ps, ps], pads=[pp, pp, pp, pp])
    b.g.outputs = [out]
    validate_graph(b.g)
    return b.g


CONV_POOL_CASES = [  # (cin, h, w, cout, k, s, p, pool, pool k, pool s, pool pad)
    (3, 40, 38, 16, 7, 2, 3, "max_pool2d", 3, 2, 1),  # ResNet stem shape, reduced
    (16, 20, 18, 16, 3, 1, 1, "max_pool2d", 2, 2, 0),
    (8, 37, 19, 24, 3, 1, 1, "max_pool2d", 3, 2, 1),  # tall: the circular window buffer wraps
    (16, 14, 14, 32, 1, 1, 0, "max_pool2d", 3, 1, 1),  # stride-1 pool (GoogLeNet inception branch)
    (32, 28, 28, 40, 3, 1, 1, "avg_pool2d", 3, 2, 1),
    (24, 9, 130, 16, 3, 1, 1, "max_pool2d", 3, 2, 1),  # wide: several column strips with halo columns
]


@pytest.mark.parametrize("arch_name", ARCHS)
@pytest.mark.parametrize("case", range(len(CONV_POOL_CASES)))
def test_conv_pool_fused_bit_exact(arch_name, case):
    g, arch = _conv_pool_graph(*CONV_POOL_CASES[case], seed=case), load_arch(arch_name)
    group = Group("conv_pool", tuple(op.name for op in g.ops))
    assert emittable(group, g, arch)
    plan = FusionPlan("manual", [group])
    compiled = compile_graph_fused(g, arch, plan)
    conv_out = g.ops[0].outputs[0]
    assert conv_out not in {b.name for b in compiled.outputs}
    assert emulator_vs_golden(g, arch, plan, seed=case).bad == 0
    unfused = compile_graph_fused(g, arch, plan_fusion(g, arch, "none"))
    assert compiled.instr_counts["SAVE"] < unfused.instr_counts["SAVE"]  # the conv's output is never saved


POOL_ON_SAVE_CASES = [  # (arch, cin, h, w, cout, k, s, p, pool): a 2x2 stride-2 pool after the conv
    ("DPUCZDX8G_ISA1_B1152", 16, 18, 22, 24, 3, 1, 1, "max_pool2d"),  # last row tile of 2 rows
    ("DPUCZDX8G_ISA1_B4096", 40, 16, 16, 30, 3, 1, 1, "avg_pool2d"),
    ("DPUCZDX8G_ISA1_B1152", 516, 14, 14, 40, 3, 1, 1, "max_pool2d"),  # group swap, two weight chunks
    ("DPUCZDX8G_ISA1_B1152", 64, 8, 200, 30, 3, 1, 1, "max_pool2d"),  # ring, two column tiles
    ("DPUCZDX8G_ISA1_B4096", 24, 24, 24, 300, 3, 2, 1, "max_pool2d"),  # strided conv, 19 output groups
]


@pytest.mark.parametrize("case", range(len(POOL_ON_SAVE_CASES)))
def test_pool_on_save_is_bit_exact_and_costs_no_conv(case):
    """conv -> 2x2/2 pool as the conv's own tiles, pooled in the banks (conv.PoolOnSave): every CONV the conv
    alone has and no more, only the pooled rows saved, one ALU per pair of conv rows; the emulator equals the
    golden reference."""
    from tvm_dpu.codegen.fused_conv_pool import _pools_on_save

    arch_name, cin, h, w, cout, k, s, p, pool = POOL_ON_SAVE_CASES[case]
    g, arch = _conv_pool_graph(cin, h, w, cout, k, s, p, pool, 2, 2, 0, seed=case), load_arch(arch_name)
    group = Group("conv_pool", tuple(op.name for op in g.ops))
    assert emittable(group, g, arch)
    plan = FusionPlan("manual", [group])
    assert emulator_vs_golden(g, arch, plan, seed=case).bad == 0
    fused = compile_graph_fused(g, arch, plan).instr_counts
    alone = compile_graph_fused(g, arch, plan_fusion(g, arch, "none")).instr_counts
    assert fused["CONV"] == alone["CONV"]
    assert fused["SAVE"] < alone["SAVE"]
    assert _pools_on_save(arch, g, g.ops[0], g.ops[1])
    assert fused["ALU"] >= g.tensors[g.ops[1].outputs[0]].shape[2]  # one ALU per pooled row (per column tile)


def test_pointwise_conv_keeps_the_chain_for_its_pool():
    """A pointwise conv alone takes flat tiles, which a pool cannot follow: conv -> 2x2 pool fuses through the
    circular buffer as before, not as PoolOnSave (no ALU per pair of conv rows in place)."""
    from tvm_dpu.codegen.fused_conv_pool import _pools_on_save

    g, arch = _conv_pool_graph(24, 12, 12, 40, 1, 1, 0, "max_pool2d", 2, 2, 0, seed=1), load_arch(ARCHS[1])
    assert not _pools_on_save(arch, g, g.ops[0], g.ops[1])
    g3 = _conv_pool_graph(24, 12, 12, 40, 3, 1, 1, "max_pool2d", 2, 2, 0, seed=1)
    assert _pools_on_save(arch, g3, g3.ops[0], g3.ops[1])


def test_conv_pool_is_chosen_and_faster_in_the_timing_model(monkeypatch):
    """ResNet-50 stem (conv7x7s2 + maxpool3x3s2 at 224x224): the search picks the fused group and the timing
    model agrees it is faster than the ops alone (the same conv alone: without the channel augmentation of the
    lone first-layer conv, which the fused emitter does not do and which makes the ops alone faster)."""
    from tvm_dpu.codegen import compiler
    from tvm_dpu.fusion.select import compile_with_fusion
    from tvm_dpu.timing.simulate import simulate_subgraph

    monkeypatch.setattr(compiler, "input_augmentation", lambda *a: None)

    g, arch = _conv_pool_graph(3, 224, 224, 64, 7, 2, 3, "max_pool2d", 3, 2, 1, seed=3), load_arch(ARCHS[0])
    fused, plan = compile_with_fusion(g, arch, "optimal")
    assert [gr.template for gr in plan.fused()] == ["conv_pool"]
    unfused, _ = compile_with_fusion(g, arch, "none")
    assert simulate_subgraph(fused).cycles < simulate_subgraph(unfused).cycles
    assert tile_width(tuple(op.name for op in g.ops), "conv_pool", g, arch) is not None


def _pw_dw_graph(cin: int, h: int, w: int, cmid: int, k: int, s: int, p: int, seed: int) -> Graph:
    """MobileNetV2 expansion: pointwise conv then depthwise conv (relu6)."""
    b = _B(seed)
    x = b.input(cin, h, w)
    e = b.conv(x, cmid, 1)
    ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    out = b.op("depthwise_conv2d", [e], (1, cmid, ho, wo), 4,
               {"weights": b.const((cmid, 1, k, k), 6), "bias": b.const((cmid,), 4)},
               strides=[s, s], pads=[p, p, p, p], groups=cmid, act="relu6")
    b.g.outputs = [out]
    validate_graph(b.g)
    return b.g


PW_DW_CASES = [  # (cin, h, w, expanded channels, dw k, dw s, dw pad)
    (16, 20, 18, 96, 3, 1, 1),
    (24, 17, 15, 144, 3, 2, 1),
    (8, 9, 40, 30, 3, 2, 1),  # channels not a multiple of ICP
    (160, 7, 7, 960, 3, 1, 1),  # MobileNetV2's widest expansion
]


@pytest.mark.parametrize("arch_name", ARCHS)
@pytest.mark.parametrize("case", range(len(PW_DW_CASES)))
def test_pw_dw_fused_bit_exact(arch_name, case):
    g, arch = _pw_dw_graph(*PW_DW_CASES[case], seed=case), load_arch(arch_name)
    group = Group("pw_dw", tuple(op.name for op in g.ops))
    assert emittable(group, g, arch)
    plan = FusionPlan("manual", [group])
    compiled = compile_graph_fused(g, arch, plan)
    assert emulator_vs_golden(g, arch, plan, seed=case).bad == 0
    from tvm_dpu.timing.simulate import simulate_subgraph

    unfused = compile_graph_fused(g, arch, plan_fusion(g, arch, "none"))
    # the expansion never goes to DDR and back (the weights and the input are read once either way)
    assert simulate_subgraph(compiled).ddr_write_bytes < simulate_subgraph(unfused).ddr_write_bytes


def test_pw_dw_faster_in_the_timing_model():
    """MobileNetV2 block 2 expansion (24 -> 144 at 56x56, dw 3x3): fused beats the ops alone on both archs."""
    from tvm_dpu.timing.simulate import simulate_subgraph

    g = _pw_dw_graph(24, 56, 56, 144, 3, 1, 1, seed=4)
    names = tuple(op.name for op in g.ops)
    for arch_name in ARCHS:
        arch = load_arch(arch_name)
        fused = compile_graph_fused(g, arch, FusionPlan("manual", [Group("pw_dw", names)]))
        alone = compile_graph_fused(g, arch, FusionPlan("none", [Group(SINGLE, (n,)) for n in names]))
        assert simulate_subgraph(fused).cycles < simulate_subgraph(alone).cycles, arch_name


@pytest.mark.parametrize("arch_name", ARCHS)
def test_timed_only_compile_has_the_same_code_without_weights(arch_name):
    """keep_params=False (programs compiled only to be timed) gives the same instructions and regions, and
    zeros for the parameters."""
    g, arch = _block(), load_arch(arch_name)
    plan = plan_fusion(g, arch, "optimal")
    full, timed = compile_graph_fused(g, arch, plan), compile_graph_fused(g, arch, plan, keep_params=False)
    assert np.array_equal(full.code, timed.code) and full.region_sizes == timed.region_sizes
    assert timed.params.size == full.params.size and not timed.params.any() and full.params.any()


def _inverted_residuals(n: int, c: int, hw: int, expand: int, seed: int) -> Graph:
    """`n` MobileNetV2 inverted residual blocks (1x1 expand, 3x3 depthwise, 1x1 project, add)."""
    b = _B(seed)
    x = b.input(c, hw, hw)
    for _ in range(n):
        e = b.conv(x, c * expand, 1, fp_out=4, act="relu6")
        d = b.op("depthwise_conv2d", [e], (1, c * expand, hw, hw), 4,
                 {"weights": b.const((c * expand, 1, 3, 3), 6), "bias": b.const((c * expand,), 4)},
                 strides=[1, 1], pads=[1, 1, 1, 1], groups=c * expand, act="relu6")
        p = b.conv(d, c, 1, act="none")
        x = b.op("eltwise_add", [p, x], b.shape(p), 2, act="none")
    b.g.outputs = [x]
    validate_graph(b.g)
    return b.g


def test_regions_are_closed_under_both_plans():
    from tvm_dpu.fusion.select import _regions

    a = [Group("pw_dw", ("e1", "d1")), Group("conv_add", ("p1", "a1")), Group(SINGLE, ("e2",)),
         Group(SINGLE, ("d2",))]
    b = [Group(SINGLE, ("e1",)), Group("dw_pw", ("d1", "p1")), Group(SINGLE, ("a1",)), Group(SINGLE, ("e2",)),
         Group(SINGLE, ("d2",))]
    assert _regions(a, b) == [{"e1", "d1", "p1", "a1"}]
    assert _regions(a, a) == []


@pytest.mark.parametrize("arch_name", ARCHS)
def test_searched_plan_no_slower_than_greedy_in_the_whole_program(arch_name):
    """MobileNetV2's middle blocks (96 channels at 14x14, expansion 6): pw_dw + conv_add and dw_pw + add are a
    near tie costed alone; the search settles such ties in context (fusion.select._in_context), so the program
    of its plan simulates no slower than greedy's and stays bit-exact."""
    from tvm_dpu.fusion.cost import cost_source
    from tvm_dpu.timing.simulate import cycles

    g, arch = _inverted_residuals(3, 96, 14, 6, seed=9), load_arch(arch_name)
    with cost_source("simulate"):
        plans = {m: plan_fusion(g, arch, m, None, emittable) for m in ("greedy", "optimal")}
    sim = {m: cycles(compile_graph_fused(g, arch, p, keep_params=False).code, arch) for m, p in plans.items()}
    assert sim["optimal"] <= sim["greedy"]
    assert "in_context" in plans["optimal"].stats
    assert emulator_vs_golden(g, arch, plans["optimal"], seed=2).bad == 0


@pytest.mark.parametrize("arch_name", ARCHS)
@pytest.mark.parametrize("cin,hw,cout", [(48, 14, 40), (260, 9, 30), (20, 23, 100)])
def test_pointwise_conv_add_runs_flattened(arch_name, cin, hw, cout):
    """A 1x1 conv + add over dense maps runs over the pixels in raster order (fused_conv.flattenable,
    tiling.raster_tiles): CONVs longer than an image row, a last tile that ends mid-row, and the result
    bit-exact."""
    b = _B(cin + hw)
    x = b.input(cin, hw, hw)
    c = b.conv(x, cout, 1, act="none")
    s = b.conv(x, cout, 1, act="none")
    out = b.op("eltwise_add", [c, s], b.shape(c), 2, act="relu")
    b.g.outputs = [out]
    validate_graph(b.g)
    arch = load_arch(arch_name)
    conv_op, add_op = b.g.ops[0], b.g.ops[2]
    plan = FusionPlan("manual", [Group(SINGLE, (b.g.ops[1].name,)), Group("conv_add", (conv_op.name, add_op.name))])
    assert emittable(plan.groups[1], b.g, arch)
    from tvm_dpu.codegen.isa import decode_program

    instrs = decode_program(compile_graph_fused(b.g, arch, plan).code)
    assert max(i["length"] for i in instrs if i.name == "CONV") > hw
    assert emulator_vs_golden(b.g, arch, plan, seed=cin).bad == 0
