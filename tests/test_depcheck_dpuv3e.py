"""Race checking on DPUV3E (DPUCAHX8H) programs: the DPUV3E emulator records each instruction's bank rows and DDR
bytes (timing.depcheck.Access) as the DPUCZDX8G emulator does, the checker finds vai_c's U50LV programs clean and
names the race a dropped token opens."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from tvm_dpu.arch import load_arch
from tvm_dpu.codegen.isa import Instr, decode_program, encode_program
from tvm_dpu.emulator.dpuv3e import DpuV3EEmulator
from tvm_dpu.runtime.dep_check import check_code
from tvm_dpu.xmodel import read_xmodel

DATA = Path(__file__).parent / "data" / "xmodel" / "dpucahx8h"


def _subgraphs():
    for f in sorted(DATA.glob("*.xmodel")):
        for d in read_xmodel(f).dpu_subgraphs():
            yield f.name, d


def _regions(d) -> dict[int, np.ndarray]:
    return {r.reg_id: (np.frombuffer(r.data, np.uint8).copy() if r.data else np.zeros(r.size, np.uint8))
            for r in d.regions.values()}


def _code(d) -> np.ndarray:
    return np.frombuffer(d.mc_code, "<u4").astype(np.uint32)


def test_vai_c_u50lv_programs_are_race_free():
    seen = 0
    for name, d in _subgraphs():
        rep = check_code(_code(d), load_arch(d.fingerprint), _regions(d))
        assert rep.races_checked and rep.ok, (name, d.name, rep.problems[:3], [str(r) for r in rep.races[:3]])
        seen += 1
    assert seen == 8


def test_recording_changes_no_result_and_sees_every_transfer():
    name, d = next(_subgraphs())
    arch = load_arch(d.fingerprint)
    plain, traced = _regions(d), _regions(d)
    DpuV3EEmulator(arch).run(_code(d), plain)
    acc = DpuV3EEmulator(arch).record_accesses(_code(d), traced)
    for rid in plain:
        np.testing.assert_array_equal(plain[rid], traced[rid])
    instrs = decode_program(_code(d), "DPUV3E")
    assert len(acc) == len(instrs)  # up to and including the END
    for ins, a in zip(instrs, acc):
        if ins.name == "LOAD":
            assert a.ddr_reads and a.bank_writes and not a.ddr_writes
        elif ins.name == "SAVE":
            assert a.ddr_writes and a.bank_reads and not a.ddr_reads
        elif ins.name == "CONV":
            assert a.bank_reads and a.bank_writes


def test_a_dropped_load_to_conv_token_is_a_race():
    """vai_c's program with one load->conv token removed (the LOAD no longer posts, the CONV no longer waits):
    still balanced, but the CONV now reads weights no token orders after the LOAD that wrote them."""
    _, d = next(x for x in _subgraphs() if "vai2.5_u50lv.xmodel" in x[0])
    instrs = decode_program(_code(d), "DPUV3E")
    conv = next(i for i, x in enumerate(instrs) if x.name == "CONV" and x.dpdon == 0b0001)
    load = max(i for i in range(conv) if instrs[i].name == "LOAD" and instrs[i].dpdby == 0b0100)
    broken = list(instrs)
    broken[load] = Instr("LOAD", instrs[load].fields, instrs[load].dpdon, 0)
    broken[conv] = Instr("CONV", instrs[conv].fields, 0, instrs[conv].dpdby)
    rep = check_code(encode_program(broken, "DPUV3E"), load_arch(d.fingerprint), _regions(d))
    assert not rep.problems and rep.races
    assert any(r.kind == "RAW" and r.second == conv and r.first < conv for r in rep.races)
    assert "bank" in str(rep.races[0])


def test_padded_pixels_are_not_recorded_as_reads():
    """A CONV's padding replaces window pixels the hardware never fetches: only the real ones are reads (else a
    LOAD refilling the rows past a padded edge, as PointPillars' RPN does, would be a false WAR race)."""
    from tvm_dpu.codegen.isa import make_instr

    arch = load_arch("DPUCAHX8H_ISA2")
    prog = [make_instr("CONVINIT", isa="DPUV3E", kernel_h=3, kernel_w=3, valid_pixel_parallel=1, stride_h=1,
                       stride_w=1, jump_read=1, jump_read_endl=64, jump_write=1, jump_write_endl=1, stride_out=1),
            make_instr("CONV", isa="DPUV3E", bank_id_in=0, bank_id_out=8, channel_group=1, length=2, pad_top=1,
                       pad_left=1, pad_right=2, pad_bottom=2),
            make_instr("END", isa="DPUV3E")]
    acc = DpuV3EEmulator(arch).record_accesses(encode_program(prog, "DPUV3E"), {})
    depth = DpuV3EEmulator(arch).banks.key_depth
    image = arch.bank_group("VB1").base_id + arch.bank_group("VB1").count
    reads = np.unique(np.concatenate(acc[1].bank_reads))
    # a 3 x 4 window: rows 1-2 and columns 1-3 are real (pad_top / pad_left 1, right / bottom edges unpadded)
    assert (reads[reads < image * depth]).size == 2 * 3


@pytest.mark.slow
@pytest.mark.parametrize("name", ["pointpillars_custom_op_u50lv_cd437d4143a38734bb3aba509dc6b4cc5111ddd9.xmodel",
                                  "pointpillars_custom_op_u50lv-dwc_59a2ba1f015add2c7539062c5bf0d6742c0c2e00.xmodel"])
def test_pointpillars_u50lv_is_race_free(name):
    """vai_c's PointPillars for U50LV / U50LV-DWC (2 MB, not vendored: tests/data/xmodel/dpucahx8h/PROVENANCE.md):
    both DPU subgraphs (PFN 30,007 and RPN 8,094 instructions) balance their tokens and have no race."""
    path = Path(os.environ.get("TVM_DPU_XMODELS", "xmodels-not-vendored")) / name
    if not path.is_file():
        pytest.skip("set TVM_DPU_XMODELS to a directory holding vai_c's PointPillars U50LV xmodels")
    subgraphs = read_xmodel(path).dpu_subgraphs()
    assert len(subgraphs) == 2
    for d in subgraphs:
        rep = check_code(_code(d), load_arch(d.fingerprint), _regions(d))
        assert rep.races_checked and rep.ok, (d.name, rep.problems[:3], [str(r) for r in rep.races[:3]])
