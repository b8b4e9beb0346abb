"""Fused emitters with variants the fusion search times on the timing model: pw_dw_pw (conv -> depthwise ->
pointwise, both intermediate maps on chip) and conv_add's tile chunking. Each is bit-exact, clean under the
dependency checker, and chosen only where it is faster (YOLOX-nano's shapes)."""
from __future__ import annotations

import pytest

from tvm_dpu.arch import load_arch
from tvm_dpu.arch.arch import list_presets
from tvm_dpu.codegen.compiler import compile_graph_fused
from tvm_dpu.codegen.fused import FUSED_EMITTERS, emittable
from tvm_dpu.codegen.fused_conv_add import CONV_ADD_VARIANTS
from tvm_dpu.codegen.fused_pw_dw_pw import PW_DW_PW_VARIANTS
from tvm_dpu.codegen.tiling import CodegenError
from tvm_dpu.fusion.cost import cost_source
from tvm_dpu.fusion.select import compile_with_fusion, plan_fusion
from tvm_dpu.runtime.dep_check import check_programs
from tvm_dpu.timing.simulate import simulate_subgraph
from tvm_dpu.types import SINGLE, FusionPlan, Group
from tvm_dpu.xgraph import Graph
from tvm_dpu.xgraph.validate import validate_graph
from conftest import emulator_vs_golden
from test_codegen import _B

ARCHS = ["DPUCZDX8G_ISA1_B4096", "DPUCZDX8G_ISA1_B1152"]


def _pw_dw_pw(cin: int, h: int, w: int, cmid: int, s: int, cout: int, seed: int) -> Graph:
    """1x1 conv (relu) -> 3x3 depthwise of stride s (relu) -> 1x1 conv: a CSP bottleneck / head branch."""
    b = _B(seed)
    x = b.input(cin, h, w)
    e = b.conv(x, cmid, 1)
    d = b.dw3x3(e, s)
    b.g.outputs = [b.conv(d, cout, 1)]
    validate_graph(b.g)
    return b.g


CASES = [  # (cin, h, w, mid channels, dw stride, cout)
    (16, 13, 11, 32, 1, 24),
    (32, 20, 18, 32, 2, 64),  # YOLOX's conv3 -> strided dw -> pconv
    (8, 9, 21, 30, 1, 20),  # channels not a multiple of ICP
]


def _clean(compiled, arch) -> None:
    for label, rep in check_programs(compiled, None, arch).items():
        assert rep.ok and rep.races_checked, (label, rep.problems[:3], rep.races[:3])


@pytest.mark.parametrize("variant", PW_DW_PW_VARIANTS)
@pytest.mark.parametrize("arch_name", ARCHS)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_pw_dw_pw_bit_exact_and_clean(arch_name, case, variant):
    g, arch = _pw_dw_pw(*CASES[case], seed=case), load_arch(arch_name)
    names = tuple(op.name for op in g.ops)
    group = Group("pw_dw_pw", names)
    assert emittable(group, g, arch)
    plan = FusionPlan("manual", [group], variants={names[0]: variant})
    result = emulator_vs_golden(g, arch, plan, seed=case)
    assert result.bad == 0
    _clean(result.compiled, arch)
    # neither intermediate map goes to DDR: only the last conv's output is written
    alone = compile_graph_fused(g, arch, FusionPlan("none", [Group(SINGLE, (n,)) for n in names]))
    out_bytes = g.tensors[g.outputs[0]].shape[1] * g.tensors[g.outputs[0]].shape[2] * g.tensors[g.outputs[0]].shape[3]
    assert simulate_subgraph(result.compiled).ddr_write_bytes == out_bytes
    assert simulate_subgraph(alone).ddr_write_bytes > out_bytes


ISA1 = [n for n in list_presets() if n.startswith("DPUCZDX8G_ISA1_")]


@pytest.mark.parametrize("arch_name", ISA1)
def test_strided_chain_on_a_map_of_few_wraps_bit_exact_and_clean(arch_name):
    """A stride-2 depthwise whose conv output takes fewer wraps of the row-fetch layout than a pass needs (14
    rows: 1 or 2 wraps of PP x 2 rows): the circular buffer holds the whole map, so the chain's strips are as wide
    as that buffer allows (fused_chain.chain_tile), and the program stays exact and clean on every ISA1 preset. Here the buffer has fewer wraps than a pass over a taller map needs (2 it reads + 1 being filled)."""
    from tvm_dpu.codegen.fused_pw_dw_pw import _tile

    g, arch = _pw_dw_pw(16, 14, 14, 384, 2, 24, seed=11), load_arch(arch_name)
    assert _tile(arch, g, *g.ops).wraps < 3
    names = tuple(op.name for op in g.ops)
    result = emulator_vs_golden(g, arch, FusionPlan("manual", [Group("pw_dw_pw", names)]), seed=11)
    assert result.bad == 0, result.by_output
    _clean(result.compiled, arch)


TALL = [(16, 40, 40, 96, 2, 24), (8, 48, 60, 96, 2, 16)]  # stride-2 chains over maps of many wraps


@pytest.mark.parametrize("arch_name", ISA1)
def test_tight_variant_wider_strips_bit_exact_and_clean(arch_name):
    """pw_dw_pw's "tight" variant: a circular buffer of only the wraps a depthwise pass reads (no spare one for
    the conv to fill meanwhile) leaves room for wider strips over a tall stride-2 map; exact and clean on every
    ISA1 preset (on the first of TALL where its tile differs from wide's), and offered to the search only there."""
    from tvm_dpu.codegen.fused_pw_dw_pw import _variant_tile, group_variants

    arch = load_arch(arch_name)
    for k, shape in enumerate(TALL):
        g = _pw_dw_pw(*shape, seed=20 + k)
        wide, tight = (_variant_tile(arch, g, (*g.ops, None), v) for v in ("wide", "tight"))
        if tight != wide:
            break
        assert group_variants(arch, g, g.ops) == PW_DW_PW_VARIANTS[:2]
    assert tight.lp > wide.lp and tight.wraps < wide.wraps
    assert "tight" in group_variants(arch, g, g.ops)
    names = tuple(op.name for op in g.ops)
    result = emulator_vs_golden(g, arch, FusionPlan("manual", [Group("pw_dw_pw", names)], variants={names[0]: "tight"}),
                                seed=k)
    assert result.bad == 0, result.by_output
    _clean(result.compiled, arch)


def test_strided_block_of_a_small_map_is_one_strip_and_taken():
    """MobileNetV2's 28x28 -> 14x14 block (32 -> 192 -> stride-2 dw -> 64, B4096): the expanded map takes 2 wraps
    of 16 rows, so a buffer of 2 wraps (not the 3 a pass over a taller map needs: 2 read + 1 filled) holds it, and
    the chain runs as one strip of all 14 output columns instead of two of 7 (half the expand CONVs, each paying
    the CONV fill); the search then takes it over the expand conv alone + dw_pw, with less DDR traffic."""
    from tvm_dpu.codegen.fused_pw_dw_pw import _tile

    g, arch = _pw_dw_pw(32, 28, 28, 192, 2, 64, seed=12), load_arch("DPUCZDX8G_ISA1_B4096")
    a, dw, pw = g.ops
    assert _tile(arch, g, a, dw, pw).lp == 14
    compiled, plan = compile_with_fusion(g, arch, "optimal")
    assert [gr.template for gr in plan.fused()] == ["pw_dw_pw"]
    split = compile_graph_fused(g, arch, FusionPlan("manual", [Group(SINGLE, (a.name,)), Group("dw_pw", (dw.name,
                                                                                                       pw.name))]))
    ours, theirs = simulate_subgraph(compiled), simulate_subgraph(split)
    assert ours.cycles < theirs.cycles
    assert ours.ddr_read_bytes + ours.ddr_write_bytes < theirs.ddr_read_bytes + theirs.ddr_write_bytes
    assert emulator_vs_golden(g, arch, plan, seed=12).bad == 0
    _clean(compiled, arch)


def test_pw_dw_pw_rejects_an_unknown_variant():
    g, arch = _pw_dw_pw(*CASES[0], seed=0), load_arch(ARCHS[0])
    names = tuple(op.name for op in g.ops)
    with pytest.raises(CodegenError, match="pw_dw_pw variant 'fast'"):
        compile_graph_fused(g, arch, FusionPlan("manual", [Group("pw_dw_pw", names)], variants={names[0]: "fast"}))


def _searched_without(g: Graph, arch, template: str):
    """The optimal plan's program when `template` has no emitter (what the search did before it had one)."""
    with cost_source("simulate"):
        plan = plan_fusion(g, arch, "optimal", tuple(t for t in FUSED_EMITTERS if t != template), emittable)
    return compile_graph_fused(g, arch, plan)


def test_search_takes_pw_dw_pw_where_it_gains():
    """YOLOX-nano's head branch at 52x52 (64 -> 64 -> dw -> 64, B4096): the search fuses all three ops, the
    program is faster than the best plan without the template and exact."""
    g, arch = _pw_dw_pw(64, 52, 52, 64, 1, 64, seed=7), load_arch("DPUCZDX8G_ISA1_B4096")
    compiled, plan = compile_with_fusion(g, arch, "optimal")
    assert [gr.template for gr in plan.fused()] == ["pw_dw_pw"]
    before = _searched_without(g, arch, "pw_dw_pw")
    assert simulate_subgraph(compiled).cycles < 0.95 * simulate_subgraph(before).cycles
    assert emulator_vs_golden(g, arch, plan, seed=7).bad == 0
    _clean(compiled, arch)


def _conv_add(c: int, h: int, w: int, seed: int) -> Graph:
    """1x1 conv over c channels beside an add with its input (a CSP bottleneck's residual)."""
    b = _B(seed)
    x = b.input(c, h, w)
    b.g.outputs = [b.op("eltwise_add", [b.conv(x, c, 1), x], (1, c, h, w), 2, act="none")]
    validate_graph(b.g)
    return b.g


def test_conv_add_one_pass_taken_where_it_gains():
    """YOLOX-nano's dark3 residual (1x1 over 32 channels at 52x52, B4096): "wide" (the fewest CONVs) cuts the
    output into two 16-channel chunks, loading the input twice and moving the add's operand and output in strided
    16-byte pieces; the search times both tilings and keeps one_pass, faster and exact."""
    g, arch = _conv_add(32, 52, 52, seed=3), load_arch("DPUCZDX8G_ISA1_B4096")
    compiled, plan = compile_with_fusion(g, arch, "optimal")
    [group] = plan.fused()
    assert group.template == "conv_add" and plan.variants == {group.ops[0]: "one_pass"}
    wide = compile_graph_fused(g, arch, FusionPlan("manual", list(plan.groups)))
    assert simulate_subgraph(compiled).cycles < 0.8 * simulate_subgraph(wide).cycles
    for variant in CONV_ADD_VARIANTS:
        p = FusionPlan("manual", list(plan.groups), variants={group.ops[0]: variant})
        assert emulator_vs_golden(g, arch, p, seed=3).bad == 0
    _clean(compiled, arch)


def test_conv_add_keeps_wide_where_it_is_faster():
    """A 1x1 over 256 -> 1024 channels at 14x14 beside an add (the case of fused_conv.flat_chunk's docstring):
    one pass over all 64 output groups makes CONVs of a few pixels each; the fewest CONVs win and the plan
    records no variant."""
    from tvm_dpu.fusion.cost import piece_cycles

    b = _B(5)
    x, r = b.input(256, 14, 14), b.input(1024, 14, 14)
    b.g.outputs = [b.op("eltwise_add", [b.conv(x, 1024, 1), r], (1, 1024, 14, 14), 2, act="none")]
    validate_graph(b.g)
    g, arch = b.g, load_arch("DPUCZDX8G_ISA1_B4096")
    _, plan = compile_with_fusion(g, arch, "optimal")
    [group] = plan.fused()
    assert group.template == "conv_add" and plan.variants == {}
    timed = {v: piece_cycles(g, arch, [group], {group.ops[0]: v}) for v in CONV_ADD_VARIANTS}
    assert timed["wide"] < timed["one_pass"]
