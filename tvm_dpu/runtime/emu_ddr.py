"""LOAD (DDR -> one bank) and SAVE (one bank -> DDR), isa1-semantics.md 4 and 5."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from tvm_dpu.runtime.banks import last_wins

if TYPE_CHECKING:
    from tvm_dpu.runtime.emulator import Ctx, Emulator

#: LOAD broadcast code that replaces every (unmasked) byte by const_value; other codes have no effect in the
#: simulator (5.1).
BROADCAST_CONST = 7


def _ddr_range(ctx: "Ctx", reg: np.ndarray, pitch_field: str) -> None:
    f = ctx.ins.fields
    end = f["ddr_addr"] + (f["length"] - 1) * f[pitch_field] + f["channel"]
    ctx.check(end <= reg.size, "ddr_addr",
              f"access ends at byte {end}, past the end of DDR region {f['reg_id']} ({reg.size} bytes; "
              f"length={f['length']} {pitch_field}={f[pitch_field]} channel={f['channel']})")


def load(emu: "Emulator", ctx: "Ctx") -> None:
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
    if f["broadcast"] == BROADCAST_CONST:
        data = np.full((n, ch), f["const_value"], dtype=np.uint8)
    else:
        src = f["ddr_addr"] + items[:, None] * jr + np.arange(ch, dtype=np.int64)
        data = reg[src]
    if jr <= ch <= 64:
        # Channel-augmentation padding of overlapping first-layer items (5.1).
        data = data.copy()
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
        data[mask] = 0
    rows = f["bank_addr"] + items * f["jump_write"]
    banks.write(np.int64(bank_id), rows, data)
    emu.stats.load_bytes += n * ch


def save(emu: "Emulator", ctx: "Ctx") -> None:
    f = ctx.ins.fields
    banks = emu.banks
    bank_id = emu.check_image_bank(ctx, "bank_id")
    reg = emu.region(ctx)
    _ddr_range(ctx, reg, "jump_write")
    n, ch, jw = f["length"], f["channel"], f["jump_write"]
    items = np.arange(n, dtype=np.int64)
    dst0 = f["ddr_addr"] + items * jw
    argmax = f["argmax"]
    if f["const_en"]:
        data = np.full((n, ch), f["const_value"], dtype=np.uint8)
    else:
        data = banks.read(np.int64(bank_id), f["bank_addr"] + items * f["jump_read"], ch)
        if argmax & 2:
            v = data.view(np.int8)
            data = (v.max(axis=1) if argmax & 1 else v.argmax(axis=1).astype(np.int64)).astype(np.int8)
            data = data.view(np.uint8)[:, None]
    width = data.shape[1]
    dst = (dst0[:, None] + np.arange(width, dtype=np.int64)).reshape(-1)
    vals = data.reshape(-1)
    if n > 1 and jw < width:
        dst, vals = last_wins(dst, vals)
    reg[dst] = vals
    emu.stats.save_bytes += int(dst.size)
