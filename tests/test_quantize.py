"""Float XGraph -> int8 XGraph: every DPU constraint holds, the golden reference approximates the float one,
and the code generator's emulator output equals the golden reference on a quantized graph."""
from __future__ import annotations

import numpy as np
import pytest

import tvm_dpu.quant as quant
from tvm_dpu.arch import load_arch
from tvm_dpu.codegen.compiler import compile_graph
from tvm_dpu.errors import QuantizationError
from tvm_dpu.quant.calibration import choose_fix_point, collect_stats, quantize_values
from tvm_dpu.quant.fixpoint import LEAKY_ALPHA
from tvm_dpu.quant.quantize import quantize_graph, quantize_with_report
from tvm_dpu.emulator.core import Emulator
from tvm_dpu.xgraph import Graph, Op, Tensor, quant_params, run_graph
from tvm_dpu.xgraph.float_ref import run_graph_float
from tvm_dpu.xgraph.validate import validate_graph


class _FB:
    """Tiny float-graph builder (the float counterpart of test_codegen's `_B`)."""

    def __init__(self, seed: int = 0):
        self.g = Graph("fg")
        self.rng = np.random.default_rng(seed)
        self.n = 0

    def _name(self, p: str) -> str:
        self.n += 1
        return f"{p}{self.n}"

    def input(self, c: int, h: int, w: int) -> str:
        t = self.g.add_tensor(Tensor(self._name("in"), (1, c, h, w), "float32"))
        self.g.inputs.append(t.name)
        return t.name

    def const(self, data: np.ndarray) -> str:
        data = np.asarray(data, np.float32)
        return self.g.add_tensor(Tensor(self._name("k"), data.shape, "float32", None, data)).name

    def op(self, type_: str, inputs: list[str], shape, params=None, **attrs) -> str:
        out = self.g.add_tensor(Tensor(self._name(type_), tuple(shape), "float32")).name
        self.g.add_op(Op(self._name("op"), type_, list(inputs), [out], attrs, params or {}))
        return out

    def conv(self, x: str, cout: int, k: int, s: int = 1, p: int = 0, act: str = "relu", bias: bool = True,
             gain: float = 1.4, alpha: float | None = None) -> str:
        _, c, h, w = self.g.tensors[x].shape
        params = {"weights": self.const(self.rng.standard_normal((cout, c, k, k)) * gain / np.sqrt(c * k * k))}
        if bias:
            params["bias"] = self.const(self.rng.standard_normal(cout) * 0.1)
        ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
        return self.op("conv2d", [x], (1, cout, ho, wo), params, strides=[s, s], pads=[p, p, p, p], act=act,
                       alpha=alpha)

    def shape(self, t: str):
        return self.g.tensors[t].shape

    def batches(self, n: int = 4, size: int = 4, seed: int = 1):
        rng = np.random.default_rng(seed)
        return [{i: rng.standard_normal((size,) + self.shape(i)[1:]) for i in self.g.inputs} for _ in range(n)]


def _resnetish(seed: int = 0) -> _FB:
    """5 layers: conv-relu, maxpool, conv-relu, conv + residual add-relu, global avgpool, dense."""
    b = _FB(seed)
    x = b.input(3, 16, 16)
    c1 = b.conv(x, 16, 3, 1, 1)
    p1 = b.op("max_pool2d", [c1], (1, 16, 8, 8), kernel=[2, 2], strides=[2, 2])
    c2 = b.conv(p1, 16, 3, 1, 1)
    c3 = b.conv(c2, 16, 3, 1, 1, act="none")
    a = b.op("eltwise_add", [c3, p1], (1, 16, 8, 8), act="relu")
    gp = b.op("avg_pool2d", [a], (1, 16, 1, 1), **{"global": True})
    d = b.op("dense", [gp], (1, 10, 1, 1), {"weights": b.const(b.rng.standard_normal((10, 16)) * 0.3),
                                            "bias": b.const(b.rng.standard_normal(10) * 0.1)})
    b.g.outputs = [d]
    return b


def _sqnr(ref: np.ndarray, got: np.ndarray) -> float:
    return 10 * np.log10(np.sum(ref ** 2) / np.sum((ref - got) ** 2))


def _quantized_vs_float(gf: Graph, gq: Graph, feeds_f: dict[str, np.ndarray]) -> dict[str, float]:
    """SQNR (dB) per graph output of golden(int8 inputs) dequantized against the float reference."""
    ref = run_graph_float(gf, feeds_f)
    feeds_q = {n: quantize_values(v, gq.tensors[n].fix_point) for n, v in feeds_f.items()}
    got = run_graph(gq, feeds_q)
    return {n: _sqnr(ref[n], got[n].astype(np.float64) * 2.0 ** -gq.tensors[n].fix_point) for n in gf.outputs}


def _all_quant_params(gq: Graph) -> None:
    validate_graph(gq)
    for op in gq.ops:
        quant_params(op, gq)
    for t in gq.tensors.values():
        assert t.dtype == "int8" and t.fix_point is not None
        if t.is_const:
            assert t.data.dtype == np.int8


@pytest.mark.parametrize("method", ["mse", "minmax"])
def test_resnetish_quantizes_and_matches_float(method):
    b = _resnetish()
    stats = collect_stats(b.g, b.batches(), progress=False)
    res = quantize_with_report(b.g, stats, method=method)
    gq = res.graph
    _all_quant_params(gq)
    assert [op.type for op in gq.ops] == [op.type for op in b.g.ops]
    assert set(res.report.fix_points) == set(gq.tensors)
    # max pool keeps the fix_point (free)
    pool = gq.ops[1]
    assert gq.tensors[pool.inputs[0]].fix_point == gq.tensors[pool.outputs[0]].fix_point
    rng = np.random.default_rng(99)  # data the calibration has not seen
    sq = [_quantized_vs_float(b.g, gq, {b.g.inputs[0]: rng.standard_normal(b.shape(b.g.inputs[0]))})
          for _ in range(3)]
    worst = min(min(s.values()) for s in sq)
    print(f"resnet-ish 5 layers, {method}: worst output SQNR {worst:.1f} dB")
    assert worst > 20.0


def test_mobilenet_block_relu6_fix_point_4_and_codegen_matches_golden():
    b = _FB(2)
    x = b.input(8, 12, 12)
    e = b.conv(x, 24, 1, act="relu6")
    dw = b.op("depthwise_conv2d", [e], (1, 24, 6, 6),
              {"weights": b.const(b.rng.standard_normal((24, 1, 3, 3)) * 0.4),
               "bias": b.const(b.rng.standard_normal(24) * 0.1)},
              strides=[2, 2], pads=[1, 1, 1, 1], act="relu6")
    pr = b.conv(dw, 16, 1, act="none")
    out = b.op("eltwise_add", [pr, b.conv(pr, 16, 3, 1, 1, act="leaky_relu", alpha=0.1, bias=False)],
               (1, 16, 6, 6))
    b.g.outputs = [out]
    gq = quant.calibrate(b.g, b.batches(), progress=False)
    _all_quant_params(gq)
    assert gq.tensors[e].fix_point == 4 and gq.tensors[dw].fix_point == 4
    leaky = gq.ops[-2]
    assert leaky.attrs["alpha"] == LEAKY_ALPHA  # 0.1 forced to 26/256
    assert b.g.ops[-2].attrs["alpha"] == 0.1  # the float graph is not modified
    rng = np.random.default_rng(5)
    s = _quantized_vs_float(b.g, gq, {x: rng.standard_normal(b.shape(x))})
    assert s[out] > 15.0, s  # the 26/256 slope differs from 0.1 on purpose

    arch = load_arch("DPUCZDX8G_ISA1_B1152")
    compiled = compile_graph(gq, arch)
    feeds = {x: quantize_values(rng.standard_normal(b.shape(x)), gq.tensors[x].fix_point)}
    regions = compiled.new_regions()
    for bind in compiled.inputs:
        bind.fmap.to_ddr(regions[bind.fmap.reg_id], feeds[bind.name])
    Emulator(arch).run(compiled.code, regions)
    golden = run_graph(gq, feeds)
    for bind in compiled.outputs:
        got = bind.fmap.from_ddr(regions[bind.fmap.reg_id])
        assert np.array_equal(got, golden[bind.name]), f"{bind.name}: emulator != golden"


def _inception(seed: int = 1) -> tuple[_FB, list[str], str]:
    b = _FB(seed)
    x = b.input(8, 9, 9)
    br1 = b.conv(x, 6, 1)
    br2 = b.conv(b.conv(x, 6, 1), 10, 3, 1, 1, gain=4.0)  # larger range than the others
    pool = b.op("max_pool2d", [x], (1, 8, 9, 9), kernel=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])
    br3 = b.conv(pool, 5, 1, gain=0.3)
    cat = b.op("concat", [br1, br2, br3], (1, 21, 9, 9), axis=1)
    b.conv(cat, 8, 1)
    b.g.outputs = [b.g.ops[-1].outputs[0]]
    return b, [br1, br2, br3], cat


def test_concat_inputs_share_the_fix_point():
    b, branches, cat = _inception()
    stats = collect_stats(b.g, b.batches(), progress=False)
    own = {n: stats.fix_point(n) for n in branches}
    assert len(set(own.values())) > 1  # calibrated alone they would differ
    res = quantize_with_report(b.g, stats)
    gq = res.graph
    _all_quant_params(gq)
    fps = {gq.tensors[n].fix_point for n in branches + [cat]}
    assert len(fps) == 1
    assert quant_params(gq.op(gq.ops[[o.outputs[0] for o in gq.ops].index(cat)].name), gq).free
    assert fps.pop() <= min(own.values())  # the shared fp fits the widest branch
    assert not res.report.requantizing


def test_concat_with_graph_input_and_conflicting_pins_requantizes():
    b = _FB(3)
    x = b.input(4, 6, 6)
    r6 = b.conv(x, 4, 3, 1, 1, act="relu6")  # pinned to 4
    c = b.conv(x, 4, 3, 1, 1, gain=0.2)
    cat = b.op("concat", [x, r6, c], (1, 12, 6, 6), axis=1)
    b.g.outputs = [cat]
    stats = collect_stats(b.g, b.batches(), progress=False)
    res = quantize_with_report(b.g, stats, overrides={x: 6})
    gq = res.graph
    _all_quant_params(gq)
    assert gq.tensors[x].fix_point == 6  # graph input keeps its own fp
    assert gq.tensors[r6].fix_point == 4 and gq.tensors[cat].fix_point == 4 and gq.tensors[c].fix_point == 4
    q = quant_params(gq.ops[-1], gq)
    assert not q.free and q.requant[0] is not None and q.requant[1] is None
    assert res.report.requantizing


def test_pinned_fix_point_does_not_clip_a_wider_concat_branch():
    b = _FB(11)
    x = b.input(4, 6, 6)
    r6 = b.conv(x, 4, 3, 1, 1, act="relu6")
    wide = b.conv(x, 4, 3, 1, 1, act="none", gain=40.0)  # values far beyond the 8.0 that fp 4 can hold
    cat = b.op("concat", [r6, wide], (1, 8, 6, 6), axis=1)
    b.g.outputs = [cat]
    stats = collect_stats(b.g, b.batches(), progress=False)
    assert stats[wide].absmax > 16
    res = quantize_with_report(b.g, stats)
    gq = res.graph
    _all_quant_params(gq)
    assert gq.tensors[r6].fix_point == 4
    assert gq.tensors[wide].fix_point == gq.tensors[cat].fix_point < 4
    assert res.report.requantizing


def test_overrides_are_respected():
    b = _resnetish()
    names = [op.outputs[0] for op in b.g.ops]
    w0 = b.g.ops[0].params["weights"]
    stats = collect_stats(b.g, b.batches(), progress=False)
    base = quantize_graph(b.g, stats)
    over = {names[1]: base.tensors[names[1]].fix_point - 1, names[-1]: 2, w0: 5}
    res = quantize_with_report(b.g, stats, overrides=over)
    gq = res.graph
    _all_quant_params(gq)
    for n, fp in over.items():
        assert gq.tensors[n].fix_point == fp
        assert res.report.tensors[n].reason == "override"
    # maxpool output overridden: its input (the conv output) shares it
    assert gq.tensors[names[0]].fix_point == over[names[1]]


def test_overrides_alone_without_stats():
    b = _FB(4)
    x = b.input(2, 5, 5)
    c = b.conv(x, 3, 3, 1, 1)
    b.g.outputs = [c]
    with pytest.raises(QuantizationError, match=f"tensor '{c}'.*no fix_point override and no calibration"):
        quantize_graph(b.g, None, overrides={x: 5})
    gq = quantize_graph(b.g, None, overrides={x: 5, c: 3})
    assert (gq.tensors[x].fix_point, gq.tensors[c].fix_point) == (5, 3)
    with pytest.raises(QuantizationError, match="no such tensor"):
        quantize_graph(b.g, None, overrides={"nope": 1})


def test_override_conflicting_with_relu6_is_named():
    b = _FB(5)
    x = b.input(2, 5, 5)
    c = b.conv(x, 3, 3, 1, 1, act="relu6")
    b.g.outputs = [c]
    with pytest.raises(QuantizationError, match=f"op '{b.g.ops[0].name}' \\(conv2d\\): output '{c}' must have "
                                               "fix_point 4"):
        quantize_graph(b.g, collect_stats(b.g, b.batches(), progress=False), overrides={c: 5})


def test_leaky_alpha_far_from_26_256_is_rejected():
    b = _FB(6)
    x = b.input(2, 5, 5)
    b.g.outputs = [b.conv(x, 3, 3, 1, 1, act="leaky_relu", alpha=0.2)]
    stats = collect_stats(b.g, b.batches(), progress=False)
    with pytest.raises(QuantizationError, match=f"op '{b.g.ops[0].name}'.*alpha 0.2"):
        quantize_graph(b.g, stats)
    b2 = _FB(6)
    x = b2.input(2, 5, 5)
    b2.g.outputs = [b2.op("activation", [x], (1, 2, 5, 5), mode="leaky_relu", alpha=0.2)]
    with pytest.raises(QuantizationError, match=f"op '{b2.g.ops[0].name}'.*alpha 0.2"):
        quantize_graph(b2.g, collect_stats(b2.g, b2.batches(), progress=False))


def test_shift_cut_adjustments():
    """Tiny weights: fp_w lowered so shift_cut <= 16. Huge weights before a pinned output: fp_w raised
    (saturating); huge weights with a free output: the output fp lowered."""
    b = _FB(7)
    x = b.input(4, 6, 6)
    tiny = b.op("conv2d", [x], (1, 4, 6, 6), {"weights": b.const(b.rng.standard_normal((4, 4, 1, 1)) * 1e-5)})
    big = b.op("conv2d", [x], (1, 4, 6, 6), {"weights": b.const(b.rng.standard_normal((4, 4, 1, 1)) * 40)})
    b.g.outputs = [tiny, big]
    w_tiny, w_big = (op.params["weights"] for op in b.g.ops)
    stats = collect_stats(b.g, b.batches(), progress=False)
    fp_big = stats.fix_point(x) + choose_fix_point(b.g.tensors[w_big].data) + 2  # needs shift_cut -2
    res = quantize_with_report(b.g, stats, overrides={tiny: 2, big: fp_big})
    gq = res.graph
    _all_quant_params(gq)
    fx = gq.tensors[x].fix_point
    assert fx + gq.tensors[w_tiny].fix_point - 2 == 16
    assert gq.tensors[w_tiny].fix_point < res.report.tensors[w_tiny].chosen
    assert fx + gq.tensors[w_big].fix_point - gq.tensors[big].fix_point == 0
    assert gq.tensors[w_big].fix_point > res.report.tensors[w_big].chosen
    assert res.report.tensors[w_big].saturated > 0
    assert sum("shift_cut" in n for n in res.report.notes) == 2

    res2 = quantize_with_report(b.g, stats, overrides={x: -5})
    g2 = res2.graph
    _all_quant_params(g2)
    assert g2.tensors[w_big].fix_point == res2.report.tensors[w_big].chosen  # weights untouched
    assert g2.tensors[big].fix_point == -5 + g2.tensors[w_big].fix_point < stats.fix_point(big)
    assert any(f"tensor {big!r}" in n and "lowered" in n for n in res2.report.notes)


def test_bias_fix_point_is_constrained():
    b = _FB(8)
    x = b.input(3, 4, 4)
    w = b.const(np.full((2, 3, 1, 1), 0.01))
    bias = b.const(np.array([1e-6, -2e-6]))  # would want a huge fp
    c = b.op("conv2d", [x], (1, 2, 4, 4), {"weights": w, "bias": bias})
    b.g.outputs = [c]
    gq = quantize_graph(b.g, collect_stats(b.g, b.batches(), progress=False))
    _all_quant_params(gq)
    q = quant_params(gq.ops[0], gq)
    assert q.shift_bias == 0  # clamped to fp_in + fp_w
    assert gq.tensors[bias].fix_point == gq.tensors[x].fix_point + gq.tensors[w].fix_point


def test_avgpool_count_include_pad_false_with_pads_rejected():
    b = _FB(9)
    x = b.input(3, 6, 6)
    b.g.outputs = [b.op("avg_pool2d", [x], (1, 3, 6, 6), kernel=[3, 3], pads=[1, 1, 1, 1],
                        count_include_pad=False)]
    with pytest.raises(QuantizationError, match=f"op '{b.g.ops[0].name}'.*count_include_pad=False"):
        quantize_graph(b.g, collect_stats(b.g, b.batches(), progress=False))


def test_upsample_hard_sigmoid_prelu():
    b = _FB(10)
    x = b.input(4, 3, 3)
    up = b.op("upsample_nearest", [x], (1, 4, 6, 6), scale=[2, 2])
    hs = b.op("activation", [up], (1, 4, 6, 6), mode="hard_sigmoid")
    pr = b.op("activation", [up], (1, 4, 6, 6), {"alpha": b.const(np.array([0.25, -0.5, 0.1, 2.0]))}, mode="prelu")
    b.g.outputs = [hs, pr]
    stats = collect_stats(b.g, b.batches(), progress=False)
    res = quantize_with_report(b.g, stats)
    gq = res.graph
    _all_quant_params(gq)
    assert gq.tensors[up].fix_point == gq.tensors[x].fix_point
    assert gq.tensors[hs].fix_point == 7
    assert gq.tensors[gq.ops[2].params["alpha"]].fix_point == 0  # negative slope
    s = _quantized_vs_float(b.g, gq, {x: np.random.default_rng(3).standard_normal((1, 4, 3, 3))})
    assert s[hs] > 25.0, s
    assert "prelu" in res.report.format()


def test_float_graph_required_and_bad_method():
    b = _resnetish()
    stats = collect_stats(b.g, b.batches(1), progress=False)
    with pytest.raises(QuantizationError, match="unknown fix_point method"):
        quantize_graph(b.g, stats, method="kl")
    gq = quantize_graph(b.g, stats)
    with pytest.raises(QuantizationError, match="takes a float32 graph"):
        quantize_graph(gq, stats)


def _zoo_float_xgraphs(name: str) -> list[Graph]:
    """Float XGraphs of the DPU partitions of a reduced zoo model (frontend -> partition -> from_relax)."""
    from tvm_dpu import zoo
    from tvm_dpu.frontend import from_onnx
    from tvm_dpu.passes import from_relax, partition
    from tvm_dpu.backend.dpu_compile import dpu_functions

    pmod, _ = partition(from_onnx(zoo.build_model(name, reduced=True)), load_arch("DPUCZDX8G_ISA1_B4096"))
    return [from_relax.build_float_xgraph(fn, sym).graph for sym, fn in dpu_functions(pmod).items()]


@pytest.mark.parametrize("name,bound", [("resnet18", 18.0), ("mobilenetv2", 12.0)])
def test_zoo_reduced_models(name, bound):
    """Whole reduced networks: every op quantizes; the output of golden(int8) tracks the float reference."""
    graphs = _zoo_float_xgraphs(name)
    assert graphs
    rng = np.random.default_rng(0)
    for g in graphs:
        shape = g.tensors[g.inputs[0]].shape
        stats = collect_stats(g, [rng.standard_normal((4,) + shape[1:]) for _ in range(2)], progress=False)
        gq = quantize_graph(g, stats)
        _all_quant_params(gq)
        relu6 = [op.outputs[0] for op in g.ops if op.attrs.get("act") == "relu6"]
        assert all(gq.tensors[t].fix_point == 4 for t in relu6)
        sq = [min(_quantized_vs_float(g, gq, {g.inputs[0]: rng.standard_normal(shape)}).values()) for _ in range(2)]
        print(f"{name} reduced, partition {g.name[:30]}...: {len(g.ops)} ops, SQNR {min(sq):.1f} dB")
        assert min(sq) > bound


@pytest.mark.parametrize("seed", range(20))
def test_random_graphs_always_satisfy_the_dpu_constraints(seed):
    """Weight gains over seven decades, every fused activation, residual adds, concats and pools: the quantizer
    always finds fix_points that every op's quantization rule accepts."""
    r = np.random.default_rng(seed)
    b = _FB(seed)
    cur = b.input(4, 8, 8)
    for _ in range(5):
        act = str(r.choice(["none", "relu", "relu6", "leaky_relu"]))
        kw = dict(act=act, gain=10.0 ** r.uniform(-4, 3), alpha=0.1 if act == "leaky_relu" else None)
        kind = r.integers(0, 4)
        if kind == 0:
            cur = b.conv(cur, 4, 3, 1, 1, **kw)
        elif kind == 1:
            cur = b.op("eltwise_add", [b.conv(cur, 4, 1, **kw), cur], b.shape(cur), act=str(r.choice(["none", "relu"])))
        elif kind == 2:
            cur = b.op("concat", [b.conv(cur, 2, 1, **kw), b.conv(cur, 2, 3, 1, 1)], b.shape(cur), axis=1)
        else:
            cur = b.op("max_pool2d", [cur], b.shape(cur), kernel=[3, 3], pads=[1, 1, 1, 1])
    b.g.outputs = [cur]
    res = quantize_with_report(b.g, collect_stats(b.g, b.batches(2), progress=False))
    _all_quant_params(res.graph)
    for op in b.g.ops:
        if op.attrs.get("act") == "relu6":
            assert res.graph.tensors[op.outputs[0]].fix_point == 4
        if op.type == "max_pool2d":
            assert len({res.graph.tensors[t].fix_point for t in op.inputs + op.outputs}) == 1
