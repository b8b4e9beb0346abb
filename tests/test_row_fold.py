"""Row folding of conv -> whole-width pool chains (codegen.row_fold; PointPillars' PFN): the folded chain equals the
golden reference bit for bit, takes fewer CONVs, is refused where it cannot apply, and the search picks it."""
from __future__ import annotations

import pytest

from tvm_dpu.arch import load_arch
from tvm_dpu.codegen.compiler import compile_graph_fused
from tvm_dpu.codegen.fused_conv_pool import fold_variants, group_variants
from tvm_dpu.codegen.row_fold import fold_factors, folded_fmap
from tvm_dpu.runtime.dep_check import check_subgraph
from tvm_dpu.types import FMap, FusionPlan, Group
from tvm_dpu.xgraph import Graph
from tvm_dpu.xgraph.validate import validate_graph
from conftest import emulator_vs_golden
from test_codegen import _B

ZCU102 = "DPUCZDX8G_ISA1_B4096"


def _pfn_graph(cin: int, h: int, w: int, cout: int, pool: str = "max_pool2d", act: str = "relu", seed: int = 0,
               pool_k: int | None = None, pool_s: int | None = None) -> Graph:
    """PointPillars' PFN shape: a 1x1 conv over an h x w map, then a 1 x w pool of stride w (pool_k: another
    pool width, which does not fold; pool_s: another stride, which a whole-width window ignores)."""
    b = _B(seed)
    x = b.input(cin, h, w)
    c = b.conv(x, cout, 1, act=act)
    pk = pool_k or w
    ps = pool_s or pk
    out = b.op(pool, [c], (1, cout, h, (w - pk) // ps + 1), 3, kernel=[1, pk], strides=[1, ps], pads=[0, 0, 0, 0])
    b.g.outputs = [out]
    validate_graph(b.g)
    return b.g


def _plan(g: Graph, variant: str) -> FusionPlan:
    ops = tuple(op.name for op in g.ops)
    return FusionPlan("manual", [Group("conv_pool", ops)], variants={ops[0]: variant})


FOLD_CASES = [  # (arch, cin, h, w, cout, pool, act, k, pool stride)
    (ZCU102, 4, 48, 100, 64, "max_pool2d", "relu", 2, 1),  # vai_c's PFN at reduced H (pool stride 1, as its xmodel)
    (ZCU102, 9, 48, 100, 64, "max_pool2d", "relu", 2, None),
    (ZCU102, 9, 48, 24, 64, "max_pool2d", "relu", 8, None),
    (ZCU102, 16, 30, 10, 16, "max_pool2d", "none", 5, None),  # no activation
    (ZCU102, 16, 36, 12, 32, "avg_pool2d", "relu", 3, 1),
    ("DPUCZDX8G_ISA1_B1152", 9, 40, 20, 24, "max_pool2d", "relu", 4, None),
]


@pytest.mark.parametrize("case", range(len(FOLD_CASES)))
def test_folded_chain_is_bit_exact_with_fewer_convs(case):
    arch_name, cin, h, w, cout, pool, act, k, stride = FOLD_CASES[case]
    g, arch = _pfn_graph(cin, h, w, cout, pool, act, seed=case, pool_s=stride), load_arch(arch_name)
    conv, p = g.ops
    assert fold_variants(arch, g, conv, p)  # the search has folds to time (the largest that fit; k is any that fits)
    folded = _plan(g, f"fold{k}")
    assert emulator_vs_golden(g, arch, folded, seed=case).bad == 0
    compiled = compile_graph_fused(g, arch, folded)
    assert check_subgraph(compiled).problems == []
    wide = compile_graph_fused(g, arch, _plan(g, "wide")).instr_counts
    assert compiled.instr_counts["CONV"] < wide["CONV"]


def test_a_pool_narrower_than_the_width_does_not_fold():
    """A 1x4 stride-4 pool over a width of 24 reads several windows per row: no fold is offered."""
    g = _pfn_graph(9, 16, 24, 32, pool_k=4)
    conv, p = g.ops
    assert fold_factors(g, conv, p) == []
    assert group_variants(load_arch(ZCU102), g, [conv, p]) == ("wide",)


def test_a_windowed_conv_does_not_fold():
    """A 3x3 conv mixes neighbouring rows: folding them side by side would change its output."""
    b = _B(1)
    c = b.conv(b.input(8, 12, 10), 16, 3, p=1)
    out = b.op("max_pool2d", [c], (1, 16, 12, 1), 3, kernel=[1, 10], strides=[1, 10], pads=[0, 0, 0, 0])
    b.g.outputs = [out]
    conv, p = b.g.ops
    assert fold_factors(b.g, conv, p) == []


def test_the_fold_is_refused_where_the_folded_rows_outgrow_the_tile():
    """H prime: no k divides it. A width whose folded line exceeds the 10-bit line pitch: no fold fits."""
    arch = load_arch(ZCU102)
    g = _pfn_graph(9, 13, 24, 64)
    assert fold_factors(g, *g.ops) == [13] and fold_variants(arch, g, *g.ops) == ()  # 13*24 columns: too wide
    g = _pfn_graph(9, 8, 200, 64)  # 2 x 200 columns x 4 channel groups > 1023
    assert fold_factors(g, *g.ops) == [2, 4, 8] and fold_variants(arch, g, *g.ops) == ()


def test_maps_with_padded_rows_do_not_fold():
    assert folded_fmap(FMap.dense(1, 0, 6, 5, 8), 3) == FMap(1, 0, 2, 15, 8, 8, 120)
    assert folded_fmap(FMap(1, 0, 6, 5, 8, 8, 48), 3) is None  # rows 48 bytes apart, 40 used
    assert folded_fmap(FMap.dense(1, 0, 6, 5, 8), 4) is None  # 4 does not divide 6


def test_the_search_picks_the_fold_on_the_pfn_shape():
    """compile_with_fusion times the fold against the unfolded chain and keeps it; the result stays bit-exact."""
    from tvm_dpu.fusion.select import compile_with_fusion
    from tvm_dpu.timing.simulate import simulate_subgraph

    g, arch = _pfn_graph(9, 96, 100, 64, seed=5), load_arch(ZCU102)
    compiled, plan = compile_with_fusion(g, arch, "optimal")
    assert plan.variants == {g.ops[0].name: "fold2"}
    wide = compile_graph_fused(g, arch, _plan(g, "wide"))
    assert simulate_subgraph(compiled).cycles < 0.8 * simulate_subgraph(wide).cycles
    assert emulator_vs_golden(g, arch, plan, seed=5).bad == 0


def _pfn_onnx(h: int, w: int):
    """vai_c's PointPillars PFN layer as ONNX at reduced height: 1x1 conv (4 -> 64) + ReLU + a 1 x w max pool of
    stride 1 (its xmodel's: one window position either way)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    init = lambda n, a: numpy_helper.from_array(np.asarray(a, np.float32), n)
    node = helper.make_node
    nodes = [node("Conv", ["x", "w", "b"], ["c"], name="conv"), node("Relu", ["c"], ["r"], name="relu"),
             node("MaxPool", ["r"], ["y"], name="mp", kernel_shape=[1, w], strides=[1, 1])]
    g = helper.make_graph(nodes, "pfn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, h, w])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, h, 1])],
                          [init("w", rng.standard_normal((64, 4, 1, 1)) * 0.3),
                           init("b", rng.standard_normal(64) * 0.1)])
    calib = rng.standard_normal((4, 1, 4, h, w)).astype(np.float32)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=7), calib


def test_the_pfn_rebuilt_from_its_xmodel_folds(tmp_path, monkeypatch):
    """bench_vaic's path (xmodel.compare: the xmodel's int8 network rebuilt and compiled by tvm-dpu) on the PFN
    shape at H = 48: the rebuild equals the exported program's outputs and takes fewer CONVs and cycles than with
    the fold turned off."""
    import tvm_dpu
    from tvm_dpu.codegen import fused_conv_pool
    from tvm_dpu.xmodel.compare import compare

    model, calib = _pfn_onnx(48, 100)
    path = tvm_dpu.build(model, arch=ZCU102, progress=False, calibration=calib).export(tmp_path / "pfn.xmodel")
    (folded,) = compare(path, seed=1).subgraphs
    monkeypatch.setattr(fused_conv_pool, "fold_variants", lambda *a: ())
    (plain,) = compare(path, seed=1).subgraphs
    assert folded.outputs_equal and plain.outputs_equal and folded.total >= 64 * 48
    assert folded.ours.instructions["CONV"] < plain.ours.instructions["CONV"]
    assert folded.ours.cycles < plain.ours.cycles
