"""`tvm-dpu compare`: vai_c's DPU programs beside tvm-dpu's compile of the same quantized ops (QDQ rebuild)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tvm_dpu.cli import main
from tvm_dpu.codegen.isa import decode_program
from tvm_dpu.xmodel.compare import compare
from tvm_dpu.xmodel.encode import encode_graph
from tvm_dpu.xmodel.model import read_xmodel
from tvm_dpu.xmodel.reader import Attr, decode_graph

DATA = Path(__file__).parent / "data" / "xmodel"
ISA1 = sorted(DATA.glob("*isa1*.xmodel"))


@pytest.mark.parametrize("path", ISA1, ids=[p.stem for p in ISA1])
def test_vai_c_conv_subgraph_matches_ours_int8(path):
    res = compare(path, seed=3)
    d = {x.name: x for x in read_xmodel(path).dpu_subgraphs()}
    conv, dense = res.subgraphs  # conv/pool stack and dense head: both rebuilt and compared
    assert conv.name == "subgraph_quant_conv2d"
    assert conv.inputs == 3 and conv.total == 3 * 256 and conv.differing == 0 and conv.outputs_equal
    code = np.frombuffer(d[conv.name].mc_code, "<u4")
    assert sum(conv.vai_c.instructions.values()) == len(decode_program(code))
    assert conv.vai_c.instructions["CONV"] == 18
    # ours keeps the maps on chip as vai_c's does (a resident chain): no more SAVE-engine instructions than it
    assert conv.ours.instructions["SAVE"] <= conv.vai_c.instructions["SAVE"]
    # DDR bytes one run moved: at least the input (784 B) and weights read, the 256-byte output written
    assert conv.vai_c.ddr_read_bytes > 100_000 and conv.vai_c.ddr_write_bytes == 256
    assert conv.ours.ddr_write_bytes >= 256
    assert conv.ours.cycles is not None and conv.ours.cycles > 0
    # vai_c's program: cycles, or the timing model's error (reported, not raised)
    assert (conv.vai_c.cycles is None) == (conv.vai_c.timing_error is not None)
    # the dense subgraph's bias has fix_point fp_in + fp_w + 1 and odd values: rebuilt as given (shift_bias field 0,
    # quant.rules.SHIFT_BIAS_MIN), the outputs equal vai_c's int8 for int8
    assert not res.not_compared
    assert dense.name.startswith("subgraph_quant_dense") and dense.total == 3 * 10 and dense.outputs_equal
    assert not any("rebuilt exactly as values" in n for n in dense.notes)
    assert "int8 outputs equal (0 of 768 elements differ over 3 random inputs)" in res.table()
    assert not conv.warnings and not dense.warnings  # the outputs depend on the input


def test_isa0_is_not_compared_with_reason(tmp_path):
    """A DPU subgraph for ISA0 (vai_c 1.4's fingerprint for this network) is listed with the reason, not run."""
    g = decode_graph(ISA1[0].read_bytes())
    for sg in g["subg_root"]["subg_child"]:
        if "dpu_fingerprint" in sg["subg_attr"]:
            sg["subg_attr"]["dpu_fingerprint"] = Attr("uint64_value", 0x01000020F6014407)
    isa0 = tmp_path / "isa0.xmodel"
    isa0.write_bytes(encode_graph(g))
    res = compare(isa0)
    assert not res.subgraphs and len(res.not_compared) == 2
    assert all("DPUCZDX8G_ISA0_B4096: tvm-dpu has no instruction table for DPUCZDX8G ISA0" in why
               for why in res.not_compared.values())
    assert main(["compare", str(isa0)]) == 1


def _own_xmodel(tmp_path):
    from test_xmodel_write import _build  # the same small model the writer tests export

    return _build().export(tmp_path / "own.xmodel")


def test_our_own_xmodel_compares_equal(tmp_path, capsys):
    """Our exported xmodel's ops carry their int8 constants: the rebuild compiles back to the same programs."""
    res = compare(_own_xmodel(tmp_path))
    assert len(res.subgraphs) == 2 and not res.not_compared
    for s in res.subgraphs:
        assert s.outputs_equal and s.total > 0
        assert s.vai_c.instructions == s.ours.instructions
        assert s.vai_c.cycles == s.ours.cycles and s.cycle_ratio == 1.0
    assert main(["compare", str(tmp_path / "own.xmodel")]) == 0
    assert "ratio ours/vai_c: 1.000" in capsys.readouterr().out


def test_our_grouped_conv_xmodel_compares_equal(tmp_path):
    """A grouped conv is written as one conv2d-fix fed by a concat-fix of its per-group const-fix ops; the rebuild
    joins them again and compiles back to the same program."""
    from test_xmodel_xir import _grouped

    path = _grouped("dnnvm-zu2").export(tmp_path / "grouped.xmodel")
    res = compare(path)
    assert len(res.subgraphs) == 1 and not res.not_compared
    (s,) = res.subgraphs
    assert s.outputs_equal and s.total > 0
    assert s.vai_c.instructions == s.ours.instructions and s.cycle_ratio == 1.0


def _every_op_model():
    """conv+relu, depthwise, 1x1 conv, eltwise add, max and avg pool, concat, nearest upsample, conv, hard-sigmoid."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def init(n, a):
        return numpy_helper.from_array(np.asarray(a, np.float32), n)

    inits = [init("w1", rng.standard_normal((8, 3, 3, 3)) * 0.3), init("b1", rng.standard_normal(8) * 0.1),
             init("wd", rng.standard_normal((8, 1, 3, 3)) * 0.3), init("w2", rng.standard_normal((8, 8, 1, 1)) * 0.3),
             init("sc", [1, 1, 2, 2]), init("w3", rng.standard_normal((4, 16, 3, 3)) * 0.2)]
    n = helper.make_node
    nodes = [n("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             n("Relu", ["c1"], ["r1"], name="relu1"),
             n("Conv", ["r1", "wd"], ["dw"], name="dw", pads=[1, 1, 1, 1], group=8),
             n("Conv", ["r1", "w2"], ["pw"], name="pw"),
             n("Add", ["dw", "pw"], ["add"], name="add"),
             n("MaxPool", ["add"], ["mp"], name="mp", kernel_shape=[2, 2], strides=[2, 2]),
             n("AveragePool", ["r1"], ["ap"], name="ap", kernel_shape=[2, 2], strides=[2, 2]),
             n("Concat", ["mp", "ap"], ["cat"], name="cat", axis=1),
             n("Resize", ["cat", "", "sc"], ["up"], name="up", mode="nearest"),
             n("Conv", ["up", "w3"], ["c3"], name="conv3", pads=[1, 1, 1, 1]),
             n("HardSigmoid", ["c3"], ["y"], name="hs", alpha=1 / 6, beta=0.5)]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)


def test_every_rebuilt_op_type_round_trips(tmp_path):
    """Exported by our writer, rebuilt by compare, compiled again: the same program and int8 outputs for every
    DPU op type the rebuild covers."""
    import tvm_dpu

    calib = np.random.default_rng(1).standard_normal((4, 1, 3, 8, 8)).astype(np.float32)
    path = tvm_dpu.build(_every_op_model(), progress=False, calibration=calib).export(tmp_path / "all.xmodel")
    xm = read_xmodel(path)
    types = {op.type for op in xm.ops}
    assert xm.op("dw.weights").output.shape == (1, 3, 3, 8)  # XIR depthwise: (multiplier, kh, kw, C)
    assert xm.op("conv3.weights").output.shape == (4, 3, 3, 16)  # OHWI
    assert {"conv2d-fix", "depthwise-conv2d-fix", "eltwise-fix", "pool-fix", "concat-fix", "upsample-fix",
            "hard-sigmoid-fix"} <= types
    (s,) = compare(path, seed=5).subgraphs
    assert s.outputs_equal and s.total == 3 * 256
    assert s.vai_c.instructions == s.ours.instructions and s.vai_c.cycles == s.ours.cycles
    assert (s.vai_c.ddr_read_bytes, s.vai_c.ddr_write_bytes) == (s.ours.ddr_read_bytes, s.ours.ddr_write_bytes)


def test_op_without_rebuild_is_named(tmp_path):
    g = decode_graph(_own_xmodel(tmp_path).read_bytes())
    for op in g["op_node"]:
        if op["op_type"] == "pool-fix":
            op["op_type"] = "mystery-fix"
    bad = tmp_path / "bad.xmodel"
    bad.write_bytes(encode_graph(g))
    res = compare(bad)
    assert len(res.subgraphs) == 1
    (why,) = res.not_compared.values()
    assert "DPU op 'pool1' of type 'mystery-fix' cannot be rebuilt" in why


def _zero_params(tmp_path, which: str):
    """vai_c's VAI 3.0 file with the CONST region of the DPU subgraph whose name starts with `which` zeroed."""
    g = decode_graph(ISA1[-1].read_bytes())
    for sg in g["subg_root"]["subg_child"]:
        if sg["subgraph_name"].startswith(which) and "reg_id_to_parameter_value" in sg["subg_attr"]:
            a = sg["subg_attr"]["reg_id_to_parameter_value"]
            sg["subg_attr"]["reg_id_to_parameter_value"] = Attr(a.kind, {k: bytes(len(v)) for k, v in a.value.items()})
    path = tmp_path / f"zero_{which}.xmodel"
    path.write_bytes(encode_graph(g))
    return path


def test_outputs_that_do_not_depend_on_the_input_get_a_warning(tmp_path, capsys):
    """Zero weights and biases: the conv stack's outputs are all zero, the dense head's (hard-sigmoid of 0) the
    same for every input. Both compilers agree, and the comparison says that agreement proves nothing."""
    import json

    conv = compare(_zero_params(tmp_path, "subgraph_quant_conv2d")).subgraphs[0]
    assert conv.outputs_equal
    (w,) = conv.warnings
    assert "is all zero for each of the 3 inputs tried" in w and "prove nothing" in w
    dense = compare(_zero_params(tmp_path, "subgraph_quant_dense")).subgraphs[1]
    assert dense.outputs_equal
    (w,) = dense.warnings
    assert "is the same for each of the 3 inputs tried" in w
    out = tmp_path / "c.json"
    assert main(["compare", str(tmp_path / "zero_subgraph_quant_conv2d.xmodel"), "--json", str(out)]) == 0
    assert f"WARNING: {conv.warnings[0]}" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["subgraphs"][0]["warnings"] == conv.warnings and doc["subgraphs"][0]["outputs_equal"]


def test_debug_mode_per_layer_programs_compared_layer_by_layer():
    """vai_c 2.5's file carries per-layer programs (debug mode: `mc_code` on the children); run in
    children_topological_sort order, each one's map in DDR equals tvm-dpu's golden reference of that op."""
    res = compare(ISA1[0], seed=1)
    conv, dense = res.subgraphs
    assert [c.op for c in conv.layers] == ["quant_conv2d", "quant_max_pooling2d"]
    assert [c.op for c in dense.layers] == ["quant_dense(TransferMatMulToConv2d)",
                                            "quant_dense_sigmoid_sigmoid(MoveReshape)(MergeMultoHsigmoid)"]
    for c in conv.layers + dense.layers:
        assert c.differing == 0 and c.total > 0 and "per-layer program" in c.read
    assert conv.layers[0].total == 3 * 22 * 22 * 32 and conv.layers_equal
    assert "layer quant_conv2d: equal (0 of 46464" in res.table()


def test_a_layer_read_from_the_wrong_place_differs(tmp_path):
    """Negative control: the same file with quant_conv2d's ddr_addr moved by one byte. The program and the final
    outputs are unchanged (still equal); the map read from DDR at the recorded place is not the layer's."""
    g = decode_graph(ISA1[0].read_bytes())
    for op in g["op_node"]:
        if op["op_name"] == "quant_conv2d":
            a = op["output_tensor"]["tensor_attr"]
            a["ddr_addr"] = Attr("int32_value", a["ddr_addr"].value + 1)
    moved = tmp_path / "moved.xmodel"
    moved.write_bytes(encode_graph(g))
    conv = compare(moved, seed=1).subgraphs[0]
    assert conv.outputs_equal
    bad = next(c for c in conv.layers if c.op == "quant_conv2d")
    assert bad.differing > bad.total // 2 and not conv.layers_equal


def test_release_maps_not_in_ddr_are_named_not_compared():
    """vai_c 3.0's release program keeps its maps on chip though the file marks them location 1: each is listed
    with the reason (another tensor shares its bytes, or the program leaves its bytes unwritten), not compared."""
    conv = compare(ISA1[1], seed=1).subgraphs[0]
    assert conv.layers == []
    assert "shares REG_1 bytes with 'quant_conv2d_1_fix'" in conv.layers_not_compared["quant_conv2d"]
    assert "leaves 2048 of its 2048 bytes in DDR unwritten" in conv.layers_not_compared["quant_max_pooling2d_fix"]


def test_our_export_keeps_a_map_in_ddr_and_it_matches(tmp_path):
    """Our export of the writer tests' model, compiled unfused so every conv's map goes through DDR (the fused
    plan may keep them on chip, location 0): each map in DDR between DPU layers equals the golden reference's."""
    import numpy as np

    import tvm_dpu
    from test_xmodel_write import _model

    calib = np.random.default_rng(1).standard_normal((4, 1, 3, 8, 8)).astype(np.float32)
    model = tvm_dpu.build(_model("Softmax"), progress=False, calibration=calib, fusion="none")
    res = compare(model.export(tmp_path / "own_unfused.xmodel"))
    layers = [c for s in res.subgraphs for c in s.layers]
    assert {"conv1", "conv2"} <= {c.op for c in layers}
    assert all(c.differing == 0 and c.total > 0 for c in layers) and all(s.layers_equal for s in res.subgraphs)