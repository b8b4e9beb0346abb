"""Zynq UltraScale+ parts as data (parts.json): PL resources, the board whose DPU clock applies, the DDR bandwidth
of that board, the platform reserve and the DPU configurations AMD ships on each part. Every value in parts.json
carries its source."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from tvm_dpu.errors import ArchError

PARTS_FILE = Path(__file__).with_name("parts.json")
RESOURCES = ("dsp", "bram36k", "lut", "uram")


@lru_cache(maxsize=1)
def _data() -> dict:
    return json.loads(PARTS_FILE.read_text())


def _public(d: dict) -> dict:
    return {k: v for k, v in d.items() if not k.startswith("_")}


def list_parts() -> list[str]:
    return sorted(_public(_data()["parts"]))


def _entry(part: str) -> dict[str, Any]:
    parts = _public(_data()["parts"])
    key = part.strip().lower()
    if key not in parts:
        raise ArchError(f"part {part!r}: {_fixed_card(key) or ''}known parts are {sorted(parts)}")
    return parts[key]


def _fixed_card(name: str) -> str | None:
    """What to say when `name` is a card of another family (presets.json family_boards: u50, u50lv, u280)."""
    from tvm_dpu.arch.arch import families, family_boards
    for a in family_boards():
        if a.name == name:
            return (f"{name} is an Alveo card carrying {a.cores} x {a.dpu_name} engines at {a.freq_mhz:g} MHz "
                    f"(AMD's fixed overlay, presets.json family_boards): dse chooses DPUCZDX8G configurations for "
                    f"Zynq parts, and tvm-dpu compiles no {a.family} program to rank yet "
                    f"({families()[a.family].missing}); `tvm-dpu report` times a vai_c {a.family} xmodel on it; ")
    return None


def part_info(part: str) -> dict[str, Any]:
    """A part's entry: dsp, bram36k, lut, uram, board (the board preset name, or None) and source."""
    return {k: v for k, v in _entry(part).items() if k != "ddr_bytes_per_s"}


def part_ddr(part: str) -> tuple[float | None, str]:
    """(bytes/s, source) of the DDR on the board AMD builds the part into; None when no such board is known."""
    d = _entry(part)["ddr_bytes_per_s"]
    return (None if d["value"] is None else float(d["value"])), d["source"]


def platform_reserve() -> dict[str, float]:
    """PL the platform keeps on a part, in blocks: the shell plus the DPU's Vitis interconnect (parts.json gives
    the source of each figure)."""
    parts = _public(_data()["platform_reserve"])
    return {r: float(sum(c[r]["value"] for c in parts.values())) for r in RESOURCES}


def platform_reserve_sources() -> dict[str, dict[str, tuple[float, str]]]:
    """Per reserve component ("shell", "dpu_interconnect"), per resource: (value, source)."""
    parts = _public(_data()["platform_reserve"])
    return {name: {r: (float(c[r]["value"]), c[r]["source"]) for r in RESOURCES} for name, c in parts.items()}


def shipped(part: str) -> dict[str, Any] | None:
    """The DPU configurations AMD ships on `part` ({"dpu": [...], "cores": [...], "source"}), or None."""
    return _public(_data()["shipped"]).get(part.strip().lower())
