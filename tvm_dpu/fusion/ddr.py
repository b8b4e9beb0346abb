"""The fusion search's DDR-bytes tie-break (issue 36 item 3).

The search minimises cycles on the timing model. Where two groupings of the same ops come out nearly equal, the
one that moves fewer feature-map bytes through DDR is the better program beyond the model: DDR bandwidth is
shared with the other DPU cores and the CPU, so bytes not moved are time another master gets back, and the
timing model's own DDR figures are its least certain (docs/timing-model.md). The rule:

    Among the options a decision compares, those within DDR_TIE (1%) of the fastest option's cycles are
    ties; of those, the one moving the fewest DDR bytes wins (then the fewest cycles, then the option listed
    first, i.e. the current choice, so repeated sweeps settle).

The search applies it where it compares whole alternatives: each barrier's special cases against each other and
against none (select._Search.run, the cycles being the option's group and every path it touches), and each region
settled in context (select._in_context). The shortest paths inside a linear path stay pure cycles: a tolerance is
not additive.

A grouping's DDR bytes (`DdrBytes`) are those of the feature maps each of its groups reads from or writes to DDR,
each map once per group: the inputs it takes from outside the group and the outputs a later group or the graph
output needs. Maps produced and consumed inside a fused group stay in the banks (codegen.compiler._on_chip_maps
keeps exactly those on chip), parameters are the same in every grouping and left out, and so are the re-reads a
group's tiling makes (halo rows and columns), which the estimate does not model.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TypeVar

from tvm_dpu.types import Group
from tvm_dpu.xgraph.graph import Graph

#: Options within this fraction of the fastest option's cycles are ties, settled by DDR bytes.
DDR_TIE = 0.01

T = TypeVar("T")


class DdrBytes:
    """DDR bytes of groupings of one graph's ops (cached per group)."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.readers: dict[str, set[str]] = {}
        for op in graph.ops:
            for t in op.inputs:
                self.readers.setdefault(t, set()).add(op.name)
        self.outputs = frozenset(graph.outputs)
        self._cache: dict[tuple[str, ...], int] = {}

    def _nbytes(self, tensor: str) -> int:
        return math.prod(self.graph.tensors[tensor].shape)

    def group(self, g: Group) -> int:
        """Bytes of the feature maps group `g` takes from DDR and leaves there."""
        hit = self._cache.get(g.ops)
        if hit is not None:
            return hit
        members = set(g.ops)
        ops = [self.graph.op(n) for n in g.ops]
        made = {t for op in ops for t in op.outputs}
        ins = {t for op in ops for t in op.inputs if t not in made and not self.graph.tensors[t].is_const}
        outs = {t for t in made if t in self.outputs or self.readers.get(t, set()) - members}
        n = self._cache[g.ops] = sum(self._nbytes(t) for t in ins | outs)
        return n

    def of(self, groups: Iterable[Group]) -> int:
        """Bytes of a grouping (the sum over its groups)."""
        return sum(self.group(g) for g in groups)


def prefer(options: Sequence[tuple[T, float, int]]) -> T:
    """The option the rule picks among (option, cycles, DDR bytes) triples (see the module docstring)."""
    fastest = min(c for _, c, _ in options)
    if math.isinf(fastest):
        return options[0][0]
    ties = [(b, c, i) for i, (_, c, b) in enumerate(options) if c <= fastest * (1 + DDR_TIE) + 1e-9]
    return options[min(ties)[2]][0]
