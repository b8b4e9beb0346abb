"""Leaf data types handed between stages (no imports from the rest of the package)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class InputSpec:
    """A model input or output: name, static shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
