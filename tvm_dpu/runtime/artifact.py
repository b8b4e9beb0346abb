"""The deployable artifact (.tvmdpu): one file with the CPU library and every compiled DPU subgraph.

A `container` (JSON header + checksummed raw sections) holding:

* ``cpu_lib``: the TVM LLVM library of the CPU part for the build machine (a shared object exported by TVM), and
  with ``export(..., cross="aarch64")`` also ``cpu_lib.aarch64``, the same CPU part compiled for aarch64 Linux
  (the board); the header's ``cpu_libs`` maps machine name -> section, and `load` picks the running machine's;
* per DPU subgraph ``sg<i>.code`` (uint32 LE machine words), ``sg<i>.params`` (the parameter region bytes) and
  ``sg<i>.xgraph`` (the quantized XGraph in its own safe format, for `--verify`);
* in the header: format version, arch name and fingerprint, model inputs, per subgraph its symbol, DDR region
  sizes, input/output bindings (DDR place, shape, fix_point), instruction counts, and the partition report.

Loading parses JSON and raw bytes only. The CPU library is native code by nature: it is loaded (after its checksum
is verified) with TVM's module loader, exactly like any TVM deployment; nothing else in the file can execute.
"""
from __future__ import annotations

import os
import platform
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm import relax

from tvm_dpu.arch import load_arch
from tvm_dpu.types import CompiledSubgraph, FMap, PartitionReport, TensorBinding
from tvm_dpu.container import pack, unpack
from tvm_dpu.errors import ArchError, ArtifactError
from tvm_dpu.runtime.compiled_model import CompiledModel, InputSpec
from tvm_dpu.runtime.subgraph_runner import SubgraphRunner
from tvm_dpu.xgraph import serialize

MAGIC = b"TVMDPU\x00A"
FORMAT_VERSION = 1
SUFFIX = ".tvmdpu"


def _binding_json(b: TensorBinding) -> dict:
    return {"name": b.name, "shape": list(b.shape), "fix_point": int(b.fix_point), "fmap": asdict(b.fmap)}


def _binding(d: dict) -> TensorBinding:
    return TensorBinding(d["name"], tuple(d["shape"]), int(d["fix_point"]), FMap(**d["fmap"]))


#: Cross targets of `export(cross=...)`: name -> (machine name as platform.machine() reports it, TVM target, cc).
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


def cross_compile_cpu(model: CompiledModel, cross: str) -> bytes:
    """The CPU part of `model` compiled and linked for `cross` (a key of CROSS_TARGETS)."""
    from tvm.support import cc as tvm_cc

    if cross not in CROSS_TARGETS:
        raise ArtifactError(f"cross={cross!r}: unknown cross target (known: {sorted(CROSS_TARGETS)})")
    machine, target, compiler = CROSS_TARGETS[cross]
    if shutil.which(compiler) is None:
        raise ArtifactError(f"cross={cross!r} needs the cross compiler {compiler!r} on PATH (Debian/Ubuntu: "
                            "apt-get install gcc-aarch64-linux-gnu)")
    if model.cpu_module is None:
        raise ArtifactError("cross-compiling needs the model's lowered Relax module (CompiledModel.cpu_module), "
                            "which this model does not carry; build it with tvm_dpu.build in this process")
    ex = tvm.compile(model.cpu_module, target=tvm.target.Target(target))
    with tempfile.TemporaryDirectory() as tmp:
        lib = Path(tmp) / f"cpu_{machine}.so"
        # The triple also governs the object that packs imported modules (constants): without it TVM packs them
        # for the build machine and the link fails.
        fcompile = tvm_cc.cross_compiler(compiler, get_target_triple=lambda: target["mtriple"])
        try:
            ex.export_library(str(lib), fcompile=fcompile)
        except RuntimeError as e:
            raise ArtifactError(f"cross-compiling the CPU part for {cross} failed: {' '.join(str(e).split())[:600]}"
                                ) from None
        data = lib.read_bytes()
    if elf_machine(data) != ELF_MACHINES.get(machine):
        raise ArtifactError(f"cross-compiled CPU library is not an {machine} ELF (e_machine {elf_machine(data)})")
    return data


def export(model: CompiledModel, path: str | os.PathLike[str], cross: str | None = None,
           verify_data: bool = True) -> Path:
    """Write `model` to one file; returns the path. `cross="aarch64"` adds the CPU library compiled for aarch64
    Linux (the Zynq UltraScale+ boards) beside the build machine's, with the cross toolchain
    aarch64-linux-gnu-gcc (ArtifactError if absent). `verify_data=False` leaves out the quantized XGraphs that
    only golden-reference verification needs (they hold a second copy of the weights: about half the file)."""
    path = Path(path)
    sections: dict[str, bytes] = {}
    cpu_libs = {}
    if cross is not None:  # first: its errors (no toolchain, ...) should not wait for the host export
        machine = CROSS_TARGETS.get(cross, (cross,))[0]
        sections[f"cpu_lib.{machine}"] = cross_compile_cpu(model, cross)
    if not isinstance(model.executable, relax.VMExecutable):
        raise ArtifactError("this model's CPU part is a loaded library, not a compiled executable: a model loaded "
                            "from an artifact cannot be exported again (copy the .tvmdpu file instead)")
    with tempfile.TemporaryDirectory() as tmp:
        lib = Path(tmp) / "cpu.so"
        model.executable.export_library(str(lib))
        sections["cpu_lib"] = lib.read_bytes()
    cpu_libs[host_machine()] = "cpu_lib"
    if cross is not None:
        cpu_libs[machine] = f"cpu_lib.{machine}"
    subgraphs = []
    # Subgraph order (and so section names) follows the partition's subgraph ids: deterministic and readable.
    order = sorted(model.runners.items(), key=lambda kv: (model.subgraph_ids.get(kv[0]) is None,
                                                          model.subgraph_ids.get(kv[0]) or 0, kv[0]))
    for i, (symbol, r) in enumerate(order):
        sg = r.sg
        key = f"sg{i}"
        sections[f"{key}.code"] = np.ascontiguousarray(sg.code, dtype="<u4").tobytes()
        sections[f"{key}.params"] = np.ascontiguousarray(sg.params, dtype=np.uint8).tobytes()
        if r.graph is not None and verify_data:
            sections[f"{key}.xgraph"] = serialize.dumps(r.graph)
        subgraphs.append({
            "key": key, "symbol": symbol, "id": model.subgraph_ids.get(symbol), "name": sg.name,
            "region_sizes": {str(k): int(v) for k, v in sg.region_sizes.items()},
            "inputs": [_binding_json(b) for b in sg.inputs], "outputs": [_binding_json(b) for b in sg.outputs],
            "output_shapes": [list(s) for s in r.output_shapes], "instr_counts": dict(sg.instr_counts),
            "op_ranges": [list(x) for x in sg.op_ranges],
        })
    header = {
        "format": "tvm-dpu-artifact",
        "arch": {"name": model.arch.name, "fingerprint": hex(model.arch.fingerprint)},
        "inputs": [{"name": s.name, "shape": list(s.shape), "dtype": s.dtype} for s in model.inputs],
        "outputs": [{"name": s.name, "shape": list(s.shape), "dtype": s.dtype} for s in model.output_specs()],
        "graph": model.source_graph,
        "subgraphs": subgraphs,
        "partition": model.partition_report.to_json() if model.partition_report is not None else None,
        "build": model.build_info,
        "cpu_libs": cpu_libs,
    }
    data = pack(MAGIC, FORMAT_VERSION, header, sections)
    tmp_path = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp_path.write_bytes(data)
    os.replace(tmp_path, path)
    return path


def _arch_of(name: str, fp: int):
    try:
        return load_arch(name)
    except ArchError:  # a core described only by its fingerprint
        from tvm_dpu.arch.arch import arch_from_fingerprint

        return arch_from_fingerprint(fp)


def _device_for(device: Any, arch, fp: int, path: Path, options: dict) -> Any:
    """The device to run on; ArtifactError when its DPU fingerprint is not the artifact's."""
    from tvm_dpu.runtime.device import EmulatorDevice

    if isinstance(device, str) and device not in ("emulator", "pynq"):
        raise ArtifactError(f"device={device!r}: expected 'emulator', 'pynq' or a device object")
    if device == "emulator":
        if options:
            raise ArtifactError(f"device='emulator' takes no options (got {sorted(options)})")
        return EmulatorDevice(arch)
    if device == "pynq":
        from tvm_dpu.runtime.pynq_driver import PynqDevice

        device = PynqDevice(**options)
    dev_arch = getattr(device, "arch", None)
    if dev_arch is None or not callable(getattr(device, "execute", None)):
        raise ArtifactError(f"device {device!r} is not a DPU device (needs .arch and .execute(sg, regions))")
    dev_fp = int(dev_arch.fingerprint)
    if dev_fp != fp:
        raise ArtifactError(f"{path}: built for DPU fingerprint {hex(fp)} ({arch.dpu_name}) but the device "
                            f"has {hex(dev_fp)} ({dev_arch.dpu_name}): recompile for the device's arch")
    return device


def load(path: str | os.PathLike[str], device: Any = "emulator", **device_options: Any) -> CompiledModel:
    """Load an artifact in this process and return a runnable `CompiledModel`.

    `device`: "emulator" (default), "pynq" (a `PynqDevice(**device_options)`, e.g. bitfile="dpu.bit") or a
    device object. The device's DPU fingerprint must equal the artifact's (ArtifactError otherwise). The DPU
    functions are registered before the Relax VM is created. Nothing in the file is executed except the CPU
    library, which is loaded only after its checksum has been verified.
    """
    from tvm_dpu.runtime.tvm_glue import register

    register()
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ArtifactError(f"{path}: cannot read: {e.strerror}") from None
    c = unpack(data, MAGIC, FORMAT_VERSION, str(path), "tvm-dpu artifact", "tvm-dpu-artifact")
    h = c.header
    try:
        fp = int(h["arch"]["fingerprint"], 16)
        arch = _arch_of(h["arch"]["name"], fp)
        if arch.fingerprint != fp:
            raise ArtifactError(f"{path}: arch {arch.name!r} has fingerprint {hex(arch.fingerprint)} here but the "
                                f"artifact says {hex(fp)}")
    except ArtifactError:
        raise
    except (KeyError, TypeError, ValueError) as e:
        raise ArtifactError(f"{path}: malformed artifact header: {type(e).__name__}: {e}") from None
    dev = _device_for(device, arch, fp, path, device_options)
    try:
        runners = {}
        ids = {}
        for s in h["subgraphs"]:
            code = np.frombuffer(c.section(s["key"] + ".code"), dtype="<u4").astype(np.uint32)
            params = np.frombuffer(c.section(s["key"] + ".params"), dtype=np.uint8).copy()
            graph = serialize.loads(c.section(s["key"] + ".xgraph"), f"{path}:{s['key']}.xgraph") \
                if c.has(s["key"] + ".xgraph") else None
            sg = CompiledSubgraph(
                name=s["name"], arch=arch.name, fingerprint=fp, code=code, params=params,
                region_sizes={int(k): int(v) for k, v in s["region_sizes"].items()},
                inputs=[_binding(b) for b in s["inputs"]], outputs=[_binding(b) for b in s["outputs"]],
                instr_counts={k: int(v) for k, v in s["instr_counts"].items()},
                op_ranges=[(str(a), int(b), int(e)) for a, b, e in s["op_ranges"]])
            runners[s["symbol"]] = SubgraphRunner(sg, dev, graph, [tuple(x) for x in s["output_shapes"]])
            if s.get("id") is not None:
                ids[s["symbol"]] = int(s["id"])
        inputs = [InputSpec(i["name"], tuple(i["shape"]), i["dtype"]) for i in h["inputs"]]
        outputs = [InputSpec(i["name"], tuple(i["shape"]), i["dtype"]) for i in h.get("outputs") or []]
        source_graph = h.get("graph")
        report = None
        if h.get("partition") is not None:
            report = PartitionReport.from_json(h["partition"])
    except ArtifactError:
        raise
    except (KeyError, TypeError, ValueError) as e:
        raise ArtifactError(f"{path}: malformed artifact header: {type(e).__name__}: {e}") from None
    libs = h.get("cpu_libs") or {host_machine(): "cpu_lib"}
    machine = host_machine()
    if machine not in libs:
        raise ArtifactError(f"{path}: no CPU library for this machine ({machine}); the artifact has "
                            f"{sorted(libs)}: export it with cross={machine!r} or run it on one of those")
    with tempfile.TemporaryDirectory() as tmp:
        lib_path = Path(tmp) / "cpu.so"
        lib_path.write_bytes(c.section(libs[machine]))
        lib = tvm.runtime.load_module(str(lib_path))
    model = CompiledModel(executable=lib, arch=arch, runners=runners, inputs=inputs, partition_report=report,
                          subgraph_ids=ids, build_info=dict(h.get("build") or {}), outputs=outputs,
                          source_graph=source_graph)
    model.register_functions()  # before any VM exists (the VM binds the DPU functions at construction)
    return model


def read_header(path: str | os.PathLike[str]) -> tuple[dict, dict[str, int]]:
    """(header, section name -> size in bytes) of an artifact, verified, without loading its CPU library."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ArtifactError(f"{path}: cannot read: {e.strerror}") from None
    c = unpack(data, MAGIC, FORMAT_VERSION, str(path), "tvm-dpu artifact", "tvm-dpu-artifact")
    sizes = {name: int(e["nbytes"]) for name, e in sorted(c.header["sections"].items())}
    return c.header, sizes


def read_code(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Subgraph key -> machine code (uint32 words) of an artifact, without loading its CPU library."""
    path = Path(path)
    c = unpack(path.read_bytes(), MAGIC, FORMAT_VERSION, str(path), "tvm-dpu artifact", "tvm-dpu-artifact")
    return {s["key"]: np.frombuffer(c.section(s["key"] + ".code"), dtype="<u4").astype(np.uint32)
            for s in c.header["subgraphs"]}
