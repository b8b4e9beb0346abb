"""Encoding an XIR graph (nested dicts, as reader.decode_graph returns them) to protobuf bytes with the field
tables of schema.py: the writer's half of the one schema definition.

Deterministic: fields in field-number order, map entries sorted by key, repeated numbers packed, proto3 defaults
of message fields left out (an attribute's oneof value is always written, even False or 0).
"""
from __future__ import annotations

import struct
from typing import Any

from ..errors import XModelError
from ..util.protowire import FIXED32, FIXED64, LENGTH_DELIMITED, VARINT, encode_varint
from .reader import Attr
from .schema import MESSAGES, WIRE_OF_KIND, WRAPPERS, Field

_ATTR_FIELDS = {f.name: (n, f) for n, f in MESSAGES["AttrValue"].items()}


def _key(number: int, wire: int) -> bytes:
    return encode_varint(number << 3 | wire)


def _ld(number: int, payload: bytes) -> bytes:
    return _key(number, LENGTH_DELIMITED) + encode_varint(len(payload)) + payload


def _raw(kind: str, v: Any) -> bytes:
    """The value bytes (no key) of one scalar."""
    if kind == "float":
        return struct.pack("<f", v)
    if kind == "double":
        return struct.pack("<d", v)
    return encode_varint(int(v))


def _one(number: int, f: Field, v: Any) -> bytes:
    if f.kind == "message":
        return _ld(number, attr_bytes(v) if f.message == "AttrValue" else encode(f.message, v))
    if f.kind == "string":
        return _ld(number, v.encode())
    if f.kind == "bytes":
        return _ld(number, bytes(v))
    return _key(number, WIRE_OF_KIND[f.kind]) + _raw(f.kind, v)


def _is_default(f: Field, v: Any) -> bool:
    return v is None or (not isinstance(v, Attr) and v in ("", b"", 0, False, [], {}))


def encode(message: str, value: dict[str, Any]) -> bytes:
    """The wire bytes of `value` (field name -> value) as `message`."""
    out = []
    for number, f in sorted(MESSAGES[message].items()):
        v = value.get(f.name)
        if _is_default(f, v):
            continue
        if f.kind == "map":
            vf = Field("value", f.value_kind, f.message)
            out += [_ld(number, _one(1, Field("key", "string"), k) + _one(2, vf, v[k])) for k in sorted(v)]
        elif f.repeated and WIRE_OF_KIND[f.kind] in (VARINT, FIXED32, FIXED64):
            out.append(_ld(number, b"".join(_raw(f.kind, x) for x in v)))
        elif f.repeated:
            out += [_one(number, f, x) for x in v]
        else:
            out.append(_one(number, f, v))
    return b"".join(out)


def _wrap(message: str, v: Any) -> dict:
    """An attribute's Python value as its wrapper message (the inverse of the reader's unwrapping)."""
    if message == "BytesVec":
        v = [{"value": b} for b in v]
    elif message == "MapString2Bytes":
        v = {k: {"value": b} for k, b in v.items()}
    elif message.startswith("MapString2") and message.endswith("Vec"):
        v = {k: {"value": x} for k, x in v.items()}
    return {"value": v}


def attr_bytes(a: Attr) -> bytes:
    """The bytes of one AttrValue message (its oneof field always written)."""
    if a.kind not in _ATTR_FIELDS:
        raise XModelError(f"attribute kind {a.kind!r} is not one of XIR's AttrValue fields")
    number, f = _ATTR_FIELDS[a.kind]
    if f.kind == "message" and f.message in WRAPPERS:
        return _ld(number, encode(f.message, _wrap(f.message, a.value)))
    return _one(number, f, a.value)


def encode_graph(graph: dict[str, Any]) -> bytes:
    """The bytes of an XIR Graph message (what a .xmodel file holds)."""
    return encode("Graph", graph)
