"""Safe, versioned binary format for an XGraph (no pickle; loading never executes anything from the file).

A `tvm_dpu.security.container` (magic b"DPUXGRPH", version 1): the JSON header holds the graph structure and tensor
metadata (name, shape, dtype, fix_point); each constant's raw little-endian C-order array is a section named by its
tensor, with its own sha256. Equal graphs give identical bytes: tensors are written in name order and the JSON is
canonical. Every defect (wrong magic, unknown version, truncation, trailing bytes, a flipped byte, a malformed
header) raises one `ArtifactError` saying what and where.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from tvm_dpu.security import container
from tvm_dpu.errors import ArtifactError
from tvm_dpu.xgraph.graph import Graph, GraphError, Op, Subgraph, Tensor
from tvm_dpu.xgraph.validate import validate_graph

MAGIC = b"DPUXGRPH"
FORMAT_VERSION = 1
FORMAT_TAG = "tvm-dpu-xgraph"
FIXED_SIZE = container.FIXED_SIZE  # 60


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
    """Serialize `graph` (validated first) to bytes; each constant is a container section named by its tensor."""
    validate_graph(graph)
    sections: dict[str, np.ndarray] = {}  # the arrays themselves: the container copies each once, into its bytes
    tensors = []
    for name in sorted(graph.tensors):
        t = graph.tensors[name]
        tensors.append({"name": t.name, "shape": list(t.shape), "dtype": t.dtype,
                        "fix_point": None if t.fix_point is None else int(t.fix_point), "data": t.data is not None})
        if t.data is not None:
            sections[t.name] = np.ascontiguousarray(t.data).astype(np.dtype(t.dtype).newbyteorder("<"), copy=False)
    header = {
        "format": FORMAT_TAG,
        "name": graph.name,
        "inputs": list(graph.inputs),
        "outputs": list(graph.outputs),
        "ops": [{"name": op.name, "type": op.type, "inputs": list(op.inputs), "outputs": list(op.outputs),
                 "attrs": _jsonify(op.attrs), "params": dict(op.params), "source": list(op.source)}
                for op in graph.ops],
        "tensors": tensors,
        "root": None if graph.root is None else _subgraph_to_json(graph.root),
    }
    return container.pack(MAGIC, FORMAT_VERSION, header, sections)


def loads(data: bytes, source: str = "<bytes>") -> Graph:
    """Parse bytes written by `dumps`; `source` names the file in error messages."""
    c = container.unpack(data, MAGIC, FORMAT_VERSION, source, "XGraph", FORMAT_TAG, article="an",
                         label="tensor {!r}")
    try:
        return _build(c)
    except ArtifactError:
        raise
    except GraphError as e:
        raise ArtifactError(f"{source}: the stored graph is invalid: {e}") from None
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, OverflowError, RecursionError) as e:
        raise ArtifactError(f"{source}: malformed header at offset {FIXED_SIZE}: {type(e).__name__}: {e}") from None


def _build(c: container.Container) -> Graph:
    header = c.header
    tensors: dict[str, Tensor] = {}
    for t in header["tensors"]:
        arr = None
        if t["data"]:
            raw = c.section(t["name"])
            dt = np.dtype(t["dtype"]).newbyteorder("<")
            count = int(np.prod(t["shape"], dtype=np.int64))
            if count * dt.itemsize != len(raw):
                raise ArtifactError(f"{c.source}: tensor {t['name']!r}: {len(raw)} data bytes do not hold shape "
                                    f"{t['shape']} of {t['dtype']}")
            arr = np.frombuffer(raw, dtype=dt, count=count).astype(t["dtype"]).reshape(t["shape"])
        tensors[t["name"]] = Tensor(t["name"], tuple(t["shape"]), t["dtype"], t["fix_point"], arr)
    ops = [Op(o["name"], o["type"], list(o["inputs"]), list(o["outputs"]), dict(o["attrs"]), dict(o["params"]),
              list(o["source"])) for o in header["ops"]]
    root = None if header["root"] is None else _subgraph_from_json(header["root"])
    g = Graph(header["name"], tensors, ops, list(header["inputs"]), list(header["outputs"]), root)
    validate_graph(g)
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
    from tvm_dpu.security.safe_io import read_regular

    return loads(read_regular(path, "artifact"), os.fspath(path))
