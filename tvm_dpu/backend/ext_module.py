"""`relax.ext.dpu`: the BYOC codegen that turns each DPU partition into a TVM runtime module carrying its code.

`RunCodegen` hands every function with Codegen="dpu" to `relax.ext.dpu`. By then the DPU compile pass
(backend/dpu_compile.py) has attached the partition's compiled program (program_blob bytes) as the function
attribute `tvm_dpu.program`. For each partition this codegen writes a small C object: the blob embedded with
`.incbin` under a local label, and the packed function `__tvm_ffi_<symbol>` the Relax VM calls. That function
calls the host dispatcher `tvm_dpu.runtime.dispatch` (registered when `tvm_dpu` is imported) with the symbol, the
blob's address and size, then the VM's arguments unchanged (inputs, then the preallocated outputs). The object is
returned as a static-library module, so `VirtualMachine(ex)` (which links it) and `ex.export_library` (which
links it into the .so) both carry the DPU code; a second model in the same process carries its own bytes under
local labels, so nothing clashes and nothing is looked up in a table another model could overwrite.

The object is compiled for the machine of the target being built (`Target.current()`'s mtriple, its host's when
it has one: `Target("dpu-kv260", host=aarch64)`), so a build for aarch64 (the board) embeds an aarch64 trampoline.
"""
from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import tvm
import tvm_ffi

from tvm_dpu.errors import DPUError
from tvm_dpu.security.program_blob import DISPATCH_FUNC
from tvm_dpu.util.toolchains import c_compiler, machine_of_triple

#: Function attribute holding a partition's compiled program (a uint8 tvm.runtime.Tensor of program_blob bytes).
PROGRAM_ATTR = "tvm_dpu.program"

_TRAMPOLINE = r"""/* tvm-dpu: DPU partition {symbol}: its program bytes and the packed function the Relax VM calls. */
#include <stdint.h>
#include <tvm/ffi/c_api.h>

__asm__(".section .rodata.tvm_dpu.{label},\"a\",@progbits\n"
        ".balign 64\n"
        ".local tvm_dpu_blob_{label}\n"
        "tvm_dpu_blob_{label}:\n"
        ".incbin \"{path}\"\n"
        ".local tvm_dpu_blob_end_{label}\n"
        "tvm_dpu_blob_end_{label}:\n"
        ".previous\n");
extern const unsigned char tvm_dpu_blob_{label}[] __attribute__((visibility("hidden")));
extern const unsigned char tvm_dpu_blob_end_{label}[] __attribute__((visibility("hidden")));

TVM_FFI_DLL_EXPORT int __tvm_ffi_{symbol}(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result) {{
  static const char kName[] = "{dispatch}";
  static const char kSymbol[] = "{symbol}";
  TVMFFIByteArray name = {{kName, sizeof(kName) - 1}};
  TVMFFIObjectHandle fn = 0;
  (void)self;
  if (TVMFFIFunctionGetGlobal(&name, &fn) != 0) return -1;
  if (fn == 0) {{
    TVMFFIErrorSetRaisedFromCStr("RuntimeError", "DPU partition {symbol} needs the tvm-dpu runtime: import tvm_dpu "
                                 "before running this module");
    return -1;
  }}
  TVMFFIAny call_args[num_args + 3];
  call_args[0].type_index = kTVMFFIRawStr;
  call_args[0].zero_padding = 0;
  call_args[0].v_c_str = kSymbol;
  call_args[1].type_index = kTVMFFIInt;
  call_args[1].zero_padding = 0;
  call_args[1].v_int64 = (int64_t)(intptr_t)tvm_dpu_blob_{label};
  call_args[2].type_index = kTVMFFIInt;
  call_args[2].zero_padding = 0;
  call_args[2].v_int64 = (int64_t)(tvm_dpu_blob_end_{label} - tvm_dpu_blob_{label});
  for (int32_t i = 0; i < num_args; ++i) call_args[i + 3] = args[i];
  TVMFFIAny ret;
  ret.type_index = kTVMFFINone;
  ret.zero_padding = 0;
  ret.v_int64 = 0;
  int rc = TVMFFIFunctionCall(fn, call_args, num_args + 3, &ret);
  TVMFFIObjectDecRef(fn);
  if (rc == 0 && ret.type_index >= kTVMFFIStaticObjectBegin) TVMFFIObjectDecRef(ret.v_obj);
  result->type_index = kTVMFFINone;
  result->zero_padding = 0;
  result->v_int64 = 0;
  return rc;
}}
"""

_SYMBOL_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _include_dir() -> str:
    return str(Path(tvm_ffi.__file__).resolve().parent / "include")


def write_trampoline_object(out: Path, symbol: str, blob: bytes | memoryview, machine: str,
                            dispatch: str = DISPATCH_FUNC) -> None:
    """Compile the C object (ELF) for one partition to the file `out`: `blob` embedded, `__tvm_ffi_<symbol>`
    defined, calling the host function `dispatch`. The compiler writes the file itself, so a large program is not
    read back into Python on its way to TVM."""
    if not _SYMBOL_RE.match(symbol):
        raise DPUError(f"DPU partition symbol {symbol!r} is not a C identifier")
    cc = c_compiler(machine)
    with tempfile.TemporaryDirectory(prefix="tvm_dpu_") as tmp:
        bin_path = Path(tmp) / "program.bin"
        bin_path.write_bytes(blob)
        # Fixed relative file names and a fixed local label: the object's bytes depend on the blob and the symbol
        # only (deterministic artifacts), and symbols of any length fit.
        (Path(tmp) / "partition.c").write_text(
            _TRAMPOLINE.format(symbol=symbol, label="program", path="program.bin", dispatch=dispatch))
        cmd = [cc, "-c", "-fPIC", "-O2", "-std=gnu11", "-I", _include_dir(), "partition.c", "-o",
               str(Path(out).resolve())]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
        if proc.returncode != 0:
            raise DPUError(f"compiling the DPU trampoline of {symbol} with {cc} failed: "
                           f"{' '.join(proc.stderr.split())[:800]}")


def _blob_of(fn, symbol: str) -> memoryview:
    attrs = fn.attrs or {}
    if PROGRAM_ATTR not in attrs:
        raise DPUError(f"DPU partition {symbol} has no compiled program: compile DPU partitions with "
                       "tvm.compile(mod, target='dpu') or relax_pipeline=relax.get_pipeline('dpu', arch=..., "
                       "calibration=...), which calibrates, quantizes and generates the DPU code before RunCodegen")
    # A view of the attribute's own memory (DLPack): the program (VGG-16: 140 MB of weights) is not copied twice
    # on its way into the object file.
    return memoryview(np.from_dlpack(attrs[PROGRAM_ATTR]).view(np.uint8).reshape(-1))


def describing_module(text: str, parts: list, symbols: list[str]) -> tvm.runtime.Module:
    """A C-source module whose source is `text` (a C comment; it compiles to nothing) importing the modules `parts`:
    what the codegen returns, so that `inspect_source()` says what the partitions hold while the static libraries
    below it carry the code (export_library and the VM link the whole import tree)."""
    body = text.replace("*/", "* /")
    code = f"/* tvm-dpu: the DPU partitions of this module\n\n{body}*/\ntypedef int tvm_dpu_partitions_t;\n"
    # it lists the partitions' symbols as its functions (TVM's linker asks the module it was handed; the code is in
    # the static libraries below, linked into the same library)
    module = tvm_ffi.get_global_func("runtime.CSourceModuleCreate")(code, "c", list(symbols), [])
    for part in parts:
        module.import_module(part)
    return module


def _describe_dpu_programs(blobs: list[tuple[str, memoryview]]) -> str:
    from tvm_dpu.security.program_blob import program_summary, summary_text, unpack_program

    return summary_text([program_summary(unpack_program(blob, f"DPU partition {symbol}")) for symbol, blob in blobs])


def embedding_codegen(dispatch: str, describe=None):
    """A BYOC codegen hook that embeds each partition's `tvm_dpu.program` bytes in a static-library module whose
    packed function calls the host function `dispatch` (the DPU's, or a custom-IP plugin's). With `describe`
    (symbol/blob pairs -> text), the static libraries are returned below one `describing_module`."""

    def codegen(functions, options, constant_names):
        target = tvm.target.Target.current(allow_none=True)
        if target is not None and target.host is not None:
            target = target.host  # the trampoline runs beside the VM: on the host (cross compilation)
        mtriple = None
        if target is not None:
            mtriple = str(target.attrs["mtriple"]) if "mtriple" in target.attrs else None
        machine = machine_of_triple(mtriple)
        modules, blobs = [], []
        with tempfile.TemporaryDirectory(prefix="tvm_dpu_") as tmp:
            for i, fn in enumerate(functions):
                symbol = str(fn.attrs["global_symbol"])
                obj = Path(tmp) / f"partition{i}.o"
                blob = _blob_of(fn, symbol)
                write_trampoline_object(obj, symbol, blob, machine, dispatch)
                blobs.append((symbol, blob))
                # load_static_library keeps the object's bytes: the file can go with the directory.
                modules.append(tvm.runtime.load_static_library(str(obj), [symbol]))
        if describe is None or not modules:
            return modules
        return [describing_module(describe(blobs), modules, [sym for sym, _ in blobs])]

    return codegen


#: The `relax.ext.dpu` hook: one static-library runtime module per DPU partition function, below a C-source module
#: whose `inspect_source()` lists every partition's symbol, arch, instruction counts and tensor fix_points.
dpu_codegen = embedding_codegen(DISPATCH_FUNC, _describe_dpu_programs)


def register_codegen() -> None:
    tvm_ffi.register_global_func("relax.ext.dpu", dpu_codegen, override=True)


#: TVM's own "default" pipeline factory, saved before backend.relax_pipeline.register() wraps it.
TVM_DEFAULT_PIPELINE: dict = {"factory": None}


def cpu_lowering() -> tvm.transform.Pass:
    """TVM's own default Relax pipeline (what tvm.compile runs for a CPU target)."""
    from tvm import relax

    factory = TVM_DEFAULT_PIPELINE["factory"] or relax.pipeline.PIPELINE_MAP["default"]
    return factory()
