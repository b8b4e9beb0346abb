"""Checks of values read from a file against a format's schema (types and ranges), before anything uses them.
Each failure is a SchemaError naming the field; the reader turns it into its own error with the file's name."""
from __future__ import annotations


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
