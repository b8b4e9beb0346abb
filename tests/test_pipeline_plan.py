"""Stage planning for multi-board pipelines: optimal on small chains (against brute force), memory checks,
heterogeneous boards, links as data, and the op chain of a compiled model from the timing model."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tvm_dpu
from tvm_dpu import zoo
from tvm_dpu.pipeline import Board, OpCost, PlanError, load_link, plan_chain
from tvm_dpu.pipeline.plan import HostTerms, board_ddr_bytes, op_chain
from tvm_dpu.timing.host import HostCost

LINK = load_link("serial-8.5g")


def _brute(ops, boards, link, host=None):
    n, k = len(ops), len(boards)
    best = float("inf")
    for cuts in itertools.combinations(range(1, n), k - 1):
        bounds = [0, *cuts, n]
        worst = 0.0
        for s, b in enumerate(boards):
            i, j = bounds[s], bounds[s + 1]
            send = ops[j - 1].cut_bytes if j < n else 0
            recv = ops[i - 1].cut_bytes if i > 0 else 0
            mem = sum(o.param_bytes for o in ops[i:j]) + max(o.work_bytes for o in ops[i:j])
            mem += recv  # the receive buffer, which holds skip tensors for the whole frame
            mem += send if link.overlap else 0  # the second output buffer
            if mem > b.ddr_bytes:
                worst = float("inf")
                break
            dpu = sum(o.seconds[b.arch] for o in ops[i:j])
            h = sum(o.host_seconds for o in ops[i:j])
            # the stage's weights are resident on its board: a frame pays none
            h += 0.0 if host is None else host.stage_s(recv if i else host.input_elems,
                                                      send if j < n else host.output_elems, i == 0, j == n)
            if not link.overlap:
                period = dpu + h + link.seconds(send)
            elif host is not None and host.overlap:  # double-buffered: only the driver holds the DPU
                period = max(dpu + host.cost.dpu_call_s, h, link.seconds(send))
            else:
                period = max(dpu + h, link.seconds(send))
            worst = max(worst, period)
        best = min(best, worst)
    return best


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 9), st.integers(1, 4), st.integers(0, 2**31), st.booleans(), st.booleans(), st.booleans(),
       st.booleans())
def test_optimal_against_brute_force(n, k, seed, hetero, overlap, with_host, host_overlap):
    LINK = load_link("serial-8.5g" if overlap else "serial-8.5g-blocking")
    k = min(k, n)
    rng = np.random.default_rng(seed)
    archs = ["A", "B"] if hetero else ["A"]
    # Op times of a few ms and cuts of up to 4 MB (3.8 ms on the serial link): send and compute compete.
    ops = [OpCost(f"op{i}", {a: float(rng.uniform(0.1, 5.0)) * 1e-3 * (1.7 if a == "B" else 1.0) for a in archs},
                  int(rng.integers(0, 100)) * 10_000, int(rng.integers(1, 50)) * 10_000,
                  int(rng.integers(0, 40)) * 100_000, float(rng.choice([0.0, 0.0, rng.uniform(0.1, 3.0)])) * 1e-3)
           for i in range(n)]  # some ops are CPU ops on the host (host_seconds)
    boards = [Board(f"b{s}", archs[s % len(archs)], int(rng.integers(120, 600)) * 10_000) for s in range(k)]
    # a host that converts at 2 ns per element (a 4 MB cut: 8 ms each way), so host time moves the best cut
    # (an int8 stage's call at 50 us; which stages run through the VM, on floats, varies with the seed)
    cost = HostCost(2e-4, 5e-5, 1e-9, 5e-10, 3e-10, 2e-10, 1e-6, 1e-9, 3e-5, 1e-9, int8_call_s=5e-5)
    host = HostTerms(cost, 150_000, 1000, 1e-3, 2e-3, first_vm=seed % 3 == 0, middle_vm=seed % 2 == 0,
                     overlap=host_overlap) if with_host else None
    expected = _brute(ops, boards, LINK, host)
    if expected == float("inf"):
        with pytest.raises(PlanError, match="no way to fit"):
            plan_chain(ops, boards, LINK, host)
        return
    plan = plan_chain(ops, boards, LINK, host)
    assert plan.bottleneck_s == pytest.approx(expected)
    if host is not None:
        assert all(s.host_s > 0 for s in plan.stages)
        assert plan.bottleneck().startswith("stage ") and plan.to_json()["stages"][0]["host_ms"] > 0
    assert [s.first for s in plan.stages][0] == 0 and plan.stages[-1].end == n
    assert all(a.end == b.first for a, b in zip(plan.stages, plan.stages[1:]))
    assert all(s.memory_bytes <= s.board.ddr_bytes for s in plan.stages) and plan.stages[-1].send_bytes == 0


def test_requests_that_cannot_be_planned():
    ops = [OpCost("a", {"A": 1.0}, 10, 10, 0)]
    with pytest.raises(PlanError, match="cannot fill 2 stages"):
        plan_chain(ops, [Board("x", "A", 100), Board("y", "A", 100)], LINK)
    with pytest.raises(PlanError, match="no predicted time on B"):
        plan_chain(ops, [Board("x", "B", 100)], LINK)
    with pytest.raises(PlanError, match="largest op, 'a', needs 20 B"):
        plan_chain(ops, [Board("x", "A", 19)], LINK)
    with pytest.raises(PlanError, match="known links"):
        load_link("carrier-pigeon")
    assert load_link("gbe").seconds(125_000_000) == pytest.approx(1e-4 + 1e9 / 0.94e9)
    # the Ray executor's default link: Ray's object store (measured on loopback) over GbE, slower than bare GbE
    from tvm_dpu.pipeline.plan import default_link

    assert default_link("ray") == "ray-gbe" and default_link("local") == "serial-8.5g"
    ray_gbe = load_link("ray-gbe")
    assert ray_gbe.latency_us > load_link("gbe").latency_us and ray_gbe.gbit_per_s <= load_link("gbe").gbit_per_s
    assert board_ddr_bytes("zcu102") == 3 * 2**30


def test_op_chain_of_a_compiled_model_and_its_plan():
    model = zoo.build_model("resnet18", reduced=True)
    compiled = tvm_dpu.build(model, arch="zcu102", calibration=[zoo.random_input(model, seed=0)], progress=False)
    boards = [Board(f"zcu102-{i}", "zcu102", board_ddr_bytes("zcu102")) for i in range(3)]
    chain = op_chain(compiled, boards)
    (runner,) = compiled.runners.values()
    assert [c.name for c in chain] == [n for n, _, _ in runner.sg.op_ranges]
    total = sum(c.seconds["zcu102"] for c in chain)
    assert total == pytest.approx(compiled.timing().latency_s, rel=0.01)
    assert chain[-1].cut_bytes > 0 and all(c.cut_bytes > 0 for c in chain)  # something always crosses
    one = plan_chain(chain, boards[:1], LINK)
    three = plan_chain(chain, boards, LINK)
    assert three.bottleneck_s <= one.bottleneck_s and len(three.stages) == 3
    assert three.to_json()["stages"][0]["ops"][0] == chain[0].name


def test_skip_tensor_buffer_counted_in_memory():
    # op b's output is used two ops later: the middle stage receives it and holds it while its own op runs
    ops = [OpCost("a", {"A": 1e-3}, 0, 10, 500), OpCost("b", {"A": 1e-3}, 0, 10, 500),
           OpCost("c", {"A": 1e-3}, 0, 10, 0)]
    plan = plan_chain(ops, [Board(f"b{i}", "A", 10_000) for i in range(3)], LINK)
    assert [s.memory_bytes for s in plan.stages] == [10 + 500, 500 + 10 + 500, 500 + 10]
    with pytest.raises(PlanError, match="no way to fit"):
        plan_chain(ops, [Board(f"b{i}", "A", 1000) for i in range(3)], LINK)


def test_host_terms_of_a_model_move_the_plan():
    model = zoo.build_model("resnet18", reduced=True)
    compiled = tvm_dpu.build(model, arch="zcu102", calibration=[zoo.random_input(model, seed=0)], progress=False)
    from tvm_dpu.pipeline.stages import host_terms
    from tvm_dpu.timing.host import load_host_cost

    cost = load_host_cost()
    terms = host_terms(compiled, cost)
    assert terms.input_elems == 3 * 64 * 64 and terms.output_elems == 10
    boards = [Board(f"zcu102-{i}", "zcu102", board_ddr_bytes("zcu102")) for i in range(2)]
    chain = op_chain(compiled, boards)
    bare = plan_chain(chain, boards, LINK)
    hosted = plan_chain(chain, boards, LINK, terms)
    assert hosted.bottleneck_s > bare.bottleneck_s
    # no CPU op before or after the DPU part: every stage passes int8 through (no VM), paying at least its call
    # and a driver call, the first quantizing the input and the last dequantizing the output
    assert not (terms.first_vm or terms.last_vm or terms.middle_vm)
    for st in hosted.stages:
        assert st.host_s >= cost.int8_call_s + cost.dpu_call_s and st.serial_s == pytest.approx(cost.dpu_call_s)
    assert hosted.stages[0].host_s >= cost.quant_s_per_elem * terms.input_elems
    # double-buffered, the host works beside the DPU; strictly serial it adds to it
    serial = plan_chain(chain, boards, LINK, host_terms(compiled, cost, overlap=False))
    assert serial.bottleneck_s >= hosted.bottleneck_s
    assert serial.bottleneck_s == pytest.approx(max(s.compute_s + s.host_s for s in serial.stages))
    slow = plan_chain(chain, boards, LINK, host_terms(compiled, cost.scaled(50.0)))
    assert slow.bottleneck_s > hosted.bottleneck_s and "host" in slow.bottleneck()


def test_several_op_orders_on_a_branchy_graph():
    from tvm_dpu.pipeline.model import PipelineModel
    from tvm_dpu.pipeline.plan import chain_units, plan_model, unit_deps, unit_orders

    model = zoo.build_model("googlenet", reduced=True)
    x = zoo.random_input(model, seed=3)
    compiled = tvm_dpu.build(model, arch="zcu102", calibration=[zoo.random_input(model, seed=0)], progress=False)
    units = chain_units(compiled)
    deps = unit_deps(units)
    orders = unit_orders(units)
    assert len(orders) >= 2 and orders[0] == list(range(len(units)))
    for order in orders:  # every order is topological
        pos = {u: i for i, u in enumerate(order)}
        assert all(pos[d] < pos[u] for u in order for d in deps[u])
    boards = [Board(f"zcu102-{i}", "zcu102", board_ddr_bytes("zcu102")) for i in range(3)]
    per_order = [plan_chain(op_chain(compiled, boards, o), boards, LINK) for o in orders]
    best = plan_model(compiled, boards, LINK)
    assert best.bottleneck_s == pytest.approx(min(p.bottleneck_s for p in per_order))
    # the cut bytes differ between orders (else one order would do)
    assert len({tuple(c.cut_bytes for c in op_chain(compiled, boards, o)) for o in orders}) > 1
    # a pipeline cut along another order still computes the single-board integers
    other = per_order[1]
    pipe = PipelineModel.from_plan(compiled, other)
    assert np.array_equal(pipe.run(x)[0], compiled.run(x)[0])
    pipe.close()
    with pytest.raises(PlanError, match="permutation"):
        op_chain(compiled, boards, [0] * len(units))
    with pytest.raises(PlanError, match="before the unit that produces it"):
        op_chain(compiled, boards, list(reversed(range(len(units)))))
