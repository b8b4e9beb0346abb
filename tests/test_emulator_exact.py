"""Exactness of the emulator's fast arithmetic paths (issue 12 item 5): the float32 GEMM with float64
requantisation, the integer fallback it must equal, GEMM parts on several threads, the float32 weights kept
between runs, ELEW lookup tables and merged LOAD/SAVE runs. Each fast path is compared with an independent
integer reference or with the plain path it replaces; no test looks at the clock."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from tvm_dpu.arch.arch import LEAKY_NUM, LEAKY_SHIFT, find_preset
from tvm_dpu.codegen.isa import encode_program, iter_program, make_instr
from tvm_dpu.quant.fixpoint import (float32_shift_round_exact, float_shift_round_exact, floor_clamp_int8,
                                    saturate_int8, shift_round)
from tvm_dpu.emulator import conv as emu_conv, ddr as emu_ddr
from tvm_dpu.emulator import core as emu_mod
from tvm_dpu.emulator.conv import GEMM_CHUNK, INT8_PRODUCT_BITS
from tvm_dpu.emulator.core import Emulator

ARCH = find_preset("DPUCZDX8G_ISA1_B4096")
CONVW = ARCH.bank_group("CONVW").base_id
BIAS = ARCH.bank_group("BIAS").base_id


def _conv_out(acc: np.ndarray, bias: np.ndarray, sb: int, sc: int, act: int) -> np.ndarray:
    """Reference requantisation of isa1-semantics.md 6.4 on exact integers (int64 / Python ints)."""
    v = 2 * np.asarray(acc, dtype=np.int64) + (np.asarray(bias, dtype=np.int64) << sb)
    n = sc + 1
    out = shift_round(v, n)
    if act == 1:
        out = np.maximum(out, 0)
    elif act == 4:
        out = np.clip(out, 0, 96)
    elif act == 3:
        out = np.where(v < 0, shift_round(v * LEAKY_NUM, n + LEAKY_SHIFT), out)
    return saturate_int8(out)


# ---- float64 requantisation primitive ------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 7, 11, 24, 40, 52])
def test_floor_clamp_equals_shift_round(n):
    """y = v * 2**-n + 0.5 formed from exact float64 terms, floored and clamped, is DPURound of v / 2**n for
    every integer the bound admits, including the ties and the ends of the range."""
    rng = np.random.default_rng(n)
    limit = (1 << 53) - (1 << (n - 1))
    assert float_shift_round_exact(limit, n) and not float_shift_round_exact(limit + 1, n)
    ties = np.array([k * (1 << n) + (1 << (n - 1)) for k in range(-130, 130)], dtype=np.int64)
    edges = np.array([limit, -limit, limit - 1, 1 - limit, 0, 1, -1], dtype=np.int64)
    big = rng.integers(-limit, limit, size=2000, dtype=np.int64)
    small = rng.integers(-300 << n, 300 << n, size=2000, dtype=np.int64) if n < 50 else big
    v = np.concatenate([ties, ties - 1, ties + 1, edges, big, small])
    v = v[np.abs(v) <= limit]  # what the bound admits
    for lo, hi in [(-128, 127), (0, 127), (0, 96)]:
        y = v.astype(np.float64) * 2.0 ** -n + 0.5
        got = floor_clamp_int8(y, lo, hi, np.empty(v.shape, np.int8))
        want = np.clip(shift_round(v, n), lo, hi).astype(np.int8)
        assert np.array_equal(got, want)


@pytest.mark.parametrize("n, sb", [(1, 0), (5, 3), (11, 8), (16, 16)])
def test_float32_requant_equals_shift_round(n, sb):
    """The float32 form: y = acc * 2**(1-n) + (B*2**sb + 2**(n-1)) * 2**-n in float32 (one GEMM chunk, |acc| <=
    2**24), floored and clamped, equals DPURound((2*acc + B*2**sb) / 2**n) clamped, even where y itself is not a
    float32 (far beyond the clamps)."""
    assert float32_shift_round_exact(128 << sb | 1 << (n - 1), n)
    assert not float32_shift_round_exact(1, 17) and not float32_shift_round_exact((1 << 24) + 1, 8)
    rng = np.random.default_rng(n)
    b = rng.integers(-128, 128, size=4000, dtype=np.int64)
    # 2*acc + B*2**sb + 2**(n-1) close to k * 2**n: y next to an integer, where a rounded y would floor wrongly
    near = ((rng.integers(-130, 130, size=4000) << n) - (1 << (n - 1)) - (b << sb)) >> 1
    acc = np.concatenate([rng.integers(-(1 << 24), (1 << 24) + 1, size=4000), near + rng.integers(-2, 3, size=4000),
                          near, np.full(4000, 1 << 24), np.full(4000, -(1 << 24))])
    b = np.tile(b, 5)
    acc = np.clip(acc, -(1 << 24), 1 << 24)
    p = acc.astype(np.float32) * np.float32(2.0 ** (1 - n))
    c = ((b << sb) + (1 << (n - 1))).astype(np.float32) * np.float32(2.0 ** -n)
    for lo, hi in [(-128, 127), (0, 127), (0, 96)]:
        got = floor_clamp_int8(p + c, lo, hi, np.empty(acc.shape, np.int8))
        want = np.clip(shift_round(2 * acc + (b << sb), n), lo, hi).astype(np.int8)
        assert np.array_equal(got, want)


def test_float_bound_rejects_wide_shifts():
    assert not float_shift_round_exact(1, 54)  # 2**53 itself plus anything
    assert not float_shift_round_exact(1, 0)  # no rounding: the integer path handles it


# ---- CONV: worst-case operands over the longest reduction ---------------------------------------------------
def _longest_conv(x: int, w: int | None, bias: int, sc: int, sb: int,
                  act: int) -> tuple[np.ndarray, Emulator, np.ndarray]:
    """One CONV whose every input byte is x, over the longest reduction the CONVW banks hold without wrapping:
    kernel 16x8, 16 channel groups (K = 128 taps * 256 channels = 32768 = a whole CONVW bank). Every weight is w,
    or (w None) a pattern whose partial sums climb far past 2**24 and come back (an inexact float32 sum would
    show in the output). Returns the OCP outputs, the emulator and the exact ACC per output."""
    kh, kw, cg = 16, 8, 16
    emu = Emulator(ARCH)
    mem = emu.banks.mem
    mem[:16] = np.uint8(x & 0xFF)  # image banks
    if w is None:
        # Per output channel: random 126/127 over the first half of K, their negation over the second, and a last
        # weight nudged by -3..3: the running sum climbs to ~2**28 and falls back to a small, visible ACC.
        rng = np.random.default_rng(x & 0xFF)
        half = rng.choice(np.array([126, 127]), size=(ARCH.ocp, 16384))
        wts = np.concatenate([half, -half], axis=1)
        wts[:, -1] += rng.integers(-3, 4, size=ARCH.ocp)
        mem[CONVW:CONVW + ARCH.ocp] = wts.astype(np.int8).view(np.uint8).reshape(ARCH.ocp, 2048, 16)
    else:
        mem[CONVW:CONVW + ARCH.ocp] = np.uint8(w & 0xFF)
    acc = x * mem[CONVW:CONVW + ARCH.ocp].view(np.int8).astype(np.int64).reshape(ARCH.ocp, -1).sum(axis=1)
    mem[BIAS] = np.uint8(bias & 0xFF)
    init = make_instr("CONVINIT", kernel_h=kh, kernel_w=kw, stride_h=1, stride_w=1, stride_out=1,
                      valid_pixel_parallel=1, jump_read=cg, jump_read_endl=1, jump_write=1, jump_write_endl=1,
                      shift_cut=sc, shift_bias=sb, act_type=act)
    conv = make_instr("CONV", bank_id_in=0, bank_addr_in=0, bank_addr_in_1=kw * cg, channel_group=cg, length=1,
                      pad_right=kw - 1, pad_bottom=kh - 1, bank_addr_weights=0, bank_id_out=8, bank_addr_out=0)
    emu.run(encode_program([init, conv, make_instr("END")]), {})
    assert kh * kw * cg * ARCH.icp == mem.shape[1] * mem.shape[2]
    return mem[8, 0].view(np.int8).copy(), emu, acc


@pytest.mark.parametrize("x, w, bias, sc, sb, act, float_path", [
    (-128, -128, 127, 23, 20, 0, True),  # largest product, longest reduction: ACC = 2**29
    (-128, -128, -128, 23, 20, 1, True),
    (127, -128, 5, 22, 3, 0, True),  # large negative ACC
    (127, None, 0, 2, 0, 0, True),  # partial sums ~2**28, small ACC: a float32 sum would drop low bits
    (-128, None, 3, 3, 2, 1, True),
    (127, -128, 5, 22, 3, 4, True),  # relu6
    (-128, -128, 0, 30, 0, 0, True),  # 2*ACC / 2**31 = 0.5: a rounding tie (half up)
    (127, -128, 0, 20, 0, 3, False),  # leaky takes the integer path
    (-128, -128, 127, 62, 20, 0, False),  # N = 63: beyond float64's 53 bits, integer path
])
def test_conv_worst_case_is_exact(x, w, bias, sc, sb, act, float_path):
    got, emu, acc = _longest_conv(x, w, bias, sc, sb, act)
    batch = next(s for s, _ in next(iter(emu._programs.values())).plan if hasattr(s, "__self__")).__self__
    assert batch.float_path == float_path
    assert batch.wt.shape[0] == 32768 > GEMM_CHUNK * 16  # many float32 chunks summed in float64
    assert np.abs(acc).max() <= 32768 << INT8_PRODUCT_BITS
    want = _conv_out(acc, np.full(ARCH.ocp, bias), sb, sc, act)
    assert np.array_equal(got, want)


# ---- CONV: random programs, float path == integer path, threads, weight reuse -----------------------------------
def _random_conv_program(rng: np.random.Generator, n_convs: int, vpp: int) -> np.ndarray:
    """CONVINIT then `n_convs` CONVs sharing one random window (a layer's output-channel groups)."""
    kh, kw = int(rng.integers(1, 6)), int(rng.integers(1, 6))
    sh, sw = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    cg = int(rng.integers(1, 5))
    length = int(rng.integers(1, 9))
    init = make_instr("CONVINIT", kernel_h=kh, kernel_w=kw, stride_h=sh, stride_w=sw, stride_out=1,
                      valid_pixel_parallel=vpp, jump_read=cg, jump_read_endl=int(rng.integers(1, 40)),
                      jump_write=n_convs, jump_write_endl=length * n_convs, shift_cut=int(rng.integers(0, 21)),
                      shift_bias=int(rng.integers(0, 21)), act_type=int(rng.choice([0, 1, 3, 4])))
    wrows = kh * kw * cg
    convs = [make_instr("CONV", bank_id_in=int(rng.integers(0, 8)), bank_addr_in=int(rng.integers(0, 2048)),
                        bank_addr_in_1=int(rng.integers(0, 2048)), bank_addr_in_2=int(rng.integers(0, 2048)),
                        bank_addr_in_3=int(rng.integers(0, 2048)), channel_group=cg, length=length,
                        pad_left=int(rng.integers(0, 3)), pad_top=int(rng.integers(0, 3)),
                        pad_right=int(rng.integers(0, kw)), pad_bottom=int(rng.integers(0, kh)),
                        channel_offset=int(rng.integers(0, 16)), bank_addr_weights=k * wrows, bank_addr_bias=k,
                        bank_id_out=8, bank_addr_out=k)
             for k in range(n_convs)]
    return encode_program([init] + convs + [make_instr("END")])


def _run_conv(code: np.ndarray, seed: int) -> np.ndarray:
    emu = Emulator(ARCH)
    rng = np.random.default_rng(seed)
    emu.banks.mem[...] = rng.integers(0, 256, size=emu.banks.mem.shape, dtype=np.uint8)
    emu.banks.mem[0, :64] = 0x80  # -128 runs: saturating products
    emu.banks.mem[CONVW:CONVW + 16, :64] = 0x80
    emu.run(code, {})
    return emu.banks.mem.copy()


@pytest.mark.parametrize("seed", range(12))
def test_random_convs_float_path_equals_integer_path(monkeypatch, seed):
    """Random CONV runs (kernels, strides, pads, masked channels, all activations): the float32 GEMM with float64
    requantisation, in several thread parts, leaves the banks exactly as the integer path, one part."""
    rng = np.random.default_rng(100 + seed)
    code = _random_conv_program(rng, n_convs=int(rng.integers(1, 5)), vpp=int(rng.integers(1, 5)))
    monkeypatch.setenv("TVM_DPU_EMU_THREADS", "3")
    monkeypatch.setattr(emu_conv, "PARALLEL_MIN_MACS", 0)
    monkeypatch.setattr(emu_conv, "PARALLEL_MIN_ROWS", 1)
    fast = _run_conv(code, seed)
    monkeypatch.setenv("TVM_DPU_EMU_THREADS", "1")
    monkeypatch.setattr(emu_conv, "float_shift_round_exact", lambda *args: False)
    assert np.array_equal(fast, _run_conv(code, seed))


@pytest.mark.parametrize("vpp, n_convs", [(4, 1), (1, 3)])  # row parts; column parts (one output row)
def test_conv_thread_parts_against_direct_convolution(monkeypatch, vpp, n_convs):
    """Threaded GEMM parts (by rows and by output-channel groups) against a direct numpy convolution."""
    monkeypatch.setenv("TVM_DPU_EMU_THREADS", "2")
    monkeypatch.setattr(emu_conv, "PARALLEL_MIN_MACS", 0)
    monkeypatch.setattr(emu_conv, "PARALLEL_MIN_ROWS", 1)
    rng = np.random.default_rng(vpp)
    cg, kh, kw, length = 3, 3, 2, 5
    emu = Emulator(ARCH)
    x = rng.integers(-128, 128, size=(vpp + kh - 1, length + kw - 1, cg * 16), dtype=np.int8)
    wts = rng.integers(-128, 128, size=(n_convs * 16, kh, kw, cg * 16), dtype=np.int8)
    b = rng.integers(-128, 128, size=n_convs * 16, dtype=np.int8)
    for h in range(x.shape[0]):  # input row h in bank h % 8, slot h // 8 (64 rows apart)
        emu.banks.mem[h % 8, (h // 8) * 64:(h // 8) * 64 + x.shape[1] * cg] = x[h].reshape(-1, 16).view(np.uint8)
    for o in range(n_convs * 16):
        g, ol = divmod(o, 16)
        emu.banks.mem[CONVW + ol, g * kh * kw * cg:(g + 1) * kh * kw * cg] = wts[o].reshape(-1, 16).view(np.uint8)
    emu.banks.mem[BIAS, :n_convs] = b.reshape(n_convs, 16).view(np.uint8)
    init = make_instr("CONVINIT", kernel_h=kh, kernel_w=kw, stride_h=1, stride_w=1, stride_out=1,
                      valid_pixel_parallel=vpp, jump_read=cg, jump_read_endl=1, jump_write=n_convs,
                      jump_write_endl=length * n_convs, shift_cut=9, shift_bias=3, act_type=0)
    convs = [make_instr("CONV", bank_id_in=0, bank_addr_in=0, bank_addr_in_1=64, channel_group=cg, length=length,
                        pad_right=kw - 1, pad_bottom=kh - 1, bank_addr_weights=g * kh * kw * cg, bank_addr_bias=g,
                        bank_id_out=8, bank_addr_out=g) for g in range(n_convs)]
    emu.run(encode_program([init] + convs + [make_instr("END")]), {})
    batch = next(s for s, _ in next(iter(emu._programs.values())).plan if hasattr(s, "__self__")).__self__
    assert len(batch.parts) > 1
    acc = np.zeros((vpp, length, n_convs * 16), dtype=np.int64)
    for i in range(kh):
        for j in range(kw):
            acc += np.tensordot(x[i:i + vpp, j:j + length].astype(np.int64), wts[:, i, j].astype(np.int64),
                                axes=([2], [1]))
    want = _conv_out(acc, b, 3, 9, 0)
    got = np.stack([emu.banks.mem[8 + p, :length * n_convs].view(np.int8).reshape(length, -1)
                    for p in range(vpp)])
    assert np.array_equal(got, want)


def test_changed_weights_are_picked_up():
    """The float32 weights (and bias terms) kept between runs are remade whenever the CONVW (BIAS) bytes differ
    from the last run's."""
    rng = np.random.default_rng(5)
    code = _random_conv_program(rng, n_convs=2, vpp=2)
    start = rng.integers(0, 256, size=Emulator(ARCH).banks.mem.shape, dtype=np.uint8)
    changed = start.copy()
    changed[CONVW + 1, 1] ^= 0x5A  # one weight row of one output channel
    new_bias = start.copy()
    new_bias[BIAS, :2] ^= 0x33
    emu = Emulator(ARCH)
    for banks in (start, changed, changed, start, new_bias, start):
        emu.banks.mem[...] = banks
        emu.run(code, {})
        fresh = Emulator(ARCH)
        fresh.banks.mem[...] = banks
        fresh.run(code, {})
        assert np.array_equal(emu.banks.mem, fresh.banks.mem)


@pytest.mark.parametrize("gemm", ["float32", "int8"])
@pytest.mark.parametrize("all_loaded", [True, False])
def test_weights_loaded_from_a_constant_region_are_compared_once(monkeypatch, all_loaded, gemm):
    """A CONV whose weights and bias the program LOADs from a region the caller declares constant compares them
    with the ones it prepared only when the region's array is not the one it last checked; a new array (other
    weights) or no promise is compared, and every run equals a fresh emulator's. When one weight row is not loaded
    by the program (it keeps what the banks held), the weights are compared on every run. On both GEMM paths."""
    from tvm_dpu.emulator import gemm as emu_gemm

    monkeypatch.setenv(emu_gemm.ENV, gemm)
    if gemm == "int8" and not emu_gemm.available():
        pytest.skip("no AVX-512 VNNI here: the emulator's compiled kernels are off")
    rng = np.random.default_rng(11)
    conv = _random_conv_program(rng, n_convs=1, vpp=2)
    init, conv_ins = [ins for _, ins in iter_program(conv)][:2]
    wrows = init.fields["kernel_h"] * init.fields["kernel_w"] * conv_ins.fields["channel_group"]
    loads = [make_instr("LOAD", bank_id=CONVW + o, bank_addr=0, length=wrows, channel=16, jump_read=16,
                        jump_write=1, reg_id=0, ddr_addr=o * wrows * 16)
             for o in range(ARCH.ocp if all_loaded else ARCH.ocp - 1)]
    loads.append(make_instr("LOAD", bank_id=BIAS, bank_addr=0, length=1, channel=16, jump_read=16, jump_write=1,
                            reg_id=0, ddr_addr=ARCH.ocp * wrows * 16))
    code = encode_program(loads + [init, conv_ins, make_instr("END")])
    params = [rng.integers(0, 256, ARCH.ocp * wrows * 16 + 16, dtype=np.uint8) for _ in range(2)]
    for p in params:
        p.flags.writeable = False
    start = rng.integers(0, 256, size=Emulator(ARCH).banks.mem.shape, dtype=np.uint8)
    emu = Emulator(ARCH)
    reads = []
    for i, (p, constant) in enumerate([(0, True), (0, True), (0, True), (1, True), (1, False), (0, True)]):
        emu.banks.mem[...] = start
        emu.run(code, {0: params[p]}, (0,) if constant else ())
        if i == 0:
            (batch,) = [s.__self__ for s, _ in list(emu._programs.values())[-1].plan
                        if isinstance(getattr(s, "__self__", None), emu_conv.ConvBatch)]
            assert (batch.const_rid == 0) == all_loaded
            read_w = batch.read_w
            batch.read_w = lambda: reads.append(i) or read_w()
        fresh = Emulator(ARCH)
        fresh.banks.mem[...] = start
        fresh.run(code, {0: params[p]})
        assert np.array_equal(emu.banks.mem, fresh.banks.mem)
    assert reads == ([3, 4, 5] if all_loaded else [1, 2, 3, 4, 5])


# ---- ELEW: lookup tables and the arithmetic path against the semantics -------------------------------------
def _elew_reference(xs: list[np.ndarray], shifts: list[int], etype: int, sw: int, relu: bool) -> np.ndarray:
    """isa1-semantics.md 8.3 with exact rationals."""
    out = np.empty(xs[0].shape, dtype=np.int8)
    for idx in np.ndindex(xs[0].shape):
        a = [(4 * int(x[idx])) // (1 << s) for x, s in zip(xs, shifts)]
        t = Fraction(sum(a)) if etype == 0 else Fraction(a[0] * a[1])
        t *= Fraction(1 << sw) if sw < 16 else Fraction(1, 1 << (sw - 16))
        t /= 4 if etype == 0 else 16
        if relu:
            t = max(t, Fraction(0))
        r = (t + Fraction(1, 2)).__floor__()
        out[idx] = min(127, max(-128, r))
    return out


@pytest.mark.parametrize("num, etype", [(1, 0), (2, 0), (2, 1), (3, 0), (4, 0)])
def test_elew_against_semantics(num, etype):
    rng = np.random.default_rng(num * 10 + etype)
    for trial in range(4):
        emu = Emulator(ARCH)
        emu.banks.mem[...] = rng.integers(0, 256, size=emu.banks.mem.shape, dtype=np.uint8)
        emu.banks.mem[:4, :3] = 0x80 if trial % 2 else 0x7F
        shifts = [int(rng.integers(0, 16)) for _ in range(num)]
        sw = int(rng.integers(0, 32))
        relu = bool(rng.integers(0, 2))
        inits = [make_instr("ELEWINIT", id=i, bank_id_in=i, bank_addr_in=7 * i, shift_read=shifts[i], jump_read=2,
                            jump_read_endl=5, share_pp=0, jump_bank=1) for i in range(num)]
        elew = make_instr("ELEW", num=num, valid_pixel_parallel=2, channel_group=2, length=3, bank_id_out=8,
                          bank_addr_out=5, shift_write=sw, jump_write=2, jump_write_endl=9, elew_type=etype,
                          act_type=int(relu))
        before = emu.banks.mem.copy()
        emu.run(encode_program(inits + [elew]), {})
        xs = [np.stack([np.stack([before[i + k, 7 * i + 2 * j:7 * i + 2 * j + 2].reshape(-1) for j in range(3)])
                        for k in range(2)]).view(np.int8) for i in range(num)]
        want = _elew_reference(xs, shifts, etype, sw, relu)
        got = np.stack([np.stack([emu.banks.mem[8 + k, 5 + 2 * j:7 + 2 * j].reshape(-1) for j in range(3)])
                        for k in range(2)]).view(np.int8)
        assert np.array_equal(got, want)


# ---- LOAD / SAVE runs merged into one copy ------------------------------------------------------------------
def _transfer_program(rng: np.random.Generator) -> list:
    """Runs of LOADs and SAVEs with evenly spaced DDR items: overlapping bank rows (later LOAD wins), items that
    do not fill their last row (zero-filled tail), and SAVEs whose DDR bytes overlap (not merged)."""
    prog = []
    for _ in range(4):
        n, ch = int(rng.integers(1, 6)), int(rng.choice([3, 16, 20, 32]))
        pitch = ch + int(rng.integers(0, 5))
        delta = int(rng.choice([n * pitch, n * pitch + 8, 5]))
        for k in range(int(rng.integers(2, 7))):
            prog.append(make_instr("LOAD", bank_id=int(rng.integers(0, 34)), bank_addr=int(rng.integers(0, 8)),
                                   length=n, channel=ch, jump_read=pitch, jump_write=int(rng.integers(1, 3)),
                                   reg_id=0, ddr_addr=100 + k * delta))
        for k in range(int(rng.integers(2, 7))):
            prog.append(make_instr("SAVE", bank_id=int(rng.integers(0, 16)), bank_addr=int(rng.integers(0, 8)),
                                   length=n, channel=ch, jump_read=int(rng.integers(1, 3)), jump_write=pitch,
                                   reg_id=1, ddr_addr=50 + k * delta))
    return prog + [make_instr("END")]


@pytest.mark.parametrize("seed", range(6))
def test_merged_transfers_equal_one_by_one(monkeypatch, seed):
    rng = np.random.default_rng(seed)
    code = encode_program(_transfer_program(rng))
    results = []
    for merge in (True, False):
        if not merge:
            monkeypatch.setattr(emu_ddr, "merge_transfers", lambda steps, skip: list(steps))
        emu = Emulator(ARCH)
        emu.banks.mem[...] = np.random.default_rng(seed + 50).integers(0, 256, size=emu.banks.mem.shape,
                                                                         dtype=np.uint8)
        regions = {0: np.random.default_rng(seed + 60).integers(0, 256, size=4096, dtype=np.uint8),
                   1: np.zeros(4096, dtype=np.uint8)}
        stats = emu.run(code, regions)
        results.append((emu.banks.mem.copy(), regions[1].copy(), stats.counts, stats.load_bytes, stats.save_bytes))
        if merge:
            assert any(step is emu_mod._skip for step in next(iter(emu._programs.values())).steps)
    (mem_a, ddr_a, *st_a), (mem_b, ddr_b, *st_b) = results
    assert np.array_equal(mem_a, mem_b) and np.array_equal(ddr_a, ddr_b) and st_a == st_b


# ---- depthwise conv (ALU modes 0, 6, 8), planned when the program compiles -----------------------------------
DWCONVW = ARCH.bank_group("DWCONVW").base_id
DW_MODES = {"dwconv": 0, "dwconv_nobias": 6, "dwconv_w16": 8}


def _dw_setup(emu: Emulator, rng: np.random.Generator, *, mode: str, kh: int, sh: int, vpp: int, L: int, cg: int,
              D: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random input (image row h in bank h from row 100, pixel pitch cg*D rows), depthwise weights (DWCONVW from
    row 10, tap pitch cg*D rows, int16 pairs for dwconv_w16) and bias (BIAS row 5) in the banks of `emu`; returns
    them as x (real_h, src_w, D, C), w (taps, D, C) and bias (C,)."""
    C = 16 * cg
    real_h, src_w = (vpp - 1) * sh + kh, (L - 1) * sh + kh
    x = rng.integers(-128, 128, (real_h, src_w, D, C), dtype=np.int8)
    for h in range(real_h):
        emu.banks.bank(h)[100:100 + src_w * cg * D] = x[h].view(np.uint8).reshape(-1, 16)
    if mode == "dwconv_w16":
        w = rng.integers(-2**15, 2**15, (kh * kh, D, C), dtype=np.int16)
        w = np.repeat(w[..., ::16], 16, axis=-1)  # one weight per channel group (its first element is used)
        emu.banks.bank(DWCONVW)[10:10 + kh * kh * D * 2 * cg] = w.view(np.uint8).reshape(-1, 16)
    else:
        w = rng.integers(-128, 128, (kh * kh, D, C), dtype=np.int8)
        emu.banks.bank(DWCONVW)[10:10 + kh * kh * D * cg] = w.view(np.uint8).reshape(-1, 16)
    bias = rng.integers(-128, 128, C, dtype=np.int8)
    emu.banks.bank(BIAS)[5:5 + cg] = bias.view(np.uint8).reshape(-1, 16)
    return x, w, bias


def _dw_reference(x, w, bias, *, mode: str, kh: int, sh: int, vpp: int, L: int, sc: int, sb: int, act: int,
                  pads: tuple[int, int, int, int], choff: int) -> np.ndarray:
    """Depthwise conv by definition (isa1-semantics.md 9.1): pads and masked channels read as 0, an exact int64
    sum over taps and depth, then the CONV requantisation (dwconv_nobias / w16: no bias and shift sc)."""
    x = x.astype(np.int64)
    for region in emu_conv.pad_slices(x.shape[0], x.shape[1], kh, kh, *pads):
        x[region] = 0
    if choff:
        x[..., x.shape[-1] - choff:] = 0
    acc = np.zeros((vpp, L, x.shape[-1]), np.int64)
    for i in range(kh):
        for j in range(kh):
            acc += (x[i:i + (vpp - 1) * sh + 1:sh, j:j + (L - 1) * sh + 1:sh] * w[i * kh + j].astype(np.int64)).sum(2)
    if mode == "dwconv":
        return _conv_out(acc, bias, sb, sc, act)
    return _conv_out(acc, np.zeros_like(bias), 0, sc, act)  # DPURound(acc / 2**sc) = DPURound(2*acc / 2**(sc+1))


@pytest.mark.parametrize("mode, act, kh, sh, vpp, L, cg, D, sc, sb, pads, choff", [
    ("dwconv", 1, 3, 1, 4, 7, 2, 1, 7, 3, (1, 1, 1, 1), 0),  # int32 accumulator, relu, padding all round
    ("dwconv", 3, 3, 1, 3, 5, 1, 1, 6, 2, (0, 1, 2, 1), 0),  # leaky (integer path)
    ("dwconv", 0, 3, 2, 2, 6, 1, 1, 40, 20, (1, 0, 2, 2), 5),  # shift too wide for int32: int64 path; masked channels
    ("dwconv", 4, 5, 1, 4, 4, 1, 1, 9, 4, (2, 2, 4, 4), 0),  # relu6, 5x5
    ("dwconv_nobias", 4, 3, 1, 4, 6, 2, 2, 5, 0, (1, 1, 2, 2), 3),  # kernel_d 2, masked channels
    ("dwconv_nobias", 0, 3, 1, 2, 3, 1, 1, 0, 0, (0, 0, 2, 2), 0),  # no shift at all
    ("dwconv_w16", 0, 3, 1, 3, 4, 1, 2, 12, 0, (1, 1, 2, 2), 0),  # int16 weights, kernel_d 2
])
@pytest.mark.parametrize("gemm", ["float32", "int8"])
def test_dwconv_against_definition(monkeypatch, gemm, mode, act, kh, sh, vpp, L, cg, D, sc, sb, pads, choff):
    """A depthwise ALU equals the definition, on numpy and on the compiled kernel (TVM_DPU_EMU_GEMM=int8), on its
    first run (compiled) and on a second run of the cached program after input, weights and bias all changed; and
    when its ALUINIT came in an earlier program (interpreted)."""
    from dataclasses import replace

    from tvm_dpu.emulator import gemm as emu_gemm

    monkeypatch.setenv(emu_gemm.ENV, gemm)
    if gemm == "int8" and not emu_gemm.available():
        pytest.skip("no AVX-512 VNNI here: the emulator's compiled kernels are off")
    arch = replace(ARCH, dw_leaky=True)
    w_pitch = cg * D * (2 if mode == "dwconv_w16" else 1)
    init = make_instr("ALUINIT", exec_mode=DW_MODES[mode], kernel_h=kh, kernel_w=kh, stride_h=sh, stride_w=sh,
                      length=L, channel_group=cg, channel_offset=choff, jump_read=cg * D, jump_write=cg,
                      jump_read_weights=w_pitch, shift_cut=sc, shift_bias=sb, act_type=act)
    alu = make_instr("ALU", valid_pixel_parallel=vpp, kernel_d=D, bank_id_in=0, bank_addr_in=100, bank_id_out=8,
                     bank_addr_out=300, bank_addr_weights=10, bank_addr_bias=5, pad_top=pads[0], pad_left=pads[1],
                     pad_bottom=pads[2], pad_right=pads[3])
    rng = np.random.default_rng(sc * 31 + kh)
    emu = Emulator(arch)
    geometry = dict(mode=mode, kh=kh, sh=sh, vpp=vpp, L=L)
    for code in ([init, alu], [init, alu], [init], [alu]):
        x, w, bias = _dw_setup(emu, rng, cg=cg, D=D, **geometry)
        stats = emu.run(encode_program(code + [make_instr("END")]), {})
        if code[-1].name != "ALU":
            continue
        want = _dw_reference(x, w, bias, sc=sc, sb=sb, act=act, pads=pads, choff=choff, **geometry)
        got = np.stack([emu.banks.bank(8 + r)[300:300 + L * cg].view(np.int8).reshape(L, -1) for r in range(vpp)])
        assert np.array_equal(got, want), f"{mode} program {[i.name for i in code]}"
        assert stats.macs == vpp * L * 16 * cg * kh * kh * D


@pytest.mark.parametrize("xv, wv, bv", [(-128, -128, 127), (-128, 127, -128), (127, -128, -128)])
@pytest.mark.parametrize("mode, kh, D, sc, sb", [
    ("dwconv", 3, 1, 29, 20),  # the widest shift and bias whose epilogue still runs in int32
    ("dwconv", 5, 2, 30, 20),  # shift 31: the int64 epilogue
    ("dwconv_nobias", 7, 1, 30, 0),  # 7x7, the largest unrolled window; int32 epilogue
    ("dwconv_nobias", 8, 1, 14, 0),  # 8x8: the tap loops stay loops
])
def test_dwconv_kernel_extremes(monkeypatch, xv, wv, bv, mode, kh, D, sc, sb):
    """The compiled depthwise kernel at the largest accumulator and offset magnitudes of a window (every input,
    weight and bias at an int8 extreme), with the epilogue in int32 and in int64 and the taps unrolled or not,
    equals the definition."""
    from tvm_dpu.emulator import gemm as emu_gemm

    monkeypatch.setenv(emu_gemm.ENV, "int8")
    if not emu_gemm.available():
        pytest.skip("no AVX-512 VNNI here: the emulator's compiled kernels are off")
    cg, L = 1, 5  # one block of DW_PIXELS pixels and a remainder
    vpp = min(2, ARCH.pp - kh + 1)  # the window's rows in one bank group (as _dw_setup places them)
    init = make_instr("ALUINIT", exec_mode=DW_MODES[mode], kernel_h=kh, kernel_w=kh, stride_h=1, stride_w=1,
                      length=L, channel_group=cg, jump_read=cg * D, jump_write=cg, jump_read_weights=cg * D,
                      shift_cut=sc, shift_bias=sb, act_type=0)
    alu = make_instr("ALU", valid_pixel_parallel=vpp, kernel_d=D, bank_id_in=0, bank_addr_in=100, bank_id_out=8,
                     bank_addr_out=300, bank_addr_weights=10, bank_addr_bias=5, pad_bottom=kh - 1,
                     pad_right=kh - 1)
    emu = Emulator(ARCH)
    geometry = dict(mode=mode, kh=kh, sh=1, vpp=vpp, L=L)
    x, w, bias = _dw_setup(emu, np.random.default_rng(0), cg=cg, D=D, **geometry)
    x[...], w[...], bias[...] = xv, wv, bv
    real_h = vpp - 1 + kh
    for h in range(real_h):
        emu.banks.bank(h)[100:100 + x.shape[1] * cg * D] = x[h].view(np.uint8).reshape(-1, 16)
    emu.banks.bank(DWCONVW)[10:10 + kh * kh * D * cg] = w.view(np.uint8).reshape(-1, 16)
    emu.banks.bank(BIAS)[5:5 + cg] = bias.view(np.uint8).reshape(-1, 16)
    emu.run(encode_program([init, alu, make_instr("END")]), {})
    want = _dw_reference(x, w, bias, sc=sc, sb=sb, act=0, pads=(0, 0, kh - 1, kh - 1), choff=0, **geometry)
    got = np.stack([emu.banks.bank(8 + r)[300:300 + L * cg].view(np.int8).reshape(L, -1) for r in range(vpp)])
    assert np.array_equal(got, want)
    assert np.abs(want).max() < 127  # not saturated: a wrapped sum would show


# ---- row transfers cut into affine pieces ---------------------------------------------------------------------
@pytest.mark.parametrize("pattern, step, count", [("store", None, 3), ("residues", ARCH.pp, ARCH.pp),
                                                  ("fetch_stride2", 2, 3)])
@pytest.mark.parametrize("nbytes", [16, 9, 32])
def test_piecewise_row_transfers_equal_plain(pattern: str, step: int | None, count: int, nbytes: int) -> None:
    """Rows cycling through a bank group (the row-store rule: bank g0 + r % PP, row base + r // PP * pitch) have
    keys that are affine only piece by piece: the precomputed reader and writer (strided copies per piece)
    must move exactly the bytes Banks.read / Banks.write move, zero-filled row tails included. With the banks
    visited 3 apart, runs of consecutive items are short and only the residue classes modulo PP are affine; a
    stride-2 window (the row-fetch rule: two rows per bank) is affine in its even and odd rows, one of them cut
    where the rows wrap the bank group: 3 pieces, not one per row."""
    from tvm_dpu.emulator.banks import Banks, fetch_rows, store_rows

    rng = np.random.default_rng(nbytes)
    nrow = -(-nbytes // ARCH.icp)
    if pattern == "residues":
        item = np.arange(6 * ARCH.pp + 1)
        banks_, rows = (3 * item) % ARCH.pp, 100 + item // ARCH.pp * 40
    elif pattern == "store":
        banks_, rows = store_rows(2, ARCH.pp, 2 * ARCH.pp + 3, 1, 0, 40, 100)
    else:
        rm = fetch_rows(0, ARCH.pp, 2 * ARCH.pp + 1, 2, 0, 60, (100, 400))
        banks_, rows = rm.banks, rm.rows
    rows = rows[:, None] + np.arange(5)[None, :] * nrow
    plain, fast = Banks(ARCH), Banks(ARCH)
    keys = fast.keys(banks_[:, None], rows, nrow)
    pieces = fast.affine_pieces(keys)
    assert fast.affine_view(keys) is None and pieces is not None and len(pieces) == count
    assert all(sl.step == step for sl, _ in pieces)
    plain.mem[...] = rng.integers(0, 256, size=plain.mem.shape, dtype=np.uint8)
    fast.mem[...] = plain.mem
    data = rng.integers(0, 256, size=rows.shape + (nbytes,), dtype=np.uint8)
    plain.write(banks_[:, None], rows, data)
    fast.row_writer(keys, nbytes)(data)
    assert np.array_equal(plain.mem, fast.mem)
    got = fast.row_reader(keys, nbytes)()
    assert np.array_equal(got, plain.read(banks_[:, None], rows, nbytes))
    assert np.array_equal(got, data)
