"""The cores of one DPU device as separate devices (virtual DPUs): one device object per core."""
from __future__ import annotations

from typing import Any

from tvm_dpu.arch import load_arch
from tvm_dpu.runtime.device import DeviceError, EmulatorDevice
from tvm_dpu.runtime.pynq_driver import PynqDevice


def devices(arch: Any, kind: str = "emulator", **options: Any) -> list:
    """One device per DPU core of `arch` (a board preset such as "zcu102" has 3): the virtual DPUs of one FPGA.
    `kind`: "emulator" (an independent emulator per core) or "pynq" (`PynqDevice(core=i, **options)`, each core
    through its own register window). Pin a model to a core by passing one of them as its device."""
    arch = load_arch(arch)
    if kind == "emulator":
        if options:
            raise DeviceError(f"emulator devices take no options (got {sorted(options)})")
        out = [EmulatorDevice(arch) for _ in range(arch.cores)]
    elif kind == "pynq":
        out = [PynqDevice(core=i, arch=arch, **options) for i in range(arch.cores)]
    else:
        raise DeviceError(f"kind {kind!r}: expected 'emulator' or 'pynq'")
    for i, dev in enumerate(out):
        dev.core = i
    return out
