"""The timing model's cycle cache keys a program on what the timing model reads of it (simulate.timing_key): the
instruction sequence, the dependency masks and cost.TIMED_FIELDS. These tests hold the cost model to that list
and show that programs differing only elsewhere (shifts, addresses) share their cycles, and others do not."""
from __future__ import annotations

import numpy as np
import pytest

from tvm_dpu.arch import load_arch
from tvm_dpu.codegen.compiler import compile_graph
from tvm_dpu.errors import DPUError
from tvm_dpu.codegen.isa import Instr, decode_program, encode_program, enum_codes, instr_specs
from tvm_dpu.timing import simulate as sim
from tvm_dpu.timing.cost import TIMED_FIELDS, CostModel
from tvm_dpu.timing.params import machine
from tvm_dpu.xgraph import Graph, Op, Tensor

ARCH = "DPUCZDX8G_ISA1_B4096"


class _Recording(dict):
    """Fields that note every name read."""

    def __init__(self, values: dict, seen: set):
        super().__init__(values)
        self.seen = seen

    def __getitem__(self, key):
        self.seen.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.seen.add(key)
        return super().get(key, default)


def _random_instr(name: str, rng: np.random.Generator, seen: set, **fixed: int) -> Instr:
    spec = instr_specs()[name]
    values = {f.name: int(rng.integers(f.min_value, min(f.max_value, f.min_value + 300) + 1)) for f in spec.fields}
    values.update(fixed)
    return Instr(name, _Recording(values, seen), 0, 0)


def test_cost_reads_only_the_timed_fields():
    m = machine(load_arch(ARCH))
    rng = np.random.default_rng(0)
    dw_modes = [enum_codes("alu_exec_mode")[k] for k in ("dwconv", "dwconv_nobias", "dwconv_w16")]
    read: dict[str, set] = {name: set() for name in instr_specs()}
    for trial in range(40):
        cm = CostModel(m)
        mode = {"exec_mode": dw_modes[trial % 3]} if trial % 2 else {}
        cm.cost(0, _random_instr("CONVINIT", rng, read["CONVINIT"]))
        cm.cost(1, _random_instr("ALUINIT", rng, read["ALUINIT"], **mode))
        for name in instr_specs():
            fixed = {"broadcast": 7} if name == "LOAD" and trial % 2 else {}
            fixed = {"argmax": 2} if name == "SAVE" and trial % 2 else fixed
            cm.cost(2, _random_instr(name, rng, read[name], **fixed))
    for name, fields in read.items():
        assert fields <= set(TIMED_FIELDS.get(name, ())), (name, fields - set(TIMED_FIELDS.get(name, ())))
    # and the list names only what is read (a stale entry would only cost cache hits, but says something false)
    for name, fields in TIMED_FIELDS.items():
        assert set(fields) <= read[name], (name, set(fields) - read[name])


def _graph(out_fp: int, bias_fp: int) -> Graph:
    rng = np.random.default_rng(1)
    g = Graph("g")
    x = g.add_tensor(Tensor("x", (1, 16, 20, 20), "int8", 4)).name
    w = g.add_tensor(Tensor("w", (32, 16, 3, 3), "int8", 7, rng.integers(-128, 128, (32, 16, 3, 3)).astype(np.int8)))
    b = g.add_tensor(Tensor("b", (32,), "int8", bias_fp, rng.integers(-128, 128, 32).astype(np.int8)))
    y = g.add_tensor(Tensor("y", (1, 32, 20, 20), "int8", out_fp)).name
    g.add_op(Op("c", "conv2d", [x], [y], {"strides": [1, 1], "pads": [1, 1, 1, 1], "act": "relu"},
                {"weights": w.name, "bias": b.name}))
    z = g.add_tensor(Tensor("z", (1, 32, 10, 10), "int8", out_fp)).name
    g.add_op(Op("p", "max_pool2d", [y], [z], {"kernel": [2, 2], "strides": [2, 2]}))
    g.inputs, g.outputs = [x], [z]
    return g


def test_programs_differing_in_shifts_share_a_key_and_their_cycles(monkeypatch):
    arch = load_arch(ARCH)
    a = compile_graph(_graph(3, 5), arch).code
    b = compile_graph(_graph(2, 6), arch).code
    assert a.tobytes() != b.tobytes()  # other shifts
    assert sim.timing_key(a) == sim.timing_key(b)
    assert sim.simulate(a, ARCH).cycles == sim.simulate(b, ARCH).cycles
    sim._CYCLES.clear()
    calls = []
    real = sim.simulate
    monkeypatch.setattr(sim, "simulate", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert sim.cycles(a, ARCH) == sim.cycles(b, ARCH)
    assert len(calls) == 1  # the second program is answered from the cache


def test_a_timed_field_or_a_token_changes_the_key():
    arch = load_arch(ARCH)
    code = compile_graph(_graph(3, 5), arch).code
    instrs = decode_program(code)
    i = next(k for k, ins in enumerate(instrs) if ins.name == "CONV")
    longer = [Instr(ins.name, dict(ins.fields), ins.dpdon, ins.dpdby) for ins in instrs]
    longer[i].fields["length"] += 1
    assert sim.timing_key(encode_program(longer)) != sim.timing_key(code)
    fewer_tokens = [Instr(ins.name, dict(ins.fields), ins.dpdon, ins.dpdby) for ins in instrs]
    fewer_tokens[i].dpdby = 0
    assert sim.timing_key(encode_program(fewer_tokens)) != sim.timing_key(code)
    moved = [Instr(ins.name, dict(ins.fields), ins.dpdon, ins.dpdby) for ins in instrs]
    j = next(k for k, ins in enumerate(instrs) if ins.name == "LOAD")
    moved[j].fields["ddr_addr"] += 64  # an address: the timing model does not read it
    assert sim.timing_key(encode_program(moved)) == sim.timing_key(code)


def test_a_stream_that_does_not_decode_is_keyed_on_its_words():
    bad = np.array([0xF0000000, 1, 2], dtype=np.uint32)  # no instruction has opcode 15
    kind, _ = sim.timing_key(bad)
    assert kind == "words"
    with pytest.raises(DPUError, match="opcode"):
        sim.cycles(bad, ARCH)
