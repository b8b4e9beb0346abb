"""conv.emit_conv_groups, the one CONV emission of the code generator: what a tile's CONVINIT and CONVs hold
(the fused and unfused emitters' programs are checked against the golden model in test_codegen / test_fusion*)."""
from __future__ import annotations

from tvm_dpu.arch import load_arch
from tvm_dpu.codegen.conv import ConvIn, ConvJob, ConvOut, emit_conv_groups
from tvm_dpu.codegen.program import Program
from tvm_dpu.codegen.tiling import RowPlacement

ARCH = load_arch("DPUCZDX8G_ISA1_B4096")  # ICP 16, PP 8, bank depth 2048


def _job(**kw) -> ConvJob:
    base = dict(name="c", kh=3, kw=3, sh=2, sw=2, pads=(1, 1, 1, 1), cin=40, cout=48, act_type=1, shift_cut=7,
                shift_bias=3, w_offset=0, b_offset=0)
    return ConvJob(**{**base, **kw})


def test_groups_weights_bias_and_output_rows():
    prog = Program(track=False)
    job = _job()  # 40 channels: 3 groups of 16 per pixel, 8 of them padding; 27 CONVW rows per output group
    place = RowPlacement(ARCH.pp, 2, 60, 3, 2040, b0=5)  # wraps past the bank end: addresses taken mod depth
    emit_conv_groups(prog, ARCH, job, ConvIn.of(100, place, ARCH.bank_depth), ConvOut(200, 300, 3, 7, 2, 1), 3,
                     4, 9, 50, 6, (("vb0", 0),), (("vb1", 0),), pads=(1, 0, 2, 1), stride_offset_in=1)
    init, *convs = [e.instr for e in prog.entries]
    assert init.name == "CONVINIT" and [c.name for c in convs] == ["CONV"] * 3
    assert (init["jump_read"], init["jump_read_endl"], init["jump_write"], init["jump_write_endl"],
            init["stride_out"], init["stride_offset_out"], init["stride_offset_in"]) == (3, 60, 3, 7, 2, 1, 1)
    assert (init["kernel_h"], init["kernel_w"], init["stride_h"], init["stride_w"], init["valid_pixel_parallel"],
            init["act_type"], init["shift_cut"], init["shift_bias"]) == (3, 3, 2, 2, 4, 1, 7, 3)
    for g, c in enumerate(convs):
        assert (c["bank_addr_weights"], c["bank_addr_bias"], c["bank_addr_out"]) == (50 + 27 * g, 6 + g, 300 + g)
        assert (c["bank_id_in"], c["bank_id_out"], c["length"]) == (105, 200, 9)
        assert [c[f] for f in ("bank_addr_in", "bank_addr_in_1", "bank_addr_in_2", "bank_addr_in_3")] == \
            [2040, 2160 - 2048, 2280 - 2048, 2400 - 2048]
        # pad_right / pad_bottom count the kernel taps that do read the image (kernel - 1 - padding)
        assert (c["pad_top"], c["pad_left"], c["pad_bottom"], c["pad_right"]) == (1, 0, 0, 1)
        assert (c["channel_group"], c["channel_offset"]) == (3, 8)
    assert all(e.reads == (("vb0", 0),) and e.writes == (("vb1", 0),) for e in prog.entries[1:])


def test_one_group_per_call_keeps_one_convinit():
    """The resident chains emit one group per call (their output rows wrap the bank): the CONVINIT in force is
    not repeated."""
    prog = Program()
    job = _job(kh=1, kw=1, sh=1, sw=1, pads=(0, 0, 0, 0), cin=16)
    src = ConvIn(0, (0, 10, 20, 30), 10)
    for g in range(3):
        emit_conv_groups(prog, ARCH, job, src, ConvOut(8, (2047 + g) % ARCH.bank_depth, 3), 1, 8, 10, g, g, (), ())
    names = [e.instr.name for e in prog.entries]
    assert names == ["CONVINIT", "CONV", "CONV", "CONV"]
    assert [e.instr["bank_addr_out"] for e in prog.entries[1:]] == [2047, 0, 1]
    assert [e.instr["bank_addr_weights"] for e in prog.entries[1:]] == [0, 1, 2]
