"""The DPUCAHX8H timing model (timing/cost_dpuv3e.py, timing/params_dpucahx8h.json): DPUV3E programs are timed from
their own fields, weight LOADs go through the weight ports, the cost reads only its timed fields, and vai_c's
U50LV programs get cycles."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tvm_dpu.arch import load_arch
from tvm_dpu.codegen.isa import Instr, encode_program, instr_specs, make_instr
from tvm_dpu.timing import simulate as sim
from tvm_dpu.timing.cost_dpuv3e import TIMED_FIELDS_V3E, V3ECostModel
from tvm_dpu.timing.params import TimingError, load_params, machine
from tvm_dpu.xmodel import read_xmodel

ISA = "DPUV3E"
TARGET = "DPUCAHX8H_ISA2_DWC"
U50LV = Path(__file__).parent / "data" / "xmodel" / "dpucahx8h"


class _Recording(dict):
    def __init__(self, values: dict, seen: set):
        super().__init__(values)
        self.seen = seen

    def __getitem__(self, key):
        self.seen.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        if key in self:
            self.seen.add(key)
        return super().get(key, default)


def _random(name: str, rng: np.random.Generator, seen: set, **fixed: int) -> Instr:
    spec = instr_specs(ISA)[name]
    values = {f.name: int(rng.integers(f.min_value, min(f.max_value, f.min_value + 300) + 1)) for f in spec.fields}
    values.update(fixed)
    return Instr(name, _Recording(values, seen), 0, 0)


def test_cost_reads_only_its_timed_fields():
    m = machine(load_arch(TARGET))
    rng = np.random.default_rng(0)
    read: dict[str, set] = {name: set() for name in instr_specs(ISA)}
    for trial in range(40):
        cm = V3ECostModel(m)
        for init in ("CONVINIT", "POOLINIT", "DWINIT"):
            cm.cost(0, _random(init, rng, read[init]))
        for name in instr_specs(ISA):
            fixed = {"bank_id": m.params.weight_load_bank} if name == "LOAD" and trial % 2 else {}
            cm.cost(1, _random(name, rng, read[name], **fixed))
    for name, fields in read.items():
        assert fields <= set(TIMED_FIELDS_V3E.get(name, ())), (name, fields - set(TIMED_FIELDS_V3E.get(name, ())))
    for name, fields in TIMED_FIELDS_V3E.items():
        assert set(fields) <= read[name], (name, set(fields) - read[name])


def _weight_program(ports_bank: int) -> np.ndarray:
    load = make_instr("LOAD", isa=ISA, bank_id=ports_bank, length=64, channel=16, jump_read=16,
                      output_channel_num=16, dpdby=0b0100)
    init = make_instr("CONVINIT", isa=ISA, kernel_h=1, kernel_w=1, valid_pixel_parallel=8)
    conv = make_instr("CONV", isa=ISA, channel_group=4, length=16, dpdon=0b0001)
    return encode_program([load, init, conv, make_instr("END", isa=ISA)], ISA)


def test_weight_load_moves_every_output_channel_over_both_weight_ports():
    arch = load_arch(TARGET)
    p = load_params(arch)
    weights = sim.simulate(_weight_program(p.weight_load_bank), arch)
    assert weights.ddr_read_bytes == 64 * 16 * 16  # all 16 output channels' rows
    one_port = sim.simulate(_weight_program(p.weight_load_bank), arch, p.replace(weight_ports=1))
    load_w, load_1 = (float(r.end[0] - r.start[0]) for r in (weights, one_port))
    assert load_1 > 1.8 * load_w  # twice the beats through one port (plus the same issue cost)
    fmap = sim.simulate(_weight_program(0), arch)
    assert fmap.ddr_read_bytes == 64 * 16  # a feature-map LOAD into an image bank: one item per row


def test_a_save_beside_a_weight_load_keeps_the_data_port():
    """A weight LOAD goes through the weight ports: a SAVE running at the same time keeps the engine's data port,
    while beside a feature-map LOAD of the same bytes it shares it."""
    arch = load_arch(TARGET)
    bank = load_params(arch).weight_load_bank

    def save_cycles(load_bank: int, oc: int) -> float:
        load = make_instr("LOAD", isa=ISA, bank_id=load_bank, length=512, channel=64, jump_read=64,
                          output_channel_num=oc)
        save = make_instr("SAVE", isa=ISA, bank_id=8, length=512, channel=64, jump_write=64)
        r = sim.simulate(encode_program([load, save, make_instr("END", isa=ISA)], ISA), arch)
        assert r.ddr_read_bytes == 512 * 64 * oc
        return float(r.end[1] - r.start[1])

    alone_port, shared_port = save_cycles(bank, 1), save_cycles(0, 1)
    assert shared_port > 1.5 * alone_port


def test_weight_load_bank_is_the_emulators():
    from tvm_dpu.emulator import DPUV3E_WEIGHT_LOAD_BANK

    assert load_params(TARGET).weight_load_bank == DPUV3E_WEIGHT_LOAD_BANK


def test_pool_and_depthwise_cost_their_kernel_from_their_init():
    arch = load_arch(TARGET)
    fill = load_params(arch).alu_fill_cycles
    for init, op in (("POOLINIT", "POOL"), ("DWINIT", "DPTWISE")):
        prog = [make_instr(init, isa=ISA, kernel_h=3, kernel_w=3, valid_pixel_parallel=1),
                make_instr(op, isa=ISA, channel_group=2, length=10), make_instr("END", isa=ISA)]
        r = sim.simulate(encode_program(prog, ISA), arch)
        assert float(r.end[1] - r.start[1]) == pytest.approx(3 * 3 * 2 * 10 + fill)
        assert (r.macs > 0) == (op == "DPTWISE")
        with pytest.raises(TimingError, match=f"instruction 0 \\({op}\\): no {init} before it"):
            sim.simulate(encode_program(prog[1:], ISA), arch)


def test_timing_key_is_per_instruction_set():
    code = _weight_program(63)
    assert sim.timing_key(code, ISA) != sim.timing_key(code)
    arch = load_arch(TARGET)
    assert sim.cycles(code, arch) == sim.simulate(code, arch).cycles


def test_vai_c_u50lv_programs_are_timed():
    files = sorted(U50LV.glob("*.xmodel"))
    assert len(files) == 4
    for f in files:
        for d in read_xmodel(f).dpu_subgraphs():
            arch = load_arch(d.fingerprint)
            r = sim.simulate(np.frombuffer(d.mc_code, "<u4").astype(np.uint32), arch)
            assert r.cycles > 0 and r.macs > 0 and r.ddr_read_bytes > 0 and r.ddr_write_bytes > 0
            assert r.cycles >= max(r.engine_busy.values())  # engines overlap, never exceed the whole
            assert r.freq_hz == arch.freq_mhz * 1e6


@pytest.mark.parametrize("board,engines,mhz,peak_gops", [("u50", 6, 300, 7373), ("u50lv", 10, 275, 11264),
                                                          ("u280", 14, 300, 17203)])
def test_alveo_boards_match_pg367_peak(board, engines, mhz, peak_gops):
    """PG367 Table 1's peak GOPS is engines x PP*ICP*OCP*2 x clock: the presets reproduce it, and stay out of the
    compile targets while DPUCAHX8H has no code generator."""
    from tvm_dpu.arch import list_presets
    from tvm_dpu.arch.arch import family_boards

    a = load_arch(board)
    assert (a.cores, a.freq_mhz, a.instruction_set) == (engines, mhz, ISA)
    assert round(a.peak_gops * a.cores) == peak_gops
    assert board not in list_presets() and a in family_boards()
    assert machine(a).freq_hz == mhz * 1e6


def test_report_times_on_a_board_and_refuses_another_family(tmp_path, capsys):
    from tvm_dpu.cli import main

    f = U50LV / "tf2_custom_op_vai2.5_u50lv.xmodel"
    assert main(["report", str(f), "--board", "u50lv", "-o", str(tmp_path / "r.html")]) == 0
    assert "timing for 2/2 subgraph(s)" in capsys.readouterr().out
    assert main(["report", str(f), "--board", "zcu102", "-o", str(tmp_path / "r.html")]) != 0
    assert "carries DPUCZDX8G_ISA1_B4096, the xmodel's programs are for DPUCAHX8H_ISA2" in capsys.readouterr().err


def test_dse_names_the_alveo_card_it_cannot_explore():
    from tvm_dpu.arch.parts import part_info
    from tvm_dpu.errors import ArchError

    with pytest.raises(ArchError, match="u50lv is an Alveo card carrying 10 x DPUCAHX8H_ISA2 engines at 275 MHz"):
        part_info("u50lv")
