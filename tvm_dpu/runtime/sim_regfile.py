"""SIMULATION of a Pynq board with a DPUCZDX8G core: a stand-in `pynq` module for testing the Pynq driver.

Nothing here touches hardware. `SimulatedPynq` offers the three parts of the `pynq` API the driver uses
(`Overlay`, `allocate`, `MMIO`) over a simulated physical address space:

* `allocate` returns numpy buffers with a fake, page-aligned `physical_address`. Each buffer has a host view
  (the array) and a separate "device" copy: `flush()` copies host -> device, `invalidate()` device -> host, so a
  driver that forgets a cache operation sees stale data, as on a board with caches.
* `MMIO` at the DPU IP's base address reads and writes a register file laid out as in `pynq_driver`. Writing
  AP_START to AP_CTRL runs the instruction emulator on the device copies of the buffers the base-address
  registers point at, with the code read from the instruction address up to its END.
* Faults behave like a hung core: an emulator error (bad address, bad instruction, unmapped register) leaves
  AP_DONE clear and records the reason in `SimulatedDPU.fault`; the driver then times out. `hang=True` never
  finishes; `latency_polls=N` sets AP_DONE only after N reads of AP_CTRL, to exercise polling.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tvm_dpu.arch import load_arch
from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.isa import decode
from tvm_dpu.errors import DPUError
from tvm_dpu.runtime import pynq_driver as regs
from tvm_dpu.emulator import NUM_REGIONS, Emulator

#: Simulated physical addresses: the DPU's AXI-lite window and the first contiguous buffer.
SIM_DPU_BASE = 0x8000_0000
SIM_DDR_BASE = 0x6000_0000
PAGE = 4096


class SimBuffer(np.ndarray):
    """A simulated `pynq.allocate` buffer: host array + device copy at a fake physical address."""

    physical_address: int
    _device: np.ndarray
    _ddr: "SimulatedDDR"

    def flush(self) -> None:
        self._device[...] = np.asarray(self).reshape(-1).view(np.uint8)

    def invalidate(self) -> None:
        np.asarray(self).reshape(-1).view(np.uint8)[...] = self._device

    sync_to_device = flush
    sync_from_device = invalidate

    @property
    def device_address(self) -> int:
        return self.physical_address

    def freebuffer(self) -> None:
        self._ddr.free(self.physical_address)

    close = freebuffer


@dataclass
class _Allocation:
    phys: int
    device: np.ndarray  # uint8, what the DPU sees


class SimulatedDDR:
    """Bump allocator of page-aligned fake physical addresses; resolves an address to device memory."""

    def __init__(self) -> None:
        self.next = SIM_DDR_BASE
        self.allocations: dict[int, _Allocation] = {}
        # the cores of one board allocate from one pool, each from its own calling thread
        self._lock = threading.Lock()

    def allocate(self, shape: Any, dtype: Any = np.uint8, **_: Any) -> SimBuffer:
        host = np.zeros(shape, dtype=dtype)
        nbytes = host.nbytes
        if nbytes <= 0:
            raise ValueError(f"cannot allocate an empty buffer of shape {shape}")
        alloc = _Allocation(0, np.zeros(nbytes, dtype=np.uint8))
        with self._lock:
            phys = alloc.phys = self.next
            self.next += (nbytes + PAGE - 1) // PAGE * PAGE
            self.allocations[phys] = alloc
        buf = host.view(SimBuffer)
        buf.physical_address = phys
        buf._device = alloc.device
        buf._ddr = self
        return buf

    def free(self, phys: int) -> None:
        with self._lock:
            self.allocations.pop(phys, None)

    def resolve(self, addr: int) -> tuple[_Allocation, int]:
        """(allocation, offset) holding byte address `addr`; KeyError when unmapped."""
        with self._lock:
            allocations = list(self.allocations.values())
        for a in allocations:
            if a.phys <= addr < a.phys + a.device.size:
                return a, addr - a.phys
        raise KeyError(f"physical address 0x{addr:x} is not inside any allocated buffer")


@dataclass
class SimulatedDPU:
    """The register file of one simulated DPUCZDX8G core; AP_START runs the emulator."""

    arch: Arch
    ddr: SimulatedDDR
    hang: bool = False
    latency_polls: int = 0
    regs: dict[int, int] = field(default_factory=dict)
    fault: str | None = None
    runs: int = 0
    writes: list[tuple[int, int]] = field(default_factory=list)  # every register write, in order
    _polls_left: int = 0
    _armed: bool = True  # a start is accepted; after a run, only once INT_CLEAR (0x40) has been written

    def __post_init__(self) -> None:
        self.regs[regs.AP_CTRL] = regs.AP_IDLE
        fp = self.arch.fingerprint
        self.regs[regs.FINGERPRINT_LO] = fp & 0xFFFFFFFF
        self.regs[regs.FINGERPRINT_HI] = fp >> 32

    def read(self, offset: int) -> int:
        if offset == regs.AP_CTRL and self._polls_left > 0:
            self._polls_left -= 1
            if self._polls_left == 0:
                self._finish()
        value = self.regs.get(offset, 0)
        if offset == regs.AP_CTRL and value & regs.AP_DONE:
            self.regs[offset] = value & ~regs.AP_DONE  # ap_done is clear-on-read, as the IP does
        return value

    def write(self, offset: int, value: int) -> None:
        value = int(value) & 0xFFFFFFFF
        self.writes.append((offset, value))
        if offset == regs.AP_CTRL:
            if value & regs.AP_START:
                if not self._armed:  # the IP ignores a start until the done state is cleared through 0x40
                    self.fault = "AP_START without writing 1 to INT_CLEAR (0x40) after the previous run: ignored"
                    return
                self._start()
            return
        if offset == regs.INT_CLEAR:
            if value & 1:
                self._armed = True
            self.regs[offset] = value
            return
        if offset == regs.ISR:
            self.regs[regs.ISR] = self.regs.get(regs.ISR, 0) & ~value  # toggle-on-write clear of set bits
            return
        self.regs[offset] = value

    def _addr64(self, lo: int) -> int:
        return self.regs.get(lo, 0) | (self.regs.get(lo + 4, 0) << 32)

    def _start(self) -> None:
        self.regs[regs.AP_CTRL] = regs.AP_START  # busy: not idle, not done
        self._armed = False
        self.fault = None
        if self.hang:
            return
        try:
            self._execute()
        except (DPUError, KeyError) as e:
            self.fault = f"{type(e).__name__}: {e}"
            return  # a faulting core never raises done
        self.runs += 1
        if self.latency_polls > 0:
            self._polls_left = self.latency_polls
        else:
            self._finish()

    def _finish(self) -> None:
        self.regs[regs.AP_CTRL] = regs.AP_DONE | regs.AP_IDLE
        self.regs[regs.ISR] = self.regs.get(regs.ISR, 0) | regs.ISR_DONE

    def _execute(self) -> None:
        code_alloc, off = self.ddr.resolve(self._addr64(regs.INSTR_ADDR_LO))
        words = code_alloc.device[off - off % 4:].view("<u4").tolist()
        pos = 0
        while True:  # the core fetches until END; running off the buffer is a fault
            if pos >= len(words):
                raise DPUError(f"instruction fetch ran past the code buffer at word {pos} without an END")
            ins, n = decode(words, pos)
            pos += n
            if ins.name == "END":
                break
        regions = {}
        for rid in range(NUM_REGIONS):
            base = self._addr64(regs.addr_lo(rid))
            if base:
                alloc, boff = self.ddr.resolve(base)
                regions[rid] = alloc.device[boff:]
        Emulator(self.arch).run(np.asarray(words[:pos], dtype=np.uint32), regions)


class _SimOverlay:
    def __init__(self, bitfile: str, ip_dict: dict):
        self.bitfile = bitfile
        self.ip_dict = ip_dict


class _SimMMIO:
    def __init__(self, dpu: SimulatedDPU, base: int, length: int):
        self.dpu, self.base, self.length = dpu, base, length

    def _check(self, offset: int) -> None:
        if not 0 <= offset < self.length or offset % 4:
            raise ValueError(f"MMIO offset 0x{offset:x} outside the 0x{self.length:x}-byte window or unaligned")

    def read(self, offset: int, length: int = 4) -> int:
        self._check(offset)
        return self.dpu.read(offset)

    def write(self, offset: int, value: int) -> None:
        self._check(offset)
        self.dpu.write(offset, value)


class SimulatedPynq:
    """A SIMULATION of the `pynq` module for one board with `cores` DPU cores: pass as `PynqDevice(pynq=...)`.

    `arch`: the DPU configuration the simulated bitstream reports through its fingerprint registers. Core i has
    its own 4 KiB register window; the windows are placed at irregular offsets (as an overlay's hardware
    description may place them), so a driver must take them from the ip_dict, not assume a stride.
    """

    IP_NAME = "DPUCZDX8G_1"
    #: Offsets of the cores' register windows from SIM_DPU_BASE (deliberately not a fixed stride).
    CORE_OFFSETS = (0x0, 0x3000, 0x5000, 0x10000)

    def __init__(self, arch: Any = "DPUCZDX8G_ISA1_B4096", *, hang: bool = False, latency_polls: int = 0,
                 fail_allocation: bool = False, cores: int = 1):
        self.ddr = SimulatedDDR()
        self.dpus = [SimulatedDPU(load_arch(arch), self.ddr, hang=hang, latency_polls=latency_polls)
                     for _ in range(cores)]
        self.dpu = self.dpus[0]
        self.fail_allocation = fail_allocation
        self.ip_dict = {f"DPUCZDX8G_{i + 1}": {"phys_addr": SIM_DPU_BASE + self.CORE_OFFSETS[i],
                                               "addr_range": regs.REG_SPACE,
                                               "type": "xilinx.com:RTLKernel:DPUCZDX8G:1.0"}
                        for i in range(cores)}

    def Overlay(self, bitfile: str, *args: Any, **kwargs: Any) -> _SimOverlay:  # noqa: N802 (pynq's spelling)
        return _SimOverlay(bitfile, self.ip_dict)

    def allocate(self, shape: Any, dtype: Any = np.uint8, **kwargs: Any) -> SimBuffer:
        if self.fail_allocation:
            raise RuntimeError("simulated CMA pool exhausted")
        return self.ddr.allocate(shape, dtype)

    def MMIO(self, base_addr: int, length: int = 4, **kwargs: Any) -> _SimMMIO:  # noqa: N802
        for i, dpu in enumerate(self.dpus):
            if base_addr == SIM_DPU_BASE + self.CORE_OFFSETS[i]:
                return _SimMMIO(dpu, base_addr, length)
        raise ValueError(f"no simulated device at 0x{base_addr:x}")
