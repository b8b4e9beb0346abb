"""vai_c's layer groups beside tvm-dpu's kernels: where a DPU subgraph's cycles, SAVEs and DDR bytes go, per group.

A vai_c DPU subgraph holds one child per layer group (the ops it runs together). Its one program is cut into
consecutive instruction ranges, one per group: a group's range starts at its first LOAD of one of its constants
(weights, biases; vai_c runs its groups one after another and keeps most maps on chip, so SAVEs cannot mark the
groups: a group's weights LOADed ahead while the one before computes shift the cut a little early). A group with
no constants (a lone pool, concat, upsample) is counted with the group before it.
tvm-dpu's program names its kernels' instruction ranges (CompiledSubgraph.op_ranges; a fused kernel's ops joined
by '+', each the rebuilt network's node, i.e. vai_c's op name, plus a suffix). A row joins the vai_c groups one of
our kernels spans (our pw_dw_pw_add covers vai_c's expand+depthwise group and its project+add group), so both
sides of a row compute the same ops. Both sides' figures come from the timing model on the whole program
(OpTiming: a range's cycles are how far its last completion lies beyond every earlier range's, so the rows add up
to the program's cycles), instructions per engine and the static DDR bytes of its LOADs and SAVEs.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Container

import numpy as np

from ..errors import DPUError
from .model import DpuSubgraph, XModel, XSubgraph

#: Instruction engines counted per row.
ENGINES = ("LOAD", "SAVE", "CONV", "MISC")
_NOT_RUN = ("const-fix", "upload", "download")


@dataclass
class GroupFigures:
    """One side's figures for a row."""
    cycles: float = 0.0
    instructions: dict[str, int] = field(default_factory=lambda: {e: 0 for e in ENGINES})
    ddr_read: int = 0
    ddr_write: int = 0

    def add(self, op: Any, engines: np.ndarray) -> None:
        """Add one timed range (simulate's OpTiming) whose instructions run on `engines` (indices into ENGINES)."""
        self.cycles += float(op.cycles)
        for i, e in enumerate(ENGINES):
            self.instructions[e] += int(np.sum(engines == i))
        self.ddr_read += int(op.ddr_read)
        self.ddr_write += int(op.ddr_write)


@dataclass
class GroupRow:
    """vai_c layer groups and our kernels that compute the same `ops` (vai_c's op names)."""
    groups: list[str]
    ops: list[str]
    kernels: list[str]
    vai_c: GroupFigures
    ours: GroupFigures

    @property
    def ratio(self) -> float | None:
        return self.ours.cycles / self.vai_c.cycles if self.vai_c.cycles else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio}


class _Union:
    def __init__(self, n: int):
        self.up = list(range(n))

    def find(self, i: int) -> int:
        while self.up[i] != i:
            self.up[i] = self.up[self.up[i]]
            i = self.up[i]
        return i

    def join(self, a: int, b: int) -> None:
        self.up[self.find(a)] = self.find(b)


def _run_ops(xm: XModel, g: XSubgraph) -> list[str]:
    return [o for o in g.all_ops() if xm.op(o).type not in _NOT_RUN]


def _extent(t: Any) -> tuple[int, int]:
    return t.ddr_addr, t.last_byte() + 1


def vai_c_ranges(xm: XModel, d: DpuSubgraph, groups: list[XSubgraph], isa: str) -> list[tuple[int, int]]:
    """Per group, its [first, end) instruction range in vai_c's program, decoded as instruction set `isa` (the
    arch's: ISA2's instructions are longer than ISA1's; see the module docstring; (0, 0) for a group that LOADs no
    constants of its own)."""
    from ..codegen.isa import decode_program

    places: list[tuple[int, int, int, int]] = []  # (reg_id, first byte, end byte, group) of each group's constants
    for k, g in enumerate(groups):
        for o in g.all_ops():
            t = xm.op(o).output
            if xm.op(o).type == "const-fix" and t.reg_id is not None and t.ddr_addr is not None:
                places.append((t.reg_id, *_extent(t), k))
    first = [-1] * len(groups)
    code = decode_program(np.frombuffer(d.mc_code, "<u4"), isa)
    for i, ins in enumerate(code):
        if ins.name == "LOAD":
            for reg, lo, hi, k in places:
                if first[k] < 0 and reg == ins["reg_id"] and lo <= ins["ddr_addr"] < hi:
                    first[k] = i
                    break
    starts = sorted((first[k], k) for k in range(len(groups)) if first[k] >= 0)
    out = [(0, 0)] * len(groups)
    for j, (i, k) in enumerate(starts):
        out[k] = (0 if j == 0 else i, starts[j + 1][0] if j + 1 < len(starts) else len(code))
    return out


def _op_of(part: str, known: Container[str]) -> str | None:
    """vai_c's op name one '+'-part of our kernel name was rebuilt from (the part minus its '__<op><n>' suffix)."""
    if part in known:
        return part
    head = part.rsplit("__", 1)[0]
    return head if head in known else None


def group_rows(xm: XModel, d: DpuSubgraph, code: np.ndarray, op_ranges: list[tuple[str, int, int]],
               arch: Any) -> list[GroupRow]:
    """Per-row figures of vai_c's DPU subgraph `d` against our program `code` with its kernels' `op_ranges` (one
    DPU partition), or [] when `d` has no layer groups. Raises DPUError (from the timing model) when either program
    cannot be timed."""
    from ..timing.simulate import simulate

    groups = [g for g in d.subgraph.children if _run_ops(xm, g)]
    if not groups or not op_ranges:
        return []
    owner = {op: k for k, g in enumerate(groups) for op in _run_ops(xm, g)}
    ranges = vai_c_ranges(xm, d, groups, arch.instruction_set)
    uf = _Union(len(groups))
    for k in range(1, len(groups)):  # a group without constants of its own: counted with the one before
        if ranges[k][0] == ranges[k][1]:
            uf.join(k, k - 1)
    mine = []
    for name, lo, hi in op_ranges:
        ks = sorted({owner[o] for o in (_op_of(p, owner) for p in name.split("+")) if o is not None})
        for k in ks[1:]:
            uf.join(ks[0], k)
        mine.append(ks[0] if ks else None)
    rows: dict[int, GroupRow] = {}
    for k, g in enumerate(groups):
        r = rows.setdefault(uf.find(k), GroupRow([], [], [], GroupFigures(), GroupFigures()))
        r.groups.append(g.name)
        r.ops += _run_ops(xm, g)
    _time(simulate(np.frombuffer(d.mc_code, "<u4"), arch, op_ranges=[(g.name, *rg) for g, rg in zip(groups, ranges)]),
          [rows[uf.find(k)].vai_c for k in range(len(groups))])
    orphan = GroupRow([], [], [], GroupFigures(), GroupFigures())  # kernels of no vai_c group (none expected)
    targets = [rows[uf.find(k)] if k is not None else orphan for k in mine]
    for r, (name, _, _) in zip(targets, op_ranges):
        r.kernels.append(name)
    _time(simulate(code, arch, op_ranges=op_ranges), [r.ours for r in targets])
    return [rows[k] for k in dict.fromkeys(uf.find(k) for k in range(len(groups)))] + \
        ([orphan] if orphan.kernels else [])


def _time(result: Any, into: list[GroupFigures]) -> None:
    engines = np.asarray(result.engine_of)
    for op, fig in zip(result.ops, into):
        fig.add(op, engines[op.first:op.end])


def try_group_rows(xm: XModel, d: DpuSubgraph, code: np.ndarray, op_ranges: list[tuple[str, int, int]],
                   arch: Any) -> tuple[list[GroupRow], str | None]:
    """group_rows, or ([], why) when a program cannot be timed."""
    try:
        return group_rows(xm, d, code, op_ranges, arch), None
    except DPUError as e:
        return [], f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
