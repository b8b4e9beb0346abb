"""Bit-exact functional emulator of DPUCZDX8G ISA1 machine code (docs/isa1-emulator.md, isa1-semantics.md).

It executes instructions strictly in program order and ignores dpdon/dpdby, like AMD's `sim-runner` (the source of
the conformance vectors). Each instruction is one vectorised numpy step (engine modules emu_ddr, emu_conv, emu_alu,
emu_elew). Every bank id, DDR access and field combination the simulator checks is checked here, with an
EmulatorError naming the instruction index, the instruction and the field.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.isa import Instr, iter_program
from tvm_dpu.errors import EmulatorError, ISAError
from tvm_dpu.runtime import emu_alu, emu_conv, emu_ddr, emu_elew
from tvm_dpu.runtime.banks import Banks

#: Number of DDR base-address registers reachable by reg_id (3-bit field).
NUM_REGIONS = 8

#: Activation names of the Arch lists -> act_type codes.
ACT_CODES = {"relu": 1, "prelu": 2, "leaky_relu": 3, "relu6": 4, "hsigmoid": 5, "hswish": 6}


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


class Emulator:
    """Functional model of one DPU core: banks, the INIT registers, and the eight DDR regions.

    Bank contents persist across `run` calls (call `reset()` to clear them); banks start zeroed.
    `stop_at_end=True` (default) stops at the first END as the hardware does; False executes every instruction
    as AMD's simulator does (END is then a no-op).
    """

    def __init__(self, arch: Arch, stop_at_end: bool = True):
        self.arch = arch
        self.stop_at_end = stop_at_end
        self.banks = Banks(arch)
        self.regions: dict[int, np.ndarray] = {}
        self.convinit: Instr | None = None
        self.aluinit: Instr | None = None
        self.elew_fifo: list[Instr] = []
        self.stats = EmuStats()

    def reset(self) -> None:
        """Clear banks and INIT state."""
        self.banks.reset()
        self.convinit = None
        self.aluinit = None
        self.elew_fifo = []

    # ---- activation white-lists -------------------------------------------------------------
    def allowed_acts(self, engine: str) -> set[int]:
        """act_type codes the target allows on engine 'conv', 'alu' or 'elew'."""
        a = self.arch
        names, leaky_flag = {
            "conv": (a.conv_activations, a.conv_leaky),
            "alu": (a.alu_activations, a.dw_leaky),
            "elew": (a.elew_activations, False),
        }[engine]
        # Leaky is gated by the fingerprint flag (CV_LKRL / DW_LKRL), the other codes by the name lists.
        codes = {0} | {ACT_CODES[n] for n in names if n in ACT_CODES and n != "leaky_relu"}
        if leaky_flag:
            codes.add(ACT_CODES["leaky_relu"])
        return codes

    # ---- checks shared by engines ------------------------------------------------------------
    def check_image_bank(self, ctx: Ctx, field_name: str) -> int:
        b = int(ctx.ins.fields[field_name])
        if b not in self.banks.image_ids:
            raise ctx.error(field_name, f"not an image bank of {self.arch.name} ({self.banks.describe_image()})")
        return b

    def region(self, ctx: Ctx) -> np.ndarray:
        rid = int(ctx.ins.fields["reg_id"])
        reg = self.regions.get(rid)
        if reg is None:
            raise ctx.error("reg_id", f"DDR region {rid} is not defined (defined: {sorted(self.regions)})")
        return reg

    # ---- main loop ---------------------------------------------------------------------------
    def run(self, code: np.ndarray, regions: Mapping[int, np.ndarray]) -> EmuStats:
        """Execute machine code (uint32 words) against DDR `regions` {reg_id: uint8 array}, modified in place."""
        t0 = time.perf_counter()
        self.regions = {}
        for rid, arr in regions.items():
            if not 0 <= int(rid) < NUM_REGIONS:
                raise EmulatorError(f"DDR region id {rid} outside 0..{NUM_REGIONS - 1}")
            if not isinstance(arr, np.ndarray) or arr.dtype != np.uint8 or arr.ndim != 1:
                raise EmulatorError(f"DDR region {rid} must be a 1-D uint8 numpy array")
            self.regions[int(rid)] = arr
        code = np.asarray(code)
        if code.dtype != np.uint32:
            raise EmulatorError(f"code must be a uint32 array, got {code.dtype}")
        handlers = {
            "LOAD": emu_ddr.load, "SAVE": emu_ddr.save,
            "CONVINIT": Emulator._convinit, "CONV": emu_conv.conv,
            "ALUINIT": Emulator._aluinit, "ALU": emu_alu.alu,
            "ELEWINIT": Emulator._elewinit, "ELEW": emu_elew.elew,
            "END": Emulator._end,
            "POOLINIT": Emulator._isa0_only, "POOL": Emulator._isa0_only,
            "DWINIT": Emulator._isa0_only, "DPTWISE": Emulator._isa0_only,
        }
        stats = self.stats = EmuStats()
        try:
            program = list(iter_program(code))
        except ISAError as e:
            raise EmulatorError(f"cannot decode program: {e}") from None
        for index, (_, ins) in enumerate(program):
            ctx = Ctx(index, ins, self.arch)
            handlers[ins.name](self, ctx)
            stats.counts[ins.name] += 1
            if ins.name == "END":
                stats.ended = True
                if self.stop_at_end:
                    stats.skipped_after_end = len(program) - index - 1
                    break
        stats.seconds = time.perf_counter() - t0
        return stats

    # ---- instructions that only change state --------------------------------------------------
    def _convinit(self, ctx: Ctx) -> None:
        self.convinit = ctx.ins

    def _aluinit(self, ctx: Ctx) -> None:
        self.aluinit = ctx.ins

    def _elewinit(self, ctx: Ctx) -> None:
        self.elew_fifo.append(ctx.ins)

    def _end(self, ctx: Ctx) -> None:
        pass

    def _isa0_only(self, ctx: Ctx) -> None:
        engine = "pool_engine" if ctx.ins.name.startswith("POOL") else "dwconv_engine"
        raise ctx.error(None, f"{self.arch.name} (ISA1) has no {engine}; use ALUINIT/ALU "
                              f"(isa1-semantics.md 0, 12.10)")
