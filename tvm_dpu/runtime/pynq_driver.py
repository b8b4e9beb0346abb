"""Pynq driver for one DPUCZDX8G core, written against the `pynq` API (Overlay, allocate, MMIO).

Install on the board with ``pip install 'tvm-dpu[pynq]'``. The `pynq` module is injectable (``pynq=...``) so that
the simulated register file (`tvm_dpu.runtime.sim_regfile`, a simulation, not hardware) can stand in for a board.

Register map of one core (AXI-lite offsets from the IP's base address). Provenance of each entry:

====================  ==========  ======================================================================
register              offset      source
====================  ==========  ======================================================================
AP_CTRL               0x00        UNVERIFIED: Vitis-flow kernel control (bit 0 ap_start, bit 1 ap_done,
                                  bit 2 ap_idle), the convention of XRT-managed kernels such as the
                                  DPUCZDX8G of Vitis/Pynq-DPU overlays
GIE / IER / ISR       0x04/08/0C  UNVERIFIED: same convention (global/IP interrupt enable, interrupt
                                  status bit 0 = done, toggle-on-write clear)
INSTR_ADDR lo / hi    0x50/0x54   isa1-semantics.md section 4 (the edge runtime's dpu controller)
ADDR_i lo / hi        0x60 + 8*i  isa1-semantics.md section 4: base of DDR register reg_id = i, i < 8
FINGERPRINT lo / hi   0x1F0/1F4   UNVERIFIED for this flow: the Vivado-flow DPU driver's TARGETID
                                  registers; only read when no `arch` is given
====================  ==========  ======================================================================

The instruction address is written as a full 64-bit byte address (lo/hi); the Vivado-flow IP instead takes the
address shifted right by 12 in one register (unverified which the Vitis-flow IP expects; the code buffer is page
aligned so both readings name the same page). Base addresses follow the runtime rule base = physical address of
the region's buffer (every region starts at ddr_addr 0 of its own buffer).
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


def find_dpu_ip(ip_dict: dict, ip_name: str | None = None) -> tuple[str, dict]:
    """(name, ip_dict entry) of the DPU core in an overlay's ip_dict; DeviceError naming what is there."""
    if ip_name is not None:
        if ip_name not in ip_dict:
            raise DeviceError(f"overlay has no IP {ip_name!r} (IPs: {sorted(ip_dict)})")
        return ip_name, ip_dict[ip_name]
    for hint in DPU_IP_HINTS:
        for name in sorted(ip_dict):
            entry = ip_dict[name]
            if hint in name or hint in str(entry.get("type", "")):
                return name, entry
    raise DeviceError(f"overlay has no DPUCZDX8G IP (IPs: {sorted(ip_dict)}); load a bitstream with the DPU or "
                      "pass ip_name=")


class PynqDevice(RegisterDevice):
    """One DPUCZDX8G core driven through `pynq`: contiguous buffers from `pynq.allocate`, registers via MMIO.

    `overlay`: a loaded `pynq.Overlay` (or `bitfile` to load one). `arch`: the DPU configuration of the bitstream
    (preset name, Arch, fingerprint); when None it is read from the fingerprint registers (unverified offsets,
    see the module docstring). `timeout_s` bounds every run; a run that does not finish raises
    DeviceTimeoutError with the status registers.
    """

    name = "pynq"

    def __init__(self, overlay: Any = None, *, bitfile: str | None = None, ip_name: str | None = None,
                 arch: Any = None, timeout_s: float = 5.0, poll_interval_s: float = 1e-4, pynq: Any = None):
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
        self.ip_name, entry = find_dpu_ip(dict(getattr(overlay, "ip_dict", {}) or {}), ip_name)
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

    def set_instruction_address(self, addr: int) -> None:
        self._write64(INSTR_ADDR_LO, addr)

    def set_base_address(self, reg_id: int, addr: int) -> None:
        self._write64(addr_lo(reg_id), addr)

    def start(self) -> None:
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
