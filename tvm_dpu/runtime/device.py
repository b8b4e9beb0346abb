"""Devices that execute a compiled DPU subgraph: the instruction emulator here, the Pynq driver on a board.

A device receives exactly what the hardware receives: the machine code, the DDR regions addressed by the
base-address registers (parameters, workspace, inputs, outputs) and nothing of the XGraph.

Two levels share one contract:

* `Device.execute(sg, regions)`: what the runtime calls (SubgraphRunner); regions are modified in place.
* `RegisterDevice`: the hardware sequence behind `execute` for a memory-mapped DPU core: allocate physically
  contiguous buffers, copy in and flush, write the eight base-address registers and the instruction address,
  start, wait with a timeout, invalidate and copy out. The Pynq driver implements its primitives with the `pynq`
  API; the simulated register file (`sim_regfile`) stands in for the board in tests.

What a call hands over and what stays on the device: `regions` holds the regions of this call (reg_id -> array);
a region the call does not give is the device's own. The parameter region (REG_PARAMS) is then the program's
parameters, written into device memory once per loaded program (the first call) and never again while the
program stays loaded; the workspace and any other region not given is private to the device. The runtime gives
only the inputs and outputs (`CompiledSubgraph.io_regions`), or for segments on several cores the one shared
feature-map region (`shared_region`), which is already device memory and is used in place, with no copy.
"""
from __future__ import annotations

import threading
import time
import weakref
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Protocol

import numpy as np

from tvm_dpu.arch.arch import Arch
from tvm_dpu.types import REG_PARAMS, REG_SHARED, CompiledSubgraph
from tvm_dpu.errors import DPUError
from tvm_dpu.emulator import NUM_REGIONS, EmuStats, Emulator

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


def emulator_device(arch: Arch) -> Any:
    """The emulator of `arch`'s instruction set as a device: EmulatorDevice (DPUV2) or emulator.DpuV3EDevice."""
    if arch.instruction_set == "DPUV3E":
        from tvm_dpu.emulator import DpuV3EDevice

        return DpuV3EDevice(arch)
    return EmulatorDevice(arch)


class EmulatorDevice:
    """The bit-exact instruction emulator standing in for the DPU (one core). Safe to share between threads:
    each thread runs its own emulator state (banks, INIT registers, compiled-program cache)."""

    name = "emulator"

    def __init__(self, arch: Arch):
        self.arch = arch
        self._local = threading.local()
        self.last_stats: EmuStats | None = None
        self._padded: dict[int, tuple[Any, np.ndarray]] = {}
        self._padded_lock = threading.Lock()

    @property
    def emulator(self) -> Emulator:
        """This thread's emulator."""
        emu = getattr(self._local, "emulator", None)
        if emu is None:
            emu = self._local.emulator = Emulator(self.arch)
        return emu

    def execute(self, sg: CompiledSubgraph, regions: dict[int, np.ndarray]) -> None:
        """Run `sg` over `regions` (modified in place); its parameters, when not given, are the region this device
        keeps for the program (`resident_params`: made at most once per program, never per call), any other
        region not given a fresh zeroed one (so concurrent calls share nothing they write)."""
        check_shared(sg, regions)
        full = dict(regions)
        constant: tuple[int, ...] = ()
        for rid, size in sg.region_sizes.items():
            if rid not in full:
                if rid == REG_PARAMS:
                    full[rid], private = self._resident(sg)
                    # this device's own copy, which nothing writes: the emulator need not recheck the weights
                    # its CONVs load from it on every call
                    constant = (rid,) if private else ()
                else:
                    full[rid] = np.zeros(size, np.uint8)
        try:
            self.last_stats = self.emulator.run(sg.code, full, constant)
        except ValueError as e:
            if REG_PARAMS in regions or "read-only" not in str(e):
                raise
            raise DeviceError(f"program {sg.name!r} writes into its parameter region (DDR region {REG_PARAMS}), "
                              "which stays on the device for every later call: refusing to run it") from None

    def resident_params(self, sg: CompiledSubgraph) -> np.ndarray:
        """`sg`'s parameter region as this device keeps it: the program's parameter bytes themselves, read-only,
        when they fill the region (what the compiler writes); otherwise a zero-padded copy made once per program
        and dropped with it."""
        return self._resident(sg)[0]

    def _resident(self, sg: CompiledSubgraph) -> tuple[np.ndarray, bool]:
        """`resident_params(sg)` and whether it is this device's private copy (else a view of sg.params, which
        whoever holds `sg` could change)."""
        size = int(sg.region_sizes.get(REG_PARAMS, 0))
        params = np.asarray(sg.params, dtype=np.uint8).reshape(-1)
        if params.size == size:
            view = params.view()
            view.flags.writeable = False  # a program writing its own weights would corrupt every later call
            return view, False
        key = id(sg)
        with self._padded_lock:
            hit = self._padded.get(key)
            if hit is not None and hit[0]() is sg:
                return hit[1], True
            region = np.zeros(size, np.uint8)
            region[: params.size] = params
            region.flags.writeable = False
            self._padded[key] = (weakref.ref(sg, lambda _, k=key: self._padded.pop(k, None)), region)
            return region, True

    @contextmanager
    def shared_region(self, nbytes: int) -> Iterator[np.ndarray]:
        """A zeroed region of `nbytes` every core of this device addresses, for one call's segments (the emulator's
        DDR is host memory: a fresh array per call, so concurrent calls never share one)."""
        yield np.zeros(int(nbytes), np.uint8)


def check_shared(sg: CompiledSubgraph, regions: dict[int, Any]) -> None:
    """DeviceError when `sg` is a segment addressing the shared feature-map region and the call gives none: its
    inputs and outputs live only there (runtime.subgraph_runner.run_segments gives it)."""
    if REG_SHARED in sg.region_sizes and REG_SHARED not in regions:
        raise DeviceError(f"program {sg.name!r} reads and writes its feature maps in the shared DDR region "
                          f"{REG_SHARED}, which this call does not give: run it through its partition's segments")


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


@dataclass
class _Loaded:
    """A program as one RegisterDevice holds it: code and parameters in device memory (written once), and a
    buffer per other region of the program (its workspace; the inputs and outputs a call copies in and out)."""

    sg: CompiledSubgraph
    code: Any
    regions: dict[int, Any]
    #: Whether regions[REG_PARAMS] holds the program's parameters (False after a call gave its own).
    params_resident: bool = True


class RegisterDevice:
    """The execution sequence of a memory-mapped DPU core, written once over a few primitives.

    Subclasses provide: `allocate(nbytes) -> buffer` (a 1-D uint8 array-like with `physical_address`,
    `flush()`, `invalidate()`), `write_reg(offset, value)`, `read_reg(offset) -> int`, and the register layout
    through `set_instruction_address`, `set_base_address`, `start`, `is_done`, `status`.

    A program is loaded on its first call: its buffers allocated, its code and parameters copied and flushed.
    Later calls write only the regions they give (the inputs; `bytes_to_device` counts what was written, by
    kind), so the weights cross to the device once per loaded program, not per call. A program stays loaded
    until `close()`; another CompiledSubgraph (a rebuilt or reloaded model) is another program, loaded afresh.
    """

    name = "register-device"
    arch: Arch
    timeout_s: float = 5.0
    poll_interval_s: float = 1e-4

    def __init__(self) -> None:
        self._loaded: dict[int, _Loaded] = {}
        self.last_seconds: float | None = None
        #: Bytes copied from the host into device buffers: "code", "params" (each once per loaded program) and
        #: "regions" (what calls give: inputs, outputs, a caller's own parameter region).
        self.bytes_to_device: Counter[str] = Counter()
        # One core runs one program at a time: calls from several threads take turns.
        self._run_lock = threading.Lock()
        self._shared_free: dict[int, list[Any]] = {}
        self._shared_lock = threading.Lock()

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
        """(code buffer, reg_id -> region buffer) of `sg` on this device, loaded on first use: buffers allocated,
        code and parameters copied and flushed (once per program)."""
        entry = self._load(sg)
        return entry.code, entry.regions

    def _load(self, sg: CompiledSubgraph) -> _Loaded:
        entry = self._loaded.get(id(sg))
        if entry is not None and entry.sg is sg:
            return entry
        code_bytes = np.ascontiguousarray(sg.code, dtype="<u4").view(np.uint8)
        code = self._allocate(page_align(code_bytes.size), f"the code of {sg.name!r}")
        self._write(code, code_bytes, "code")
        regions = {}
        for rid, size in sorted(sg.region_sizes.items()):
            if not 0 <= int(rid) < NUM_REGIONS:
                raise DeviceError(f"subgraph {sg.name!r}: DDR region {rid} outside the 8 base-address registers")
            if rid != REG_SHARED:  # every call brings that one (a `shared_region`)
                regions[int(rid)] = self._allocate(page_align(size), f"DDR region {rid} of {sg.name!r}")
        entry = self._loaded[id(sg)] = _Loaded(sg, code, regions, params_resident=False)
        self._write_params(entry)
        return entry

    def _write_params(self, entry: _Loaded) -> None:
        """Put the program's parameters (back) into its parameter buffer, if it has one."""
        if REG_PARAMS in entry.regions:
            self._write(entry.regions[REG_PARAMS], np.asarray(entry.sg.params, dtype=np.uint8).reshape(-1),
                        "params")
        entry.params_resident = True

    def _write(self, buf: Any, data: np.ndarray, kind: str) -> None:
        """Copy `data` to the start of device buffer `buf`, zero the rest, flush; counted in `bytes_to_device`."""
        buf[: data.size] = data
        buf[data.size:] = 0
        buf.flush()
        self.bytes_to_device[kind] += int(data.size)

    def _allocate(self, nbytes: int, what: str) -> Any:
        try:
            return self.allocate(nbytes)
        except DeviceError:
            raise
        except (MemoryError, RuntimeError, OSError, ValueError) as e:
            raise DeviceError(f"cannot allocate {nbytes} bytes of contiguous memory for {what}: "
                              f"{type(e).__name__}: {e}") from None

    @contextmanager
    def shared_region(self, nbytes: int) -> Iterator[Any]:
        """A device buffer of at least `nbytes` that every core of this device addresses (they share its DDR),
        for one call's segments: taken from this device's pool of free ones (a new one allocated when all are in
        use), so calls in flight at once never share one; back in the pool after the block."""
        size = page_align(nbytes)
        with self._shared_lock:
            free = self._shared_free.get(size)
            buf = free.pop() if free else None
        if buf is None:
            buf = self._allocate(size, "a shared feature-map region")
        try:
            yield buf
        finally:
            with self._shared_lock:
                self._shared_free.setdefault(size, []).append(buf)

    def execute(self, sg: CompiledSubgraph, regions: dict[int, Any]) -> None:
        """Point the DPU at code and regions, start, wait (timeout); regions updated in place. A region given as a
        host array is copied in and back; one given as a device buffer (with `physical_address`, e.g. a
        `shared_region`) is used in place; the program's parameters and workspace, when not given, are the
        loaded program's. Serialised per device (thread-safe)."""
        with self._run_lock:
            self._execute(sg, regions)

    def _execute(self, sg: CompiledSubgraph, regions: dict[int, Any]) -> None:
        check_shared(sg, regions)
        entry = self._load(sg)
        if not self.is_idle():
            raise DeviceError(f"the DPU is busy before starting {sg.name!r} (status {self._status_text()}); "
                              "a previous run did not finish: reset the overlay")
        bases: dict[int, int] = {rid: int(buf.physical_address) for rid, buf in entry.regions.items()}
        copied = []
        for rid, src in regions.items():
            if not 0 <= int(rid) < NUM_REGIONS:
                raise DeviceError(f"subgraph {sg.name!r}: DDR region {rid} outside the 8 base-address registers")
            if hasattr(src, "physical_address"):
                bases[int(rid)] = int(src.physical_address)
                continue
            buf = entry.regions.get(int(rid))
            if buf is None:
                raise DeviceError(f"subgraph {sg.name!r} has no DDR region {rid} (its regions: "
                                  f"{sorted(sg.region_sizes)})")
            self._write(buf, np.asarray(src).reshape(-1), "regions")
            copied.append((rid, buf, src))
            if rid == REG_PARAMS:
                entry.params_resident = False
        if REG_PARAMS not in regions and not entry.params_resident:
            self._write_params(entry)
        for rid in range(NUM_REGIONS):
            self.set_base_address(rid, bases.get(rid, 0))
        self.set_instruction_address(int(entry.code.physical_address))
        t0 = time.monotonic()
        self.start()
        self.wait(sg.name, t0)
        self.last_seconds = time.monotonic() - t0
        self.acknowledge()
        for rid, buf, dst in copied:
            buf.invalidate()
            dst[...] = np.asarray(buf)[: dst.size]

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
        """Free every buffer this device allocated (loaded programs and free shared regions)."""
        bufs = [b for e in self._loaded.values() for b in [e.code, *e.regions.values()]]
        bufs += [b for free in self._shared_free.values() for b in free]
        for buf in bufs:
            try:
                self.free(buf)
            except Exception:  # freeing is best effort at shutdown
                pass
        self._loaded.clear()
        self._shared_free.clear()
