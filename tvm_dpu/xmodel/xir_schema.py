"""XIR's `graph_proto_v2` messages as field tables, with a protobuf wire-format encoder and decoder over them.

The field numbers and types are facts of XIR's public schema (`serial_v2.Graph` and friends); no AMD file is
vendored. One table drives both directions, so what `encode` writes `decode` reads back field for field.
A message value is a dict {field name: value}; repeated fields are lists; `map<string, X>` fields are dicts.
An attribute value (`AttrValue`, a oneof) is a pair (kind, value) with kind one of `ATTR_KINDS`.
Decoding parses bytes only (never executes anything) and raises XModelError naming the message and offset.
"""
from __future__ import annotations

import struct
from typing import Any

from tvm_dpu.errors import DPUError


class XModelError(DPUError, ValueError):
    """A malformed or unsupported .xmodel."""


# field tables: message -> {field name: (number, type, label)}; type is a scalar ("string", "bytes", "uint32",
# "int32", "uint64", "int64", "bool", "float", "double"), a message name, or "map:<value type>"; label is
# "one" or "rep".
MESSAGES: dict[str, dict[str, tuple[int, str, str]]] = {
    "Graph": {"graph_name": (1, "string", "one"), "op_node": (5, "OPNode", "rep"),
              "subg_root": (10, "SubGraph", "one"), "graph_attr": (11, "map:AttrValue", "one")},
    "OPNode": {"op_name": (1, "string", "one"), "op_type": (2, "string", "one"),
               "op_attr": (3, "map:AttrValue", "one"), "args": (4, "OpArg", "rep"),
               "output_tensor": (5, "Tensor", "one")},
    "OpArg": {"arg_name": (1, "string", "one"), "arg_ops": (2, "string", "rep")},
    "Tensor": {"tensor_name": (1, "string", "one"), "tensor_dim": (2, "uint32", "rep"),
               "data_type": (5, "int32", "one"), "tensor_bit_width": (6, "int32", "one"),
               "tensor_attr": (10, "map:AttrValue", "one")},
    "SubGraph": {"subgraph_name": (1, "string", "one"), "op_name": (3, "string", "rep"),
                 "subg_attr": (5, "map:AttrValue", "one"), "subg_child": (10, "SubGraph", "rep")},
    "Bytes": {"value": (1, "bytes", "one")},
}
#: AttrValue's oneof: kind -> (field number, element type, "one" | "vec" | "map").
ATTR_KINDS: dict[str, tuple[int, str, str]] = {
    "bool": (4, "bool", "one"), "int32": (5, "int32", "one"), "uint32": (6, "uint32", "one"),
    "int64": (7, "int64", "one"), "uint64": (8, "uint64", "one"), "float": (9, "float", "one"),
    "double": (10, "double", "one"), "string": (11, "string", "one"), "bytes": (12, "Bytes", "one"),
    "bool_vec": (13, "bool", "vec"), "int32_vec": (14, "int32", "vec"), "uint32_vec": (15, "uint32", "vec"),
    "int64_vec": (16, "int64", "vec"), "uint64_vec": (17, "uint64", "vec"), "float_vec": (18, "float", "vec"),
    "double_vec": (19, "double", "vec"), "string_vec": (20, "string", "vec"), "bytes_vec": (21, "Bytes", "vec"),
    "map_string_2_int32": (22, "int32", "map"), "map_string_2_uint32": (23, "uint32", "map"),
    "map_string_2_int64": (24, "int64", "map"), "map_string_2_uint64": (25, "uint64", "map"),
    "map_string_2_string": (26, "string", "map"), "map_string_2_bytes": (27, "Bytes", "map"),
}
#: XIR's DataType::Type numbering of Tensor.data_type.
DATA_TYPES = {"INT": 0, "UINT": 1, "XINT": 2, "XUINT": 3, "FLOAT": 4}
_KIND_BY_FIELD = {num: kind for kind, (num, _, _) in ATTR_KINDS.items()}
_VARINT = {"uint32", "int32", "uint64", "int64", "bool"}
_FIXED = {"float": ("<f", 5), "double": ("<d", 1)}


# -- encoding ------------------------------------------------------------------------------------------------
def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative int32/int64 are sign-extended to 10 bytes, as protobuf does
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _key(num: int, wire: int) -> bytes:
    return _varint(num << 3 | wire)


def _ld(num: int, payload: bytes) -> bytes:
    return _key(num, 2) + _varint(len(payload)) + payload


def _scalar(num: int, typ: str, v: Any) -> bytes:
    if typ in _VARINT:
        return _key(num, 0) + _varint(int(v))
    if typ in _FIXED:
        fmt, wire = _FIXED[typ]
        return _key(num, wire) + struct.pack(fmt, v)
    if typ == "string":
        return _ld(num, v.encode())
    if typ == "bytes":
        return _ld(num, bytes(v))
    return _ld(num, encode(typ, v))


def _packed(num: int, typ: str, vs: list) -> bytes:
    if typ in _VARINT:
        return _ld(num, b"".join(_varint(int(v)) for v in vs))
    if typ in _FIXED:
        return _ld(num, b"".join(struct.pack(_FIXED[typ][0], v) for v in vs))
    return b"".join(_scalar(num, typ, v) for v in vs)


def encode_attr(kind: str, value: Any) -> bytes:
    """The bytes of one AttrValue message."""
    if kind not in ATTR_KINDS:
        raise XModelError(f"attribute kind {kind!r} is not one of XIR's AttrValue kinds")
    num, typ, shape = ATTR_KINDS[kind]
    if typ == "Bytes":
        wrap = lambda b: {"value": bytes(b)}  # noqa: E731
    else:
        wrap = lambda b: b  # noqa: E731
    if shape == "one":
        return _scalar(num, typ, wrap(value))
    if shape == "vec":
        return _ld(num, _packed(1, typ, [wrap(v) for v in value]))
    # a map message {1: entries}; entries sorted by key so equal maps give equal bytes
    return _ld(num, b"".join(_ld(1, _scalar(1, "string", k) + _scalar(2, typ, wrap(value[k])))
                             for k in sorted(value)))


def encode(message: str, value: dict) -> bytes:
    """The wire bytes of `value` (dict of field name -> value) as `message`; fields in field-number order,
    map entries by key: deterministic."""
    table = MESSAGES[message]
    out = []
    for name, (num, typ, label) in sorted(table.items(), key=lambda kv: kv[1][0]):
        if name not in value or value[name] is None:
            continue
        v = value[name]
        if typ == "map:AttrValue":
            out += [_ld(num, _scalar(1, "string", k) + _ld(2, encode_attr(*v[k]))) for k in sorted(v)]
        elif label == "rep":
            out.append(_packed(num, typ, v))
        else:
            out.append(_scalar(num, typ, v))
    return b"".join(out)


# -- decoding ------------------------------------------------------------------------------------------------
def _read_varint(b: bytes, i: int, where: str) -> tuple[int, int]:
    n = shift = 0
    while True:
        if i >= len(b):
            raise XModelError(f"{where}: truncated varint at byte {i}")
        c = b[i]
        i += 1
        n |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return n, i
        if shift > 63:
            raise XModelError(f"{where}: varint longer than 10 bytes at byte {i}")


def _fields(b: bytes, where: str) -> list[tuple[int, int, Any]]:
    out = []
    i = 0
    while i < len(b):
        k, i = _read_varint(b, i, where)
        num, wire = k >> 3, k & 7
        if wire == 0:
            v, i = _read_varint(b, i, where)
        elif wire == 2:
            n, i = _read_varint(b, i, where)
            if i + n > len(b):
                raise XModelError(f"{where}: field {num} claims {n} bytes at byte {i}, {len(b) - i} remain")
            v, i = b[i:i + n], i + n
        elif wire in (1, 5):
            n = 8 if wire == 1 else 4
            if i + n > len(b):
                raise XModelError(f"{where}: truncated fixed field {num} at byte {i}")
            v, i = b[i:i + n], i + n
        else:
            raise XModelError(f"{where}: field {num} has wire type {wire}, not one protobuf defines (byte {i})")
        out.append((num, wire, v))
    return out


def _signed(n: int, typ: str) -> int:
    if typ in ("int32", "int64") and n >> 63:
        return n - (1 << 64)
    return n


def _decode_scalar(typ: str, wire: int, v: Any, where: str) -> Any:
    if typ in _VARINT:
        if wire != 0:
            raise XModelError(f"{where}: expected a varint, got wire type {wire}")
        return bool(v) if typ == "bool" else _signed(v, typ)
    if typ in _FIXED:
        return struct.unpack(_FIXED[typ][0], v)[0]
    if wire != 2:
        raise XModelError(f"{where}: expected length-delimited bytes, got wire type {wire}")
    if typ == "string":
        try:
            return bytes(v).decode()
        except UnicodeDecodeError:
            raise XModelError(f"{where}: string is not UTF-8") from None
    if typ == "bytes":
        return bytes(v)
    return decode(typ, v, where)


def _decode_rep(typ: str, wire: int, v: Any, where: str) -> list:
    if wire == 2 and (typ in _VARINT or typ in _FIXED):  # packed
        if typ in _FIXED:
            fmt = _FIXED[typ][0]
            size = struct.calcsize(fmt)
            return [struct.unpack_from(fmt, v, i)[0] for i in range(0, len(v) - len(v) % size, size)]
        out, i = [], 0
        while i < len(v):
            n, i = _read_varint(v, i, where)
            out.append(bool(n) if typ == "bool" else _signed(n, typ))
        return out
    return [_decode_scalar(typ, wire, v, where)]


def decode_attr(b: bytes, where: str) -> tuple[str, Any]:
    """(kind, value) of one AttrValue message."""
    fs = _fields(b, where)
    if len(fs) != 1:
        raise XModelError(f"{where}: an attribute value holds {len(fs)} fields, not 1")
    num, wire, v = fs[0]
    kind = _KIND_BY_FIELD.get(num)
    if kind is None:
        raise XModelError(f"{where}: attribute value field {num} is not a kind this reader knows")
    _, typ, shape = ATTR_KINDS[kind]
    unwrap = (lambda m: m.get("value") or b"") if typ == "Bytes" else (lambda m: m)  # noqa: E731
    if shape == "one":
        return kind, unwrap(_decode_scalar(typ, wire, v, where))
    if shape == "vec":
        out = []
        for n2, w2, v2 in _fields(v, where):
            if n2 == 1:
                out += _decode_rep(typ, w2, v2, where)
        return kind, [unwrap(x) for x in out]
    m = {}
    for n2, w2, v2 in _fields(v, where):
        if n2 != 1:
            continue
        entry = {n3: (w3, v3) for n3, w3, v3 in _fields(v2, where)}
        k = _decode_scalar("string", *entry[1], where) if 1 in entry else ""
        if 2 in entry:
            m[k] = unwrap(_decode_scalar(typ, *entry[2], f"{where}[{k}]"))
        else:  # protobuf omits a default value: an empty string/bytes or 0
            m[k] = b"" if typ == "Bytes" else "" if typ == "string" else 0
    return kind, m


def decode(message: str, b: bytes, where: str = "xmodel") -> dict:
    """Inverse of `encode`: a dict with every field of `message` present (repeated: [], maps: {})."""
    table = MESSAGES[message]
    by_num = {num: (name, typ, label) for name, (num, typ, label) in table.items()}
    out: dict[str, Any] = {name: ([] if label == "rep" else {} if typ.startswith("map:") else None)
                           for name, (num, typ, label) in table.items()}
    for num, wire, v in _fields(b, f"{where} ({message})"):
        if num not in by_num:
            continue  # unknown fields are skipped, as protobuf does (e.g. Graph.op_defs)
        name, typ, label = by_num[num]
        here = f"{where}.{name}"
        if typ == "map:AttrValue":
            entry = {n3: (w3, v3) for n3, w3, v3 in _fields(v, here)}
            k = _decode_scalar("string", *entry[1], here) if 1 in entry else ""
            if 2 not in entry or entry[2][0] != 2:
                raise XModelError(f"{here}[{k}]: attribute has no value")
            out[name][k] = decode_attr(entry[2][1], f"{here}[{k}]")
        elif label == "rep":
            out[name] += _decode_rep(typ, wire, v, here)
        else:
            out[name] = _decode_scalar(typ, wire, v, here)
    return out
