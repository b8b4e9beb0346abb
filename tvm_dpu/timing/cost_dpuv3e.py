"""Per-instruction cost of the DPUV3E instruction set (DPUCAHX8H: Alveo U50 / U50LV / U280).

The formulas are DPUCZDX8G's (cost.py) where the instruction does the same work; what DPUV3E does differently
(docs/timing-model.md, DPUCAHX8H section):

* A weight LOAD (`bank_id` = the family's `weight_load_bank`, 0x3F) fills `output_channel_num` CONV weight banks
  of `length` x `channel` bytes each through the core's weight ports (PG367: DPU_AXI_W0 / W1, half the output
  channels each), not the engine's feature-map port: it moves at `weight_ports` ports' rate (`own_ports`) and a
  SAVE running beside it keeps the whole data port.
* POOL, DWINIT/DPTWISE have engines of their own (AMD's target prototxts: pool_engine PP 1, dwconv_engine PP 2,
  CP 16), each output pixel reading kernel_h x kernel_w input pixels of CP channels per channel group per cycle,
  the engine's valid_pixel_parallel rows in parallel; their INITs hold the kernel. They post and take tokens as
  MISC (their category in the field table), so the model runs them on the MISC engine.
* There is no ALU / ALUINIT.
"""
from __future__ import annotations

from tvm_dpu.codegen.isa import Instr
from tvm_dpu.timing.cost import ENGINE_INDEX, CostModel, InstrCost, dma_beats
from tvm_dpu.timing.params import MachineModel

#: DPUV3E's fields the cost reads (as cost.TIMED_FIELDS for DPUV2; tests/test_timing_dpuv3e.py holds the cost
#: model to it).
TIMED_FIELDS_V3E: dict[str, tuple[str, ...]] = {
    "LOAD": ("length", "channel", "jump_read", "bank_id", "output_channel_num"),
    "SAVE": ("length", "channel", "jump_write"),
    "CONVINIT": ("kernel_h", "kernel_w", "valid_pixel_parallel"),
    "CONV": ("channel_group", "length", "channel_offset"),
    "POOLINIT": ("kernel_h", "kernel_w", "valid_pixel_parallel"),
    "POOL": ("length", "channel_group"),
    "DWINIT": ("kernel_h", "kernel_w", "valid_pixel_parallel"),
    "DPTWISE": ("length", "channel_group", "channel_offset"),
    "ELEW": ("num", "length", "channel_group"),
}


class V3ECostModel(CostModel):
    """`CostModel` for DPUV3E programs."""

    ISA = "DPUV3E"
    TIMED_FIELDS = TIMED_FIELDS_V3E
    INITS = {"CONVINIT": "CONV", "POOLINIT": "POOL", "DWINIT": "DPTWISE"}
    INIT_ATTR = {"CONV": "convinit", "POOL": "poolinit", "DPTWISE": "dwinit"}

    def __init__(self, m: MachineModel) -> None:
        super().__init__(m)
        self.poolinit: Instr | None = None
        self.dwinit: Instr | None = None

    def cost(self, idx: int, ins: Instr) -> InstrCost:
        name = ins.name
        if name == "LOAD" and ins.fields["bank_id"] == self.m.params.weight_load_bank:
            return self._weight_load(ins)
        if name in ("POOLINIT", "DWINIT"):
            setattr(self, "poolinit" if name == "POOLINIT" else "dwinit", ins)
            return InstrCost(ENGINE_INDEX["misc"], self.m.params.init_cycles)
        if name in ("POOL", "DPTWISE"):
            return self._window(idx, ins)
        return super().cost(idx, ins)

    def _weight_load(self, ins: Instr) -> InstrCost:
        """A LOAD into every CONV weight bank through the weight ports, which move its halves side by side and leave
        the engine's data port to its SAVEs."""
        m, p, f = self.m, self.m.params, ins.fields
        n, ch, oc = f["length"], f["channel"], f["output_channel_num"]
        ports = max(1, p.weight_ports)
        rows = n * -(-ch // m.arch.icp) * oc / ports
        return InstrCost(ENGINE_INDEX["load"], p.dma_issue_cycles + rows / p.dma_bank_rows_per_cycle,
                         oc * dma_beats(m, n, ch, f["jump_read"]), m.ddr_latency_cycles, ddr_read=n * ch * oc,
                         own_ports=ports * m.port_beats_per_cycle)

    def _window(self, idx: int, ins: Instr) -> InstrCost:
        """POOL / DPTWISE: kh*kw*cg*length cycles (vpp rows in parallel) plus the ALU-class fill."""
        f, a, p = ins.fields, self.m.arch, self.m.params
        pool = ins.name == "POOL"
        init = self._need(self.poolinit if pool else self.dwinit, idx, ins.name, "POOLINIT" if pool else "DWINIT")
        kh, kw, vpp = init["kernel_h"], init["kernel_w"], init["valid_pixel_parallel"]
        cg, length = f["channel_group"], f["length"]
        macs = 0 if pool else vpp * length * kh * kw * max(0, cg * a.icp - f["channel_offset"])
        return InstrCost(ENGINE_INDEX["misc"], kh * kw * cg * length + p.alu_fill_cycles, macs=macs)
