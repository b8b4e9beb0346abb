"""DNNVM Algorithm 1: all embeddings of the fusion templates in an XGraph (subgraph monomorphism).

FilterCandidates keeps the graph vertices with the query vertex's type and constraints; the search starts at the
query vertex with the fewest candidates (the rarest type); NextQueryVertex follows a breadth-first order of the
template; RefineCandidates keeps only neighbours (in the edge's direction) of an already matched vertex; Matching
checks injectivity and that every query edge to an already matched vertex exists in the graph.
`embeddings_vf2` computes the same set with networkx's VF2 matcher (the tests compare the two).
"""
from __future__ import annotations

from collections import deque

from tvm_dpu.fusion.opgraph import OpGraph
from tvm_dpu.fusion.templates import TEMPLATES, Template, vertex_ok

Embedding = dict[str, str]  # query vertex key -> graph vertex


def _bfs_order(t: Template, start: str) -> list[tuple[str, str | None, bool]]:
    """[(query vertex, matched neighbour to refine from, True if the edge goes neighbour -> vertex)]."""
    adj: dict[str, list[tuple[str, bool]]] = {v.key: [] for v in t.vertices}
    for a, b in t.edges:
        adj[a].append((b, True))
        adj[b].append((a, False))
    order = [(start, None, True)]
    seen = {start}
    todo = deque([start])
    while todo:
        u = todo.popleft()
        for w, forward in adj[u]:
            if w not in seen:
                seen.add(w)
                order.append((w, u, forward))
                todo.append(w)
    if len(order) != len(t.vertices):
        raise ValueError(f"template {t.name!r} is not connected")
    return order


def find_embeddings(t: Template, og: OpGraph) -> list[Embedding]:
    """All embeddings of template `t` in `og` (one per injective vertex mapping)."""
    cands: dict[str, list[str]] = {}
    for v in t.vertices:  # FilterCandidates
        pool = [u for ty in sorted(v.types) for u in og.by_type.get(ty, ())]
        cands[v.key] = [u for u in pool if vertex_ok(og, v, u)]
        if not cands[v.key]:
            return []
    start = min(t.vertices, key=lambda v: (len(cands[v.key]), v.key)).key  # DefineStartPoint: rarest
    order = _bfs_order(t, start)
    cand_sets = {k: set(c) for k, c in cands.items()}
    edges = set(t.edges)
    out: list[Embedding] = []
    m: Embedding = {}
    used: set[str] = set()

    def matching(key: str, u: str) -> bool:
        if u in used:
            return False
        for other, g in m.items():
            if (key, other) in edges and g not in og.succ[u]:
                return False
            if (other, key) in edges and u not in og.succ[g]:
                return False
        return True

    def search(depth: int) -> None:
        if depth == len(order):
            out.append(dict(m))
            return
        key, nbr, forward = order[depth]
        if nbr is None:
            refined = cands[key]
        else:  # RefineCandidates: adjacent to the matched neighbour, in the edge's direction
            g = m[nbr]
            refined = [u for u in (og.succ[g] if forward else og.pred[g]) if u in cand_sets[key]]
        for u in refined:
            if matching(key, u):
                m[key] = u
                used.add(u)
                search(depth + 1)
                del m[key]
                used.discard(u)

    search(0)
    return out


def all_embeddings(og: OpGraph, templates: tuple[Template, ...] = TEMPLATES) -> dict[str, list[Embedding]]:
    """Template name -> its embeddings."""
    return {t.name: find_embeddings(t, og) for t in templates}


def embeddings_vf2(t: Template, og: OpGraph, nxg=None) -> list[Embedding]:
    """The same embeddings by networkx's VF2 (subgraph monomorphism with node matching)."""
    import networkx as nx
    from networkx.algorithms.isomorphism import DiGraphMatcher

    q = nx.DiGraph()
    for v in t.vertices:
        q.add_node(v.key, qv=v)
    q.add_edges_from(t.edges)
    g = nxg if nxg is not None else og.to_networkx()
    for v in g.nodes:
        g.nodes[v]["name"] = v
    matcher = DiGraphMatcher(g, q, node_match=lambda gn, qn: vertex_ok(og, qn["qv"], gn["name"]))
    return [{qk: gv for gv, qk in mapping.items()} for mapping in matcher.subgraph_monomorphisms_iter()]
