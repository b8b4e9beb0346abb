"""XGraph structure: validation errors, and the safe serialization format (round trip, determinism, corruption)."""
from __future__ import annotations

import hashlib
import json
import struct

import numpy as np
import pytest

from tvm_dpu.errors import ArtifactError
from tvm_dpu.xgraph import Graph, GraphError, Op, Subgraph, Tensor, dumps, load, loads, run_graph, save
from tvm_dpu.xgraph.serialize import FIXED_SIZE, FORMAT_VERSION, MAGIC
from tvm_dpu.xgraph.validate import validate_graph


def build(order: int = 0) -> Graph:
    """conv(+relu) -> maxpool, a residual add and a concat; `order` permutes tensor insertion."""
    rng = np.random.default_rng(0)
    tensors = [
        Tensor("in", (1, 3, 8, 8), "int8", 6),
        Tensor("w", (4, 3, 3, 3), "int8", 7, rng.integers(-128, 128, (4, 3, 3, 3)).astype(np.int8)),
        Tensor("b", (4,), "int8", 6, rng.integers(-128, 128, (4,)).astype(np.int8)),
        Tensor("c", (1, 4, 8, 8), "int8", 5),
        Tensor("p", (1, 4, 4, 4), "int8", 5),
        Tensor("s", (1, 4, 4, 4), "int8", 4),
        Tensor("cat", (1, 8, 4, 4), "int8", 4),
    ]
    if order:
        tensors = tensors[::-1]
    g = Graph("net", {t.name: t for t in tensors}, inputs=["in"], outputs=["cat"])
    g.ops = [
        Op("conv", "conv2d", ["in"], ["c"], {"pads": [1, 1, 1, 1], "act": "relu", "strides": (1, 1)},
           {"weights": "w", "bias": "b"}, ["Conv_0", "Relu_1"]),
        Op("pool", "max_pool2d", ["c"], ["p"], {"kernel": [2, 2], "strides": [2, 2]}, source=["MaxPool_2"]),
        Op("add", "eltwise_add", ["p", "p"], ["s"], {"act": "none"}),
        Op("concat", "concat", ["s", "s"], ["cat"], {"axis": 1}),
    ]
    g.root = Subgraph("root", "root", children=[Subgraph("dpu0", "dpu", ["conv", "pool", "add", "concat"])])
    return g


def test_valid_graph_passes():
    g = build()
    validate_graph(g)
    out = run_graph(g, {"in": np.zeros((1, 3, 8, 8), np.int8)})
    assert out["cat"].shape == (1, 8, 4, 4)


# -- validation errors -------------------------------------------------------------------------------------
def test_dangling_input():
    g = build()
    g.ops[1].inputs = ["nowhere"]
    with pytest.raises(GraphError, match="'pool'.*'nowhere' is not defined"):
        validate_graph(g)
    g = build()
    g.tensors["orphan"] = Tensor("orphan", (1, 4, 8, 8), "int8", 5)
    g.ops[1].inputs = ["orphan"]
    with pytest.raises(GraphError, match="'pool'.*dangling input 'orphan'"):
        validate_graph(g)


def test_cycle_and_order():
    g = build()
    g.ops[0].inputs = ["s"]  # conv reads add's output: conv -> pool -> add -> conv
    g.tensors["in"].shape = (1, 3, 8, 8)
    with pytest.raises(GraphError, match="cycle through ops"):
        validate_graph(g)
    g = build()
    g.ops[0], g.ops[1] = g.ops[1], g.ops[0]
    with pytest.raises(GraphError, match="'pool'.*produced later by op 'conv'"):
        validate_graph(g)


def test_shape_mismatch():
    g = build()
    g.tensors["p"].shape = (1, 4, 5, 5)
    msg = "'pool'.*shape mismatch.*declared \\(1, 4, 5, 5\\).*inferred \\(1, 4, 4, 4\\)"
    with pytest.raises(GraphError, match=msg):
        validate_graph(g)
    g = build()
    g.tensors["b"] = Tensor("b", (5,), "int8", 6, np.zeros(5, np.int8))
    with pytest.raises(GraphError, match="'conv'.*bias 'b' must have shape \\(4,\\)"):
        validate_graph(g)
    g = build()
    g.tensors["w"].data = np.zeros((4, 3, 3, 2), np.int8)
    with pytest.raises(GraphError, match="tensor 'w': data shape"):
        validate_graph(g)


def test_missing_fix_point():
    g = build()
    g.tensors["p"].fix_point = None
    with pytest.raises(GraphError, match="tensor 'p': int8 tensor without fix_point"):
        validate_graph(g)


def test_op_level_errors():
    g = build()
    g.ops[1].type = "lrn"
    with pytest.raises(GraphError, match="'pool'.*unsupported op type 'lrn'"):
        validate_graph(g)
    g = build()
    del g.ops[1].attrs["kernel"]
    with pytest.raises(GraphError, match="'pool'.*missing attribute 'kernel'"):
        validate_graph(g)
    g = build()
    g.ops[0].params = {"bias": "b"}
    with pytest.raises(GraphError, match="'conv'.*missing parameter 'weights'"):
        validate_graph(g)
    g = build()
    g.ops[0].attrs["act"] = "gelu"
    with pytest.raises(GraphError, match="'conv'.*act 'gelu'"):
        validate_graph(g)
    g = build()
    g.ops[0].attrs["blob"] = {"a": 1}
    with pytest.raises(GraphError, match="'conv'.*attribute 'blob'.*not a JSON scalar"):
        validate_graph(g)
    g = build()
    g.ops[2].outputs = ["p"]
    with pytest.raises(GraphError, match="'add'.*'p' is already written by op 'pool'"):
        validate_graph(g)
    g = build()
    g.ops[3].inputs = ["s", "c"]
    with pytest.raises(GraphError, match="'concat'.*input 'c'.*does not match"):
        validate_graph(g)


def test_subgraph_errors():
    g = build()
    g.root.children.append(Subgraph("cpu0", "cpu", ["pool"]))
    with pytest.raises(GraphError, match="op 'pool' already in subgraph 'dpu0'"):
        validate_graph(g)
    g = build()
    g.root.children[0].device = "gpu"
    with pytest.raises(GraphError, match="device 'gpu'"):
        validate_graph(g)
    g = build()
    g.root.children[0].ops.append("ghost")
    with pytest.raises(GraphError, match="unknown op 'ghost'"):
        validate_graph(g)


# -- serialization -----------------------------------------------------------------------------------------
def test_round_trip_equal_and_deterministic(tmp_path):
    g = build()
    data = dumps(g)
    assert data[:8] == MAGIC
    g2 = loads(data)
    assert g2 == g
    assert g2.tensors["w"].data.dtype == np.int8
    assert dumps(g2) == data
    assert dumps(build(order=1)) == data  # equal graphs, different dict order: same bytes
    path = tmp_path / "net.xg"
    save(g, path)
    assert path.read_bytes() == data
    assert load(path) == g
    feeds = {"in": np.random.default_rng(1).integers(-128, 128, (1, 3, 8, 8)).astype(np.int8)}
    np.testing.assert_array_equal(run_graph(load(path), feeds)["cat"], run_graph(g, feeds)["cat"])


def test_different_graphs_differ():
    g = build()
    g.tensors["w"].data = g.tensors["w"].data.copy()
    g.tensors["w"].data[0, 0, 0, 0] ^= 1
    assert g != build()
    assert dumps(g) != dumps(build())


def test_wide_and_float_constants_round_trip():
    g = build()
    g.tensors["extra"] = Tensor("extra", (3, 2), "float32", None, np.arange(6, dtype=np.float32).reshape(3, 2) / 3)
    g.tensors["w16"] = Tensor("w16", (5,), "int16", 12, np.array([-32768, -1, 0, 1, 32767], np.int16))
    g2 = loads(dumps(g))
    assert g2 == g
    assert g2.tensors["w16"].data.dtype == np.int16


def test_truncated():
    data = dumps(build())
    for cut in (0, 4, 10, FIXED_SIZE - 1, FIXED_SIZE + 5, len(data) - 1):
        with pytest.raises(ArtifactError) as e:
            loads(data[:cut])
        assert "truncated" in str(e.value) or "not an XGraph file" in str(e.value)
    with pytest.raises(ArtifactError, match=f"truncated: {len(data) - 1} bytes.*need {len(data)}"):
        loads(data[:-1])


def test_wrong_magic_and_version():
    data = bytearray(dumps(build()))
    bad = bytes(b"PK\x03\x04") + bytes(data[4:])
    with pytest.raises(ArtifactError, match="not an XGraph file.*offset 0"):
        loads(bad)
    data[8:12] = struct.pack("<I", FORMAT_VERSION + 1)
    with pytest.raises(ArtifactError, match=f"unknown XGraph format version {FORMAT_VERSION + 1} at offset 8"):
        loads(bytes(data))


def test_trailing_bytes():
    data = dumps(build())
    with pytest.raises(ArtifactError, match=f"3 unexpected trailing bytes from offset {len(data)}"):
        loads(data + b"abc")


def test_flipped_bytes_everywhere():
    data = dumps(build())
    header_len = struct.unpack_from("<Q", data, 12)[0]
    header = json.loads(data[FIXED_SIZE:FIXED_SIZE + header_len])
    w = header["sections"]["w"]
    blob_start = FIXED_SIZE + header_len
    # every byte position: one clear ArtifactError, never another exception
    for pos in range(0, len(data), 7):
        bad = bytearray(data)
        bad[pos] ^= 0x10
        with pytest.raises(ArtifactError):
            loads(bytes(bad))
    # a flip inside the weights names the tensor and its byte range
    pos = blob_start + w["offset"] + 5
    bad = bytearray(data)
    bad[pos] ^= 0x01
    with pytest.raises(ArtifactError, match="checksum mismatch.*tensor 'w' \\(bytes "):
        loads(bytes(bad))
    # a flip in the JSON header
    bad = bytearray(data)
    bad[FIXED_SIZE + 3] ^= 0x01
    with pytest.raises(ArtifactError, match="checksum mismatch.*header"):
        loads(bytes(bad))
    # a flip in the stored checksum itself
    bad = bytearray(data)
    bad[30] ^= 0x01
    with pytest.raises(ArtifactError, match="checksum mismatch"):
        loads(bytes(bad))


def test_consistent_but_invalid_content_is_artifact_error():
    """A file whose checksum matches but whose content is wrong (hand-edited and re-hashed) is still refused."""
    data = dumps(build())
    hlen = struct.unpack_from("<Q", data, 12)[0]
    blen = struct.unpack_from("<Q", data, 20)[0]
    header = json.loads(data[FIXED_SIZE:FIXED_SIZE + hlen])
    header["ops"][1]["inputs"] = ["ghost"]
    for edit, msg in ((header, "stored graph is invalid.*'ghost'"), ({"format": "zip"}, "format tag")):
        h = json.dumps(edit, sort_keys=True, separators=(",", ":")).encode()
        payload = h + data[FIXED_SIZE + hlen:]
        fixed = struct.pack("<8sIQQ32s", MAGIC, FORMAT_VERSION, len(h), blen, hashlib.sha256(payload).digest())
        with pytest.raises(ArtifactError, match=msg):
            loads(fixed + payload)


def test_load_missing_file(tmp_path):
    with pytest.raises(ArtifactError, match="cannot read"):
        load(tmp_path / "absent.xg")
