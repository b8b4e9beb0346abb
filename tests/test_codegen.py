"""Code generator: every op compiled to machine code, run on the emulator, must equal the golden reference bit for
bit (the two share only the fixed-point primitives and the quantization parameters)."""
from __future__ import annotations

import numpy as np
import pytest

from tvm_dpu.arch import load_arch
from tvm_dpu.codegen.compiler import compile_graph, compile_graph_fused
from tvm_dpu.codegen.conv import CONV_VARIANTS
from tvm_dpu.codegen.tiling import CodegenError
from tvm_dpu.codegen.isa import CONV, LOAD, SAVE
from tvm_dpu.xgraph import Graph, Op, Tensor
from conftest import emulator_vs_golden

ARCHS = ["DPUCZDX8G_ISA1_B4096", "DPUCZDX8G_ISA1_B1152"]


class _B:
    """Tiny quantized-graph builder for the tests."""

    def __init__(self, seed: int = 0):
        self.g = Graph("g")
        self.rng = np.random.default_rng(seed)
        self.n = 0

    def _name(self, p: str) -> str:
        self.n += 1
        return f"{p}{self.n}"

    def input(self, c: int, h: int, w: int, fp: int = 4) -> str:
        t = self.g.add_tensor(Tensor(self._name("in"), (1, c, h, w), "int8", fp))
        self.g.inputs.append(t.name)
        return t.name

    def const(self, shape, fp: int, lo: int = -128, hi: int = 128) -> str:
        data = self.rng.integers(lo, hi, shape).astype(np.int8)
        return self.g.add_tensor(Tensor(self._name("k"), tuple(shape), "int8", fp, data)).name

    def op(self, type_: str, inputs: list[str], shape, fp: int, params=None, **attrs) -> str:
        out = self.g.add_tensor(Tensor(self._name(type_), tuple(shape), "int8", fp)).name
        self.g.add_op(Op(self._name("op"), type_, list(inputs), [out], attrs, params or {}))
        return out

    def conv(self, x: str, cout: int, k: int, s: int = 1, p: int = 0, fp_out: int = 3, act: str = "relu",
             bias: bool = True, fp_w: int = 7) -> str:
        _, c, h, w = self.g.tensors[x].shape
        params = {"weights": self.const((cout, c, k, k), fp_w)}
        if bias:
            params["bias"] = self.const((cout,), 5)
        ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
        return self.op("conv2d", [x], (1, cout, ho, wo), fp_out, params, strides=[s, s], pads=[p, p, p, p], act=act)

    def dw3x3(self, x: str, s: int) -> str:
        """3x3 depthwise conv of stride s, pad 1, relu, over `x` (the middle of a pw -> dw -> pw block)."""
        _, c, h, w = self.shape(x)
        ho, wo = (h + 2 - 3) // s + 1, (w + 2 - 3) // s + 1
        return self.op("depthwise_conv2d", [x], (1, c, ho, wo), 4,
                       {"weights": self.const((c, 1, 3, 3), 6), "bias": self.const((c,), 4)},
                       strides=[s, s], pads=[1, 1, 1, 1], groups=c, act="relu")

    def shape(self, t: str):
        return self.g.tensors[t].shape


def _check(graph: Graph, arch_name: str, seed: int = 0, plan=None) -> dict:
    run = emulator_vs_golden(graph, arch_name, plan, seed)
    assert run.bad == 0, f"elements that differ, by output: {run.by_output}"
    return run.compiled.instr_counts


@pytest.mark.parametrize("arch", ARCHS)
def test_resnet_block(arch):
    b = _B()
    x = b.input(3, 32, 30)
    c1 = b.conv(x, 24, 7, 2, 3, fp_out=3)
    p1 = b.op("max_pool2d", [c1], (1, 24, 8, 8), 3, kernel=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c2 = b.conv(p1, 24, 3, 1, 1, fp_out=3)
    c3 = b.conv(c2, 24, 3, 1, 1, fp_out=2, act="none")
    a = b.op("eltwise_add", [c3, p1], (1, 24, 8, 8), 2, act="relu")
    gp = b.op("avg_pool2d", [a], (1, 24, 1, 1), 3, **{"global": True})
    d = b.op("dense", [gp], (1, 10, 1, 1), 2, {"weights": b.const((10, 24), 7), "bias": b.const((10,), 4)})
    b.g.outputs = [d, a]
    counts = _check(b.g, arch)
    assert counts["CONV"] >= 3 and counts["ALU"] >= 2 and counts["ELEW"] >= 1


@pytest.mark.parametrize("arch", ARCHS)
def test_inception_concat_aliasing_and_requant(arch):
    b = _B(1)
    x = b.input(16, 9, 9)
    br1 = b.conv(x, 8, 1, fp_out=3)
    br2 = b.conv(b.conv(x, 12, 1, fp_out=3), 20, 3, 1, 1, fp_out=3)
    br3 = b.conv(x, 5, 5, 1, 2, fp_out=2)  # another fix_point: requantized into the concat
    pool = b.op("max_pool2d", [x], (1, 16, 9, 9), 4, kernel=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])
    br4 = b.conv(pool, 7, 1, fp_out=3)
    cat = b.op("concat", [br1, br2, br3, br4], (1, 40, 9, 9), 3, axis=1)
    b.conv(cat, 16, 1, fp_out=3)
    _check(b.g, arch)


@pytest.mark.parametrize("arch", ARCHS)
def test_mobilenet_block(arch):
    b = _B(2)
    x = b.input(24, 14, 14)
    e = b.conv(x, 72, 1, fp_out=4, act="relu6")
    dw = b.op("depthwise_conv2d", [e], (1, 72, 7, 7), 4,
              {"weights": b.const((72, 1, 3, 3), 7), "bias": b.const((72,), 6)},
              strides=[2, 2], pads=[1, 1, 1, 1], act="relu6")
    p = b.conv(dw, 32, 1, fp_out=3, act="none")
    b.op("eltwise_add", [p, b.conv(p, 32, 3, 1, 1, fp_out=4, act="leaky_relu", bias=False)], (1, 32, 7, 7), 3)
    _check(b.g, arch)


@pytest.mark.parametrize("arch", ARCHS)
def test_alu_activations_avgpool_upsample(arch):
    b = _B(3)
    x = b.input(20, 6, 10, fp=5)
    lk = b.op("activation", [x], (1, 20, 6, 10), 5, mode="leaky_relu", alpha=26 / 256)
    hs = b.op("activation", [lk], (1, 20, 6, 10), 7, mode="hard_sigmoid")
    pr = b.op("activation", [x], (1, 20, 6, 10), 5, {"alpha": b.const((20,), 6, lo=0)}, mode="prelu")
    ap = b.op("avg_pool2d", [pr], (1, 20, 2, 3), 5, kernel=[3, 3], strides=[3, 3])
    up = b.op("upsample_nearest", [ap], (1, 20, 6, 9), 5, scale=[3, 3])
    b.g.outputs = [hs, up]
    _check(b.g, arch)


@pytest.mark.parametrize("arch", ARCHS)
def test_large_layer_tiles_weights_and_width(arch):
    """More output groups than fit in CONVW (weight chunks) and a width that needs several column tiles."""
    b = _B(4)
    x = b.input(200, 6, 300)
    b.conv(x, 150, 3, 1, 1, fp_out=3)
    counts = _check(b.g, arch)
    assert counts["CONV"] > 10


@pytest.mark.parametrize("arch", ARCHS)
def test_conv_variants_are_bit_exact_and_chosen_by_the_timing_model(arch):
    """Kernel polymorphism: every conv variant computes the golden result with its own instruction sequence; the
    choice is the variant with the fewest predicted cycles, and the plan says so."""
    from tvm_dpu.fusion.select import choose_conv_variants
    from tvm_dpu.types import SINGLE, FusionPlan, Group

    b = _B(5)
    # 300 input channels: on B4096 the widest tile of 200 channels halves its resident groups itself already
    # (conv._swap_chunk), which made "wide" and "split_weights" the same instructions
    x = b.input(300, 6, 200)
    b.conv(x, 150, 3, 1, 1, fp_out=3)
    (op,) = b.g.ops
    codes = set()
    for v in CONV_VARIANTS:
        plan = FusionPlan("v", [Group(SINGLE, (op.name,))], variants={op.name: v})
        counts = _check(b.g, arch, plan=plan)
        codes.add((v, counts["CONV"], counts["LOAD"]))
    assert len({c[1:] for c in codes}) == len(CONV_VARIANTS)  # three different instruction sequences
    chosen = choose_conv_variants(b.g, load_arch(arch), FusionPlan("none", [Group(SINGLE, (op.name,))]))
    info = chosen.stats["conv_variants"][op.name]
    assert set(info["predicted_cycles"]) == set(CONV_VARIANTS)
    best = min(info["predicted_cycles"].values())
    assert info["predicted_cycles"][info["chosen"]] == best and str(round(best)) in info["why"]
    assert chosen.variants.get(op.name, "wide") == info["chosen"]


def test_unknown_conv_variant_is_an_error():
    from tvm_dpu.types import SINGLE, FusionPlan, Group

    b = _B(6)
    b.conv(b.input(8, 4, 4), 8, 3, 1, 1)
    b.g.outputs = [b.g.ops[-1].outputs[0]]
    plan = FusionPlan("v", [Group(SINGLE, (b.g.ops[0].name,))], variants={b.g.ops[0].name: "fast"})
    with pytest.raises(CodegenError, match="conv variant 'fast'"):
        compile_graph_fused(b.g, load_arch(ARCHS[0]), plan)


def test_codegen_error_names_op():
    b = _B(5)
    x = b.input(4, 8, 8)
    # a grouped (not depthwise) transposed conv has no code generator yet (grouped conv2d has)
    b.op("conv2d_transpose", [x], (1, 4, 10, 10), 3, {"weights": b.const((4, 2, 3, 3), 7)}, groups=2)
    b.g.outputs = [b.g.ops[-1].outputs[0]]
    with pytest.raises(CodegenError, match=f"op '{b.g.ops[-1].name}' \\(conv2d_transpose\\): grouped"):
        compile_graph(b.g, load_arch("B4096"))


def test_dependency_tokens_pair_up():
    """Every dpdon of engine B on engine A is matched, in order, by a dpdby of A to B (the token discipline the
    timing model replays; an engine's counter to itself starts with OWN_CREDIT tokens, docs/dependency-protocol.md),
    and a CONV never starts before the LOADs of its tile."""
    b = _B(6)
    x = b.input(64, 20, 20)
    b.conv(b.conv(x, 64, 3, 1, 1), 32, 3, 1, 1)
    b.g.outputs = [b.g.ops[-1].outputs[0]]
    compiled = compile_graph(b.g, load_arch("B4096"))
    from tvm_dpu.codegen.isa import decode_program, instr_spec
    instrs = decode_program(compiled.code)
    engines = {"load": LOAD, "save": SAVE, "conv": CONV, "misc": 8}
    from tvm_dpu.timing.depcheck import OWN_CREDIT
    posted = {(a, bb): OWN_CREDIT if a == bb else 0 for a in engines.values() for bb in engines.values()}
    waited = {k: 0 for k in posted}
    for ins in instrs:
        e = engines[instr_spec(ins.name).category]
        for src in engines.values():
            if ins.dpdon & src:
                waited[(src, e)] += 1
                assert waited[(src, e)] <= posted[(src, e)]  # a post precedes its wait in program order
            if ins.dpdby & src:
                posted[(e, src)] += 1
    assert posted == {k: v + (OWN_CREDIT if k[0] == k[1] else 0) for k, v in waited.items()}
    assert posted[(LOAD, CONV)] > 0 and posted[(CONV, SAVE)] > 0 and posted[(SAVE, LOAD)] > 0


@pytest.mark.parametrize("arch", ARCHS)
def test_bias_one_bit_finer_than_the_accumulator(arch):
    """fp_bias = fp_in + fp_w + 1 (vai_c's TF2 dense layer): ISA field shift_bias 0, V = 2*acc + bias. Odd biases
    (which no coarser fix_point represents) on the CONV engine, the ALU's depthwise conv and a dense layer: the
    emulator equals the golden bit for bit, and the CONVINIT carries field 0."""
    from tvm_dpu.codegen.isa import decode_program
    from tvm_dpu.xgraph import quant_params

    b = _B(3)
    x = b.input(16, 6, 6, fp=4)
    odd = lambda n: b.g.add_tensor(Tensor(b._name("k"), (n,), "int8", 4 + 7 + 1,  # noqa: E731
                                          (b.rng.integers(-64, 64, n) * 2 + 1).astype(np.int8))).name
    c = b.op("conv2d", [x], (1, 16, 6, 6), 5, {"weights": b.const((16, 16, 3, 3), 7), "bias": odd(16)},
             strides=[1, 1], pads=[1, 1, 1, 1], act="none")
    b.g.tensors[b.g.ops[-1].params["bias"]].fix_point = 4 + 7 + 1
    assert (quant_params(b.g.ops[-1], b.g).shift_bias, quant_params(b.g.ops[-1], b.g).shift_bias_isa) == (-1, 0)
    d = b.op("depthwise_conv2d", [c], (1, 16, 6, 6), 4,
             {"weights": b.const((16, 1, 3, 3), 6), "bias": b.g.add_tensor(Tensor(
                 "dwb", (16,), "int8", 5 + 6 + 1, (b.rng.integers(-64, 64, 16) * 2 + 1).astype(np.int8))).name},
             strides=[1, 1], pads=[1, 1, 1, 1], groups=16, act="relu")
    gp = b.op("avg_pool2d", [d], (1, 16, 1, 1), 4, **{"global": True})
    b.g.tensors["dwb"].fix_point = 5 + 6 + 1
    e = b.op("dense", [gp], (1, 10, 1, 1), 2, {"weights": b.const((10, 16), 7), "bias": b.g.add_tensor(Tensor(
        "db", (10,), "int8", 4 + 7 + 1, (b.rng.integers(-64, 64, 10) * 2 + 1).astype(np.int8))).name})
    b.g.outputs = [e, c]
    run = emulator_vs_golden(b.g, arch, None, 0)
    assert run.bad == 0, run.by_output
    inits = [i for i in decode_program(run.compiled.code) if i.name == "CONVINIT"]
    assert any(i.fields["shift_bias"] == 0 for i in inits)
