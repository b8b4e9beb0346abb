"""The deployable artifact (.tvmdpu): one file with the CPU library and every compiled DPU subgraph.

A `container` (JSON header + checksummed raw sections) holding:

* ``cpu_lib``: the TVM LLVM library of the CPU part (a shared object exported by TVM);
* per DPU subgraph ``sg<i>.code`` (uint32 LE machine words), ``sg<i>.params`` (the parameter region bytes) and
  ``sg<i>.xgraph`` (the quantized XGraph in its own safe format, for `--verify`);
* in the header: format version, arch name and fingerprint, model inputs, per subgraph its symbol, DDR region
  sizes, input/output bindings (DDR place, shape, fix_point), instruction counts, and the partition report.

Loading parses JSON and raw bytes only. The CPU library is native code by nature: it is loaded (after its checksum
is verified) with TVM's module loader, exactly like any TVM deployment; nothing else in the file can execute.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import tvm

from tvm_dpu.arch import load_arch
from tvm_dpu.codegen.compiler import CompiledSubgraph, TensorBinding
from tvm_dpu.codegen.layout import FMap
from tvm_dpu.container import pack, unpack
from tvm_dpu.errors import ArtifactError
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


def export(model: CompiledModel, path: str | os.PathLike[str]) -> Path:
    """Write `model` to one file; returns the path."""
    path = Path(path)
    sections: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as tmp:
        lib = Path(tmp) / "cpu.so"
        model.executable.export_library(str(lib))
        sections["cpu_lib"] = lib.read_bytes()
    subgraphs = []
    for i, (symbol, r) in enumerate(sorted(model.runners.items())):
        sg = r.sg
        key = f"sg{i}"
        sections[f"{key}.code"] = np.ascontiguousarray(sg.code, dtype="<u4").tobytes()
        sections[f"{key}.params"] = np.ascontiguousarray(sg.params, dtype=np.uint8).tobytes()
        if r.graph is not None:
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
        "subgraphs": subgraphs,
        "partition": model.partition_report.to_json() if model.partition_report is not None else None,
        "build": model.build_info,
    }
    data = pack(MAGIC, FORMAT_VERSION, header, sections)
    tmp_path = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp_path.write_bytes(data)
    os.replace(tmp_path, path)
    return path


def load(path: str | os.PathLike[str], device: Any = "emulator") -> CompiledModel:
    """Load an artifact in this process; `device` is "emulator" (default) or a device object whose `arch` must
    carry the artifact's DPU fingerprint."""
    from tvm_dpu.runtime.device import EmulatorDevice
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
        arch = load_arch(h["arch"]["name"])
        if arch.fingerprint != fp:
            raise ArtifactError(f"{path}: arch {arch.name!r} has fingerprint {hex(arch.fingerprint)} here but the "
                                f"artifact says {hex(fp)}")
        if device == "emulator":
            dev = EmulatorDevice(arch)
        else:
            dev = device
            dev_fp = int(dev.arch.fingerprint)
            if dev_fp != fp:
                raise ArtifactError(f"{path}: built for DPU fingerprint {hex(fp)} ({arch.dpu_name}) but the device "
                                    f"has {hex(dev_fp)} ({dev.arch.dpu_name}): recompile for the device's arch")
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
        report = None
        if h.get("partition") is not None:
            from tvm_dpu.passes.report import PartitionReport

            report = PartitionReport.from_json(h["partition"])
    except ArtifactError:
        raise
    except (KeyError, TypeError, ValueError) as e:
        raise ArtifactError(f"{path}: malformed artifact header: {type(e).__name__}: {e}") from None
    with tempfile.TemporaryDirectory() as tmp:
        lib_path = Path(tmp) / "cpu.so"
        lib_path.write_bytes(c.section("cpu_lib"))
        lib = tvm.runtime.load_module(str(lib_path))
    model = CompiledModel(executable=lib, arch=arch, runners=runners, inputs=inputs, partition_report=report,
                          subgraph_ids=ids, build_info=dict(h.get("build") or {}))
    return model
