"""The host side of plugin partitions: `tvm_dpu.plugins.dispatch(symbol, blob_address, blob_size, *tensors)`, which
the trampoline of every plugin partition in a TVM module calls. It reads the plugin subgraph embedded in the
calling module, finds the installed plugin of that name and version, and runs one of its runners:

* "sim" (the IP's emulator) by default, "run" (the board) when the DPU device is a Pynq board, or the mode set
  with `set_runner("ref" | "sim" | "run")` (process default) / `use_runner(mode)` (this thread, a block).
"""
from __future__ import annotations

import contextvars
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np

from tvm_dpu.plugins.api import PluginError, call_plugin, checked_outputs
from tvm_dpu.plugins.registry import get_plugin
from tvm_dpu.security.program_blob import PLUGIN_DISPATCH_FUNC, unpack_plugin_program
from tvm_dpu.runtime.dispatch import cached_blob

_MODES = ("ref", "sim", "run")
_DEFAULT = {"mode": None}
_MODE: contextvars.ContextVar[str | None] = contextvars.ContextVar("tvm_dpu_plugin_runner", default=None)


def set_runner(mode: str | None) -> None:
    """Process default runner of plugin subgraphs ("ref", "sim", "run"; None: automatic)."""
    if mode is not None and mode not in _MODES:
        raise PluginError(f"runner {mode!r}: choose one of {', '.join(_MODES)}")
    _DEFAULT["mode"] = mode


@contextmanager
def use_runner(mode: str) -> Iterator[None]:
    """Within the block (this thread), plugin subgraphs run with runner `mode`."""
    if mode not in _MODES:
        raise PluginError(f"runner {mode!r}: choose one of {', '.join(_MODES)}")
    token = _MODE.set(mode)
    try:
        yield
    finally:
        _MODE.reset(token)


def current_mode() -> str:
    mode = _MODE.get() or _DEFAULT["mode"]
    if mode is not None:
        return mode
    from tvm_dpu.runtime.device import RegisterDevice
    from tvm_dpu.runtime.dispatch import get_device

    device = get_device()
    return "run" if device == "pynq" or isinstance(device, RegisterDevice) else "sim"


def _program(symbol: str, address: int, size: int) -> tuple[dict, bytes]:
    what = f"plugin partition {symbol}"
    return cached_blob(address, size, "plugin", what, lambda data: unpack_plugin_program(data, what))


def dispatch(symbol: str, address: int, size: int, *args: Any) -> None:
    header, payload = _program(str(symbol), int(address), int(size))
    plugin = get_plugin(header["plugin"])
    if str(plugin.version) != header["version"]:
        raise PluginError(f"plugin partition {symbol} was compiled by plugin {header['plugin']!r} version "
                          f"{header['version']}, but version {plugin.version} is installed: recompile, or install "
                          "that version")
    n_in = len(header["input_shapes"])
    if len(args) != n_in + len(header["output_shapes"]):
        raise PluginError(f"plugin partition {symbol}: called with {len(args)} tensors, expected "
                          f"{n_in} inputs and {len(header['output_shapes'])} outputs")
    inputs = [np.array(np.from_dlpack(a), dtype=np.float32) for a in args[:n_in]]
    mode = current_mode()
    runner = call_plugin(plugin, f"runner {mode!r}", plugin.runner, mode)
    outs = call_plugin(plugin, f"runner {mode!r} of partition {symbol}", runner, payload, inputs)
    shapes = [tuple(int(d) for d in dst.shape) for dst in args[n_in:]]
    outs = checked_outputs(plugin, f"runner {mode!r} of partition {symbol}", outs, shapes)
    for dst, val in zip(args[n_in:], outs):
        dst.copyfrom(np.ascontiguousarray(val.reshape(tuple(dst.shape))))


_REGISTERED: list[bool] = []


def register_dispatcher() -> None:
    if not _REGISTERED:
        import tvm_ffi

        tvm_ffi.register_global_func(PLUGIN_DISPATCH_FUNC, dispatch, override=True)
        _REGISTERED.append(True)
