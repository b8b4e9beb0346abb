"""Per-instruction cost: cycles (compute engines) or AXI beats (LOAD/SAVE), DDR bytes and MACs.

Formulas (sources and assumptions in docs/timing-model.md):

* CONV (CONV engine): one cycle per output column, kernel tap and input channel group, each cycle doing
  PP rows x ICP input channels x OCP output channels (PG338 peak PP*ICP*OCP MACs per clock; a CONV reduces all
  `channel_group` groups and kh*kw taps, isa1-semantics.md 6.2): `kh*kw*cg*L + conv_fill_cycles`. Rows beyond vpp
  and channels beyond the real count are computed and wasted, as in hardware.
* ALU (MISC engine): `L*kh*kw*cg*kernel_d + alu_fill_cycles`, vpp <= ALU_PP rows in parallel (isa1-semantics 9.1).
* ELEW (MISC engine): `L*cg*ceil(num/elew_inputs_per_cycle) + alu_fill_cycles`.
* INIT / END: `init_cycles`.
* LOAD / SAVE: `dma_issue_cycles` plus a transfer of `beats` (data beats of axi_bytes plus burst_overhead_beats per
  burst; a contiguous transfer is split into max_burst_bytes bursts, a strided one is one burst per item) moved
  at the AXI rate shared with the other DMA engine (simulate.py), and never faster than the bank side:
  `dma_bank_rows_per_cycle` rows of ICP bytes per cycle (`length*ceil(channel/ICP)/dma_bank_rows_per_cycle`). Completion (the dpdby token) comes
  ddr_latency later; the engine itself is free when the last beat has moved.
"""
from __future__ import annotations

from dataclasses import dataclass

from tvm_dpu.codegen.isa import Instr, enum_codes
from tvm_dpu.timing.params import MachineModel, TimingError

#: The depthwise-conv ALU exec modes: the ones that multiply (MACs).
_DW_MODES = frozenset(enum_codes("alu_exec_mode")[m] for m in ("dwconv", "dwconv_nobias", "dwconv_w16"))

ENGINES: tuple[str, ...] = ("load", "save", "conv", "misc")
ENGINE_INDEX: dict[str, int] = {e: i for i, e in enumerate(ENGINES)}


#: The fields of each instruction that `CostModel.cost` reads (a CONV / ALU also reads these of its CONVINIT /
#: ALUINIT): with the instruction sequence and the dependency masks, all a program's timing depends on. The
#: timing model's cycle cache keys programs on these alone (simulate.timing_key), so programs that differ only in
#: addresses and shifts (a repeated block elsewhere in DDR, with other fix points) are simulated once;
#: tests/test_timing_key.py checks that `cost` reads no other field.
TIMED_FIELDS: dict[str, tuple[str, ...]] = {
    "LOAD": ("length", "channel", "jump_read", "broadcast"),
    "SAVE": ("length", "channel", "jump_write", "const_en", "argmax"),
    "CONVINIT": ("kernel_h", "kernel_w", "valid_pixel_parallel"),
    "CONV": ("channel_group", "length", "channel_offset"),
    "ALUINIT": ("kernel_h", "kernel_w", "channel_group", "length", "exec_mode"),
    "ALU": ("kernel_d", "valid_pixel_parallel"),
    "ELEW": ("num", "length", "channel_group"),
    "POOL": ("length", "channel_group"),
    "DPTWISE": ("length", "channel_group"),
}


@dataclass(frozen=True)
class InstrCost:
    """Cost of one instruction.

    Compute instructions (`beats == 0`) occupy their engine `cycles`. LOAD/SAVE move `beats` AXI beats at the rate
    the simulator grants, taking at least `cycles` (issue + bank-side limit), and complete `latency` cycles after
    their last beat.
    """

    engine: int
    cycles: float
    beats: float = 0.0
    latency: float = 0.0
    ddr_read: int = 0
    ddr_write: int = 0
    macs: int = 0
    #: beats per cycle of ports of its own (a DPUCAHX8H weight LOAD's weight ports); 0: the shared data ports
    own_ports: float = 0.0


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def dma_beats(m: MachineModel, length: int, channel: int, pitch: int) -> float:
    """AXI beats (data + burst overhead) of `length` items of `channel` bytes, `pitch` bytes apart in DDR."""
    ab = m.axi_bytes
    p = m.params
    if length == 1 or pitch == channel:
        total = length * channel
        bursts = _ceil(total, p.max_burst_bytes)
        return _ceil(total, ab) + bursts * p.burst_overhead_beats
    per_item_bursts = _ceil(channel, p.max_burst_bytes)
    return length * (_ceil(channel, ab) + per_item_bursts * p.burst_overhead_beats)


class CostModel:
    """Turns a decoded program into `InstrCost`s, tracking the INIT state (CONVINIT, ALUINIT, ELEWINIT queue).

    Class data the simulator reads (one cost model per instruction set, `cost_model_class`): `TIMED_FIELDS`, and
    per instruction whose cost reads an INIT, the INIT (`INITS`: INIT name -> instruction) and the attribute that
    holds it (`INIT_ATTR`)."""

    ISA = "DPUV2"
    TIMED_FIELDS = TIMED_FIELDS
    INITS = {"CONVINIT": "CONV", "ALUINIT": "ALU"}
    INIT_ATTR = {"CONV": "convinit", "ALU": "aluinit"}

    def __init__(self, m: MachineModel) -> None:
        self.m = m
        self.convinit: Instr | None = None
        self.aluinit: Instr | None = None

    def cost(self, idx: int, ins: Instr) -> InstrCost:
        m, p, a = self.m, self.m.params, self.m.arch
        name = ins.name
        f = ins.fields
        if name in ("LOAD", "SAVE"):
            length, channel = f["length"], f["channel"]
            pitch = f["jump_read"] if name == "LOAD" else f["jump_write"]
            nbytes = length * channel
            const = (name == "LOAD" and f.get("broadcast") == 7) or (name == "SAVE" and f.get("const_en"))
            beats = 0.0 if (const and name == "LOAD") else dma_beats(m, length, channel, pitch)
            bank_cycles = length * _ceil(channel, a.icp) / p.dma_bank_rows_per_cycle
            if name == "SAVE" and f.get("argmax", 0) & 2:
                nbytes, beats = length, dma_beats(m, length, 1, pitch)
            eng = ENGINE_INDEX["load" if name == "LOAD" else "save"]
            return InstrCost(eng, p.dma_issue_cycles + bank_cycles, beats, m.ddr_latency_cycles if beats else 0.0,
                             ddr_read=nbytes if name == "LOAD" and beats else 0,
                             ddr_write=nbytes if name == "SAVE" else 0)
        if name == "CONVINIT":
            self.convinit = ins
            return InstrCost(ENGINE_INDEX["conv"], p.init_cycles)
        if name == "CONV":
            ci = self._need(self.convinit, idx, name, "CONVINIT")
            kh, kw, vpp = ci["kernel_h"], ci["kernel_w"], ci["valid_pixel_parallel"]
            cg, length = f["channel_group"], f["length"]
            cycles = kh * kw * cg * length + p.conv_fill_cycles
            macs = vpp * length * a.ocp * kh * kw * max(0, cg * a.icp - f["channel_offset"])
            return InstrCost(ENGINE_INDEX["conv"], cycles, macs=macs)
        if name == "ALUINIT":
            self.aluinit = ins
            return InstrCost(ENGINE_INDEX["misc"], p.init_cycles)
        if name == "ALU":
            ai = self._need(self.aluinit, idx, name, "ALUINIT")
            kh, kw, cg, length = ai["kernel_h"], ai["kernel_w"], ai["channel_group"], ai["length"]
            d = f["kernel_d"]
            cycles = length * kh * kw * cg * d + p.alu_fill_cycles
            macs = 0
            if ai["exec_mode"] in _DW_MODES:
                macs = f["valid_pixel_parallel"] * length * kh * kw * d * cg * a.icp
            return InstrCost(ENGINE_INDEX["misc"], cycles, macs=macs)
        if name == "ELEW":
            reads = _ceil(f["num"], max(1, p.elew_inputs_per_cycle))
            return InstrCost(ENGINE_INDEX["misc"], f["length"] * f["channel_group"] * reads + p.alu_fill_cycles)
        if name in ("ELEWINIT", "POOLINIT", "DWINIT"):
            return InstrCost(ENGINE_INDEX["misc"], p.init_cycles)
        if name == "POOL":
            return InstrCost(ENGINE_INDEX["misc"], f["length"] * f["channel_group"] + p.alu_fill_cycles)
        if name == "DPTWISE":
            return InstrCost(ENGINE_INDEX["misc"], f["length"] * f["channel_group"] + p.alu_fill_cycles)
        if name == "END":
            return InstrCost(ENGINE_INDEX["save"], p.init_cycles)
        raise TimingError(f"instruction {idx} ({name}): no cost formula for this instruction")

    @staticmethod
    def _need(init: Instr | None, idx: int, name: str, init_name: str) -> Instr:
        if init is None:
            raise TimingError(f"instruction {idx} ({name}): no {init_name} before it")
        return init
