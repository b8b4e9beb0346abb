"""An ONNX model's graph inputs read straight from the file's protobuf bytes, and the check of user-given input
shapes against them.

The CLI reads the inputs this way before anything heavy is imported (onnx, TVM: seconds), so a missing file, a
file that is not ONNX, an unknown input name or a wrong shape is reported at once instead of after the import. The
frontend checks the shapes with the same `checked_shapes` after its full import, so both say the same thing.
"""
from __future__ import annotations

import mmap
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from .errors import FrontendError
from .util.protowire import LENGTH_DELIMITED, VARINT, WireError, fields, varint

# Field numbers of onnx.proto3 (ModelProto.graph, GraphProto.initializer/input, TensorProto.name, ValueInfoProto,
# TypeProto.tensor_type, TypeProto.Tensor.shape, TensorShapeProto.dim, Dimension.dim_value/dim_param).
_MODEL_GRAPH, _GRAPH_INITIALIZER, _GRAPH_INPUT, _TENSOR_NAME = 7, 5, 11, 8
_VI_NAME, _VI_TYPE, _TYPE_TENSOR, _TENSOR_SHAPE, _SHAPE_DIM, _DIM_VALUE, _DIM_PARAM = 1, 2, 1, 2, 1, 1, 2


@dataclass(frozen=True)
class GraphInput:
    """One graph input: `dims` None when it declares no shape, a str where a dimension is symbolic."""

    name: str
    dims: list[int | str] | None
    is_tensor: bool = True


def _sub(buf: memoryview, start: int, end: int, number: int) -> list[tuple[int, int]]:
    return [(s, e) for n, w, _, s, e in fields(buf, start, end) if n == number and w == LENGTH_DELIMITED]


def _text(buf: memoryview, start: int, end: int, number: int) -> str:
    spans = _sub(buf, start, end, number)
    return bytes(buf[spans[-1][0]:spans[-1][1]]).decode("utf-8", "replace") if spans else ""


def _input(buf: memoryview, start: int, end: int) -> GraphInput:
    name = _text(buf, start, end, _VI_NAME)
    types = _sub(buf, start, end, _VI_TYPE)
    tensor = _sub(buf, *types[-1], _TYPE_TENSOR) if types else []
    if not tensor:
        return GraphInput(name, None, is_tensor=False)
    shapes = _sub(buf, *tensor[-1], _TENSOR_SHAPE)
    if not shapes:
        return GraphInput(name, None)
    dims: list[int | str] = []
    for d_start, d_end in _sub(buf, *shapes[-1], _SHAPE_DIM):
        value, param = 0, "?"
        for n, w, _, s, e in fields(buf, d_start, d_end):
            if n == _DIM_VALUE and w == VARINT:
                value = varint(buf, s, e)[0]
                value = value - (1 << 64) if value >= 1 << 63 else value
            elif n == _DIM_PARAM and w == LENGTH_DELIMITED:
                param = bytes(buf[s:e]).decode("utf-8", "replace") or "?"
        dims.append(int(value) if value > 0 else param)
    return GraphInput(name, dims)


def read_inputs(path: str | Path) -> list[GraphInput]:
    """The graph inputs of the ONNX file `path` that are not initializers, in order; FrontendError naming the file
    (and the byte offset) when it is missing or not an ONNX model."""
    path = Path(path)
    if not path.is_file():
        raise FrontendError(f"{path}: {'is a directory, expected an ONNX file' if path.is_dir() else 'no such file'}")
    try:
        with open(path, "rb") as f:
            if not f.seek(0, 2):
                raise FrontendError(f"{path}: the file is empty, not an ONNX model")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                buf = memoryview(mm)
                try:
                    graphs = _sub(buf, 0, len(buf), _MODEL_GRAPH)
                    if len(graphs) != 1:
                        raise WireError(f"{len(graphs)} graph fields, expected 1", 0)
                    inits = {_text(buf, s, e, _TENSOR_NAME) for s, e in _sub(buf, *graphs[0], _GRAPH_INITIALIZER)}
                    found = [_input(buf, s, e) for s, e in _sub(buf, *graphs[0], _GRAPH_INPUT)]
                finally:
                    buf.release()
    except WireError as e:
        raise FrontendError(f"{path}: not a readable ONNX model ({e} at byte offset {e.offset})") from None
    except OSError as e:
        raise FrontendError(f"{path}: cannot read: {e.strerror or e}") from None
    return [i for i in found if i.name not in inits]


def fmt_dims(dims: Sequence) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def checked_shapes(inputs: Sequence[GraphInput], shapes: Mapping | None, where: str) -> dict[str, list[int]]:
    """The static shape of every input: the given one (checked against the declared rank and fixed dimensions)
    or the declared one; FrontendError for a name that is no input, a clash or a dimension left symbolic."""
    names = [i.name for i in inputs]
    shapes = dict(shapes or {})
    unknown = [k for k in shapes if k not in names]
    if unknown:
        raise FrontendError(f"{where}: shapes given for {unknown}, which are not model inputs "
                            f"(the inputs are {names})")
    out: dict[str, list[int]] = {}
    for vi in inputs:
        dims = vi.dims
        if not vi.is_tensor:
            raise FrontendError(f"{where}: input '{vi.name}' is not a tensor; only tensor inputs are supported")
        if vi.name in shapes:
            try:
                given = [int(d) for d in shapes[vi.name]]
            except (TypeError, ValueError):
                raise FrontendError(f"shape for input '{vi.name}' must be a list of ints, got "
                                    f"{shapes[vi.name]!r}") from None
            if any(d <= 0 for d in given):
                raise FrontendError(f"shape for input '{vi.name}' must be positive, got {given}")
            if dims is not None and len(dims) != len(given):
                raise FrontendError(f"input '{vi.name}' has rank {len(dims)} ({fmt_dims(dims)}), "
                                    f"but the given shape {given} has rank {len(given)}")
            if dims is not None:
                clash = [i for i, (d, g) in enumerate(zip(dims, given)) if isinstance(d, int) and d != g]
                if clash:
                    raise FrontendError(f"input '{vi.name}' is declared {fmt_dims(dims)}; the given shape {given} "
                                        f"differs at dim(s) {clash}")
            out[vi.name] = given
            continue
        if dims is None or any(not isinstance(d, int) for d in dims):
            example = ",".join(str(d) if isinstance(d, int) else "1" for d in (dims or ["1", "3", "224", "224"]))
            raise FrontendError(
                f"input '{vi.name}' has {'unknown rank' if dims is None else 'dims ' + fmt_dims(dims)}: the DPU "
                f"compiler needs static shapes. Pass shapes={{'{vi.name}': [{example.replace(',', ', ')}]}} "
                f"(CLI: --input-shape {vi.name}={example})")
        out[vi.name] = [int(d) for d in dims]
    return out
