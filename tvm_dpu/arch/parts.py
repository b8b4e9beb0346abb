"""Zynq UltraScale+ parts as data (parts.json): PL resources, the board whose DDR and DPU clock apply, the
platform reserve and the DPU configurations AMD ships on each part."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from tvm_dpu.errors import ArchError

PARTS_FILE = Path(__file__).with_name("parts.json")


@lru_cache(maxsize=1)
def _data() -> dict:
    return json.loads(PARTS_FILE.read_text())


def _public(d: dict) -> dict:
    return {k: v for k, v in d.items() if not k.startswith("_")}


def list_parts() -> list[str]:
    return sorted(_public(_data()["parts"]))


def part_info(part: str) -> dict[str, Any]:
    """A part's entry: dsp, bram36k, lut, uram and board (the board preset name, or None)."""
    parts = _public(_data()["parts"])
    key = part.strip().lower()
    if key not in parts:
        raise ArchError(f"part {part!r}: known parts are {sorted(parts)}")
    return dict(parts[key])


def platform_reserve() -> dict[str, float]:
    """Share of each PL resource kept for the platform (see parts.json: an assumption, not sourced)."""
    return dict(_public(_data()["platform_reserve"]["fraction"]))


def shipped(part: str) -> dict[str, Any] | None:
    """The DPU configurations AMD ships on `part` ({"dpu": [...], "cores": [...], "source"}), or None."""
    return _public(_data()["shipped"]).get(part.strip().lower())
