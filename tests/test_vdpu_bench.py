"""benchmarks/bench_vdpu.py's end-to-end measurement (fGrain's way) on a reduced model."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

import tvm_dpu
from tvm_dpu import zoo

ROOT = Path(__file__).resolve().parents[1]


def test_end_to_end_gain_and_loss_are_measured_on_the_whole_run():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_vdpu
    finally:
        sys.path.pop(0)
    proto = zoo.build_model("googlenet", reduced=True)
    model = tvm_dpu.build(proto, arch="zcu102", progress=False, calibration=[zoo.random_input(proto, seed=0)],
                          cores=3, segments="always")
    x = zoo.random_input(proto, seed=1)
    e = bench_vdpu.end_to_end(model, x, reps=3)
    assert e["cores"] == 3 and e["segments"] > 1
    # every run sleeps at least the predicted DPU time of what it runs, plus the host around it
    single_dpu_ms = model.timing().latency_s * 1e3
    assert e["native_ms"] >= single_dpu_ms and e["wrapped_ms"] >= single_dpu_ms
    assert e["segments_ms"] >= model.report()["timing"]["latency_ms"] * 0.99
    assert e["gain_percent"] == pytest.approx(100 * (1 - e["segments_ms"] / e["native_ms"]))
    assert e["loss_percent"] == pytest.approx(100 * (e["wrapped_ms"] - e["native_ms"]) / e["native_ms"])
    # the host's share: wall time less the DPU time slept, the one program's DPU time the timing model's
    assert e["dpu_ms"]["one_program"] == pytest.approx(single_dpu_ms)
    assert e["host_ms"]["native"] == pytest.approx(e["native_ms"] - single_dpu_ms) and e["host_ms"]["native"] > 0
    assert e["host_ms"]["segments"] == pytest.approx(e["segments_ms"] - e["dpu_ms"]["segments"])
    p = e["predicted"]
    assert p["one_program_ms"] > single_dpu_ms  # the host cost model adds to the DPU time
    assert p["gain_percent"] < p["dpu_only_gain_percent"]  # segments cost the host more than one program


def _bench():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_vdpu
    finally:
        sys.path.pop(0)
    return bench_vdpu


def test_timed_cores_share_the_ddr_as_the_timing_model_charges_it():
    """Alone a program sleeps its one-core time; two at once each advance at their two-core rate, so neither ends
    before its two-core time (a sleep never ends early: lower bounds only)."""
    import threading
    import time

    bv = _bench()
    ddr = bv._SharedDDR()
    t0 = time.perf_counter()
    ddr.hold([0.01, 0.03])
    assert time.perf_counter() - t0 >= 0.01
    ends = []

    def one():
        ddr.hold([0.01, 0.03])
        ends.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # the second starts a little after the first: the first runs alone for that while, then both at 1/0.03
    assert len(ends) == 2 and max(ends) >= 0.02 and ddr.active == 0


def test_multi_tenant_throughput_with_timed_cores():
    bv = _bench()
    names = ["googlenet", "mixed_cnn"]
    built, inputs = {}, {}
    for n in names:
        proto = zoo.build_model(n, reduced=True) if n == "googlenet" else zoo.build_model(n)
        built[n] = tvm_dpu.build(proto, arch="zcu102", progress=False, calibration=[zoo.random_input(proto, seed=0)])
        inputs[n] = zoo.random_input(proto, seed=1)
    t = bv.tenants_timed(built, inputs, names, runs=2, reps=2)
    assert t["cores"] == [0, 1] and len(t["samples_ms"]["sequential"]) == 2
    assert t["speedup"] == pytest.approx(t["sequential_ms"] / t["concurrent_ms"])
    # one after another sleeps every program's one-core time, runs times each, plus the host around it
    dpu_ms = sum(built[n].timing().latency_s for n in names) * 1e3 * 2
    assert min(t["samples_ms"]["sequential"]) >= dpu_ms * 0.999
    assert all(built[n].device.runs >= 2 * 2 for n in names)  # served on their timed virtual DPUs
