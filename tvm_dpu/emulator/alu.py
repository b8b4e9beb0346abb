"""ALU (with the most recent ALUINIT): depthwise conv, PReLU, pooling, leaky, max-reduce, hard sigmoid
(isa1-semantics.md 9)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from tvm_dpu.codegen.isa import enum_codes, enum_name
from tvm_dpu.quant.fixpoint import HSIGMOID_MUL, INT8_MAX, INT8_MIN, saturate_int8, shift_round
from tvm_dpu.emulator import gemm as emu_gemm
from tvm_dpu.emulator.banks import store_rows
from tvm_dpu.emulator.conv import (CLAMPS, ENGINE_ACTS, SHIFT_BIAS_MAX, window_gather, activate,
                                      pad_slices, window_use)

if TYPE_CHECKING:
    from tvm_dpu.codegen.isa import Instr
    from tvm_dpu.emulator.context import Core, Ctx, Step

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


def alu(emu: "Core", ctx: "Ctx") -> None:
    """Interpret one ALU under the ALUINIT in force now (an ALU whose ALUINIT the compiled program cannot know)."""
    plan_alu(emu, ctx, emu.aluinit)(emu.regions)


def plan_alu(emu: "Core", ctx: "Ctx", init: "Instr | None") -> "AluStep":
    """Check an ALU under ALUINIT `init` and precompute its window gather, parameter reads and output scatter;
    returns the step that performs it (reading the banks when it runs)."""
    f = ctx.ins.fields
    ctx.check(init is not None, None, "no ALUINIT before this ALU")
    g = init.fields
    arch = emu.arch
    mode = g["exec_mode"]
    _check(emu, ctx, g, mode)
    kh, kw, sh, sw = g["kernel_h"], g["kernel_w"], g["stride_h"], g["stride_w"]
    vpp, cg, L, D = f["valid_pixel_parallel"], g["channel_group"], g["length"], f["kernel_d"]
    C = cg * arch.icp
    real_h = (vpp - 1) * sh + kh
    src_w = (L - 1) * sw + kw
    # maxreduce ignores padding and channel_offset (9.1): it depends on every byte it fetches.
    masked = mode != MAXREDUCE
    pads = pad_slices(real_h, src_w, kh, kw, f["pad_top"], f["pad_left"], f["pad_bottom"], f["pad_right"]) \
        if masked else []
    choff = min(g["channel_offset"], C) if masked else 0
    # What is overwritten with the pad value after each gather: padding, then the masked tail channels (6.3).
    fills = pads + ([(Ellipsis, slice(C - choff, None))] if choff else [])
    gather, window_keys = window_gather(
        emu, ctx, bank_id=emu.check_image_bank(ctx, "bank_id_in"), height=real_h, width=src_w, nrow=C * D // arch.icp,
        stride_h=sh, offset_in=g["stride_offset_in"], endl=g["jump_read_endl"], jump=g["jump_read"],
        bases=(f["bank_addr_in"], f["bank_addr_in_1"], f["bank_addr_in_2"], f["bank_addr_in_3"]),
        used=window_use(real_h, src_w, kh, kw, sh, sw, pads, cg, D, arch.icp, choff)
        if emu.banks.trace is not None else None)
    xbuf = emu_gemm.aligned_empty((real_h, src_w, C * D // arch.icp, arch.icp), np.uint8)  # the kernel's input
    x = xbuf.view(np.int8).reshape(real_h, src_w, D, C)
    pad = INT8_MIN if mode == MAXPOOL else 0
    compute = _compute(emu, ctx, g, mode, x, vpp, L, D, C)
    obanks, orows = store_rows(emu.check_image_bank(ctx, "bank_id_out"), arch.pp, vpp, g["stride_out"],
                               g["stride_offset_out"], g["jump_write_endl"], f["bank_addr_out"])
    rows = orows[:, None] + np.arange(L, dtype=np.int64)[None, :] * g["jump_write"]
    out_keys = emu.banks.keys(obanks[:, None], rows, -(-C // arch.icp))
    write = emu.banks.row_writer(out_keys, C)

    def step() -> None:
        gather(xbuf)
        for region in fills:
            x[region] = pad
        write(compute().view(np.uint8))
    return AluStep(step, window_keys.reshape(-1), out_keys.reshape(-1))


@dataclass(eq=False)
class AluStep:
    """A planned ALU: callable as its step, with the image-bank rows it reads and writes (the emulator's CONV
    grouping checks them; its parameter rows are in DWCONVW / BIAS, which no CONV writes)."""

    run: Callable[[], None]
    reads: np.ndarray  # bank row keys of the window
    writes: np.ndarray  # bank row keys written

    def __call__(self, regions: object) -> None:
        self.run()


def _check(emu: "Core", ctx: "Ctx", g: dict, mode: int) -> None:
    """The ALUINIT / ALU field checks of the simulator."""
    f = ctx.ins.fields
    arch = emu.arch
    ctx.check(mode in ALU_MODES, None,
              f"ALUINIT exec_mode={mode} not an ALU mode of {arch.name} ({min(ALU_MODES)}-{max(ALU_MODES)})")
    emu.check_image_bank(ctx, "bank_id_in")
    emu.check_image_bank(ctx, "bank_id_out")
    kh, kw, sh, sw, D = g["kernel_h"], g["kernel_w"], g["stride_h"], g["stride_w"], f["kernel_d"]
    ctx.check(f["valid_pixel_parallel"] <= arch.alu_pp, "valid_pixel_parallel", f"> ALU pixel parallelism {arch.alu_pp}")
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


def _compute(emu: "Core", ctx: "Ctx", g: dict, mode: int, x: np.ndarray, vpp: int, L: int, D: int,
             C: int) -> Callable[[], np.ndarray]:
    """The function computing the (vpp, L, C) int8 output of the ALU from its padded window `x` (real_h, src_w,
    D, C), reading its parameters from the banks when called."""
    if mode in (DWCONV, DWCONV_NOBIAS, DWCONV_W16):
        return _dwconv(emu, ctx, g, mode, x, vpp, L)
    kh, kw, sh, sw = g["kernel_h"], g["kernel_w"], g["stride_h"], g["stride_w"]
    win = sliding_window_view(x, (kh, kw), axis=(0, 1))[::sh, ::sw][:vpp, :L]  # (vpp, L, D, C, kh, kw)
    if mode in (PRELU, LEAKY):
        if mode == PRELU:
            read = emu.banks.row_reader(_param_keys(emu, "DWCONVW", ctx.ins.fields["bank_addr_weights"], C), C)
            alpha_of = lambda: read().view(np.int8).astype(np.int64)  # noqa: E731
        else:
            alpha = np.full(C, np.int8(np.uint8(g["multi_factor"]).view(np.int8)), dtype=np.int64)
            alpha_of = lambda: alpha  # noqa: E731

        def prelu() -> np.ndarray:
            xv = win[:, :, 0, :, 0, 0].astype(np.int64)  # (vpp, L, C)
            t = np.where(xv < 0, xv * alpha_of(), xv)
            neg = shift_round(t, _shp(g["shift_prelu_n"]))
            pos = shift_round(t, _shp(g["shift_prelu_p"]))
            return saturate_int8(np.where(t < 0, neg, pos))
        return prelu
    if mode == AVGPOOL:
        mf = int(np.uint8(g["multi_factor"]).view(np.int8))
        return lambda: saturate_int8(shift_round(win[:, :, 0].astype(np.int64).sum(axis=(-2, -1)) * mf,
                                                 -_tsc(g["shift_cut"])))
    if mode in (MAXPOOL, MAXREDUCE):
        return lambda: saturate_int8(shift_round(np.maximum(win[:, :, 0].max(axis=(-2, -1)).astype(np.int64),
                                                            INT8_MIN), -_tsc(g["shift_cut"])))

    def hard_sigmoid() -> np.ndarray:
        xv = win[:, :, 0, :, 0, 0].astype(np.int64)
        v = np.clip(xv * HSIGMOID_MUL + (3 * HSIGMOID_MUL << g["shift_bias"]), 0, HSIGMOID_CLAMP)
        return saturate_int8(shift_round(v, g["shift_cut"]))
    return hard_sigmoid


def _param_keys(emu: "Core", group: str, rows: "np.ndarray | int", nbytes: int) -> np.ndarray:
    """Row keys of `nbytes` bytes at each of `rows` of the first bank of parameter group `group`."""
    banks = emu.banks
    return banks.keys(np.int64(banks.base_id[group]), np.asarray(rows, dtype=np.int64), -(-nbytes // banks.width))


def _dw_weights(emu: "Core", ctx: "Ctx", g: dict, mode: int, D: int, C: int) -> Callable[[], np.ndarray]:
    """The function reading the (taps, D, C) depthwise weights from the DWCONVW bank (int8, or the int16 of
    dwconv_w16 as int64)."""
    f = ctx.ins.fields
    cg, cp = g["channel_group"], emu.arch.icp
    taps = f["bank_addr_weights"] + np.arange(g["kernel_h"] * g["kernel_w"], dtype=np.int64) * g["jump_read_weights"]
    if mode != DWCONV_W16:
        read = emu.banks.row_reader(_param_keys(emu, "DWCONVW", taps[:, None] + np.arange(D) * cg, C), C)
        return lambda: read().view(np.int8)
    read16 = emu.banks.row_reader(_param_keys(emu, "DWCONVW", taps[:, None] + np.arange(D) * cg * 2, 2 * C), 2 * C)
    # One weight per channel group: channel c uses element c - c % CP.
    first_of_group = (np.arange(C) // cp) * cp

    def weights16() -> np.ndarray:
        raw = read16()  # (taps, D, 2C) little-endian int16 per element
        w16 = raw.reshape(raw.shape[:2] + (C, 2)).astype(np.int64)
        w16 = (w16[..., 0] | (w16[..., 1] << 8))
        w16 = np.where(w16 >= 1 << 15, w16 - (1 << 16), w16)
        return w16[:, :, first_of_group]
    return weights16


def _dwconv(emu: "Core", ctx: "Ctx", g: dict, mode: int, x: np.ndarray, vpp: int,
            L: int) -> Callable[[], np.ndarray]:
    """Depthwise conv: one multiply-add per tap and depth slice over all (vpp, L, C) outputs, in int32 where the
    accumulator, bias and rounding cannot overflow it (else int64), then the shift, activation and clamp."""
    kh, kw, sh, sw = g["kernel_h"], g["kernel_w"], g["stride_h"], g["stride_w"]
    D, C = x.shape[2], x.shape[3]
    emu.stats.macs += vpp * L * C * kh * kw * D
    weights = _dw_weights(emu, ctx, g, mode, D, C)
    act, sb = g["act_type"], g["shift_bias"]
    n = g["shift_cut"] + 1 if mode == DWCONV else g["shift_cut"]
    read_bias = emu.banks.row_reader(_param_keys(emu, "BIAS", ctx.ins.fields["bank_addr_bias"], C), C) \
        if mode == DWCONV else None
    bound = kh * kw * D * 128 * (1 << 15 if mode == DWCONV_W16 else 128)  # |ACC|
    if act in CLAMPS and bound < 1 << 31 and n <= emu_gemm.SHIFT_MAX and C % emu_gemm.COLS == 0 \
            and emu_gemm.available():
        mul = 2 if mode == DWCONV else 1
        # every term of the epilogue and its partial sums below 2**31: it may run in int32
        int32_epilogue = n < 31 and bound * mul + (128 << sb if read_bias else 0) + (1 << n) < 1 << 31
        kernel = emu_gemm.dw_kernel(kh, kw, D, mode == DWCONV_W16, int32_epilogue)
        if kernel is not None:
            return _dwconv_on_kernel(kernel, x, weights, read_bias, g, mul, n, vpp, L, mode == DWCONV_W16)
    bound = 2 * bound + (128 << sb) if mode == DWCONV else bound
    fast = act in CLAMPS and n < 31 and bound + (1 << n) < 1 << 31
    dtype = np.int32 if fast else np.int64
    xi = np.empty(x.shape, dtype)
    acc, tmp = np.empty((vpp, L, C), dtype), np.empty((vpp, L, C), dtype)
    terms = [(xi[i:i + (vpp - 1) * sh + 1:sh, j:j + (L - 1) * sw + 1:sw, d], i * kw + j, d)
             for i in range(kh) for j in range(kw) for d in range(D)]
    lo, hi = CLAMPS.get(act, (INT8_MIN, INT8_MAX))
    out = np.empty((vpp, L, C), np.int8)

    def dwconv() -> np.ndarray:
        w = weights().astype(dtype)
        np.copyto(xi, x)
        np.multiply(terms[0][0], w[terms[0][1], terms[0][2]], out=acc)
        for view, t, d in terms[1:]:
            np.multiply(view, w[t, d], out=tmp)
            np.add(acc, tmp, out=acc)
        if read_bias is not None:
            np.multiply(acc, 2, out=acc)
            np.add(acc, read_bias().view(np.int8).astype(dtype) << dtype(sb), out=acc)
        if not fast:
            return activate(acc, n, act)
        if n > 0:
            np.add(acc, dtype(1 << (n - 1)), out=acc)
            np.right_shift(acc, dtype(n), out=acc)
        np.maximum(acc, lo, out=acc)
        np.minimum(acc, hi, out=acc)
        np.copyto(out, acc, casting="unsafe")
        return out
    return dwconv


def _dwconv_on_kernel(kernel: Callable, x: np.ndarray, weights: Callable[[], np.ndarray],
                      read_bias: "Callable[[], np.ndarray] | None", g: dict, mul: int, n: int, vpp: int,
                      L: int, w16: bool) -> Callable[[], np.ndarray]:
    """The depthwise conv on emu_gemm's compiled `kernel` (int32 accumulator; the caller checked that it cannot
    overflow and chose the epilogue's width): out = clamp((ACC * mul + B * 2**sb + 2**(n-1)) >> n) for none /
    relu / relu6. Weights and biases are copied from the banks into the kernel's buffers run by run (the kernel
    computes the offsets)."""
    kh, kw, sh, sw, sb = g["kernel_h"], g["kernel_w"], g["stride_h"], g["stride_w"], g["shift_bias"]
    D, C = x.shape[2], x.shape[3]
    w = emu_gemm.aligned_empty((kh, kw, D, C), np.int32 if w16 else np.int8)
    b = emu_gemm.aligned_zeros((C,), np.int8)
    out = emu_gemm.aligned_empty((vpp, L, C), np.int8)
    half = 1 << (n - 1) if n > 0 else 0
    args = [emu_gemm.to_tensor(v) for v in (x, w, b, out)]
    args += [sh, sw, mul, sb if read_bias is not None else 0, half, n, *CLAMPS[g["act_type"]]]

    def dwconv() -> np.ndarray:
        np.copyto(w, weights().reshape(w.shape), casting="unsafe")  # int8, or dwconv_w16's int16 values
        if read_bias is not None:
            np.copyto(b, read_bias().view(np.int8))
        kernel(*args)
        return out
    return dwconv
