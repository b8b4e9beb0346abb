"""Program.deeper_counters: the code generator lets a cross-engine token counter hold up to k tokens along program
order where an emitter asks for it (fused_chain.CHAIN_COUNTER_DEPTH), and the dependency checker still proves the
programs deadlock-free, balanced, race-free on every resource the instructions declare, and within the bound."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_dpu.codegen.fused_chain import CHAIN_COUNTER_DEPTH
from tvm_dpu.codegen.program import Program
from tvm_dpu.timing.depcheck import CODEGEN_COUNTER_DEPTH, Access, check
from tvm_dpu.timing.simulate import simulate

ARCH = "DPUCZDX8G_ISA1_B4096"
_FIELDS = {"LOAD": dict(length=1, channel=16, jump_read=16), "SAVE": dict(length=1, channel=16, jump_write=16),
           "CONV": dict(length=1), "ALU": dict(valid_pixel_parallel=1)}


def _accesses(prog: Program) -> list[Access]:
    """Each instruction's declared resources as bank rows (one row per resource name), for the race check."""
    ids: dict[tuple, int] = {}
    key = lambda rs: [np.array([ids.setdefault(r, len(ids)) for r in rs], np.int64)] if rs else []
    return [Access(bank_reads=key(e.reads), bank_writes=key(e.writes)) for e in prog.entries]


def _checked(prog: Program, depth: int):
    rep = check(prog.encode(), _accesses(prog), counter_depth=depth)
    assert rep.ok and rep.races_checked, (rep.problems[:3], [str(r) for r in rep.races[:3]])
    assert rep.max_cross_depth() <= depth
    return rep


_OP = st.tuples(st.sampled_from(sorted(_FIELDS)), st.sets(st.integers(0, 5), max_size=2),
                st.sets(st.integers(0, 5), max_size=2))


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(_OP, min_size=1, max_size=40), depth=st.integers(1, 3))
def test_any_stream_is_race_free_deadlock_free_and_within_the_depth(ops, depth):
    prog = Program()
    with prog.deeper_counters(depth):
        for name, reads, writes in ops:
            prog.emit(name, reads=[("r", k) for k in sorted(reads)], writes=[("r", k) for k in sorted(writes)],
                      **_FIELDS[name])
    prog.end()
    _checked(prog, depth)


def _double_buffered_passes(passes: int, depth: int | None) -> Program:
    """A pool pass's shape: each ALU writes one of two output slots, four SAVEs read it out; a pass reusing a slot
    needs the SAVEs of the pass before last."""
    prog = Program()

    def body() -> None:
        prog.emit("ALUINIT", kernel_h=1, kernel_w=100, stride_h=1, stride_w=1, exec_mode=2, length=1,
                  channel_group=4)
        for p in range(passes):
            prog.emit("ALU", writes=[("out", p % 2)], valid_pixel_parallel=4)
            for r in range(4):
                prog.emit("SAVE", reads=[("out", p % 2)], writes=[("y", p, r)], bank_id=r, length=1, channel=64,
                          jump_write=64, ddr_addr=256 * p + 64 * r)

    if depth is None:
        body()
    else:
        with prog.deeper_counters(depth):
            body()
    prog.end()
    return prog


def test_a_pass_waits_for_the_saves_of_the_pass_before_last_with_two_tokens():
    one, two = _double_buffered_passes(12, None), _double_buffered_passes(12, 2)
    r1, r2 = _checked(one, 1), _checked(two, 2)
    assert r1.pairs()["save->misc"]["depth"] == 1 and r2.pairs()["save->misc"]["depth"] == 2
    # pass 2 (the first to reuse a slot) takes its token from the last SAVE of pass 0 either way; with one token
    # every later pass takes it from the first SAVE of the pass just before it (the post moved past the previous
    # wait), with two from the last SAVE of the pass before last, the one it needs
    saves = lambda prog, p: [i for i, e in enumerate(prog.entries) if e.instr.name == "SAVE"][4 * p: 4 * p + 4]
    for prog, want in ((one, lambda p: saves(one, p - 1)[0]), (two, lambda p: saves(two, p - 2)[-1])):
        posters = [i for i, e in enumerate(prog.entries) if e.instr.name == "SAVE" and e.instr.dpdby & 8]
        assert posters == [saves(prog, 0)[-1]] + [want(p) for p in range(3, 12)]
    t1, t2 = simulate(one.encode(), ARCH), simulate(two.encode(), ARCH)
    assert t1.engine_busy == pytest.approx(t2.engine_busy)
    assert t2.cycles < t1.cycles  # the ALUs no longer wait out the previous pass's SAVEs and their round trip


def test_depth_one_is_the_default_and_the_scope_restores_it():
    prog = Program()
    assert prog.counter_depth == 1
    with prog.deeper_counters(2):
        assert prog.counter_depth == 2
        with prog.deeper_counters(1):  # never shallower than the depth in force
            assert prog.counter_depth == 2
    assert prog.counter_depth == 1
    with pytest.raises(RuntimeError):
        with prog.deeper_counters(3):
            raise RuntimeError("emitter failed")
    assert prog.counter_depth == 1
    assert CHAIN_COUNTER_DEPTH <= CODEGEN_COUNTER_DEPTH  # what the emitters ask for is what the zoo tests allow
