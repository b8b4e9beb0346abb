"""Data types that cross stages, in one leaf module every stage may import.

* `FMap` and the DDR region numbering: where a feature map lives, as LOAD/SAVE address it (codegen writes it,
  the runtime reads and writes tensors through it).
* `TensorBinding`, `CompiledSubgraph`: what codegen hands the runtime (and the artifact stores).
* `Group`, `FusionPlan`: what the fusion search hands codegen.
* `TensorDesc`, `LayerDesc`: one coarse op as the analytic cost model sees it (xgraph.ops.layer_desc builds it,
  timing.analytic reads it, so the timing stage needs no XGraph).
* `NodeReport`, `PartitionReport`: where each model node runs and why (built by passes.report, stored in the
  artifact and read back by the runtime).
* `InputSpec`: a model input or output (name, static shape, dtype).

Imports only the standard library and numpy, so importing it never drags a stage in.
"""
from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

# -- DDR layout ----------------------------------------------------------------------------------------------
#: reg_id of each DDR region of a compiled DPU subgraph (data, fixed for the whole project).
REG_PARAMS = 0  # weights, biases, slopes (constant, laid out in bank order)
REG_WORK = 1  # intermediate feature maps (liveness-reused)
REG_INPUT = 2  # subgraph inputs
REG_OUTPUT = 3  # subgraph outputs
#: The feature maps the segments of one partition on several cores hand each other, with the partition's own inputs
#: and outputs: one region of the device all its cores address, each tensor at an offset fixed at compile time
#: (codegen/relocate.py); a segment's parameters and workspace stay in its own REG_PARAMS / REG_WORK.
REG_SHARED = 4
REGION_NAMES = {REG_PARAMS: "params", REG_WORK: "workspace", REG_INPUT: "input", REG_OUTPUT: "output",
                REG_SHARED: "shared"}


#: Width `PartitionReport.table()` keeps its lines within (the reason column wraps).
TABLE_WIDTH = 120


@dataclass(frozen=True)
class FMap:
    """An int8 NHWC feature map (batch 1) in a DDR region.

    Byte (y, x, c) lives at `offset + y*row_pitch + x*pixel_pitch + c` in the region of base-address register
    `reg_id` (isa1-semantics.md 4). A map may be a channel slice of a wider map (pixel_pitch > c): that is how
    a concat costs nothing, its producers simply save into their slice."""

    reg_id: int
    offset: int
    h: int
    w: int
    c: int
    pixel_pitch: int
    row_pitch: int

    @staticmethod
    def dense(reg_id: int, offset: int, h: int, w: int, c: int) -> "FMap":
        return FMap(reg_id, offset, h, w, c, c, w * c)

    def addr(self, y: int, x: int, c: int = 0) -> int:
        return self.offset + y * self.row_pitch + x * self.pixel_pitch + c

    @property
    def nbytes(self) -> int:
        """Extent in bytes from the first to one past the last byte of the map."""
        return (self.h - 1) * self.row_pitch + (self.w - 1) * self.pixel_pitch + self.c

    def channels(self, c0: int, c: int) -> "FMap":
        """The view of channels [c0, c0 + c)."""
        return replace(self, offset=self.offset + c0, c=c)

    def to_ddr(self, region: np.ndarray, nchw: np.ndarray) -> None:
        """Write an int8 (1, C, H, W) array into `region` at this map's place."""
        # one strided copy straight into place (a contiguous HWC copy first cost 3x as much on a 224x224 image)
        hwc = np.asarray(nchw, dtype=np.int8).reshape(self.c, self.h, self.w).transpose(1, 2, 0)
        self._view(region)[...] = hwc.view(np.uint8)

    def from_ddr(self, region: np.ndarray) -> np.ndarray:
        """Read this map out of `region` as an int8 (1, C, H, W) array."""
        return self._view(region).view(np.int8).transpose(2, 0, 1)[None].copy()

    def _view(self, region: np.ndarray) -> np.ndarray:
        # as_strided trusts its arguments: a map reaching past its region would read or write foreign memory.
        if self.offset < 0 or min(self.h, self.w, self.c) < 1 or self.pixel_pitch < self.c or \
                self.row_pitch < (self.w - 1) * self.pixel_pitch + self.c or \
                self.offset + self.nbytes > region.size:
            raise ValueError(f"feature map {self} does not lie inside its DDR region of {region.size} bytes")
        shape, strides = (self.h, self.w, self.c), (self.row_pitch, self.pixel_pitch, 1)
        if region.flags.c_contiguous and region.flags.writeable and region.dtype == np.uint8:
            # the direct constructor: several times cheaper than as_strided, which matters per tensor per call
            return np.ndarray(shape, np.uint8, buffer=region, offset=self.offset, strides=strides)
        return np.lib.stride_tricks.as_strided(region[self.offset:], shape=shape, strides=strides, writeable=True)


# -- compiled subgraph ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorBinding:
    """Where a subgraph input/output lives in DDR and how to (de)quantize it."""

    name: str
    shape: tuple[int, ...]  # logical NCHW
    fix_point: int
    fmap: FMap


@dataclass
class CompiledSubgraph:
    """A DPU subgraph ready to run: machine code, parameter blob, DDR region sizes and tensor bindings."""

    name: str
    arch: str
    fingerprint: int
    code: np.ndarray  # uint32 words
    params: np.ndarray  # uint8 bytes of REG_PARAMS
    region_sizes: dict[int, int]
    inputs: list[TensorBinding]
    outputs: list[TensorBinding]
    instr_counts: dict[str, int] = field(default_factory=dict)
    op_ranges: list[tuple[str, int, int]] = field(default_factory=list)  # (op name, first instr, end instr)
    #: Where the program keeps each feature map that reaches DDR (inputs, outputs, workspace maps, concat slices);
    #: a map of the graph absent here never leaves the banks. Not stored in artifacts (the xmodel writer reads it).
    places: dict[str, FMap] = field(default_factory=dict)
    #: REG_PARAMS byte offset where each constant tensor's packed bytes start (in bank order, not the tensor's own
    #: layout); a grouped conv's constants also per group (codegen.layout.group_param). Not stored in artifacts.
    param_offsets: dict[str, int] = field(default_factory=dict)

    @property
    def ddr_bytes(self) -> int:
        return sum(self.region_sizes.values())

    def new_regions(self) -> dict[int, np.ndarray]:
        """Fresh DDR regions for one run: params copied, the rest zeroed."""
        regions = {reg: np.zeros(size, dtype=np.uint8) for reg, size in self.region_sizes.items()}
        regions[REG_PARAMS][: len(self.params)] = self.params
        return regions

    def io_regions(self) -> dict[int, np.ndarray]:
        """Fresh zeroed regions for what one call hands the device (its inputs and outputs): the parameters and
        the workspace are the device's own (runtime/device.py: written once per loaded program)."""
        return {reg: np.zeros(size, dtype=np.uint8) for reg, size in self.region_sizes.items()
                if reg in (REG_INPUT, REG_OUTPUT)}


# -- fusion plan ---------------------------------------------------------------------------------------------
#: Template name of a group that is one op alone.
SINGLE = "single"


@dataclass(frozen=True)
class Group:
    """One execution unit of a plan: a template's fused members (topological order) or one op alone."""

    template: str
    ops: tuple[str, ...]

    @property
    def single(self) -> bool:
        """One op alone, not a template's group."""
        return self.template == SINGLE


@dataclass
class FusionPlan:
    """Groups covering every op once (singles included) and the concat inputs saved straight into their slice."""

    mode: str
    groups: list[Group]
    concat_fused: frozenset[str] = frozenset()
    cost: float = 0.0
    stats: dict = field(default_factory=dict)
    #: Op name -> instruction-sequence variant of a lone conv (codegen.conv.CONV_VARIANTS) or of the fused group
    #: it starts (its template's variants, tvm_dpu/templates/: conv_add, pw_dw_pw); absent: "wide".
    variants: dict[str, str] = field(default_factory=dict)

    def fused(self) -> list[Group]:
        return [g for g in self.groups if not g.single]


# -- cost-model view of an op ------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorDesc:
    """A tensor an op reads or writes: its name, logical shape and whether it is a constant."""

    name: str
    shape: tuple[int, ...]
    const: bool = False

    @property
    def chw(self) -> tuple[int, int, int]:
        """(C, H, W) of a feature map; (C, 1, 1) of a 2-D (N, C) tensor."""
        s = self.shape
        return (s[1], s[2], s[3]) if len(s) == 4 else (s[1], 1, 1)

    @property
    def nbytes(self) -> int:
        """int8 bytes of one batch element (C * H * W)."""
        c, h, w = self.chw
        return c * h * w


@dataclass(frozen=True)
class LayerDesc:
    """One coarse op with the numbers the analytic DNNVM cost model (timing.analytic) needs."""

    name: str
    type: str
    inputs: tuple[TensorDesc, ...]  # every input in op order, constants included
    outputs: tuple[TensorDesc, ...]
    window: tuple[int, int, int, int] = (1, 1, 1, 1)  # kh, kw, sh, sw (dense: the whole input; point ops: 1s)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)  # top, left, bottom, right
    groups: int = 1
    weights: int = 0  # weight elements (0: no weights)
    macs: int = 0  # multiply-accumulates (conv2d, dense, depthwise_conv2d; 0 for the others)


# -- partition report ---------------------------------------------------------------------------------------
@dataclass
class NodeReport:
    """Placement of one model node."""

    name: str
    op: str
    device: str  # "dpu" | "cpu" | a custom-IP plugin's device
    subgraph: int | None
    reason: str | None
    note: str | None = None  # how a DPU node is mapped when not one-to-one (e.g. a grouped conv's decomposition)

    def to_json(self) -> dict:
        d = {"name": self.name, "op": self.op, "device": self.device, "subgraph": self.subgraph, "reason": self.reason}
        if self.note is not None:  # optional key: reports of models without such nodes keep the five keys
            d["note"] = self.note
        return d


@dataclass
class PartitionReport:
    """Per-node placement of a partitioned model (see module docstring)."""

    arch: str
    nodes: list[NodeReport] = field(default_factory=list)
    subgraphs: int = 0

    def to_json(self) -> dict:
        return {"arch": self.arch, "nodes": [n.to_json() for n in self.nodes], "subgraphs": self.subgraphs}

    @classmethod
    def from_json(cls, d: dict) -> "PartitionReport":
        """Inverse of `to_json` (the artifact stores the report)."""
        nodes = [NodeReport(str(n["name"]), str(n["op"]), str(n["device"]), n["subgraph"], n["reason"],
                            n.get("note")) for n in d["nodes"]]
        return cls(str(d["arch"]), nodes, int(d["subgraphs"]))

    def save_json(self, path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=2) + "\n")

    @property
    def dpu_nodes(self) -> list[NodeReport]:
        return [n for n in self.nodes if n.device == "dpu"]

    @property
    def cpu_nodes(self) -> list[NodeReport]:
        return [n for n in self.nodes if n.device == "cpu"]

    def node(self, name: str) -> NodeReport:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no node named {name!r} in the partition report")

    def summary(self) -> str:
        k, m = len(self.dpu_nodes), len(self.cpu_nodes)
        others: dict[str, int] = {}
        for n in self.nodes:  # custom-IP plugins' devices
            if n.device not in ("dpu", "cpu"):
                others[n.device] = others.get(n.device, 0) + 1
        plugins = "".join(f", {c} on {d}" for d, c in sorted(others.items()))
        return (
            f"{len(self.nodes)} nodes: {k} on DPU in {self.subgraphs} subgraph{'s' if self.subgraphs != 1 else ''}"
            f"{plugins}, {m} on CPU ({self.arch})"
        )

    def table(self) -> str:
        headers = ("node", "op", "device", "subgraph", "reason / note")
        rows = [
            (n.name, n.op, n.device, "" if n.subgraph is None else str(n.subgraph), n.reason or n.note or "")
            for n in self.nodes
        ]
        widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
        # The reason column wraps so that a line stays within TABLE_WIDTH (a reason can run to 400 characters).
        indent = sum(widths[:-1]) + 2 * (len(widths) - 1)
        widths[-1] = min(widths[-1], max(TABLE_WIDTH - indent, 40))

        def line(cells) -> str:
            return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

        out = [line(headers), line(["-" * w for w in widths])]
        for r in rows:
            first, *more = textwrap.wrap(r[-1], widths[-1], break_on_hyphens=False) or [""]
            out.append(line((*r[:-1], first)))
            out += [" " * indent + m for m in more]
        out.append(self.summary())
        return "\n".join(out)

    def __str__(self) -> str:
        return self.table()


@dataclass(frozen=True)
class InputSpec:
    """A model input or output: name, static shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"


def unique_name(want: str, taken: set[str]) -> str:
    """`want`, or `want#2`, `want#3`, ... : the first not in `taken` (which it is added to)."""
    name, k = want, 1
    while name in taken:
        k += 1
        name = f"{want}#{k}"
    taken.add(name)
    return name
