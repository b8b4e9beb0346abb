"""XGraph: the coarse DPU graph (tensors with power-of-two fix_points, coarse ops, a subgraph tree).

A DPU subgraph of the model becomes one `Graph`: int8 feature maps in logical NCHW layout, int8 constants
(weights, biases, slopes) with their own fix_points, and coarse ops in topological order. Op attributes are
JSON-able scalars and lists only, so a graph serializes without pickle (see `serialize.py`). The op types,
their attributes and shape rules are listed in `ops.py`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from tvm_dpu.errors import DPUError

#: Element types a tensor may have. Feature maps and DPU constants are int8; the wider types exist for
#: CPU-side constants and 16-bit depthwise weights (ALU mode 8).
DTYPES = ("int8", "int16", "int32", "float32")

#: Devices a subgraph may be assigned to.
DEVICES = ("root", "dpu", "cpu")


class GraphError(DPUError, ValueError):
    """A malformed XGraph: dangling input, cycle, shape mismatch, missing fix_point or attribute, ..."""


@dataclass(eq=False)
class Tensor:
    """One tensor. `shape` is logical NCHW for feature maps; constants keep their own layout
    (conv weights OIHW, transposed-conv weights IOHW, bias (C,)). value = q * 2**-fix_point."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "int8"
    fix_point: int | None = None
    data: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.shape = tuple(int(s) for s in self.shape)
        if self.data is not None:
            self.data = np.asarray(self.data)

    @property
    def is_const(self) -> bool:
        return self.data is not None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Tensor):
            return NotImplemented
        if (self.name, self.shape, self.dtype, self.fix_point) != (other.name, other.shape, other.dtype,
                                                                     other.fix_point):
            return False
        if self.data is None or other.data is None:
            return self.data is None and other.data is None
        return self.data.dtype == other.data.dtype and np.array_equal(self.data, other.data)

    __hash__ = None  # type: ignore[assignment]


@dataclass
class Op:
    """One coarse op. `params` maps a role ("weights", "bias", "alpha") to a constant tensor name;
    `source` lists the model node names the op was built from (for messages and reports)."""

    name: str
    type: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    source: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        # Tuples become lists so an op equals itself after a JSON round trip.
        self.attrs = {k: _listify(v) for k, v in self.attrs.items()}

    def where(self) -> str:
        """'op NAME (TYPE)', for error messages."""
        return f"op {self.name!r} ({self.type})"


@dataclass
class Subgraph:
    """A node of the XIR-like subgraph tree: the root holds children; leaves name the ops they hold."""

    name: str
    device: str = "root"
    ops: list[str] = field(default_factory=list)
    children: list[Subgraph] = field(default_factory=list)

    def leaves(self) -> list[Subgraph]:
        """Subgraphs without children, depth first."""
        if not self.children:
            return [self]
        out: list[Subgraph] = []
        for child in self.children:
            out.extend(child.leaves())
        return out


@dataclass
class Graph:
    """A coarse DPU graph: tensors by name, ops in topological order, graph inputs and outputs."""

    name: str
    tensors: dict[str, Tensor] = field(default_factory=dict)
    ops: list[Op] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    root: Subgraph | None = None

    # -- construction helpers -------------------------------------------------------------------------
    def add_tensor(self, tensor: Tensor) -> Tensor:
        if tensor.name in self.tensors:
            raise GraphError(f"graph {self.name!r}: tensor {tensor.name!r} defined twice")
        self.tensors[tensor.name] = tensor
        return tensor

    def add_op(self, op: Op) -> Op:
        self.ops.append(op)
        return op

    def op(self, name: str) -> Op:
        for op in self.ops:
            if op.name == name:
                return op
        raise GraphError(f"graph {self.name!r}: no op named {name!r}")

    def tensor(self, name: str, user: str = "") -> Tensor:
        try:
            return self.tensors[name]
        except KeyError:
            if user:
                raise GraphError(f"{user}: tensor {name!r} is not defined in graph {self.name!r}") from None
            raise GraphError(f"graph {self.name!r}: tensor {name!r} is not defined") from None

    def rename_tensor(self, old: str, new: str) -> None:
        """Give tensor `old` the name `new` everywhere this graph refers to it (ops, inputs, outputs)."""
        if new in self.tensors:
            raise GraphError(f"graph {self.name!r}: cannot rename {old!r} to {new!r}, which exists")
        t = self.tensor(old)
        del self.tensors[old]
        t.name = new
        self.tensors[new] = t
        for op in self.ops:
            op.inputs = [new if x == old else x for x in op.inputs]
            op.outputs = [new if x == old else x for x in op.outputs]
            op.params = {r: new if x == old else x for r, x in op.params.items()}
        self.inputs = [new if x == old else x for x in self.inputs]
        self.outputs = [new if x == old else x for x in self.outputs]

    def producers(self) -> dict[str, Op]:
        """Tensor name -> the op that writes it."""
        return {t: op for op in self.ops for t in op.outputs}

    def readers(self) -> dict[str, list[str]]:
        """Tensor name -> the names of the ops that read it, in op order (a tensor nobody reads is absent)."""
        out: dict[str, list[str]] = {}
        for op in self.ops:
            for t in op.inputs:
                out.setdefault(t, []).append(op.name)
        return out

    def extract(self, members: Sequence[str], name: str | None = None) -> "Graph":
        """The ops named in `members` as a graph of their own, in this graph's op order: feature maps they read
        but do not produce become its inputs (in first-use order), maps they produce that are read outside them
        (or are this graph's outputs) its outputs (in production order). Tensors are shared, not copied, so
        quantization (fix points) carries over."""
        names = set(members)
        unknown = names - {op.name for op in self.ops}
        if unknown:
            raise GraphError(f"graph {self.name!r}: no op(s) {sorted(unknown)[:5]} to extract")
        ops = [op for op in self.ops if op.name in names]
        produced = {t for op in ops for t in op.outputs}
        used_outside = {t for op in self.ops if op.name not in names for t in op.inputs} | set(self.outputs)
        inputs: list[str] = []
        for op in ops:
            for t in op.inputs:
                if not self.tensors[t].is_const and t not in produced and t not in inputs:
                    inputs.append(t)
        outputs = [t for op in ops for t in op.outputs if t in used_outside]
        used = set(inputs) | produced | {t for op in ops for t in op.inputs} | \
            {t for op in ops for t in op.params.values()}
        return Graph(name or f"{self.name}:{'+'.join(op.name for op in ops)}", {t: self.tensors[t] for t in used
                     if t in self.tensors}, ops, inputs, outputs)

    def param(self, op: Op, role: str, required: bool = True) -> Tensor | None:
        """The constant tensor bound to `role` of `op`, or None when optional and absent."""
        name = op.params.get(role)
        if name is None:
            if required:
                raise GraphError(f"{op.where()}: missing parameter {role!r}")
            return None
        t = self.tensor(name, op.where())
        if t.data is None:
            raise GraphError(f"{op.where()}: parameter {role!r} -> tensor {name!r} has no data")
        return t


def _listify(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_listify(v) for v in value]
    return value


def check_jsonable(value: Any, where: str) -> None:
    """Raise GraphError unless `value` is a JSON scalar (finite) or a (nested) list of them."""
    if value is None or isinstance(value, (bool, str)):
        return
    if isinstance(value, (int, np.integer)):
        return
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(float(value)):
            raise GraphError(f"{where}: non-finite float {value!r}")
        return
    if isinstance(value, (list, tuple)):
        for v in value:
            check_jsonable(v, where)
        return
    raise GraphError(f"{where}: value of type {type(value).__name__} is not a JSON scalar or list")
