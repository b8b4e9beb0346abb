"""Writing the deployable artifact (.tvmdpu) of a `CompiledModel`: `export` and the aarch64 cross build of its CPU
part. The format is described in runtime/artifact.py, which reads it back; the writer lives apart so that
`CompiledModel.export` and `artifact.load` (which builds a CompiledModel) do not import each other."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tvm
from tvm import relax

from tvm_dpu.security import signing
from tvm_dpu.security.container import pack
from tvm_dpu.security.container import write as write_container
from tvm_dpu.errors import ArtifactError, DPUError
from tvm_dpu.security.program_blob import find_plugin_blobs, plugin_summary
from tvm_dpu.util.toolchains import CROSS_TARGETS, ELF_MACHINES, elf_machine, host_machine
from tvm_dpu.security.trust import record_build
from tvm_dpu.xgraph import serialize

if TYPE_CHECKING:
    from tvm_dpu.runtime.compiled_model import CompiledModel
    from tvm_dpu.runtime.subgraph_runner import SubgraphRunner

MAGIC = b"TVMDPU\x00A"
FORMAT_VERSION = 2
SUFFIX = ".tvmdpu"


def _export_library(ex: Any, fcompile: Any = None) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        lib = Path(tmp) / "model.so"
        ex.export_library(str(lib), fcompile=fcompile) if fcompile is not None else ex.export_library(str(lib))
        return lib.read_bytes()


def cross_compile(model: CompiledModel, cross: str) -> bytes:
    """TVM's exported library of `model` built for `cross` (a key of CROSS_TARGETS): the CPU part and the DPU
    trampolines compiled for that machine (the pipeline "dpu_lowering" embeds the model's compiled programs)."""
    from tvm.support import cc as tvm_cc

    if cross not in CROSS_TARGETS:
        raise ArtifactError(f"cross={cross!r}: unknown cross target (known: {sorted(CROSS_TARGETS)})")
    machine, target, compiler = CROSS_TARGETS[cross]
    if model.relax_module is None:
        raise ArtifactError("cross-compiling needs the model's Relax module (CompiledModel.relax_module), which "
                            "this model does not carry; build it with tvm_dpu.build in this process")
    try:
        ex = tvm.compile(model.relax_module, target=tvm.target.Target(target), relax_pipeline="dpu_lowering")
        # The triple also governs the object that packs imported modules: without it TVM packs them for the
        # build machine and the link fails.
        data = _export_library(ex, tvm_cc.cross_compiler(compiler, get_target_triple=lambda: target["mtriple"]))
    except DPUError as e:
        raise ArtifactError(f"cross-compiling for {cross}: {e}") from None
    except RuntimeError as e:
        raise ArtifactError(f"cross-compiling the CPU part for {cross} failed: {' '.join(str(e).split())[:600]}"
                            ) from None
    if elf_machine(data) != ELF_MACHINES.get(machine):
        raise ArtifactError(f"cross-compiled library is not an {machine} ELF (e_machine {elf_machine(data)})")
    return data


def _without_timings(obj: Any) -> Any:
    """`obj` without wall-clock and process-time figures ("times_s", "cpu_times_s" and "t_*" keys): they differ
    between identical builds and belong in report.json, not in a file that must be byte-identical for the same
    inputs."""
    if isinstance(obj, dict):
        return {k: _without_timings(v) for k, v in obj.items() if k not in ("times_s", "cpu_times_s")
                and not str(k).startswith("t_")}
    if isinstance(obj, list):
        return [_without_timings(v) for v in obj]
    return obj


def _ordered(model: CompiledModel) -> list[tuple[str, SubgraphRunner]]:
    # Subgraph order (and so section names) follows the partition's subgraph ids: deterministic and readable.
    return sorted(model.runners.items(), key=lambda kv: (model.subgraph_ids.get(kv[0]) is None,
                                                         model.subgraph_ids.get(kv[0]) or 0, kv[0]))


def export(model: CompiledModel, path: str | os.PathLike[str], cross: str | None = None,
           verify_data: bool = True, sign: str | os.PathLike[str] | None = None) -> Path:
    """Write `model` to one file; returns the path. `cross="aarch64"` adds the library built for aarch64 Linux
    (the Zynq UltraScale+ boards) beside the build machine's, with the cross toolchain aarch64-linux-gnu-gcc
    (ArtifactError if absent). `verify_data=False` leaves out the quantized XGraphs that only golden-reference
    verification needs (they hold a second copy of the weights: about half the file). `sign` (an Ed25519 private
    key file) appends a signature over every byte (tvm_dpu.security.signing)."""
    path = Path(path)
    sections: dict[str, bytes] = {}
    cpu_libs = {}
    if cross is not None:  # first: its errors (no toolchain, ...) should not wait for the host export
        machine = CROSS_TARGETS.get(cross, (cross,))[0]
        sections[f"lib.{machine}"] = cross_compile(model, cross)
        cpu_libs[machine] = f"lib.{machine}"
    if not isinstance(model.executable, relax.VMExecutable):
        raise ArtifactError("this model's CPU part is a loaded library, not a compiled executable: a model loaded "
                            "from an artifact cannot be exported again (copy the .tvmdpu file instead)")
    host = host_machine()
    sections[f"lib.{host}"] = _export_library(model.executable)
    cpu_libs[host] = f"lib.{host}"
    subgraphs = []
    for i, (symbol, r) in enumerate(_ordered(model)):
        key = f"sg{i}"
        if r.graph is not None and verify_data:
            sections[f"{key}.xgraph"] = serialize.dumps(r.graph)
        subgraphs.append({"key": key, "symbol": symbol, "id": model.subgraph_ids.get(symbol), "name": r.sg.name,
                          "program_sha256": r.program_digest.hex()})
    build = _without_timings(model.build_info)
    plugin_subgraphs = [plugin_summary(h) for h, _ in find_plugin_blobs(sections[f"lib.{host}"], "library")]
    header = {
        "format": "tvm-dpu-artifact",
        "arch": {"name": model.arch.name, "fingerprint": hex(model.arch.fingerprint)},
        **model.io_json(),
        "graph": model.source_graph,
        "subgraphs": subgraphs,
        "partition": model.partition_report.to_json() if model.partition_report is not None else None,
        "build": build,
        "cpu_libs": cpu_libs,
        "plugin_subgraphs": plugin_subgraphs,
    }
    tmp_path = path.with_name(path.name + f".tmp{os.getpid()}")
    if sign is not None:
        tmp_path.write_bytes(signing.sign(pack(MAGIC, FORMAT_VERSION, header, sections), sign))
    else:  # streamed: the file is not assembled in memory beside its sections
        write_container(tmp_path, MAGIC, FORMAT_VERSION, header, sections)
    os.replace(tmp_path, path)
    record_build(path)
    return path

