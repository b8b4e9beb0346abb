"""The fast paths of the code generator and the timing model give what the plain ones give.

* `isa.make_encoded` (Program.emit builds each distinct field set once) equals make_instr + encode, and refuses a
  change of the shared fields;
* `Program.encode` (cached words, masks ORed in) equals `encode_program` of the same instructions, and names the
  instruction of a bad field as encode_program does;
* `simulate` (costs cached by the bits the cost model reads, flat event loop) equals the reference below: the
  simulator as it was before the fast paths (main 4734a72), kept here as the oracle, on vai_c's programs and on
  compiled ones, and its costs equal a plain CostModel pass over the decoded program whatever was cached before.
"""
from __future__ import annotations

import heapq
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tvm_dpu
from tvm_dpu import zoo
from tvm_dpu.arch import load_arch
from tvm_dpu.codegen.isa import decode_program, encode, encode_program, instr_specs, make_encoded, make_instr
from tvm_dpu.codegen.program import Program
from tvm_dpu.errors import ISAError
from tvm_dpu.timing import simulate as sim
from tvm_dpu.timing.cost import CostModel
from tvm_dpu.timing.depcheck import initial_tokens
from tvm_dpu.timing.params import load_params, machine

VAI_C_PROGRAMS = sorted((Path(__file__).parent / "data" / "vai_c_mc").glob("*.bin"))
ARCHS = ("DPUCZDX8G_ISA1_B4096", "DPUCZDX8G_ISA1_B1152", "dnnvm-zu2")


# -- instructions ------------------------------------------------------------------------------------------------
@st.composite
def _field_sets(draw):
    name = draw(st.sampled_from(sorted(instr_specs())))
    spec = instr_specs()[name]
    chosen = draw(st.lists(st.sampled_from(spec.fields), unique_by=lambda f: f.name)) if spec.fields else []
    # mostly in range, sometimes one past either end
    fields = {f.name: draw(st.integers(f.min_value - 1, f.max_value + 1) | st.integers(f.min_value, f.max_value))
              for f in chosen}
    return name, fields


@settings(max_examples=300, deadline=None)
@given(_field_sets())
def test_make_encoded_equals_make_instr_and_encode(case):
    name, fields = case
    for _ in range(2):  # built, then served from the cache
        ins, words = make_encoded(name, fields)
        ref = make_instr(name, **fields)
        assert ins == ref
        try:
            expected = tuple(encode(ref))
        except ISAError:
            expected = None
        assert words == expected


def test_make_encoded_shares_read_only_fields_but_not_masks():
    a, _ = make_encoded("CONV", {"length": 8, "channel_group": 2})
    b, _ = make_encoded("CONV", {"length": 8, "channel_group": 2})
    assert a is not b and a.fields is b.fields
    a.dpdon |= 4
    assert b.dpdon == 0
    with pytest.raises(ISAError, match="read-only"):
        a.fields["length"] = 9
    with pytest.raises(ISAError, match="unknown field"):
        make_encoded("CONV", {"lenght": 8})
    with pytest.raises(ISAError, match="unknown instruction"):
        make_encoded("CONVX", {})


def _build(name, arch, fusion):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tvm_dpu.build(zoo.build_model(name, reduced=True), arch=arch, fusion=fusion, progress=False,
                             calibration=[zoo.random_input(name, reduced=True, seed=s) for s in range(2)])


@pytest.fixture(scope="module")
def compiled():
    """Programs of a reduced zoo model on two archs, fused and not."""
    out = []
    for arch, fusion in (("DPUCZDX8G_ISA1_B4096", "optimal"), ("dnnvm-zu2", "none")):
        model = _build("mixed_cnn", arch, fusion)
        out += [(r.sg.code, arch) for r in model.runners.values()]
    return out


def test_program_encode_equals_encode_program():
    prog = Program()
    prog.emit("LOAD", reads=[("ddr", "x")], writes=[("vb0", 0)], bank_id=0, length=4, channel=16, jump_read=16,
              ddr_addr=8192)
    prog.emit("CONVINIT", kernel_h=3, kernel_w=3)
    for k in range(3):
        prog.emit("CONV", reads=[("vb0", 0)], writes=[("vb1", k % 2)], length=8, channel_group=2)
        prog.emit("SAVE", reads=[("vb1", k % 2)], writes=[("ddr", "y")], length=2, channel=16, jump_write=16,
                  ddr_addr=4096 * k)
    prog.end()
    assert any(e.instr.dpdon != e.instr.dpdby for e in prog.entries)  # cross-engine tokens were added
    assert np.array_equal(prog.encode(), encode_program(prog.instrs))
    assert decode_program(prog.encode()) == prog.instrs


def test_program_encode_names_a_bad_field_like_encode_program():
    prog = Program()
    prog.emit("CONVINIT", kernel_h=3)
    prog.emit("CONV", length=5000)  # length has 10 bits (minus): 1..1024
    prog.end()
    with pytest.raises(ISAError, match=r"instruction 1: CONV: field length=5000 outside 1\.\.1024"):
        prog.encode()
    with pytest.raises(ISAError, match=r"instruction 1: CONV: field length=5000 outside"):
        encode_program(prog.instrs)


# -- the timing model ------------------------------------------------------------------------------------------
def _reference_simulate(code, arch, params=None):
    """The simulator before its fast paths (costs of freshly decoded instructions, the event loop as it was), with
    the own-engine token of a LOAD/SAVE posted when its transfer ends under dma_own_token "transfer_end":
    (cycles, start, end, done, busy)."""
    m = machine(load_arch(arch), params)
    own_at_end = m.params.dma_own_token == "transfer_end"
    cm = CostModel(m)
    instrs = decode_program(code)
    costs = [cm.cost(i, ins) for i, ins in enumerate(instrs)]
    fetch, words = [], 0
    for ins in instrs:
        words += instr_specs()[ins.name].words
        fetch.append(words * m.fetch_cycles_per_word)
    n = len(instrs)
    mask = lambda v: [e for e in range(4) if v >> e & 1]
    needs, posts_to = [mask(i.dpdon) for i in instrs], [mask(i.dpdby) for i in instrs]
    queues = [[i for i, c in enumerate(costs) if c.engine == e] for e in range(4)]
    head, running = [0] * 4, [None] * 4
    free_at, remaining, min_end, rate = [0.0] * 4, [0.0] * 4, [0.0] * 4, [0.0] * 4
    tokens, posts = initial_tokens(), []
    start, end, done = [math.nan] * n, [math.nan] * n, [math.nan] * n
    is_dma = [c.beats > 0 for c in costs]
    busy = [0.0] * 4
    cap, eps, ports = m.dma_beats_per_cycle, 1e-9, float(m.params.axi_data_ports)
    own_cap = [min(c.beats / max(c.cycles, eps), ports) if c.beats > 0 else 0.0 for c in costs]

    def rerate():
        il, is_ = running[0], running[1]
        load_on, save_on = il is not None and remaining[0] > 0.0, is_ is not None and remaining[1] > 0.0
        if load_on and save_on:
            cl, cs = own_cap[il], own_cap[is_]
            first, second, c1, c2 = (1, 0, cs, cl) if cs < cl else (0, 1, cl, cs)
            r1 = min(c1, cap / 2)
            rate[first], rate[second] = r1, min(c2, (cap - r1) / 1)
        elif load_on:
            rate[0], rate[1] = min(own_cap[il], cap / 1), 0.0
        elif save_on:
            rate[0], rate[1] = 0.0, min(own_cap[is_], cap / 1)
        else:
            rate[0] = rate[1] = 0.0

    t, finished = 0.0, 0
    while finished < n:
        started = False
        for e in range(4):
            if running[e] is not None or head[e] >= len(queues[e]):
                continue
            i = queues[e][head[e]]
            if fetch[i] > t + eps or any(tokens[s][e] <= 0 for s in needs[i]):
                continue
            for s in needs[i]:
                tokens[s][e] -= 1
            head[e] += 1
            running[e], start[i] = i, t
            min_end[e] = t + costs[i].cycles
            if is_dma[i]:
                remaining[e], started = costs[i].beats, True
            else:
                remaining[e], free_at[e] = 0.0, t + costs[i].cycles
        if started:
            rerate()
        cands = []
        for e in range(4):
            i = running[e]
            if i is None:
                if head[e] < len(queues[e]) and fetch[queues[e][head[e]]] > t + eps:
                    cands.append(fetch[queues[e][head[e]]])
                continue
            if is_dma[i] and remaining[e] > 0.0:
                cands.append(t + remaining[e] / rate[e] if rate[e] > 0 else math.inf)
            else:
                cands.append(max(min_end[e] if is_dma[i] else free_at[e], t))
        if posts:
            cands.append(posts[0][0])
        t_next = min(cands)
        dt, changed = t_next - t, False
        for e in (0, 1):
            i = running[e]
            if i is not None and remaining[e] > 0.0:
                remaining[e] = max(0.0, remaining[e] - rate[e] * dt)
                if remaining[e] <= 1e-6 * max(1.0, costs[i].beats):
                    remaining[e], changed = 0.0, True
        t = t_next
        for e in range(4):
            i = running[e]
            if i is None:
                continue
            if is_dma[i]:
                if remaining[e] > 0.0 or min_end[e] > t + eps:
                    continue
            elif free_at[e] > t + eps:
                continue
            end[i], running[e] = t, None
            busy[e] += t - start[i]
            if own_at_end and is_dma[i] and e in posts_to[i]:
                tokens[e][e] += 1
            heapq.heappush(posts, (t + costs[i].latency, i))
            changed = changed or is_dma[i]
        if changed:
            rerate()
        while posts and posts[0][0] <= t + eps:
            tp, i = heapq.heappop(posts)
            done[i], finished = tp, finished + 1
            for d in posts_to[i]:
                if not (own_at_end and is_dma[i] and d == costs[i].engine):
                    tokens[costs[i].engine][d] += 1
    return float(np.nanmax(done)) if n else 0.0, start, end, done, busy, costs


def _assert_same_as_reference(code, arch, params=None):
    r = sim.simulate(code, arch, params)
    cycles, start, end, done, busy, costs = _reference_simulate(code, arch, params)
    assert r.cycles == cycles
    for got, want in ((r.start, start), (r.end, end), (r.done, done)):
        assert np.array_equal(got, np.array(want))  # bit for bit, not approximately
    assert [r.engine_busy[e] for e in ("load", "save", "conv", "misc")] == busy
    assert r.macs == sum(c.macs for c in costs)
    assert (r.ddr_read_bytes, r.ddr_write_bytes) == (sum(c.ddr_read for c in costs), sum(c.ddr_write for c in costs))


@pytest.mark.parametrize("path", VAI_C_PROGRAMS, ids=lambda p: p.stem)
@pytest.mark.parametrize("arch", ARCHS)
def test_simulate_equals_reference_on_vai_c_programs(path, arch):
    code = np.frombuffer(path.read_bytes(), "<u4")
    _assert_same_as_reference(code, arch)  # params.json: own tokens at the transfer's end
    _assert_same_as_reference(code, arch, load_params(arch, dma_own_token="completion"))


def test_simulate_equals_reference_on_compiled_programs(compiled):
    assert len(compiled) >= 2
    for code, arch in compiled:
        _assert_same_as_reference(code, arch)
        _assert_same_as_reference(code, "DPUCZDX8G_ISA1_B1152")  # on another machine too


def test_cached_costs_equal_a_fresh_cost_model_pass(compiled):
    """A program costed after others with other addresses and fix points (cache warm) gets the costs a fresh
    CostModel gives its decoded instructions."""
    code, arch = compiled[0]
    m = machine(load_arch(arch))
    for c, a in compiled:  # warm the cache with every program
        sim._costs(c, machine(load_arch(a)))
    moved = decode_program(code)
    for ins in moved:  # other DDR addresses: the timing model does not read them
        if "ddr_addr" in ins.fields:
            ins.fields["ddr_addr"] = (ins.fields["ddr_addr"] + 4096) % (1 << 29)
    for program in (code, encode_program(moved)):
        names, dpdon, dpdby, costs, _ = sim._costs(program, m)
        cm = CostModel(m)
        instrs = decode_program(program)
        assert costs == [cm.cost(i, ins) for i, ins in enumerate(instrs)]
        assert names == [i.name for i in instrs]
        assert (dpdon, dpdby) == ([i.dpdon for i in instrs], [i.dpdby for i in instrs])


def test_simulate_reports_a_bad_stream_as_decoding_does():
    code = encode_program([make_instr("LOAD", length=4, channel=16), make_instr("END")])
    with pytest.raises(ISAError, match="word 0: truncated LOAD"):
        sim.simulate(code[:2], "DPUCZDX8G_ISA1_B4096")
    with pytest.raises(ISAError, match="unknown opcode"):
        sim.simulate(np.array([0x30000000], np.uint32), "DPUCZDX8G_ISA1_B4096")
