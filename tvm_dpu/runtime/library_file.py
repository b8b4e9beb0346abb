"""TVM's exported library (`ex.export_library("m.so")` of a module compiled with target "dpu") as a file the
tools read: `tvm-dpu inspect|report|run m.so` and `tvm_dpu.describe`.

Such a library holds every DPU partition's program (program_blob bytes, embedded by the BYOC codegen) beside the
CPU part. Reading it for `inspect` / `report` / `describe` scans the file's bytes for those programs
(program_blob.find_blobs: checksums and header schema verified); nothing is loaded or executed. The header the
tools print is put together from the programs (arch, per subgraph its symbol, tensors with fix_points,
instruction counts); what only a .tvmdpu artifact records (the partition report, model output names, the
verification XGraphs) is absent.

Running it loads native code, so the trust policy applies (tvm_dpu.trust): a library runs only when it carries a
valid signature by a trusted key (the trailer `tvm_dpu.signing.sign` appends; ELF loaders ignore
trailing bytes) or the caller
vouches for it (`trust="unsigned"`, `tvm-dpu run --allow-unsigned`). "Built by this user" does not apply: TVM's
export_library, not tvm-dpu, wrote the file. The bytes that were checked are the bytes loaded.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from tvm_dpu.errors import ArtifactError
from tvm_dpu.program_blob import Program, binding_json, find_blobs, find_plugin_blobs, plugin_summary
from tvm_dpu.toolchains import ELF_MACHINES, elf_machine
from tvm_dpu.types import InputSpec

ELF_MAGIC = b"\x7fELF"
#: The "format" of the header `library_header` puts together (an artifact's header has none).
LIBRARY_FORMAT = "TVM exported library"
#: The library's one "section" in the header the tools read (they print section sizes).
LIBRARY_SECTION = "library"


def is_library(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a shared library (an ELF file), e.g. TVM's export_library output."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == ELF_MAGIC
    except OSError:
        return False


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise ArtifactError(f"{path}: cannot read: {e.strerror}") from None


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


# ------------------------------------------------------------------------------------------------- running
_MATCH_SHAPE = re.compile(r"vm\.builtin\.match_shape in: %(\d+), %void, i(\d+), ((?:i\d+, )*)")


def _main_input_shapes(lib: Any) -> dict[int, tuple[int, ...]]:
    """Static shapes of main's parameters, read from the VM bytecode's match_shape checks (code 0 = a dimension
    asserted equal to an immediate); parameters with any other dimension are left out."""
    from tvm import relax

    text = relax.VMExecutable(lib).as_text()
    body = text.split("@main:", 1)[1].split("\n@", 1)[0] if "@main:" in text else ""
    shapes: dict[int, tuple[int, ...]] = {}
    for m in _MATCH_SHAPE.finditer(body):
        reg, ndim = int(m.group(1)), int(m.group(2))
        vals = [int(v) for v in re.findall(r"i(\d+)", m.group(3))]
        pairs = list(zip(vals[0::2], vals[1::2]))[:ndim]
        if len(pairs) == ndim and all(code == 0 for code, _ in pairs) and reg not in shapes:
            shapes[reg] = tuple(v for _, v in pairs)
    return shapes


def load_library(path: str | os.PathLike[str], device: Any = "emulator", trusted_keys: Any = None, *,
                 trust: str = "auto", **device_options: Any):
    """A runnable `CompiledModel` of an exported library, loaded under the trust policy (module docstring). Its
    inputs are named as main's parameters, with the shapes the bytecode checks; the DPU partitions run on
    `device` as for an artifact. Golden verification is not available (the library has no XGraphs)."""
    import tvm
    from tvm import relax

    from tvm_dpu.runtime.artifact import _device_for, _load_library
    from tvm_dpu.runtime.compiled_model import CompiledModel
    from tvm_dpu.runtime.device import arch_of
    from tvm_dpu.runtime.subgraph_runner import SubgraphRunner
    from tvm_dpu.trust import check_library_trust

    path = Path(path)
    data = check_library_trust(_read(path), str(path), trusted_keys, trust)
    progs = library_programs(data, str(path))
    a = _arch_of(progs, str(path))
    fp = int(a["fingerprint"], 16)
    arch = arch_of(a["name"], fp, str(path))
    cores = max((p.multicore.cores for p in progs.values() if p.multicore is not None), default=1)
    dev = _device_for(device, arch, fp, path, device_options, min(cores, arch.cores))
    runners = {s: SubgraphRunner(p.sg, dev, None, p.output_shapes, p.digest, p.multicore) for s, p in progs.items()}
    lib = _load_library(data)
    vm = relax.VirtualMachine(lib, tvm.cpu())
    n = int(vm.module["get_function_arity"]("main"))
    shapes = _main_input_shapes(lib)
    inputs = []
    for i in range(n):
        name = str(vm.module["get_function_param_name"]("main", i))
        if i not in shapes:
            raise ArtifactError(f"{path}: the shape of input {name!r} is not static in the library's bytecode; "
                                "run it through tvm.runtime.load_module and relax.VirtualMachine")
        inputs.append(InputSpec(name, shapes[i], "float32"))
    return CompiledModel(executable=lib, arch=arch, runners=runners, inputs=inputs,
                         subgraph_ids={s: i for i, s in enumerate(progs)}, device=dev,
                         build_info={"source": LIBRARY_FORMAT},
                         plugin_subgraphs=[plugin_summary(h) for h, _ in find_plugin_blobs(data, str(path))])




# ------------------------------------------------------------------------------------------------- describe
def _static_library_programs(module: Any, found: dict[str, Program]) -> None:
    """The DPU programs of the static libraries in `module`'s import tree (the DPU codegen's objects)."""
    import tempfile

    if module.kind == "static_library":
        with tempfile.TemporaryDirectory(prefix="tvm_dpu_") as tmp:
            obj = Path(tmp) / "partition.o"
            module.write_to_file(str(obj), "o")
            found.update(library_programs(obj.read_bytes(), "DPU partition object"))
    elif module.kind == "library" and not found:
        raise ArtifactError("a library loaded with tvm.runtime.load_module: its DPU programs are read from the file "
                            "it was loaded from, tvm_dpu.describe('m.so') (nothing is loaded to read them)")
    for child in module.imports:
        _static_library_programs(child, found)


def describe(obj: Any) -> list[dict]:
    """What every DPU partition of `obj` holds: one `program_blob.program_summary` per partition (symbol, arch and
    fingerprint, instruction counts by kind, code/param bytes, input and output tensors with shapes and
    fix_points). `obj`: a path to TVM's exported library (.so) or to a .tvmdpu artifact, the bytes of a library, or
    what `tvm.compile(..., target="dpu")` returned (or its runtime module). Files are read, never loaded."""
    from tvm_dpu.program_blob import program_summary

    if isinstance(obj, (str, os.PathLike)):
        from tvm_dpu.runtime.artifact import programs

        progs = programs(obj)
    elif isinstance(obj, (bytes, bytearray, memoryview)):
        progs = library_programs(bytes(obj), "library bytes")
    else:
        module = getattr(obj, "mod", obj)  # a relax.VMExecutable wraps its runtime module
        if not hasattr(module, "imports"):
            raise ArtifactError(f"tvm_dpu.describe: expected a path, library bytes or a TVM module, got "
                                f"{type(obj).__name__}")
        progs = {}
        _static_library_programs(module, progs)
    return [program_summary(p) for p in progs.values()]


__all__ = ["describe", "is_library", "library_code", "library_header", "library_programs", "load_library",
           "subgraph_fields"]
