"""The conv -> pool chain's pass order (fused_chain.defers_passes): PointPillars' PFN shape (a 1x1 conv, then a
1 x W max over each row) emits each pool pass one conv row group late, which keeps the CONV engine from waiting for
the pass just before it; other chains keep the eager order."""
from __future__ import annotations

import numpy as np
import pytest

from tvm_dpu.arch import load_arch
from tvm_dpu.codegen import fused_chain
from tvm_dpu.codegen.compiler import compile_graph_fused
from tvm_dpu.runtime.dep_check import check_programs
from tvm_dpu.timing.depcheck import CODEGEN_COUNTER_DEPTH
from tvm_dpu.timing.simulate import simulate
from tvm_dpu.types import FusionPlan, Group
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


def test_pfn_chain_defers_passes_exact_clean_and_faster(monkeypatch):
    g, arch = _pfn_graph(), load_arch(ARCH)
    late = compile_graph_fused(g, arch, _plan(g))
    assert emulator_vs_golden(g, arch, _plan(g), seed=2).bad == 0
    for label, rep in check_programs(late, arch=arch).items():
        assert rep.ok and rep.races_checked and not rep.races, (label, rep.problems[:3], rep.races[:3])
        assert rep.max_cross_depth() <= CODEGEN_COUNTER_DEPTH
    with monkeypatch.context() as m:
        m.setattr(fused_chain, "defers_passes", lambda *a: False)
        eager = compile_graph_fused(g, arch, _plan(g))
    assert not np.array_equal(late.code, eager.code)
    t_late, t_eager = simulate(late.code, arch), simulate(eager.code, arch)
    assert t_late.engine_busy["conv"] == pytest.approx(t_eager.engine_busy["conv"])  # the same CONVs
    # eager: once every `wraps` row groups a CONV waits for the whole pool pass before it (>= 416 cycles here)
    assert t_late.cycles < t_eager.cycles - 400, (t_late.cycles, t_eager.cycles)


def test_chains_whose_passes_read_several_wraps_keep_the_eager_order(monkeypatch):
    g, arch = _conv_pool_graph(*CONV_POOL_CASES[2], seed=2), load_arch(ARCH)  # 3x3 s2 pool: passes span wraps
    plan = FusionPlan("manual", [Group("conv_pool", tuple(op.name for op in g.ops))])
    code = compile_graph_fused(g, arch, plan).code
    with monkeypatch.context() as m:
        m.setattr(fused_chain, "defers_passes", lambda *a: False)
        assert np.array_equal(compile_graph_fused(g, arch, plan).code, code)


def test_defers_passes_needs_single_wrap_passes_and_a_spare_wrap():
    one = [(0, 1, 0, 0), (4, 1, 0, 0), (8, 1, 1, 1)]
    assert fused_chain.defers_passes(5, one, 20)
    assert not fused_chain.defers_passes(5, one, 19)  # too few laps of the buffer to pay the lag
    assert not fused_chain.defers_passes(2, one, 20)
    assert not fused_chain.defers_passes(5, one + [(-1, 3, -1, 0)], 20)
