"""Safe, versioned binary format for an XGraph (no pickle; loading never executes anything from the file).

Layout (all integers little-endian)::

    offset  size  field
    0       8     magic b"DPUXGRPH"
    8       4     format version (uint32), currently 1
    12      8     header length H in bytes (uint64)
    20      8     blob length B in bytes (uint64)
    28      32    sha256 of the payload (bytes 60 .. 60+H+B)
    60      H     header: UTF-8 JSON (sorted keys, no spaces) with the graph structure and tensor metadata
    60+H    B     blobs: raw little-endian C-order arrays, each 16-byte aligned (zero filled), at the offsets
                  (relative to the blob start) the header gives, each with its own sha256

Equal graphs give identical bytes: tensors are written in name order and the JSON is canonical. Every defect
(wrong magic, unknown version, truncation, trailing bytes, a flipped byte, a malformed header) raises one
`ArtifactError` saying what and where.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
from typing import Any

import numpy as np

from tvm_dpu.errors import ArtifactError
from tvm_dpu.xgraph.graph import Graph, GraphError, Op, Subgraph, Tensor

MAGIC = b"DPUXGRPH"
FORMAT_VERSION = 1
_FIXED = struct.Struct("<8sIQQ32s")
FIXED_SIZE = _FIXED.size  # 60
_ALIGN = 16


def _subgraph_to_json(sg: Subgraph) -> dict[str, Any]:
    return {"name": sg.name, "device": sg.device, "ops": list(sg.ops),
            "children": [_subgraph_to_json(c) for c in sg.children]}


def _subgraph_from_json(d: dict[str, Any]) -> Subgraph:
    return Subgraph(d["name"], d["device"], list(d["ops"]), [_subgraph_from_json(c) for c in d["children"]])


def _jsonify(value: Any) -> Any:
    """numpy scalars and tuples to plain JSON values (lists)."""
    if isinstance(value, (list, tuple)):
        return [_jsonify(v) for v in value]
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


def dumps(graph: Graph) -> bytes:
    """Serialize `graph` (validated first) to bytes."""
    graph.validate()
    blobs = bytearray()
    tensors = []
    for name in sorted(graph.tensors):
        t = graph.tensors[name]
        entry: dict[str, Any] = {"name": t.name, "shape": list(t.shape), "dtype": t.dtype,
                                 "fix_point": None if t.fix_point is None else int(t.fix_point), "data": None}
        if t.data is not None:
            raw = np.ascontiguousarray(t.data).astype(np.dtype(t.dtype).newbyteorder("<"), copy=False).tobytes()
            blobs.extend(b"\0" * (-len(blobs) % _ALIGN))
            entry["data"] = {"offset": len(blobs), "nbytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}
            blobs.extend(raw)
        tensors.append(entry)
    header = {
        "format": "tvm-dpu-xgraph",
        "name": graph.name,
        "inputs": list(graph.inputs),
        "outputs": list(graph.outputs),
        "ops": [{"name": op.name, "type": op.type, "inputs": list(op.inputs), "outputs": list(op.outputs),
                 "attrs": _jsonify(op.attrs), "params": dict(op.params), "source": list(op.source)}
                for op in graph.ops],
        "tensors": tensors,
        "root": None if graph.root is None else _subgraph_to_json(graph.root),
    }
    hbytes = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                        allow_nan=False).encode("ascii")
    payload = hbytes + bytes(blobs)
    fixed = _FIXED.pack(MAGIC, FORMAT_VERSION, len(hbytes), len(blobs), hashlib.sha256(payload).digest())
    return fixed + payload


def _locate_corruption(header_bytes: bytes, blobs: bytes, start: int) -> str:
    """Best effort: which region a checksum mismatch is in, using the per-blob hashes."""
    try:
        header = json.loads(header_bytes)
        for t in header["tensors"]:
            d = t.get("data")
            if d is None:
                continue
            raw = blobs[d["offset"]: d["offset"] + d["nbytes"]]
            if hashlib.sha256(raw).hexdigest() != d["sha256"]:
                lo = start + len(header_bytes) + d["offset"]
                return f"in the data of tensor {t['name']!r} (bytes {lo}..{lo + d['nbytes'] - 1})"
        return f"in the header or blob padding (header bytes {start}..{start + len(header_bytes) - 1})"
    except Exception:  # the header itself is damaged
        return f"in the JSON header (bytes {start}..{start + len(header_bytes) - 1})"


def loads(data: bytes, source: str = "<bytes>") -> Graph:
    """Parse bytes written by `dumps`; `source` names the file in error messages."""
    data = bytes(data)
    if len(data) < len(MAGIC) or data[: len(MAGIC)] != MAGIC:
        raise ArtifactError(f"{source}: not an XGraph file (magic at offset 0 is {data[:8]!r}, expected {MAGIC!r})")
    if len(data) < FIXED_SIZE:
        raise ArtifactError(f"{source}: truncated: {len(data)} bytes, the fixed header needs {FIXED_SIZE}")
    _, version, hlen, blen, digest = _FIXED.unpack_from(data, 0)
    if version != FORMAT_VERSION:
        raise ArtifactError(f"{source}: unknown XGraph format version {version} at offset 8 (this reader knows "
                            f"version {FORMAT_VERSION})")
    end = FIXED_SIZE + hlen + blen
    if len(data) < end:
        raise ArtifactError(f"{source}: truncated: {len(data)} bytes, header (offset 12) and blob (offset 20) "
                            f"lengths need {end}; data ends at offset {len(data)}")
    if len(data) > end:
        raise ArtifactError(f"{source}: {len(data) - end} unexpected trailing bytes from offset {end}")
    payload = data[FIXED_SIZE:end]
    if hashlib.sha256(payload).digest() != digest:
        where = _locate_corruption(payload[:hlen], payload[hlen:], FIXED_SIZE)
        raise ArtifactError(f"{source}: checksum mismatch (sha256 stored at offset 28): the file is corrupt, {where}")
    try:
        return _build(json.loads(payload[:hlen].decode("ascii")), payload[hlen:], FIXED_SIZE + hlen)
    except ArtifactError:
        raise
    except GraphError as e:
        raise ArtifactError(f"{source}: the stored graph is invalid: {e}") from None
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, OverflowError, RecursionError) as e:
        raise ArtifactError(f"{source}: malformed header at offset {FIXED_SIZE}: {type(e).__name__}: {e}") from None


def _build(header: dict[str, Any], blobs: bytes, blob_start: int) -> Graph:
    if header.get("format") != "tvm-dpu-xgraph":
        raise ArtifactError(f"header at offset {FIXED_SIZE}: format tag {header.get('format')!r} is not "
                            "'tvm-dpu-xgraph'")
    tensors: dict[str, Tensor] = {}
    for t in header["tensors"]:
        arr = None
        d = t["data"]
        if d is not None:
            off, nbytes = int(d["offset"]), int(d["nbytes"])
            if off < 0 or off + nbytes > len(blobs):
                raise ArtifactError(f"tensor {t['name']!r}: data at blob offset {off} (+{nbytes}) lies outside the "
                                    f"{len(blobs)}-byte blob region starting at offset {blob_start}")
            dt = np.dtype(t["dtype"]).newbyteorder("<")
            count = int(np.prod(t["shape"], dtype=np.int64))
            if count * dt.itemsize != nbytes:
                raise ArtifactError(f"tensor {t['name']!r}: {nbytes} data bytes at offset {blob_start + off} do not "
                                    f"hold shape {t['shape']} of {t['dtype']}")
            arr = np.frombuffer(blobs, dtype=dt, count=count, offset=off).astype(t["dtype"]).reshape(t["shape"])
        tensors[t["name"]] = Tensor(t["name"], tuple(t["shape"]), t["dtype"], t["fix_point"], arr)
    ops = [Op(o["name"], o["type"], list(o["inputs"]), list(o["outputs"]), dict(o["attrs"]), dict(o["params"]),
              list(o["source"])) for o in header["ops"]]
    root = None if header["root"] is None else _subgraph_from_json(header["root"])
    g = Graph(header["name"], tensors, ops, list(header["inputs"]), list(header["outputs"]), root)
    g.validate()
    return g


def save(graph: Graph, path: str | os.PathLike[str]) -> None:
    """Write `graph` to `path` (atomically: a temporary file renamed into place)."""
    data = dumps(graph)
    tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def load(path: str | os.PathLike[str]) -> Graph:
    """Read a graph written by `save`; ArtifactError on any defect."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ArtifactError(f"{os.fspath(path)}: cannot read XGraph file: {e.strerror}") from None
    return loads(data, os.fspath(path))
