"""ELEW (element-wise add / multiply of up to 4 operands bound FIFO-style from ELEWINITs), isa1-semantics.md 8."""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Callable

import numpy as np

from tvm_dpu.codegen.isa import enum_code
from tvm_dpu.quant.fixpoint import saturate_int8, shift_round

if TYPE_CHECKING:
    from tvm_dpu.codegen.isa import Instr
    from tvm_dpu.emulator.context import Core, Ctx

ELEW_ADD, ELEW_MUL = enum_code("elew_type", "add"), enum_code("elew_type", "mul")
#: The ELEW act_type field is 1 bit: none or relu (8.3).
ACT_RELU = enum_code("act_type", "relu")
#: ELEWs with at most this many operands run as a lookup in a table of all 256**num results.
TABLE_MAX_INPUTS = 2
#: shift_write 0..15 shifts left, 16..31 shifts right by (v - 16).
SHIFT_WRITE_RIGHT = 16


def elew(emu: "Core", ctx: "Ctx") -> None:
    """Execute the ELEW of `ctx` with the operands its pending ELEWINITs describe (interpreted)."""
    _plan(emu, ctx, list(emu.elew_fifo))()


def plan_elew(emu: "Core", ctx: "Ctx", fifo: "list[Instr]") -> Callable[[], None]:
    """Check the ELEW of `ctx` against the pending ELEWINITs `fifo` (front first) and precompute its bank reads
    and writes; the returned function pops its ELEWINITs from `emu.elew_fifo` and performs it."""
    return _plan(emu, ctx, fifo)


def _plan(emu: "Core", ctx: "Ctx", fifo: "list[Instr]") -> Callable[[], None]:
    f = ctx.ins.fields
    arch = emu.arch
    pp, cp = arch.pp, arch.icp
    num, vpp, cg, L = f["num"], f["valid_pixel_parallel"], f["channel_group"], f["length"]
    etype = f["elew_type"]
    ctx.check(etype in (ELEW_ADD, ELEW_MUL), "elew_type",
              f"not an elew_type of {arch.name} ({ELEW_ADD} add, {ELEW_MUL} mul)")
    ctx.check(etype != ELEW_MUL or num == 2, "num", "mult needs exactly 2 inputs")
    ctx.check(f["act_type"] in emu.allowed_acts("elew"), "act_type", f"not an ELEW activation of {arch.name}")
    ctx.check(vpp <= arch.alu_pp, "valid_pixel_parallel", f"> eltwise pixel parallelism {arch.alu_pp}")
    ctx.check(len(fifo) >= num, "num", f"only {len(fifo)} pending ELEWINIT(s)")
    inits = fifo[:num]
    bank_out = emu.check_image_bank(ctx, "bank_id_out")
    C = cg * cp
    k = np.arange(vpp, dtype=np.int64)
    j = np.arange(L, dtype=np.int64)
    readers, shifts = [], []
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
        b_rows = np.broadcast_arrays(banks[:, None], rows)
        keys = emu.banks.keys(b_rows[0], b_rows[1], -(-C // emu.banks.width))  # (vpp, L, rows)
        readers.append(emu.banks.row_reader(keys, C))
        shifts.append(g["shift_read"])
    sw = f["shift_write"]
    scale = sw - SHIFT_WRITE_RIGHT if sw >= SHIFT_WRITE_RIGHT else -sw
    scale += 2 if etype == ELEW_ADD else 4
    relu = f["act_type"] == ACT_RELU
    g0 = bank_out - bank_out % pp
    u = bank_out + k
    obanks = g0 + (u - g0) % pp
    orows = f["bank_addr_out"] + ((u - g0) // pp) * f["jump_write_endl"]
    rows = orows[:, None] + j[None, :] * f["jump_write"]
    write = emu.banks.row_writer(emu.banks.keys(obanks[:, None], rows, -(-C // emu.banks.width)), C)
    params = (tuple(shifts), etype, scale, relu)
    if num > TABLE_MAX_INPUTS:
        def run() -> None:
            del emu.elew_fifo[:num]
            write(combine([read().view(np.int8) for read in readers], *params).view(np.uint8))
        return run
    table = result_table(num, *params)
    read0 = readers[0]
    read1 = readers[-1]

    def run_table() -> None:
        del emu.elew_fifo[:num]
        if num == 1:
            index = read0()
        else:
            index = np.left_shift(read0(), 8, dtype=np.uint16)
            np.bitwise_or(index, read1(), out=index)
        write(np.take(table, index))
    return run_table


def combine(xs: list[np.ndarray], shifts: tuple[int, ...], etype: int, scale: int, relu: bool) -> np.ndarray:
    """The ELEW arithmetic (8.3) of int8 operands `xs` (one per ELEWINIT), exactly: int8 result."""
    total = None
    for x, sr in zip(xs, shifts):
        a = (x.astype(np.int64) << 2) >> sr
        if total is None:
            total = a
        elif etype == ELEW_ADD:
            total = total + a
        else:
            total = total * a
    out = shift_round(total, scale)
    if relu:
        out = np.maximum(out, 0)
    return saturate_int8(out)


@functools.lru_cache(maxsize=256)
def result_table(num: int, shifts: tuple[int, ...], etype: int, scale: int, relu: bool) -> np.ndarray:
    """`combine` of every combination of `num` <= TABLE_MAX_INPUTS int8 operands, as uint8 indexed by the
    operands' bytes (x0 * 256 + x1): an ELEW is then one table lookup per element, exact by construction.
    Read-only (shared between emulators and threads)."""
    v = np.arange(256, dtype=np.uint8).view(np.int8)
    grids = [g.reshape(-1) for g in np.meshgrid(*[v] * num, indexing="ij")]
    table = combine(grids, shifts, etype, scale, relu).view(np.uint8)
    table.flags.writeable = False
    return table
