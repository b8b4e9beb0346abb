"""The bytes of one compiled DPU subgraph, as the BYOC codegen embeds them in TVM's module and the runtime reads
them back: a `container` (JSON header + checksummed sections) holding the machine code, the parameter region and
everything the host needs to run it (DDR region sizes, input/output bindings with fix_points, arch fingerprint).

This is the single definition of that format: `relax.ext.dpu` writes it (backend/ext_module.py), the runtime
dispatcher reads it at the address the module's trampoline hands over (runtime/dispatch.py), and the artifact
tools find it inside an exported library (`find_blobs`). Reading parses JSON and raw bytes only.
"""
from __future__ import annotations

import math
import struct
from dataclasses import asdict, dataclass

import numpy as np

from tvm_dpu.security.container import FIXED_SIZE, pack, parts, unpack
from tvm_dpu.errors import ArtifactError
from tvm_dpu.schema import SchemaError, need_dict, need_int, need_list, need_str
from tvm_dpu.types import REG_PARAMS, CompiledSubgraph, FMap, TensorBinding

MAGIC = b"TVMDPUSG"
FORMAT_VERSION = 1
FORMAT_TAG = "tvm-dpu-subgraph"
#: The host function every partition's trampoline calls with (symbol, blob address, blob size, *tensors);
#: runtime/dispatch.py registers it.
DISPATCH_FUNC = "tvm_dpu.runtime.dispatch"

_FIXED = struct.Struct("<8sIQQ32s")  # the container's fixed header (container.py), read without copying the blob


@dataclass
class Segment:
    """One piece of a DPU subgraph compiled as a program of its own, placed on a core by the multi-core schedule
    (backend/multicore.py): it starts when the segments in `after` have ended (their outputs are its inputs)."""

    sg: CompiledSubgraph
    core: int
    start: float  # predicted cycles
    end: float
    after: list[int]


@dataclass
class Multicore:
    """The segments of a DPU subgraph and their schedule on `cores` cores, carried beside its one-core program.
    Segment inputs are the subgraph's inputs or outputs of earlier segments (matched by tensor name, same fix
    point); every subgraph output is produced by one segment."""

    cores: int
    segments: list[Segment]
    single_cycles: float  # predicted cycles of the whole program on one core
    cycles: float  # predicted makespan of the schedule

    def core_order(self) -> list[list[int]]:
        """Segments of each core in the order it runs them (by predicted start)."""
        out: list[list[int]] = [[] for _ in range(self.cores)]
        for i in sorted(range(len(self.segments)), key=lambda i: (self.segments[i].start, i)):
            out[self.segments[i].core].append(i)
        return out


@dataclass
class Program:
    """A parsed subgraph blob: what the dispatcher executes."""

    symbol: str
    sg: CompiledSubgraph
    output_shapes: list[tuple[int, ...]]
    digest: bytes  # the container's sha256: identifies the content
    #: Where the code and parameter bytes lie in the blob: {"code": (offset, nbytes), "params": (...)}.
    spans: dict[str, tuple[int, int]]
    #: Segments and their schedule on several cores (`build(..., cores=N)`), or None: one program, one core.
    multicore: Multicore | None = None

    @property
    def fingerprint(self) -> int:
        return self.sg.fingerprint


def binding_json(b: TensorBinding) -> dict:
    return {"name": b.name, "shape": list(b.shape), "fix_point": int(b.fix_point), "fmap": asdict(b.fmap)}


def program_summary(p: Program) -> dict:
    """What one DPU program holds, for people: partition symbol, arch and fingerprint, instruction counts by
    kind, code and parameter bytes, and every input/output tensor with its shape and fix_point (the scale is
    2**-fix_point); `tvm_dpu.describe` returns these and the DPU modules' `inspect_source()` prints them."""
    sg = p.sg
    return {"symbol": p.symbol, "arch": sg.arch, "fingerprint": f"{sg.fingerprint:#x}",
            "instructions": int(sum(sg.instr_counts.values())), "instr_counts": dict(sorted(sg.instr_counts.items())),
            "code_bytes": int(sg.code.nbytes), "param_bytes": int(sg.params.nbytes),
            "inputs": [{"name": b.name, "shape": list(b.shape), "fix_point": int(b.fix_point)} for b in sg.inputs],
            "outputs": [{"name": b.name, "shape": list(b.shape), "fix_point": int(b.fix_point)} for b in sg.outputs],
            "cores": p.multicore.cores if p.multicore is not None else 1, "sha256": p.digest.hex()}


def summary_text(summaries: list[dict]) -> str:
    """`program_summary` dicts as text, one block per DPU partition."""
    lines = []
    for s in summaries:
        counts = ", ".join(f"{k} {v}" for k, v in s["instr_counts"].items())
        lines.append(f"DPU partition {s['symbol']}: arch {s['arch']} (fingerprint {s['fingerprint']}), "
                     f"{s['instructions']} instructions ({counts}), code {s['code_bytes']} B, params "
                     f"{s['param_bytes']} B" + (f", {s['cores']} cores" if s["cores"] > 1 else ""))
        for kind in ("inputs", "outputs"):
            for t in s[kind]:
                lines.append(f"  {kind[:-1]:6s} {t['name']}: shape {tuple(t['shape'])}, fix_point {t['fix_point']}")
    return "\n".join(lines) + ("\n" if lines else "")


def binding_from_json(d: dict) -> TensorBinding:
    return TensorBinding(d["name"], tuple(int(x) for x in d["shape"]), int(d["fix_point"]), FMap(**d["fmap"]))


def program_parts(symbol: str, sg: CompiledSubgraph, output_shapes: list[tuple[int, ...]],
                  multicore: Multicore | None = None) -> list:
    """The bytes of one compiled subgraph (deterministic: equal inputs give identical bytes) as a list of buffers
    in order, the code and parameters referenced rather than copied (VGG-16's are 140 MB), for a caller that
    copies them once into their final place. With `multicore`, its segments follow as nested program blobs
    (sections "segment.NNN") and the schedule as the header's "multicore" entry."""
    header = {
        "format": FORMAT_TAG, "symbol": symbol, "name": sg.name, "arch": sg.arch, "fingerprint": hex(sg.fingerprint),
        "region_sizes": {str(k): int(v) for k, v in sorted(sg.region_sizes.items())},
        "inputs": [binding_json(b) for b in sg.inputs], "outputs": [binding_json(b) for b in sg.outputs],
        "output_shapes": [[int(x) for x in s] for s in output_shapes],
        "instr_counts": {k: int(v) for k, v in sorted(sg.instr_counts.items())},
        "op_ranges": [[str(a), int(b), int(e)] for a, b, e in sg.op_ranges],
    }
    sections = {"code": np.ascontiguousarray(sg.code, dtype="<u4"),
                "params": np.ascontiguousarray(sg.params, dtype=np.uint8)}
    if multicore is not None:
        header["multicore"] = {
            "cores": int(multicore.cores), "single_cycles": float(multicore.single_cycles),
            "cycles": float(multicore.cycles),
            "segments": [{"core": int(g.core), "start": float(g.start), "end": float(g.end),
                          "after": [int(d) for d in g.after]} for g in multicore.segments]}
        for i, g in enumerate(multicore.segments):
            sections[_segment_section(i)] = pack_program(f"{symbol}.seg{i}", g.sg, [b.shape for b in g.sg.outputs])
    return parts(MAGIC, FORMAT_VERSION, header, sections)


def pack_program(symbol: str, sg: CompiledSubgraph, output_shapes: list[tuple[int, ...]],
                 multicore: Multicore | None = None) -> bytes:
    """`program_parts` joined: the bytes of one compiled subgraph."""
    return b"".join(program_parts(symbol, sg, output_shapes, multicore))


#: Most segments one subgraph may carry, and most cores a schedule may name (the DPUCZDX8G has at most 4).
MAX_SEGMENTS = 4096
MAX_CORES = 16


def _segment_section(i: int) -> str:
    return f"segment.{i:03d}"


def _cycles(v, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise SchemaError(f"{what} must be a finite number >= 0, got {v!r:.40}")
    return float(v)


def _multicore(h: dict, c, sg: CompiledSubgraph, source: str) -> Multicore:
    """The "multicore" header entry and its segment sections, checked: every segment a valid program of the same
    DPU, dependencies on earlier segments only, each segment input a subgraph input or an output of a segment it
    waits for (same shape and fix point), every subgraph output produced by a segment."""
    cores = need_int(h.get("cores"), "multicore.cores", 1, MAX_CORES)
    rows = need_list(h.get("segments"), "multicore.segments")
    if not 2 <= len(rows) <= MAX_SEGMENTS:
        raise SchemaError(f"multicore.segments has {len(rows)} entries, expected 2 to {MAX_SEGMENTS}")
    known = {b.name: (b.shape, b.fix_point) for b in sg.inputs}
    producer = {b.name: -1 for b in sg.inputs}
    segments = []
    for i, r in enumerate(rows):
        what = f"multicore.segments[{i}]"
        r = need_dict(r, what)
        if set(r) != {"core", "start", "end", "after"}:
            raise SchemaError(f"{what} has fields {sorted(r)}")
        after = [need_int(d, f"{what}.after", 0, i - 1) for d in need_list(r.get("after"), f"{what}.after")]
        start = _cycles(r.get("start"), f"{what}.start")
        end = _cycles(r.get("end"), f"{what}.end")
        if end < start:
            raise SchemaError(f"{what} ends (cycle {end}) before it starts ({start})")
        name = _segment_section(i)
        if not c.has(name):
            raise SchemaError(f"{what}: no section {name!r}")
        seg = unpack_program(c.view(name), f"{source} {name}").sg
        if seg.fingerprint != sg.fingerprint:
            raise SchemaError(f"{what} is compiled for fingerprint {seg.fingerprint:#x}, not {sg.fingerprint:#x}")
        for b in seg.inputs:
            if b.name not in known:
                raise SchemaError(f"{what} reads {b.name!r}, which no earlier segment nor the subgraph input gives")
            if known[b.name] != (b.shape, b.fix_point):
                raise SchemaError(f"{what} reads {b.name!r} as shape {list(b.shape)} fix point {b.fix_point}, "
                                  f"its producer gives {list(known[b.name][0])} fix point {known[b.name][1]}")
            if producer[b.name] >= 0 and producer[b.name] not in after:
                raise SchemaError(f"{what} reads {b.name!r} from segment {producer[b.name]} but does not wait for it")
        for b in seg.outputs:
            if b.name in known:
                raise SchemaError(f"{what} writes {b.name!r}, which is already given")
            known[b.name] = (b.shape, b.fix_point)
            producer[b.name] = i
        segments.append(Segment(seg, need_int(r.get("core"), f"{what}.core", 0, cores - 1), start, end, after))
    for b in sg.outputs:
        if known.get(b.name) != (b.shape, b.fix_point):
            raise SchemaError(f"subgraph output {b.name!r} is not produced by a segment (with its shape and fix point)")
    return Multicore(cores, segments, _cycles(h.get("single_cycles"), "multicore.single_cycles"),
                     _cycles(h.get("cycles"), "multicore.cycles"))


def digest_of(prefix: bytes) -> bytes:
    """The content digest stored in a blob's fixed header (its first `FIXED_SIZE` bytes)."""
    return _FIXED.unpack_from(prefix, 0)[4]


#: Bounds a program's header must respect (a DPU core addresses 8 DDR regions; a region above 4 GiB or a tensor
#: with more than 2**31 elements is not something this compiler writes).
NUM_REGIONS = 8
MAX_REGION_BYTES = 1 << 32
MAX_ELEMENTS = 1 << 31


def _shape(v, what: str) -> tuple[int, ...]:
    dims = tuple(need_int(d, f"{what}[{i}]", 1, MAX_ELEMENTS) for i, d in enumerate(need_list(v, what)))
    if not dims or int(np.prod(dims, dtype=np.int64)) > MAX_ELEMENTS:
        raise SchemaError(f"{what} {list(dims)} is empty or too large")
    return dims


def _binding(d, what: str, regions: dict[int, int]) -> TensorBinding:
    d = need_dict(d, what)
    f = need_dict(d.get("fmap"), f"{what}.fmap")
    reg = need_int(f.get("reg_id"), f"{what}.fmap.reg_id", 0, NUM_REGIONS - 1)
    if reg not in regions:
        raise SchemaError(f"{what}.fmap.reg_id {reg} is not a region of this program ({sorted(regions)})")
    h, w, c = (need_int(f.get(k), f"{what}.fmap.{k}", 1, MAX_ELEMENTS) for k in ("h", "w", "c"))
    pixel = need_int(f.get("pixel_pitch"), f"{what}.fmap.pixel_pitch", c, MAX_REGION_BYTES)
    row = need_int(f.get("row_pitch"), f"{what}.fmap.row_pitch", (w - 1) * pixel + c, MAX_REGION_BYTES)
    off = need_int(f.get("offset"), f"{what}.fmap.offset", 0, MAX_REGION_BYTES)
    if set(f) != {"reg_id", "offset", "h", "w", "c", "pixel_pitch", "row_pitch"}:
        raise SchemaError(f"{what}.fmap has fields {sorted(f)}")
    fmap = FMap(reg, off, h, w, c, pixel, row)
    if off + fmap.nbytes > regions[reg]:
        raise SchemaError(f"{what}.fmap (offset {off}, {fmap.nbytes} bytes) reaches past DDR region {reg} "
                   f"({regions[reg]} bytes)")
    shape = _shape(d.get("shape"), f"{what}.shape")
    if len(shape) != 4 or shape[0] != 1 or shape[1:] != (c, h, w):
        raise SchemaError(f"{what}.shape {list(shape)} is not (1, c, h, w) = (1, {c}, {h}, {w}) of its feature map")
    fp = need_int(d.get("fix_point"), f"{what}.fix_point", -128, 127)
    return TensorBinding(need_str(d.get("name"), f"{what}.name"), shape, fp, fmap)


def unpack_program(data: bytes, source: str) -> Program:
    """Parse and verify a blob: the container's checksums, then every header value against the schema (types,
    ranges, feature maps inside their DDR regions, shapes consistent with them) before anything is used.
    One ArtifactError naming `source` and the field on any defect."""
    c = unpack(data, MAGIC, FORMAT_VERSION, source, "DPU subgraph", FORMAT_TAG)
    h = c.header
    try:
        regions = {need_int(int(k) if isinstance(k, str) and k.isdigit() else k, f"region_sizes key {k!r}", 0,
                        NUM_REGIONS - 1): need_int(v, f"region_sizes[{k}]", 0, MAX_REGION_BYTES)
                   for k, v in need_dict(h.get("region_sizes"), "region_sizes").items()}
        code_raw, params_raw = c.view("code"), c.view("params")
        if not code_raw or len(code_raw) % 4:
            raise SchemaError(f"section 'code' has {len(code_raw)} bytes, not a whole number of 32-bit words")
        if len(params_raw) > regions.get(REG_PARAMS, 0):
            raise SchemaError(f"section 'params' ({len(params_raw)} bytes) does not fit DDR region {REG_PARAMS} "
                       f"({regions.get(REG_PARAMS, 0)} bytes)")
        n_words = len(code_raw) // 4
        inputs = [_binding(b, f"inputs[{i}]", regions) for i, b in enumerate(need_list(h.get("inputs"), "inputs"))]
        outputs = [_binding(b, f"outputs[{i}]", regions) for i, b in enumerate(need_list(h.get("outputs"), "outputs"))]
        if not outputs:
            raise SchemaError("a program without outputs")
        shapes = [_shape(s, f"output_shapes[{i}]")
                  for i, s in enumerate(need_list(h.get("output_shapes"), "output_shapes", len(outputs)))]
        batches = set()
        for i, (s, b) in enumerate(zip(shapes, outputs)):
            # the program computes one image; a batch of N runs it N times (runtime.subgraph_runner.execute_float)
            per_image = int(np.prod(b.shape))
            if int(np.prod(s)) < per_image or int(np.prod(s)) % per_image:
                raise SchemaError(f"output_shapes[{i}] {list(s)} does not hold a whole number of images of the "
                                  f"{per_image} elements of output {b.name!r}")
            batches.add(int(np.prod(s)) // per_image)
        if len(batches) > 1:
            raise SchemaError(f"output_shapes hold different batch sizes {sorted(batches)}")
        counts = {need_str(k, "instr_counts key"): need_int(v, f"instr_counts[{k}]", 0, n_words)
                  for k, v in need_dict(h.get("instr_counts"), "instr_counts").items()}
        ranges = []
        for i, r in enumerate(need_list(h.get("op_ranges"), "op_ranges")):
            name, lo, hi = need_list(r, f"op_ranges[{i}]", 3)
            lo = need_int(lo, f"op_ranges[{i}] start", 0, n_words)
            ranges.append((need_str(name, f"op_ranges[{i}] name"), lo, need_int(hi, f"op_ranges[{i}] end", lo, n_words)))
        fp_text = need_str(h.get("fingerprint"), "fingerprint")
        try:
            fingerprint = int(fp_text, 16)
        except ValueError:
            raise SchemaError(f"fingerprint {fp_text!r:.40} is not a hex number") from None
        need_int(fingerprint, "fingerprint", 0, (1 << 64) - 1)
        sg = CompiledSubgraph(
            name=need_str(h.get("name"), "name"), arch=need_str(h.get("arch"), "arch"), fingerprint=fingerprint,
            code=np.frombuffer(code_raw, dtype="<u4").astype(np.uint32),
            params=np.frombuffer(params_raw, dtype=np.uint8).copy(), region_sizes=regions, inputs=inputs,
            outputs=outputs, instr_counts=counts, op_ranges=ranges)
        symbol = need_str(h.get("symbol"), "symbol")
        multicore = None if h.get("multicore") is None else \
            _multicore(need_dict(h["multicore"], "multicore"), c, sg, source)
    except SchemaError as e:
        raise ArtifactError(f"{source}: DPU subgraph header: {e}") from None
    spans = {name: (c.area_offset(name), len(c.view(name))) for name in ("code", "params")}
    return Program(symbol, sg, shapes, digest_of(data), spans, multicore)


def _scan(data: bytes, magic: bytes, version: int, parse):
    """parse(blob bytes, source suffix) for every blob framed with `magic` / `version` in `data`, in file order. A
    magic match whose framing does not hold (a coincidence in machine code) is skipped; a blob that frames but
    fails its checksums or header checks is an ArtifactError naming its offset."""
    out = []
    pos = data.find(magic)
    while pos >= 0:
        if pos + FIXED_SIZE <= len(data):
            _, ver, hlen, blen, _ = _FIXED.unpack_from(data, pos)
            end = pos + FIXED_SIZE + hlen + blen
            if ver == version and end <= len(data):
                out.append(parse(memoryview(data)[pos:end], pos))  # a view: each blob is not copied first
                pos = data.find(magic, end)
                continue
        pos = data.find(magic, pos + 1)
    return out


def find_blobs(data: bytes, source: str) -> list[Program]:
    """Every DPU subgraph blob embedded in `data` (an exported shared library), in file order."""
    return _scan(data, MAGIC, FORMAT_VERSION,
                 lambda blob, pos: unpack_program(blob, f"{source} (DPU subgraph at offset {pos})"))


# ---------------------------------------------------------------------------------------------------------
# Custom-IP plugin subgraphs (tvm_dpu.plugins): the same framing, the plugin's own bytes as the payload
# ---------------------------------------------------------------------------------------------------------
PLUGIN_MAGIC = b"TVMDPUPL"
PLUGIN_FORMAT_VERSION = 1
PLUGIN_FORMAT_TAG = "tvm-dpu-plugin-subgraph"
#: The host function every plugin partition's trampoline calls (plugins/runtime.py registers it).
PLUGIN_DISPATCH_FUNC = "tvm_dpu.plugins.dispatch"


def pack_plugin_program(plugin: str, version: str, device: str, symbol: str, input_shapes, output_shapes,
                        nodes: list[str], payload: bytes) -> bytes:
    header = {"format": PLUGIN_FORMAT_TAG, "plugin": plugin, "version": version, "device": device, "symbol": symbol,
              "input_shapes": [[int(d) for d in s] for s in input_shapes],
              "output_shapes": [[int(d) for d in s] for s in output_shapes], "nodes": [str(n) for n in nodes]}
    return pack(PLUGIN_MAGIC, PLUGIN_FORMAT_VERSION, header, {"payload": bytes(payload)})


def unpack_plugin_program(data: bytes, source: str) -> tuple[dict, bytes]:
    """(header, payload) of a plugin subgraph blob, every header value checked (ArtifactError on any defect)."""
    c = unpack(data, PLUGIN_MAGIC, PLUGIN_FORMAT_VERSION, source, "plugin subgraph", PLUGIN_FORMAT_TAG)
    h = c.header
    try:
        for key in ("plugin", "version", "device", "symbol"):
            need_str(h.get(key), key)
        for key in ("input_shapes", "output_shapes"):
            for i, s in enumerate(need_list(h.get(key), key)):
                _shape(s, f"{key}[{i}]")
        for i, n in enumerate(need_list(h.get("nodes"), "nodes")):
            need_str(n, f"nodes[{i}]")
    except SchemaError as e:
        raise ArtifactError(f"{source}: plugin subgraph header: {e}") from None
    return h, c.section("payload")


def plugin_summary(header: dict) -> dict:
    """What reports and the artifact header show of a plugin subgraph."""
    return {k: header[k] for k in ("symbol", "plugin", "version", "device", "nodes")}


def find_plugin_blobs(data: bytes, source: str) -> list[tuple[dict, bytes]]:
    """Every plugin subgraph blob embedded in `data` (an exported library), in file order."""
    return _scan(data, PLUGIN_MAGIC, PLUGIN_FORMAT_VERSION,
                 lambda blob, pos: unpack_plugin_program(blob, f"{source} (plugin subgraph at offset {pos})"))
