"""Fusion gains on the timing model: a fused plan is never slower than its unfused form (the zoo networks, both the
B4096 and the DNNVM ZU2 arch), a probe of convs, pools and adds where DDR traffic dominates gains from fusion, and a
fused kernel's parameter LOADs overlap the previous op's CONVs (the bubble that made GoogLeNet's fused plans lose)."""
from __future__ import annotations

import warnings

import pytest

import tvm_dpu
from tvm_dpu import zoo
from tvm_dpu.arch import load_arch
from tvm_dpu.codegen.isa import ENGINE_BITS, decode_program
from tvm_dpu.fusion.select import compile_with_fusion
from tvm_dpu.timing.params import load_params
from tvm_dpu.timing.simulate import cycles, simulate
from tvm_dpu.xgraph.validate import validate_graph
from conftest import emulator_vs_golden
from test_codegen import _B

ARCHS = ["DPUCZDX8G_ISA1_B4096", "dnnvm-zu2"]

# GoogLeNet is the network whose fused plans lost (the build fell back to "none"); the rest run with -m slow.
_ZOO = [m if m == "googlenet" else pytest.param(m, marks=pytest.mark.slow) for m in zoo.MODELS]
#: Known losses (measured on the reduced zoo, both archs): none. SqueezeNet 1.1's stem conv + max pool on B4096 lost
#: 2.4% while every LOAD/SAVE waited out its predecessor's DDR round trip (the augmented conv's LOADs are one burst
#: per item); with own tokens posted at the transfer's end it no longer does.
_KNOWN_LOSSES: set[tuple[str, str]] = set()


@pytest.mark.parametrize("arch_name", ARCHS)
@pytest.mark.parametrize("name", _ZOO)
def test_searched_plan_no_slower_than_unfused_on_zoo(name, arch_name, request):
    """Every DPU subgraph of a reduced zoo network: the plan the search picks (before the build's fallback
    check), compiled and simulated, takes no more cycles than the unfused program."""
    if (name, arch_name) in _KNOWN_LOSSES:
        request.applymarker(pytest.mark.xfail(strict=True, reason="known loss in context, see _KNOWN_LOSSES"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = tvm_dpu.build(zoo.build_model(name, reduced=True), arch=arch_name, fusion="none",
                              calibration=[zoo.random_input(name, reduced=True)], progress=False)
    arch = load_arch(arch_name)
    fused_somewhere = False
    for sym, runner in model.runners.items():
        unfused, _ = compile_with_fusion(runner.graph, arch, "none", keep_params=False)
        searched, plan = compile_with_fusion(runner.graph, arch, "optimal", keep_params=False)
        fused_somewhere |= bool(plan.fused())
        assert cycles(searched.code, arch) <= cycles(unfused.code, arch), \
            f"{name}/{sym}: fused groups {[g.ops for g in plan.fused()]} make the program slower"
    if name == "googlenet":
        assert fused_somewhere


def _probe(c: int, hw: int) -> object:
    """Convs, pools and adds on a small map (a residual pair, a conv + max pool, a 1x1 pair joined by an add): few
    MACs per byte, so the DDR round trips of the unfused program dominate."""
    b = _B(5)
    x = b.input(c, hw, hw)
    c1 = b.conv(x, c, 3, p=1)
    c2 = b.conv(c1, c, 3, p=1, act="none")
    a = b.op("eltwise_add", [c2, x], b.shape(c2), 2, act="relu")
    p = b.op("max_pool2d", [b.conv(a, c, 3, p=1)], (1, c, hw // 2, hw // 2), 3, kernel=[2, 2], strides=[2, 2])
    c3 = b.conv(p, 2 * c, 1, act="none")
    s = b.conv(p, 2 * c, 1, act="none")
    b.g.outputs = [b.op("eltwise_add", [c3, s], b.shape(c3), 2, act="relu")]
    validate_graph(b.g)
    return b.g


@pytest.mark.parametrize("arch_name", ARCHS)
def test_fusion_gains_where_ddr_traffic_dominates(arch_name):
    """On the probe (16 channels, 16x16) fusion moves a quarter less DDR data and saves cycles: measured 17.6% on
    B4096 and 9.6% on ZU2 since a LOAD/SAVE posts its own engine's token at its transfer's end (26% and 24% while
    every LOAD/SAVE waited out its predecessor's DDR round trip, which made round trips dearer; before the fused
    kernels overlapped their parameter LOADs the search gained nothing on such probes). ZU2's B1152 computes the
    same convs at a quarter of B4096's rate, so the traffic fusion saves is a smaller share of its time. Optimal is
    no slower than greedy, and the fused program is bit-exact."""
    g, arch = _probe(16, 16), load_arch(arch_name)
    sims, plans = {}, {}
    for mode in ("none", "greedy", "optimal"):
        compiled, plans[mode] = compile_with_fusion(g, arch, mode, keep_params=False)
        sims[mode] = simulate(compiled.code, arch)
    assert sims["optimal"].cycles <= (0.92 if arch_name == "dnnvm-zu2" else 0.85) * sims["none"].cycles
    assert sims["optimal"].cycles <= sims["greedy"].cycles < sims["none"].cycles
    ddr = {m: s.ddr_read_bytes + s.ddr_write_bytes for m, s in sims.items()}
    assert ddr["optimal"] < 0.75 * ddr["none"]
    assert {gr.template for gr in plans["optimal"].fused()} >= {"conv_add", "conv_pool"}
    assert emulator_vs_golden(g, arch, plans["optimal"], seed=1).bad == 0


@pytest.mark.parametrize("arch_name", ARCHS)
def test_fused_parameter_loads_overlap_the_previous_ops_convs(arch_name):
    """A conv, then two 1x1 convs sharing its output (hconv2): the fused kernel's weights go to the CONVW half the
    conv did not use, so its first parameter LOAD waits for no CONV and starts while the conv still computes."""
    b = _B(2)
    x = b.input(32, 20, 20)
    c = b.conv(x, 48, 3, p=1)
    b.g.outputs = [b.conv(c, 24, 1), b.conv(c, 36, 1)]
    validate_graph(b.g)
    arch = load_arch(arch_name)
    compiled, plan = compile_with_fusion(b.g, arch, "optimal")
    assert [gr.template for gr in plan.fused()] == ["hconv2"]
    (lo, hi), = [(lo, hi) for name, lo, hi in compiled.op_ranges if "+" in name]
    instrs = decode_program(compiled.code)
    first_load = next(i for i in range(lo, hi) if instrs[i].name == "LOAD")
    assert not instrs[first_load].dpdon & ENGINE_BITS["conv"]
    t = simulate(compiled.code, arch)
    last_conv_before = max(i for i in range(lo) if instrs[i].name == "CONV")
    assert t.start[first_load] < t.end[last_conv_before]
    assert emulator_vs_golden(b.g, arch, plan, seed=3).bad == 0


@pytest.mark.parametrize("arch_name", ARCHS)
@pytest.mark.parametrize("h", [8, 18])
def test_dw_pw_pointwise_convs_take_all_pp_rows(arch_name, h):
    """ShuffleNetV2's downsampling branch (a 3x3 stride-2 depthwise conv, then a 1x1 conv, 14 channels): the ALU
    computes fewer rows at once than the CONV (alu_pp < pp), so the fused kernel runs several depthwise passes per
    tile and each pointwise CONV covers PP rows. With one pass per tile the fused pair ran twice the CONVs of the
    unfused 1x1 conv, and lost to it on dnnvm-zu2 (CONV fills); h=18 leaves a tail tile of one row. Without a tail
    the fused pair is faster; with it (ZU2, PP 4: 6 CONVs against the unfused conv's 2) it may lose, but by less
    than its extra CONVs' fills, which its saved transfers pay back (since issue 35's refit, conv_fill_cycles 224, it
    loses on ZU2: 2,548 against 2,498 cycles; the build's compile_subgraph ships the unfused plan when it is faster)."""
    b = _B(4)
    x = b.input(14, h, 8)
    ho = (h + 1) // 2
    dw = b.op("depthwise_conv2d", [x], (1, 14, ho, 4), 4,
              {"weights": b.const((14, 1, 3, 3), 6), "bias": b.const((14,), 4)},
              strides=[2, 2], pads=[1, 1, 1, 1], act="relu")
    b.g.outputs = [b.conv(dw, 14, 1)]
    validate_graph(b.g)
    arch = load_arch(arch_name)
    from tvm_dpu.codegen.compiler import compile_graph_fused
    from tvm_dpu.fusion.select import plan_fusion
    from tvm_dpu.types import FusionPlan, Group
    plan = FusionPlan("manual", [Group("dw_pw", tuple(op.name for op in b.g.ops))])
    fused = compile_graph_fused(b.g, arch, plan, keep_params=False)
    alone = compile_graph_fused(b.g, arch, plan_fusion(b.g, arch, "none"), keep_params=False)
    n_out = -(-14 // arch.ocp)
    assert fused.instr_counts["CONV"] == -(-ho // arch.pp) * n_out
    if ho % arch.pp == 0 or ho < arch.pp:
        assert cycles(fused.code, arch) < cycles(alone.code, arch)
    extra = fused.instr_counts["CONV"] - alone.instr_counts["CONV"]
    fill = load_params(arch).conv_fill_cycles
    assert cycles(fused.code, arch) < cycles(alone.code, arch) + max(0, extra) * fill
    _assert_exact_and_race_free(b.g, arch, plan, seed=5)


@pytest.mark.parametrize("arch_name", ARCHS)
def test_dw_pw_passes_sharing_one_window_are_exact(arch_name):
    """A wide map (64 channels, 60 columns): two depthwise passes' windows do not both fit half a bank, so the
    passes of a tile load theirs into the same rows, one after the other; the output stays bit-exact."""
    b = _B(7)
    x = b.input(64, 30, 60)
    dw = b.op("depthwise_conv2d", [x], (1, 64, 15, 30), 4,
              {"weights": b.const((64, 1, 3, 3), 6), "bias": b.const((64,), 4)},
              strides=[2, 2], pads=[1, 1, 1, 1], act="relu")
    b.g.outputs = [b.conv(dw, 40, 1)]
    validate_graph(b.g)
    from tvm_dpu.types import FusionPlan, Group
    plan = FusionPlan("manual", [Group("dw_pw", tuple(op.name for op in b.g.ops))])
    _assert_exact_and_race_free(b.g, load_arch(arch_name), plan, seed=1)


def _assert_exact_and_race_free(g, arch, plan, seed: int) -> None:
    """The fused program's outputs equal the golden reference's, and the dependency checker finds no token
    problem and no race between the passes' LOADs, ALUs and the CONVs over their banks."""
    from tvm_dpu.runtime.dep_check import check_subgraph
    from tvm_dpu.timing.depcheck import CODEGEN_COUNTER_DEPTH
    run = emulator_vs_golden(g, arch, plan, seed=seed)
    assert run.bad == 0, run.by_output
    rep = check_subgraph(run.compiled)
    assert rep.ok and rep.races_checked, (rep.problems[:3], rep.races[:3])
    assert rep.max_cross_depth() <= CODEGEN_COUNTER_DEPTH
