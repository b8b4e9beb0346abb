"""The host side of every DPU partition: the function the BYOC trampolines call, and the choice of device.

Each DPU partition in a TVM module is a small native function (backend/ext_module.py) that calls the global
function `tvm_dpu.runtime.dispatch(symbol, blob_address, blob_size, *inputs, *outputs)`, registered when
`tvm_dpu` is imported. The program it runs is the one embedded in the calling module (its bytes at
`blob_address`): nothing is looked up by symbol in a process-wide table, so two models with the same partition
names keep their own code. Parsed programs are cached by (address, size, content digest) and hold no copy of the
module's memory beyond what parsing needs; the cache is bounded.

Device choice, innermost first: `with tvm_dpu.use_device(dev):` around the call (what `CompiledModel.run` does,
per thread), else the process default set by `tvm_dpu.set_device("emulator" | "pynq" | device)`, else an
emulator of the program's arch. The device's DPU fingerprint must equal the program's.
"""
from __future__ import annotations

import contextvars
import ctypes
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from tvm_dpu.security.container import FIXED_SIZE
from tvm_dpu.errors import DPUError
from tvm_dpu.security.program_blob import DISPATCH_FUNC, Program, digest_of, unpack_program
from tvm_dpu.runtime.subgraph_runner import execute_float

#: Parsed programs kept (each is small: its code and parameters are views of the calling module's memory).
PROGRAM_CACHE_ENTRIES = 64

#: Called after every DPU call inside `use_device(..., observer=f)`: f(symbol, program, int8 inputs, int8 outputs).
Observer = Callable[[str, Program, list, list], None]
#: Called after every DPU call inside `use_device(..., timer=f)`: f(symbol, start, end) (time.perf_counter()).
Timer = Callable[[str, float, float], None]


@dataclass(frozen=True)
class _Context:
    device: Any
    observer: Observer | None
    #: sha256 digests of the only programs this context may run (those a loaded artifact's header lists); None:
    #: any program of the calling module (a model built in this process).
    programs: frozenset[bytes] | None = None
    timer: Timer | None = None


_CONTEXT: contextvars.ContextVar[_Context | None] = contextvars.ContextVar("tvm_dpu_device", default=None)
_LOCK = threading.Lock()
_PROGRAMS: OrderedDict[tuple[str, int, int, bytes], Any] = OrderedDict()
_DEFAULT: dict[str, Any] = {"spec": "emulator", "options": {}, "device": None}
_BY_ARCH: dict[tuple[str, str, int], Any] = {}


def set_device(device: Any = "emulator", **options: Any) -> None:
    """Choose where DPU partitions of TVM modules run in this process when no `use_device` block says otherwise:
    "emulator" (default: the bit-exact instruction emulator of each program's arch), "pynq" (a `PynqDevice(**options)`,
    e.g. bitfile="dpu.bit"; created on first use) or a device object (with `.arch` and `.execute(sg, regions)`)."""
    if isinstance(device, str):
        from tvm_dpu.runtime.device_kinds import check_options, device_kind

        check_options(device_kind(device, f"device {device!r}"), options, f"device {device!r}")
    else:
        _check_device(device)
    with _LOCK:
        _DEFAULT.update(spec=device, options=dict(options), device=None if isinstance(device, str) else device)


def get_device() -> Any:
    """The device spec of this thread's context or the process default ("emulator", "pynq" or a device)."""
    ctx = _CONTEXT.get()
    return ctx.device if ctx is not None else _DEFAULT["spec"]


@contextmanager
def use_device(device: Any, observer: Observer | None = None,
               programs: frozenset[bytes] | None = None, timer: Timer | None = None) -> Iterator[None]:
    """Within the block (this thread / context only), DPU partitions run on `device`; `observer` sees every call;
    `programs` (sha256 digests), when given, are the only programs a call may run; `timer` gets each call's
    start and end."""
    _check_device(device)
    token = _CONTEXT.set(_Context(device, observer, programs, timer))
    try:
        yield
    finally:
        _CONTEXT.reset(token)


def _check_device(device: Any) -> None:
    if getattr(device, "arch", None) is None or not callable(getattr(device, "execute", None)):
        raise DPUError(f"device {device!r} is not a DPU device (needs .arch and .execute(sg, regions))")


def _device_for_program(kind: Any, program: Program) -> Any:
    """One device of `kind` (not `own_arch`) per program arch, shared by the calls of this process."""
    from tvm_dpu.runtime.device import arch_of

    key = (kind.name, program.sg.arch, program.fingerprint)
    with _LOCK:
        dev = _BY_ARCH.get(key)
        if dev is None:
            dev = _BY_ARCH[key] = kind.make(arch_of(program.sg.arch, program.fingerprint))
    return dev


def _default_device(program: Program) -> Any:
    from tvm_dpu.runtime.device_kinds import DEVICE_KINDS

    spec = _DEFAULT["spec"]
    if isinstance(spec, str) and not DEVICE_KINDS[spec].own_arch:
        return _device_for_program(DEVICE_KINDS[spec], program)
    with _LOCK:
        if _DEFAULT["device"] is None:  # a named kind with a DPU of its own, made on first use
            _DEFAULT["device"] = DEVICE_KINDS[spec].make(None, **_DEFAULT["options"])
        return _DEFAULT["device"]


def cached_blob(address: int, size: int, kind: str, what: str, parse: Callable[[bytes], Any]) -> Any:
    """`parse(bytes)` of the blob of `kind` a module embeds at `address`, cached by (kind, address, size, content
    digest): parsed and verified on first sight, later found from its 60-byte fixed header alone. One bounded cache
    serves every kind of embedded program (DPU subgraphs here, custom-IP plugin subgraphs in plugins/runtime.py)."""
    if size < FIXED_SIZE or address <= 0:
        raise DPUError(f"{what}: no program bytes (address {address:#x}, {size} bytes)")
    key = (kind, address, size, digest_of(ctypes.string_at(address, FIXED_SIZE)))
    with _LOCK:
        hit = _PROGRAMS.get(key)
        if hit is not None:
            _PROGRAMS.move_to_end(key)
            return hit
    parsed = parse(ctypes.string_at(address, size))
    with _LOCK:
        _PROGRAMS[key] = parsed
        while len(_PROGRAMS) > PROGRAM_CACHE_ENTRIES:
            _PROGRAMS.popitem(last=False)
    return parsed


def program_at(address: int, size: int, symbol: str) -> Program:
    """The parsed program whose blob lies at `address` (cached; verified on first sight)."""
    what = f"DPU partition {symbol}"
    return cached_blob(address, size, "dpu", what, lambda data: _in_place(unpack_program(data, what), address))


def _in_place(prog: Program, address: int) -> Program:
    """`prog` with its code and parameters as read-only views of the module's own bytes (verified just before):
    the cache then holds no copy of them, so dropping the module frees them."""
    for name, dtype in (("code", "<u4"), ("params", np.uint8)):
        off, n = prog.spans[name]
        view = np.frombuffer((ctypes.c_char * n).from_address(address + off), dtype=dtype) if n else \
            np.zeros(0, dtype=dtype)
        view.flags.writeable = False
        setattr(prog.sg, name, view)
    return prog


def dispatch(symbol: str, address: int, size: int, *args: Any) -> None:
    """Run one DPU partition call: float32 inputs, then the preallocated float32 outputs (destination passing)."""
    start = time.perf_counter()
    prog = program_at(int(address), int(size), str(symbol))
    n_in = len(prog.sg.inputs)
    if len(args) != n_in + len(prog.sg.outputs):
        raise DPUError(f"DPU partition {symbol}: called with {len(args)} tensors, the program takes {n_in} inputs "
                       f"and {len(prog.sg.outputs)} outputs")
    ctx = _CONTEXT.get()
    if ctx is not None and ctx.programs is not None and prog.digest not in ctx.programs:
        raise DPUError(f"DPU partition {symbol}: the model's library called a program (sha256 "
                       f"{prog.digest.hex()[:16]}...) that its artifact header does not list: refusing to run it "
                       "(the library was changed after export)")
    device = ctx.device if ctx is not None else _default_device(prog)
    dev_fp = int(device.arch.fingerprint)
    if dev_fp != prog.fingerprint:
        raise DPUError(f"DPU partition {symbol} was compiled for DPU fingerprint {prog.fingerprint:#x} "
                       f"({prog.sg.arch}) but the device has {dev_fp:#x} ({device.arch.name}): recompile for the "
                       "device's arch or choose another device")
    inputs = [np.from_dlpack(a) for a in args[:n_in]]
    qin, qout, outs = execute_float(prog.sg, device, inputs, prog.output_shapes, prog.multicore)
    for dst, val in zip(args[n_in:], outs):
        dst.copyfrom(np.ascontiguousarray(val, dtype=np.float32))
    if ctx is not None and ctx.timer is not None:
        ctx.timer(str(symbol), start, time.perf_counter())
    if ctx is not None and ctx.observer is not None:
        ctx.observer(str(symbol), prog, qin, qout)


_REGISTERED = False


def register_dispatcher() -> None:
    """Register `tvm_dpu.runtime.dispatch` (idempotent); `import tvm_dpu` does it."""
    global _REGISTERED
    if not _REGISTERED:
        import tvm_ffi

        tvm_ffi.register_global_func(DISPATCH_FUNC, dispatch, override=True)
        _REGISTERED = True
