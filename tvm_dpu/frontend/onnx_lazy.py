"""Reading an ONNX file without holding its weights: the large float32 initializers stay in the file and are read
straight into TVM's tensors when the importer converts them.

`onnx.load` reads the whole file into bytes and parses it into a proto holding every weight (VGG-16: 0.5 GB each);
the importer then copies every weight into TVM, so a compile held the weights two or three times before its first
pass. `load_lazy` walks the protobuf wire format of the file instead (ModelProto.graph = field 7,
GraphProto.initializer = 5, TensorProto.raw_data = 9), parses everything but those initializers' raw bytes, and
marks each such initializer as external data in the file itself (ONNX's own representation: data_location
EXTERNAL, external_data location / offset / length), with the file's absolute path as location so the tensor
says where its bytes are whatever the working directory. `read_tensor` then reads one into a TVM tensor.

Code that needs the values in the proto itself (QDQ stripping, cutting a model, ONNX's checker on a model
changed in memory) calls `with_weights` first and gets exactly what `onnx.load` gives.
"""
from __future__ import annotations

import mmap
import os
import numpy as np
import onnx
import tvm

from ..errors import FrontendError
from ..util.protowire import LENGTH_DELIMITED as _LENGTH_DELIMITED
from ..util.protowire import WireError as _WireError
from ..util.protowire import encode_varint as _encode_varint
from ..util.protowire import fields as _fields
from ..util.protowire import varint as _varint

#: Initializers at least this large are left in the file (small ones, e.g. shapes, stay in the proto).
MIN_LAZY_BYTES = 1 << 16
_MODEL_GRAPH, _GRAPH_INITIALIZER, _TENSOR_DATA_TYPE, _TENSOR_RAW_DATA, _TENSOR_DATA_LOCATION = 7, 5, 2, 9, 14


def _lazy_initializer(buf: memoryview, start: int, end: int) -> tuple[list, tuple[int, int]] | None:
    """(pieces of the initializer without its raw_data, (file offset, length) of the raw bytes), or None when it
    stays as it is (not float32, small, or not raw_data)."""
    raw = None
    float32 = False
    pieces = []
    for number, wire, tag_start, v_start, v_end in _fields(buf, start, end):
        if number == _TENSOR_RAW_DATA and wire == _LENGTH_DELIMITED:
            raw = (v_start, v_end - v_start)
            continue
        if number == _TENSOR_DATA_TYPE and wire == 0:
            float32 = _varint(buf, v_start, v_end)[0] == onnx.TensorProto.FLOAT
        if number == _TENSOR_DATA_LOCATION and wire == 0 and \
                _varint(buf, v_start, v_end)[0] == onnx.TensorProto.EXTERNAL:
            raise _WireError("external data files", start)  # onnx.load reads them
        pieces.append(buf[tag_start:v_end])
    if raw is None or not float32 or raw[1] < MIN_LAZY_BYTES:
        return None
    return pieces, raw


def _length_delimited(number: int, pieces: list) -> list:
    size = sum(len(p) for p in pieces)
    return [_encode_varint(number << 3 | _LENGTH_DELIMITED), _encode_varint(size), *pieces]


def _without_weights(buf: memoryview) -> tuple[bytes, list[tuple[int, int, int]]]:
    """(the model's bytes without the lazy initializers' raw data, [(initializer index, offset, length)])."""
    out, lazy, graphs = [], [], 0
    for number, wire, tag_start, v_start, v_end in _fields(buf, 0, len(buf)):
        if number != _MODEL_GRAPH or wire != _LENGTH_DELIMITED:
            out.append(buf[tag_start:v_end])
            continue
        graphs += 1
        graph, index = [], 0
        for g_number, g_wire, g_tag, g_start, g_end in _fields(buf, v_start, v_end):
            if g_number == _GRAPH_INITIALIZER and g_wire == _LENGTH_DELIMITED:
                found = _lazy_initializer(buf, g_start, g_end)
                if found is not None:
                    pieces, (offset, length) = found
                    graph += _length_delimited(_GRAPH_INITIALIZER, pieces)
                    lazy.append((index, offset, length))
                    index += 1
                    continue
                index += 1
            graph.append(buf[g_tag:g_end])
        out += _length_delimited(_MODEL_GRAPH, graph)
    if graphs != 1:
        raise _WireError(f"{graphs} graph fields", 0)
    return b"".join(out), lazy


def load_lazy(path: str) -> onnx.ModelProto:
    """The model in the ONNX file `path` with its large float32 initializers left in the file (see the module
    docstring). A file this reader does not expect (external data files, a malformed file) is read by
    `onnx.load` instead, which reports any defect."""
    path = os.path.abspath(path)
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            data, lazy = _without_weights(memoryview(mm))
        model = onnx.ModelProto.FromString(data)
    except Exception:  # noqa: BLE001 - anything unexpected (empty file, bad framing): onnx.load reports it
        return onnx.load(path)
    inits = model.graph.initializer
    for index, offset, length in lazy:
        t = inits[index]
        t.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", path), ("offset", str(offset)), ("length", str(length))):
            entry = t.external_data.add()
            entry.key, entry.value = key, value
    return model


def _lazy_place(t: onnx.TensorProto) -> tuple[str, int, int] | None:
    """(file, offset, length) of an initializer `load_lazy` left in its file, else None."""
    if t.data_location != onnx.TensorProto.EXTERNAL:
        return None
    info = {e.key: e.value for e in t.external_data}
    if not os.path.isabs(info.get("location", "")):
        return None  # ONNX external data relative to its model: onnx's own loader handles it
    return info["location"], int(info["offset"]), int(info["length"])


def has_lazy_weights(model: onnx.ModelProto) -> bool:
    return any(_lazy_place(t) is not None for t in model.graph.initializer)


def _read(place: tuple[str, int, int], out: np.ndarray) -> None:
    path, offset, length = place
    view = memoryview(out.reshape(-1)).cast("B")
    if view.nbytes != length:
        raise FrontendError(f"{path}: {length} bytes at offset {offset} do not fill a tensor of {view.nbytes} bytes")
    with open(path, "rb") as f:
        f.seek(offset)
        if f.readinto(view) != length:
            raise FrontendError(f"{path}: the file changed while it was read (truncated at offset {offset})")


def read_tensor(t: onnx.TensorProto) -> tvm.runtime.Tensor | None:
    """A lazy initializer's values read from its file straight into a new TVM tensor (no other copy), or None for
    an initializer whose values are in the proto."""
    place = _lazy_place(t)
    if place is None:
        return None
    tensor = tvm.runtime.empty(tuple(int(d) for d in t.dims), "float32")
    _read(place, np.from_dlpack(tensor))
    return tensor


def for_checker(model: onnx.ModelProto, where: str) -> onnx.ModelProto:
    """A copy of `model` that `onnx.checker` judges as it judges `with_weights(model)`, without reading the lazy
    weights (ResNet-50: the checker re-read and parsed the 100 MB file, 0.18 s).

    Each lazy initializer keeps its fields but holds an empty raw_data for an empty shape: the checker's only test
    of raw_data, that it fills the declared shape, is made here from the byte count in the file (FrontendError
    naming the initializer). Nothing else the checker tests without `full_check` reads an initializer's values
    or shape."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for t in out.graph.initializer:
        place = _lazy_place(t)
        if place is None:
            continue
        dims = [int(d) for d in t.dims]
        need = 4 * int(np.prod(dims, dtype=np.int64))  # float32: the only lazy data type
        if any(d < 0 for d in dims) or place[2] != need:
            raise FrontendError(f"{where}: initializer {t.name!r} holds {place[2]} bytes of raw_data, its shape "
                                f"{dims} of float32 needs {need}")
        t.ClearField("external_data")
        t.ClearField("data_location")
        del t.dims[:]
        t.dims.append(0)
        t.raw_data = b""
    return out


def with_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with every lazy initializer's values back in the proto (what `onnx.load` gives); `model` itself
    when it has none."""
    if not has_lazy_weights(model):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for t in out.graph.initializer:
        place = _lazy_place(t)
        if place is not None:
            values = np.empty(tuple(int(d) for d in t.dims), np.float32)
            _read(place, values)
            t.ClearField("external_data")
            t.ClearField("data_location")
            t.raw_data = values.tobytes()
    return out
