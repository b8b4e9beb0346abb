"""The fusion search compiles and simulates each geometry of piece once (fusion.cost.piece_key / piece_cycles):
pieces sharing a key must have programs the timing model cannot tell apart. The hazard the key must see:
Program.emit drops an INIT equal to the one in force, so two convs of one geometry whose quantization shifts are
equal emit one CONVINIT fewer than two whose shifts differ, and their fused program takes other cycles."""
from __future__ import annotations

import sys
import warnings

import numpy as np
import pytest

from tvm_dpu.arch import load_arch
from tvm_dpu.codegen.compiler import compile_graph_fused
from tvm_dpu.errors import FusionError
from tvm_dpu.timing.simulate import cycles, timing_key
from tvm_dpu.types import SINGLE, FusionPlan, Group
from tvm_dpu.xgraph import Graph
from tvm_dpu.xgraph.validate import validate_graph
from test_codegen import _B

import tvm_dpu.fusion.cost  # noqa: F401 - the module (tvm_dpu.fusion re-exports a function named cost)

fcost = sys.modules["tvm_dpu.fusion.cost"]

B1152 = "DPUCZDX8G_ISA1_B1152"


def _chains(fix_points: list[tuple[int, int]], c: int = 16, h: int = 32, w: int = 8) -> tuple[Graph, list]:
    """One graph with a 1x1 conv -> 1x1 conv chain per (fp of the first conv's output, fp of the second's), all of
    one geometry; returns the graph and each chain's (first op, second op). With fix points (4, 4) both convs have
    shift_cut 7 and shift_bias 6 (equal CONVINIT values), with (4, 3) the second has shift_cut 8."""
    b = _B(0)
    chains = []
    for fa, fb in fix_points:
        x = b.input(c, h, w)
        a = b.conv(x, c, 1, fp_out=fa)
        y = b.conv(a, c, 1, fp_out=fb)
        b.g.outputs.append(y)
        producer = b.g.producers()
        chains.append((producer[a].name, producer[y].name))
    validate_graph(b.g)
    return b.g, chains


def _fresh(graph: Graph, arch, groups: list[Group]):
    """The piece compiled on its own, as before the cache: (cycles, timing key)."""
    code = compile_graph_fused(graph.extract([n for g in groups for n in g.ops]), arch, FusionPlan("t", groups),
                               keep_params=False).code
    return cycles(code, arch), timing_key(code)


def _key(graph: Graph, groups: list[Group]):
    return fcost.piece_key(graph.extract([n for g in groups for n in g.ops]), groups)


@pytest.fixture
def count_compiles(monkeypatch):
    calls = []
    real = fcost.compile_graph_fused

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(fcost, "compile_graph_fused", counting)
    return calls


def test_equal_shifts_change_the_program_and_the_key(count_compiles):
    arch = load_arch(B1152)
    g, (same, differ) = _chains([(4, 4), (4, 3)])
    pieces = [[Group("conv_conv", same)], [Group("conv_conv", differ)]]
    fresh = [_fresh(g, arch, p) for p in pieces]
    # the hazard is real: one CONVINIT per row tile more, and more cycles, where the shifts differ
    assert fresh[0][1] != fresh[1][1] and fresh[0][0] < fresh[1][0]
    assert _key(g, pieces[0]) != _key(g, pieces[1])
    count_compiles.clear()
    assert [fcost.piece_cycles(g, arch, p) for p in pieces] == [f[0] for f in fresh]
    assert len(count_compiles) == 2


def test_one_pattern_is_compiled_once(count_compiles):
    """Other shift values with the same equality pattern (the second conv's values differ from the first's, none
    all 0) and another graph position share one compile; and the cycles are each piece's own."""
    arch = load_arch(B1152)
    g, chains = _chains([(4, 3), (4, 2), (3, 3), (5, 2)])
    pieces = [[Group("conv_conv", ch)] for ch in chains]
    fresh = [_fresh(g, arch, p) for p in pieces]
    assert len({_key(g, p) for p in pieces}) == 1
    assert len({f[1] for f in fresh}) == 1
    count_compiles.clear()
    assert [fcost.piece_cycles(g, arch, p) for p in pieces] == [f[0] for f in fresh]
    assert len(count_compiles) == 1


@pytest.mark.parametrize("arch_name", ["DPUCZDX8G_ISA1_B4096", B1152])
def test_cached_cycles_are_each_pieces_own(arch_name):
    """Random fix points, pieces of several groupings (a fused pair, two singles, a resident chain) costed through
    the cache in one graph context: every answer equals the piece compiled alone."""
    arch = load_arch(arch_name)
    rng = np.random.default_rng(1)
    fps = [(4, 4), (4, 3)] + [(int(rng.integers(2, 6)), int(rng.integers(2, 6))) for _ in range(6)]
    g, chains = _chains(fps, h=16)
    for a, b in chains:
        for groups in ([Group("conv_conv", (a, b))], [Group(SINGLE, (a,)), Group(SINGLE, (b,))],
                       [Group("resident", (a, b))], [Group(SINGLE, (b,))]):
            assert fcost.piece_cycles(g, arch, groups) == _fresh(g, arch, groups)[0], (a, b, groups)


def test_grouping_and_shapes_are_in_the_key():
    g, (ch,) = _chains([(4, 3)])
    fused, apart = [Group("conv_conv", ch)], [Group(SINGLE, (ch[0],)), Group(SINGLE, (ch[1],))]
    assert _key(g, fused) != _key(g, apart)
    g2, (ch2,) = _chains([(4, 3)], w=10)
    assert _key(g, fused) != _key(g2, [Group("conv_conv", ch2)])
    g3, (ch3,) = _chains([(4, 3)])
    assert _key(g, fused) == _key(g3, [Group("conv_conv", ch3)])
    w = g3.tensors[g3.op(ch3[1]).params["weights"]]
    w.dtype, w.data = "int16", w.data.astype(np.int16)
    assert _key(g, fused) != _key(g3, [Group("conv_conv", ch3)])


def test_requantized_concat_inputs_are_in_the_key():
    """A concat input with another fix point than the output is copied through a requantizing ALU pass: which
    inputs do must be in the key, whatever the shifts."""
    keys = []
    for fps in ((3, 3), (2, 3), (3, 2)):
        b = _B(0)
        x = b.input(8, 6, 6)
        parts = [b.conv(x, 8, 1, fp_out=fp) for fp in fps]
        out = b.op("concat", parts, (1, 16, 6, 6), 3, axis=1)
        b.g.outputs = [out]
        validate_graph(b.g)
        keys.append(fcost.piece_key(b.g, [Group(SINGLE, (op.name,)) for op in b.g.ops]))
    assert len(set(keys)) == 3


def test_check_mode_catches_a_key_that_leaves_out_the_shifts(monkeypatch):
    """TVM_DPU_CHECK_PIECE_KEY=1 compiles every piece and refuses a key shared by different timed programs: with
    the quantization left out of the key, the two chains of the first test collide."""
    arch = load_arch(B1152)
    g, (same, differ) = _chains([(4, 4), (4, 3)])
    monkeypatch.setattr(fcost, "_quant_shape", lambda q, classes: None)
    monkeypatch.setenv(fcost.CHECK_ENV, "1")
    fcost.piece_cycles(g, arch, [Group("conv_conv", same)])
    with pytest.raises(FusionError, match="share a geometry key"):
        fcost.piece_cycles(g, arch, [Group("conv_conv", differ)])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50", "mobilenetv2", "googlenet", "squeezenet1_1", "efficientnet_b0"])
def test_check_mode_on_reduced_zoo(monkeypatch, name):
    """Every piece of a reduced zoo model's build compiled anyway and compared with the one its key shares."""
    import tvm_dpu
    from tvm_dpu import zoo

    monkeypatch.setenv(fcost.CHECK_ENV, "1")
    for arch in ("DPUCZDX8G_ISA1_B4096", B1152):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tvm_dpu.build(zoo.build_model(name, reduced=True), arch=arch,
                          calibration=[zoo.random_input(name, reduced=True)], progress=False)
