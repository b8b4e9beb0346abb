"""The device kinds a name selects ("emulator", "pynq"): the one table that `load(device=...)`, `set_device`,
`devices(arch, kind)` and the CLI's `--device` choices read, so a new kind of device is added here only.
The device classes are imported when a device is made, so that reading the names (the CLI's parser) stays cheap."""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Mapping

from tvm_dpu.errors import DPUError

if TYPE_CHECKING:
    from tvm_dpu.arch.arch import Arch
    from tvm_dpu.runtime.device import EmulatorDevice
    from tvm_dpu.runtime.pynq_driver import PynqDevice


@dataclass(frozen=True)
class DeviceKind:
    """A named kind of DPU device. `make(arch, core, **options)` builds one: `arch` is the DPU the programs were
    compiled for (None for a kind with `own_arch`, which reports the DPU it has), `core` a core index for a
    per-core device (None: the whole device)."""

    name: str
    takes_options: bool
    own_arch: bool  # the device is a DPU of its own (checked against the program's); else built for the program's
    make: Callable[..., Any]


def _emulator(arch: "Arch", core: int | None = None, **options: Any) -> "EmulatorDevice":
    from tvm_dpu.runtime.device import emulator_device

    # an emulator per core is independent: the core index changes nothing in it
    return emulator_device(arch)


def _pynq(arch: "Arch | None", core: int | None = None, **options: Any) -> "PynqDevice":
    from tvm_dpu.runtime.pynq_driver import PynqDevice

    # the whole board reads its arch from the DPU's fingerprint; one core's window is told both
    if core is None:
        return PynqDevice(**options)
    return PynqDevice(core=core, arch=arch, **options)


#: Device name -> its kind; the order is the CLI's and the error messages'.
DEVICE_KINDS: Mapping[str, DeviceKind] = MappingProxyType({k.name: k for k in (
    DeviceKind("emulator", takes_options=False, own_arch=False, make=_emulator),
    DeviceKind("pynq", takes_options=True, own_arch=True, make=_pynq),
)})


def device_choices(or_object: bool = False) -> str:
    """The names as an error message lists them: "'emulator' or 'pynq'", or with `or_object`
    "'emulator', 'pynq' or a device object"."""
    names = [repr(n) for n in DEVICE_KINDS]
    if or_object:
        return f"{', '.join(names)} or a device object"
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]


def device_kind(name: str, what: str, error: type[DPUError] = DPUError, or_object: bool = True) -> DeviceKind:
    """The kind called `name`; `error(what: expected ...)` if there is none."""
    kind = DEVICE_KINDS.get(name)
    if kind is None:
        raise error(f"{what}: expected {device_choices(or_object)}")
    return kind


def check_options(kind: DeviceKind, options: Mapping[str, Any], what: str, error: type[DPUError] = DPUError) -> None:
    """`error` when `options` are given to a kind that takes none."""
    if options and not kind.takes_options:
        raise error(f"{what}: device kind {kind.name!r} takes no options (got {sorted(options)})")
