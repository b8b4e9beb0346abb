"""LOAD (DDR -> one bank) and SAVE (one bank -> DDR), isa1-semantics.md 4 and 5."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping

import numpy as np
from numpy.lib.stride_tricks import as_strided

from tvm_dpu.emulator.banks import all_distinct, last_wins_index

if TYPE_CHECKING:
    from tvm_dpu.emulator.banks import Banks
    from tvm_dpu.emulator.context import Core, Ctx, Step

#: LOAD broadcast code that replaces every (unmasked) byte by const_value; other codes have no effect in the
#: simulator (5.1).
BROADCAST_CONST = 7


def _ddr_range(ctx: "Ctx", reg: np.ndarray, pitch_field: str) -> None:
    f = ctx.ins.fields
    end = f["ddr_addr"] + (f["length"] - 1) * f[pitch_field] + f["channel"]
    ctx.check(end <= reg.size, "ddr_addr",
              f"access ends at byte {end}, past the end of DDR region {f['reg_id']} ({reg.size} bytes; "
              f"length={f['length']} {pitch_field}={f[pitch_field]} channel={f['channel']})")


def _masked_overrun(ctx: "Ctx", reg: np.ndarray, keep: np.ndarray | None) -> int:
    """How many bytes past the end of its DDR region a LOAD reaches, when every one of them is masked by its
    channel-augmentation padding (`keep` False: the tail of the last items, pad_end / pad_idx, 5.1); 0 when it
    stays inside. Those bytes never reach a bank (they are zero there), and vai_c sizes an input region to its
    tensor, so the last augmented items of a first-layer LOAD run a few masked bytes past it; the hardware reads
    whole bursts from 4 KiB-page-aligned buffers (4) and the masked bytes are discarded. Any unmasked byte past
    the end is the EmulatorError of _ddr_range."""
    f = ctx.ins.fields
    end = f["ddr_addr"] + (f["length"] - 1) * f["jump_read"] + f["channel"]
    if end <= reg.size:
        return 0
    if keep is not None:
        n, ch = keep.shape
        # one past the last unmasked byte of each item (0 for an item masked entirely)
        last = np.where(keep.any(axis=1), ch - np.argmax(keep[:, ::-1], axis=1), 0)
        if f["ddr_addr"] + int(np.max(np.arange(n, dtype=np.int64) * f["jump_read"] + last)) <= reg.size:
            return end - reg.size
    _ddr_range(ctx, reg, "jump_read")
    raise AssertionError("unreachable: _ddr_range raises for an access past the region")


def _read_items(rid: int, addr: int, n: int, ch: int, jr: int,
                keep: np.ndarray | None) -> list[tuple[int, int, int, int, int]]:
    """The DDR bytes a LOAD depends on, as (reg_id, first byte, items, bytes per item, pitch) runs: all `ch` bytes
    of its `n` items, less those its channel-augmentation mask `keep` (n, ch) zeroes, which are contiguous at
    each item's start and end (5.1). Items masked alike form one run."""
    if keep is None:
        return [(rid, addr, n, ch, jr)]
    any_kept = keep.any(axis=1)
    lo = np.where(any_kept, np.argmax(keep, axis=1), 0)
    hi = np.where(any_kept, ch - np.argmax(keep[:, ::-1], axis=1), 0)
    out: list[tuple[int, int, int, int, int]] = []
    i = 0
    while i < n:
        j = i + 1
        while j < n and lo[j] == lo[i] and hi[j] == hi[i]:
            j += 1
        if hi[i] > lo[i]:
            out.append((rid, addr + i * jr + int(lo[i]), j - i, int(hi[i] - lo[i]), jr))
        i = j
    return out


def _items(reg: np.ndarray, addr: int, n: int, width: int, pitch: int, writeable: bool) -> np.ndarray:
    """(n, width) view of DDR bytes addr + i * pitch + j (range already checked; the region may be strided)."""
    return _ddr_view(reg, addr, (n, width), (pitch, 1), writeable)


def _ddr_view(reg: np.ndarray, addr: int, shape: tuple[int, ...], steps: tuple[int, ...],
              writeable: bool) -> np.ndarray:
    """The view of DDR region `reg` whose item [i, j, ...] is byte addr + i * steps[0] + j * steps[1] + ... (range
    already checked). A contiguous region is viewed through its buffer, which numpy bounds-checks and which costs
    a microsecond against as_strided's several (a thousand transfers per run of vai_c's MobileNetV2; the
    read-only parameter region is the source of every weight LOAD). A view of a read-only region is read-only,
    so a write through it raises numpy's read-only ValueError."""
    if reg.flags.c_contiguous:
        view = np.ndarray(shape, np.uint8, buffer=reg, offset=addr, strides=steps)
        if not writeable and view.flags.writeable:
            view.flags.writeable = False
        return view
    st = reg.strides[0]
    return as_strided(reg[addr:], shape=shape, strides=tuple(k * st for k in steps), writeable=writeable)


def plan_load(emu: "Core", ctx: "Ctx") -> "Step":
    """Check a LOAD and precompute its transfer; returns the step that performs it."""
    f = ctx.ins.fields
    banks = emu.banks
    bank_id = f["bank_id"]
    ctx.check(bank_id < banks.num_banks, "bank_id",
              f"no such bank on {emu.arch.name} (banks 0-{banks.num_banks - 1})")
    ctx.check(f["mode_avg"] == 0, "mode_avg", f"{emu.arch.name} has no mean-value bank (ISA1); mode_avg must be 0")
    reg = emu.region(ctx)
    n, ch, jr = f["length"], f["channel"], f["jump_read"]
    items = np.arange(n, dtype=np.int64)
    keep = None
    if jr <= ch <= 64:
        # Channel-augmentation padding of overlapping first-layer items (5.1).
        byte = np.arange(ch, dtype=np.int64)
        lead = np.maximum(0, f["pad_start"] - items * jr)
        ctx.check(f["pad_start"] < ch, "pad_start", f"leading pad count must be < channel={ch}")
        mask = byte[None, :] < lead[:, None]
        first_tail = n - f["pad_idx"]
        m = f["pad_end"] + jr * (items - first_tail)
        start = -(-ch // banks.width) * banks.width - m
        tail_items = items >= first_tail
        ctx.check(bool(np.all(start[tail_items] > 0)), "pad_end",
                  f"tail pad start index must be > 0 (pad_idx={f['pad_idx']}, jump_read={jr}, channel={ch})")
        mask |= tail_items[:, None] & (byte[None, :] >= start[:, None])
        if mask.any():
            keep = ~mask
    overrun = _masked_overrun(ctx, reg, keep)
    if banks.trace is not None and f["broadcast"] != BROADCAST_CONST:
        banks.trace.ddr_reads.extend(_read_items(int(f["reg_id"]), int(f["ddr_addr"]), n, ch, jr, keep))
    nrow = -(-ch // banks.width)
    keys = banks.keys(np.int64(bank_id), f["bank_addr"] + items * f["jump_write"], nrow)
    emu.stats.load_bytes += n * ch
    if f["broadcast"] == BROADCAST_CONST:
        write = banks.row_writer(keys, ch)
        data = np.full((n, ch), f["const_value"], dtype=np.uint8)
        if keep is not None:
            data[~keep] = 0
        return lambda regions: write(data)
    rid, a = int(f["reg_id"]), int(f["ddr_addr"])
    if overrun:
        def source(regions: Mapping[int, np.ndarray]) -> np.ndarray:
            # the bytes past the region's end are all masked (keep is 0 there): read them as zeros
            padded = np.concatenate([regions[rid][a:], np.zeros(overrun, np.uint8)])
            return _items(padded, 0, n, ch, jr, writeable=False)
    elif jr == ch:
        def source(regions: Mapping[int, np.ndarray]) -> np.ndarray:
            return regions[rid][a:a + n * ch].reshape(n, ch)
    else:
        def source(regions: Mapping[int, np.ndarray]) -> np.ndarray:
            return _items(regions[rid], a, n, ch, jr, writeable=False)
    if keep is None:
        # The bank writer is made when the LOAD runs on its own (most are merged: merge_transfers).
        def make() -> "Step":
            write = banks.row_writer(keys, ch)
            return lambda regions: write(source(regions))
        return Transfer(make, False, rid, a, n, ch, jr, keys, banks)
    write = banks.row_writer(keys, ch)
    return lambda regions: write(source(regions) * keep)


def plan_save(emu: "Core", ctx: "Ctx") -> "Step":
    """Check a SAVE and precompute its transfer; returns the step that performs it."""
    f = ctx.ins.fields
    banks = emu.banks
    bank_id = emu.check_image_bank(ctx, "bank_id")
    reg = emu.region(ctx)
    _ddr_range(ctx, reg, "jump_write")
    n, ch, jw = f["length"], f["channel"], f["jump_write"]
    items = np.arange(n, dtype=np.int64)
    argmax = f["argmax"]
    width = 1 if argmax & 2 and not f["const_en"] else ch
    if f["const_en"]:
        const = np.full((n, ch), f["const_value"], dtype=np.uint8)

        def source() -> np.ndarray:
            return const
    else:
        nrow = -(-ch // banks.width)
        keys = banks.keys(np.int64(bank_id), f["bank_addr"] + items * f["jump_read"], nrow)
        read = banks.row_reader(keys, ch)
        if not argmax & 2:
            source = read
        elif argmax & 1:
            def source() -> np.ndarray:
                return read().view(np.int8).max(axis=1, keepdims=True).view(np.uint8)
        else:
            def source() -> np.ndarray:
                return read().view(np.int8).argmax(axis=1).astype(np.int8).view(np.uint8)[:, None]
    emu.stats.save_bytes += n * width
    rid, a = int(f["reg_id"]), int(f["ddr_addr"])
    if n > 1 and jw < width:
        dst = (a + items[:, None] * jw + np.arange(width, dtype=np.int64)).reshape(-1)
        sel = last_wins_index(dst)
        if sel is not None:
            dst = dst[sel]

        def save_overlapping(regions: Mapping[int, np.ndarray]) -> None:
            vals = source().reshape(-1)
            regions[rid][dst] = vals if sel is None else vals[sel]
        return save_overlapping
    if jw == width:
        def save_run(regions: Mapping[int, np.ndarray]) -> None:
            regions[rid][a:a + n * width].reshape(n, width)[...] = source()
        step = save_run
    else:
        def save_strided(regions: Mapping[int, np.ndarray]) -> None:
            _items(regions[rid], a, n, width, jw, writeable=True)[...] = source()
        step = save_strided
    if f["const_en"] or argmax & 2:
        return step
    return Transfer(lambda: step, True, rid, a, n, ch, jw, keys, banks)


@dataclass(eq=False)
class Transfer:
    """A planned plain LOAD or SAVE (no padding mask, constant or argmax): callable as its own step, and what
    `merge_transfers` needs to do a run of them as one copy."""

    make: "Callable[[], Step]"  # the step performing this transfer alone
    save: bool
    rid: int
    addr: int  # first DDR byte
    n: int  # items
    ch: int  # bytes per item
    pitch: int  # DDR bytes between items
    keys: np.ndarray  # (n, rows per item) bank row keys
    banks: "Banks"

    _step: "Step | None" = None

    def __call__(self, regions: Mapping[int, np.ndarray]) -> None:
        if self._step is None:
            self._step = self.make()
        self._step(regions)


def merge_transfers(steps: list, skip: "Step") -> list:
    """`steps` with each run of adjacent LOADs (or SAVEs) of the same shape whose DDR items are evenly spaced
    (a layer's weight banks, the rows of a feature-map tile) replaced by one step copying them all, followed by
    `skip` steps. LOADs read only DDR and SAVEs read only banks, so the only order inside a run that matters is
    which of two writes to the same place lands last: the merged LOAD writes bank rows in program order (later
    wins), and SAVEs are merged only when their DDR bytes are disjoint."""
    out = list(steps)
    i = 0
    while i < len(out):
        first = out[i]
        j = i + 1
        if isinstance(first, Transfer) and j < len(out) and _same_shape(first, out[j]):
            delta = out[j].addr - first.addr
            while j < len(out) and _same_shape(first, out[j]) and out[j].addr == first.addr + (j - i) * delta:
                j += 1
            merged = _merged(out[i:j], delta)
            if merged is not None:
                out[i:j] = [merged] + [skip] * (j - i - 1)
        i = j
    for step in steps:  # the keys were only needed here
        if isinstance(step, Transfer):
            step.keys = _NO_KEYS
    return out


_NO_KEYS = np.zeros((0, 1), np.int64)


def _same_shape(a: Transfer, b: object) -> bool:
    return isinstance(b, Transfer) and (b.save, b.rid, b.n, b.ch, b.pitch) == (a.save, a.rid, a.n, a.ch, a.pitch)


def _merged(run: list[Transfer], delta: int) -> "Step | None":
    """One step performing the transfers `run` (DDR items at addr + k*delta + i*pitch), or None (SAVEs whose DDR
    bytes overlap)."""
    first = run[0]
    m, n, ch, pitch, rid, a0 = len(run), first.n, first.ch, first.pitch, first.rid, first.addr
    keys = np.stack([t.keys for t in run])  # (m, n, rows per item)
    banks = first.banks

    def ddr(regions: Mapping[int, np.ndarray], writeable: bool) -> np.ndarray:
        return _ddr_view(regions[rid], a0, (m, n, ch), (delta, pitch, 1), writeable)
    if not first.save:
        write = banks.row_writer(keys, ch)
        return lambda regions: write(ddr(regions, False))
    dst = (a0 + np.arange(m)[:, None, None] * delta + np.arange(n)[None, :, None] * pitch + np.arange(ch)).reshape(-1)
    if not all_distinct(dst):
        return None
    read = banks.row_reader(keys, ch)

    def save(regions: Mapping[int, np.ndarray]) -> None:
        ddr(regions, True)[...] = read()
    return save
