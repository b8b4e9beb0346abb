"""The DPUV3E emulator (tvm_dpu/emulator/dpuv3e.py) against AMD's simulator: every program of
tests/data/dpuv3e_conformance (LOAD/SAVE, CONV with the two-port weight LOAD, POOL, ELEW, DPTWISE on three
DPUCAHX8H targets) gives the simulator's DDR regions byte for byte; bad programs are refused naming the instruction."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tvm_dpu.arch import load_arch
from tvm_dpu.codegen.isa import encode_program, make_instr
from tvm_dpu.errors import EmulatorError
from tvm_dpu.emulator.dpuv3e import DpuV3EEmulator, V3EBanks, engine_specs

DATA = Path(__file__).parent / "data" / "dpuv3e_conformance"
CASES = json.loads((DATA / "cases.json").read_text())


def _case(name: str):
    z = np.load(DATA / f"{name}.npz")
    arch = load_arch(json.loads(str(z["arch"]))["name"])
    regions = {int(k[3:-3]): z[k].copy() for k in z.files if k.endswith("_in")}
    return z, arch, regions


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["name"])
def test_emulator_equals_the_simulator(case):
    z, arch, regions = _case(case["name"])
    stats = DpuV3EEmulator(arch).run(z["code"], regions)
    assert set(stats.by_name) == set(case["instructions"]) - {"END"}
    for rid, got in regions.items():
        assert np.array_equal(got, z[f"reg{rid}_out"]), (case["name"], rid, int((got != z[f"reg{rid}_out"]).sum()))


def test_every_computing_instruction_is_covered():
    seen = {name for c in CASES for name in c["instructions"]}
    assert seen == {"LOAD", "SAVE", "CONVINIT", "CONV", "POOLINIT", "POOL", "DWINIT", "DPTWISE", "ELEWINIT", "ELEW",
                    "END"}


def test_banks_and_engines_come_from_the_target():
    dwc = load_arch("DPUCAHX8H_ISA2_DWC")
    banks = V3EBanks(dwc)
    assert banks.depth[0] == 8192 and banks.depth[16] == 2048 and banks.depth[34] == 256 and 35 not in banks.mem
    assert engine_specs(dwc)["dwconv"].pp == 2 and engine_specs(load_arch("DPUCAHX8H_ISA2_ELP2"))["elew"].pp == 2
    assert "dwconv" not in engine_specs(load_arch("DPUCAHX8H_ISA2"))


def _program(*instrs):
    return encode_program([make_instr(n, isa="DPUV3E", **f) for n, f in instrs], "DPUV3E")


def test_errors_name_the_instruction_and_field():
    arch = load_arch("DPUCAHX8H_ISA2")
    load = dict(bank_id=40, bank_addr=0, jump_read=16, jump_write=1, length=1, channel=16, reg_id=0, ddr_addr=0,
                pad_idx=1, jump_read_endl=1, output_channel_num=1)
    with pytest.raises(EmulatorError, match=r"instruction 0 \(LOAD\) field bank_id=40: no such bank"):
        DpuV3EEmulator(arch).run(_program(("LOAD", load), ("END", {})), {0: np.zeros(16, np.uint8)})
    with pytest.raises(EmulatorError, match=r"instruction 1 \(LOAD\) field ddr_addr=8: reads up to byte 24"):
        DpuV3EEmulator(arch).run(_program(("LOAD", dict(load, bank_id=0)), ("LOAD", dict(load, bank_id=0, ddr_addr=8)),
                                          ("END", {})), {0: np.zeros(16, np.uint8)})
    dw = dict(bank_id_in=0, bank_id_out=8, channel_group=1, length=1)
    with pytest.raises(EmulatorError, match=r"instruction 0 \(DPTWISE\): no DWINIT"):
        DpuV3EEmulator(arch).run(_program(("DPTWISE", dw), ("END", {})), {})
    init = dict(kernel_h=1, kernel_w=1, stride_h=1, stride_w=1, valid_pixel_parallel=1, jump_read=1, jump_read_endl=1,
                jump_write=1, jump_write_endl=1, stride_out=1)
    with pytest.raises(EmulatorError, match=r"instruction 1 \(DPTWISE\).*DPUCAHX8H_ISA2 has no dwconv engine"):
        DpuV3EEmulator(arch).run(_program(("DWINIT", init), ("DPTWISE", dw), ("END", {})), {})


def test_banks_persist_across_runs_and_end_stops():
    """A second program SAVEs what the first LOADed; instructions after END do not run."""
    arch = load_arch("DPUCAHX8H_ISA2")
    emu = DpuV3EEmulator(arch)
    data = np.arange(32, dtype=np.uint8)
    emu.run(_program(("LOAD", dict(bank_id=3, bank_addr=5, jump_read=16, jump_write=1, length=2, channel=16, reg_id=0,
                                   ddr_addr=0, pad_idx=1, jump_read_endl=1, output_channel_num=1)), ("END", {})),
            {0: data})
    out = np.zeros(32, np.uint8)
    save = dict(bank_id=3, bank_addr=5, jump_read=1, jump_write=16, length=2, channel=16, reg_id=1, ddr_addr=0)
    stats = emu.run(_program(("SAVE", save), ("END", {}), ("SAVE", dict(save, ddr_addr=8))), {1: out})
    assert np.array_equal(out, data) and stats.instructions == 1


def test_overlapping_items_are_written_in_order():
    """Bank::Write item by item: a later item overwrites the rows it shares with an earlier one, and each write
    zero-fills the rest of its last row."""
    banks = V3EBanks(load_arch("DPUCAHX8H_ISA2"))
    items = np.stack([np.full(20, 1, np.uint8), np.full(20, 2, np.uint8)])
    banks.write_many(0, np.array([8191, 0]), items)  # item 0 wraps to row 0, which item 1 then starts at
    assert banks.read(0, 8191, 16).tolist() == [1] * 16
    assert banks.read(0, 0, 32).tolist() == [2] * 20 + [0] * 12
