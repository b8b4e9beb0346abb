"""The Pynq driver's full sequence against the SIMULATED register file (tvm_dpu.runtime.sim_regfile), no board.

The simulation's "start" runs the instruction emulator on the device copies of the buffers the driver allocated,
flushed and pointed the base-address registers at, so these tests fail if the driver skips a copy, a cache flush or
invalidate, a register write, or reads back the wrong buffer. A board test runs only where pynq and a DPU exist.
"""
from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

from tvm_dpu import zoo
from tvm_dpu.builder import build
from tvm_dpu.types import REG_INPUT
from tvm_dpu.errors import ArtifactError, DPUError
from tvm_dpu.runtime import pynq_driver as regs
from tvm_dpu.runtime.artifact import load
from tvm_dpu.runtime.device import DeviceError, DeviceTimeoutError, EmulatorDevice
from tvm_dpu.runtime.pynq_driver import PynqDevice
from tvm_dpu.runtime.sim_regfile import SIM_DPU_BASE, SimulatedPynq

ARCH = "zcu102"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    model = zoo.build_model("mixed_cnn")
    calib = [zoo.random_input(model, seed=s) for s in range(2)]
    compiled = build(model, arch=ARCH, calibration=calib, progress=False)
    path = compiled.export(tmp_path_factory.mktemp("art") / "m.tvmdpu")
    return model, compiled, path


def _device(sim, **kw):
    return PynqDevice(bitfile="dpu.bit", pynq=sim, **kw)


def test_driver_runs_every_subgraph_bit_exact_and_matches_emulator(built):
    model, compiled, path = built
    x = zoo.random_input(model, seed=11)
    expected = compiled.run(x)[0]
    sim = SimulatedPynq(ARCH, latency_polls=5)
    dev = _device(sim, timeout_s=5.0)
    assert dev.arch.fingerprint == compiled.arch.fingerprint  # read from the fingerprint registers
    m = load(path, device=dev)
    m.set_verify(True)
    y = m.run(x)[0]
    np.testing.assert_array_equal(y, expected)
    assert sum(r.mismatches for r in m.verify_results()) == 0
    assert sim.dpu.runs == len(compiled.runners)
    # Second run reuses the buffers (no new allocations) and still agrees.
    n_alloc = len(sim.ddr.allocations)
    np.testing.assert_array_equal(m.run(x)[0], expected)
    assert len(sim.ddr.allocations) == n_alloc


def test_register_sequence(built):
    _, compiled, _ = built
    runner = next(iter(compiled.runners.values()))
    sg = runner.sg
    sim = SimulatedPynq(ARCH)
    dev = _device(sim)
    regions = sg.new_regions()
    rng = np.random.default_rng(0)
    b = sg.inputs[0]
    b.fmap.to_ddr(regions[b.fmap.reg_id], rng.integers(-20, 20, b.shape, dtype=np.int8))
    ref = {k: v.copy() for k, v in regions.items()}
    EmulatorDevice(compiled.arch).execute(sg, ref)
    dev.execute(sg, regions)
    for k in regions:
        np.testing.assert_array_equal(regions[k], ref[k])
    writes = sim.dpu.writes
    offsets = [o for o, _ in writes]
    start = offsets.index(regs.AP_CTRL)
    # every base-address register and the instruction address are written before start
    for rid in range(8):
        assert regs.addr_lo(rid) in offsets[:start] and regs.addr_lo(rid) + 4 in offsets[:start]
    assert regs.INSTR_ADDR_LO in offsets[:start] and regs.INSTR_ADDR_HI in offsets[:start]
    values = dict(writes[:start])
    code_buf, bufs = dev.buffers_for(sg)
    assert values[regs.INSTR_ADDR_LO] == code_buf.physical_address & 0xFFFFFFFF
    assert values[regs.addr_lo(REG_INPUT)] == bufs[REG_INPUT].physical_address & 0xFFFFFFFF
    unused = set(range(8)) - set(sg.region_sizes)
    assert all(values[regs.addr_lo(r)] == 0 for r in unused)
    assert code_buf.physical_address % 4096 == 0 and all(v.physical_address % 4096 == 0 for v in bufs.values())
    assert writes[start] == (regs.AP_CTRL, regs.AP_START)
    assert (regs.ISR, regs.ISR_DONE) in writes[start:]  # done acknowledged


def test_missing_flush_is_visible_to_the_simulation(built, monkeypatch):
    """The simulation keeps host and device copies apart: a driver that skipped flush would compute garbage."""
    _, compiled, _ = built
    sg = next(iter(compiled.runners.values())).sg
    sim = SimulatedPynq(ARCH)
    dev = _device(sim)
    regions = sg.new_regions()
    ref = {k: v.copy() for k, v in regions.items()}
    EmulatorDevice(compiled.arch).execute(sg, ref)
    from tvm_dpu.runtime.sim_regfile import SimBuffer

    monkeypatch.setattr(SimBuffer, "flush", lambda self: None)
    with pytest.raises(DeviceTimeoutError):  # without the code flushed the core fetches zeros: no END, a hang
        dev.timeout_s = 0.2
        dev.execute(sg, regions)


def test_hung_core_times_out_with_status():
    sim = SimulatedPynq(ARCH, hang=True)
    dev = _device(sim, timeout_s=0.15)
    from tvm_dpu.types import CompiledSubgraph
    from tvm_dpu.codegen.isa import encode_program, make_instr

    code = encode_program([make_instr("END")])
    sg = CompiledSubgraph("tiny", ARCH, dev.arch.fingerprint, code, np.zeros(16, np.uint8), {0: 16}, [], [])
    import time

    t0 = time.monotonic()
    with pytest.raises(DeviceTimeoutError, match=r"within 0.15 s .*AP_CTRL=0x00000001"):
        dev.execute(sg, sg.new_regions())
    assert time.monotonic() - t0 < 2.0
    with pytest.raises(DeviceError, match="busy"):  # the core never finished: refuse to start on top of it
        dev.execute(sg, sg.new_regions())


def test_faulting_program_times_out_and_the_simulation_names_the_fault():
    from tvm_dpu.types import CompiledSubgraph
    from tvm_dpu.codegen.isa import encode_program, make_instr

    sim = SimulatedPynq(ARCH)
    dev = _device(sim, timeout_s=0.1)
    # LOAD from base register 5, which the subgraph does not define: the core faults (hangs).
    code = encode_program([make_instr("LOAD", reg_id=5, length=1, channel=16), make_instr("END")])
    sg = CompiledSubgraph("bad", ARCH, dev.arch.fingerprint, code, np.zeros(16, np.uint8), {0: 16}, [], [])
    with pytest.raises(DeviceTimeoutError):
        dev.execute(sg, sg.new_regions())
    assert "reg_id" in sim.dpu.fault and "instruction 0" in sim.dpu.fault.lower().replace("#", "")


def test_device_errors_are_clear():
    with pytest.raises(DeviceError, match="contiguous memory"):
        from tvm_dpu.types import CompiledSubgraph
        from tvm_dpu.codegen.isa import encode_program, make_instr

        sim = SimulatedPynq(ARCH, fail_allocation=True)
        dev = _device(sim)
        sg = CompiledSubgraph("x", ARCH, dev.arch.fingerprint, encode_program([make_instr("END")]),
                              np.zeros(16, np.uint8), {0: 16}, [], [])
        dev.execute(sg, sg.new_regions())
    sim = SimulatedPynq(ARCH)
    with pytest.raises(DeviceError, match="no IP 'nope'"):
        _device(sim, ip_name="nope")
    with pytest.raises(DeviceError, match="overlay or bitfile"):
        PynqDevice(pynq=sim)
    sim.ip_dict.clear()
    with pytest.raises(DeviceError, match="no DPUCZDX8G IP"):
        _device(sim)
    with pytest.raises(ValueError, match="outside"):
        SimulatedPynq(ARCH).MMIO(SIM_DPU_BASE, 0x100).read(0x200)


def test_fingerprint_mismatch_between_artifact_and_board(built):
    _, _, path = built
    sim = SimulatedPynq("DPUCZDX8G_ISA1_B1152")
    with pytest.raises(ArtifactError, match="fingerprint .* recompile"):
        load(path, device=_device(sim))
    # load(device="pynq") builds the PynqDevice from the options, with the same check
    with pytest.raises(ArtifactError, match="fingerprint"):
        load(path, device="pynq", bitfile="dpu.bit", pynq=sim)
    m = load(path, device="pynq", bitfile="dpu.bit", pynq=SimulatedPynq(ARCH))
    assert next(iter(m.runners.values())).device.name == "pynq"


def test_without_pynq_installed_the_error_says_how_to_get_it():
    if importlib.util.find_spec("pynq") is not None:
        pytest.skip("pynq is installed here")
    with pytest.raises(DPUError, match=r"tvm-dpu\[pynq\]"):
        PynqDevice(bitfile="dpu.bit")


@pytest.mark.skipif(importlib.util.find_spec("pynq") is None or not os.environ.get("TVM_DPU_BITFILE"),
                    reason="needs a board: the pynq package and TVM_DPU_BITFILE naming a DPUCZDX8G bitstream")
def test_on_board(built):  # pragma: no cover - runs only on a board
    model, compiled, path = built
    m = load(path, device="pynq", bitfile=os.environ["TVM_DPU_BITFILE"])
    m.set_verify(True)
    m.run(zoo.random_input(model, seed=1))
    assert sum(r.mismatches for r in m.verify_results()) == 0


def test_before_every_start_the_done_state_is_cleared_and_hp_set(built):
    """AMD's runtime writes 1 to 0x40 and 0x07070f0f to 0x48 before every start; the simulated IP, like the real
    one, ignores a second start without the 0x40 write."""
    _, compiled, _ = built
    sg = next(iter(compiled.runners.values())).sg
    sim = SimulatedPynq(ARCH)
    dev = _device(sim)
    for _ in range(2):
        dev.execute(sg, sg.new_regions())
    writes = sim.dpu.writes
    starts = [i for i, w in enumerate(writes) if w == (regs.AP_CTRL, regs.AP_START)]
    assert len(starts) == 2 and sim.dpu.runs == 2
    for s in starts:
        before = writes[:s]
        assert (regs.INT_CLEAR, 1) in before[-3:] and (regs.HP_BUS, 0x07070F0F) in before[-3:]

    class NoClear(PynqDevice):
        def start(self):
            self.write_reg(regs.AP_CTRL, regs.AP_START)

    sim2 = SimulatedPynq(ARCH)
    dev2 = NoClear(bitfile="dpu.bit", pynq=sim2, timeout_s=0.2)
    dev2.execute(sg, sg.new_regions())
    with pytest.raises(DeviceTimeoutError):
        dev2.execute(sg, sg.new_regions())
    assert "INT_CLEAR" in sim2.dpu.fault and sim2.dpu.runs == 1


def test_ap_done_clears_on_read_and_addresses_are_40_bit(built):
    _, compiled, _ = built
    sg = next(iter(compiled.runners.values())).sg
    sim = SimulatedPynq(ARCH)
    dev = _device(sim)
    sim.dpu.write(regs.INT_CLEAR, 1)
    dev.execute(sg, sg.new_regions())
    sim.dpu.regs[regs.AP_CTRL] |= regs.AP_DONE
    assert dev.read_reg(regs.AP_CTRL) & regs.AP_DONE and not dev.read_reg(regs.AP_CTRL) & regs.AP_DONE
    with pytest.raises(DeviceError, match="40-bit"):
        dev.set_base_address(0, 1 << 40)
    with pytest.raises(DeviceError, match="40-bit"):
        dev.set_instruction_address(1 << 41)


def test_cores_found_from_the_hardware_description(built):
    """Three cores at irregular register windows: core i is the i-th window by address, each runs on its own."""
    import tvm_dpu
    from tvm_dpu.runtime.pynq_driver import dpu_cores

    _, compiled, _ = built
    sg = next(iter(compiled.runners.values())).sg
    sim = SimulatedPynq(ARCH, cores=3)
    cores = dpu_cores(sim.ip_dict)
    assert [e["phys_addr"] for _, e in cores] == sorted(e["phys_addr"] for e in sim.ip_dict.values())
    devs = [PynqDevice(bitfile="dpu.bit", pynq=sim, core=i) for i in range(3)]
    for i, d in enumerate(devs):
        d.execute(sg, sg.new_regions())
        assert [dpu.runs for dpu in sim.dpus][i] == 1
    assert [dpu.runs for dpu in sim.dpus] == [1, 1, 1]
    with pytest.raises(DeviceError, match="has 3 DPU core"):
        PynqDevice(bitfile="dpu.bit", pynq=sim, core=3)
    emus = tvm_dpu.devices("zcu102")
    assert len(emus) == 3 and [d.core for d in emus] == [0, 1, 2] and len({id(d.device) for d in emus}) == 3
