"""The int8 CONV GEMM kernel (emulator/gemm.py) against exact integer references and against the float32 BLAS
path it replaces: the kernel alone (random shapes, extreme operands, the largest K whose int32 lanes cannot
wrap), and whole CONV instructions run on both paths. The float32 path stays in the product for hosts without
AVX-512 VNNI; here it is the reference. No test looks at the clock."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tvm_dpu.arch.arch import find_preset
from tvm_dpu.codegen.isa import encode_program, make_instr
from tvm_dpu.errors import EmulatorError
from tvm_dpu.quant.fixpoint import saturate_int8, shift_round
from tvm_dpu.emulator import conv as emu_conv, gemm as emu_gemm
from tvm_dpu.emulator.core import Emulator

# "auto" uses the kernel only where TVM is already imported (emu_gemm's cold-start rule): these tests want it.
import tvm  # noqa: E402,F401 isort: skip

CLAMPS = [(-128, 127), (0, 127), (0, 6)]

needs_kernel = pytest.mark.skipif(not emu_gemm.available(), reason="host CPU has no AVX-512 VNNI (or "
                                  f"{emu_gemm.ENV}=float32): the emulator uses its float32 GEMM")


def _reference(x: np.ndarray, w: np.ndarray, bias: np.ndarray, sb: int, n: int, lo: int, hi: int) -> np.ndarray:
    """clamp(DPURound((2*ACC + B*2**sb) / 2**n)) on exact int64 (isa1-semantics.md 6.4)."""
    acc = x.astype(np.int64) @ w.astype(np.int64)
    return np.clip(shift_round(2 * acc + (bias.astype(np.int64) << sb), n), lo, hi).astype(np.int8)


def _old_float_path(x: np.ndarray, w: np.ndarray, bias: np.ndarray, sb: int, n: int, lo: int,
                    hi: int) -> np.ndarray:
    """What emu_conv computed before the kernel: the exact chunked float32 GEMM, then the integer requant."""
    acc = emu_conv.exact_matmul_t(x.astype(np.float32), np.ascontiguousarray(w.T).astype(np.float32))
    return np.clip(saturate_int8(shift_round(2 * acc + (bias.astype(np.int64) << sb), n)), lo, hi).astype(np.int8)


def _kernel(x: np.ndarray, w: np.ndarray, bias: np.ndarray, sb: int, n: int, lo: int, hi: int) -> np.ndarray:
    """The kernel as emu_conv drives it: x + 128 bytes padded to Kp, packed weights, offsets, int8 output."""
    m, k = x.shape
    kp, np_ = emu_gemm.padded(k, w.shape[1])
    a = emu_gemm.aligned_zeros((m, kp), np.uint8)
    a[:, :k] = x.view(np.uint8) ^ emu_conv.INT8_SIGN_BIT
    b = emu_gemm.aligned_empty((np_ // emu_gemm.COLS, kp // emu_gemm.KSTEP, 64), np.int8)
    off = emu_gemm.aligned_empty((np_,), np.int64)
    off[...] = emu_gemm.offsets(emu_gemm.pack_weights(w, b), bias, sb, n)
    y = emu_gemm.aligned_empty((m, np_), np.int8)
    emu_gemm.gemm_requant(*(emu_gemm.to_tensor(v) for v in (a.view(np.int32), b, off, y)), n, lo, hi)
    return y[:, :w.shape[1]]


_EXTREMES = st.sampled_from(["random", "min", "max", "mixed"])


def _operand(rng: np.random.Generator, kind: str, shape: tuple[int, int]) -> np.ndarray:
    if kind == "min":
        return np.full(shape, -128, np.int8)
    if kind == "max":
        return np.full(shape, 127, np.int8)
    if kind == "mixed":
        return rng.choice(np.array([-128, 127], np.int8), size=shape)
    return rng.integers(-128, 128, size=shape, dtype=np.int8)


@needs_kernel
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=st.integers(1, 40), k=st.integers(1, 700), n=st.integers(1, 70), xk=_EXTREMES, wk=_EXTREMES,
       sb=st.integers(0, 20), shift=st.integers(1, emu_gemm.SHIFT_MAX), clamp=st.sampled_from(CLAMPS),
       seed=st.integers(0, 2**31))
def test_kernel_equals_integer_reference_and_old_path(m, k, n, xk, wk, sb, shift, clamp, seed):
    """Any shape (row tails, K and N not multiples of the kernel's 4 and 16), extreme operands, any shift."""
    rng = np.random.default_rng(seed)
    x, w = _operand(rng, xk, (m, k)), _operand(rng, wk, (k, n))
    bias = rng.integers(-128, 128, size=n, dtype=np.int8)
    got = _kernel(x, w, bias, sb, shift, *clamp)
    assert np.array_equal(got, _reference(x, w, bias, sb, shift, *clamp))
    assert np.array_equal(got, _old_float_path(x, w, bias, sb, shift, *clamp))


@needs_kernel
@pytest.mark.parametrize("xv, wv", [(-128, -128), (127, -128), (-128, 127), (127, 127)])
def test_kernel_exact_at_largest_k(xv, wv):
    """Every product at an extreme over the largest K the kernel takes: the int32 lane holds K * (x+128) * w,
    up to 255 * 128 * K_MAX (just under 2**31); ACC itself reaches 2**14 * K_MAX."""
    k = emu_gemm.K_MAX
    assert k * 255 * 128 < 2**31 <= (k + 1) * 255 * 128  # the bound is the tight one
    x = np.full((3, k), xv, np.int8)
    w = np.full((k, 16), wv, np.int8)
    w[-1, 0] = 0  # one column off the extreme: a non-uniform result
    bias = np.array([127, -128] * 8, np.int8)
    for sb, shift, clamp in [(20, 31, (-128, 127)), (0, 1, (-128, 127)), (3, 40, (0, 127)), (20, 63, (0, 6))]:
        want = _reference(x, w, bias, sb, shift, *clamp)
        assert np.array_equal(_kernel(x, w, bias, sb, shift, *clamp), want)
    # and where the shift leaves the accumulation visible
    acc = x[:1].astype(np.int64) @ w.astype(np.int64)
    assert np.abs(acc).min() >= 127 * 127 * (k - 1)


@pytest.mark.parametrize("mode", ["auto", "int8", "float32"])
def test_conv_worst_case_on_both_paths(mode, monkeypatch):
    """test_emulator_exact's longest-reduction CONVs (K = 32768) on the int8 kernel and on the float32 path, up to
    the widest shifts (N = 62 the kernel's last, 63 and 64 past it)."""
    from tests.test_emulator_exact import test_conv_worst_case_is_exact as worst

    monkeypatch.setenv(emu_gemm.ENV, mode)
    for case in [(-128, -128, 127, 23, 20, 0, True), (127, None, 0, 2, 0, 0, True),
                 (-128, -128, 0, 30, 0, 0, True), (-128, -128, 127, 61, 20, 0, False),
                 (-128, -128, 127, 62, 20, 0, False), (127, -128, -128, 63, 20, 1, False)]:
        worst(*case)


def test_bad_setting_is_one_clear_error(monkeypatch):
    monkeypatch.setenv(emu_gemm.ENV, "int4")
    with pytest.raises(EmulatorError, match=emu_gemm.ENV):
        emu_gemm.available()


def _run_conv(arch, mode: str, monkeypatch, mem: np.ndarray, init: dict, conv: dict) -> "np.ndarray | str":
    """Bank memory after CONVINIT + CONV on `arch` under GEMM setting `mode`, or the error message."""
    monkeypatch.setenv(emu_gemm.ENV, mode)
    emu = Emulator(arch)
    emu.banks.mem[...] = mem
    try:
        emu.run(encode_program([make_instr("CONVINIT", **init), make_instr("CONV", **conv), make_instr("END")]), {})
    except EmulatorError as e:
        return str(e)
    assert emu._programs  # compiled, so the batched ConvStep ran
    return emu.banks.mem.copy()


@needs_kernel
@pytest.mark.parametrize("arch_name", ["DPUCZDX8G_ISA1_B4096", "DPUCZDX8G_ISA1_B1152", "DPUCZDX8G_ISA1_B512"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(kh=st.integers(1, 4), kw=st.integers(1, 4), sh=st.integers(1, 3), sw=st.integers(1, 3),
       vpp=st.integers(1, 8), cg=st.integers(1, 3), length=st.integers(1, 6), pads=st.tuples(
           *[st.integers(0, 3)] * 4), choff=st.integers(0, 20), sc=st.integers(0, 14), sb=st.integers(0, 6),
       act=st.sampled_from([emu_conv.ACT_NONE, emu_conv.ACT_RELU, emu_conv.ACT_RELU6, emu_conv.ACT_LEAKY]),
       extreme=st.booleans(), seed=st.integers(0, 2**31))
def test_conv_instruction_same_on_both_paths(arch_name, monkeypatch, kh, kw, sh, sw, vpp, cg, length, pads, choff,
                                             sc, sb, act, extreme, seed):
    """Random CONV instructions (kernel, stride, padding, masked channels, activation) over random or extreme
    bank contents give the same banks, or the same error, on the int8 kernel and on the float32 path (OCP 16,
    12 and 8: output columns padded to the kernel's 16 on the last two)."""
    arch = find_preset(arch_name)
    banks = Emulator(arch).banks
    rng = np.random.default_rng(seed)
    mem = rng.integers(0, 256, size=banks.mem.shape, dtype=np.uint8)
    if extreme:
        mem[...] = rng.choice(np.array([0x80, 0x7F], np.uint8), size=mem.shape)
    top, left, bottom, right = pads
    init = dict(kernel_h=kh, kernel_w=kw, stride_h=sh, stride_w=sw, stride_out=1,
                valid_pixel_parallel=min(vpp, arch.pp), jump_read=cg, jump_read_endl=1, jump_write=1,
                jump_write_endl=1, shift_cut=sc, shift_bias=sb, act_type=act)
    conv = dict(bank_id_in=0, bank_addr_in=0, bank_addr_in_1=64, bank_addr_in_2=128, bank_addr_in_3=192,
                channel_group=cg, length=length, pad_top=min(top, kh - 1), pad_left=min(left, kw - 1),
                pad_bottom=min(bottom, kh - 1), pad_right=min(right, kw - 1),
                channel_offset=min(choff, cg * arch.icp - 1), bank_addr_weights=0, bank_id_out=arch.pp, bank_addr_out=0)
    assert {0, arch.pp} <= banks.image_ids
    got = _run_conv(arch, "auto", monkeypatch, mem, init, conv)
    want = _run_conv(arch, "float32", monkeypatch, mem, init, conv)
    if isinstance(want, str) or isinstance(got, str):
        assert got == want
    else:
        assert np.array_equal(got, want)
