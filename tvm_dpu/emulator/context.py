"""What the emulator's engine modules share, below them all: the instruction being executed (`Ctx`, for error
messages), a compiled step, the statistics of a run, and `Core`, the part of the emulated core (banks, DDR regions,
INIT state) an engine reads and writes. The engines (ddr, conv, alu, elew) import only this module of the
emulator's top; core.Emulator is the `Core` they are given."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, Protocol

import numpy as np

from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.isa import Instr
from tvm_dpu.errors import EmulatorError

if TYPE_CHECKING:
    from tvm_dpu.emulator.banks import Banks

#: Number of DDR base-address registers reachable by reg_id (3-bit field).
NUM_REGIONS = 8

#: One compiled instruction: performs it against the DDR regions of the current run.
Step = Callable[[Mapping[int, np.ndarray]], None]


@dataclass
class EmuStats:
    """What one `Emulator.run` executed."""

    counts: Counter = field(default_factory=Counter)  # instructions executed, per name
    load_bytes: int = 0  # DDR bytes read by LOAD (const-fill LOADs count their item bytes)
    save_bytes: int = 0  # DDR bytes written by SAVE
    macs: int = 0  # multiply-accumulates of CONV and ALU dwconv modes (vpp rows only)
    ended: bool = False  # an END was reached
    skipped_after_end: int = 0  # instructions after END that were not executed (stop_at_end=True)
    seconds: float = 0.0

    @property
    def instructions(self) -> int:
        return sum(self.counts.values())

    def as_dict(self) -> dict:
        return {"counts": dict(self.counts), "instructions": self.instructions, "load_bytes": self.load_bytes,
                "save_bytes": self.save_bytes, "macs": self.macs, "ended": self.ended,
                "skipped_after_end": self.skipped_after_end, "seconds": self.seconds}


class Ctx:
    """The instruction being executed, for error messages."""

    def __init__(self, index: int, ins: Instr, arch: Arch):
        self.index = index
        self.ins = ins
        self.arch = arch

    def error(self, field_name: str | None, msg: str) -> EmulatorError:
        where = f"instruction {self.index} ({self.ins.name})"
        if field_name is not None:
            where += f" field {field_name}={self.ins.fields.get(field_name, '?')}"
        return EmulatorError(f"{where}: {msg}")

    def check(self, ok: bool, field_name: str | None, msg: str) -> None:
        if not ok:
            raise self.error(field_name, msg)


class Core(Protocol):
    """The state of one emulated core that the engines use (core.Emulator implements it)."""

    arch: Arch
    banks: "Banks"
    regions: dict[int, np.ndarray]
    aluinit: Instr | None
    elew_fifo: list[Instr]
    stats: EmuStats

    def scratch(self, name: str, shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray: ...

    def allowed_acts(self, engine: str) -> frozenset[int]: ...

    def check_image_bank(self, ctx: Ctx, field_name: str) -> int: ...

    def region(self, ctx: Ctx) -> np.ndarray: ...
