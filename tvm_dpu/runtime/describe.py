"""`tvm_dpu.describe`: what every DPU partition of a compiled model holds, read without loading anything."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from tvm_dpu.errors import ArtifactError
from tvm_dpu.security.program_blob import Program, program_summary
from tvm_dpu.runtime.artifact import programs
from tvm_dpu.runtime.library_file import library_programs


def _static_library_programs(module: Any, found: dict[str, Program]) -> None:
    """The DPU programs of the static libraries in `module`'s import tree (the DPU codegen's objects)."""
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
    if isinstance(obj, (str, os.PathLike)):
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


__all__ = ["describe"]
