"""vai_c's layer groups beside tvm-dpu's ops: where a DPU subgraph's cycles, SAVEs and DDR bytes go, per group.

vai_c's xmodels hold, under each DPU subgraph, one child per layer group (the ops it runs together), most with
their own machine code (`mc_code`). tvm-dpu's program names its ops' instruction ranges (CompiledSubgraph.op_ranges,
fused kernels' ops joined by '+'; each name is the rebuilt network's node, i.e. vai_c's op name, plus a suffix).
A row joins the vai_c groups that one of our kernels spans (our pw_dw_pw covers vai_c's expand+depthwise group and
the next project group), so both sides of a row compute the same ops. vai_c's figures are its groups' own programs
on the timing model (each alone: no overlap with the neighbours); ours are the timing model's per-op figures of our
whole program (OpTiming.cycles: how far the op's last completion lies beyond every earlier op's).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import DPUError
from .model import DpuSubgraph, XModel

#: Instruction engines counted per group.
_ENGINES = ("LOAD", "SAVE", "CONV", "MISC")


@dataclass
class GroupFigures:
    """One side's figures for a row: cycles on the timing model, instructions per engine, DDR bytes (static: the
    LOADs' and SAVEs' sizes)."""
    cycles: float = 0.0
    instructions: dict[str, int] = field(default_factory=lambda: {e: 0 for e in _ENGINES})
    ddr_read: int = 0
    ddr_write: int = 0

    def add(self, cycles: float, engines: np.ndarray, ddr_read: int, ddr_write: int) -> None:
        self.cycles += float(cycles)
        for i, e in enumerate(_ENGINES):
            self.instructions[e] += int(np.sum(engines == i))
        self.ddr_read += int(ddr_read)
        self.ddr_write += int(ddr_write)


@dataclass
class GroupRow:
    """vai_c layer groups (names) and our kernels (names) that compute the same ops."""
    groups: list[str]
    ops: list[str]
    kernels: list[str]
    vai_c: GroupFigures
    ours: GroupFigures

    @property
    def ratio(self) -> float | None:
        return self.ours.cycles / self.vai_c.cycles if self.vai_c.cycles else None

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {**asdict(self), "ratio": self.ratio}


def _op_of(kernel_part: str, known: set[str]) -> str | None:
    """vai_c's op name that one '+'-part of our op-range name was rebuilt from (the part minus its '__<op><n>'
    suffix), or None."""
    if kernel_part in known:
        return kernel_part
    head = kernel_part.rsplit("__", 1)[0]
    return head if head in known else None


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


def _engine_index(engine_of: np.ndarray, lo: int, hi: int) -> np.ndarray:
    return np.asarray(engine_of[lo:hi])


def group_rows(xm: XModel, d: DpuSubgraph, code: np.ndarray, op_ranges: list[tuple[str, int, int]],
               arch: Any) -> list[GroupRow]:
    """Per-group rows of vai_c's DPU subgraph `d` against our program `code` with its `op_ranges` (one DPU
    partition), or [] when `d` has no layer groups with machine code. Raises DPUError (from the timing model) when
    either program cannot be timed."""
    from ..timing.simulate import simulate

    groups = [c for c in d.subgraph.children if isinstance(c.attrs.get("mc_code"), (bytes, bytearray))
              and c.attrs["mc_code"]]
    if not groups or not op_ranges:
        return []
    owner = {op: i for i, g in enumerate(groups) for op in g.ops}
    known = set(owner)
    uf = _Union(len(groups))
    kernels: list[tuple[str, int, int, int | None]] = []  # (name, lo, hi, a group it computes)
    for name, lo, hi in op_ranges:
        gs = sorted({owner[o] for o in (_op_of(p, known) for p in name.split("+")) if o is not None})
        for g in gs[1:]:
            uf.join(gs[0], g)
        kernels.append((name, lo, hi, gs[0] if gs else None))
    rows: dict[int, GroupRow] = {}
    for i, g in enumerate(groups):
        r = rows.setdefault(uf.find(i), GroupRow([], [], [], GroupFigures(), GroupFigures()))
        r.groups.append(g.name)
        r.ops += [o for o in g.ops if xm.op(o).type != "const-fix"]
        t = simulate(np.frombuffer(bytes(g.attrs["mc_code"]), "<u4"), arch)
        r.vai_c.add(t.cycles, t.engine_of, t.ddr_read_bytes, t.ddr_write_bytes)
    ours = simulate(code, arch, op_ranges=[(n, lo, hi) for n, lo, hi, _ in kernels])
    orphan = GroupRow(["(none)"], [], [], GroupFigures(), GroupFigures())
    for (name, lo, hi, g), op in zip(kernels, ours.ops):
        r = rows[uf.find(g)] if g is not None else orphan
        r.kernels.append(name)
        r.ours.add(op.cycles, _engine_index(ours.engine_of, lo, hi), op.ddr_read, op.ddr_write)
    out = [rows[k] for k in sorted(rows, key=lambda k: min(groups.index(next(x for x in groups if x.name == n))
                                                           for n in rows[k].groups))]
    return out + ([orphan] if orphan.kernels else [])


def try_group_rows(xm: XModel, d: DpuSubgraph, code: np.ndarray, op_ranges: list[tuple[str, int, int]],
                   arch: Any) -> tuple[list[GroupRow], str | None]:
    """group_rows, or ([], why) when a program cannot be timed."""
    try:
        return group_rows(xm, d, code, op_ranges, arch), None
    except DPUError as e:
        return [], f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
