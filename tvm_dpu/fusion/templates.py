"""Fusion templates as patterns (DNNVM 4.1, Fig. 3/4): a small query graph per template, from the template registry
(tvm_dpu/templates/: each template's module holds its `Pattern`).

A template is a set of query vertices (allowed op types + named constraints) and directed query edges
(producer -> consumer through a feature map). A vertex with ``member=False`` anchors the pattern but is not part
of the fused group (the shared input of a horizontal fusion). Constraints are names looked up in
`CONSTRAINTS`; each is a predicate over one op of the `OpGraph` (graph.py of this package), so the same
labelling serves Algorithm 1 and the networkx VF2 cross-check.

Concat fusion is not a template here: whether a producer SAVEs straight into its concat slice is a per-edge
decision without conflicts (see select.concat_fusions).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import tvm_dpu.templates as tpl
from tvm_dpu.fusion.opgraph import OpGraph
from tvm_dpu.templates import QueryVertex
from tvm_dpu.xgraph import ops as xops


@dataclass(frozen=True)
class Template:
    name: str
    kind: str  # "vertical" (chain of linear edges), "eltwise" (conv + add at a barrier), "horizontal"
    vertices: tuple[QueryVertex, ...]
    edges: tuple[tuple[str, str], ...]

    def vertex(self, key: str) -> QueryVertex:
        for v in self.vertices:
            if v.key == key:
                return v
        raise KeyError(key)


def _conv_plain(og: OpGraph, name: str) -> bool:
    op = og.ops[name]
    return (op.type == "conv2d" and xops.attr(op, "groups") == 1
            and tuple(xops.attr(op, "dilations")) == (1, 1))


def _single_consumer(og: OpGraph, name: str) -> bool:
    """The op's output feeds exactly one op and is not a graph output: it may stay on chip."""
    return og.n_consumers(name) == 1 and not og.is_graph_output(name)


def _pointwise(og: OpGraph, name: str) -> bool:
    op = og.ops[name]
    if op.type != "conv2d":
        return False
    w = og.graph.tensors[op.params["weights"]].shape
    return (tuple(w[2:]) == (1, 1) and tuple(xops.attr(op, "strides")) == (1, 1)
            and tuple(xops.attr(op, "pads")) == (0, 0, 0, 0))


def _add2(og: OpGraph, name: str) -> bool:
    op = og.ops[name]
    return op.type == "eltwise_add" and len(op.inputs) == 2 and op.inputs[0] != op.inputs[1]


CONSTRAINTS: dict[str, Callable[[OpGraph, str], bool]] = {
    "conv_plain": _conv_plain,
    "single_consumer": _single_consumer,
    "pointwise": _pointwise,
    "add2": _add2,
}

#: The templates Algorithm 1 matches (those of the registry with a pattern), in greedy priority order (a GPP
#: compiler tries them in a fixed order).
TEMPLATES: tuple[Template, ...] = tuple(Template(d.name, d.pattern.kind, d.pattern.vertices, d.pattern.edges)
                                        for d in tpl.matched() if d.pattern is not None)


def vertex_ok(og: OpGraph, v: QueryVertex, name: str) -> bool:
    """T(u) == T(v) and every constraint of v holds for op `name` (FilterCandidates / Matching)."""
    return og.type_of(name) in v.types and all(CONSTRAINTS[c](og, name) for c in v.constraints)
