"""Reading AMD's .xmodel files: the vendored vai_c files (tests/data/xmodel, see PROVENANCE.md) decode into the
graph, subgraph tree and DPU subgraphs; small hand-encoded graphs pin the wire details (packed and unpacked
repeated scalars, negative ints, floats, the AttrValue oneof); damaged bytes give one XModelError naming the
field path and offset."""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tvm_dpu.errors import ArtifactError, XModelError
from tvm_dpu.util.protowire import encode_varint
from tvm_dpu.xmodel import read_xmodel

DATA = Path(__file__).parent / "data" / "xmodel"
FILES = sorted(DATA.glob("*.xmodel"))
ISA1 = [p for p in FILES if "isa1" in p.name]


# -- a hand encoder for the tests (field number, wire type, payload), independent of the schema tables ----------
def _ld(number: int, payload: bytes) -> bytes:
    return encode_varint(number << 3 | 2) + encode_varint(len(payload)) + payload


def _vi(number: int, value: int) -> bytes:
    return encode_varint(number << 3) + encode_varint(value)


def _s(number: int, text: str) -> bytes:
    return _ld(number, text.encode())


def _attr(name: str, value: bytes) -> bytes:  # a map<string, AttrValue> entry
    return _s(1, name) + _ld(2, value)


def _graph(ops: list[bytes], root: bytes, attrs: bytes = b"", name: str = "g") -> bytes:
    return _s(1, name) + b"".join(_ld(5, o) for o in ops) + _ld(10, root) + attrs


def _tensor(name: str, dims: list[int], packed: bool = True, attrs: bytes = b"") -> bytes:
    if packed:
        d = _ld(2, b"".join(encode_varint(x) for x in dims))
    else:
        d = b"".join(_vi(2, x) for x in dims)
    return _s(1, name) + d + _vi(5, 2) + _vi(6, 8) + attrs


def test_vendored_files_are_present_and_small():
    assert len(FILES) == 2 and len(ISA1) == 2
    assert all(p.stat().st_size < 1 << 20 for p in FILES)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_vendored_graph_tree_and_dpu_subgraphs(path):
    m = read_xmodel(path)
    assert m.name == "functional_1" and m.attrs["origin"] == "tensorflow2"
    assert [s.device for s in m.root.children] == ["USER", "DPU", "CPU", "DPU", "CPU"]
    types = {op.type for op in m.ops}
    assert {"data-fix", "upload", "download", "conv2d-fix", "pool-fix", "const-fix", "fix2float", "float2fix",
            "Mylayer", "const"} <= types
    # every op sits in exactly one leaf of the tree
    placed = m.root.all_ops()
    assert sorted(placed) == sorted(op.name for op in m.ops)
    dpus = m.dpu_subgraphs()
    assert len(dpus) == 2
    for d in dpus:
        assert d.fingerprint >> 56 in (1,) and len(d.mc_code) % 4 == 0 and len(d.mc_code) > 0
        assert d.dpu_name.startswith("DPUCZDX8G_ISA")
        const = d.regions[0]
        assert const.context_type == "CONST" and const.data is not None and len(const.data) == const.size
        assert all(r.data is None for r in d.regions.values() if r.reg_id != 0)
        (x,) = d.inputs
        (y,) = d.outputs
        for t in (x, y):  # interface tensors: in DDR, in their region, strides of a dense NHWC layout
            assert t.location == 1 and t.ddr_addr + t.strides[0] <= d.regions[t.reg_id].size
            assert t.strides[-1] == 1 and t.dtype == "xint8"
    first = dpus[0]
    assert first.inputs[0].shape == (1, 28, 28, 1) and first.inputs[0].fix_point == -2
    assert first.inputs[0].strides == (784, 28, 1, 1)
    assert first.outputs[0].shape == (1, 2, 2, 64)


def test_constants_live_in_the_const_region_at_their_ddr_addr():
    m = read_xmodel(DATA / "tf2_custom_op_vai2.5_isa1.xmodel")
    d = m.dpu_subgraphs()[0]
    w = m.op("quant_conv2d_weights_new").output
    assert (w.reg_id, w.ddr_addr, w.shape, w.fix_point) == (0, 0, (32, 7, 7, 1), 14)
    b = m.op("quant_conv2d_bias_new").output
    assert (b.ddr_addr, b.shape) == (32 * 7 * 7, (32,))  # packed right after the weights
    values = np.frombuffer(d.regions[0].data, np.int8, w.nbytes, w.ddr_addr)
    assert values.std() > 0  # real weights, not padding
    conv = m.op("quant_conv2d")
    assert conv.inputs == {"input": ["input_1_upload_0"], "weights": ["quant_conv2d_weights_new"],
                           "bias": ["quant_conv2d_bias_new"]}
    assert conv.attrs["kernel"] == [7, 7] and conv.attr_kinds["kernel"] == "int32_vec_value"
    prelu = m.op("custom_layer/p_re_lu_9/alpha:0_const")
    assert prelu.output.dtype == "float32" and len(prelu.attrs["data"]) == 2 * 2 * 64 * 4


def test_subgraph_attributes_keep_their_types():
    m = read_xmodel(DATA / "tf2_custom_op_vai3.0_isa1.xmodel")
    sg = m.subgraphs("DPU")[0]
    assert sg.attr_kinds["dpu_fingerprint"] == "uint64_value"
    assert sg.attr_kinds["reg_id_to_size"] == "map_string_2_int32_value"
    assert sg.attr_kinds["reg_id_to_parameter_value"] == "map_string_2_bytes_value"
    assert sg.attrs["reg_id_to_context_type_v2"] == {"REG_0": "CONST", "REG_1": "WORKSPACE", "REG_2": "INTERFACE",
                                                     "REG_3": "INTERFACE"}
    assert sg.attrs["children_topological_sort"] == [c.name for c in sg.children if c.name in
                                                     sg.attrs["children_topological_sort"]]


def _tiny(dims_packed: bool = True, op_attrs: bytes = b"") -> bytes:
    op = _s(1, "x") + _s(2, "data-fix") + op_attrs + _ld(5, _tensor("x_t", [1, 4, 4, 3], dims_packed))
    user = _s(1, "subgraph_x") + _s(3, "x") + _ld(5, _attr("device", _s(11, "USER")))
    root = _s(1, "root") + _ld(10, user)
    return _graph([op], root)


@pytest.mark.parametrize("packed", [True, False])
def test_repeated_scalars_packed_or_not(packed):
    m = read_xmodel(_tiny(packed))
    assert m.op("x").output.shape == (1, 4, 4, 3)
    assert m.root.children[0].device == "USER" and m.root.children[0].ops == ["x"]


def test_attr_value_kinds():
    attrs = (_ld(3, _attr("neg", _vi(5, (1 << 64) - 3)))  # int32 -3, sign-extended to 10 bytes as protobuf does
             + _ld(3, _attr("f", encode_varint(9 << 3 | 5) + struct.pack("<f", 0.5)))
             + _ld(3, _attr("d", encode_varint(10 << 3 | 1) + struct.pack("<d", -2.25)))
             + _ld(3, _attr("zero", _vi(5, 0)))  # an explicit 0 is an int32, not "unset"
             + _ld(3, _attr("flag", _vi(4, 1)))
             + _ld(3, _attr("dims", _ld(14, _ld(1, b"".join(encode_varint(v) for v in (2, 3)))))))
    op = read_xmodel(_tiny(op_attrs=attrs)).op("x")
    assert op.attrs == {"neg": -3, "f": 0.5, "d": -2.25, "zero": 0, "flag": True, "dims": [2, 3]}
    assert op.attr_kinds["zero"] == "int32_value"


def test_unknown_fields_are_skipped():
    data = _tiny() + _vi(99, 7) + _s(98, "future")
    assert read_xmodel(data).name == "g"


def test_xmodel_error_is_an_artifact_error():
    assert issubclass(XModelError, ArtifactError)


@pytest.mark.parametrize("data, where", [
    (b"", "empty"),
    (b"\x0a\x40abc", "field Graph at offset 0"),                     # graph_name longer than the file
    (b"\x0a\x01a\xd2", "truncated varint"),                          # a tag cut short
    (b"\x0b", "wire type 3"),                                        # a group
    (b"\x08\x01", "Graph.graph_name"),                               # a varint where a string belongs
    (b"\x0a\x02\xff\xfe", "Graph.graph_name at offset 2"),            # not UTF-8
])
def test_damaged_bytes_name_field_and_offset(data, where):
    with pytest.raises(XModelError, match=where):
        read_xmodel(data)


def test_nested_too_deep_is_refused():
    sg = _s(1, "leaf")
    for _ in range(100):
        sg = _s(1, "n") + _ld(10, sg)
    with pytest.raises(XModelError, match="nested more than"):
        read_xmodel(_graph([], sg))


def test_missing_file_and_no_tree(tmp_path):
    with pytest.raises(XModelError, match="cannot read"):
        read_xmodel(tmp_path / "none.xmodel")
    with pytest.raises(XModelError, match="no subgraph tree"):
        read_xmodel(_s(1, "g"))


def test_op_reading_an_unknown_op_is_refused():
    op = _s(1, "y") + _s(2, "fix2float") + _ld(4, _s(1, "input") + _s(2, "ghost"))
    with pytest.raises(XModelError, match="'y' reads 'ghost'"):
        read_xmodel(_graph([op], _s(1, "root")))


_BASE = (DATA / "tf2_custom_op_vai2.5_isa1.xmodel").read_bytes()


def _read_or_xmodel_error(data: bytes) -> None:
    from tvm_dpu.xmodel.runner import load_xmodel
    try:
        load_xmodel(read_xmodel(data))  # reads the graph, every DPU subgraph and the run order
    except XModelError:
        pass


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, len(_BASE) - 1))
def test_fuzz_truncated(cut):
    _read_or_xmodel_error(_BASE[:cut])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(_BASE) - 1), st.integers(0, 255)), min_size=1, max_size=8))
def test_fuzz_mutated_bytes(edits):
    data = bytearray(_BASE)
    for pos, value in edits:
        data[pos] = value
    _read_or_xmodel_error(bytes(data))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2000), st.sampled_from([1 << 31, 1 << 40, (1 << 63) - 1, 0xFFFFFFFF]))
def test_fuzz_oversized_length_fields(start, length):
    # find the next length-delimited tag at or after `start` by re-walking the top level, and blow its length up
    from tvm_dpu.util.protowire import fields
    for number, wire, tag, v_start, v_end in fields(_BASE, 0, len(_BASE)):
        if wire == 2 and tag >= start:
            key_end = tag + len(encode_varint(number << 3 | 2))
            data = _BASE[:key_end] + encode_varint(length) + _BASE[v_start:]
            with pytest.raises(XModelError, match="past the end"):
                read_xmodel(data)
            return
