"""Checks of values read from a file against a format's schema (types and ranges), before anything uses them.
Each failure is a SchemaError naming the field; the reader turns it into its own error with the file's name."""
from __future__ import annotations

import json
import re

import numpy as np


class SchemaError(Exception):
    """A value outside the schema; the message names the field."""


def need_int(v, what: str, lo: int | None = None, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise SchemaError(f"{what} must be an integer, got {type(v).__name__} {v!r:.40}")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise SchemaError(f"{what} = {v} outside [{lo}, {hi}]")
    return v


def need_str(v, what: str) -> str:
    if not isinstance(v, str) or not v:
        raise SchemaError(f"{what} must be a non-empty string, got {type(v).__name__} {v!r:.40}")
    return v


def need_list(v, what: str, n: int | None = None) -> list:
    if not isinstance(v, list) or (n is not None and len(v) != n):
        raise SchemaError(f"{what} must be a list{'' if n is None else f' of {n}'}, got {type(v).__name__} {v!r:.60}")
    return v


def need_dict(v, what: str) -> dict:
    if not isinstance(v, dict):
        raise SchemaError(f"{what} must be an object, got {type(v).__name__} {v!r:.60}")
    return v


#: tvm-dpu's own documents nest at most 7 deep (an artifact header); 64 leaves room and stays far below
#: Python's recursion limit.
MAX_JSON_DEPTH = 64
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)


def json_depth(raw: bytes) -> int:
    """Deepest bracket nesting of JSON text `raw`, brackets inside strings ignored; computed without recursion or
    a Python loop per byte, so a hostile file costs linear time and memory."""
    bare = np.frombuffer(_JSON_STRING.sub(b'""', raw), np.uint8)
    step = (np.isin(bare, (ord("["), ord("{"))).astype(np.int32)
            - np.isin(bare, (ord("]"), ord("}"))).astype(np.int32))
    return int(np.cumsum(step).max(initial=0))


def parse_json(raw: bytes | str, max_bytes: int, max_depth: int = MAX_JSON_DEPTH):
    """JSON text `raw` parsed after its size and nesting are checked (SchemaError for a document over either
    bound, not valid UTF-8 or not valid JSON), so neither a huge nor a deeply nested file reaches the parser."""
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    if len(raw) > max_bytes:
        raise SchemaError(f"the JSON document is {len(raw)} bytes, more than the {max_bytes} this reader accepts")
    depth = json_depth(raw)
    if depth > max_depth:
        raise SchemaError(f"the JSON document nests {depth} levels deep, more than the {max_depth} this reader "
                          "accepts")
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise SchemaError(f"not UTF-8 text (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise SchemaError(f"malformed JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except RecursionError:  # pragma: no cover - the depth check comes first
        raise SchemaError("the JSON document nests too deeply") from None
