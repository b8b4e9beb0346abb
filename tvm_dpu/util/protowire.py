"""Protobuf wire format, walked by hand: the varint, the field framing and nothing else.

Two readers share it: frontend/onnx_lazy.py (an ONNX file without its weights) and xmodel/ (AMD's XIR graphs,
whose schema is written out as field tables rather than generated code). Every read is bounded by the message
that holds it, so a truncated or oversized field raises WireError with the file offset instead of reading past
the buffer or allocating from a length it was told.
"""
from __future__ import annotations

from typing import Iterator

VARINT, FIXED64, LENGTH_DELIMITED, FIXED32 = 0, 1, 2, 5


class WireError(ValueError):
    """Bytes that are not protobuf wire format: `offset` is where in the buffer the defect starts."""

    def __init__(self, message: str, offset: int):
        super().__init__(message)
        self.offset = offset


def varint(buf: memoryview | bytes, pos: int, end: int) -> tuple[int, int]:
    """(value, position after it) of the varint at buf[pos], which must end before `end` (at most 10 bytes)."""
    start = pos
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise WireError("truncated varint" if pos >= end else "varint longer than 10 bytes", start)
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def encode_varint(value: int) -> bytes:
    """The varint encoding of a non-negative `value` (negative int32/int64 first add 2**64, as protobuf does)."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def fields(buf: memoryview | bytes, start: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(field number, wire type, tag start, value start, value end) of each field in buf[start:end]; for a
    varint the value span is its encoding. Groups (wire types 3, 4) and the unused types 6, 7 are refused."""
    pos = start
    while pos < end:
        tag_start = pos
        key, pos = varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise WireError("field number 0", tag_start)
        if wire == VARINT:
            _, value_end = varint(buf, pos, end)
        elif wire == FIXED64:
            value_end = pos + 8
        elif wire == FIXED32:
            value_end = pos + 4
        elif wire == LENGTH_DELIMITED:
            n, pos = varint(buf, pos, end)
            value_end = pos + n
        else:
            raise WireError(f"wire type {wire} of field {number}", tag_start)
        if value_end > end:
            raise WireError(f"field {number} runs {value_end - end} bytes past the end of its message", tag_start)
        yield number, wire, tag_start, pos, value_end
        pos = value_end
