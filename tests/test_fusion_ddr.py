"""The fusion search's DDR-bytes tie-break (fusion.ddr, issue 36 item 3): within DDR_TIE of the fastest option's
cycles the grouping moving the fewest feature-map bytes wins; the bytes are those of the maps each group takes from
and leaves in DDR."""
from __future__ import annotations

import math

from tvm_dpu.arch import load_arch
from tvm_dpu.fusion.ddr import DDR_TIE, DdrBytes, prefer
from tvm_dpu.fusion.select import compile_with_fusion
from tvm_dpu.timing.simulate import simulate_subgraph
from tvm_dpu.types import SINGLE, Group
from test_pw_dw_pw_add import _block


def test_prefer_breaks_ties_by_ddr_bytes_only_within_the_tolerance():
    fast, lean = ("fast", 10_000.0, 500_000), ("lean", 10_000.0 * (1 + DDR_TIE) - 1, 100_000)
    assert prefer([fast, lean]) == "lean"  # within the tolerance: fewer bytes
    too_slow = ("lean", 10_000.0 * (1 + DDR_TIE) + 1, 100_000)
    assert prefer([fast, too_slow]) == "fast"  # beyond it: cycles decide
    assert prefer([("cur", 5.0, 7), ("other", 5.0, 7)]) == "cur"  # a full tie keeps the first (the current choice)
    assert prefer([("a", 5.0, 9), ("b", 4.0, 9)]) == "b"  # equal bytes: the faster
    assert prefer([("cur", math.inf, 1), ("x", math.inf, 0)]) == "cur"  # nothing feasible: unchanged


def test_ddr_bytes_count_the_maps_a_grouping_moves():
    """MobileNetV2's residual block (c x h x w maps in and out, 6c expanded): the whole block as one group moves its
    input and its output; the chain with the add apart also saves the project conv's output and reads it back
    beside the block input again; every op alone moves every map between them."""
    g = _block(16, 9, 11, 6, seed=0)
    ddr = DdrBytes(g)
    a, dw, pw, add = (op.name for op in g.ops)
    m = 16 * 9 * 11
    assert ddr.of([Group("pw_dw_pw_add", (a, dw, pw, add))]) == 2 * m
    assert ddr.of([Group("pw_dw_pw", (a, dw, pw)), Group(SINGLE, (add,))]) == 5 * m
    alone = ddr.of([Group(SINGLE, (n,)) for n in (a, dw, pw, add)])
    assert alone == 5 * m + 4 * 6 * m  # the expanded map out and back in, twice (expand -> dw -> project)


def test_searched_plan_moves_no_more_bytes_than_the_static_estimate_says():
    """The estimate orders groupings as the programs do: the searched plan of a residual block (fused whole) moves
    fewer simulated DDR bytes than the chain with the add apart."""
    from tvm_dpu.codegen.compiler import compile_graph_fused
    from tvm_dpu.types import FusionPlan

    g, arch = _block(32, 14, 14, 6, seed=2), load_arch("DPUCZDX8G_ISA1_B4096")
    compiled, plan = compile_with_fusion(g, arch, "optimal")
    names = tuple(op.name for op in g.ops)
    apart = [Group("pw_dw_pw", names[:3]), Group(SINGLE, names[3:])]
    other = compile_graph_fused(g, arch, FusionPlan("manual", apart))
    ddr = DdrBytes(g)
    moved = [simulate_subgraph(c) for c in (compiled, other)]
    assert ddr.of(plan.groups) < ddr.of(apart)
    assert moved[0].ddr_read_bytes + moved[0].ddr_write_bytes < moved[1].ddr_read_bytes + moved[1].ddr_write_bytes
