"""ELEW (element-wise add / multiply of up to 4 operands bound FIFO-style from ELEWINITs), isa1-semantics.md 8."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from tvm_dpu.quant.fixpoint import saturate_int8, shift_round

if TYPE_CHECKING:
    from tvm_dpu.runtime.emulator import Ctx, Emulator

ELEW_ADD, ELEW_MULT = 0, 1
#: shift_write 0..15 shifts left, 16..31 shifts right by (v - 16).
SHIFT_WRITE_RIGHT = 16


def elew(emu: "Emulator", ctx: "Ctx") -> None:
    f = ctx.ins.fields
    arch = emu.arch
    pp, cp = arch.pp, arch.icp
    num, vpp, cg, L = f["num"], f["valid_pixel_parallel"], f["channel_group"], f["length"]
    etype = f["elew_type"]
    ctx.check(etype in (ELEW_ADD, ELEW_MULT), "elew_type", f"not an elew_type of {arch.name} (0 add, 1 mult)")
    ctx.check(etype != ELEW_MULT or num == 2, "num", "mult needs exactly 2 inputs")
    ctx.check(f["act_type"] in emu.allowed_acts("elew"), "act_type", f"not an ELEW activation of {arch.name}")
    ctx.check(vpp <= arch.alu_pp, "valid_pixel_parallel", f"> eltwise pixel parallelism {arch.alu_pp}")
    ctx.check(len(emu.elew_fifo) >= num, "num", f"only {len(emu.elew_fifo)} pending ELEWINIT(s)")
    inits = emu.elew_fifo[:num]
    del emu.elew_fifo[:num]
    bank_out = emu.check_image_bank(ctx, "bank_id_out")
    C = cg * cp
    k = np.arange(vpp, dtype=np.int64)
    j = np.arange(L, dtype=np.int64)
    total = None
    for i, init in enumerate(inits):
        g = init.fields
        ctx.check(g["id"] == i, "num", f"pending ELEWINIT #{i} has id={g['id']}, expected {i}")
        b = g["bank_id_in"]
        if b not in emu.banks.image_ids:
            raise ctx.error(None, f"input {i}: ELEWINIT bank_id_in={b} is not an image bank of {arch.name} "
                                  f"({emu.banks.describe_image()})")
        jb = g["jump_bank"]
        ctx.check(jb * vpp <= pp, "valid_pixel_parallel", f"input {i}: jump_bank={jb} * vpp > PP={pp}")
        g0 = b - b % pp
        if g["share_pp"]:
            banks = np.full(vpp, b, dtype=np.int64)
            base = np.full(vpp, g["bank_addr_in"], dtype=np.int64)
        else:
            u = b + k * jb
            banks = g0 + u % pp
            base = g["bank_addr_in"] + ((u - g0) // pp) * g["jump_read_endl"]
        rows = base[:, None] + j[None, :] * g["jump_read"]
        x = emu.banks.read(banks[:, None], rows, C).view(np.int8).astype(np.int64)
        a = (x << 2) >> g["shift_read"]
        if total is None:
            total = a
        elif etype == ELEW_ADD:
            total = total + a
        else:
            total = total * a
    sw = f["shift_write"]
    scale = sw - SHIFT_WRITE_RIGHT if sw >= SHIFT_WRITE_RIGHT else -sw
    out = shift_round(total, scale + (2 if etype == ELEW_ADD else 4))
    if f["act_type"] == 1:
        out = np.maximum(out, 0)
    out = saturate_int8(out)
    g0 = bank_out - bank_out % pp
    u = bank_out + k
    obanks = g0 + (u - g0) % pp
    orows = f["bank_addr_out"] + ((u - g0) // pp) * f["jump_write_endl"]
    rows = orows[:, None] + j[None, :] * f["jump_write"]
    emu.banks.write(obanks[:, None], rows, out)
