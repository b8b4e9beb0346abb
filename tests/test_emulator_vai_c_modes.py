"""Instruction modes vai_c emits that tvm-dpu's own code generator does not (issue 21 item 2), pinned against
independent numpy computations written from isa1-semantics.md: channel-augmented LOADs with pad_start / pad_end,
including the masked bytes a last item reads past the end of its DDR region; SAVE hp_id=1; CONVINIT
stride_offset_in=1. (ELEW num=1 is pinned in test_emulator_exact.py::test_elew_against_semantics[1-0].)"""
from __future__ import annotations

import numpy as np
import pytest

from tvm_dpu.arch.arch import find_preset
from tvm_dpu.codegen.isa import encode_program, make_instr
from tvm_dpu.errors import EmulatorError
from tvm_dpu.emulator.core import Emulator

ARCH = find_preset("DPUCZDX8G_ISA1_B4096")
ICP = ARCH.icp
CONVW = ARCH.bank_group("CONVW").base_id
BIAS = ARCH.bank_group("BIAS").base_id


def _augmented_items(ddr: np.ndarray, n: int, ch: int, jr: int, pad_start: int, pad_idx: int,
                     pad_end: int) -> np.ndarray:
    """isa1-semantics.md 5.1 for item i: DDR bytes [i*jr, i*jr + ch) with the leading pad_start - i*jr bytes and,
    for the last pad_idx items, the bytes from ceil(ch/ICP)*ICP - m on (m = pad_end + jr*(i - first tail))
    zeroed. Bytes past the end of `ddr` must all be masked: they are taken as 0xEE and must not show."""
    src = np.concatenate([ddr, np.full(n * jr + ch, 0xEE, np.uint8)])
    out = np.zeros((n, ch), np.uint8)
    for i in range(n):
        item = src[i * jr:i * jr + ch].copy()
        item[:max(0, pad_start - i * jr)] = 0
        if i >= n - pad_idx:
            m = pad_end + jr * (i - (n - pad_idx))
            item[-(-ch // ICP) * ICP - m:] = 0
        out[i] = item
    return out


def _load_save(n, ch, jr, pad_start, pad_idx, pad_end, region: np.ndarray, hp_id: int = 0):
    """LOAD the items into image bank 0 (one row each), SAVE them back densely into region 1."""
    prog = [make_instr("LOAD", bank_id=0, bank_addr=0, length=n, channel=ch, jump_read=jr, jump_write=1,
                       pad_start=pad_start, pad_idx=pad_idx, pad_end=pad_end, reg_id=2, ddr_addr=0),
            make_instr("SAVE", bank_id=0, bank_addr=0, length=n, channel=ch, jump_read=1, jump_write=ch,
                       reg_id=1, ddr_addr=0, hp_id=hp_id),
            make_instr("END")]
    regions = {2: region, 1: np.zeros(n * ch, np.uint8)}
    Emulator(ARCH).run(encode_program(prog), regions)
    return regions[1].reshape(n, ch)


# a first-layer style LOAD: kw=4 taps of 3 channels read as one 12-byte pixel, stride 3 between pixels
N, CH, JR, PAD_START, PAD_IDX, PAD_END = 6, 12, 3, 2, 2, 6
# item 4 keeps bytes [0, 10), item 5 keeps [0, 7): the last unmasked byte is 5*3 + 6 = 21
NEEDED = 22
FULL = (N - 1) * JR + CH  # 27: what the LOAD spans unmasked


def test_augmented_load_with_pads_matches_the_semantics():
    rng = np.random.default_rng(0)
    region = rng.integers(1, 256, FULL, dtype=np.uint8)  # inside the region: nothing reads past its end
    got = _load_save(N, CH, JR, PAD_START, PAD_IDX, PAD_END, region)
    want = _augmented_items(region, N, CH, JR, PAD_START, PAD_IDX, PAD_END)
    assert np.array_equal(got, want)
    assert (want[0, :2] == 0).all() and (want[4, 10:] == 0).all() and (want[5, 7:] == 0).all()


def test_masked_bytes_past_the_region_end_read_as_zero():
    """vai_c sizes the input region exactly: the last augmented items reach 5 masked bytes past it."""
    rng = np.random.default_rng(1)
    exact = rng.integers(1, 256, NEEDED, dtype=np.uint8)
    got = _load_save(N, CH, JR, PAD_START, PAD_IDX, PAD_END, exact)
    assert np.array_equal(got, _augmented_items(exact, N, CH, JR, PAD_START, PAD_IDX, PAD_END))
    # the same program with the region padded by zeros or by random bytes gives the same result
    for tail in (np.zeros(FULL - NEEDED, np.uint8), rng.integers(0, 256, FULL - NEEDED, dtype=np.uint8)):
        assert np.array_equal(_load_save(N, CH, JR, PAD_START, PAD_IDX, PAD_END, np.concatenate([exact, tail])), got)


def test_an_unmasked_byte_past_the_end_is_still_an_error():
    region = np.ones(NEEDED - 1, np.uint8)  # byte 21 (item 5, byte 6) is kept by the mask
    with pytest.raises(EmulatorError, match=r"instruction 0 \(LOAD\) field ddr_addr=0: access ends at byte 27"):
        _load_save(N, CH, JR, PAD_START, PAD_IDX, PAD_END, region)
    # with pad_idx=1, pad_end=0 (no pads) nothing is masked: one byte short is an error
    with pytest.raises(EmulatorError, match="past the end of DDR region 2"):
        _load_save(N, CH, JR, 0, 1, 0, np.ones(FULL - 1, np.uint8))
    # an ordinary (non-overlapping) LOAD never gets the allowance
    with pytest.raises(EmulatorError, match="past the end"):
        _load_save(2, 16, 16, 0, 1, 0, np.ones(31, np.uint8))


@pytest.mark.parametrize("hp_id", [0, 1])
def test_save_hp_id_selects_a_port_and_changes_no_data(hp_id):
    rng = np.random.default_rng(2)
    region = rng.integers(0, 256, 64, dtype=np.uint8)
    got = _load_save(4, 16, 16, 0, 1, 0, region, hp_id=hp_id)
    assert np.array_equal(got.reshape(-1), region)


def test_conv_with_stride_offset_in_1():
    """CONVINIT stride_offset_in=1 (vai_c uses it for a strided conv whose first input row sits in the second
    line slot): CONV against 6.2-6.4 computed here from the row-fetch rule of 3.3 on the bank contents."""
    rng = np.random.default_rng(3)
    emu = Emulator(ARCH)
    emu.banks.mem[...] = rng.integers(0, 256, size=emu.banks.mem.shape, dtype=np.uint8)
    kh, kw, sh, sw, s0, vpp, L, E, J, A0 = 3, 2, 2, 1, 1, 2, 3, 5, 1, 4
    sc, sb = 7, 3
    init = make_instr("CONVINIT", kernel_h=kh, kernel_w=kw, stride_h=sh, stride_w=sw, stride_offset_in=s0,
                      valid_pixel_parallel=vpp, shift_cut=sc, shift_bias=sb, act_type=0, jump_read=J,
                      jump_read_endl=E, jump_write=1, jump_write_endl=8, stride_out=1)
    conv = make_instr("CONV", bank_id_in=0, bank_addr_in=A0, channel_group=1, length=L, bank_addr_weights=2,
                      bank_addr_bias=1, bank_id_out=8, bank_addr_out=3, pad_right=kw - 1, pad_bottom=kh - 1)
    before = emu.banks.mem.copy()
    emu.run(encode_program([init, conv]), {})
    mem = before.view(np.int8)
    # input rows h of the real window: q = s0 + h, bank floor(q / sh) (one group), row A0 + (q mod sh)*E + w*J
    real_h = (vpp - 1) * sh + kh
    x = np.array([[mem[(s0 + h) // sh, A0 + ((s0 + h) % sh) * E + w * J] for w in range((L - 1) * sw + kw)]
                  for h in range(real_h)], np.int64)  # (h, w, ICP)
    w_ = np.array([[[mem[CONVW + o, 2 + i * kw + j] for j in range(kw)] for i in range(kh)]
                   for o in range(ARCH.ocp)], np.int64)  # (o, i, j, c)
    b = mem[BIAS, 1, :ARCH.ocp].astype(np.int64)
    for p in range(vpp):
        for q in range(L):
            acc = np.einsum("ijc,oijc->o", x[p * sh:p * sh + kh, q * sw:q * sw + kw], w_)
            v = 2 * acc + (b << sb)  # the DPUV2 bias is not doubled (6.4): t = (2*ACC + B*2^sb) / 2^(sc+1)
            want = np.clip((v + (1 << sc)) >> (sc + 1), -128, 127).astype(np.int8)
            got = emu.banks.mem[8 + p, 3 + q].view(np.int8)[:ARCH.ocp]
            assert np.array_equal(got, want), (p, q)
