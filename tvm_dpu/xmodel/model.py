"""The XIR graph of a .xmodel as the project's own dataclasses: ops, tensors, the subgraph tree and, for each DPU
subgraph, what running it needs (machine code, regions, I/O tensors at their DDR addresses)."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from ..arch.arch import arch_from_fingerprint
from ..codegen.isa import DEFAULT_ISA
from ..errors import ArchError, ISAError, XModelError
from ..security.safe_io import read_regular
from .reader import Attr, decode_graph

#: XIR's DataType::Type numbering (xir/tensor/data_type.hpp): Tensor.data_type.
DATA_TYPES = {0: "int", 1: "uint", 2: "xint", 3: "xuint", 4: "float", 5: "bfloat"}
#: Limits checked before anything is allocated from a file's numbers: elements of one tensor (1 GiB of float32,
#: far past any DPUCZDX8G feature map), bytes of one DPU subgraph's register regions together (the boards' DDR is
#: 2-4 GiB, vai_c's largest models use tens of MiB), and the fix point's magnitude (int8 scales are 2**-16..2**16
#: in practice; 2**+-64 still fits a float32 without overflow).
MAX_TENSOR_ELEMENTS = 1 << 28
MAX_REGION_BYTES = 1 << 30
MAX_FIX_POINT = 64


def _values(attrs: dict[str, Attr]) -> dict[str, Any]:
    return {k: a.value for k, a in attrs.items()}


def _kinds(attrs: dict[str, Attr]) -> dict[str, str]:
    return {k: a.kind for k, a in attrs.items()}


@dataclass
class XTensor:
    """An op's output tensor. `dtype` is XIR's type and width (e.g. "xint8", "float32"); `fix_point` (int8
    value * 2**-fix_point), `reg_id`, `ddr_addr`, `strides` (bytes, per dim) and `location` (1 = DDR) are None
    where the tensor does not carry them."""
    name: str
    shape: tuple[int, ...]
    dtype: str
    fix_point: int | None
    reg_id: int | None
    ddr_addr: int | None
    strides: tuple[int, ...] | None
    location: int | None
    attrs: dict[str, Any] = field(default_factory=dict)
    attr_kinds: dict[str, str] = field(default_factory=dict)
    op: str = ""  # the op producing it

    @property
    def size(self) -> int:
        return math.prod(int(d) for d in self.shape)

    @property
    def nbytes(self) -> int:
        bits = int("".join(c for c in self.dtype if c.isdigit()) or 8)
        return self.size * bits // 8

    def byte_strides(self) -> tuple[int, ...]:
        """`strides`, or the dense int8 layout's when the tensor carries none."""
        if self.strides is not None:
            return self.strides
        return tuple(math.prod(int(d) for d in self.shape[i + 1:]) for i in range(len(self.shape)))

    def last_byte(self) -> int:
        """The DDR offset of the tensor's last int8 element under `byte_strides` (ddr_addr when it has one)."""
        return self.ddr_addr + sum((int(d) - 1) * st for d, st in zip(self.shape, self.byte_strides()))

    def check_placement(self, region_size: int, where: str) -> None:
        """XModelError unless every int8 element lies inside a region of `region_size` bytes at a distinct byte:
        strides one per dimension, at least 1, not overlapping; ddr_addr and the last byte inside the region."""
        strides = self.byte_strides()
        what = f"{where}: tensor {self.name!r} (shape {list(self.shape)}, strides {list(strides)})"
        if len(strides) != len(self.shape) or any(st < 1 for st in strides):
            raise XModelError(f"{what}: needs one stride of at least 1 byte per dimension")
        extent = 1
        for st, d in sorted((st, d) for d, st in zip(self.shape, strides) if d > 1):
            if st < extent:
                raise XModelError(f"{what}: elements overlap (stride {st} inside a {extent}-byte span)")
            extent = st * d
        last = self.last_byte()
        if self.ddr_addr < 0 or last >= region_size:
            raise XModelError(f"{what} at ddr_addr {self.ddr_addr} ends at byte {last + 1}, past REG_{self.reg_id}'s "
                              f"{region_size} bytes")


@dataclass
class XOp:
    """One XIR op: `inputs` maps each argument name (input, weights, bias, ...) to the names of the ops feeding it."""
    name: str
    type: str
    attrs: dict[str, Any]
    inputs: dict[str, list[str]]
    output: XTensor
    attr_kinds: dict[str, str] = field(default_factory=dict)

    @property
    def input_ops(self) -> list[str]:
        return [n for names in self.inputs.values() for n in names]


@dataclass
class XSubgraph:
    """A node of the subgraph tree. `device` is "USER", "DPU", "CPU" or None (a DPU subgraph's layer groups);
    `ops` lists the ops held directly by this node (a DPU subgraph's ops sit in its children)."""
    name: str
    device: str | None
    attrs: dict[str, Any]
    children: list["XSubgraph"]
    ops: list[str]
    attr_kinds: dict[str, str] = field(default_factory=dict)

    def walk(self) -> Iterator["XSubgraph"]:
        yield self
        for c in self.children:
            yield from c.walk()

    def all_ops(self) -> list[str]:
        """Every op of this subgraph and its descendants, in tree order."""
        return [o for s in self.walk() for o in s.ops]


@dataclass
class Region:
    """A DPU register region (REG_n): `data` is the CONST region's bytes (reg_id_to_parameter_value), else None."""
    reg_id: int
    name: str
    context_type: str
    context_type_v2: str | None
    size: int
    data: bytes | None


@dataclass
class DpuSubgraph:
    """What a DPU subgraph runs: its machine code, arch fingerprint, regions and I/O tensors (DPU side: an input is
    an upload op's output, an output the tensor a download op reads)."""
    name: str
    fingerprint: int
    mc_code: bytes
    mc_code_preload: bytes
    regions: dict[int, Region]
    inputs: list[XTensor]
    outputs: list[XTensor]
    attrs: dict[str, Any]
    subgraph: XSubgraph

    @property
    def dpu_name(self) -> str:
        return str(self.attrs.get("dpu_name", ""))

    @property
    def instruction_set(self) -> str:
        return instruction_set_of(self.fingerprint)

    def weight_split(self) -> tuple[int, int, int] | None:
        """vai_c's HBM weight split (DPUCAHX8H): (W0 reg_id, W1 reg_id, OCP) as its weight LOADs name them
        (`weight_split`), else None. A weight tensor placed in W0 holds, of every OCP output channels, the first
        OCP/2 there and the others at the same offsets in W1 (a last half short of OCP/2 is zero-padded), as one
        LOAD with bank_id 0x3F reads them through both DDR ports (AMD's simulator, Load<DPUV3E>::Exec)."""
        if "_weight_split" not in self.__dict__:  # read from the code once per subgraph
            self.__dict__["_weight_split"] = weight_split(self.attrs, self.fingerprint)
        return self.__dict__["_weight_split"]

    def split_extent(self, t: XTensor) -> int | None:
        """Bytes a weight tensor in W0 takes in each of W0 and W1 (`weight_split`); None for any other tensor."""
        return split_extent(self.weight_split(), t)

    def const_values(self, t: XTensor) -> np.ndarray | None:
        """The int8 values of constant tensor `t` from its CONST region(s), in its own layout (output channels
        first, joined back from W0 and W1 for a split weight); None when the region holds no bytes for it."""
        n = math.prod(int(x) for x in t.shape)
        region = self.regions.get(t.reg_id) if t.reg_id is not None else None
        if region is None or region.data is None or t.ddr_addr is None:
            return None
        extent = self.split_extent(t)
        if extent is None:
            return None if t.ddr_addr + n > len(region.data) else \
                np.frombuffer(region.data, np.int8, n, t.ddr_addr).reshape(t.shape)
        w0, w1, ocp = self.weight_split()  # type: ignore[misc]
        other = self.regions.get(w1)
        parts = [region.data, None if other is None else other.data]
        if parts[1] is None or t.ddr_addr + extent > min(len(parts[0]), len(parts[1])):
            return None
        half, k = ocp // 2, n // int(t.shape[0])
        halves = [np.frombuffer(p, np.int8, extent, t.ddr_addr).reshape(-1, half, k) for p in parts]
        return np.concatenate(halves, axis=1).reshape(-1, k)[:int(t.shape[0])].reshape(t.shape)


def weight_split(attrs: dict[str, Any], fingerprint: Any) -> tuple[int, int, int] | None:
    """(W0 reg_id, W1 reg_id, OCP) of a DPUCAHX8H subgraph (`DpuSubgraph.weight_split`), read where the hardware
    reads it: the regions its first weight LOAD (bank_id 0x3F) names through `reg_id` and `reg_id_1`. None without
    such a LOAD, when both ports read one region (tvm-dpu's programs: each 16-channel group's two halves lie one
    after the other there, so a weight tensor is one contiguous run), for another instruction set, or for code or
    a fingerprint that does not decode. (The region maps do not single the pair out: vai_c maps the biases'
    region to segment W0 as well.)"""
    from ..codegen.isa import iter_program
    from ..emulator import DPUV3E_ISA as ISA, DPUV3E_WEIGHT_LOAD_BANK as WEIGHT_LOAD_BANK

    code = attrs.get("mc_code")
    try:
        arch = arch_from_fingerprint(fingerprint)
        if not isinstance(code, bytes) or arch.instruction_set != ISA:
            return None
        for _, ins in iter_program(np.frombuffer(code, "<u4", len(code) // 4), shared=True, isa=ISA):
            if ins.name == "LOAD" and ins.fields["bank_id"] == WEIGHT_LOAD_BANK:
                w0, w1 = int(ins.fields["reg_id"]), int(ins.fields["reg_id_1"])
                return (w0, w1, arch.ocp) if w0 != w1 else None
    except (ArchError, ISAError, TypeError):
        return None
    return None


def split_extent(split: tuple[int, int, int] | None, t: XTensor) -> int | None:
    """Bytes weight tensor `t` takes in each of W0 and W1 under `split` (ceil(oc / OCP) * OCP/2 output channels);
    None when `t` is not in W0 or there is no split."""
    if split is None or t.reg_id != split[0] or len(t.shape) < 2:  # a bias (1-D) is never split
        return None
    return -(-int(t.shape[0]) // split[2]) * (split[2] // 2) * math.prod(int(x) for x in t.shape[1:])


def instruction_set_of(fingerprint: Any) -> str:
    """The instruction set a DPU fingerprint names ("DPUV2", "DPUV3E"); DPUV2 for one that names none tvm-dpu has a
    table for (DPUCZDX8G ISA0, a malformed value), whose decoding then fails naming the word."""
    try:
        return arch_from_fingerprint(fingerprint).instruction_set
    except ArchError:
        return DEFAULT_ISA


def _reg_id(name: str, where: str) -> int:
    if not name.startswith("REG_") or not name[4:].isdigit():
        raise XModelError(f"{where}: register region {name!r} is not named REG_<n>")
    return int(name[4:])


@dataclass
class XModel:
    """A decoded .xmodel. `attrs` are the graph's attributes (origin, libs_info, ...)."""
    name: str
    attrs: dict[str, Any]
    ops: list[XOp]
    root: XSubgraph
    source: str = "<bytes>"
    attr_kinds: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.op_by_name = {op.name: op for op in self.ops}
        self._readers: dict[str, list[XOp]] = {}
        for op in self.ops:
            for n in dict.fromkeys(op.input_ops):
                self._readers.setdefault(n, []).append(op)

    def op(self, name: str) -> XOp:
        try:
            return self.op_by_name[name]
        except KeyError:
            raise XModelError(f"{self.source}: no op named {name!r}") from None

    def subgraphs(self, device: str) -> list[XSubgraph]:
        """The root's children on `device`, in file order."""
        return [s for s in self.root.children if s.device == device]

    def cpu_subgraphs(self) -> list[XSubgraph]:
        return self.subgraphs("CPU")

    def user_subgraphs(self) -> list[XSubgraph]:
        return self.subgraphs("USER")

    def consumers(self, name: str) -> list[XOp]:
        return list(self._readers.get(name, ()))

    def dpu_subgraph(self, sg: XSubgraph) -> DpuSubgraph:
        """The runnable view of the DPU subgraph `sg` (see DpuSubgraph)."""
        where = f"{self.source}: DPU subgraph {sg.name!r}"
        a = sg.attrs
        for key in ("mc_code", "dpu_fingerprint", "reg_id_to_size", "reg_id_to_context_type"):
            if key not in a:
                raise XModelError(f"{where} has no attribute {key!r}")
        for key, kind in (("mc_code", bytes), ("mc_code_preload", bytes), ("dpu_fingerprint", int),
                          ("reg_id_to_size", dict), ("reg_id_to_context_type", dict),
                          ("reg_id_to_context_type_v2", dict), ("reg_id_to_parameter_value", dict)):
            if key in a and (not isinstance(a[key], kind) or isinstance(a[key], bool)):
                raise XModelError(f"{where}: attribute {key!r} is a {sg.attr_kinds.get(key, type(a[key]).__name__)}, "
                                  f"not a {kind.__name__}")
        kinds_v2 = a.get("reg_id_to_context_type_v2", {})
        params = a.get("reg_id_to_parameter_value", {})
        regions = {}
        total = 0
        for name, size in a["reg_id_to_size"].items():
            rid = _reg_id(name, where)
            if not isinstance(size, int) or size < 0:
                raise XModelError(f"{where}: region {name} has size {size!r}")
            total += size
            if total > MAX_REGION_BYTES:
                raise XModelError(f"{where}: register regions of more than {MAX_REGION_BYTES} bytes together "
                                  f"(reg_id_to_size {name} = {size}): past what tvm-dpu allocates for one subgraph")
            data = params.get(name)
            if data is not None and not isinstance(data, bytes):
                raise XModelError(f"{where}: the parameters of region {name} are not bytes")
            kind = str(a["reg_id_to_context_type"].get(name, ""))
            if data is not None and len(data) > size:
                raise XModelError(f"{where}: region {name} holds {len(data)} parameter bytes in {size}")
            if kind == "CONST" and size and len(data or b"") != size:
                raise XModelError(f"{where}: CONST region {name} of {size} bytes has {len(data or b'')} parameter "
                                  "bytes (reg_id_to_parameter_value): its weights would be missing")
            regions[rid] = Region(rid, name, kind, kinds_v2.get(name), size, data)
        ops = [self.op(n) for n in sg.all_ops()]
        inputs = [op.output for op in ops if op.type == "upload"]
        outputs = []
        for op in ops:
            if op.type == "download":
                (src,) = op.input_ops or [None]
                if src is None:
                    raise XModelError(f"{where}: download op {op.name!r} has no input")
                outputs.append(self.op(src).output)
        for t in inputs + outputs:
            if t.reg_id is None or t.ddr_addr is None:
                raise XModelError(f"{where}: I/O tensor {t.name!r} has no reg_id / ddr_addr")
            if t.reg_id not in regions:
                raise XModelError(f"{where}: I/O tensor {t.name!r} is in REG_{t.reg_id}, which has no size")
            t.check_placement(regions[t.reg_id].size, where)
        code = bytes(a["mc_code"])
        _check_code(code, where, instruction_set_of(a["dpu_fingerprint"]))
        return DpuSubgraph(sg.name, int(a["dpu_fingerprint"]), code,
                           bytes(a.get("mc_code_preload", b"")), regions, inputs, outputs, dict(a), sg)

    def dpu_subgraphs(self) -> list[DpuSubgraph]:
        return [self.dpu_subgraph(s) for s in self.subgraphs("DPU")]


def _check_code(code: bytes, where: str, isa: str = DEFAULT_ISA) -> None:
    """XModelError unless `code` is whole instructions of `isa` (the set the fingerprint names) ending with END (a program without END never tells
    its runner it finished: VART would wait for its interrupt forever)."""
    import numpy as np

    from ..codegen.isa import iter_program
    from ..errors import ISAError

    if len(code) % 4:
        raise XModelError(f"{where}: mc_code has {len(code)} bytes, not whole 32-bit words")
    last = None
    try:
        for pos, ins in iter_program(np.frombuffer(code, "<u4"), isa=isa):
            if last is not None and last[1] == "END":
                raise XModelError(f"{where}: mc_code goes on after END (word {pos})")
            last = (pos, ins.name)
    except ISAError as e:
        raise XModelError(f"{where}: mc_code does not decode as {isa}: {e}") from None
    if last is None or last[1] != "END":
        raise XModelError(f"{where}: mc_code ({len(code) // 4} words) does not end with END"
                          + ("" if last is None else f" (its last instruction, at word {last[0]}, is {last[1]})"))


def _int_or_none(attrs: dict[str, Any], key: str) -> int | None:
    v = attrs.get(key)
    return int(v) if isinstance(v, (int, bool)) else None


def _tensor(msg: dict[str, Any], op: str) -> XTensor:
    attrs: dict[str, Attr] = msg["tensor_attr"]
    values = _values(attrs)
    stride = values.get("stride")
    dtype = f"{DATA_TYPES.get(msg['data_type'], 'unknown')}{msg['tensor_bit_width']}"
    return XTensor(msg["tensor_name"], tuple(int(d) for d in msg["tensor_dim"]), dtype,
                   _int_or_none(values, "fix_point"), _int_or_none(values, "reg_id"),
                   _int_or_none(values, "ddr_addr"),
                   tuple(int(s) for s in stride) if isinstance(stride, list) else None,
                   _int_or_none(values, "location"), values, _kinds(attrs), op)


def _subgraph(msg: dict[str, Any]) -> XSubgraph:
    attrs: dict[str, Attr] = msg["subg_attr"]
    values = _values(attrs)
    device = values.get("device")
    return XSubgraph(msg["subgraph_name"], device if isinstance(device, str) else None, values,
                     [_subgraph(c) for c in msg["subg_child"]], list(msg["op_name"]), _kinds(attrs))


def _check_tensor(op: XOp, source: str) -> None:
    """XModelError unless the op's output tensor has sizes tvm-dpu can allocate and a usable fix point."""
    t = op.output
    where = f"{source}: op {op.name!r}: output tensor {t.name!r}"
    if any(d < 1 for d in t.shape):
        raise XModelError(f"{where} has shape {list(t.shape)}: every dimension must be at least 1")
    if t.size > MAX_TENSOR_ELEMENTS:
        raise XModelError(f"{where} has shape {list(t.shape)} ({t.size} elements): more than the "
                          f"{MAX_TENSOR_ELEMENTS} tvm-dpu allocates for one tensor")
    if t.fix_point is not None and abs(t.fix_point) > MAX_FIX_POINT:
        raise XModelError(f"{where} has fix_point {t.fix_point}: outside +-{MAX_FIX_POINT}")


def _check_acyclic(ops: list[XOp], source: str) -> None:
    """XModelError naming an op on a cycle of the op graph (Kahn's algorithm: linear in ops and edges)."""
    waiting = {op.name: len(set(op.input_ops)) for op in ops}
    readers: dict[str, list[str]] = {}
    for op in ops:
        for n in set(op.input_ops):
            readers.setdefault(n, []).append(op.name)
    ready = [n for n, k in waiting.items() if k == 0]
    while ready:
        n = ready.pop()
        for r in readers.get(n, ()):
            waiting[r] -= 1
            if waiting[r] == 0:
                ready.append(r)
    stuck = [n for n, k in waiting.items() if k > 0]
    if stuck:
        raise XModelError(f"{source}: the op graph has a cycle ({len(stuck)} op(s) on or behind it never get their "
                          f"inputs, e.g. {stuck[0]!r})")


def read_xmodel(path_or_bytes: str | os.PathLike | bytes | bytearray | memoryview) -> XModel:
    """Read an AMD .xmodel (a serialized XIR graph). A file that is not one, or is damaged, raises XModelError
    naming the field and file offset."""
    if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
        data, source = bytes(path_or_bytes), "<bytes>"
    else:
        source = os.fspath(path_or_bytes)
        data = read_regular(source, "xmodel", XModelError)
    g = decode_graph(data, source)
    ops = []
    for i, m in enumerate(g["op_node"]):
        if not m["op_name"]:
            raise XModelError(f"{source}: op {i} has no name")
        tensor = _tensor(m["output_tensor"] or {"tensor_name": "", "tensor_dim": [], "data_type": 0,
                                                 "tensor_bit_width": 0, "tensor_attr": {}}, m["op_name"])
        ops.append(XOp(m["op_name"], m["op_type"], _values(m["op_attr"]),
                       {a["arg_name"]: list(a["arg_ops"]) for a in m["args"]}, tensor, _kinds(m["op_attr"])))
    by_name = {op.name: op for op in ops}
    if len(by_name) != len(ops):
        raise XModelError(f"{source}: two ops share a name")
    for op in ops:
        _check_tensor(op, source)
        for n in op.input_ops:
            if n not in by_name:
                raise XModelError(f"{source}: op {op.name!r} reads {n!r}, which is not an op of the graph")
            if n == op.name:
                raise XModelError(f"{source}: op {op.name!r} reads its own output")
        if op.type in ("upload", "download") and op.input_ops:
            src = by_name[op.input_ops[0]].output
            if len(op.input_ops) != 1 or src.size != op.output.size:
                raise XModelError(f"{source}: {op.type} op {op.name!r} copies {op.input_ops} "
                                  f"({list(src.shape)}) to a tensor of shape {list(op.output.shape)}")
    _check_acyclic(ops, source)
    if g["subg_root"] is None:
        raise XModelError(f"{source}: the graph has no subgraph tree (subg_root): not compiled by vai_c")
    root = _subgraph(g["subg_root"])
    holder: dict[str, str] = {}
    for sg in root.walk():
        for n in sg.ops:
            if n not in by_name:
                raise XModelError(f"{source}: subgraph {sg.name!r} holds {n!r}, which is not an op of the graph")
            if n in holder:
                raise XModelError(f"{source}: op {n!r} is held by subgraphs {holder[n]!r} and {sg.name!r}")
            holder[n] = sg.name
    return XModel(g["graph_name"], _values(g["graph_attr"]), ops, root, source, _kinds(g["graph_attr"]))
