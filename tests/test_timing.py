"""Timing model: cycle formulas, the engine/token simulation, traces and the analytic estimate."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from tvm_dpu.arch import load_arch
from tvm_dpu.codegen.compiler import compile_graph
from tvm_dpu.codegen.isa import CONV, LOAD, SAVE, encode_program, make_instr
from tvm_dpu.timing.analytic import analytic_estimate, compare, graph_ops
from tvm_dpu.timing.cost import ENGINES, dma_beats
from tvm_dpu.timing.params import TimingError, load_params, machine
from tvm_dpu.timing.simulate import simulate, simulate_subgraph
from tvm_dpu.timing.trace import chrome_trace, write_chrome_trace, write_gantt_png
from tvm_dpu.xgraph import Graph, Op, Tensor
from tvm_dpu.xgraph.ops import layer_descs

ARCH = "zcu102"


def _load(dpdon=0, dpdby=0, length=32, channel=64, bank_id=0):
    return make_instr("LOAD", dpdon, dpdby, bank_id=bank_id, length=length, channel=channel, jump_read=channel,
                      jump_write=4)


def _save(dpdon=0, dpdby=0, length=32, channel=16):
    return make_instr("SAVE", dpdon, dpdby, bank_id=8, length=length, channel=channel, jump_read=1,
                      jump_write=channel)


def _convinit():
    return make_instr("CONVINIT", kernel_h=3, kernel_w=3, valid_pixel_parallel=8)


def _conv(dpdon=0, dpdby=0, length=32, cg=4):
    return make_instr("CONV", dpdon, dpdby, channel_group=cg, length=length, bank_id_out=8)


def _run(instrs, arch=ARCH, **kw):
    return simulate(encode_program(instrs), arch, **kw)


def _chain(conv_length=32):
    """LOAD -> CONV -> SAVE with tokens, then END."""
    return [_load(dpdby=CONV), _convinit(), _conv(dpdon=LOAD, dpdby=SAVE, length=conv_length), _save(dpdon=CONV),
            make_instr("END")]


def test_chain_respects_tokens_and_engine_order():
    r = _run(_chain())
    load, conv, save = 0, 2, 3
    assert r.start[conv] >= r.done[load] - 1e-9  # the CONV waits for the LOAD's data (incl. DDR latency)
    assert r.done[load] > r.end[load]  # completion comes ddr_latency after the last beat
    assert r.start[save] >= r.done[conv] - 1e-9
    assert r.cycles == pytest.approx(float(np.max(r.done)))
    # the CONV's duration is its formula: kh*kw*cg*L + fill
    p = load_params(ARCH)
    assert r.end[conv] - r.start[conv] == pytest.approx(3 * 3 * 4 * 32 + p.conv_fill_cycles)
    assert r.macs == 8 * 32 * 16 * 9 * 4 * 16
    assert r.ddr_read_bytes == 32 * 64 and r.ddr_write_bytes == 32 * 16


def test_without_tokens_engines_overlap():
    """The same instructions without dpdon/dpdby run concurrently on their engines."""
    free = [_load(), _convinit(), _conv(), _save(), make_instr("END")]
    r_free, r_chain = _run(free), _run(_chain())
    assert r_free.start[2] < r_free.end[0]
    assert r_free.cycles < r_chain.cycles


def test_double_buffered_tiles_overlap():
    """Tile 1's LOAD (other buffer) runs during tile 0's CONV; tile 1's CONV waits for its own LOAD."""
    prog = [_load(dpdby=CONV), _convinit(), _conv(dpdon=LOAD, dpdby=SAVE, length=64), _load(dpdby=CONV, bank_id=4),
            _conv(dpdon=LOAD, dpdby=SAVE, length=64), _save(dpdon=CONV), _save(dpdon=CONV), make_instr("END")]
    r = _run(prog)
    assert r.start[3] < r.end[2]  # second LOAD overlaps the first CONV
    assert r.start[4] >= max(r.end[2], r.done[3]) - 1e-9
    assert r.start[5] >= r.done[2] - 1e-9 and r.start[6] >= r.done[4] - 1e-9
    assert r.engine_busy["conv"] <= r.cycles


def test_missing_token_deadlocks_with_clear_error():
    prog = [_load(), _convinit(), _conv(dpdon=LOAD), make_instr("END")]  # the LOAD never posts to CONV
    with pytest.raises(TimingError, match=r"deadlock.*instruction 2 \(CONV, engine conv\).*load"):
        _run(prog)


def test_cross_wait_deadlock_names_both():
    prog = [_load(dpdon=SAVE, dpdby=SAVE), _save(dpdon=LOAD, dpdby=LOAD)]  # each waits for the other first
    with pytest.raises(TimingError, match=r"instruction 0 \(LOAD.*instruction 1 \(SAVE"):
        _run(prog)


def test_conv_without_init_is_an_error():
    with pytest.raises(TimingError, match=r"instruction 0 \(CONV\): no CONVINIT"):
        _run([_conv()])


@pytest.mark.parametrize("lengths", [(8, 16), (16, 64), (100, 101)])
def test_more_macs_more_cycles(lengths):
    a, b = (_run(_chain(conv_length=n)) for n in lengths)
    assert b.macs > a.macs and b.cycles > a.cycles


def test_higher_clock_lower_latency():
    base = load_arch(ARCH)
    slow = dataclasses.replace(base, freq_mhz=200.0)
    fast = dataclasses.replace(base, freq_mhz=400.0)
    prog = _chain(64) * 1
    assert _run(prog, fast).latency_s < _run(prog, slow).latency_s


def test_strided_rows_cost_more_than_contiguous():
    """A strided row is one burst per item: an item shorter than a beat still takes a whole beat (9-byte image
    rows: 64 beats instead of 36), and each burst pays burst_overhead_beats (16-byte items cost more only then)."""
    m = machine(ARCH)
    ov = m.params.burst_overhead_beats
    assert dma_beats(m, 64, 9, 9) == 36 + ov and dma_beats(m, 64, 9, 64) == 64 + 64 * ov
    contiguous = dma_beats(m, 64, 16, 16)
    assert contiguous >= 64 * 16 / m.axi_bytes
    for overhead in (0.0, 1.0, 4.0):
        over = machine(ARCH, load_params(ARCH).replace(burst_overhead_beats=overhead))
        strided = dma_beats(over, 64, 16, 64)
        assert strided == 64 + 64 * overhead and (strided > dma_beats(over, 64, 16, 16)) == (overhead > 0)


def test_load_and_save_share_the_axi_rate():
    big = dict(length=1024, channel=256)
    alone = _run([make_instr("LOAD", bank_id=0, jump_read=256, jump_write=16, **big)])
    both = _run([make_instr("LOAD", bank_id=0, jump_read=256, jump_write=16, **big),
                 make_instr("SAVE", bank_id=8, jump_read=16, jump_write=256, **big)])
    narrow = dataclasses.replace(load_params(ARCH), axi_data_ports=1)
    shared = _run([make_instr("LOAD", bank_id=0, jump_read=256, jump_write=16, **big),
                   make_instr("SAVE", bank_id=8, jump_read=16, jump_write=256, **big)], params=narrow)
    assert both.cycles >= alone.cycles
    assert shared.cycles > 1.5 * alone.cycles  # one port for both transfers: they take turns


def test_per_engine_busy_and_utilisation_bounds():
    r = _run(_chain(48) + [])
    for e in ENGINES:
        assert 0 <= r.engine_busy[e] <= r.cycles
        assert 0 <= r.utilisation[e] <= 1
    assert 0 < r.peak_utilisation < 1
    assert r.gops == pytest.approx(2 * r.macs / r.latency_s / 1e9)


def test_unknown_parameter_is_rejected():
    with pytest.raises(TimingError, match="unknown timing parameter"):
        load_params(ARCH, not_a_knob=1)


# -- compiled graphs --------------------------------------------------------------------------------------
def _graph(seed: int = 0) -> Graph:
    rng = np.random.default_rng(seed)
    g = Graph("g")
    n = [0]

    def t(shape, fp, data=None):
        n[0] += 1
        return g.add_tensor(Tensor(f"t{n[0]}", tuple(shape), "int8", fp, data)).name

    def k(shape, fp):
        return t(shape, fp, rng.integers(-128, 128, shape).astype(np.int8))

    def op(type_, ins, shape, fp, params=None, **attrs):
        out = t(shape, fp)
        g.add_op(Op(f"op{len(g.ops)}", type_, ins, [out], attrs, params or {}))
        return out

    x = t((1, 32, 28, 28), 4)
    g.inputs.append(x)
    c1 = op("conv2d", [x], (1, 64, 28, 28), 3, {"weights": k((64, 32, 3, 3), 7), "bias": k((64,), 5)},
            strides=[1, 1], pads=[1, 1, 1, 1], act="relu")
    c2 = op("conv2d", [c1], (1, 64, 28, 28), 3, {"weights": k((64, 64, 3, 3), 7), "bias": k((64,), 5)},
            strides=[1, 1], pads=[1, 1, 1, 1], act="none")
    a = op("eltwise_add", [c2, c1], (1, 64, 28, 28), 2, act="relu")
    p = op("max_pool2d", [a], (1, 64, 14, 14), 2, kernel=[2, 2], strides=[2, 2])
    g.outputs = [p]
    return g


def test_compiled_graph_per_op_cycles_and_ops():
    g = _graph()
    sg = compile_graph(g, load_arch(ARCH))
    r = simulate_subgraph(sg, ARCH, model_ops=graph_ops(layer_descs(g)))
    assert [o.name for o in r.ops] == [op.name for op in g.ops]
    assert sum(o.cycles for o in r.ops) <= r.cycles + 1e-6
    assert sum(o.cycles for o in r.ops) > 0.9 * r.cycles
    conv_ops = [o for o in r.ops if o.macs]
    assert len(conv_ops) == 2 and conv_ops[1].macs > conv_ops[0].macs
    assert r.total_ops == graph_ops(layer_descs(g)) == 2 * 28 * 28 * 64 * 9 * (32 + 64)
    assert r.macs * 2 >= r.total_ops  # instructions compute channel padding too
    assert r.ddr_read_bytes > 0 and r.ddr_write_bytes > 0


def test_a_whole_program_simulated_again_is_replayed_not_rerun(monkeypatch):
    # The compile simulates the program it keeps, the timing report simulates it again: the second is the first's
    # replay (same cycles, instruction times and op timings), in a result of its own; a program below
    # REPLAY_MIN_INSTRS, another arch or other words are simulated anew.
    import tvm_dpu.timing.simulate as sim

    monkeypatch.setattr(sim, "REPLAY_MIN_INSTRS", 1)
    monkeypatch.setattr(sim, "_REPLAYS", type(sim._REPLAYS)())
    runs = []
    engines = sim._Engines
    monkeypatch.setattr(sim, "_Engines", lambda *a: runs.append(1) or engines(*a))
    g = _graph()
    sg = compile_graph(g, load_arch(ARCH))
    first = simulate(sg.code, ARCH)
    again = simulate_subgraph(sg, ARCH, model_ops=graph_ops(layer_descs(g)))
    assert len(runs) == 1 and again is not first and again.ops and not first.ops and first.model_ops is None
    assert again.cycles == first.cycles and np.array_equal(again.done, first.done)
    monkeypatch.setattr(sim, "_REPLAYS", type(sim._REPLAYS)())
    rerun = simulate_subgraph(sg, ARCH, model_ops=graph_ops(layer_descs(g)))
    assert len(runs) == 2 and rerun.ops == again.ops and np.array_equal(rerun.start, again.start)
    with pytest.raises(ValueError):
        again.start[0] = 0.0  # shared between results: read-only
    simulate(sg.code, "dnnvm-zu2")
    simulate(np.array(sg.code, copy=True), ARCH)  # equal words: a replay
    assert len(runs) == 3
    monkeypatch.setattr(sim, "REPLAY_MIN_INSTRS", 6)  # the chain has 5 instructions: not kept
    _run(_chain())
    _run(_chain())
    assert len(runs) == 5


@pytest.mark.parametrize("arch", [ARCH, "dnnvm-zu2"])
def test_analytic_close_to_simulator(arch):
    """The DNNVM-style roofline estimate stays within 30% of the simulated cycles on a small compiled graph."""
    g = _graph(1)
    r = simulate_subgraph(compile_graph(g, load_arch(arch)), arch)
    est = analytic_estimate(layer_descs(g), arch)
    cmp = compare(est, r)
    assert abs(cmp["relative_deviation"]) < 0.3, cmp
    convs = [l for l in est.layers if l.type == "conv2d"]
    assert all(l.tile is not None and l.ctc > 0 for l in convs)
    assert est.total_ops == graph_ops(layer_descs(g))


def test_chrome_trace_schema(tmp_path):
    g = _graph()
    r = simulate_subgraph(compile_graph(g, load_arch(ARCH)), ARCH)
    p = write_chrome_trace(r, tmp_path / "t.json")
    doc = json.loads(p.read_text())
    ev = doc["traceEvents"]
    xs = [e for e in ev if e["ph"] == "X"]
    assert len([e for e in xs if e["tid"] < len(ENGINES)]) == len(r.names)
    assert {e["tid"] for e in xs} <= set(range(len(ENGINES) + 1))
    for e in xs:
        assert {"name", "ph", "ts", "dur", "pid", "tid"} <= set(e)
        assert e["dur"] >= 0 and e["ts"] >= 0
    names = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {"LOAD", "SAVE", "CONV", "MISC", "ops"}
    # timestamps are microseconds at the core clock
    last = max(e["ts"] + e["dur"] for e in xs)
    assert last <= r.latency_s * 1e6 + 1e-6
    short = [e for e in chrome_trace(r, max_events=5)["traceEvents"] if e["ph"] == "X" and e["tid"] < len(ENGINES)]
    assert [e["args"]["instr"] for e in short] == [0, 1, 2, 3, 4]


def test_gantt_png(tmp_path):
    pytest.importorskip("matplotlib")
    r = _run(_chain(64))
    p = write_gantt_png(r, tmp_path / "g.png")
    assert p is not None and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_gantt_bars_merge_only_below_a_pixel():
    """The PNG draws busy intervals less than a pixel apart as one bar; overlaps and gaps of a pixel stay."""
    from tvm_dpu.timing.trace import _coalesce

    start, end = np.array([0.0, 5.0, 2.0, 20.0, 30.0]), np.array([3.0, 6.0, 4.0, 25.0, 31.0])
    assert _coalesce(start, end, 1.5) == [(0.0, 6.0), (20.0, 25.0), (30.0, 31.0)]
    assert _coalesce(start, end, 10.0) == [(0.0, 6.0), (20.0, 31.0)]
    assert _coalesce(start, end, 15.0) == [(0.0, 31.0)]
    assert _coalesce(np.array([0.0, 10.0]), np.array([30.0, 12.0]), 1.0) == [(0.0, 30.0)]  # nested interval
    assert _coalesce(np.zeros(0), np.zeros(0), 1.0) == []


def test_simulate_model_sums_subgraphs():
    """simulate_model adds the DPU subgraphs of a CompiledModel-like object (runners -> .sg, .graph)."""
    from types import SimpleNamespace

    from tvm_dpu.runtime.model_timing import simulate_model

    arch = load_arch(ARCH)
    g0, g1 = _graph(0), _graph(2)
    runners = {f"sg{i}": SimpleNamespace(sg=compile_graph(g, arch), graph=g) for i, g in enumerate((g0, g1))}
    mt = simulate_model(SimpleNamespace(runners=runners, arch=arch))
    parts = [simulate_subgraph(r.sg, arch) for r in runners.values()]
    assert mt.cycles == pytest.approx(sum(p.cycles for p in parts))
    assert mt.total_ops == graph_ops(layer_descs(g0)) + graph_ops(layer_descs(g1))
    assert mt.gops == pytest.approx(mt.total_ops / mt.latency_s / 1e9)
    assert mt.summary()["cpu_time_included"] is False
