"""Pynq driver for one DPUCZDX8G core, written against the `pynq` API (Overlay, allocate, MMIO).

Install on the board with ``pip install 'tvm-dpu[pynq]'``. The `pynq` module is injectable (``pynq=...``) so that
the simulated register file (`tvm_dpu.runtime.sim_regfile`, a simulation, not hardware) can stand in for a board.

Register map of one core (AXI-lite offsets from the core's own 4 KiB window, the Vitis-flow "1to1" map). Sources:
AMD's VART dpu-controller for edge devices (dpu_control_xrt_edge.cpp writes, before every start, 1 to 0x40 "CLEAR
INTERRUPT", 0x44 PROF_EN, 0x07070f0f to the HP register, the instruction address to INSTR_L/H and the eight
base addresses from ADDR_0_L), the header offsets it uses as reported in issue 11 (HP at 0x48, fingerprint at
0x1F0/0x1F4), and isa1-semantics.md section 4.

====================  ==========  ======================================================================
register              offset      meaning
====================  ==========  ======================================================================
AP_CTRL               0x00        bit 0 ap_start, bit 1 ap_done (cleared when read), bit 2 ap_idle
GIE / IER / ISR       0x04/08/0C  global / IP interrupt enable, interrupt status (toggle-on-write clear)
INT_CLEAR             0x40        write 1 before every start: clears the done state; without it the core
                                  runs only once
PROF_EN               0x44        profiling counters enable (written 0: not used)
HP_BUS                0x48        HP-port burst / outstanding settings, 0x07070f0f before every start
INSTR_ADDR lo / hi    0x50/0x54   instruction address: the full byte address of the 4 KiB-aligned code
ADDR_i lo / hi        0x60 + 8*i  base of DDR register reg_id = i, i < 8 (physical byte address)
FINGERPRINT lo / hi   0x1F0/1F4   the core's 64-bit fingerprint (read when no `arch` is given)
====================  ==========  ======================================================================

Addresses above 40 bits are refused (the DPU's AXI masters address 40 bits, as AMD's runtime checks). Base
addresses follow the runtime rule base = physical address of the region's buffer (every region starts at
ddr_addr 0 of its own buffer). An overlay with several cores lists one IP entry (one register window) per core in
its hardware description; `dpu_cores(overlay)` finds them, `PynqDevice(core=i)` drives the i-th.
"""
from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from tvm_dpu.arch import load_arch
from tvm_dpu.arch.arch import Arch
from tvm_dpu.runtime.device import DeviceError, RegisterDevice

AP_CTRL = 0x00
GIE = 0x04
IER = 0x08
ISR = 0x0C
INSTR_ADDR_LO = 0x50
INSTR_ADDR_HI = 0x54
ADDR_BASE = 0x60
INT_CLEAR = 0x40
PROF_EN = 0x44
HP_BUS = 0x48
HP_BUS_VALUE = 0x07070F0F
ADDR_LIMIT = 1 << 40
FINGERPRINT_LO = 0x1F0
FINGERPRINT_HI = 0x1F4
REG_SPACE = 0x1000

AP_START = 1 << 0
AP_DONE = 1 << 1
AP_IDLE = 1 << 2
ISR_DONE = 1 << 0

#: IP names a DPU overlay uses for the core, tried in order when `ip_name` is not given.
DPU_IP_HINTS = ("DPUCZDX8G", "dpuczdx8g", "dpu")


def addr_lo(reg_id: int) -> int:
    """Offset of the low 32 bits of base-address register ADDR_<reg_id>."""
    return ADDR_BASE + 8 * int(reg_id)


def import_pynq() -> Any:
    """The real `pynq` module, or a DeviceError saying how to get it."""
    try:
        return importlib.import_module("pynq")
    except ImportError as e:
        raise DeviceError(f"the Pynq driver needs the 'pynq' package ({e}); on the board run "
                          "pip install 'tvm-dpu[pynq]', or use device='emulator'") from None


def dpu_cores(ip_dict: dict) -> list[tuple[str, dict]]:
    """(name, ip_dict entry) of every DPU core in an overlay's ip_dict (its hardware description lists one register
    window per core), ordered by physical address: core i is the i-th."""
    for hint in DPU_IP_HINTS:
        found = [(name, e) for name, e in ip_dict.items() if hint in name or hint in str(e.get("type", ""))]
        if found:
            return sorted(found, key=lambda ne: int(ne[1]["phys_addr"]))
    return []


def find_dpu_ip(ip_dict: dict, ip_name: str | None = None, core: int = 0) -> tuple[str, dict]:
    """(name, ip_dict entry) of DPU core `core` (or the IP `ip_name`) in an overlay's ip_dict; DeviceError naming
    what is there."""
    if ip_name is not None:
        if ip_name not in ip_dict:
            raise DeviceError(f"overlay has no IP {ip_name!r} (IPs: {sorted(ip_dict)})")
        return ip_name, ip_dict[ip_name]
    cores = dpu_cores(ip_dict)
    if not cores:
        raise DeviceError(f"overlay has no DPUCZDX8G IP (IPs: {sorted(ip_dict)}); load a bitstream with the DPU or "
                          "pass ip_name=")
    if not 0 <= core < len(cores):
        raise DeviceError(f"core {core}: the overlay has {len(cores)} DPU core(s) ({[n for n, _ in cores]})")
    return cores[core]


class PynqDevice(RegisterDevice):
    """One DPUCZDX8G core driven through `pynq`: contiguous buffers from `pynq.allocate`, registers via MMIO.

    `overlay`: a loaded `pynq.Overlay` (or `bitfile` to load one). `arch`: the DPU configuration of the bitstream
    (preset name, Arch, fingerprint); when None it is read from the fingerprint registers. `core`: which DPU core
    of the overlay (see `dpu_cores`). `timeout_s` bounds every run; a run that does not finish raises
    DeviceTimeoutError with the status registers.
    """

    name = "pynq"

    def __init__(self, overlay: Any = None, *, bitfile: str | None = None, ip_name: str | None = None,
                 arch: Any = None, timeout_s: float = 5.0, poll_interval_s: float = 1e-4, pynq: Any = None,
                 core: int = 0):
        super().__init__()
        self.pynq = pynq if pynq is not None else import_pynq()
        if overlay is None:
            if bitfile is None:
                raise DeviceError("PynqDevice needs an overlay or bitfile= (the DPU bitstream, e.g. dpu.bit)")
            try:
                overlay = self.pynq.Overlay(bitfile)
            except DeviceError:
                raise
            except Exception as e:  # pynq raises IOError/RuntimeError/ValueError variously
                raise DeviceError(f"cannot load overlay {bitfile!r}: {type(e).__name__}: {e}") from None
        self.overlay = overlay
        self.ip_name, entry = find_dpu_ip(dict(getattr(overlay, "ip_dict", {}) or {}), ip_name, core)
        self.core = core
        self.base_address = int(entry["phys_addr"])
        self.mmio = self.pynq.MMIO(self.base_address, int(entry.get("addr_range") or REG_SPACE))
        self.timeout_s = float(timeout_s)
        self.poll_interval_s = float(poll_interval_s)
        self.arch: Arch = load_arch(arch) if arch is not None else self._arch_from_registers()

    # -- registers ------------------------------------------------------------------------------------------
    def write_reg(self, offset: int, value: int) -> None:
        self.mmio.write(int(offset), int(value) & 0xFFFFFFFF)

    def read_reg(self, offset: int) -> int:
        return int(self.mmio.read(int(offset))) & 0xFFFFFFFF

    def _write64(self, offset: int, value: int) -> None:
        self.write_reg(offset, value & 0xFFFFFFFF)
        self.write_reg(offset + 4, (value >> 32) & 0xFFFFFFFF)

    def read_fingerprint(self) -> int:
        return self.read_reg(FINGERPRINT_LO) | (self.read_reg(FINGERPRINT_HI) << 32)

    def _arch_from_registers(self) -> Arch:
        from tvm_dpu.arch.arch import arch_from_fingerprint

        fp = self.read_fingerprint()
        try:
            return arch_from_fingerprint(fp)
        except ValueError as e:
            raise DeviceError(f"DPU IP {self.ip_name!r} reports fingerprint 0x{fp:016x}, which is not a DPUCZDX8G "
                              f"configuration ({e}); pass arch= explicitly") from None

    # -- RegisterDevice primitives --------------------------------------------------------------------------
    def allocate(self, nbytes: int) -> Any:
        return self.pynq.allocate(shape=(int(nbytes),), dtype=np.uint8)

    def free(self, buf: Any) -> None:
        for method in ("freebuffer", "close"):
            fn = getattr(buf, method, None)
            if fn is not None:
                fn()
                return

    @staticmethod
    def _checked_address(addr: int, what: str) -> int:
        if not 0 <= int(addr) < ADDR_LIMIT:
            raise DeviceError(f"{what} 0x{int(addr):x} is beyond the DPU's 40-bit address space")
        return int(addr)

    def set_instruction_address(self, addr: int) -> None:
        self._write64(INSTR_ADDR_LO, self._checked_address(addr, "instruction address"))

    def set_base_address(self, reg_id: int, addr: int) -> None:
        self._write64(addr_lo(reg_id), self._checked_address(addr, f"base address of DDR register {reg_id}"))

    def start(self) -> None:
        # What AMD's runtime writes before every start: clear the done state (else the core runs only once), no
        # profiling, the HP-port burst/outstanding settings; then ap_start.
        self.write_reg(INT_CLEAR, 1)
        self.write_reg(PROF_EN, 0)
        self.write_reg(HP_BUS, HP_BUS_VALUE)
        self.write_reg(AP_CTRL, AP_START)

    def is_done(self) -> bool:
        return bool(self.read_reg(AP_CTRL) & AP_DONE)

    def is_idle(self) -> bool:
        ctrl = self.read_reg(AP_CTRL)
        return bool(ctrl & AP_IDLE) or not (ctrl & AP_START)

    def acknowledge(self) -> None:
        isr = self.read_reg(ISR)
        if isr & ISR_DONE:
            self.write_reg(ISR, ISR_DONE)  # toggle-on-write clear

    def status(self) -> dict[str, int]:
        return {"AP_CTRL": self.read_reg(AP_CTRL), "ISR": self.read_reg(ISR)}
