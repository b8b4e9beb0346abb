"""Virtual-DPU segments over one shared DDR region, and weights resident on the device.

* a partition's segments are linked over REG_SHARED (codegen/relocate.py): every LOAD and SAVE of a handed tensor
  lands in that tensor's slot, the slots are disjoint, and the segments' results are bit-identical to the one
  program's, on emulated cores and on the Pynq driver over the simulated board (several cores, one DDR);
* nothing passes between segments through host memory: every segment of a call gets the same region object;
* the parameters (and code) of a loaded program cross to the device once: a second call writes none;
* many threads calling one model at once get each their own result (per-call shared regions, a lock per core).
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

import tvm_dpu
from tvm_dpu import zoo
from tvm_dpu.codegen.isa import encode_program, iter_program, make_instr
from tvm_dpu.codegen.relocate import link_segments, relocate, shared_layout
from tvm_dpu.codegen.tiling import CodegenError
from tvm_dpu.security.program_blob import Multicore, Segment
from tvm_dpu.runtime.cores import CoreGroup, VirtualDPU
from tvm_dpu.runtime.device import EmulatorDevice
from tvm_dpu.runtime.pynq_driver import PynqDevice
from tvm_dpu.runtime.sim_regfile import SimBuffer, SimulatedPynq
from tvm_dpu.runtime.subgraph_runner import quantize_tensor, run_int8, run_segments
from tvm_dpu.types import REG_INPUT, REG_OUTPUT, REG_PARAMS, REG_SHARED, REG_WORK, FMap

ARCH = "zcu102"


def _model():
    return zoo.build_model("googlenet", reduced=True)


@pytest.fixture(scope="module")
def built():
    model = _model()
    cal = [zoo.random_input(model, seed=s) for s in range(2)]
    one = tvm_dpu.build(model, arch=ARCH, progress=False, calibration=cal)
    three = tvm_dpu.build(model, arch=ARCH, progress=False, calibration=cal, cores=3, segments="always")
    (runner,) = [r for r in three.runners.values() if r.multicore is not None]
    return one, three, runner


def _qin(sg, seed):
    rng = np.random.default_rng(seed)
    return [quantize_tensor(rng.standard_normal(b.shape).astype(np.float32), b.fix_point) for b in sg.inputs]


def test_segments_address_one_shared_region_in_disjoint_slots(built):
    _, _, runner = built
    segs = [g.sg for g in runner.multicore.segments]
    size = segs[0].region_sizes[REG_SHARED]
    slots: dict[str, FMap] = {}
    for s in segs:
        assert set(s.region_sizes) <= {REG_PARAMS, REG_WORK, REG_SHARED}, s.region_sizes
        assert s.region_sizes[REG_SHARED] == size
        maps = [b.fmap for b in (*s.inputs, *s.outputs)]
        for b in (*s.inputs, *s.outputs):
            assert b.fmap.reg_id == REG_SHARED and slots.setdefault(b.name, b.fmap) == b.fmap
        # every access of the shared region lies within (the margins of) one of this segment's own maps
        for pos, ins in iter_program(s.code):
            if ins.name in ("LOAD", "SAVE"):
                assert ins["reg_id"] in (REG_PARAMS, REG_WORK, REG_SHARED)
            if ins.name in ("LOAD", "SAVE") and ins["reg_id"] == REG_SHARED:
                pitch = ins["jump_read"] if ins.name == "LOAD" else ins["jump_write"]
                a, end = ins["ddr_addr"], ins["ddr_addr"] + (ins["length"] - 1) * pitch + ins["channel"]
                assert any(m.offset - 64 <= a and end <= m.offset + m.nbytes + 64 for m in maps), (s.name, pos)
    spans = sorted((m.offset, m.offset + m.nbytes) for m in slots.values())
    assert all(a[1] + 2 * 64 <= b[0] for a, b in zip(spans, spans[1:]))  # disjoint, margins free between
    assert spans[0][0] >= 64 and spans[-1][1] + 64 <= size
    # the whole partition's inputs and outputs have slots too: the host writes and reads only those
    assert {b.name for b in runner.sg.inputs} | {b.name for b in runner.sg.outputs} <= set(slots)


def test_shared_segments_are_bit_exact_against_the_one_program(built):
    one, three, runner = built
    cores = [VirtualDPU(EmulatorDevice(three.arch), c) for c in range(3)]
    for seed in (1, 2):
        q = _qin(runner.sg, seed)
        ref = run_int8(runner.sg, EmulatorDevice(three.arch), q)
        out = run_segments(runner.sg, runner.multicore, cores, q)
        for a, b in zip(ref, out):
            np.testing.assert_array_equal(a, b)
    x = zoo.random_input(_model(), seed=9)
    for a, b in zip(one.run(x), three.run(x)):
        np.testing.assert_array_equal(a, b)


class _Recording(EmulatorDevice):
    """An emulator core that records the regions each program is given."""

    def __init__(self, arch, log):
        super().__init__(arch)
        self.log = log

    def execute(self, sg, regions):
        self.log.append((sg.name, dict(regions)))
        super().execute(sg, regions)


def test_no_host_copy_between_segments(built, monkeypatch):
    _, three, runner = built
    log: list = []
    cores = [VirtualDPU(_Recording(three.arch, log), c) for c in range(3)]

    q = _qin(runner.sg, 3)
    ref = run_int8(runner.sg, EmulatorDevice(three.arch), q)
    moved = {"to_ddr": 0, "from_ddr": 0}
    for name in moved:  # count every feature map the host moves into or out of a DDR region
        real = getattr(FMap, name)
        monkeypatch.setattr(FMap, name, lambda self, *a, _n=name, _f=real: (moved.__setitem__(_n, moved[_n] + 1),
                                                                            _f(self, *a))[1])
    out = run_segments(runner.sg, runner.multicore, cores, q)
    for a, b in zip(ref, out):
        np.testing.assert_array_equal(a, b)
    # the host wrote the partition's inputs and read its outputs, nothing in between
    assert moved == {"to_ddr": len(runner.sg.inputs), "from_ddr": len(runner.sg.outputs)}
    assert len(log) == len(runner.multicore.segments)
    # each program got the one shared region and nothing else: parameters and workspace are the core's own
    assert all(set(regions) == {REG_SHARED} for _, regions in log)
    assert len({id(regions[REG_SHARED]) for _, regions in log}) == 1


def test_the_emulator_reads_parameters_in_place(built, monkeypatch):
    one, _, _ = built
    (runner,) = one.runners.values()
    dev = EmulatorDevice(one.arch)
    params = dev.resident_params(runner.sg)  # the region is whole pages: a padded copy, made once
    assert dev.resident_params(runner.sg) is params and not params.flags.writeable
    np.testing.assert_array_equal(params[: runner.sg.params.size], runner.sg.params)
    assert not params[runner.sg.params.size:].any()

    def no_full_regions(self):
        raise AssertionError("a call built every DDR region (weights copied) afresh")

    from tvm_dpu.types import CompiledSubgraph

    x = zoo.random_input(_model(), seed=5)
    ref = one.run(x)
    monkeypatch.setattr(CompiledSubgraph, "new_regions", no_full_regions)
    for a, b in zip(ref, one.run(x)):
        np.testing.assert_array_equal(a, b)
    # the device's own copy, which nothing else writes: the emulator may skip rechecking weights loaded from it
    assert runner.device.emulator.constant == {REG_PARAMS}


def test_parameters_that_fill_their_region_are_not_copied_at_all(built):
    one, _, _ = built
    (runner,) = one.runners.values()
    from dataclasses import replace

    padded = np.zeros(runner.sg.region_sizes[REG_PARAMS], np.uint8)
    padded[: runner.sg.params.size] = runner.sg.params
    sg = replace(runner.sg, params=padded)
    dev = EmulatorDevice(one.arch)
    a = dev.resident_params(sg)
    assert np.shares_memory(a, sg.params) and not a.flags.writeable and sg.params.flags.writeable
    q = _qin(sg, 4)
    for r, o in zip(run_int8(runner.sg, dev, q), run_int8(sg, dev, q)):
        np.testing.assert_array_equal(r, o)
        # a view of sg.params, which its holder may change: nothing is taken as constant
        assert dev.emulator.constant == frozenset()


def test_a_program_writing_its_resident_parameters_is_refused():
    from tvm_dpu.runtime.device import DeviceError
    from tvm_dpu.types import CompiledSubgraph

    arch = tvm_dpu.load_arch(ARCH)
    save = make_instr("SAVE", bank_id=0, bank_addr=0, length=1, channel=16, jump_read=1, jump_write=16,
                      reg_id=REG_PARAMS, ddr_addr=0)
    sg = CompiledSubgraph("w", ARCH, arch.fingerprint, encode_program([save, make_instr("END")]),
                          np.ones(64, np.uint8), {REG_PARAMS: 64}, [], [])
    with pytest.raises(DeviceError, match="writes into its parameter region"):
        EmulatorDevice(arch).execute(sg, {})
    assert sg.params.all()


# -- the Pynq driver over the simulated board -------------------------------------------------------------------
def _in_threads(n: int, fn) -> dict[int, object]:
    """fn(i) for i < n, each in its own thread, all at once: {i: result}; the first exception re-raised."""
    outs: dict[int, object] = {}
    errors: list[BaseException] = []

    def go(i):
        try:
            outs[i] = fn(i)
        except Exception as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return outs


def _pynq_cores(n, sim):
    return [VirtualDPU(PynqDevice(bitfile="dpu.bit", pynq=sim, core=c, arch=ARCH), c) for c in range(n)]


def test_pynq_second_call_writes_no_parameter_or_code_bytes(built):
    one, _, _ = built
    (runner,) = one.runners.values()
    sg = runner.sg
    sim = SimulatedPynq(ARCH)
    dev = PynqDevice(bitfile="dpu.bit", pynq=sim)
    emu = EmulatorDevice(one.arch)
    for call, seed in enumerate((1, 2, 3)):
        q = _qin(sg, seed)  # different inputs each call: nothing may depend on the previous call's workspace
        before = dict(dev.bytes_to_device)
        for a, b in zip(run_int8(sg, emu, q), run_int8(sg, dev, q)):
            np.testing.assert_array_equal(a, b)
        wrote = {k: dev.bytes_to_device[k] - before.get(k, 0) for k in ("code", "params", "regions")}
        io = sum(sg.region_sizes[r] for r in (REG_INPUT, REG_OUTPUT))
        if call == 0:
            assert wrote["params"] == sg.params.size and wrote["code"] == sg.code.nbytes
        else:
            assert wrote["params"] == 0 and wrote["code"] == 0
        assert wrote["regions"] == io  # only what the call hands over: its input and output regions
    # a caller that gives its own parameter region gets it used (the old contract), and the program's own
    # parameters are written back before the next call that does not
    regions = sg.new_regions()
    b = sg.inputs[0]
    b.fmap.to_ddr(regions[b.fmap.reg_id], _qin(sg, 6)[0])
    dev.execute(sg, regions)
    n = dev.bytes_to_device["params"]
    q = _qin(sg, 7)
    for a, b in zip(run_int8(sg, emu, q), run_int8(sg, dev, q)):
        np.testing.assert_array_equal(a, b)
    assert dev.bytes_to_device["params"] == n + sg.params.size


def test_pynq_cores_share_one_region_and_upload_weights_once(built, monkeypatch):
    _, three, runner = built
    sim = SimulatedPynq(ARCH, cores=3)
    cores = _pynq_cores(3, sim)
    flushed = []
    real_flush = SimBuffer.flush
    monkeypatch.setattr(SimBuffer, "flush", lambda self: (flushed.append(self.size), real_flush(self))[1])
    emu = EmulatorDevice(three.arch)
    weights = sum(g.sg.params.size for g in runner.multicore.segments)
    shared = runner.multicore.segments[0].sg.region_sizes[REG_SHARED]
    for call, seed in enumerate((1, 2)):
        q = _qin(runner.sg, seed)
        flushed.clear()
        before = sum(sum(c.device.bytes_to_device.values()) for c in cores)
        out = run_segments(runner.sg, runner.multicore, cores, q)
        for a, b in zip(run_int8(runner.sg, emu, q), out):
            np.testing.assert_array_equal(a, b)
        wrote = sum(sum(c.device.bytes_to_device.values()) for c in cores) - before
        if call == 0:
            assert wrote >= weights
        else:
            # the second call copies nothing through the drivers and flushes only the shared region once
            assert wrote == 0 and len(flushed) == 1 and flushed[0] >= shared
    used = {g.core for g in runner.multicore.segments}
    assert all(sim.dpus[c].runs >= 2 for c in used) and len(used) == 3


def test_a_segment_without_its_shared_region_is_refused(built):
    from tvm_dpu.runtime.device import DeviceError

    _, three, runner = built
    seg = runner.multicore.segments[0].sg
    sim = SimulatedPynq(ARCH)
    for dev in (EmulatorDevice(three.arch), PynqDevice(bitfile="dpu.bit", pynq=sim, arch=ARCH)):
        with pytest.raises(DeviceError, match="shared DDR region 4, which this call does not give"):
            dev.execute(seg, {})
    # a loaded segment holds no buffer for the shared region: every call brings its own
    _, bufs = PynqDevice(bitfile="dpu.bit", pynq=sim, arch=ARCH).buffers_for(seg)
    assert set(bufs) == set(seg.region_sizes) - {REG_SHARED}


def test_pynq_concurrent_calls_take_separate_shared_regions(built):
    _, three, runner = built
    sim = SimulatedPynq(ARCH, cores=3)
    cores = _pynq_cores(3, sim)
    emu = EmulatorDevice(three.arch)
    qs = [_qin(runner.sg, s) for s in range(4)]
    refs = [run_int8(runner.sg, emu, q) for q in qs]
    outs = _in_threads(4, lambda i: run_segments(runner.sg, runner.multicore, cores, qs[i]))
    for i in range(4):
        for a, b in zip(refs[i], outs[i]):
            np.testing.assert_array_equal(a, b)
    pool = cores[0].device._shared_free
    assert 1 <= sum(len(v) for v in pool.values()) <= 4  # regions are reused by later calls, not leaked
    n = len(sim.ddr.allocations)
    run_segments(runner.sg, runner.multicore, cores, qs[0])
    assert len(sim.ddr.allocations) == n


def test_many_threads_on_one_model(built):
    one, three, _ = built
    xs = [zoo.random_input(_model(), seed=20 + i) for i in range(6)]
    refs = [one.run(x)[0] for x in xs]
    outs = _in_threads(6, lambda i: [three.run(xs[i])[0] for _ in range(2)])
    for i in range(6):
        assert len(outs[i]) == 2
        for y in outs[i]:
            np.testing.assert_array_equal(y, refs[i])


def test_segments_compiled_before_the_shared_layout_run_as_one_program(built):
    one, _, _ = built
    (runner,) = one.runners.values()
    legacy = Multicore(2, [Segment(runner.sg, 0, 0.0, 1.0, []), Segment(runner.sg, 1, 0.0, 1.0, [])], 1.0, 1.0)
    log: list = []
    cores = [VirtualDPU(_Recording(one.arch, log), c) for c in range(2)]
    q = _qin(runner.sg, 8)
    for a, b in zip(run_int8(runner.sg, EmulatorDevice(one.arch), q), run_segments(runner.sg, legacy, cores, q)):
        np.testing.assert_array_equal(a, b)
    assert [name for name, _ in log] == [runner.sg.name]


# -- relocation errors ------------------------------------------------------------------------------------------
def _load(reg, addr, length=1, channel=16):
    return make_instr("LOAD", bank_id=0, bank_addr=0, length=length, channel=channel, jump_read=channel,
                      jump_write=1, reg_id=reg, ddr_addr=addr)


def test_relocate_moves_an_access_and_refuses_one_no_map_covers():
    src = FMap.dense(REG_INPUT, 128, 2, 2, 16)
    dst = FMap.dense(REG_SHARED, 1000, 2, 2, 16)
    code = encode_program([_load(REG_INPUT, 128 + 32), _load(REG_WORK, 5), make_instr("END")])
    out = [ins for _, ins in iter_program(relocate(code, [(src, dst)], "t"))]
    assert (out[0]["reg_id"], out[0]["ddr_addr"]) == (REG_SHARED, 1032)
    assert (out[1]["reg_id"], out[1]["ddr_addr"]) == (REG_WORK, 5)  # private regions untouched
    with pytest.raises(CodegenError, match="no input or output map covers"):
        relocate(encode_program([_load(REG_INPUT, 4000)]), [(src, dst)], "t")
    with pytest.raises(CodegenError, match="more than the 64"):
        relocate(encode_program([_load(REG_INPUT, 0, length=3, channel=64)]), [(src, dst)], "t")


def test_link_refuses_a_tensor_laid_out_two_ways(built):
    _, _, runner = built
    segs = [g.sg for g in runner.multicore.segments]
    a, b = segs[0], segs[1]
    from dataclasses import replace

    name = a.outputs[0].name
    fm = a.outputs[0].fmap
    odd = replace(b, inputs=[replace(a.outputs[0], fmap=replace(fm, row_pitch=fm.row_pitch + 16))])
    with pytest.raises(CodegenError, match="cannot share its bytes"):
        shared_layout([a, odd])
    assert link_segments(segs) == segs  # already linked: unchanged
    assert name
