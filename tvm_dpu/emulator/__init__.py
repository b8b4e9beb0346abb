"""The bit-exact instruction emulators (docs/isa1-emulator.md): DPUCZDX8G ISA1 (`Emulator`) and DPUCAHX8H DPUV3E
(`DpuV3EEmulator`), each checked against AMD's simulator's conformance vectors.

This package is the runtime's one way in: devices, the dependency checker and the xmodel runner import from here,
never from the modules inside. Inside, `core` compiles a program into steps and runs them; the engines (`ddr`,
`conv`, `alu`, `elew`) plan and execute one instruction each against `context.Core`, the shared state below them
(`context` imports none of them, so there is no cycle); `gemm` and `threads` are the CONV / depthwise kernels and
the BLAS thread control; `banks` is the image-bank model.
"""
from tvm_dpu.emulator.context import NUM_REGIONS, Ctx, EmuStats
from tvm_dpu.emulator.core import Emulator
from tvm_dpu.emulator.dpuv3e import ISA as DPUV3E_ISA, WEIGHT_LOAD_BANK as DPUV3E_WEIGHT_LOAD_BANK
from tvm_dpu.emulator.dpuv3e import DpuV3EDevice, DpuV3EEmulator
from tvm_dpu.emulator.threads import DEFAULT_BLAS_THREADS, blas_threads

__all__ = ["NUM_REGIONS", "Ctx", "EmuStats", "Emulator", "DpuV3EEmulator", "DpuV3EDevice", "DPUV3E_ISA",
           "DPUV3E_WEIGHT_LOAD_BANK", "DEFAULT_BLAS_THREADS", "blas_threads"]
