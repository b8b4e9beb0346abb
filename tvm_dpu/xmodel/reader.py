"""Decoding an XIR graph (the protobuf inside a .xmodel) with the field tables of schema.py.

The result is plain Python: a message is a dict of field name -> value (absent fields get proto3 defaults;
repeated -> list, map -> dict), an AttrValue is an `Attr` (its oneof kind and Python value). Every length is
checked against its enclosing message and nesting is bounded, so a damaged file raises one XModelError naming
the field path and the file offset, never reads past the buffer or allocates from a length field.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from ..errors import XModelError
from ..util.protowire import FIXED32, LENGTH_DELIMITED, VARINT, WireError, fields, varint
from .schema import MESSAGES, WIRE_OF_KIND, WRAPPERS, Field

#: SubGraph nests itself; vai_c's trees are 3 deep. Deeper input is refused rather than recursed into.
MAX_DEPTH = 64


@dataclass(frozen=True)
class Attr:
    """One XIR attribute: `kind` is the AttrValue oneof field set (e.g. "int32_value", "map_string_2_bytes_value"),
    `value` its Python value (bool, int, float, str, bytes, list or dict)."""
    kind: str
    value: Any


def _default(f: Field) -> Any:
    if f.kind == "map":
        return {}
    if f.repeated:
        return []
    return {"string": "", "bytes": b"", "message": None, "bool": False, "float": 0.0, "double": 0.0}.get(f.kind, 0)


def _scalar(kind: str, raw: int | bytes) -> Any:
    if kind in ("int32", "int64"):
        return raw - (1 << 64) if raw >= 1 << 63 else raw
    if kind == "bool":
        return raw != 0
    if kind == "float":
        return struct.unpack("<f", raw)[0]
    if kind == "double":
        return struct.unpack("<d", raw)[0]
    return raw  # uint32, uint64, enum


class _Decoder:
    def __init__(self, buf: memoryview, source: str):
        self.buf = buf
        self.source = source

    def fail(self, path: str, offset: int, why: str) -> XModelError:
        return XModelError(f"{self.source}: field {path} at offset {offset}: {why}")

    def message(self, name: str, start: int, end: int, path: str, depth: int) -> dict[str, Any]:
        if depth > MAX_DEPTH:
            raise self.fail(path, start, f"messages nested more than {MAX_DEPTH} deep")
        table = MESSAGES[name]
        out: dict[str, Any] = {}
        present: list[Field] = []
        try:
            for number, wire, tag, v_start, v_end in fields(self.buf, start, end):
                f = table.get(number)
                if f is None:
                    continue  # a field this schema does not know: proto3 readers skip it
                fpath = f"{path}.{f.name}"
                if f.kind == "map":
                    key, value = self.map_entry(f, v_start, v_end, wire, fpath, tag, depth)
                    out.setdefault(f.name, {})[key] = value
                    continue
                values = self.values(f, wire, v_start, v_end, fpath, tag, depth)
                present.append(f)
                if f.repeated:
                    out.setdefault(f.name, []).extend(values)
                else:
                    out[f.name] = values[-1]  # proto3: the last one wins
        except WireError as e:
            raise self.fail(path, e.offset, str(e)) from None
        for f in table.values():
            out.setdefault(f.name, _default(f))
        if name == "AttrValue":
            return self.attr(out, present)
        return out

    def values(self, f: Field, wire: int, start: int, end: int, path: str, tag: int, depth: int) -> list[Any]:
        expected = WIRE_OF_KIND[f.kind]
        if wire == expected:
            if f.kind == "message":
                return [self.message(f.message, start, end, path, depth + 1)]
            if f.kind == "string":
                try:
                    return [str(self.buf[start:end], "utf-8")]
                except UnicodeDecodeError as e:
                    raise self.fail(path, start + e.start, "a string that is not UTF-8") from None
            if f.kind == "bytes":
                return [bytes(self.buf[start:end])]
            if wire == VARINT:
                return [_scalar(f.kind, varint(self.buf, start, end)[0])]
            return [_scalar(f.kind, bytes(self.buf[start:end]))]
        if wire == LENGTH_DELIMITED and f.repeated and expected != LENGTH_DELIMITED:
            return self.packed(f, start, end)
        raise self.fail(path, tag, f"wire type {wire} where the schema has a {f.kind}")

    def packed(self, f: Field, start: int, end: int) -> list[Any]:
        wire = WIRE_OF_KIND[f.kind]
        if wire == VARINT:
            out, pos = [], start
            while pos < end:
                v, pos = varint(self.buf, pos, end)
                out.append(_scalar(f.kind, v))
            return out
        size = 4 if wire == FIXED32 else 8
        if (end - start) % size:
            raise WireError(f"packed {f.kind}s of {end - start} bytes", start)
        return [_scalar(f.kind, bytes(self.buf[p:p + size])) for p in range(start, end, size)]

    def map_entry(self, f: Field, start: int, end: int, wire: int, path: str, tag: int,
                  depth: int) -> tuple[str, Any]:
        if wire != LENGTH_DELIMITED:
            raise self.fail(path, tag, f"wire type {wire} for a map entry")
        value_field = Field("value", f.value_kind, f.message)
        key, value = "", _default(value_field)
        for number, e_wire, e_tag, v_start, v_end in fields(self.buf, start, end):
            if number == 1:
                key = self.values(Field("key", "string"), e_wire, v_start, v_end, f"{path}.key", e_tag, depth)[0]
            elif number == 2:
                value = self.values(value_field, e_wire, v_start, v_end, f"{path}[{key!r}]", e_tag, depth)[0]
        if value is None and f.value_kind == "message":  # an entry without its value: the empty message
            value = self.message(f.message, end, end, f"{path}[{key!r}]", depth + 1)
        return key, value

    @staticmethod
    def attr(decoded: dict[str, Any], present: list[Field]) -> Attr:
        if not present:
            return Attr("empty", None)
        f = present[-1]  # a oneof: the last one on the wire wins, as in protobuf's own parsers
        value = decoded[f.name]
        if f.kind == "message" and f.message in WRAPPERS:
            value = value["value"]
            if f.message == "BytesVec":
                value = [b["value"] for b in value]
            elif f.message == "MapString2Bytes":
                value = {k: (v["value"] if v is not None else b"") for k, v in value.items()}
            elif f.message.startswith("MapString2") and f.message.endswith("Vec"):
                value = {k: (v["value"] if v is not None else []) for k, v in value.items()}
        return Attr(f.name, value)


def decode_graph(data: bytes | memoryview, source: str = "<bytes>") -> dict[str, Any]:
    """The XIR Graph message in `data` as nested dicts (see the module docstring)."""
    buf = memoryview(data).cast("B") if not isinstance(data, memoryview) else data.cast("B")
    if len(buf) == 0:
        raise XModelError(f"{source}: empty file: not an XIR graph")
    return _Decoder(buf, source).message("Graph", 0, len(buf), "Graph", 0)
