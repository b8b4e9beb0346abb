"""Devices that execute a compiled DPU subgraph: the instruction emulator here, the Pynq driver on a board.

A device receives exactly what the hardware receives: the machine code, the DDR regions addressed by the
base-address registers (parameters, workspace, inputs, outputs) and nothing of the XGraph.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.compiler import CompiledSubgraph
from tvm_dpu.runtime.emulator import EmuStats, Emulator


class Device(Protocol):
    """What the runtime needs from a DPU: run one subgraph's code over its DDR regions (in place)."""

    arch: Arch

    def execute(self, sg: CompiledSubgraph, regions: dict[int, np.ndarray]) -> None:
        ...


class EmulatorDevice:
    """The bit-exact instruction emulator standing in for the DPU (one core)."""

    name = "emulator"

    def __init__(self, arch: Arch):
        self.arch = arch
        self.emulator = Emulator(arch)
        self.last_stats: EmuStats | None = None

    def execute(self, sg: CompiledSubgraph, regions: dict[int, np.ndarray]) -> None:
        self.last_stats = self.emulator.run(sg.code, regions)
