"""On-chip bank memory of the emulator and the address rules every engine shares (isa1-semantics.md 3).

All banks of one DPU core live in one uint8 array of shape (num_banks, depth, width); `Banks.bank(i)` is the
(depth x width) view of bank i. Engines always start a transfer at a row boundary, so reads and writes are done
on whole rows: a write of n bytes covers ceil(n / width) rows, the tail of the last row is zero-filled (3.1), and
every address wraps modulo depth.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tvm_dpu.arch.arch import Arch, BankGroup


class Banks:
    """The bank array of one core plus row-granular gather/scatter helpers."""

    def __init__(self, arch: Arch):
        self.arch = arch
        self.groups: tuple[BankGroup, ...] = arch.bank_groups
        self.num_banks = arch.num_banks
        self.depth = arch.bank_depth
        self.width = arch.icp
        self.mem = np.zeros((self.num_banks, self.depth, self.width), dtype=np.uint8)
        # Row view: row key = bank * depth + row.
        self._rows = self.mem.reshape(self.num_banks * self.depth, self.width)
        self.image_ids = frozenset(i for g in self.groups if g.kind == "image" for i in g.ids)

    def bank(self, bank_id: int) -> np.ndarray:
        """The (depth, width) uint8 view of one bank."""
        return self.mem[bank_id]

    def reset(self) -> None:
        self.mem[...] = 0

    def describe_image(self) -> str:
        return ", ".join(f"{g.name} {g.ids.start}-{g.ids.stop - 1}" for g in self.groups if g.kind == "image")

    # ---- row-granular access ---------------------------------------------------------------
    def _keys(self, banks: np.ndarray, rows: np.ndarray, nrow: int) -> np.ndarray:
        """Row keys (..., nrow) for transfers starting at (bank, row), rows wrapping modulo depth."""
        banks = np.asarray(banks, dtype=np.int64)
        rows = np.asarray(rows, dtype=np.int64)
        r = (rows[..., None] + np.arange(nrow, dtype=np.int64)) % self.depth
        return banks[..., None] * self.depth + r

    def read(self, banks: np.ndarray, rows: np.ndarray, nbytes: int) -> np.ndarray:
        """Gather `nbytes` consecutive bytes starting at each (bank, row); shape banks.shape + (nbytes,), uint8.

        `banks` and `rows` broadcast against each other.
        """
        banks, rows = np.broadcast_arrays(np.asarray(banks, dtype=np.int64), np.asarray(rows, dtype=np.int64))
        nrow = -(-nbytes // self.width)
        data = self._rows[self._keys(banks, rows, nrow)]  # (..., nrow, width)
        data = data.reshape(banks.shape + (nrow * self.width,))
        return data[..., :nbytes] if nrow * self.width != nbytes else data

    def write(self, banks: np.ndarray, rows: np.ndarray, data: np.ndarray) -> None:
        """Scatter data[..., nbytes] to consecutive bytes from each (bank, row), zero-filling the last row's tail.

        Items are written in C order of the leading axes; where two items touch the same row the later one wins,
        as in the simulator's sequential loops.
        """
        data = np.asarray(data)
        if data.dtype != np.uint8:
            data = data.view(np.uint8) if data.dtype == np.int8 else data.astype(np.uint8)
        lead = data.shape[:-1]
        nbytes = data.shape[-1]
        banks = np.broadcast_to(np.asarray(banks, dtype=np.int64), lead)
        rows = np.broadcast_to(np.asarray(rows, dtype=np.int64), lead)
        nrow = -(-nbytes // self.width)
        if nrow * self.width != nbytes:
            padded = np.zeros(lead + (nrow * self.width,), dtype=np.uint8)
            padded[..., :nbytes] = data
            data = padded
        keys = self._keys(banks, rows, nrow).reshape(-1)
        vals = data.reshape(-1, self.width)
        keys, vals = last_wins(keys, vals)
        self._rows[keys] = vals


def last_wins(keys: np.ndarray, vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop all but the last occurrence of each key, so a scatter is deterministic and matches sequential order."""
    if keys.size <= 1:
        return keys, vals
    uniq, first_rev = np.unique(keys[::-1], return_index=True)
    if uniq.size == keys.size:
        return keys, vals
    sel = keys.size - 1 - first_rev
    return keys[sel], vals[sel]


@dataclass(frozen=True)
class RowMap:
    """Bank and row of each image row touched by an instruction (isa1-semantics.md 3.3)."""

    banks: np.ndarray  # (H,) bank id per image row
    rows: np.ndarray  # (H,) base row (before adding the column pitch)
    groups: np.ndarray  # (H,) wrap count (base-address slot for the fetch rule)


def fetch_rows(bank_id: int, pp: int, height: int, stride: int, offset: int, endl: int,
               bases: tuple[int, ...]) -> RowMap:
    """Row-fetch rule: input row h -> bank, base row (A[grp] + (q mod S)*E), grp. grp may exceed len(bases)-1;
    the caller checks it (rows with grp beyond the base list get row 0)."""
    g0 = bank_id - bank_id % pp
    b0 = bank_id % pp
    q = offset + np.arange(height, dtype=np.int64)
    k = b0 + q // stride
    grp = k // pp
    a = np.asarray(bases, dtype=np.int64)
    base = np.where(grp < len(a), a[np.minimum(grp, len(a) - 1)], 0)
    return RowMap(g0 + k % pp, base + (q % stride) * endl, grp)


def store_rows(bank_id: int, pp: int, height: int, stride_out: int, offset_out: int, endl: int,
               base: int) -> tuple[np.ndarray, np.ndarray]:
    """Row-store rule: output row r -> (bank, base row) (before adding the column pitch)."""
    g0 = bank_id - bank_id % pp
    b0 = bank_id % pp
    q = offset_out + np.arange(height, dtype=np.int64)
    k = b0 + q // stride_out
    rows = base + (k // pp) * stride_out * endl + (q % stride_out) * endl
    return g0 + k % pp, rows
