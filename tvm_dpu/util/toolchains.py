"""Machines the CPU part can be built for, and the C compiler of each: shared by the BYOC codegen (which compiles
each DPU partition's trampoline for the target being built) and the artifact (which cross-compiles the CPU part
for the board). Data only; nothing here imports TVM."""
from __future__ import annotations

import os
import platform
import shutil

from tvm_dpu.errors import DPUError

#: Cross targets: name -> (machine name as platform.machine() reports it, TVM target, C compiler).
CROSS_TARGETS = {
    "aarch64": ("aarch64", {"kind": "llvm", "mtriple": "aarch64-linux-gnu"}, "aarch64-linux-gnu-gcc"),
}
_MACHINE_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}

#: ELF e_machine of each machine name (to label the host library and to check cross output).
ELF_MACHINES = {"x86_64": 62, "aarch64": 183}


def host_machine() -> str:
    m = platform.machine().lower()
    return _MACHINE_ALIASES.get(m, m)


def elf_machine(data: bytes) -> int | None:
    """e_machine of an ELF image (None if `data` is not ELF)."""
    if len(data) < 20 or data[:4] != b"\x7fELF":
        return None
    return int.from_bytes(data[18:20], "little" if data[5] == 1 else "big")


def machine_of_triple(mtriple: str | None) -> str:
    """Machine name of an LLVM target triple ("" or None: this machine)."""
    if not mtriple:
        return host_machine()
    arch = mtriple.split("-", 1)[0].lower()
    return _MACHINE_ALIASES.get(arch, arch)


def c_compiler(machine: str) -> str:
    """The C compiler that builds objects for `machine` (DPUError naming the package to install if absent)."""
    if machine == host_machine():
        cc = os.environ.get("CC") or "gcc"
        if shutil.which(cc) is None:
            raise DPUError(f"no C compiler {cc!r} on PATH: the DPU code is linked into TVM's module with it "
                           "(Debian/Ubuntu: apt-get install gcc)")
        return cc
    for m, _, cc in CROSS_TARGETS.values():
        if m == machine:
            if shutil.which(cc) is None:
                raise DPUError(f"building for {machine} needs the cross compiler {cc!r} on PATH (Debian/Ubuntu: "
                               f"apt-get install gcc-{cc.removesuffix('-gcc')})")
            return cc
    raise DPUError(f"no C compiler known for machine {machine!r} (known: {host_machine()}, "
                   f"{', '.join(sorted(m for m, _, _ in CROSS_TARGETS.values()))})")
