"""How a sliding-window op's input rows sit in an image bank group, and how big a tile may be.

The engines fetch input rows with the row-fetch rule of isa1-semantics.md 3.3: fetched row h of an instruction
(stride S, offset 0, first bank b0 = 0 of the group) lives in bank `(h // S) % PP` at row
`A[(h // S) // PP] + (h % S) * E + x * J`. We always place a tile that way, with the wrap bases
`A[g] = base + g * S * E`, so a tile of fetched rows occupies `G * S * E` rows of every bank of the group, where
G is the number of bank wraps (at most 4: the instruction has four base addresses).
"""
from __future__ import annotations

from dataclasses import dataclass

from tvm_dpu.codegen.layout import ceil_div
from tvm_dpu.errors import DPUError


class CodegenError(DPUError):
    """An op the code generator cannot map onto the banks/fields of the selected DPU (names op and reason)."""


#: Maximum number of bank wraps one fetch may span (bank_addr_in, _1, _2, _3).
MAX_WRAPS = 4


@dataclass(frozen=True)
class RowPlacement:
    """Placement of the fetched rows of one tile in an image bank group."""

    pp: int  # banks in the group
    stride: int  # S: stride_h of the consuming instruction
    endl: int  # E: rows between the line slots of one bank (= pixels per line * channel groups)
    pitch: int  # J: rows between consecutive pixels of a line (= channel groups)
    base: int  # A[0]

    def wraps(self, n_rows: int) -> int:
        """Bank wraps G needed by `n_rows` fetched rows."""
        return ((n_rows - 1) // self.stride) // self.pp + 1

    def footprint(self, n_rows: int) -> int:
        """Rows of every bank the tile occupies."""
        return self.wraps(n_rows) * self.stride * self.endl

    def bases(self) -> list[int]:
        """bank_addr_in, _1, _2, _3."""
        return [self.base + g * self.stride * self.endl for g in range(MAX_WRAPS)]

    def where(self, h: int) -> tuple[int, int]:
        """(bank index within the group, bank row of pixel 0) of fetched row h."""
        k = h // self.stride
        return k % self.pp, self.base + (k // self.pp) * self.stride * self.endl + (h % self.stride) * self.endl


def max_valid_rows(pp: int, vpp_max: int, kh: int, sh: int) -> int:
    """Largest vpp <= vpp_max whose fetched rows (vpp-1)*sh + kh need at most MAX_WRAPS bank wraps."""
    vpp = min(vpp_max, MAX_WRAPS * pp - (kh - 1) // sh)
    if vpp < 1:
        raise CodegenError(f"kernel height {kh} with stride {sh} needs more than {MAX_WRAPS} bank wraps of "
                           f"{pp} banks")
    return vpp


def split_even(total: int, max_part: int) -> list[tuple[int, int]]:
    """Split [0, total) into the fewest near-equal parts of at most max_part: [(start, size), ...]."""
    n = ceil_div(total, max_part)
    base, extra = divmod(total, n)
    out, s = [], 0
    for i in range(n):
        size = base + (1 if i < extra else 0)
        out.append((s, size))
        s += size
    return out
