"""Code generation of element-wise ops on the ELEW engine (add / mul of 1-4 equal-shape maps, optional ReLU).

A tile is up to PP image rows x L pixels x a chunk of channel groups. Row r of every operand is loaded into bank r
of VB0, each operand at its own base address; one ELEW covers alu_pp rows (its pixel parallelism), so a tile
takes ceil(rows / alu_pp) ELEWs, each preceded by one ELEWINIT per operand (the FIFO binding of
isa1-semantics.md 8.1). Outputs go to the same rows of VB1 and are saved row by row.

Channel gate (multiply of an H x W map by a 1 x 1 map of the same channels, squeeze-and-excitation): the gate's
channels of the tile's chunk are loaded once per tile into one bank row group, and its ELEWINIT reads them with
share_pp = 1 (the same bank for all vpp pixel rows) and jump_read = 0 (the same pixel for every column,
isa1-semantics.md 8.2), so the ELEW engine itself broadcasts the gate over H x W: no copy of the gate per pixel,
no extra instruction per pixel. The multiply arithmetic is the ordinary ELEW mult (8.3).
"""
from __future__ import annotations

from dataclasses import dataclass

from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.isa import enum_code
from tvm_dpu.codegen.layout import ceil_div
from tvm_dpu.types import FMap
from tvm_dpu.codegen.program import Program
from tvm_dpu.codegen.tiling import CodegenError, split_even

_LENGTH_MAX = 1024  # ELEW length is 11 bits, but LOAD/SAVE lengths are 10-bit minus fields
_CG_MAX = 256  # 8-bit minus channel_group
_JUMP_MAX = 4095  # 12-bit jump_read / jump_write (not minus)


@dataclass(frozen=True)
class ElewJob:
    name: str
    c: int
    kind: str  # "add" | "mul"
    act_type: int  # 0 none, 1 relu
    shift_read: tuple[int, ...]  # per operand
    shift_write: int  # 5-bit field


def emit_elew(prog: Program, arch: Arch, job: ElewJob, xs: list[FMap], y: FMap, x_res: list[str],
              y_res: str) -> None:
    n_in = len(xs)
    if not 1 <= n_in <= 4:
        raise CodegenError(f"op {job.name!r}: ELEW takes 1-4 operands, got {n_in}")
    if job.kind == "mul" and n_in != 2:
        raise CodegenError(f"op {job.name!r}: element-wise multiply needs exactly 2 operands")
    gate = [(x.h, x.w) == (1, 1) and (y.h, y.w) != (1, 1) for x in xs]
    if any(gate) and (job.kind != "mul" or gate[0]):
        raise CodegenError(f"op {job.name!r}: only the second operand of a multiply may be a 1x1 channel gate")
    cp = arch.icp
    half = arch.bank_depth // 2
    cg = ceil_div(job.c, cp)
    chunk = min(cg, _CG_MAX)
    while chunk > 1 and (n_in * chunk > half):
        chunk //= 2
    lmax = min(_LENGTH_MAX, half // (n_in * chunk), y.w)
    if lmax < 1:
        raise CodegenError(f"op {job.name!r}: no element-wise tile fits half an image bank of {arch.name}")
    vb0 = arch.bank_group("VB0").base_id
    vb1 = arch.bank_group("VB1").base_id
    rows = arch.pp
    buf = 0
    for g0, n in split_even(cg, chunk):
        c0 = g0 * cp
        cc = min(n * cp, job.c - c0)
        for p0 in range(0, y.h, rows):
            nr = min(rows, y.h - p0)
            for q0, length in split_even(y.w, lmax):
                base = buf * half
                for i, (x, res) in enumerate(zip(xs, x_res)):
                    if gate[i]:  # n rows of the gate, read by every pixel of the tile
                        prog.emit("LOAD", reads=(("ddr", res),), writes=(("vb0", buf),), bank_id=vb0,
                                  bank_addr=base + i * length * n, length=1, channel=cc, jump_read=x.pixel_pitch,
                                  jump_write=n, reg_id=x.reg_id, ddr_addr=x.addr(0, 0, c0))
                        continue
                    for r in range(nr):
                        prog.emit("LOAD", reads=(("ddr", res),), writes=(("vb0", buf),), bank_id=vb0 + r,
                                  bank_addr=base + i * length * n, length=length, channel=cc,
                                  jump_read=x.pixel_pitch, jump_write=n, reg_id=x.reg_id,
                                  ddr_addr=x.addr(p0 + r, q0, c0))
                for k0 in range(0, nr, arch.alu_pp):
                    vpp = min(arch.alu_pp, nr - k0)
                    for i in range(n_in):
                        prog.emit("ELEWINIT", bank_id_in=vb0 if gate[i] else vb0 + k0, share_pp=int(gate[i]),
                                  jump_bank=1, id=i, jump_read_endl=1, bank_addr_in=base + i * length * n,
                                  shift_read=job.shift_read[i], jump_read=0 if gate[i] else n)
                    prog.emit("ELEW", reads=(("vb0", buf),), writes=(("vb1", buf),), bank_id_out=vb1 + k0,
                              elew_type=enum_code("elew_type", job.kind), act_type=job.act_type, length=length,
                              valid_pixel_parallel=vpp, num=n_in, jump_write_endl=1, bank_addr_out=base,
                              channel_group=n, shift_write=job.shift_write, jump_write=n)
                for r in range(nr):
                    prog.emit("SAVE", reads=(("vb1", buf),), writes=(("ddr", y_res),), bank_id=vb1 + r,
                              bank_addr=base, length=length, channel=cc, jump_read=n, jump_write=y.pixel_pitch,
                              reg_id=y.reg_id, ddr_addr=y.addr(p0 + r, q0, c0))
                buf ^= 1
