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
from tvm_dpu.pipeline.plan import board_ddr_bytes, op_chain

LINK = load_link("serial-8.5g")


def _brute(ops, boards, link):
    n, k = len(ops), len(boards)
    best = float("inf")
    for cuts in itertools.combinations(range(1, n), k - 1):
        bounds = [0, *cuts, n]
        worst = 0.0
        for s, b in enumerate(boards):
            i, j = bounds[s], bounds[s + 1]
            send = ops[j - 1].cut_bytes if j < n else 0
            mem = sum(o.param_bytes for o in ops[i:j]) + max(o.work_bytes for o in ops[i:j])
            mem += send if link.overlap else 0  # the second output buffer
            if mem > b.ddr_bytes:
                worst = float("inf")
                break
            compute = sum(o.seconds[b.arch] for o in ops[i:j])
            period = max(compute, link.seconds(send)) if link.overlap else compute + link.seconds(send)
            worst = max(worst, period)
        best = min(best, worst)
    return best


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 9), st.integers(1, 4), st.integers(0, 2**31), st.booleans(), st.booleans())
def test_optimal_against_brute_force(n, k, seed, hetero, overlap):
    LINK = load_link("serial-8.5g" if overlap else "serial-8.5g-blocking")
    k = min(k, n)
    rng = np.random.default_rng(seed)
    archs = ["A", "B"] if hetero else ["A"]
    # Op times of a few ms and cuts of up to 4 MB (3.8 ms on the serial link): send and compute compete.
    ops = [OpCost(f"op{i}", {a: float(rng.uniform(0.1, 5.0)) * 1e-3 * (1.7 if a == "B" else 1.0) for a in archs},
                  int(rng.integers(0, 100)) * 10_000, int(rng.integers(1, 50)) * 10_000,
                  int(rng.integers(0, 40)) * 100_000)
           for i in range(n)]
    boards = [Board(f"b{s}", archs[s % len(archs)], int(rng.integers(120, 600)) * 10_000) for s in range(k)]
    expected = _brute(ops, boards, LINK)
    if expected == float("inf"):
        with pytest.raises(PlanError, match="no way to fit"):
            plan_chain(ops, boards, LINK)
        return
    plan = plan_chain(ops, boards, LINK)
    assert plan.bottleneck_s == pytest.approx(expected)
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
