"""TVM's exported library (`ex.export_library("m.so")` of a module compiled with target "dpu") as a file the
tools read: `tvm-dpu inspect|report|run m.so` and `tvm_dpu.describe` (runtime/describe.py). Reading only: the
trusted load of such a library is `artifact.load_library`.

Such a library holds every DPU partition's program (program_blob bytes, embedded by the BYOC codegen) beside the
CPU part. Reading it for `inspect` / `report` / `describe` scans the file's bytes for those programs
(program_blob.find_blobs: checksums and header schema verified); nothing is loaded or executed. The header the
tools print is put together from the programs (arch, per subgraph its symbol, tensors with fix_points,
instruction counts); what only a .tvmdpu artifact records (the partition report, model output names, the
verification XGraphs) is absent.

Running it loads native code, so the trust policy applies (tvm_dpu.security.trust): a library runs only when it
carries a valid signature by a trusted key (the trailer `tvm_dpu.security.signing.sign` appends; ELF loaders ignore
trailing bytes) or the caller vouches for it (`trust="unsigned"`, `tvm-dpu run --allow-unsigned`). "Built by this user" does not apply: TVM's
export_library, not tvm-dpu, wrote the file. The bytes that were checked are the bytes loaded.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tvm_dpu.errors import ArtifactError
from tvm_dpu.security.program_blob import Program, binding_json, find_blobs, find_plugin_blobs, plugin_summary
from tvm_dpu.security.safe_io import read_regular
from tvm_dpu.util.toolchains import ELF_MACHINES, elf_machine

ELF_MAGIC = b"\x7fELF"
#: The "format" of the header `library_header` puts together (an artifact's header has none).
LIBRARY_FORMAT = "TVM exported library"
#: The library's one "section" in the header the tools read (they print section sizes).
LIBRARY_SECTION = "library"


def is_library(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a shared library (an ELF file), e.g. TVM's export_library output."""
    import stat

    try:  # non-blocking and regular files only: a FIFO must not stall the check (the read refuses it clearly)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.read(fd, 4) == ELF_MAGIC
    finally:
        os.close(fd)


#: The symbol through which TVM's loader finds the modules a library carries (tvm-ffi's library_module), and the
#: module kind that holds the Relax VM's executable (what `vm_load_executable` comes from).
LIBRARY_BIN_SYMBOL = b"__tvm_ffi__library_bin"
VM_EXECUTABLE_KIND = b"relax.VMExecutable"


def _elf_symbol_bytes(data: bytes, name: bytes) -> bytes | None:
    """The bytes of the defined dynamic symbol `name` of the ELF shared object `data` (None if it has none),
    read from the section headers and .dynsym alone: nothing in the file is run. ValueError if the ELF
    structures point outside the file."""
    import struct

    if data[:4] != ELF_MAGIC or len(data) < 64 or data[4] not in (1, 2) or data[5] not in (1, 2):
        raise ValueError("not an ELF file")
    is64, end = data[4] == 2, "<" if data[5] == 1 else ">"
    e_type = struct.unpack_from(end + "H", data, 16)[0]
    if e_type != 3:
        raise ValueError(f"ELF type {e_type}, not a shared object (ET_DYN)")
    shoff, shentsize, shnum = (struct.unpack_from(end + "Q", data, 40)[0], *struct.unpack_from(end + "HH", data, 58)) \
        if is64 else (struct.unpack_from(end + "I", data, 32)[0], *struct.unpack_from(end + "HH", data, 46))
    sh_fmt = end + ("IIQQQQIIQQ" if is64 else "IIIIIIIIII")
    if shentsize < struct.calcsize(sh_fmt) or shoff + shnum * shentsize > len(data):
        raise ValueError("section headers outside the file")
    sections = [struct.unpack_from(sh_fmt, data, shoff + i * shentsize) for i in range(shnum)]
    # (name, type, flags, addr, offset, size, link, info, addralign, entsize)
    sym_fmt = end + ("IBBHQQ" if is64 else "IIIBBH")
    for sh in sections:
        if sh[1] != 11 or sh[6] >= shnum:  # SHT_DYNSYM, and its string table
            continue
        strtab = sections[sh[6]]
        if sh[4] + sh[5] > len(data) or strtab[4] + strtab[5] > len(data):
            raise ValueError(".dynsym or its strings outside the file")
        strings = data[strtab[4]:strtab[4] + strtab[5]]
        size = struct.calcsize(sym_fmt)
        for off in range(sh[4], sh[4] + sh[5] - size + 1, size):
            if is64:
                st_name, _, _, shndx, value, st_size = struct.unpack_from(sym_fmt, data, off)
            else:
                st_name, value, st_size, _, _, shndx = struct.unpack_from(sym_fmt, data, off)
            if strings[st_name:st_name + len(name) + 1] != name + b"\0" or not 0 < shndx < shnum:
                continue
            home = sections[shndx]
            start = home[4] + value - home[3]
            if home[1] == 8 or start < 0 or start + st_size > len(data):  # SHT_NOBITS: no bytes in the file
                raise ValueError(f"symbol {name.decode()} lies outside the file")
            return data[start:start + st_size]
    return None


def check_tvm_library(data: bytes, source: str) -> None:
    """ArtifactError unless `data` is a shared library TVM's runtime can run as a Relax VM executable: an ELF
    shared object exporting the module blob (LIBRARY_BIN_SYMBOL) that holds a relax.VMExecutable. Read from the
    bytes only, before the library is loaded, so a replaced library is refused without running any of its code
    (its constructors included), also under trust="unsigned"."""
    try:
        blob = _elf_symbol_bytes(data, LIBRARY_BIN_SYMBOL)
    except (ValueError, IndexError) as e:  # struct.error is a ValueError
        raise ArtifactError(f"{source}: not a TVM library ({e}); it was not loaded") from None
    if blob is None:
        raise ArtifactError(f"{source}: not a TVM library: it exports no {LIBRARY_BIN_SYMBOL.decode()} (the modules "
                            "TVM's export_library embeds); it was not loaded")
    if VM_EXECUTABLE_KIND not in blob:
        raise ArtifactError(f"{source}: a TVM library without a Relax VM executable (no {VM_EXECUTABLE_KIND.decode()} "
                            "module, so no vm_load_executable); it was not loaded")


def _read(path: Path) -> bytes:
    return read_regular(path, "library")


def library_programs(data: bytes, source: str) -> dict[str, Program]:
    """Symbol -> DPU program of every partition embedded in the library bytes `data` (no two for one symbol)."""
    found: dict[str, Program] = {}
    for p in find_blobs(data, source):
        if p.symbol in found:
            raise ArtifactError(f"{source}: two DPU programs for partition {p.symbol}: refusing an ambiguous library")
        found[p.symbol] = p
    if not found and not find_plugin_blobs(data, source):
        raise ArtifactError(f"{source}: a shared library with no tvm-dpu DPU program in it (not compiled with "
                            "target 'dpu', or not a TVM library)")
    return found


def _machine_name(data: bytes) -> str:
    em = elf_machine(data)
    return next((m for m, e in ELF_MACHINES.items() if e == em), f"EM_{em}")


def subgraph_fields(prog: Program) -> dict:
    """What a program says about its subgraph, in the form of an artifact header's subgraph entry (`read_header`):
    tensors with fix_points and DDR places, DDR region sizes, instruction counts, op ranges, sizes, multicore."""
    sg = prog.sg
    return {"inputs": [binding_json(b) for b in sg.inputs], "outputs": [binding_json(b) for b in sg.outputs],
            "region_sizes": {str(k): int(v) for k, v in sorted(sg.region_sizes.items())},
            "instr_counts": dict(sg.instr_counts), "op_ranges": [list(x) for x in sg.op_ranges],
            "output_shapes": [list(x) for x in prog.output_shapes],
            "code_bytes": int(sg.code.nbytes), "param_bytes": int(sg.params.nbytes),
            "multicore": None if prog.multicore is None else {
                "cores": prog.multicore.cores, "segments": len(prog.multicore.segments),
                "cycles_cores_1": prog.multicore.single_cycles, "cycles": prog.multicore.cycles,
                "segment_cores": [g.core for g in prog.multicore.segments]}}


def _arch_of(progs: dict[str, Program], source: str) -> dict:
    archs = {(p.sg.arch, p.fingerprint) for p in progs.values()}
    if len(archs) > 1:
        raise ArtifactError(f"{source}: DPU programs for different DPUs in one library: {sorted(archs)}")
    if not archs:
        return {"name": "?", "fingerprint": "0x0"}
    name, fp = archs.pop()
    return {"name": name, "fingerprint": f"{fp:#x}"}


def library_header(path: str | os.PathLike[str], data: bytes | None = None) -> tuple[dict, dict[str, int]]:
    """(header, section sizes) of an exported library in the form `artifact.read_header` returns, put together
    from the programs inside it (subgraphs in file order; ids 0..S-1). Nothing is loaded."""
    path = Path(path)
    data = _read(path) if data is None else data
    progs = library_programs(data, str(path))
    subgraphs = []
    for i, (symbol, prog) in enumerate(progs.items()):
        subgraphs.append({"key": f"sg{i}", "id": i, "symbol": symbol, "name": prog.sg.name,
                          "program_sha256": prog.digest.hex(),
                          **subgraph_fields(prog)})
    header = {"format": LIBRARY_FORMAT, "arch": _arch_of(progs, str(path)), "inputs": [], "outputs": [],
              "subgraphs": subgraphs, "cpu_libs": {_machine_name(data): LIBRARY_SECTION},
              "plugin_subgraphs": [plugin_summary(h) for h, _ in find_plugin_blobs(data, str(path))],
              "partition": None, "build": {}, "sections": {LIBRARY_SECTION: {"nbytes": len(data)}}}
    return header, {LIBRARY_SECTION: len(data)}


def library_code(path: str | os.PathLike[str]) -> dict:
    """Subgraph key -> machine code of an exported library (keys as `library_header` gives them)."""
    path = Path(path)
    progs = library_programs(_read(path), str(path))
    return {f"sg{i}": p.sg.code for i, p in enumerate(progs.values())}


__all__ = ["LIBRARY_FORMAT", "is_library", "library_code", "library_header", "library_programs",
           "subgraph_fields"]
