"""The DDR floor of a program: the fewest cycles any program of a network can take on the timing model when it moves
only what it must (its inputs and weights read once, its outputs written once) at the arch's DDR rate.

The rates are the simulator's (simulate.py): LOADs and SAVEs share the core's data ports, at most
`MachineModel.dma_beats_per_cycle` beats per cycle together, each engine one transfer at a time. A DPUCAHX8H
weight LOAD moves through the weight ports (`weight_ports` of `port_beats_per_cycle` each) and leaves the data
port to the SAVEs, but it still occupies the LOAD engine. So the floor is the largest of: all data-port bytes at
the shared rate, the LOAD engine's bytes (input maps, then weights at their own rate), the SAVE engine's bytes.
Issue costs, the bank side (one ICP-byte row per pixel however few channels it has) and DDR latency are left out:
a floor, not an estimate. A compiler whose program takes no more than a few per cent over it has nothing left to
win on that network (bench_vaic says so in the row instead of reporting a bare miss).
"""
from __future__ import annotations

from dataclasses import dataclass

from tvm_dpu.arch.arch import Arch
from tvm_dpu.timing.params import TimingParams, machine


@dataclass(frozen=True)
class DdrFloor:
    """Cycles of the floor and what bounds it ('data port', 'LOAD engine' or 'SAVE engine')."""
    cycles: float
    bound: str
    read_bytes: int
    write_bytes: int
    weight_bytes: int


def ddr_floor(arch: Arch | str, read_bytes: int, write_bytes: int, weight_bytes: int,
              params: TimingParams | None = None) -> DdrFloor:
    """The DDR floor of a network that reads `read_bytes` of input maps and `weight_bytes` of weights and biases
    and writes `write_bytes` of output maps, on `arch`'s timing model."""
    m = machine(arch, params)
    data = m.dma_beats_per_cycle * m.axi_bytes  # bytes per cycle through the shared data ports
    own = m.params.weight_load_bank >= 0  # weight LOADs through ports of their own (DPUCAHX8H)
    weights = max(1, m.params.weight_ports) * m.port_beats_per_cycle * m.axi_bytes if own else data
    shared = read_bytes + write_bytes + (0 if own else weight_bytes)
    bounds = {"data port": shared / data, "LOAD engine": read_bytes / data + weight_bytes / weights,
              "SAVE engine": write_bytes / data}
    bound = max(bounds, key=bounds.__getitem__)
    return DdrFloor(bounds[bound], bound, read_bytes, write_bytes, weight_bytes)
