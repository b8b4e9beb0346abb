"""The bytes of one compiled DPU subgraph, as the BYOC codegen embeds them in TVM's module and the runtime reads
them back: a `container` (JSON header + checksummed sections) holding the machine code, the parameter region and
everything the host needs to run it (DDR region sizes, input/output bindings with fix_points, arch fingerprint).

This is the single definition of that format: `relax.ext.dpu` writes it (passes/ext_module.py), the runtime
dispatcher reads it at the address the module's trampoline hands over (runtime/dispatch.py), and the artifact
tools find it inside an exported library (`find_blobs`). Reading parses JSON and raw bytes only.
"""
from __future__ import annotations

import struct
from dataclasses import asdict, dataclass

import numpy as np

from tvm_dpu.codegen.compiler import CompiledSubgraph, TensorBinding
from tvm_dpu.codegen.layout import FMap
from tvm_dpu.container import FIXED_SIZE, pack, unpack
from tvm_dpu.errors import ArtifactError

MAGIC = b"TVMDPUSG"
FORMAT_VERSION = 1
FORMAT_TAG = "tvm-dpu-subgraph"
#: The host function every partition's trampoline calls with (symbol, blob address, blob size, *tensors);
#: runtime/dispatch.py registers it.
DISPATCH_FUNC = "tvm_dpu.runtime.dispatch"

_FIXED = struct.Struct("<8sIQQ32s")  # the container's fixed header (container.py), read without copying the blob


@dataclass
class Program:
    """A parsed subgraph blob: what the dispatcher executes."""

    symbol: str
    sg: CompiledSubgraph
    output_shapes: list[tuple[int, ...]]
    digest: bytes  # the container's sha256: identifies the content
    #: Where the code and parameter bytes lie in the blob: {"code": (offset, nbytes), "params": (...)}.
    spans: dict[str, tuple[int, int]]

    @property
    def fingerprint(self) -> int:
        return self.sg.fingerprint


def binding_json(b: TensorBinding) -> dict:
    return {"name": b.name, "shape": list(b.shape), "fix_point": int(b.fix_point), "fmap": asdict(b.fmap)}


def binding_from_json(d: dict) -> TensorBinding:
    return TensorBinding(d["name"], tuple(int(x) for x in d["shape"]), int(d["fix_point"]), FMap(**d["fmap"]))


def pack_program(symbol: str, sg: CompiledSubgraph, output_shapes: list[tuple[int, ...]]) -> bytes:
    """Bytes of one compiled subgraph (deterministic: equal inputs give identical bytes)."""
    header = {
        "format": FORMAT_TAG, "symbol": symbol, "name": sg.name, "arch": sg.arch, "fingerprint": hex(sg.fingerprint),
        "region_sizes": {str(k): int(v) for k, v in sorted(sg.region_sizes.items())},
        "inputs": [binding_json(b) for b in sg.inputs], "outputs": [binding_json(b) for b in sg.outputs],
        "output_shapes": [[int(x) for x in s] for s in output_shapes],
        "instr_counts": {k: int(v) for k, v in sorted(sg.instr_counts.items())},
        "op_ranges": [[str(a), int(b), int(e)] for a, b, e in sg.op_ranges],
    }
    sections = {"code": np.ascontiguousarray(sg.code, dtype="<u4").tobytes(),
                "params": np.ascontiguousarray(sg.params, dtype=np.uint8).tobytes()}
    return pack(MAGIC, FORMAT_VERSION, header, sections)


def digest_of(prefix: bytes) -> bytes:
    """The content digest stored in a blob's fixed header (its first `FIXED_SIZE` bytes)."""
    return _FIXED.unpack_from(prefix, 0)[4]


def unpack_program(data: bytes, source: str) -> Program:
    """Parse and verify a blob (ArtifactError naming `source` on any defect)."""
    c = unpack(data, MAGIC, FORMAT_VERSION, source, "DPU subgraph", FORMAT_TAG)
    h = c.header
    try:
        sg = CompiledSubgraph(
            name=str(h["name"]), arch=str(h["arch"]), fingerprint=int(h["fingerprint"], 16),
            code=np.frombuffer(c.section("code"), dtype="<u4").astype(np.uint32),
            params=np.frombuffer(c.section("params"), dtype=np.uint8).copy(),
            region_sizes={int(k): int(v) for k, v in h["region_sizes"].items()},
            inputs=[binding_from_json(b) for b in h["inputs"]], outputs=[binding_from_json(b) for b in h["outputs"]],
            instr_counts={str(k): int(v) for k, v in h["instr_counts"].items()},
            op_ranges=[(str(a), int(b), int(e)) for a, b, e in h["op_ranges"]])
        shapes = [tuple(int(x) for x in s) for s in h["output_shapes"]]
        symbol = str(h["symbol"])
    except ArtifactError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ArtifactError(f"{source}: malformed DPU subgraph header: {type(e).__name__}: {e}") from None
    spans = {name: (c.area_offset(name), len(c.section(name))) for name in ("code", "params")}
    return Program(symbol, sg, shapes, digest_of(data), spans)


def find_blobs(data: bytes, source: str) -> list[Program]:
    """Every subgraph blob embedded in `data` (an exported shared library), in file order. A magic match whose
    framing does not hold (a coincidence in machine code) is skipped; a blob that frames but fails its checksum
    or header checks is an ArtifactError naming its offset."""
    out = []
    pos = data.find(MAGIC)
    while pos >= 0:
        if pos + FIXED_SIZE <= len(data):
            _, ver, hlen, blen, _ = _FIXED.unpack_from(data, pos)
            end = pos + FIXED_SIZE + hlen + blen
            if ver == FORMAT_VERSION and end <= len(data):
                out.append(unpack_program(data[pos:end], f"{source} (DPU subgraph at offset {pos})"))
                pos = data.find(MAGIC, end)
                continue
        pos = data.find(MAGIC, pos + 1)
    return out
