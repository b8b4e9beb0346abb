"""The DPUV3E code generator (DPUCAHX8H: codegen/dpuv3e_*.py) and the DPUCAHX8H limits profile: reduced zoo models
compiled for DPUCAHX8H_ISA2 and _DWC run bit-exact on the DPUV3E emulator against the golden reference, their
dependency tokens follow the protocol, the README example compiles and verifies for the family, and what the family
cannot do stays on the CPU with a reason. (AMD's simulator runs five of these programs: tests/data/
dpuv3e_conformance/tvmdpu_*, checked in tests/test_emu_dpuv3e.py.)"""
from __future__ import annotations

import copy
import functools
import warnings
from pathlib import Path

import numpy as np
import pytest

import tvm_dpu
from tvm_dpu import zoo
from tvm_dpu.arch import load_arch
from tvm_dpu.arch.limits import check_op
from tvm_dpu.arch.opdesc import OpDesc
from tvm_dpu.codegen.compiler import compile_graph
from tvm_dpu.codegen.dpuv3e_fields import scale_exponent, shift_bias_exponent
from tvm_dpu.codegen.dpuv3e_ops import pack_ohwi, scale_field, shift_bias_field
from tvm_dpu.codegen.isa import decode_program
from tvm_dpu.codegen.tiling import CodegenError
from tvm_dpu.emulator.dpuv3e import DpuV3EEmulator
from tvm_dpu.ops import OpRegistryError, isa_emitter, registry
from tvm_dpu.ops import hook as registry_hook
from tvm_dpu.runtime.dep_check import check_code
from tvm_dpu.timing.depcheck import check as check_deps
from tvm_dpu.xgraph import run_graph

REPO = Path(__file__).resolve().parents[1]
ARCHS = ("DPUCAHX8H_ISA2", "DPUCAHX8H_ISA2_DWC")
# mixed_cnn (conv, dense, max / global average pool, add, concat) and MobileNetV2 (depthwise, relu6, residual adds)
# by default; every reduced zoo model with -m slow
FAST = ("mixed_cnn", "mobilenetv2")
MODELS = [m if m in FAST else pytest.param(m, marks=pytest.mark.slow) for m in zoo.MODELS]


@functools.cache  # a built model is only read (a test that changes a graph changes its own copy)
def _build(name: str, arch: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tvm_dpu.build(zoo.build_model(name, reduced=True), arch=arch,
                             calibration=[zoo.random_input(name, reduced=True)], progress=False)


def emulator_vs_golden(graph, arch, seed: int = 7):
    """(compiled subgraph, elements of its outputs differing between the DPUV3E emulator and the golden
    reference) on seeded random int8 inputs."""
    compiled = compile_graph(graph, arch)
    rng = np.random.default_rng(seed)
    feeds = {n: rng.integers(-128, 128, graph.tensors[n].shape).astype(np.int8) for n in graph.inputs}
    regions = compiled.new_regions()
    for b in compiled.inputs:
        b.fmap.to_ddr(regions[b.fmap.reg_id], feeds[b.name])
    stats = DpuV3EEmulator(arch).run(compiled.code, regions)
    assert stats.ended
    golden = run_graph(graph, feeds)
    return compiled, sum(int(np.sum(b.fmap.from_ddr(regions[b.fmap.reg_id]) != golden[b.name]))
                         for b in compiled.outputs)


@pytest.mark.parametrize("name", MODELS)
def test_reduced_zoo_is_bit_exact_on_both_targets(name):
    """Partitioned by the DPUCAHX8H limits, every DPU subgraph compiles for ISA2 (depthwise as diagonal CONVs) and
    _DWC (depthwise on DPTWISE): 0 elements differ from the golden reference, the tokens balance."""
    model = _build(name, ARCHS[0])
    assert model.runners, f"{name}: no DPU subgraph"
    for arch_name in ARCHS:
        arch = load_arch(arch_name)
        for sym, r in model.runners.items():
            compiled, bad = emulator_vs_golden(r.graph, arch)
            assert bad == 0, (name, arch_name, sym)
            rep = check_deps(compiled.code, isa="DPUV3E")
            assert rep.ok, (name, arch_name, sym, rep.problems[:3])
            # and race-free on the emulator's access sets: the tokens order every pair of instructions that touch
            # the same bank row or DDR byte (a row's SAVE and the consumer's LOAD of it, at the program's DDR grain)
            races = check_code(compiled.code, arch, compiled.new_regions())
            assert races.races_checked and races.ok, (name, arch_name, sym, [str(r) for r in races.races[:3]])
            names = {ins.name for ins in decode_program(compiled.code, isa="DPUV3E")}
            depthwise = any(op.type == "depthwise_conv2d" for op in r.graph.ops)
            assert ("DPTWISE" in names) == (depthwise and arch_name.endswith("_DWC")), (name, arch_name)


def test_same_graph_same_bytes():
    g = next(iter(_build("mixed_cnn", ARCHS[0]).runners.values())).graph
    a, b = (compile_graph(g, load_arch(ARCHS[1])) for _ in range(2))
    assert np.array_equal(a.code, b.code) and np.array_equal(a.params, b.params)


def test_the_readme_example_compiles_and_verifies_for_dpucahx8h(tmp_path, capsys):
    from tvm_dpu.cli import main

    out = tmp_path / "out"
    assert main(["compile", str(REPO / "examples" / "mixed_cnn.onnx"), "--arch", "DPUCAHX8H_ISA2", "--calib",
                 str(REPO / "examples" / "mixed_cnn_calib.npz"), "-o", str(out), "-q"]) == 0
    capsys.readouterr()
    assert main(["run", str(out / "mixed_cnn.tvmdpu"), "--input", str(REPO / "examples" / "mixed_cnn_input.npz"),
                 "--verify"]) == 0
    assert "verify: 2 subgraphs, 1 run(s), 2 subgraph calls, 0 mismatching elements" in capsys.readouterr().out
    assert main(["inspect", "--check-deps", str(out / "mixed_cnn.tvmdpu")]) == 0
    capsys.readouterr()
    assert main(["inspect", "--disasm", str(out / "mixed_cnn.tvmdpu")]) == 0  # decoded as DPUV3E
    listing = capsys.readouterr().out
    assert " CONVINIT " in listing and " POOLINIT " in listing and " ELEWINIT " in listing


def _op(kind: str, **kw) -> OpDesc:
    base = dict(in_shape=(1, 32, 16, 16), out_shape=(1, 32, 16, 16), kernel=(3, 3), stride=(1, 1),
                pad=(1, 1, 1, 1), dilation=(1, 1))
    base.update(kw)
    return OpDesc(kind, **base)


def test_limits_profile_keeps_what_dpuv3e_cannot_do_on_the_cpu():
    arch = load_arch("DPUCAHX8H_ISA2")
    t = "DPUCAHX8H_ISA2"
    assert check_op(arch, _op("conv2d")) == []
    assert check_op(arch, _op("conv2d", dilation=(2, 2), pad=(2, 2, 2, 2))) == []  # as stride phases
    assert check_op(arch, _op("depthwise_conv2d", dilation=(2, 2), pad=(2, 2, 2, 2), groups=32)) == \
        [f"dilation 2x2 exceeds [1,1] on {t}"]
    assert check_op(arch, _op("conv2d", stride=(8, 8))) == [f"stride 8x8 exceeds [1,4] on {t}"]
    # the weights of one output-channel group fill the 2048-row CONVW bank, not the 8192-row image bank
    big = _op("conv2d", in_shape=(1, 4096, 8, 8), kernel=(3, 3))
    assert check_op(arch, big) == []  # split over input-channel slices (limits "split")
    assert check_op(arch, _op("depthwise_conv2d", kernel=(4, 4), pad=(1, 1, 1, 1), groups=32)) == \
        [f"kernel_h 4 is not one of [1, 2, 3, 5, 7] on {t}", f"kernel_w 4 is not one of [1, 2, 3, 5, 7] on {t}"]
    assert check_op(arch, _op("max_pool2d", kernel=(9, 9), pad=(0, 0, 0, 0))) == [f"kernel 9x9 exceeds [1,8] on {t}"]
    assert check_op(arch, _op("avg_pool2d", kernel=(2, 3), pad=(0, 0, 0, 0)))[0].startswith("kernel 2x3 is not square")
    for kind, why in (("eltwise_mul", "eltwise engine adds only"), ("activation", "has no ALU")):
        (reason,) = check_op(arch, _op(kind))
        assert reason.startswith(f"{kind} not supported on {t}: ") and why in reason, kind
    dense = OpDesc("dense", in_shape=(1, 8, 32, 32), out_shape=(1, 10))
    assert check_op(arch, dense) == [f"input H 32 exceeds the 16 a CONV kernel covers on {t}",
                                     f"input W 32 exceeds the 16 a CONV kernel covers on {t}"]


def test_each_dpuv3e_lowering_hook_resolves_in_codegen():
    hooked = {k for k, d in registry().items() if dict(d.isa_emitters).get("DPUV3E")}
    assert hooked == {"conv2d", "dense", "depthwise_conv2d", "conv2d_transpose", "max_pool2d", "avg_pool2d",
                      "eltwise_add", "concat", "upsample_nearest"}
    for kind in hooked - {"upsample_nearest"}:
        assert isa_emitter(kind, "DPUV3E").__module__ == "tvm_dpu.codegen.dpuv3e_ops"
    # LOAD / SAVE only: the DPUCZDX8G emitter, whose fields DPUV3E's LOAD and SAVE have too
    assert isa_emitter("upsample_nearest", "DPUV3E") is registry_hook("upsample_nearest", "emitter")
    with pytest.raises(OpRegistryError, match="op kind 'eltwise_mul' has no DPUV3E emitter"):
        isa_emitter("eltwise_mul", "DPUV3E")


def test_an_op_without_a_dpuv3e_lowering_is_one_error_naming_it():
    g = copy.deepcopy(next(r.graph for r in _build("mixed_cnn", ARCHS[0]).runners.values()
                           if any(op.type == "eltwise_add" for op in r.graph.ops)))
    add = next(op for op in g.ops if op.type == "eltwise_add")
    add.type = "eltwise_mul"  # what the DPUCZDX8G ELEW engine does and DPUCAHX8H's does not
    with pytest.raises(CodegenError, match=rf"op '{add.name}' \(eltwise_mul\): not supported by the DPUV3E code "
                                           r"generator of DPUCAHX8H_ISA2 \(op kind 'eltwise_mul' has no DPUV3E"):
        compile_graph(g, load_arch("DPUCAHX8H_ISA2"))


def test_field_encodings_follow_the_simulator():
    # scale 2**e in the 4-bit POOL shift_cut / ELEW shift_write; a negative bias shift as 32 - s
    assert [scale_field(e, "x") for e in (0, 7, -1, -7)] == [0, 7, 9, 15]
    with pytest.raises(CodegenError, match="scale 2\\*\\*8 is outside"):
        scale_field(8, "op 'p'")
    assert shift_bias_field(3) == 3 and shift_bias_field(-1) == 33
    # and the emulator reads back what the code generator writes
    assert all(scale_exponent(scale_field(e, "x")) == e for e in range(-7, 8))
    assert all(shift_bias_exponent(shift_bias_field(s)) == s for s in range(-31, 21))
    # 20 output channels, 3 input channels, 1x1: two OCP groups, channels padded to one ICP group, OHWI order
    w = np.arange(20 * 3, dtype=np.int8).reshape(20, 3, 1, 1)
    packed = pack_ohwi(w, 16, 16).reshape(32, 16)
    assert np.array_equal(packed[:20, :3], w[:, :, 0, 0]) and not packed[20:].any() and not packed[:, 3:].any()


def test_the_xmodel_export_loads_in_xir_and_passes_the_vart_checker(tmp_path, capsys):
    """A DPUCAHX8H build exported as .xmodel: the VART checker finds nothing; AMD's XIR (when installed) loads it
    and its shape inference agrees on every op."""
    from tvm_dpu.cli import main
    from tvm_dpu.xmodel.xir_judge import xir_unavailable

    path = _build("mixed_cnn", ARCHS[0]).export(tmp_path / "m.xmodel")
    assert main(["inspect", "--check-vart", str(path)]) == 0
    assert "0 error(s), 0 warning(s)" in capsys.readouterr().out
    if xir_unavailable():
        pytest.skip(xir_unavailable())
    assert main(["inspect", "--check-xir", str(path)]) == 0
    assert "XIR's shape inference agrees on every op" in capsys.readouterr().out


# ---- ops the DPUV3E CONV runs as stride phases (transposed, dilated) and grouped convs ---------------------------
@pytest.mark.parametrize("arch_name", ARCHS)
@pytest.mark.parametrize("k,s,p,op_pad", [(4, 2, 1, 0), (3, 2, 0, 1), (2, 3, 1, 2)])
def test_transposed_conv_as_phases(arch_name, k, s, p, op_pad):
    """(3, 2, 0, 1) and (2, 3, 1, 2) have outputs whose window holds only padding (act(bias) fills them)."""
    from test_coverage_ops import _B, _tconv

    b = _B(k * 10 + s)
    _tconv(b, b.input(20, 7, 6), 24, k, s, p, op_pad)
    assert emulator_vs_golden(b.g, load_arch(arch_name))[1] == 0


@pytest.mark.parametrize("arch_name", ARCHS)
@pytest.mark.parametrize("cin,cout,groups,k,s,p,d", [(18, 20, 1, 3, 1, 2, 2), (18, 20, 1, 3, 2, 2, 2),
                                                     (48, 96, 4, 3, 2, 1, 1), (24, 36, 3, 3, 1, 2, 2)])
def test_dilated_and_grouped_convs(arch_name, cin, cout, groups, k, s, p, d):
    from test_coverage_ops import _B, _gconv

    b = _B(cin + cout + groups)
    _gconv(b, b.input(cin, 13, 11), cout, k, groups, s, p, d)
    assert emulator_vs_golden(b.g, load_arch(arch_name))[1] == 0
