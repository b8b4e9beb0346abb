"""Physical timing parameters of a DPU core and its board (params.json), combined with an `Arch`.

The values are physical (bus widths, DDR efficiency and latency, pipeline fill): one set per arch/board, never per
network. `params.json` holds the defaults and optional per-board / per-DPU overrides; every value names its source or
says it is our assumption (docs/timing-model.md).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Mapping

from tvm_dpu.arch import load_arch
from tvm_dpu.arch.arch import Arch
from tvm_dpu.errors import DPUError


class TimingError(DPUError, ValueError):
    """Bad input to the timing model (unknown parameter, deadlocked program, ...)."""


#: When a LOAD/SAVE posts the token to its own engine (params.json `dma_own_token` says which reading is in force
#: and why): at its completion, DDR latency included, or when its transfer has ended.
DMA_OWN_TOKEN = ("completion", "transfer_end")


@dataclass(frozen=True)
class TimingParams:
    """Per-core physical parameters the cycle formulas use (see params.json for sources)."""

    axi_data_bits: int = 128
    axi_data_ports: int = 2
    instr_port_bits: int = 32
    ddr_efficiency: float = 0.7
    ddr_latency_ns: float = 200.0
    max_burst_bytes: int = 4096
    burst_overhead_beats: float = 4.0
    dma_issue_cycles: float = 4.0
    conv_fill_cycles: float = 96.0
    alu_fill_cycles: float = 16.0
    init_cycles: float = 2.0
    dma_bank_rows_per_cycle: float = 2.0
    elew_inputs_per_cycle: int = 1
    active_cores: int = 1
    host_pre_post_ms: float = 0.0
    dma_own_token: str = "completion"
    # A memory port of the core's own (an HBM pseudo channel), bytes/s; 0: the board's DDR split over active_cores
    mem_port_bytes_per_s: float = 0.0
    # The LOAD bank_id that loads weights through the weight ports (-1: none) and how many such ports there are
    weight_load_bank: int = -1
    weight_ports: int = 1

    def __post_init__(self) -> None:
        if self.dma_own_token not in DMA_OWN_TOKEN:
            raise TimingError(f"timing parameter dma_own_token={self.dma_own_token!r} is not one of "
                              f"{', '.join(DMA_OWN_TOKEN)}")

    def replace(self, **changes: Any) -> "TimingParams":
        """A copy with some values changed (unknown names raise TimingError)."""
        _check_keys(changes, "TimingParams.replace")
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class MachineModel:
    """An `Arch` plus its `TimingParams`, with the derived per-cycle quantities used by cost.py."""

    arch: Arch
    params: TimingParams

    @property
    def freq_hz(self) -> float:
        return self.arch.freq_mhz * 1e6

    @property
    def axi_bytes(self) -> int:
        """Bytes per beat of one AXI data port."""
        return self.params.axi_data_bits // 8

    @property
    def memory_beats_per_cycle(self) -> float:
        """Beats per cycle the core's memory delivers: its DDR share or, where each core has a memory port of its
        own, `mem_port_bytes_per_s` (an HBM pseudo channel), at `ddr_efficiency`."""
        share = self.params.mem_port_bytes_per_s or self.arch.ddr_bytes_per_s / max(1, self.params.active_cores)
        return share * self.params.ddr_efficiency / self.freq_hz / self.axi_bytes

    @property
    def dma_beats_per_cycle(self) -> float:
        """Beats per cycle all LOAD/SAVE traffic of the core can move: the AXI data ports, capped by its memory."""
        return min(float(self.params.axi_data_ports), self.memory_beats_per_cycle)

    @property
    def port_beats_per_cycle(self) -> float:
        """Beats per cycle one AXI port of its own memory moves (a DPUCAHX8H weight port: its own pseudo channel)."""
        return min(1.0, self.memory_beats_per_cycle)

    @property
    def ddr_latency_cycles(self) -> float:
        return self.params.ddr_latency_ns * 1e-9 * self.freq_hz

    @property
    def fetch_cycles_per_word(self) -> float:
        """Cycles to fetch one 32-bit instruction word through the instruction port."""
        return 32.0 / self.params.instr_port_bits

    @property
    def peak_ops_per_s(self) -> float:
        return self.arch.ops_per_clock * self.freq_hz


def _fields() -> set[str]:
    return {f.name for f in dataclasses.fields(TimingParams)}


def _check_keys(values: Mapping[str, Any], where: str) -> None:
    unknown = set(values) - _fields()
    if unknown:
        raise TimingError(f"{where}: unknown timing parameter(s) {', '.join(sorted(unknown))}; "
                          f"known: {', '.join(sorted(_fields()))}")


def _public(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if not k.startswith("_")}


#: The parameter file of each family the timing model has formulas for (beside this module; each names its
#: sources). DPUCZDX8G's is params.json.
PARAM_FILES = {"DPUCZDX8G": "params.json", "DPUCAHX8H": "params_dpucahx8h.json"}
#: The families whose instruction costs the timing model has formulas for.
TIMED_FAMILIES = tuple(PARAM_FILES)


@lru_cache(maxsize=None)
def _table(family: str = "DPUCZDX8G") -> dict[str, Any]:
    return json.loads(resources.files("tvm_dpu.timing").joinpath(PARAM_FILES[family]).read_text())


def load_params(arch: Arch | str, **overrides: Any) -> TimingParams:
    """Timing parameters for `arch` (an Arch or preset name): defaults, then the DPU's and the board's overrides from
    its family's parameter file (PARAM_FILES), then `overrides` (keyword arguments, e.g. for experiments)."""
    a = load_arch(arch)
    if a.family not in PARAM_FILES:
        raise TimingError(_untimed(a))
    t = _table(a.family)
    values = _public(t.get("defaults", {}))
    values.update(_public(t.get("dpus", {}).get(a.dpu_name, {})))
    if a.board:
        values.update(_public(t.get("boards", {}).get(a.board, {})))
    values.update(overrides)
    _check_keys(values, f"timing parameters of {a.name}")
    return TimingParams(**values)


def _untimed(a: Arch) -> str:
    return (f"{a.target_label}: no timing model for the {a.family} family yet (tvm-dpu times "
            f"{', '.join(TIMED_FAMILIES)} programs only)")


def machine(arch: Arch | str, params: TimingParams | None = None) -> MachineModel:
    """`MachineModel` of `arch` with `params` (default: load_params(arch)); TimingError for a family without a
    timing model (its programs run on the emulator but are not timed)."""
    a = load_arch(arch)
    if a.family not in TIMED_FAMILIES:
        raise TimingError(_untimed(a))
    return MachineModel(a, params if params is not None else load_params(a))
