"""The conv -> window chains run at counter depth 2 (fused_chain.CHAIN_COUNTER_DEPTH, Program.deeper_counters):
PointPillars' PFN shape (a 1x1 conv, then a 1 x W max over each row) no longer makes every pool pass wait out the
SAVEs of the pass just before it; the chain programs stay bit-exact and checker-clean, and programs without a
chain keep one token per counter."""
from __future__ import annotations

import pytest

from tvm_dpu.arch import load_arch
from tvm_dpu.codegen import fused_chain
from tvm_dpu.codegen.compiler import compile_graph, compile_graph_fused
from tvm_dpu.codegen.isa import decode_program
from tvm_dpu.runtime.dep_check import check_programs
from tvm_dpu.timing.depcheck import CODEGEN_COUNTER_DEPTH, check
from tvm_dpu.timing.simulate import simulate
from tvm_dpu.types import SINGLE, FusionPlan, Group
from tvm_dpu.xgraph.validate import validate_graph
from conftest import emulator_vs_golden
from test_codegen import _B
from test_fusion import CONV_POOL_CASES, _conv_pool_graph

ARCH = "DPUCZDX8G_ISA1_B4096"


def _pfn_graph(cin: int = 9, h: int = 200, w: int = 100, cout: int = 64):
    """conv 1x1 (cin -> cout) then max_pool 1 x w: each row (pillar) reduced to one pixel, as PFN's."""
    b = _B(5)
    c = b.conv(b.input(cin, h, w), cout, 1)
    out = b.op("max_pool2d", [c], (1, cout, h, 1), 3, kernel=[1, w], strides=[1, 1], pads=[0, 0, 0, 0])
    b.g.outputs = [out]
    validate_graph(b.g)
    return b.g


def _plan(g):
    return FusionPlan("manual", [Group("conv_pool", tuple(op.name for op in g.ops))])


def _clean(compiled, arch, depth: int) -> None:
    for label, rep in check_programs(compiled, arch=arch).items():
        assert rep.ok and rep.races_checked and not rep.races, (label, rep.problems[:3], rep.races[:3])
        assert rep.max_cross_depth() == depth <= CODEGEN_COUNTER_DEPTH, (label, rep.pairs())


def test_pfn_chain_at_depth_two_is_exact_clean_and_faster(monkeypatch):
    g, arch = _pfn_graph(), load_arch(ARCH)
    deep = compile_graph_fused(g, arch, _plan(g))
    assert emulator_vs_golden(g, arch, _plan(g), seed=2).bad == 0
    _clean(deep, arch, fused_chain.CHAIN_COUNTER_DEPTH)
    assert check(deep.code).pairs()["save->misc"]["depth"] == 2  # a pass waits for the pass before last's SAVEs
    with monkeypatch.context() as m:
        m.setattr(fused_chain, "CHAIN_COUNTER_DEPTH", 1)
        one = compile_graph_fused(g, arch, _plan(g))
        _clean(one, arch, 1)
    t_deep, t_one = simulate(deep.code, arch), simulate(one.code, arch)
    for e in ("conv", "misc"):  # the same instructions (DMA busy time depends on how LOAD and SAVE overlap)
        assert t_deep.engine_busy[e] == pytest.approx(t_one.engine_busy[e])
    # one token: every pass also waits out the previous pass's SAVEs and their DDR round trip, and the MISC
    # engine sets the pace (26,103 against 24,315 cycles when measured)
    assert t_deep.cycles < 0.95 * t_one.cycles, (t_deep.cycles, t_one.cycles)


@pytest.mark.parametrize("case", [1, 2, 5])
def test_other_chains_stay_exact_clean_and_no_slower(monkeypatch, case):
    g, arch = _conv_pool_graph(*CONV_POOL_CASES[case], seed=2), load_arch(ARCH)
    plan = FusionPlan("manual", [Group("conv_pool", tuple(op.name for op in g.ops))])
    run = emulator_vs_golden(g, arch, plan, seed=3)
    assert run.bad == 0
    for label, rep in check_programs(run.compiled, arch=arch).items():
        assert rep.ok and rep.races_checked and rep.max_cross_depth() <= fused_chain.CHAIN_COUNTER_DEPTH, label
    with monkeypatch.context() as m:
        m.setattr(fused_chain, "CHAIN_COUNTER_DEPTH", 1)
        one = compile_graph_fused(g, arch, plan)
    assert simulate(run.compiled.code, arch).cycles <= simulate(one.code, arch).cycles


def test_programs_without_a_chain_keep_one_token_per_counter():
    g, arch = _pfn_graph(h=48), load_arch(ARCH)
    _clean(compile_graph(g, arch), arch, 1)


def test_chain_conv_loads_group_zero_first_and_its_first_conv_waits_for_it_only():
    g, arch = _pfn_graph(h=48), load_arch(ARCH)  # 64 output channels: 4 groups on B4096
    compiled = compile_graph_fused(g, arch, _plan(g))
    instrs, t = decode_program(compiled.code), simulate(compiled.code, arch)
    convw = arch.bank_group("CONVW")
    weights = [i for i, x in enumerate(instrs)
               if x.name == "LOAD" and convw.base_id <= x.fields["bank_id"] < convw.base_id + arch.ocp]
    vb0 = arch.bank_group("VB0").base_id
    first_input = next(i for i, x in enumerate(instrs)
                       if x.name == "LOAD" and vb0 <= x.fields["bank_id"] < vb0 + arch.pp)
    first_conv = next(i for i, x in enumerate(instrs) if x.name == "CONV")
    group0 = [i for i in weights if i < first_input]
    later = [i for i in weights if i > first_input]
    assert [instrs[i].fields["length"] for i in group0] == [1] * arch.ocp  # one row per bank: group 0's
    assert [instrs[i].fields["length"] for i in later] == [3] * arch.ocp and max(later) < first_conv
    assert t.start[first_conv] < max(t.done[i] for i in later)  # it did not wait for groups 1-3
    assert emulator_vs_golden(g, arch, _plan(g), seed=4).bad == 0


def test_a_chain_after_another_conv_loads_its_weights_whole(monkeypatch):
    from tvm_dpu.codegen import fused_conv_pool

    b = _B(5)
    c = b.conv(b.conv(b.input(9, 24, 100), 16, 1), 64, 1)
    b.g.outputs = [b.op("max_pool2d", [c], (1, 64, 24, 1), 3, kernel=[1, 100], strides=[1, 1], pads=[0, 0, 0, 0])]
    validate_graph(b.g)
    plan = FusionPlan("manual", [Group(SINGLE, (b.g.ops[0].name,)),
                                 Group("conv_pool", tuple(op.name for op in b.g.ops[1:]))])
    seen, real = [], fused_conv_pool.load_chain_conv
    monkeypatch.setattr(fused_conv_pool, "load_chain_conv", lambda *a, **k: seen.append(k["split"]) or real(*a, **k))
    run = emulator_vs_golden(b.g, load_arch(ARCH), plan, seed=6)
    # the last call emits the program (compiler.relocated_params first measures the kernel in a scratch program):
    # the first conv's CONVs come before the chain's, where the split measured no gain
    assert run.bad == 0 and seen[-1] is False
