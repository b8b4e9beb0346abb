"""Validation of an XGraph: its structure (names, dtypes, fix_points, producers, topological order, subgraph
tree) and every op against its spec (ops.check_op).

A function of its own, not a Graph method, because the op specs (ops.py) are built on graph.py: the structure
sits below the op semantics, and validation needs both."""
from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from tvm_dpu.xgraph import ops as opspec
from tvm_dpu.xgraph.graph import DEVICES, DTYPES, Graph, GraphError, Op, Tensor


def validate_graph(graph: Graph) -> None:
    """Check the graph and raise `GraphError` naming the first offending op or tensor.

    Checks: tensor names, dtypes and constant data; a fix_point on every int8 tensor; op types, attributes
    and parameters; dangling inputs; single producer per tensor; no cycle and topological op order;
    inferred output shapes equal the declared ones; graph outputs produced; the subgraph tree.
    """
    for key, t in graph.tensors.items():
        _check_tensor(graph, key, t)
    names = [op.name for op in graph.ops]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise GraphError(f"graph {graph.name!r}: op name(s) {sorted(dup)} used more than once")
    for name in graph.inputs:
        t = graph.tensor(name, "graph inputs")
        if t.is_const:
            raise GraphError(f"graph {graph.name!r}: input {name!r} is a constant")

    producer: dict[str, Op] = {}
    for op in graph.ops:
        for out in op.outputs:
            t = graph.tensor(out, op.where())
            if out in producer:
                raise GraphError(f"{op.where()}: tensor {out!r} is already written by op {producer[out].name!r}")
            if out in graph.inputs or t.is_const:
                raise GraphError(f"{op.where()}: writes {out!r}, which is a graph input or a constant")
            producer[out] = op
    _check_acyclic(graph, producer)

    available = set(graph.inputs) | {n for n, t in graph.tensors.items() if t.is_const}
    for op in graph.ops:
        for inp in op.inputs:
            graph.tensor(inp, op.where())
            if inp not in available:
                if inp in producer:
                    raise GraphError(f"{op.where()}: input {inp!r} is produced later by op "
                                     f"{producer[inp].name!r}; ops must be in topological order")
                raise GraphError(f"{op.where()}: dangling input {inp!r} (not a graph input, a constant, "
                                 "or the output of any op)")
        for role, pname in op.params.items():
            if pname not in graph.tensors:
                raise GraphError(f"{op.where()}: parameter {role!r} -> tensor {pname!r} is not defined")
            if not graph.tensors[pname].is_const:
                raise GraphError(f"{op.where()}: parameter {role!r} -> tensor {pname!r} has no data")
        opspec.check_op(op, graph)
        available.update(op.outputs)

    for name in graph.outputs:
        graph.tensor(name, "graph outputs")
        if name not in available:
            raise GraphError(f"graph {graph.name!r}: output {name!r} is never produced")
    if graph.root is not None:
        _check_subgraphs(graph)

def validate_feeds(graph: Graph, feeds: Mapping[str, Any]) -> None:
    """`validate_graph`, then GraphError unless `feeds` names exactly the graph's inputs (the reference
    interpreters' entry check; each then checks the values' dtype and shape its own way)."""
    validate_graph(graph)
    missing = [n for n in graph.inputs if n not in feeds]
    if missing:
        raise GraphError(f"graph {graph.name!r}: no feed for input(s) {missing}")
    extra = [n for n in feeds if n not in graph.inputs]
    if extra:
        raise GraphError(f"graph {graph.name!r}: feed(s) {extra} are not graph inputs")


def run_ops(graph: Graph, env: dict[str, Any], step: Callable[[Op, Graph, dict[str, Any]], dict[str, Any]],
            keep_all: bool) -> dict[str, Any]:
    """Run every op of `graph` in order with `step(op, graph, env) -> {output: value}` on the fed `env` (see
    `validate_feeds`); the graph outputs by name, or every tensor computed with keep_all=True."""
    for op in graph.ops:
        env.update(step(op, graph, env))
    if keep_all:
        return env
    return {name: env[name] for name in graph.outputs}


def _check_tensor(graph: Graph, key: str, t: Tensor) -> None:
    if key != t.name:
        raise GraphError(f"graph {graph.name!r}: tensor stored under {key!r} is named {t.name!r}")
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

def _check_acyclic(graph: Graph, producer: dict[str, Op]) -> None:
    deps = {op.name: {producer[i].name for i in op.inputs if i in producer} for op in graph.ops}
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
                raise GraphError(f"graph {graph.name!r}: cycle through ops {' -> '.join(cycle)}")
            if not state.get(nxt):
                state[nxt] = 1
                stack.append((nxt, sorted(deps[nxt])))

def _check_subgraphs(graph: Graph) -> None:
    assert graph.root is not None
    known = {op.name for op in graph.ops}
    owner: dict[str, str] = {}
    todo = [graph.root]
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
