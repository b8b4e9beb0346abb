"""Fusion templates as data (DNNVM 4.1, Fig. 3/4): a small pattern graph per template.

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

from tvm_dpu.fusion.opgraph import INPUT, OpGraph
from tvm_dpu.xgraph import ops as xops


@dataclass(frozen=True)
class QueryVertex:
    key: str
    types: frozenset[str]
    constraints: tuple[str, ...] = ()
    member: bool = True


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

_CONV = frozenset({"conv2d"})
_POOL = frozenset({"max_pool2d", "avg_pool2d"})
_ANY = frozenset({INPUT, "conv2d", "depthwise_conv2d", "conv2d_transpose", "dense", "max_pool2d", "avg_pool2d",
                  "eltwise_add", "eltwise_mul", "concat", "upsample_nearest", "activation"})


def _v(key: str, types: frozenset[str], *constraints: str, member: bool = True) -> QueryVertex:
    return QueryVertex(key, types, tuple(constraints), member)


#: All templates, in greedy priority order (a GPP compiler tries them in a fixed order).
TEMPLATES: tuple[Template, ...] = (
    Template("conv_pool", "vertical",
             (_v("conv", _CONV, "conv_plain", "single_consumer"), _v("pool", _POOL)), (("conv", "pool"),)),
    Template("conv_conv", "vertical",
             (_v("conv1", _CONV, "conv_plain", "single_consumer"), _v("conv2", _CONV, "conv_plain")),
             (("conv1", "conv2"),)),
    Template("conv_add", "eltwise",
             (_v("conv", _CONV, "conv_plain", "single_consumer"), _v("add", frozenset({"eltwise_add"}), "add2")),
             (("conv", "add"),)),
    Template("dw_pw", "vertical",
             (_v("dw", frozenset({"depthwise_conv2d"}), "single_consumer"), _v("pw", _CONV, "pointwise")),
             (("dw", "pw"),)),
    Template("pw_dw", "vertical",
             (_v("pw", _CONV, "pointwise", "single_consumer"), _v("dw", frozenset({"depthwise_conv2d"}))),
             (("pw", "dw"),)),
    # after pw_dw, so greedy groups as it did before this template existed and the search's in-context check
    # (select._in_context) compares the two in their program, where a following op can wait for the whole chain
    Template("pw_dw_pw", "vertical",
             (_v("pw", _CONV, "conv_plain", "single_consumer"),
              _v("dw", frozenset({"depthwise_conv2d"}), "single_consumer"), _v("pw2", _CONV, "pointwise")),
             (("pw", "dw"), ("dw", "pw2"))),
    # the inverted-residual block whole: the chain above with the add its project conv feeds (a special case at the
    # add's barrier, as conv_add is: its chain is the whole linear path into the add)
    Template("pw_dw_pw_add", "eltwise",
             (_v("pw", _CONV, "conv_plain", "single_consumer"),
              _v("dw", frozenset({"depthwise_conv2d"}), "single_consumer"),
              _v("pw2", _CONV, "pointwise", "single_consumer"), _v("add", frozenset({"eltwise_add"}), "add2")),
             (("pw", "dw"), ("dw", "pw2"), ("pw2", "add"))),
    Template("hconv2", "horizontal",
             (_v("src", _ANY, member=False), _v("a", _CONV, "conv_plain"), _v("b", _CONV, "conv_plain")),
             (("src", "a"), ("src", "b"))),
    Template("hconv3", "horizontal",
             (_v("src", _ANY, member=False), _v("a", _CONV, "conv_plain"), _v("b", _CONV, "conv_plain"),
              _v("c", _CONV, "conv_plain")),
             (("src", "a"), ("src", "b"), ("src", "c"))),
)


def vertex_ok(og: OpGraph, v: QueryVertex, name: str) -> bool:
    """T(u) == T(v) and every constraint of v holds for op `name` (FilterCandidates / Matching)."""
    return og.type_of(name) in v.types and all(CONSTRAINTS[c](og, name) for c in v.constraints)
