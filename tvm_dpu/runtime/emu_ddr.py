"""LOAD (DDR -> one bank) and SAVE (one bank -> DDR), isa1-semantics.md 4 and 5."""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

import numpy as np
from numpy.lib.stride_tricks import as_strided

from tvm_dpu.runtime.banks import last_wins_index

if TYPE_CHECKING:
    from tvm_dpu.runtime.emulator import Ctx, Emulator, Step

#: LOAD broadcast code that replaces every (unmasked) byte by const_value; other codes have no effect in the
#: simulator (5.1).
BROADCAST_CONST = 7


def _ddr_range(ctx: "Ctx", reg: np.ndarray, pitch_field: str) -> None:
    f = ctx.ins.fields
    end = f["ddr_addr"] + (f["length"] - 1) * f[pitch_field] + f["channel"]
    ctx.check(end <= reg.size, "ddr_addr",
              f"access ends at byte {end}, past the end of DDR region {f['reg_id']} ({reg.size} bytes; "
              f"length={f['length']} {pitch_field}={f[pitch_field]} channel={f['channel']})")


def _items(reg: np.ndarray, addr: int, n: int, width: int, pitch: int, writeable: bool) -> np.ndarray:
    """(n, width) view of DDR bytes addr + i * pitch + j (range already checked; the region may be strided)."""
    step = reg.strides[0]
    return as_strided(reg[addr:], shape=(n, width), strides=(pitch * step, step), writeable=writeable)


def plan_load(emu: "Emulator", ctx: "Ctx") -> "Step":
    """Check a LOAD and precompute its transfer; returns the step that performs it."""
    f = ctx.ins.fields
    banks = emu.banks
    bank_id = f["bank_id"]
    ctx.check(bank_id < banks.num_banks, "bank_id",
              f"no such bank on {emu.arch.name} (banks 0-{banks.num_banks - 1})")
    ctx.check(f["mode_avg"] == 0, "mode_avg", f"{emu.arch.name} has no mean-value bank (ISA1); mode_avg must be 0")
    reg = emu.region(ctx)
    _ddr_range(ctx, reg, "jump_read")
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
    nrow = -(-ch // banks.width)
    write = banks.row_writer(banks.keys(np.int64(bank_id), f["bank_addr"] + items * f["jump_write"], nrow), ch)
    emu.stats.load_bytes += n * ch
    if f["broadcast"] == BROADCAST_CONST:
        data = np.full((n, ch), f["const_value"], dtype=np.uint8)
        if keep is not None:
            data[~keep] = 0
        return lambda regions: write(data)
    rid, a = int(f["reg_id"]), int(f["ddr_addr"])
    if jr == ch:
        def source(regions: Mapping[int, np.ndarray]) -> np.ndarray:
            return regions[rid][a:a + n * ch].reshape(n, ch)
    else:
        def source(regions: Mapping[int, np.ndarray]) -> np.ndarray:
            return _items(regions[rid], a, n, ch, jr, writeable=False)
    if keep is None:
        return lambda regions: write(source(regions))
    return lambda regions: write(source(regions) * keep)


def plan_save(emu: "Emulator", ctx: "Ctx") -> "Step":
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
        read = banks.row_reader(banks.keys(np.int64(bank_id), f["bank_addr"] + items * f["jump_read"], nrow), ch)
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
        return save_run

    def save_strided(regions: Mapping[int, np.ndarray]) -> None:
        _items(regions[rid], a, n, width, jw, writeable=True)[...] = source()
    return save_strided
