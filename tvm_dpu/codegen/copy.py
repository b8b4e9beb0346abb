"""Data movement without arithmetic: copy a map into another DDR place, nearest-neighbour upsampling.

Both go through an image bank: LOAD a line, then SAVE it once per output position it feeds. Upsampling by
(sh, sw) saves each input line sh*sw times with a DDR pitch of sw output pixels, so it is exact and costs no
compute engine. A plain copy (sh = sw = 1) serves a concat whose inputs could not be saved into place.
"""
from __future__ import annotations

from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.layout import ceil_div
from tvm_dpu.types import FMap
from tvm_dpu.codegen.program import Program
from tvm_dpu.codegen.tiling import CodegenError, split_even

_LEN_MAX = 1024  # LOAD / SAVE length
_SAVE_CH_MAX = 4096  # SAVE channel (12-bit minus)


def emit_upsample(prog: Program, arch: Arch, name: str, x: FMap, y: FMap, scale: tuple[int, int], x_res: str,
                  y_res: str) -> None:
    """y[(i*sh + dy), (j*sw + dx)] = x[i, j] for all dy < sh, dx < sw (scale (1, 1) is a copy)."""
    sh, sw = scale
    if (y.h, y.w, y.c) != (x.h * sh, x.w * sw, x.c):
        raise CodegenError(f"op {name!r}: output {y.h}x{y.w}x{y.c} is not input {x.h}x{x.w}x{x.c} scaled by {scale}")
    cp = arch.icp
    half = arch.bank_depth // 2
    vb0 = arch.bank_group("VB0").base_id
    cg = ceil_div(x.c, cp)
    chunk = min(cg, _SAVE_CH_MAX // cp, half)
    lmax = min(_LEN_MAX, half // chunk, x.w)
    buf = 0
    for g0, n in split_even(cg, chunk):
        c0 = g0 * cp
        cc = min(n * cp, x.c - c0)
        for q0, length in split_even(x.w, lmax):
            for i in range(x.h):
                bank = vb0 + i % arch.pp
                base = buf * half
                prog.emit("LOAD", reads=(("ddr", x_res),), writes=(("vb0", buf, bank),), bank_id=bank,
                          bank_addr=base, length=length, channel=cc, jump_read=x.pixel_pitch, jump_write=n,
                          reg_id=x.reg_id, ddr_addr=x.addr(i, q0, c0))
                for dy in range(sh):
                    for dx in range(sw):
                        prog.emit("SAVE", reads=(("vb0", buf, bank),), writes=(("ddr", y_res),), bank_id=bank,
                                  bank_addr=base, length=length, channel=cc, jump_read=n,
                                  jump_write=sw * y.pixel_pitch, reg_id=y.reg_id,
                                  ddr_addr=y.addr(i * sh + dy, q0 * sw + dx, c0))
                if i % arch.pp == arch.pp - 1:
                    buf ^= 1
            buf ^= 1
