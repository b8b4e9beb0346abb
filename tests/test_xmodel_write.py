"""Writing a CompiledModel as AMD's .xmodel: the DPU programs, regions and tensor bindings read back bit for bit
equal to the .tvmdpu artifact of the same build; bytes are deterministic; every attribute VART's DPU runner reads
is present with the type vai_c's own files give it; a host op with no XIR equivalent is one clear error."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvm_dpu
from tvm_dpu.errors import XModelError
from tvm_dpu.runtime.artifact import programs
from tvm_dpu.types import REG_PARAMS
from tvm_dpu.xmodel.model import read_xmodel
from tvm_dpu.xmodel.reader import decode_graph
from tvm_dpu.xmodel.write import VART_SUBGRAPH_ATTRS, VART_TENSOR_ATTRS

DATA = Path(__file__).parent / "data" / "xmodel"


def _model(mid: str = "Softmax") -> onnx.ModelProto:
    """conv-relu-pool (DPU) -> `mid` (host) -> conv -> flatten -> dense (DPU) -> softmax (host)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3, "w1"),
             numpy_helper.from_array(rng.standard_normal((4,)).astype(np.float32) * 0.1, "b1"),
             numpy_helper.from_array(rng.standard_normal((6, 4, 3, 3)).astype(np.float32) * 0.3, "w2"),
             numpy_helper.from_array(rng.standard_normal((5, 6 * 4 * 4)).astype(np.float32) * 0.1, "wd"),
             numpy_helper.from_array(np.array([1, -1], np.int64), "shp")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("MaxPool", ["r1"], ["p1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node(mid, ["p1"], ["s1"], name="mid"),
             helper.make_node("Conv", ["s1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["c2", "shp"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "wd"], ["y0"], name="fc", transB=1),
             helper.make_node("Softmax", ["y0"], ["y"], name="sm", axis=1)]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)


def _build(mid: str = "Softmax"):
    calib = np.random.default_rng(1).standard_normal((4, 1, 3, 8, 8)).astype(np.float32)
    return tvm_dpu.build(_model(mid), progress=False, calibration=calib)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("xw")
    model = _build()
    return model, model.export(d / "m.tvmdpu"), model.export(d / "m.xmodel")


def _dpu_subgraphs(graph: dict) -> dict[str, dict]:
    return {c["subgraph_name"]: c for c in graph["subg_root"]["subg_child"]
            if c["subg_attr"].get("device") is not None and c["subg_attr"]["device"].value == "DPU"}


def _io_tensors(graph: dict, sg: dict) -> tuple[list[dict], list[dict]]:
    """(input tensors, output tensors) where VART takes their DDR place: the upload ops' outputs, the tensors
    feeding the download ops."""
    ops = {o["op_name"]: o for o in graph["op_node"]}
    names = [n for c in sg["subg_child"] for n in c["op_name"]]
    ins = [ops[n]["output_tensor"] for n in names if ops[n]["op_type"] == "upload"]
    outs = [ops[ops[n]["args"][0]["arg_ops"][0]]["output_tensor"] for n in names if ops[n]["op_type"] == "download"]
    return ins, outs


def _check_binding(t, b) -> None:
    f = b.fmap
    assert (t.reg_id, t.ddr_addr, t.location, t.fix_point) == (f.reg_id, f.offset, 1, b.fix_point)
    assert t.strides == (f.h * f.row_pitch, f.row_pitch, f.pixel_pitch, 1)
    assert t.shape == (1, f.h, f.w, f.c) and t.dtype == "xint8"


def test_round_trip_is_bit_identical_to_the_artifact(built):
    """Through xm2's reader: every DPU subgraph's code, regions, CONST bytes and I/O bindings are the .tvmdpu's."""
    model, tvmdpu, xmodel = built
    progs = programs(tvmdpu)
    dpu = {d.name: d for d in read_xmodel(xmodel).dpu_subgraphs()}
    assert len(progs) == 2 and set(dpu) == {f"subgraph_{s}" for s in progs}
    for symbol, prog in progs.items():
        sg, d = prog.sg, dpu[f"subgraph_{symbol}"]
        assert d.mc_code == np.ascontiguousarray(sg.code, "<u4").tobytes() and d.mc_code_preload == b""
        assert d.fingerprint == sg.fingerprint == model.arch.fingerprint and d.dpu_name == model.arch.dpu_name
        assert {r: g.size for r, g in d.regions.items()} == sg.region_sizes
        assert {r: g.context_type for r, g in d.regions.items()} == {0: "CONST", 1: "DATA", 2: "DATA", 3: "DATA"}
        assert d.regions[REG_PARAMS].data == sg.new_regions()[REG_PARAMS].tobytes()
        assert all(g.data is None for r, g in d.regions.items() if r != REG_PARAMS)
        assert len(d.inputs) == len(sg.inputs) and len(d.outputs) == len(sg.outputs)
        for t, b in zip(d.inputs + d.outputs, sg.inputs + sg.outputs):
            _check_binding(t, b)


def test_host_ops_and_tree(built):
    _, _, xmodel = built
    graph = decode_graph(Path(xmodel).read_bytes())
    kids = graph["subg_root"]["subg_child"]
    assert [c["subg_attr"]["device"].value for c in kids] == ["USER", "DPU", "CPU", "DPU", "CPU"]
    ops = {o["op_name"]: o for o in graph["op_node"]}
    cpu_types = [[ops[n]["op_type"] for n in c["op_name"]] for c in kids if c["subg_attr"]["device"].value == "CPU"]
    assert cpu_types == [["fix2float", "transpose", "softmax", "transpose", "float2fix"],
                         ["fix2float", "reshape", "softmax"]]
    user = ops[kids[0]["op_name"][0]]
    assert user["op_type"] == "data-fix" and list(user["output_tensor"]["tensor_dim"]) == [1, 8, 8, 3]
    # every op a subgraph names exists, once
    named = [n for c in kids for n in (c["op_name"] or [m for k in c["subg_child"] for m in k["op_name"]])]
    assert sorted(named) == sorted(ops)


def test_bytes_are_deterministic(built, tmp_path):
    model, _, xmodel = built
    again = _build().export(tmp_path / "again.xmodel")
    assert Path(again).read_bytes() == Path(xmodel).read_bytes()
    assert model.export(tmp_path / "same.xmodel").read_bytes() == Path(xmodel).read_bytes()


def test_host_op_without_xir_equivalent_is_one_clear_error(tmp_path):
    model = _build("Sin")
    with pytest.raises(XModelError, match=r"relax\.sin \(Relax value .*limited to XIR's CPU ops add, concat, "
                                          r"conv2d, .*export the \.tvmdpu artifact instead"):
        model.export(tmp_path / "m.xmodel")
    assert not (tmp_path / "m.xmodel").exists()


VAI_C = sorted(DATA.glob("*.xmodel"))


@pytest.mark.skipif(not VAI_C, reason="no vendored vai_c xmodels in tests/data/xmodel")
@pytest.mark.parametrize("path", VAI_C, ids=[p.name[:40] for p in VAI_C])
def test_vart_attributes_present_with_vai_c_types(built, path):
    _, _, xmodel = built
    ours = decode_graph(Path(xmodel).read_bytes())
    theirs = decode_graph(path.read_bytes())
    for g in (ours, theirs):
        g["_dpu"] = list(_dpu_subgraphs(g).values())
        assert g["_dpu"]
    their_kinds = {k: theirs["_dpu"][0]["subg_attr"][k].kind for k in VART_SUBGRAPH_ATTRS
                   if k in theirs["_dpu"][0]["subg_attr"]}
    for sg in ours["_dpu"]:
        kinds = {k: a.kind for k, a in sg["subg_attr"].items()}
        for k, kind in VART_SUBGRAPH_ATTRS.items():
            assert kinds.get(k) == kind, f"DPU subgraph attribute {k}"
            if k in their_kinds:
                assert their_kinds[k] == kind, f"vai_c's {k}"
        for t in [t for ts in _io_tensors(ours, sg) for t in ts]:
            for k, kind in VART_TENSOR_ATTRS.items():
                assert t["tensor_attr"][k].kind == kind, f"tensor {t['tensor_name']} attribute {k}"
    for sg in theirs["_dpu"]:
        for t in [t for ts in _io_tensors(theirs, sg) for t in ts]:
            for k, kind in VART_TENSOR_ATTRS.items():
                assert t["tensor_attr"][k].kind == kind, f"vai_c tensor {t['tensor_name']} attribute {k}"


class _Recorder:
    """The emulator, keeping each program's int8 outputs (NCHW) of its last run."""

    def __init__(self, arch):
        from tvm_dpu.runtime.device import EmulatorDevice

        self.arch, self.inner, self.outs = arch, EmulatorDevice(arch), {}

    def execute(self, sg, regions):
        self.inner.execute(sg, regions)
        self.outs[sg.name] = [b.fmap.from_ddr(regions[b.fmap.reg_id]) for b in sg.outputs]


def test_read_back_xmodel_runs_like_the_model(built):
    """tvm_dpu.load of our xmodel (xm2's runner: DPU programs on the emulator, host ops in numpy) computes the
    CompiledModel's int8 values on every DPU output; the float outputs after the host softmax agree to float32
    rounding (numpy's exp is not TVM's). Inputs are NHWC there (the DPU's layout, as VART users feed them)."""
    model, _, xmodel = built
    rec = _Recorder(model.arch)
    model.pin(rec)
    runner = tvm_dpu.load(xmodel)
    assert [s.name for s in runner.inputs] == ["x"]
    xm = read_xmodel(xmodel)
    rng = np.random.default_rng(7)
    for _ in range(5):
        x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
        (want,) = model.run(x)
        values = runner.run_values({"x": x.transpose(0, 2, 3, 1)})
        for d in xm.dpu_subgraphs():
            symbol = d.name.removeprefix("subgraph_")
            for t, q in zip(d.outputs, rec.outs[model.runners[symbol].sg.name]):
                np.testing.assert_array_equal(values[t.op], q.transpose(0, 2, 3, 1).reshape(t.shape))
        (got,) = [values[s.name] for s in runner.outputs]
        assert got.shape == want.shape == (1, 5)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)


def test_cli_compile_format_xmodel(tmp_path):
    from tvm_dpu.cli import main

    src = tmp_path / "net.onnx"
    onnx.save(_model(), src)
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(1).standard_normal((4, 1, 3, 8, 8)).astype(np.float32))
    assert main(["compile", str(src), "--arch", "zcu102", "-o", str(tmp_path / "out"), "-q", "--calib",
                 str(tmp_path / "calib.npz"),
                 "--format", "xmodel"]) == 0
    xm = read_xmodel(tmp_path / "out" / "net.xmodel")
    assert len(xm.dpu_subgraphs()) == 2 and (tmp_path / "out" / "net.tvmdpu").exists()
