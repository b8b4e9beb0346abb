"""Devices that execute a compiled DPU subgraph: the instruction emulator here, the Pynq driver on a board.

A device receives exactly what the hardware receives: the machine code, the DDR regions addressed by the
base-address registers (parameters, workspace, inputs, outputs) and nothing of the XGraph.

Two levels share one contract:

* `Device.execute(sg, regions)`: what the runtime calls (SubgraphRunner); regions are modified in place.
* `RegisterDevice`: the hardware sequence behind `execute` for a memory-mapped DPU core: allocate physically
  contiguous buffers, copy in and flush, write the eight base-address registers and the instruction address,
  start, wait with a timeout, invalidate and copy out. The Pynq driver implements its primitives with the `pynq`
  API; the simulated register file (`sim_regfile`) stands in for the board in tests.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Protocol

import numpy as np

from tvm_dpu.arch.arch import Arch
from tvm_dpu.types import CompiledSubgraph
from tvm_dpu.errors import DPUError
from tvm_dpu.runtime.emulator import NUM_REGIONS, EmuStats, Emulator

#: The DPU runtime rounds every DDR register and the code buffer up to whole 4 KiB pages (isa1-semantics.md 4).
DDR_PAGE = 4096


class DeviceError(DPUError, RuntimeError):
    """The DPU device failed: no DPU IP in the overlay, allocation failure, busy core, bad status."""


class DeviceTimeoutError(DeviceError, TimeoutError):
    """The DPU did not signal done within the timeout (the message carries the status registers)."""


class Device(Protocol):
    """What the runtime needs from a DPU: run one subgraph's code over its DDR regions (in place)."""

    arch: Arch
    name: str

    def execute(self, sg: CompiledSubgraph, regions: dict[int, np.ndarray]) -> None:
        ...


class EmulatorDevice:
    """The bit-exact instruction emulator standing in for the DPU (one core). Safe to share between threads:
    each thread runs its own emulator state (banks, INIT registers, compiled-program cache)."""

    name = "emulator"

    def __init__(self, arch: Arch):
        self.arch = arch
        self._local = threading.local()
        self.last_stats: EmuStats | None = None

    @property
    def emulator(self) -> Emulator:
        """This thread's emulator."""
        emu = getattr(self._local, "emulator", None)
        if emu is None:
            emu = self._local.emulator = Emulator(self.arch)
        return emu

    def execute(self, sg: CompiledSubgraph, regions: dict[int, np.ndarray]) -> None:
        self.last_stats = self.emulator.run(sg.code, regions)


def arch_of(name: str, fingerprint: int, claimed_by: str = "the program") -> Arch:
    """The arch a compiled program names: the preset `name`, or (for a core known only by its fingerprint) the
    arch decoded from `fingerprint`; ArchError if the preset's fingerprint is not `fingerprint`."""
    from tvm_dpu.arch import load_arch
    from tvm_dpu.arch.arch import arch_from_fingerprint
    from tvm_dpu.errors import ArchError

    try:
        arch = load_arch(name)
    except ArchError:
        return arch_from_fingerprint(fingerprint)
    if arch.fingerprint != fingerprint:
        raise ArchError(f"arch {name!r} has fingerprint {arch.fingerprint:#x} here but {claimed_by} says "
                        f"{fingerprint:#x}")
    return arch


def page_align(n: int) -> int:
    return max(DDR_PAGE, (int(n) + DDR_PAGE - 1) // DDR_PAGE * DDR_PAGE)


class RegisterDevice:
    """The execution sequence of a memory-mapped DPU core, written once over a few primitives.

    Subclasses provide: `allocate(nbytes) -> buffer` (a 1-D uint8 array-like with `physical_address`,
    `flush()`, `invalidate()`), `write_reg(offset, value)`, `read_reg(offset) -> int`, and the register layout
    through `set_instruction_address`, `set_base_address`, `start`, `is_done`, `status`.
    Buffers are allocated once per compiled subgraph and reused by later calls.
    """

    name = "register-device"
    arch: Arch
    timeout_s: float = 5.0
    poll_interval_s: float = 1e-4

    def __init__(self) -> None:
        self._buffers: dict[int, tuple[CompiledSubgraph, Any, dict[int, Any]]] = {}
        self.last_seconds: float | None = None
        # One core runs one program at a time: calls from several threads take turns.
        self._run_lock = threading.Lock()

    # -- primitives (subclass) ------------------------------------------------------------------------------
    def allocate(self, nbytes: int) -> Any:
        raise NotImplementedError

    def free(self, buf: Any) -> None:
        raise NotImplementedError

    def set_instruction_address(self, addr: int) -> None:
        raise NotImplementedError

    def set_base_address(self, reg_id: int, addr: int) -> None:
        raise NotImplementedError

    def start(self) -> None:
        raise NotImplementedError

    def is_done(self) -> bool:
        raise NotImplementedError

    def is_idle(self) -> bool:
        raise NotImplementedError

    def acknowledge(self) -> None:
        """Clear the done/interrupt state after a run."""

    def status(self) -> dict[str, int]:
        raise NotImplementedError

    # -- the sequence -----------------------------------------------------------------------------------------
    def buffers_for(self, sg: CompiledSubgraph) -> tuple[Any, dict[int, Any]]:
        """(code buffer, reg_id -> region buffer) for `sg`, allocated on first use; code copied and flushed."""
        entry = self._buffers.get(id(sg))
        if entry is not None and entry[0] is sg:
            return entry[1], entry[2]
        code_bytes = np.ascontiguousarray(sg.code, dtype="<u4").view(np.uint8)
        code = self._allocate(page_align(code_bytes.size), f"the code of {sg.name!r}")
        code[: code_bytes.size] = code_bytes
        code[code_bytes.size:] = 0
        code.flush()
        regions = {}
        for rid, size in sorted(sg.region_sizes.items()):
            if not 0 <= int(rid) < NUM_REGIONS:
                raise DeviceError(f"subgraph {sg.name!r}: DDR region {rid} outside the 8 base-address registers")
            regions[int(rid)] = self._allocate(page_align(size), f"DDR region {rid} of {sg.name!r}")
        self._buffers[id(sg)] = (sg, code, regions)
        return code, regions

    def _allocate(self, nbytes: int, what: str) -> Any:
        try:
            return self.allocate(nbytes)
        except DeviceError:
            raise
        except (MemoryError, RuntimeError, OSError, ValueError) as e:
            raise DeviceError(f"cannot allocate {nbytes} bytes of contiguous memory for {what}: "
                              f"{type(e).__name__}: {e}") from None

    def execute(self, sg: CompiledSubgraph, regions: dict[int, np.ndarray]) -> None:
        """Copy in, point the DPU at code and regions, start, wait (timeout), copy out; regions updated in place.
        Serialised per device (thread-safe)."""
        with self._run_lock:
            self._execute(sg, regions)

    def _execute(self, sg: CompiledSubgraph, regions: dict[int, np.ndarray]) -> None:
        code, bufs = self.buffers_for(sg)
        if not self.is_idle():
            raise DeviceError(f"the DPU is busy before starting {sg.name!r} (status {self._status_text()}); "
                              "a previous run did not finish: reset the overlay")
        for rid, buf in bufs.items():
            src = regions[rid]
            buf[: src.size] = src
            buf[src.size:] = 0
            buf.flush()
        for rid in range(NUM_REGIONS):
            self.set_base_address(rid, int(bufs[rid].physical_address) if rid in bufs else 0)
        self.set_instruction_address(int(code.physical_address))
        t0 = time.monotonic()
        self.start()
        self.wait(sg.name, t0)
        self.last_seconds = time.monotonic() - t0
        self.acknowledge()
        for rid, buf in bufs.items():
            buf.invalidate()
            regions[rid][...] = np.asarray(buf)[: regions[rid].size]

    def wait(self, what: str, t0: float | None = None) -> None:
        """Poll for done until `timeout_s` has passed since `t0` (now if None); DeviceTimeoutError then."""
        t0 = time.monotonic() if t0 is None else t0
        deadline = t0 + self.timeout_s
        while True:
            if self.is_done():
                return
            if time.monotonic() >= deadline:
                raise DeviceTimeoutError(f"DPU did not finish {what!r} within {self.timeout_s:g} s "
                                         f"(status {self._status_text()}); the core may be hung on a bad "
                                         "instruction or address: reload the overlay before the next run")
            time.sleep(self.poll_interval_s)

    def _status_text(self) -> str:
        try:
            return ", ".join(f"{k}=0x{v:08x}" for k, v in self.status().items())
        except Exception as e:  # the status itself is unreadable: say so rather than mask the first error
            return f"unreadable: {type(e).__name__}: {e}"

    def close(self) -> None:
        """Free every buffer this device allocated."""
        for _, code, regions in self._buffers.values():
            for buf in [code, *regions.values()]:
                try:
                    self.free(buf)
                except Exception:  # freeing is best effort at shutdown
                    pass
        self._buffers.clear()
