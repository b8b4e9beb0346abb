"""The deployable artifact (.tvmdpu): one file wrapping TVM's exported library (the CPU part with every DPU
partition's program embedded by the BYOC codegen, exactly what `ex.export_library` writes) with the model's
metadata and the data golden verification needs.

A `container` (JSON header + checksummed raw sections) holding:

* ``lib.<machine>``: the exported shared library for each machine it was built for: the build machine always,
  and aarch64 Linux (the board) with ``export(..., cross="aarch64")``; the header's ``cpu_libs`` maps machine name
  -> section, and `load` picks the running machine's;
* per DPU subgraph ``sg<i>.xgraph``: the quantized XGraph in its own safe format (only `--verify` needs it);
* in the header: format version, arch name and fingerprint, model inputs and outputs, per subgraph its symbol
  and report id, the partition report and build options. Wall-clock timings are not stored (same inputs give
  the same bytes); they go to report.json.

Loading parses JSON and raw bytes only. The library is native code by nature: it is loaded (after its checksum
is verified) with TVM's module loader, exactly like any TVM deployment; nothing else in the file can execute.
The DPU programs inside it are read back (program_blob.find_blobs) for reports, inspect and verification.
This module reads the file; artifact_export.py writes it.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import tvm

from tvm_dpu.security import signing
from tvm_dpu.security.container import unpack
from tvm_dpu.errors import ArtifactError, DPUError
from tvm_dpu.security.program_blob import MAX_ELEMENTS, Program, find_blobs, find_plugin_blobs, plugin_summary
from tvm_dpu.security.safe_io import read_regular
# the writer's export, cross_compile and SUFFIX stay importable from here
from tvm_dpu.runtime.artifact_export import FORMAT_VERSION, MAGIC, SUFFIX, cross_compile, export  # noqa: F401
from tvm_dpu.runtime.compiled_model import CompiledModel
from tvm_dpu.runtime.library_file import (LIBRARY_FORMAT, check_tvm_library, is_library, library_code,
                                         library_header, library_programs, subgraph_fields)
from tvm_dpu.runtime.subgraph_runner import SubgraphRunner
from tvm_dpu.schema import SchemaError, need_dict, need_int, need_list, need_str
from tvm_dpu.util.toolchains import host_machine
from tvm_dpu.security.trust import check_library_trust, check_trust
from tvm_dpu.types import InputSpec, PartitionReport
from tvm_dpu.xgraph import serialize


def _device_for(device: Any, arch, fp: int, path: Path, options: dict, cores: int = 1) -> Any:
    """The device to run on; ArtifactError when its DPU fingerprint is not the artifact's. "emulator" with
    `cores` > 1 is a `CoreGroup` of that many emulated cores (for programs compiled with several cores)."""
    from tvm_dpu.runtime.device_kinds import check_options, device_kind

    if isinstance(device, str):
        kind = device_kind(device, f"device={device!r}", ArtifactError)
        check_options(kind, options, f"device={device!r}", ArtifactError)
        if not kind.own_arch:  # built for the artifact's arch: nothing to compare
            if cores > 1:
                from tvm_dpu.runtime.cores import core_group

                return core_group(arch, cores, device)
            return kind.make(arch)
        device = kind.make(None, **options)
    dev_arch = getattr(device, "arch", None)
    if dev_arch is None or not callable(getattr(device, "execute", None)):
        raise ArtifactError(f"device {device!r} is not a DPU device (needs .arch and .execute(sg, regions))")
    dev_fp = int(dev_arch.fingerprint)
    if dev_fp != fp:
        raise ArtifactError(f"{path}: built for DPU fingerprint {hex(fp)} ({arch.dpu_name}) but the device "
                            f"has {hex(dev_fp)} ({dev_arch.dpu_name}): recompile for the device's arch")
    return device


#: dtypes a model input or output may have (the DPU side quantizes float32).
IO_DTYPES = ("float32",)
_SECTION_NAME = re.compile(r"^(lib\.[a-z0-9_]+|sg[0-9]+\.xgraph)$")


def _check_header(h: dict) -> None:
    """Every header value against the format's schema (SchemaError naming the field)."""
    need_str(h.get("format"), "format")
    arch = need_dict(h.get("arch"), "arch")
    need_str(arch.get("name"), "arch.name")
    fp = need_str(arch.get("fingerprint"), "arch.fingerprint")
    if not re.fullmatch(r"0x[0-9a-f]{1,16}", fp):
        raise SchemaError(f"arch.fingerprint {fp!r:.40} is not a 64-bit hex number")
    for kind in ("inputs", "outputs"):
        for i, t in enumerate(need_list(h.get(kind), kind)):
            t = need_dict(t, f"{kind}[{i}]")
            need_str(t.get("name"), f"{kind}[{i}].name")
            dims = [need_int(d, f"{kind}[{i}].shape[{j}]", 0, MAX_ELEMENTS)
                    for j, d in enumerate(need_list(t.get("shape"), f"{kind}[{i}].shape"))]
            if int(np.prod(dims, dtype=np.float64)) > MAX_ELEMENTS:
                raise SchemaError(f"{kind}[{i}].shape {dims} is too large")
            if t.get("dtype") not in IO_DTYPES:
                raise SchemaError(f"{kind}[{i}].dtype {t.get('dtype')!r:.30} is not one of {IO_DTYPES}")
            if "fix_point" in t:
                need_int(t["fix_point"], f"{kind}[{i}].fix_point", -128, 127)
    if not h["inputs"]:
        raise SchemaError("the model has no inputs")
    sections = h["sections"]
    for name in sections:
        if not _SECTION_NAME.match(str(name)):
            raise SchemaError(f"unknown section {name!r:.60}")
    keys = set()
    for i, sg in enumerate(need_list(h.get("subgraphs"), "subgraphs")):
        sg = need_dict(sg, f"subgraphs[{i}]")
        key = need_str(sg.get("key"), f"subgraphs[{i}].key")
        if key != f"sg{i}":
            raise SchemaError(f"subgraphs[{i}].key {key!r:.30} is not 'sg{i}'")
        keys.add(key)
        need_str(sg.get("symbol"), f"subgraphs[{i}].symbol")
        need_str(sg.get("name"), f"subgraphs[{i}].name")
        if not re.fullmatch(r"[0-9a-f]{64}", need_str(sg.get("program_sha256"), f"subgraphs[{i}].program_sha256")):
            raise SchemaError(f"subgraphs[{i}].program_sha256 is not a sha256 hex digest")
        if sg.get("id") is not None:
            need_int(sg.get("id"), f"subgraphs[{i}].id", 0, 1 << 20)
    for name in sections:
        if name.endswith(".xgraph") and name.split(".")[0] not in keys:
            raise SchemaError(f"section {name!r} belongs to no subgraph")
    libs = need_dict(h.get("cpu_libs"), "cpu_libs")
    if not libs:
        raise SchemaError("cpu_libs is empty")
    for machine, sec in libs.items():
        if need_str(sec, f"cpu_libs[{machine!r}]") != f"lib.{machine}" or sec not in sections:
            raise SchemaError(f"cpu_libs[{machine!r:.30}] = {sec!r:.40} is not a library section of this file")
    part = h.get("partition")
    if part is not None:
        part = need_dict(part, "partition")
        need_str(part.get("arch"), "partition.arch")
        need_int(part.get("subgraphs"), "partition.subgraphs", 0, 1 << 20)
        for i, n in enumerate(need_list(part.get("nodes"), "partition.nodes")):
            n = need_dict(n, f"partition.nodes[{i}]")
            need_str(n.get("name"), f"partition.nodes[{i}].name")
            need_str(n.get("op"), f"partition.nodes[{i}].op")
            need_str(n.get("device"), f"partition.nodes[{i}].device")
            if n.get("subgraph") is not None:
                need_int(n.get("subgraph"), f"partition.nodes[{i}].subgraph", 0, 1 << 20)
            if n.get("reason") is not None:
                need_str(n.get("reason"), f"partition.nodes[{i}].reason")
            if n.get("note") is not None:
                need_str(n.get("note"), f"partition.nodes[{i}].note")
    graph = h.get("graph")
    if graph is not None:
        for i, n in enumerate(need_list(graph, "graph")):
            n = need_dict(n, f"graph[{i}]")
            need_str(n.get("name"), f"graph[{i}].name")
            need_str(n.get("op"), f"graph[{i}].op")
            for j, p in enumerate(need_list(n.get("inputs"), f"graph[{i}].inputs")):
                need_str(p, f"graph[{i}].inputs[{j}]")
    need_dict(h.get("build", {}), "build")
    for i, p in enumerate(need_list(h.get("plugin_subgraphs", []), "plugin_subgraphs")):
        p = need_dict(p, f"plugin_subgraphs[{i}]")
        for k in ("symbol", "plugin", "version", "device"):
            need_str(p.get(k), f"plugin_subgraphs[{i}].{k}")


def _open(path: Path, trusted_keys: Any = None, data: bytes | None = None, trust: str | None = None):
    """The verified container of an artifact: the signature (required, by one of `trusted_keys`, when they are
    given), checksums, then every header value. `data`: the file's bytes, already read by the caller (who checked
    them against a manifest); `path` then only names them in errors and the file is not read again. `trust`: set
    when the caller will load the native library: the trust policy (tvm_dpu.security.trust) then decides first."""
    if data is None:
        data = read_regular(path, "artifact")
    if trust is not None:
        data = check_trust(data, str(path), trusted_keys, trust)
    elif trusted_keys is not None:
        data = signing.verify(data, trusted_keys, str(path))
    else:
        data, _ = signing.split(data)
    c = unpack(data, MAGIC, FORMAT_VERSION, str(path), "tvm-dpu artifact", "tvm-dpu-artifact")
    try:
        _check_header(c.header)
    except SchemaError as e:
        raise ArtifactError(f"{path}: malformed artifact header: {e}") from None
    return c


#: Native libraries this process has loaded, by sha256 of their bytes. TVM's loader never unloads a shared library
#: (dlclose is not called when the module is freed), so loading the same artifact again must reuse its library:
#: otherwise every load keeps another copy mapped (about 0.7 MiB and 5 mappings for the bundled example).
_LIBRARIES: dict[bytes, Any] = {}
_LIBRARIES_LOCK = threading.Lock()


def _load_library(lib_bytes: bytes, source: str) -> Any:
    """TVM's runtime module of a (verified) library section, loaded once per distinct content per process. The
    module is immutable (the device a DPU call runs on comes from the calling model's context), so models loaded
    from equal bytes can share it. The bytes must be a TVM library with a VM executable (checked without loading
    them: check_tvm_library)."""
    key = hashlib.sha256(lib_bytes).digest()
    with _LIBRARIES_LOCK:
        lib = _LIBRARIES.get(key)
        if lib is None:
            check_tvm_library(lib_bytes, source)
            with tempfile.TemporaryDirectory() as tmp:
                lib_path = Path(tmp) / "model.so"
                lib_path.write_bytes(lib_bytes)
                lib = tvm.runtime.load_module(str(lib_path))
            _LIBRARIES[key] = lib
    return lib


def _library_section(c, path: Path, machine: str | None = None) -> tuple[str, bytes]:
    libs = c.header.get("cpu_libs")
    if not isinstance(libs, dict) or not libs:
        raise ArtifactError(f"{path}: malformed artifact header: no library table (cpu_libs)")
    machine = machine or host_machine()
    if machine not in libs:
        raise ArtifactError(f"{path}: no library for this machine ({machine}); the artifact has "
                            f"{sorted(libs)}: export it with cross={machine!r} or run it on one of those")
    return machine, c.section(str(libs[machine]))


def _programs_by_symbol(blobs: list[Program], header: dict, path: Path) -> dict[str, Program]:
    """The library's DPU programs by symbol: exactly one per subgraph the header lists, and no other, so the
    program that runs is the one `inspect` and the header describe (a second program for a symbol, or one the
    header does not list, is refused)."""
    found: dict[str, Program] = {}
    for p in blobs:
        if p.symbol in found:
            raise ArtifactError(f"{path}: the library holds two DPU programs for subgraph {p.symbol}: refusing an "
                                "ambiguous library (it was changed after export)")
        found[p.symbol] = p
    listed = {str(s.get("symbol")) for s in header.get("subgraphs") or [] if isinstance(s, dict)}
    extra = sorted(set(found) - listed)
    if extra:
        raise ArtifactError(f"{path}: the library holds DPU programs the header does not list ({extra[:4]}): "
                            "it was changed after export")
    return found


def programs(path: str | os.PathLike[str]) -> dict[str, Program]:
    """Symbol -> DPU program embedded in the artifact's library (the first library listed if this machine has
    none), or in TVM's exported library itself, without loading the library."""
    path = Path(path)
    if is_library(path):
        return library_programs(read_regular(path, "library"), str(path))
    return _programs_of(_open(path), path)


def _programs_of(c, path: Path) -> dict[str, Program]:
    libs = c.header.get("cpu_libs") or {}
    machine = host_machine() if host_machine() in libs else (sorted(libs)[0] if libs else None)
    name, lib = _library_section(c, path, machine)
    return _programs_by_symbol(find_blobs(lib, f"{path}:lib.{name}"), c.header, path)


def _check_plugins_installed(plugin_subgraphs: list[dict], path: Path) -> None:
    """Every plugin the library's subgraphs name is installed in the same version (ArtifactError otherwise): the
    artifact carries the plugins' data, the code that runs it comes from the installed plugin."""
    if not plugin_subgraphs:
        return
    # Custom-IP plugins sit above the runtime; only an artifact that uses one reaches for their registry.
    from tvm_dpu.plugins.registry import PluginError, get_plugin

    for s in plugin_subgraphs:
        try:
            installed = get_plugin(s["plugin"])
        except PluginError as e:
            raise ArtifactError(f"{path}: subgraph {s['symbol']} runs on plugin {s['plugin']!r} version "
                                f"{s['version']}, which is not installed here ({e})") from None
        if str(installed.version) != s["version"]:
            raise ArtifactError(f"{path}: subgraph {s['symbol']} was compiled by plugin {s['plugin']!r} version "
                                f"{s['version']}; version {installed.version} is installed: install that version "
                                "or recompile")


@contextlib.contextmanager
def _header_errors(path: Path) -> Iterator[None]:
    """A header that lacks a key or holds a value of the wrong kind, or names an unknown DPU, is one
    ArtifactError naming the file."""
    try:
        yield
    except ArtifactError:
        raise
    except DPUError as e:
        raise ArtifactError(f"{path}: {e}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ArtifactError(f"{path}: malformed artifact header: {type(e).__name__}: {e}") from None


def _runners(c: Any, h: dict, found: dict, dev: Any, fp: int, path: Path) -> tuple[dict, dict]:
    """A SubgraphRunner per subgraph the header lists, each with the library's program the header names
    (digest and fingerprint checked), and the subgraphs' ids."""
    runners, ids = {}, {}
    for s in h["subgraphs"]:
        symbol = str(s["symbol"])
        prog = found.get(symbol)
        if prog is None:
            raise ArtifactError(f"{path}: subgraph {symbol} is listed in the header but its library has no "
                                f"program for it (has {sorted(found)})")
        if prog.digest.hex() != s["program_sha256"]:
            raise ArtifactError(f"{path}: the DPU program of subgraph {symbol} in the library is not the one the "
                                "header names (program_sha256 differs): the library was changed")
        if prog.fingerprint != fp:
            raise ArtifactError(f"{path}: subgraph {symbol} was compiled for fingerprint {prog.fingerprint:#x}, "
                                f"the artifact says {fp:#x}")
        key = str(s["key"])
        graph = serialize.loads(c.section(key + ".xgraph"), f"{path}:{key}.xgraph") \
            if c.has(key + ".xgraph") else None
        runners[symbol] = SubgraphRunner(prog.sg, dev, graph, prog.output_shapes, prog.digest, prog.multicore)
        if s.get("id") is not None:
            ids[symbol] = int(s["id"])
    return runners, ids


def _io_specs(h: dict) -> tuple[list[InputSpec], list[InputSpec], dict[str, int]]:
    inputs = [InputSpec(str(i["name"]), tuple(int(x) for x in i["shape"]), str(i["dtype"])) for i in h["inputs"]]
    outputs = [InputSpec(str(i["name"]), tuple(int(x) for x in i["shape"]), str(i["dtype"]))
               for i in h.get("outputs") or []]
    io_fix_points = {str(i["name"]): int(i["fix_point"]) for i in [*h["inputs"], *(h.get("outputs") or [])]
                     if "fix_point" in i}
    return inputs, outputs, io_fix_points


def load(path: str | os.PathLike[str], device: Any = "emulator", trusted_keys: Any = None, *,
         data: bytes | None = None, trust: str = "auto", **device_options: Any) -> CompiledModel:
    """Load an artifact in this process and return a runnable `CompiledModel`.

    Its native library is loaded only under the trust policy (tvm_dpu.security.trust): signed by a trusted key (the
    `trusted_keys` given, else the user's trusted-keys file), or built by this user on this machine, or
    `trust="unsigned"` (the caller vouches for the file). Anything else is a SignatureError saying how to trust it.

    `data`: the artifact's bytes when the caller has already read (and checked) them: they are what is verified
    and loaded, and `path` is not read (it names the artifact in errors). Pipelines use this so that the bytes
    checked against pipeline.json are the bytes that run.

    `trusted_keys` (Ed25519 public keys: key files, raw 32 bytes or key objects): require a valid signature by one
    of them, checked before anything else in the file is used.

    `device`: "emulator" (default; several emulated cores, a `CoreGroup`, when the artifact was compiled with
    `cores` > 1), "pynq" (a `PynqDevice(**device_options)`, e.g. bitfile="dpu.bit") or a device object (e.g. a
    `tvm_dpu.runtime.cores.CoreGroup` or one core of `tvm_dpu.devices(arch)`). The device's DPU fingerprint must equal the artifact's (ArtifactError otherwise). Nothing in
    the file is executed except the library, which is loaded only after its checksum has been verified and the
    DPU programs inside it have been checked against the header.
    """
    from tvm_dpu.runtime.device import arch_of

    if data is None and is_library(path):  # TVM's export_library output (runtime/library_file.py)
        return load_library(path, device, trusted_keys, trust=trust, **device_options)
    path = Path(path)
    c = _open(path, trusted_keys, data, trust)
    h = c.header
    with _header_errors(path):
        fp = int(h["arch"]["fingerprint"], 16)
        arch = arch_of(str(h["arch"]["name"]), fp, "the artifact")
    machine, lib_bytes = _library_section(c, path)
    found = _programs_by_symbol(find_blobs(lib_bytes, f"{path}:lib.{machine}"), h, path)
    plugin_subgraphs = [plugin_summary(hd) for hd, _ in find_plugin_blobs(lib_bytes, f"{path}:lib.{machine}")]
    _check_plugins_installed(plugin_subgraphs, path)
    # Programs compiled for several cores run their segments on that many emulated cores unless told otherwise.
    cores = max((p.multicore.cores for p in found.values() if p.multicore is not None), default=1)
    dev = _device_for(device, arch, fp, path, device_options, min(cores, arch.cores))
    with _header_errors(path):
        runners, ids = _runners(c, h, found, dev, fp, path)
        inputs, outputs, io_fix_points = _io_specs(h)
        source_graph = h.get("graph")
        report = PartitionReport.from_json(h["partition"]) if h.get("partition") is not None else None
    lib = _load_library(lib_bytes, f"{path}: library section")
    return CompiledModel(executable=lib, arch=arch, runners=runners, inputs=inputs, partition_report=report,
                         subgraph_ids=ids, build_info=dict(h.get("build") or {}), outputs=outputs,
                         source_graph=source_graph, device=dev, plugin_subgraphs=plugin_subgraphs,
                         io_fix_points=io_fix_points)


def read_header(path: str | os.PathLike[str]) -> tuple[dict, dict[str, int]]:
    """(header, section name -> size in bytes) of an artifact, verified, without loading its library (for TVM's
    exported library, the header runtime/library_file.py puts together from the programs inside it).

    Each header subgraph is completed from its program inside the library (the one place that data lives):
    "inputs"/"outputs" (bindings with fix_points and DDR places), "region_sizes", "instr_counts", "op_ranges",
    "output_shapes", "code_bytes", "param_bytes", and "multicore" (None, or the cores and the segments' cores and
    predicted cycles of a program compiled for several cores)."""
    if is_library(path):  # TVM's export_library output: the header is put together from its programs
        return library_header(path)
    path = Path(path)
    c = _open(path)
    header = c.header
    sizes = {name: int(e["nbytes"]) for name, e in sorted(header["sections"].items())}
    progs = _programs_of(c, path)
    for s in header.get("subgraphs") or []:
        prog = progs.get(str(s.get("symbol")))
        if prog is None:
            raise ArtifactError(f"{path}: subgraph {s.get('symbol')} is listed in the header but its library has "
                                f"no program for it (has {sorted(progs)})")
        s.update(subgraph_fields(prog))
    return header, sizes


def read_code(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Subgraph key -> machine code (uint32 words) of an artifact (or of TVM's exported library), without loading
    its library."""
    if is_library(path):
        return library_code(path)
    path = Path(path)
    c = _open(path)
    progs = _programs_of(c, path)
    return {str(s["key"]): progs[str(s["symbol"])].sg.code for s in c.header["subgraphs"] if s["symbol"] in progs}


# ---------------------------------------------------------------------------------------------------------
# TVM's exported library (.so): loaded under the trust policy (runtime/library_file.py reads it)
# ---------------------------------------------------------------------------------------------------------
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
                 trust: str = "auto", **device_options: Any) -> CompiledModel:
    """A runnable `CompiledModel` of TVM's exported library (`ex.export_library("m.so")`), loaded under the trust
    policy for plain libraries (`trust.check_library_trust`: a trusted signature, or `trust="unsigned"`); the bytes
    checked are the bytes loaded. Its inputs are main's parameters with the shapes the VM bytecode checks; the DPU
    partitions run on `device` as for an artifact. Golden verification is not available (no XGraphs)."""
    from tvm import relax

    from tvm_dpu.runtime.device import arch_of

    path = Path(path)
    raw = read_regular(path, "library")
    data = check_library_trust(raw, str(path), trusted_keys, trust)
    header, _ = library_header(path, data)
    progs = library_programs(data, str(path))
    fp = int(header["arch"]["fingerprint"], 16)
    arch = arch_of(str(header["arch"]["name"]), fp, str(path))
    cores = max((p.multicore.cores for p in progs.values() if p.multicore is not None), default=1)
    dev = _device_for(device, arch, fp, path, device_options, min(cores, arch.cores))
    runners = {s: SubgraphRunner(p.sg, dev, None, p.output_shapes, p.digest, p.multicore) for s, p in progs.items()}
    lib = _load_library(data, str(path))
    vm = relax.VirtualMachine(lib, tvm.cpu())
    shapes = _main_input_shapes(lib)
    inputs = []
    for i in range(int(vm.module["get_function_arity"]("main"))):
        name = str(vm.module["get_function_param_name"]("main", i))
        if i not in shapes:
            raise ArtifactError(f"{path}: the shape of input {name!r} is not static in the library's bytecode; "
                                "run it through tvm.runtime.load_module and relax.VirtualMachine")
        inputs.append(InputSpec(name, shapes[i], "float32"))
    return CompiledModel(executable=lib, arch=arch, runners=runners, inputs=inputs,
                         subgraph_ids={s: i for i, s in enumerate(progs)}, device=dev,
                         build_info={"source": LIBRARY_FORMAT}, plugin_subgraphs=header["plugin_subgraphs"])
