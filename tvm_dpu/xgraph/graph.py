"""XGraph: the coarse DPU graph (tensors with power-of-two fix_points, coarse ops, a subgraph tree).

A DPU subgraph of the model becomes one `Graph`: int8 feature maps in logical NCHW layout, int8 constants
(weights, biases, slopes) with their own fix_points, and coarse ops in topological order. Op attributes are
JSON-able scalars and lists only, so a graph serializes without pickle (see `serialize.py`). The op types,
their attributes and shape rules are listed in `ops.py`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

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

    def producers(self) -> dict[str, Op]:
        """Tensor name -> the op that writes it."""
        return {t: op for op in self.ops for t in op.outputs}

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

    # -- validation -----------------------------------------------------------------------------------
    def validate(self) -> None:
        """Check the graph and raise `GraphError` naming the first offending op or tensor.

        Checks: tensor names, dtypes and constant data; a fix_point on every int8 tensor; op types, attributes
        and parameters; dangling inputs; single producer per tensor; no cycle and topological op order;
        inferred output shapes equal the declared ones; graph outputs produced; the subgraph tree.
        """
        from tvm_dpu.xgraph import ops as opspec  # ops.py imports this module

        for key, t in self.tensors.items():
            self._check_tensor(key, t)
        names = [op.name for op in self.ops]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise GraphError(f"graph {self.name!r}: op name(s) {sorted(dup)} used more than once")
        for name in self.inputs:
            t = self.tensor(name, "graph inputs")
            if t.is_const:
                raise GraphError(f"graph {self.name!r}: input {name!r} is a constant")

        producer: dict[str, Op] = {}
        for op in self.ops:
            for out in op.outputs:
                t = self.tensor(out, op.where())
                if out in producer:
                    raise GraphError(f"{op.where()}: tensor {out!r} is already written by op {producer[out].name!r}")
                if out in self.inputs or t.is_const:
                    raise GraphError(f"{op.where()}: writes {out!r}, which is a graph input or a constant")
                producer[out] = op
        self._check_acyclic(producer)

        available = set(self.inputs) | {n for n, t in self.tensors.items() if t.is_const}
        for op in self.ops:
            for inp in op.inputs:
                self.tensor(inp, op.where())
                if inp not in available:
                    if inp in producer:
                        raise GraphError(f"{op.where()}: input {inp!r} is produced later by op "
                                         f"{producer[inp].name!r}; ops must be in topological order")
                    raise GraphError(f"{op.where()}: dangling input {inp!r} (not a graph input, a constant, "
                                     "or the output of any op)")
            for role, pname in op.params.items():
                if pname not in self.tensors:
                    raise GraphError(f"{op.where()}: parameter {role!r} -> tensor {pname!r} is not defined")
                if not self.tensors[pname].is_const:
                    raise GraphError(f"{op.where()}: parameter {role!r} -> tensor {pname!r} has no data")
            opspec.check_op(op, self)
            available.update(op.outputs)

        for name in self.outputs:
            self.tensor(name, "graph outputs")
            if name not in available:
                raise GraphError(f"graph {self.name!r}: output {name!r} is never produced")
        if self.root is not None:
            self._check_subgraphs()

    def _check_tensor(self, key: str, t: Tensor) -> None:
        if key != t.name:
            raise GraphError(f"graph {self.name!r}: tensor stored under {key!r} is named {t.name!r}")
        if t.dtype not in DTYPES:
            raise GraphError(f"tensor {t.name!r}: dtype {t.dtype!r} is not one of {DTYPES}")
        if any(s <= 0 for s in t.shape):
            raise GraphError(f"tensor {t.name!r}: shape {t.shape} has a non-positive dimension")
        if t.dtype == "int8" and t.fix_point is None:
            raise GraphError(f"tensor {t.name!r}: int8 tensor without fix_point")
        if t.fix_point is not None and not isinstance(t.fix_point, (int, np.integer)):
            raise GraphError(f"tensor {t.name!r}: fix_point {t.fix_point!r} is not an integer")
        if t.data is not None:
            if t.data.dtype != np.dtype(t.dtype):
                raise GraphError(f"tensor {t.name!r}: data dtype {t.data.dtype} != declared {t.dtype}")
            if tuple(t.data.shape) != t.shape:
                raise GraphError(f"tensor {t.name!r}: data shape {tuple(t.data.shape)} != declared {t.shape}")

    def _check_acyclic(self, producer: dict[str, Op]) -> None:
        deps = {op.name: {producer[i].name for i in op.inputs if i in producer} for op in self.ops}
        state: dict[str, int] = {}  # 1 = on the DFS stack, 2 = done
        for start in deps:
            if state.get(start):
                continue
            stack: list[tuple[str, list[str]]] = [(start, sorted(deps[start]))]
            state[start] = 1
            while stack:
                node, todo = stack[-1]
                if not todo:
                    state[node] = 2
                    stack.pop()
                    continue
                nxt = todo.pop()
                if state.get(nxt) == 1:
                    cycle = [n for n, _ in stack]
                    cycle = cycle[cycle.index(nxt):] + [nxt]
                    raise GraphError(f"graph {self.name!r}: cycle through ops {' -> '.join(cycle)}")
                if not state.get(nxt):
                    state[nxt] = 1
                    stack.append((nxt, sorted(deps[nxt])))

    def _check_subgraphs(self) -> None:
        assert self.root is not None
        known = {op.name for op in self.ops}
        owner: dict[str, str] = {}
        todo = [self.root]
        while todo:
            sg = todo.pop()
            if sg.device not in DEVICES:
                raise GraphError(f"subgraph {sg.name!r}: device {sg.device!r} is not one of {DEVICES}")
            if sg.children and sg.ops:
                raise GraphError(f"subgraph {sg.name!r}: has both children and ops; ops belong to leaves")
            for name in sg.ops:
                if name not in known:
                    raise GraphError(f"subgraph {sg.name!r}: unknown op {name!r}")
                if name in owner:
                    raise GraphError(f"subgraph {sg.name!r}: op {name!r} already in subgraph {owner[name]!r}")
                owner[name] = sg.name
            todo.extend(reversed(sg.children))  # depth first, in order: the later duplicate is reported


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
