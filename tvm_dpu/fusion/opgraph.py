"""The op-level view of an XGraph that fusion works on: ops as vertices, feature-map dataflow as edges.

Each graph input becomes a pseudo vertex of type `INPUT` (named "input:<tensor>"), so convs that share a graph
input can be fused horizontally like convs sharing an op's output.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tvm_dpu.xgraph.graph import Graph, Op

INPUT = "input"


@dataclass
class OpGraph:
    graph: Graph
    ops: dict[str, Op] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # vertices, topological (pseudo inputs first)
    succ: dict[str, list[str]] = field(default_factory=dict)
    pred: dict[str, list[str]] = field(default_factory=dict)
    by_type: dict[str, list[str]] = field(default_factory=dict)
    _outputs: set[str] = field(default_factory=set)

    @staticmethod
    def of(graph: Graph) -> "OpGraph":
        og = OpGraph(graph)
        producer: dict[str, str] = {}
        for t in graph.inputs:
            v = f"{INPUT}:{t}"
            producer[t] = v
            og._add(v, INPUT)
        for op in graph.ops:
            og.ops[op.name] = op
            og._add(op.name, op.type)
            for t in op.outputs:
                producer[t] = op.name
        for op in graph.ops:
            seen: set[str] = set()
            for t in op.inputs:
                p = producer.get(t)
                if p is None or p in seen:
                    continue  # constants; a tensor read twice is one edge
                seen.add(p)
                og.succ[p].append(op.name)
                og.pred[op.name].append(p)
        og._outputs = {producer[t] for t in graph.outputs if t in producer}
        return og

    def _add(self, v: str, type_: str) -> None:
        self.order.append(v)
        self.succ[v] = []
        self.pred[v] = []
        self.by_type.setdefault(type_, []).append(v)

    def type_of(self, v: str) -> str:
        op = self.ops.get(v)
        return op.type if op is not None else INPUT

    def n_consumers(self, v: str) -> int:
        return len(self.succ[v])

    def is_graph_output(self, v: str) -> bool:
        return v in self._outputs

    def is_barrier(self, v: str) -> bool:
        """DNNVM 5.2: an op that depends on several ops or that several ops depend on."""
        return len(self.pred[v]) > 1 or len(self.succ[v]) > 1

    def to_networkx(self):
        """networkx.DiGraph with the same vertices and edges (for the VF2 cross-check)."""
        import networkx as nx

        g = nx.DiGraph()
        for v in self.order:
            g.add_node(v)
        for u, vs in self.succ.items():
            for v in vs:
                g.add_edge(u, v)
        return g
