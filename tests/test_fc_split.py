"""Large FC / conv layers on the DPU by splitting (issue 12): input-channel slices summed by ELEW adds
(backend/split_conv.py) and output-channel CONV chunks (codegen.tiling.OUT_GROUPS_MAX).

Small models on dnnvm-zu2 (B1152: bank_depth 2048, 12 channels per group, 256*12 = 3072 channels per CONV):
zero CPU nodes, golden == emulator bit for bit, close to onnxruntime float; the float split is exact; the cases
the split cannot take are clear errors. The full VGG-16 checks are slow.
"""
from __future__ import annotations

import copy
import dataclasses
import warnings

import numpy as np
import onnx
import pytest

from tvm_dpu.arch import load_arch
from tvm_dpu.codegen.fused import FUSED_EMITTERS, emittable
from tvm_dpu.codegen.fused_conv import fusable
from tvm_dpu.codegen.tiling import OUT_GROUPS_MAX
from tvm_dpu.fusion.select import plan_fusion
from tvm_dpu.backend.split_conv import SplitError, split_large_convs
from tvm_dpu.xgraph.float_ref import run_graph_float
from tvm_dpu.xgraph.graph import Graph, Op, Tensor
from tvm_dpu.zoo.graph_builder import LINEAR_GAIN, GraphBuilder

ZU2 = "dnnvm-zu2"
COSINE_MIN = 0.99  # the bound the end-to-end tests use against onnxruntime float (test_coverage_ops)


def vgg_like() -> onnx.ModelProto:
    """A reduced VGG with VGG-16's classifier problems on B1152: fc6 is a 7x7 conv over 512 channels after the
    flatten (7*7*ceil(512/12) = 2107 weight rows > 2048), fc7 has 3100 outputs (> 256*12, two CONV chunks), fc8
    reduces 3100 inputs (> 3072 channels for one CONV)."""
    b = GraphBuilder("vgg_fc_split", seed=0)
    x = b.input("X", (1, 3, 14, 14))
    x = b.relu(b.conv(x, "conv1", 512, 3, 1, 1), "relu1")
    x = b.maxpool(x, "pool1", 2, 2)
    x = b.flatten(x, "flatten")
    x = b.relu(b.gemm(x, "fc6", 64), "relu6")
    x = b.dropout(x, "drop6", 0.5)
    x = b.relu(b.gemm(x, "fc7", 3100), "relu7")
    x = b.gemm(x, "fc8", 10, gain=LINEAR_GAIN)
    return b.build(x)


def big_conv(act: str = "relu") -> onnx.ModelProto:
    """A 3x3 conv over 2736 channels: 9*ceil(2736/12) = 2052 weight rows > 2048 on B1152."""
    b = GraphBuilder(f"big_conv_{act}", seed=1)
    x = b.input("X", (1, 2736, 4, 4))
    x = b.conv(x, "conv", 24, 3, 1, 1)
    x = b.relu(x, "act") if act == "relu" else b.relu6(x, "act")
    return b.build(b.conv(x, "head", 8, 1, 1, 0, gain=LINEAR_GAIN))


def _build(model: onnx.ModelProto, arch: str = ZU2, seed: int = 1):
    import tvm_dpu

    shape = tuple(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim)
    rng = np.random.default_rng(seed)
    calib = [rng.standard_normal(shape).astype(np.float32) for _ in range(4)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = tvm_dpu.build(model, arch=arch, calibration=calib, progress=False)
    return compiled, rng.standard_normal(shape).astype(np.float32)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _run_checked(model: onnx.ModelProto, arch: str = ZU2):
    """Build, assert zero CPU nodes, run with golden verification and compare with onnxruntime: (compiled,
    cosine)."""
    import onnxruntime as ort

    compiled, x = _build(model, arch)
    rep = compiled.partition_report
    assert not rep.cpu_nodes, [(n.name, n.op, n.reason) for n in rep.cpu_nodes]
    compiled.set_verify(True)
    y = compiled.run(x)[0]
    results = compiled.verify_results()
    assert results and sum(r.mismatches for r in results) == 0
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {model.graph.input[0].name: x})[0]
    assert y.shape == ref.shape
    return compiled, _cosine(y, ref)


def _ops(compiled) -> list:
    return [op for r in compiled.runners.values() for op in r.graph.ops]


def test_vgg_like_classifier_runs_on_the_dpu():
    compiled, cos = _run_checked(vgg_like())
    assert cos > COSINE_MIN, cos
    ops = {op.name: op for op in _ops(compiled)}
    # fc6 and fc8: two partial convs each over whole channel groups, summed by one ELEW add with the activation
    assert [ops[f"fc6/part{k}"].attrs["in_slice"] for k in range(2)] == [[0, 264], [264, 248]]
    assert [ops[f"fc8/part{k}"].attrs["in_slice"] for k in range(2)] == [[0, 1560], [1560, 1540]]
    assert ops["fc6/sum"].type == "eltwise_add" and ops["fc6/sum"].attrs["act"] == "relu"
    assert ops["fc8/sum"].attrs["act"] == "none" and ops["fc6/part0"].attrs["act"] == "none"
    # fc7 is one conv; its 3100 outputs (259 groups of 12) run as CONV chunks of at most 256 groups
    assert "in_slice" not in ops["fc7"].attrs
    # each partial sum is a tensor with a fix_point of its own; the bias is added once
    graph = next(iter(compiled.runners.values())).graph
    assert all(graph.tensors[f"{ops['fc6/sum'].outputs[0]}/part{k}"].fix_point is not None for k in range(2))
    assert "bias" in ops["fc6/part0"].params and "bias" not in ops["fc6/part1"].params
    notes = {n.name: n.note for n in compiled.partition_report.nodes}
    assert notes["fc6"].startswith("input channels split into 2 slices of at most 264")
    assert "output channels in 2 CONV chunks" in notes["fc7"]


def test_oversized_conv_is_split_and_bit_exact():
    compiled, cos = _run_checked(big_conv())
    assert cos > COSINE_MIN, cos
    parts = [op for op in _ops(compiled) if op.attrs.get("in_slice")]
    assert [op.attrs["in_slice"] for op in parts] == [[0, 1368], [1368, 1368]]


def test_dilated_conv_beyond_the_channel_group_field_is_split():
    """dilation 2 over 1548 channels: 2*1548 > 256*12 (the dilated conv runs as phase convs, each partial too)."""
    b = GraphBuilder("dilated", seed=3)
    x = b.input("X", (1, 1548, 6, 6))
    x = b.relu(b.conv(x, "conv", 16, 3, 1, 1), "relu")
    model = b.build(b.conv(x, "head", 8, 1, 1, 0, gain=LINEAR_GAIN))
    conv = next(n for n in model.graph.node if n.name == "conv")  # dilation 2, pad 2: the same 6x6 output
    for a in conv.attribute:
        if a.name in ("pads", "dilations"):
            a.ints[:] = [2] * len(a.ints)
    compiled, cos = _run_checked(model)
    assert cos > COSINE_MIN, cos
    parts = [op.attrs["in_slice"] for op in _ops(compiled) if op.attrs.get("in_slice")]
    assert len(parts) == 2 and all(2 * c <= 256 * 12 for _, c in parts)


def test_output_channel_chunks_cap_one_conv():
    """A 1x1 conv of 3100 outputs from 12 inputs: every group's weights fit one bank row, so without the cap one
    chunk would take all 259 groups (beyond SAVE's 12-bit channel field)."""
    from tvm_dpu.codegen.isa import decode_program

    b = GraphBuilder("wide_out", seed=2)
    x = b.input("X", (1, 12, 4, 4))
    x = b.relu(b.conv(x, "conv", 3100, 1, 1, 0), "relu")
    model = b.build(b.conv(x, "head", 8, 1, 1, 0, gain=LINEAR_GAIN))
    compiled, cos = _run_checked(model)
    assert cos > COSINE_MIN, cos
    sg = next(iter(compiled.runners.values())).sg
    saves = [i for i in decode_program(sg.code) if i.name == "SAVE"]
    assert max(i.fields["channel"] for i in saves) <= OUT_GROUPS_MAX * 12


def test_activation_the_elew_add_cannot_apply_runs_on_its_own():
    """ReLU6 cannot ride on the ELEW add that sums the partials (ELEW: none, relu): the conv+relu6 pattern is
    rejected with that reason (test_limits conv_split_relu6) and the conv is split with the ReLU6 a standalone ALU
    activation after the add."""
    compiled, cos = _run_checked(big_conv("relu6"))
    assert cos > COSINE_MIN, cos
    ops = _ops(compiled)
    add = next(op for op in ops if op.name == "conv/sum")
    assert add.attrs["act"] == "none"
    act = next(op for op in ops if op.inputs == add.outputs)
    assert (act.type, act.attrs["mode"]) == ("activation", "relu6")


# ---- the pass on float XGraphs -----------------------------------------------------------------------------
def _float_conv_graph(c: int, act: str = "relu", kernel: int = 3, op_type: str = "conv2d") -> Graph:
    rng = np.random.default_rng(0)
    g = Graph("g")
    g.add_tensor(Tensor("x", (1, c, 4, 4), "float32"))
    if op_type == "dense":
        w = (rng.standard_normal((6, c * 16)) / np.sqrt(c * 16)).astype(np.float32)
        out, attrs = (1, 6, 1, 1), {"act": act}
    else:
        w = (rng.standard_normal((6, c, kernel, kernel)) / np.sqrt(c * kernel * kernel)).astype(np.float32)
        out, attrs = (1, 6, 4, 4), {"pads": [kernel // 2] * 4, "act": act}
    g.add_tensor(Tensor("w", w.shape, "float32", data=w))
    g.add_tensor(Tensor("b", (6,), "float32", data=rng.standard_normal(6).astype(np.float32)))
    g.add_tensor(Tensor("y", out, "float32"))
    g.add_op(Op("conv", op_type, ["x"], ["y"], attrs, {"weights": "w", "bias": "b"}, ["node_conv"]))
    g.inputs, g.outputs = ["x"], ["y"]
    return g


@pytest.mark.parametrize("op_type", ["conv2d", "dense"])
@pytest.mark.parametrize("bank_depth, c", [(2048, 2736), (128, 841)])
def test_split_is_exact_in_float(op_type, bank_depth, c):
    """Partials over the slices plus the add tree compute the same real function (the float reference runs the
    partials, so calibration sees their ranges); more than 4 partials take a tree of ELEW adds."""
    arch = dataclasses.replace(load_arch(ZU2), bank_depth=bank_depth)
    taps = 9 if op_type == "conv2d" else 16  # a dense's kernel covers its 4x4 input
    n_parts = -(-(-(-c // 12)) // (bank_depth // taps))
    g = _float_conv_graph(c, op_type=op_type)
    before = copy.deepcopy(g)
    x = np.random.default_rng(1).standard_normal((2, c, 4, 4))
    assert split_large_convs(g, arch) == ["conv"]
    parts = [op for op in g.ops if op.attrs.get("in_slice")]
    assert len(parts) == n_parts and n_parts >= 2
    assert [op.attrs["in_slice"][0] for op in parts] == list(np.cumsum([0] + [op.attrs["in_slice"][1]
                                                                              for op in parts])[:-1])
    assert sum(op.attrs["in_slice"][1] for op in parts) == c
    adds = [op for op in g.ops if op.type == "eltwise_add"]
    assert all(2 <= len(op.inputs) <= 4 for op in adds) and adds[-1].outputs == ["y"]
    assert len(adds) == (1 if n_parts <= 4 else 1 + -(-n_parts // 4) - (n_parts % 4 == 1))
    assert [op.attrs["act"] for op in adds] == ["none"] * (len(adds) - 1) + ["relu"]
    assert all(op.source == ["node_conv"] for op in g.ops)
    assert "w" not in g.tensors  # the partials hold views of it
    np.testing.assert_allclose(run_graph_float(g, {"x": x})["y"], run_graph_float(before, {"x": x})["y"],
                               rtol=1e-9, atol=1e-9)


def test_split_error_names_the_op():
    g = _float_conv_graph(2736, act="leaky_relu")
    g.ops[0].attrs["alpha"] = 0.1
    with pytest.raises(SplitError, match=r"op 'conv' \(conv2d\) \(model node\(s\) node_conv\): too large for one "
                                         r"CONV instruction and not split: activation leaky_relu"):
        split_large_convs(g, load_arch(ZU2))
    # one channel group alone beyond the bank: no slicing helps
    small = dataclasses.replace(load_arch(ZU2), bank_depth=8)
    with pytest.raises(SplitError, match="kw\\*kh\\*ceil"):
        split_large_convs(_float_conv_graph(24), small)
    # fits: nothing changes
    g = _float_conv_graph(64)
    assert split_large_convs(g, load_arch(ZU2)) == [] and [op.name for op in g.ops] == ["conv"]


def test_fused_emitters_refuse_partial_convs():
    compiled, _ = _build(big_conv())
    r = next(iter(compiled.runners.values()))
    arch = load_arch(ZU2)
    part = next(op for op in r.graph.ops if op.attrs.get("in_slice"))
    assert not fusable(arch, r.graph, part)
    plan = plan_fusion(r.graph, arch, "optimal", FUSED_EMITTERS, emittable)
    assert not any(n.startswith("conv/part") for g in plan.fused() for n in g.ops), plan.fused()


# ---- full size ---------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("arch", [ZU2, "DPUCZDX8G_ISA1_B4096"])
def test_vgg16_has_no_cpu_node(arch):
    from tvm_dpu import zoo

    compiled, cos = _run_checked(zoo.build_model("vgg16"), arch)
    assert cos > COSINE_MIN, cos


# ---- the benchmark and its generated table -----------------------------------------------------------------
def test_generated_table_matches_the_results(monkeypatch):
    """docs/op-coverage.md's split table is bench_fc_split's table of benchmarks/results/fc_split.json."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    monkeypatch.syspath_prepend(str(root / "benchmarks"))
    import bench_fc_split
    from docblock import read_block

    data = json.loads((root / "benchmarks" / "results" / "fc_split.json").read_text())
    doc = (root / "docs" / "op-coverage.md").read_text()
    assert read_block(doc, bench_fc_split.BEGIN, bench_fc_split.END) == bench_fc_split.table(
        data["rows"], data["machine"]["loadavg_start"][0])
    zu2 = next(r for r in data["rows"] if r["arch"] == ZU2)
    assert zu2["cpu_nodes_before"] and not zu2["cpu_nodes_after"] and zu2["mismatches"] == 0


def test_split_disabled_restores_the_profile(monkeypatch):
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import bench_fc_split
    from tvm_dpu.arch import OpDesc, check_op

    fc = OpDesc("conv2d", (1, 512, 7, 7), (1, 4096, 1, 1), kernel=(7, 7))
    with bench_fc_split.split_disabled(ZU2):
        assert len(check_op(load_arch(ZU2), fc)) == 2  # in_size and output channels
    assert check_op(load_arch(ZU2), fc) == []
