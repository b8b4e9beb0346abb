"""Fork chains (fusion.fork): a pointwise conv read by a depthwise conv and by other ops, fused with the depthwise
reader; the chain keeps the conv's rows on chip for it and also SAVEs them for the others. Bit-exact, clean under
the dependency checker, the map read back from DDR no more, and chosen by the search where it pays."""
from __future__ import annotations

import pytest

from tvm_dpu.arch import load_arch
from tvm_dpu.codegen.fused import emittable
from tvm_dpu.fusion.cost import cost_source
from tvm_dpu.fusion.fork import fork_options
from tvm_dpu.fusion.select import plan_fusion
from tvm_dpu.runtime.dep_check import check_programs
from tvm_dpu.timing.simulate import simulate_subgraph
from tvm_dpu.types import SINGLE, FusionPlan, Group
from tvm_dpu.xgraph import Graph
from tvm_dpu.xgraph.validate import validate_graph
from conftest import emulator_vs_golden
from test_codegen import _B

ARCHS = ["DPUCZDX8G_ISA1_B4096", "DPUCZDX8G_ISA1_B1024", "DPUCZDX8G_ISA1_B512"]


def _fork(cin: int, h: int, w: int, cmid: int, s: int, cout: int, seed: int, project: bool) -> Graph:
    """1x1 conv -> 3x3 depthwise of stride s (-> 1x1 conv with `project`), the 1x1 conv's output also read by a
    second 1x1 conv: YOLOX's CSP output feeding the next stage and the FPN, or a head stem feeding two branches."""
    b = _B(seed)
    x = b.input(cin, h, w)
    e = b.conv(x, cmid, 1)
    d = b.dw3x3(e, s)
    out = b.conv(d, cout, 1) if project else d
    b.g.outputs = [out, b.conv(e, cout, 1)]
    validate_graph(b.g)
    return b.g


CASES = [  # (cin, h, w, mid channels, dw stride, cout, project)
    (32, 20, 18, 32, 2, 64, True),  # YOLOX's conv3 -> strided dw -> pconv, conv3 also read by the FPN
    (16, 13, 11, 24, 1, 16, True),  # a head stem -> dw -> pconv, the stem also read by the other branch
    (8, 9, 21, 30, 1, 20, False),  # channels not a multiple of ICP, a lone depthwise reader
    (16, 40, 44, 48, 2, 32, False),  # several strips and wraps
]


def _groups(g: Graph, project: bool) -> tuple[Group, Group]:
    names = [op.name for op in g.ops]  # conv, dw, (pconv,) other conv
    chain = names[:3] if project else names[:2]
    return Group("pw_dw_pw" if project else "pw_dw", tuple(chain)), Group(SINGLE, (names[-1],))


@pytest.mark.parametrize("arch_name", ARCHS)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_fork_chain_bit_exact_clean_and_reads_the_map_once(arch_name, case):
    *shape, project = CASES[case]
    g, arch = _fork(*shape, seed=case, project=project), load_arch(arch_name)
    chain, other = _groups(g, project)
    assert emittable(chain, g, arch)
    result = emulator_vs_golden(g, arch, FusionPlan("manual", [chain, other]), seed=case)
    assert result.bad == 0
    for label, rep in check_programs(result.compiled, None, arch).items():
        assert rep.ok and rep.races_checked, (label, rep.problems[:3], rep.races[:3])
    # against the conv alone (its output SAVEd, then LOADed back by the depthwise conv's group): the same bytes
    # written, one read of the conv's output fewer (halo re-reads aside, both plans read it per strip)
    split = FusionPlan("split", [Group(SINGLE, (chain.ops[0],)),
                                 Group("dw_pw" if project else SINGLE, chain.ops[1:]), other])
    alone = emulator_vs_golden(g, arch, split, seed=case)
    assert alone.bad == 0
    fused, unfused = simulate_subgraph(result.compiled), simulate_subgraph(alone.compiled)
    assert fused.ddr_write_bytes == unfused.ddr_write_bytes
    mid = g.tensors[g.ops[0].outputs[0]].shape
    assert fused.ddr_read_bytes <= unfused.ddr_read_bytes - mid[1] * mid[2] * mid[3]


def test_fork_needs_every_column_computed():
    """An unpadded 3x3 stride-2 depthwise over an even width: its windows skip the conv's last column, which the
    chain then never computes, so with another reader of the conv the group is not emittable."""
    b = _B(0)
    x = b.input(16, 8, 8)
    e = b.conv(x, 16, 1)
    d = b.op("depthwise_conv2d", [e], (1, 16, 3, 3), 4,
             {"weights": b.const((16, 1, 3, 3), 6), "bias": b.const((16,), 4)},
             strides=[2, 2], pads=[0, 0, 0, 0], groups=16, act="relu")
    b.g.outputs = [d, b.conv(e, 16, 1)]
    validate_graph(b.g)
    names = [op.name for op in b.g.ops]
    assert not emittable(Group("pw_dw", tuple(names[:2])), b.g, load_arch("DPUCZDX8G_ISA1_B4096"))
    # with one reader the chain needs no column it skips: the same group compiles
    b.g.outputs = [d]
    single = Graph(b.g.name, b.g.tensors, b.g.ops[:2], b.g.inputs, [d])
    assert emittable(Group("pw_dw", tuple(names[:2])), single, load_arch("DPUCZDX8G_ISA1_B4096"))


def test_search_offers_and_costs_fork_chains():
    """plan_fusion (simulated costs) sees the fork option of a forking pointwise conv and the plan it returns
    compiles bit-exact."""
    *shape, project = CASES[0]
    g, arch = _fork(*shape, seed=0, project=project), load_arch("DPUCZDX8G_ISA1_B1024")
    singles = [Group(SINGLE, (op.name,)) for op in g.ops]
    ((conv, joins),) = fork_options(g, arch, singles)
    assert conv.ops == (g.ops[0].name,) and [new.template for _, new in joins] == ["pw_dw"]
    with cost_source("simulate"):
        plan = plan_fusion(g, arch)
    assert emulator_vs_golden(g, arch, plan).bad == 0


@pytest.mark.parametrize("arch_name", ["DPUCZDX8G_ISA1_B512", "DPUCZDX8G_ISA1_B800"])
def test_fork_pw_dw_tight_variant_bit_exact_clean_and_faster(arch_name):
    """pw_dw's "tight" tile (no spare wrap: wider strips) is offered to fork chains only, emits exactly, and on the
    PP=4 DPUs makes YOLOX's 52x52 CSP output -> stride-2 depthwise fork faster than the two ops alone, which the
    wide tile's 13-column strips are not (on B4096 both tiles are one: only "wide" is offered)."""
    from tvm_dpu.codegen.fused_conv_pool import group_variants

    g, arch = _fork(64, 52, 52, 64, 2, 64, seed=3, project=False), load_arch(arch_name)
    chain, other = _groups(g, False)
    ops = [g.op(n) for n in chain.ops]
    assert group_variants(arch, g, ops) == ("wide", "tight")
    lone = Graph(g.name, g.tensors, g.ops[:2], g.inputs, [g.ops[1].outputs[0]])
    assert group_variants(arch, lone, ops) == ("wide",)  # no fork: the one emission it always had
    cycles = {}
    for variant in ("wide", "tight"):
        result = emulator_vs_golden(g, arch, FusionPlan("manual", [chain, other], variants={chain.ops[0]: variant}))
        assert result.bad == 0
        for label, rep in check_programs(result.compiled, None, arch).items():
            assert rep.ok and rep.races_checked, (label, rep.problems[:3], rep.races[:3])
        cycles[variant] = simulate_subgraph(result.compiled).cycles
    alone = emulator_vs_golden(g, arch, FusionPlan("split", [Group(SINGLE, (n,)) for n in chain.ops] + [other]))
    assert cycles["tight"] < simulate_subgraph(alone.compiled).cycles < cycles["wide"]
    assert group_variants(load_arch("DPUCZDX8G_ISA1_B4096"), g, ops) == ("wide",)
