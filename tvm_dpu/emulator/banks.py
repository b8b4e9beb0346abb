"""On-chip bank memory of the emulator and the address rules every engine shares (isa1-semantics.md 3).

All banks of one DPU core live in one uint8 array of shape (num_banks, depth, width); `Banks.bank(i)` is the
(depth x width) view of bank i. Engines always start a transfer at a row boundary, so reads and writes are done
on whole rows: a write of n bytes covers ceil(n / width) rows, the tail of the last row is zero-filled (3.1), and
every address wraps modulo depth.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from tvm_dpu.arch.arch import Arch, BankGroup


#: Most strided copies a row writer makes of one transfer before a single scatter is the faster choice.
MAX_PIECES = 16


class Banks:
    """The bank array of one core plus row-granular gather/scatter helpers."""

    def __init__(self, arch: Arch):
        self.arch = arch
        self.groups: tuple[BankGroup, ...] = arch.bank_groups
        self.num_banks = arch.num_banks
        self.depth = arch.bank_depth
        self.width = arch.icp
        self.mem = np.zeros((self.num_banks, self.depth, self.width), dtype=np.uint8)
        # Row view: row key = bank * depth + row; byte view: byte = key * width + offset.
        self._rows = self.mem.reshape(self.num_banks * self.depth, self.width)
        self._bytes = self.mem.reshape(-1)
        self.image_ids = frozenset(i for g in self.groups if g.kind == "image" for i in g.ids)
        self.base_id = {g.name: g.base_id for g in self.groups}  # group name -> first bank id
        self._blocks: dict[tuple[int, int, int], np.ndarray] = {}
        #: The access record of the instruction being planned or run, while the emulator records accesses
        #: (Emulator.record_accesses); None otherwise, and then the accessors below only test it.
        self.trace = None

    def row_blocks(self, count: int, nrow: int, jump: int) -> np.ndarray:
        """Read-only view (keys, count, nrow, width): item [k] is the `count` runs of `nrow` rows starting at row
        keys k, k + jump, ... (no wrap-around; only keys whose last row exists are included)."""
        key = (count, nrow, jump)
        view = self._blocks.get(key)
        if view is None:
            span = (count - 1) * jump + nrow - 1
            rw, bw = self._rows.strides
            view = np.lib.stride_tricks.as_strided(self._rows, (self._rows.shape[0] - span, count, nrow, self.width),
                                                   (rw, jump * rw, rw, bw), writeable=False)
            self._blocks[key] = view
        return view

    def bank(self, bank_id: int) -> np.ndarray:
        """The (depth, width) uint8 view of one bank."""
        return self.mem[bank_id]

    def reset(self) -> None:
        self.mem[...] = 0

    def describe_image(self) -> str:
        return ", ".join(f"{g.name} {g.ids.start}-{g.ids.stop - 1}" for g in self.groups if g.kind == "image")

    # ---- row-granular access ---------------------------------------------------------------
    @property
    def rows(self) -> np.ndarray:
        """(num_banks * depth, width) view of all banks; row key = bank * depth + row."""
        return self._rows

    def keys(self, banks: np.ndarray, rows: np.ndarray, nrow: int) -> np.ndarray:
        """Row keys (..., nrow) for transfers starting at (bank, row), rows wrapping modulo depth."""
        return self._keys(banks, rows, nrow)

    def _keys(self, banks: np.ndarray, rows: np.ndarray, nrow: int) -> np.ndarray:
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
        keys = self._keys(banks, rows, nrow)
        if self.trace is not None:
            self.trace.bank_reads.append(keys.reshape(-1))
        data = self._rows[keys]  # (..., nrow, width)
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
        if self.trace is not None:
            self.trace.bank_writes.append(keys)
        vals = data.reshape(-1, self.width)
        keys, vals = last_wins(keys, vals)
        self._rows[keys] = vals


    # ---- precomputed transfers (the emulator's cached programs) ---------------------------------
    def row_reader(self, keys: np.ndarray, nbytes: int) -> Callable[[], np.ndarray]:
        """A function returning the `nbytes` bytes at each row-key list keys[..., nrow], shape keys.shape[:-1] +
        (nbytes,) uint8, as `read` would. When the keys are a regular grid of rows (`affine_view`) the result is a
        view of the bank memory (valid until the banks change), otherwise a gathered copy."""
        lead, nrow = keys.shape[:-1], keys.shape[-1]
        if self.trace is not None:
            self.trace.bank_reads.append(keys.reshape(-1))
        view = self.affine_view(keys)
        if view is not None:
            view = view[..., :nbytes]
            view.flags.writeable = False
            return lambda: view
        shape = lead + (nrow * self.width,)
        pieces = self.affine_pieces(keys)
        if pieces is not None:
            return piece_reader(pieces, shape, nbytes)
        rows, flat = self._rows, np.ascontiguousarray(keys.reshape(-1), dtype=np.intp)
        if nrow * self.width == nbytes:
            return lambda: rows[flat].reshape(shape)
        return lambda: rows[flat].reshape(shape)[..., :nbytes]

    def row_writer(self, keys: np.ndarray, nbytes: int) -> Callable[[np.ndarray], None]:
        """A function writing data (..., nbytes) uint8 to the row-key lists keys (..., nrow) exactly as `write`
        does (zero-filled row tails, later items in C order win)."""
        lead, nrow = keys.shape[:-1], keys.shape[-1]
        if self.trace is not None:
            self.trace.bank_writes.append(keys.reshape(-1))
        span = nrow * self.width
        view = self.affine_view(keys) if last_wins_index(keys.reshape(-1)) is None else None
        if view is not None:
            # Distinct rows on a regular grid: a strided view, written in place.
            if span == nbytes:
                def write_view(data: np.ndarray) -> None:
                    view[...] = data.reshape(view.shape)
                return write_view
            head, tail = view[..., :nbytes], view[..., nbytes:]

            def write_view_padded(data: np.ndarray) -> None:
                head[...] = data.reshape(head.shape)
                tail[...] = 0
            return write_view_padded
        pieces = self.affine_pieces(keys) if view is None and last_wins_index(keys.reshape(-1)) is None else None
        if pieces is not None:
            return _piece_writer(pieces, lead, nbytes, span)
        m = int(np.prod(lead, dtype=np.int64))
        flat = keys.reshape(-1)
        sel = last_wins_index(flat)
        rows = self._rows
        if sel is not None:
            flat = flat[sel]
        flat = np.ascontiguousarray(flat, dtype=np.intp)
        width = self.width

        def write_keys(data: np.ndarray) -> None:
            data = data.reshape(m, nbytes)
            if span != nbytes:
                buf = np.zeros((m, span), dtype=np.uint8)
                buf[:, :nbytes] = data
                data = buf
            vals = data.reshape(-1, width)
            rows[flat] = vals if sel is None else vals[sel]
        return write_keys

    def affine_pieces(self, keys: np.ndarray) -> list[tuple[slice, np.ndarray]] | None:
        """The row-key lists keys (..., nrow) cut along their first axis into at most MAX_PIECES parts that are
        each an `affine_view`, as (slice of the first axis, writable view) pairs: the items of each residue modulo
        some p (1: all of them) cut into runs of consecutive items, with the p that needs fewest parts; None when
        no p needs MAX_PIECES or fewer. Why: a tile's rows cycle through the banks of a group (the row-store
        rule), and a stride-s window fetches s rows from each bank (the row-fetch rule), so its keys jump at each
        bank change; a fancy-index scatter or gather (several times slower than strided copies) would do the whole
        tile, and a copy per item costs a numpy call each."""
        if keys.ndim < 2 or keys.size == 0:
            return None
        best = None
        for p in range(1, min(MAX_PIECES, keys.shape[0]) + 1):
            if best is not None and len(best) <= p:
                break  # each of p residue classes needs a part of its own: no better cut is left
            pieces: list[tuple[slice, np.ndarray]] = []
            for r in range(p):
                runs = self._runs(keys[r::p], MAX_PIECES - len(pieces) if best is None else len(best) - 1
                                  - len(pieces))
                if runs is None:
                    break
                pieces += [(slice(r + sl.start * p, r + (sl.stop - 1) * p + 1, p if p > 1 else None), view)
                           for sl, view in runs]
            else:
                best = pieces
        return best

    def _runs(self, keys: np.ndarray, most: int) -> list[tuple[slice, np.ndarray]] | None:
        """keys cut into runs of consecutive items that are each an `affine_view`, or None when that needs more
        than `most` runs."""
        pieces, i, n = [], 0, keys.shape[0]
        while i < n:
            j = i + 1
            view = self.affine_view(keys[i:j])
            if view is None:
                return None
            while j < n and (longer := self.affine_view(keys[i:j + 1])) is not None:
                view, j = longer, j + 1
            pieces.append((slice(i, j), view))
            if len(pieces) > most:
                return None
            i = j
        return pieces

    def affine_view(self, keys: np.ndarray) -> np.ndarray | None:
        """The writable view (..., nrow * width) of the bytes of the row-key lists keys (..., nrow) when every list
        is a run of consecutive rows and the runs' first keys are k0 + a linear function of their index (a strided
        block: no bank wrap inside an item, no gather needed), else None."""
        if keys.size == 0:
            return None
        lead, nrow = keys.shape[:-1], keys.shape[-1]
        layout = affine_layout(keys)
        if layout is None or (nrow > 1 and layout[1][-1] != 1):
            return None
        k0, steps = layout
        rw, bw = self._rows.strides
        return np.lib.stride_tricks.as_strided(self._rows[k0:], lead + (nrow * self.width,),
                                               tuple(st * rw for st in steps[:-1]) + (bw,))


def piece_reader(pieces: list[tuple[slice, np.ndarray]], shape: tuple[int, ...],
                 nbytes: int) -> Callable[..., np.ndarray]:
    """`read(out=None)`: the rows of `Banks.affine_pieces` copied into `out` (a fresh array when None) of `shape`
    (lead + (nrow * width,)), cut to the first `nbytes` bytes of each item: strided copies, no index array."""
    def read(out: np.ndarray | None = None) -> np.ndarray:
        if out is None:
            out = np.empty(shape, np.uint8)
        flat = out.reshape(shape)
        for sl, view in pieces:
            flat[sl] = view
        return out if shape[-1] == nbytes else out[..., :nbytes]
    return read


def _piece_writer(pieces: list[tuple[slice, np.ndarray]], lead: tuple[int, ...], nbytes: int,
                  span: int) -> Callable[[np.ndarray], None]:
    """A row writer copying data (lead + (nbytes,)) into the strided views of `Banks.affine_pieces` (distinct
    rows, so the order of the copies does not matter), zero-filling the row tails when span > nbytes."""
    parts = [(sl, view[..., :nbytes], view[..., nbytes:]) for sl, view in pieces]
    shape = lead + (nbytes,)

    def write_pieces(data: np.ndarray) -> None:
        data = data.reshape(shape)
        for sl, head, tail in parts:
            head[...] = data[sl]
            if span != nbytes:
                tail[...] = 0
    return write_pieces


def affine_layout(keys: np.ndarray) -> tuple[int, tuple[int, ...]] | None:
    """(k0, steps) when keys[i0, i1, ...] == k0 + i0 * steps[0] + i1 * steps[1] + ... for every index, else None."""
    k0 = int(keys.reshape(-1)[0])
    steps = tuple(int(keys[(0,) * d + (1,)].reshape(-1)[0]) - k0 if n > 1 else 0 for d, n in enumerate(keys.shape))
    grid = np.full((1,) * keys.ndim, k0, dtype=np.int64)
    for d, (n, st) in enumerate(zip(keys.shape, steps)):
        grid = grid + (np.arange(n, dtype=np.int64) * st).reshape((1,) * d + (n,) + (1,) * (keys.ndim - d - 1))
    return (k0, steps) if np.array_equal(keys, grid) else None


def all_distinct(keys: np.ndarray) -> bool:
    """Whether no value occurs twice in `keys` (a sort: faster than np.unique's hashing on these arrays)."""
    s = np.sort(keys, axis=None)
    return bool(np.all(s[1:] != s[:-1]))


def last_wins_index(keys: np.ndarray) -> np.ndarray | None:
    """Indices keeping only the last occurrence of each key (None when the keys are already unique)."""
    if keys.size <= 1 or all_distinct(keys):
        return None
    uniq, first_rev = np.unique(keys[::-1], return_index=True)
    if uniq.size == keys.size:
        return None
    return keys.size - 1 - first_rev


def last_wins(keys: np.ndarray, vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop all but the last occurrence of each key, so a scatter is deterministic and matches sequential order."""
    if keys.size <= 1 or all_distinct(keys):
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
