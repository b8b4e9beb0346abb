"""CONV (with the most recent CONVINIT), isa1-semantics.md 6, plus the window fetch shared with the ALU."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from tvm_dpu.quant.fixpoint import LEAKY_NUM, LEAKY_SHIFT, RELU6_MAX, saturate_int8, shift_round
from tvm_dpu.runtime.banks import fetch_rows, store_rows

if TYPE_CHECKING:
    from tvm_dpu.runtime.emulator import Ctx, Emulator

#: CONV kernel / stride white-lists of conv_limit (defaults "1-16" / "1-8").
CONV_KERNEL_MAX = 16
CONV_STRIDE_MAX = 8
SHIFT_BIAS_MAX = 20
#: Highest bank-address slot (bank_addr_in, _1, _2, _3).
MAX_ADDR_GROUP = 3


def fetch_window(emu: "Emulator", ctx: "Ctx", *, bank_id: int, height: int, width: int, nbytes: int,
                 stride_h: int, offset_in: int, endl: int, jump: int, bases: tuple[int, ...]) -> np.ndarray:
    """Gather the (height, width, nbytes) int8 input window with the row-fetch rule (3.3)."""
    pp = emu.arch.pp
    rm = fetch_rows(bank_id, pp, height, stride_h, offset_in, endl, bases)
    if height and int(rm.groups.max()) > MAX_ADDR_GROUP:
        raise ctx.error("bank_id_in", f"window of {height} rows (stride {stride_h}, stride_offset_in {offset_in}) "
                                      f"wraps the bank group {int(rm.groups.max())} times from bank {bank_id}; "
                                      f"at most {MAX_ADDR_GROUP} wraps (bank_addr_in_1..3)")
    rows = rm.rows[:, None] + np.arange(width, dtype=np.int64)[None, :] * jump
    return emu.banks.read(rm.banks[:, None], rows, nbytes).view(np.int8)


def apply_pads(x: np.ndarray, kh: int, kw: int, top: int, left: int, bottom_last: int, right_last: int,
               value: int) -> None:
    """Padding of a fetched (H, W, C) window in place, with the 'last valid index' right/bottom encoding (6.3)."""
    h, w = x.shape[:2]
    x[:top] = value
    x[:, :left] = value
    x[max(0, h - kh + bottom_last + 1):] = value
    x[:, max(0, w - kw + right_last + 1):] = value


def activate(v: np.ndarray, shift: int, act: int) -> np.ndarray:
    """DPURound(act(v / 2**shift)) for integer v, exactly; act codes 0 none, 1 relu, 3 leaky, 4 relu6."""
    out = shift_round(v, shift)
    if act == 1:
        out = np.maximum(out, 0)
    elif act == 4:
        out = np.clip(out, 0, RELU6_MAX)
    elif act == 3:
        neg = shift_round(v * LEAKY_NUM, shift + LEAKY_SHIFT)
        out = np.where(v < 0, neg, out)
    return saturate_int8(out)


#: Row-chunk of the exact matmul. One big GEMM makes multi-threaded OpenBLAS spin up threads, which on a
#: loaded 2-core machine is 10-20x slower than a few single-threaded GEMMs of this size.
MATMUL_ROWS = 64


def exact_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer a (M, K) @ b (K, N) as int64, through float64 BLAS: exact while |sums| < 2**53 (int8/int16
    products over at most 2**20 terms)."""
    af = a.astype(np.float64)
    bf = np.ascontiguousarray(b, dtype=np.float64)
    out = np.empty((a.shape[0], b.shape[1]), dtype=np.float64)
    for r in range(0, a.shape[0], MATMUL_ROWS):
        np.matmul(af[r:r + MATMUL_ROWS], bf, out=out[r:r + MATMUL_ROWS])
    return out.astype(np.int64)


def conv(emu: "Emulator", ctx: "Ctx") -> None:
    f = ctx.ins.fields
    init = emu.convinit
    ctx.check(init is not None, None, "no CONVINIT before this CONV")
    g = init.fields
    arch = emu.arch
    pp, icp, ocp = arch.pp, arch.icp, arch.ocp
    bank_in = emu.check_image_bank(ctx, "bank_id_in")
    bank_out = emu.check_image_bank(ctx, "bank_id_out")
    kh, kw, sh, sw = g["kernel_h"], g["kernel_w"], g["stride_h"], g["stride_w"]
    vpp, cg, L = g["valid_pixel_parallel"], f["channel_group"], f["length"]
    ctx.check(kh <= CONV_KERNEL_MAX and kw <= CONV_KERNEL_MAX, None,
              f"CONVINIT kernel {kh}x{kw} outside the conv kernel_size white-list 1-{CONV_KERNEL_MAX}")
    ctx.check(sh <= CONV_STRIDE_MAX and sw <= CONV_STRIDE_MAX, None,
              f"CONVINIT stride {sh}x{sw} outside the conv stride white-list 1-{CONV_STRIDE_MAX}")
    ctx.check(vpp <= pp, None, f"CONVINIT valid_pixel_parallel={vpp} > PP={pp}")
    ctx.check(g["stride_offset_in"] < sh, None,
              f"CONVINIT stride_offset_in={g['stride_offset_in']} must be < stride_h={sh}")
    ctx.check(g["shift_bias"] <= SHIFT_BIAS_MAX, None,
              f"CONVINIT shift_bias={g['shift_bias']} > {SHIFT_BIAS_MAX}")
    act = g["act_type"]
    ctx.check(act in emu.allowed_acts("conv") and act in (0, 1, 3, 4), None,
              f"CONVINIT act_type={act} not allowed on {arch.name} CONV (allowed {sorted(emu.allowed_acts('conv'))})")
    cin = cg * icp
    choff = f["channel_offset"]
    ctx.check(choff <= cin, "channel_offset", f"masks more than the {cin} input channels")
    real_h = (vpp - 1) * sh + kh
    src_w = (L - 1) * sw + kw
    x = fetch_window(emu, ctx, bank_id=bank_in, height=real_h, width=src_w, nbytes=cin, stride_h=sh,
                     offset_in=g["stride_offset_in"], endl=g["jump_read_endl"], jump=g["jump_read"],
                     bases=(f["bank_addr_in"], f["bank_addr_in_1"], f["bank_addr_in_2"], f["bank_addr_in_3"]))
    apply_pads(x, kh, kw, f["pad_top"], f["pad_left"], f["pad_bottom"], f["pad_right"], 0)
    if choff:
        x[..., cin - choff:] = 0
    # Weights: CONVW bank o, tap (i, j) at row bank_addr_weights + (i*kw + j)*cg, Cin bytes.
    wbase = arch.bank_group("CONVW").base_id
    taps = f["bank_addr_weights"] + np.arange(kh * kw, dtype=np.int64) * cg
    w = emu.banks.read((wbase + np.arange(ocp, dtype=np.int64))[:, None], taps[None, :], cin).view(np.int8)
    bias = emu.banks.read(np.int64(arch.bank_group("BIAS").base_id), np.int64(f["bank_addr_bias"]), ocp)
    bias = bias.view(np.int8).astype(np.int64)
    # (vpp, L, Cin, kh, kw) windows -> one (vpp*L, kh*kw*Cin) x (kh*kw*Cin, OCP) product.
    win = sliding_window_view(x, (kh, kw), axis=(0, 1))[::sh, ::sw][:vpp, :L]
    patches = win.transpose(0, 1, 3, 4, 2).reshape(vpp * L, kh * kw * cin)
    acc = exact_matmul(patches, w.reshape(ocp, kh * kw * cin).T)
    v = 2 * acc + (bias << g["shift_bias"])[None, :]
    out = activate(v, g["shift_cut"] + 1, act).reshape(vpp, L, ocp)
    obanks, orows = store_rows(bank_out, pp, vpp, g["stride_out"], g["stride_offset_out"], g["jump_write_endl"],
                               f["bank_addr_out"])
    rows = orows[:, None] + np.arange(L, dtype=np.int64)[None, :] * g["jump_write"]
    emu.banks.write(obanks[:, None], rows, out)
    emu.stats.macs += vpp * L * ocp * kh * kw * cin
