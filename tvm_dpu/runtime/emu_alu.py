"""ALU (with the most recent ALUINIT): depthwise conv, PReLU, pooling, leaky, max-reduce, hard sigmoid
(isa1-semantics.md 9)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from tvm_dpu.codegen.isa import enum_codes, enum_name
from tvm_dpu.quant.fixpoint import HSIGMOID_MUL, INT8_MIN, saturate_int8, shift_round
from tvm_dpu.runtime.banks import store_rows
from tvm_dpu.runtime.emu_conv import (ENGINE_ACTS, SHIFT_BIAS_MAX, activate, fetch_window, pad_slices,
                                      window_use)

if TYPE_CHECKING:
    from tvm_dpu.runtime.emulator import Ctx, Emulator

_MODE = enum_codes("alu_exec_mode")
DWCONV, PRELU, AVGPOOL, MAXPOOL = _MODE["dwconv"], _MODE["prelu"], _MODE["avgpool"], _MODE["maxpool"]
LEAKY, MAXREDUCE, DWCONV_NOBIAS = _MODE["leaky_relu"], _MODE["maxreduce"], _MODE["dwconv_nobias"]
HARD_SIGMOID, DWCONV_W16 = _MODE["hard_sigmoid"], _MODE["dwconv_w16"]
ALU_MODES = frozenset(_MODE.values())  # ISA1 alu_type list: modes 0-8
#: hard-sigmoid clamp of the pre-shift value (9.2, mode 7).
HSIGMOID_CLAMP = 1 << 32


def _tsc(sc: int) -> int:
    """Pooling scale exponent: shift left by sc when sc < 8, right by sc - 8 otherwise."""
    return sc if sc < 8 else -(sc - 8)


def _shp(v: int) -> int:
    """PReLU divide exponent: v - 32 when v >= 32, else -v."""
    return v - 32 if v >= 32 else -v


def alu(emu: "Emulator", ctx: "Ctx") -> None:
    f = ctx.ins.fields
    init = emu.aluinit
    ctx.check(init is not None, None, "no ALUINIT before this ALU")
    g = init.fields
    arch = emu.arch
    pp, cp = arch.pp, arch.icp
    mode = g["exec_mode"]
    ctx.check(mode in ALU_MODES, None,
              f"ALUINIT exec_mode={mode} not an ALU mode of {arch.name} ({min(ALU_MODES)}-{max(ALU_MODES)})")
    bank_in = emu.check_image_bank(ctx, "bank_id_in")
    bank_out = emu.check_image_bank(ctx, "bank_id_out")
    kh, kw, sh, sw = g["kernel_h"], g["kernel_w"], g["stride_h"], g["stride_w"]
    vpp, cg, L, D = f["valid_pixel_parallel"], g["channel_group"], g["length"], f["kernel_d"]
    ctx.check(vpp <= arch.alu_pp, "valid_pixel_parallel", f"> ALU pixel parallelism {arch.alu_pp}")
    ctx.check(g["stride_offset_in"] < sh, None,
              f"ALUINIT stride_offset_in={g['stride_offset_in']} must be < stride_h={sh}")
    ctx.check(g["shift_bias"] <= SHIFT_BIAS_MAX, None, f"ALUINIT shift_bias={g['shift_bias']} > {SHIFT_BIAS_MAX}")
    act = g["act_type"]
    allowed = emu.allowed_acts("alu")
    ctx.check(act in allowed and act in ENGINE_ACTS, None,
              f"ALUINIT act_type={act} not allowed on {arch.name} ALU (allowed {sorted(allowed)})")
    if mode in (PRELU, LEAKY, HARD_SIGMOID):
        ctx.check(kh == kw == sh == sw == D == 1, None,
                  f"ALU mode {enum_name('alu_exec_mode', mode)} needs kernel, stride and kernel_d 1 "
                  f"(kernel {kh}x{kw}, stride {sh}x{sw}, kernel_d {D})")
    C = cg * cp
    real_h = (vpp - 1) * sh + kh
    src_w = (L - 1) * sw + kw
    # maxreduce ignores padding and channel_offset (9.1): it depends on every byte it fetches.
    masked = mode != MAXREDUCE
    pads = pad_slices(real_h, src_w, kh, kw, f["pad_top"], f["pad_left"], f["pad_bottom"], f["pad_right"]) \
        if masked else []
    choff = min(g["channel_offset"], C) if masked else 0
    x = fetch_window(emu, ctx, bank_id=bank_in, height=real_h, width=src_w, nbytes=C * D, stride_h=sh,
                     offset_in=g["stride_offset_in"], endl=g["jump_read_endl"], jump=g["jump_read"],
                     bases=(f["bank_addr_in"], f["bank_addr_in_1"], f["bank_addr_in_2"], f["bank_addr_in_3"]),
                     used=window_use(real_h, src_w, kh, kw, sh, sw, pads, cg, D, cp, choff)
                     if emu.banks.trace is not None else None)
    x = x.reshape(real_h, src_w, D, C)
    if masked:
        pad = INT8_MIN if mode == MAXPOOL else 0
        for region in pads:
            x[region] = pad
        if choff:
            x[..., C - choff:] = pad
    win = sliding_window_view(x, (kh, kw), axis=(0, 1))[::sh, ::sw][:vpp, :L]  # (vpp, L, D, C, kh, kw)
    banks = emu.banks
    dw_bank = np.int64(arch.bank_group("DWCONVW").base_id)
    if mode in (DWCONV, DWCONV_NOBIAS, DWCONV_W16):
        taps = (f["bank_addr_weights"] + np.arange(kh * kw, dtype=np.int64) * g["jump_read_weights"])
        if mode == DWCONV_W16:
            rows = taps[:, None] + np.arange(D, dtype=np.int64)[None, :] * cg * 2
            raw = banks.read(dw_bank, rows, 2 * C)  # (taps, D, 2C) little-endian int16 per element
            w16 = raw.reshape(kh * kw, D, C, 2).astype(np.int64)
            w16 = (w16[..., 0] | (w16[..., 1] << 8))
            w16 = np.where(w16 >= 1 << 15, w16 - (1 << 16), w16)
            # One weight per channel group: channel c uses element c - c % CP.
            w = w16[:, :, (np.arange(C) // cp) * cp]
        else:
            rows = taps[:, None] + np.arange(D, dtype=np.int64)[None, :] * cg
            w = banks.read(dw_bank, rows, C).view(np.int8).astype(np.int64)
        w = w.reshape(kh, kw, D, C)
        # Exact int64 multiply-accumulate over (d, i, j); no BLAS needed for a per-channel product.
        acc = (win.astype(np.int64) * w.transpose(2, 3, 0, 1)).sum(axis=(2, 4, 5))
        emu.stats.macs += vpp * L * C * kh * kw * D
        if mode == DWCONV:
            bias = banks.read(np.int64(arch.bank_group("BIAS").base_id), np.int64(f["bank_addr_bias"]), C)
            v = 2 * acc + (bias.view(np.int8).astype(np.int64) << g["shift_bias"])
            out = activate(v, g["shift_cut"] + 1, act)
        else:
            out = activate(acc, g["shift_cut"], act)
    elif mode in (PRELU, LEAKY):
        xv = win[:, :, 0, :, 0, 0].astype(np.int64)  # (vpp, L, C)
        if mode == PRELU:
            alpha = banks.read(dw_bank, np.int64(f["bank_addr_weights"]), C).view(np.int8).astype(np.int64)
        else:
            alpha = np.full(C, np.int8(np.uint8(g["multi_factor"]).view(np.int8)), dtype=np.int64)
        t = np.where(xv < 0, xv * alpha, xv)
        neg = shift_round(t, _shp(g["shift_prelu_n"]))
        pos = shift_round(t, _shp(g["shift_prelu_p"]))
        out = saturate_int8(np.where(t < 0, neg, pos))
    elif mode == AVGPOOL:
        s = win[:, :, 0].astype(np.int64).sum(axis=(-2, -1))
        mf = int(np.uint8(g["multi_factor"]).view(np.int8))
        out = saturate_int8(shift_round(s * mf, -_tsc(g["shift_cut"])))
    elif mode in (MAXPOOL, MAXREDUCE):
        m = np.maximum(win[:, :, 0].max(axis=(-2, -1)).astype(np.int64), INT8_MIN)
        out = saturate_int8(shift_round(m, -_tsc(g["shift_cut"])))
    else:  # HARD_SIGMOID
        xv = win[:, :, 0, :, 0, 0].astype(np.int64)
        v = np.clip(xv * HSIGMOID_MUL + (3 * HSIGMOID_MUL << g["shift_bias"]), 0, HSIGMOID_CLAMP)
        out = saturate_int8(shift_round(v, g["shift_cut"]))
    obanks, orows = store_rows(bank_out, pp, vpp, g["stride_out"], g["stride_offset_out"], g["jump_write_endl"],
                               f["bank_addr_out"])
    rows = orows[:, None] + np.arange(L, dtype=np.int64)[None, :] * g["jump_write"]
    banks.write(obanks[:, None], rows, out.reshape(vpp, L, C))

