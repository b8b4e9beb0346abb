"""conv_conv_pool: conv -> windowed conv -> 2x2 stride-2 pool streamed in row strips with both intermediate maps on
chip (codegen.fused_conv_conv_pool). Bit-exact against the golden reference, clean under the dependency checker,
only the first conv's input read and the pool's output written."""
from __future__ import annotations

import pytest

from tvm_dpu.arch import load_arch
from tvm_dpu.arch.arch import list_presets
from tvm_dpu.codegen.compiler import compile_graph_fused
from tvm_dpu.codegen.fused import emittable
from tvm_dpu.codegen.fused_conv_conv_pool import CONV_CONV_POOL_VARIANTS, _tile, group_variants
from tvm_dpu.runtime.dep_check import check_programs
from tvm_dpu.timing.simulate import simulate_subgraph
from tvm_dpu.types import SINGLE, FusionPlan, Group
from tvm_dpu.xgraph import Graph
from tvm_dpu.xgraph.validate import validate_graph
from conftest import emulator_vs_golden
from test_codegen import _B

ISA1 = [n for n in list_presets() if n.startswith("DPUCZDX8G_ISA1_")]
SLOW = pytest.mark.slow
#: the default run: the default variant everywhere, the others in the slow run (the strips test runs them on
#: two presets by default, on every preset in the slow run)
VARIANTS = [v if v == "wide" else pytest.param(v, marks=SLOW) for v in CONV_CONV_POOL_VARIANTS]
PRESETS = [n if n in ("DPUCZDX8G_ISA1_B4096", "DPUCZDX8G_ISA1_B1152") else pytest.param(n, marks=SLOW)
           for n in ISA1]


def _graph(cin: int, h: int, w: int, cmid: int, ka: int, sa: int, pa: int, cout: int, kb: int, pb: int,
           pool: str, sb: int = 1, seed: int = 0) -> Graph:
    b = _B(seed)
    x = b.input(cin, h, w)
    c = b.conv(b.conv(x, cmid, ka, s=sa, p=pa), cout, kb, s=sb, p=pb)
    _, _, hc, wc = b.shape(c)
    out = b.op(pool, [c], (1, cout, hc // 2, wc // 2), 3, kernel=[2, 2], strides=[2, 2], pads=[0, 0, 0, 0])
    b.g.outputs = [out]
    validate_graph(b.g)
    return b.g


CASES = [  # (cin, h, w, mid channels, A k, s, pad, cout, B k, pad, pool)
    (16, 20, 18, 24, 3, 1, 1, 24, 3, 1, "max_pool2d"),  # a VGG block, reduced
    (3, 36, 44, 16, 3, 1, 1, 16, 3, 1, "max_pool2d"),  # VGG's first block: A channel-augmented (3 channels)
    (8, 60, 110, 20, 3, 1, 1, 28, 3, 1, "max_pool2d"),  # tall and wide: the buffer wraps, several even strips
    (12, 31, 29, 16, 3, 1, 0, 20, 3, 1, "avg_pool2d"),  # odd input (made even by _even), A unpadded
    (8, 25, 27, 24, 3, 2, 1, 12, 5, 2, "max_pool2d"),  # strided A, 5x5 B, odd input
    (24, 16, 20, 40, 1, 1, 0, 20, 3, 1, "avg_pool2d"),  # 1x1 reduce -> 3x3 -> avg pool; channels not a multiple
    (8, 45, 60, 16, 3, 1, 1, 24, 3, 1, "max_pool2d", 2),  # B strided: its passes fetch rows two apart
]


def _even(case: tuple) -> tuple:
    """The case with B's output made even (the pool halves it): drop a row / column of input where odd."""
    cin, h, w, cmid, ka, sa, pa, cout, kb, pb, pool, *sb = case

    def out(n: int) -> int:
        a = (n + 2 * pa - ka) // sa + 1
        return (a + 2 * pb - kb) // (sb[0] if sb else 1) + 1
    while out(h) % 2:
        h += 1
    while out(w) % 2:
        w += 1
    return cin, h, w, cmid, ka, sa, pa, cout, kb, pb, pool, *sb


def _clean(compiled, arch) -> None:
    for label, rep in check_programs(compiled, None, arch).items():
        assert rep.ok and rep.races_checked, (label, rep.problems[:3], rep.races[:3])


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("arch_name", ["DPUCZDX8G_ISA1_B4096", "DPUCZDX8G_ISA1_B1152"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_conv_conv_pool_bit_exact_clean_and_on_chip(arch_name, case, variant):
    g, arch = _graph(*_even(CASES[case]), seed=case), load_arch(arch_name)
    names = tuple(op.name for op in g.ops)
    group = Group("conv_conv_pool", names)
    assert emittable(group, g, arch)
    if _tile(arch, g, *g.ops, variant) is None:
        pytest.skip(f"no {variant} tile here (a map of one even strip has no second)")
    plan = FusionPlan("manual", [group], variants={names[0]: variant})
    result = emulator_vs_golden(g, arch, plan, seed=case)
    assert result.bad == 0, result.by_output
    _clean(result.compiled, arch)
    # neither intermediate goes to DDR: the only bytes written are the pool's output, the only maps read the input
    _, c, ho, wo = g.tensors[g.outputs[0]].shape
    assert simulate_subgraph(result.compiled).ddr_write_bytes == c * ho * wo
    alone = compile_graph_fused(g, arch, FusionPlan("none", [Group(SINGLE, (n,)) for n in names]))
    assert simulate_subgraph(alone).ddr_write_bytes > c * ho * wo


WIDE = (8, 40, 300, 48, 3, 1, 1, 16, 3, 1, "max_pool2d")  # 48 mid channels over 300 columns: strips on every preset


@pytest.mark.parametrize("arch_name", PRESETS)
def test_several_strips_every_preset(arch_name):
    """A map wide and tall enough for several strips and buffer wraps, on every ISA1 preset, in the variant of
    more strips than fit: the strips have even widths (the pool pairs columns) and the program is exact and
    clean."""
    variant = "narrow"
    g, arch = _graph(*_even(WIDE), seed=7), load_arch(arch_name)
    tile = _tile(arch, g, *g.ops, variant)
    assert tile is not None and tile.lp % 2 == 0 and tile.vp % 2 == 0
    assert tile.lp < g.tensors[g.ops[1].outputs[0]].shape[3]  # more than one strip
    names = tuple(o.name for o in g.ops)
    plan = FusionPlan("manual", [Group("conv_conv_pool", names)], variants={names[0]: variant})
    result = emulator_vs_golden(g, arch, plan, seed=7)
    assert result.bad == 0, result.by_output
    _clean(result.compiled, arch)


def test_variants_offered_differ():
    """Every variant offered to the search has its own tile ("wide" first); a map of one strip's width in "wide"
    offers "narrow" too, with more strips."""
    g, arch = _graph(*_even(CASES[0]), seed=7), load_arch("DPUCZDX8G_ISA1_B4096")
    offered = group_variants(arch, g, g.ops)
    assert offered == ("wide", "narrow")
    assert _tile(arch, g, *g.ops, "narrow").lp < _tile(arch, g, *g.ops, "wide").lp


def test_pool_that_does_not_halve_is_not_emittable():
    """A 3x3 stride-2 pool (overlapping windows) or an odd map: the pass-local pool cannot run; the group is not
    emittable and compiles member by member, still exact."""
    b = _B(3)
    x = b.input(8, 20, 20)
    c = b.conv(b.conv(x, 16, 3, p=1), 16, 3, p=1)
    out = b.op("max_pool2d", [c], (1, 16, 10, 10), 3, kernel=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    b.g.outputs = [out]
    validate_graph(b.g)
    arch = load_arch("DPUCZDX8G_ISA1_B4096")
    group = Group("conv_conv_pool", tuple(op.name for op in b.g.ops))
    assert not emittable(group, b.g, arch)
    assert emulator_vs_golden(b.g, arch, FusionPlan("manual", [group])).bad == 0


def test_search_takes_it_only_where_it_wins():
    """The builder's search (compile_subgraph) takes conv_conv_pool where the timing model says the program is
    faster with it: a block of few channels over a large map on B4096, whose unfused maps cost more DDR time than
    the strips' extra CONVs (faster than the plan searched without the template); not on B1152, where the CONV
    engine sets the pace and the strips' CONVs cost more than they save (there the group, in its fastest variant,
    is slower than what the builder ships)."""
    from tvm_dpu.backend.dpu_compile import compile_subgraph
    from tvm_dpu.fusion.select import compile_with_fusion
    from tvm_dpu.timing.simulate import cycles

    g = _graph(16, 112, 112, 16, 3, 1, 1, 16, 3, 1, "max_pool2d", seed=1)
    arch = load_arch("DPUCZDX8G_ISA1_B4096")
    c, plan = compile_subgraph(g, arch)
    assert [gr.template for gr in plan.groups] == ["conv_conv_pool"]
    without, _ = compile_with_fusion(g, arch, without=("conv_conv_pool",))
    assert cycles(c.code, arch) < 0.9 * cycles(without.code, arch)

    g = _graph(64, 56, 56, 64, 3, 1, 1, 64, 3, 1, "max_pool2d", seed=1)
    arch = load_arch("DPUCZDX8G_ISA1_B1152")
    c, plan = compile_subgraph(g, arch)
    assert "conv_conv_pool" not in {gr.template for gr in plan.groups}
    names = tuple(op.name for op in g.ops)
    fused = [cycles(compile_graph_fused(g, arch, FusionPlan("manual", [Group("conv_conv_pool", names)],
                                                            variants={names[0]: v})).code, arch)
             for v in group_variants(arch, g, g.ops)]
    assert min(fused) > cycles(c.code, arch)


def test_first_layer_edges_run_augmented():
    """A first layer over 3 channels (B1152, where the lone conv runs channel-augmented): the chain runs its edge
    columns augmented too, the LOADs masking the bytes in the padding (ChainTile.masked), so no strip has the
    one-column plain CONVs per edge it would otherwise need; exact and clean in the narrow strips (a left and a
    right edge strip)."""
    from tvm_dpu.codegen.isa import decode_program

    g, arch = _graph(*_even(CASES[1]), seed=1), load_arch("DPUCZDX8G_ISA1_B1152")
    names = tuple(op.name for op in g.ops)
    assert _tile(arch, g, *g.ops, "narrow").masked
    result = emulator_vs_golden(g, arch, FusionPlan("manual", [Group("conv_conv_pool", names)],
                                                    variants={names[0]: "narrow"}), seed=1)
    assert result.bad == 0, result.by_output
    _clean(result.compiled, arch)
    lengths = {i["length"] for i in decode_program(result.compiled.code) if i.name == "CONV"}
    assert min(lengths) > 1
