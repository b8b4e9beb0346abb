"""Host cost model (tvm_dpu/timing/host.py) and the int8 wire path without a float64 step."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tvm_dpu.pipeline.stages import from_wire, to_wire
from tvm_dpu.quant.fixpoint import dpu_round, dpu_round_scaled_f32
from tvm_dpu.runtime.subgraph_runner import quantize_tensor
from tvm_dpu.timing.host import HostCost, load_host_cost
from tvm_dpu.timing.params import TimingError

FLOATS = st.floats(width=32, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(hnp.arrays(np.float32, st.integers(1, 64), elements=FLOATS), st.integers(-12, 12))
def test_float32_rounding_equals_the_float64_form(x, fp):
    assert np.array_equal(dpu_round_scaled_f32(x, fp), dpu_round(x.astype(np.float64) * 2.0 ** fp))


def test_float32_rounding_edge_cases():
    fp = 0
    x = np.array([0.5, -0.5, 1.5, -1.5, 0.49999997, -0.50000006, -2.0 ** -30, 2.0 ** -30, 127.5, -128.5, 127.49999,
                  1e30, -1e30, np.inf, -np.inf, 2.5 - 2.0 ** -22, np.nextafter(np.float32(0.5), np.float32(0))],
                 dtype=np.float32)
    assert np.array_equal(dpu_round_scaled_f32(x, fp), dpu_round(x.astype(np.float64)))
    # quantize_tensor takes the float32 path for float32 and the float64 one otherwise, with equal results
    y = np.linspace(-3, 3, 1001)
    assert np.array_equal(quantize_tensor(y.astype(np.float32), 5), quantize_tensor(y.astype(np.float32)
                                                                                    .astype(np.float64), 5))


def test_wire_round_trip_is_exact_and_int8():
    rng = np.random.default_rng(0)
    a = (rng.integers(-128, 128, (1, 256, 56, 56)) * 2.0 ** -3).astype(np.float32)
    wire = to_wire([a, a[:, :3]], ["t", "out"], {"t": 3})
    assert wire["t"].dtype == np.int8 and wire["out"].dtype == np.float32
    back = from_wire(wire, ["t", "out"], {"t": 3})
    assert np.array_equal(back[0], a) and np.array_equal(back[1], a[:, :3])


def test_measured_model_loads_and_adds_up(tmp_path):
    cost = load_host_cost()
    assert "bench_host.py" in cost.source
    assert cost.call_s > 0 and cost.quant_s_per_elem > 0 and cost.segment_s > 0
    # a stage receiving and sending 1 Mi elements each, one DPU program, two CPU ops of 1000 elements
    expected = (cost.call_s + cost.dpu_call_s + 2 * 2**20 * (cost.quant_s_per_elem + cost.dequant_s_per_elem
                                                              + cost.dma_s_per_byte + cost.vm_s_per_elem)
                + 2 * (cost.cpu_fixed_s + 1000 * cost.cpu_s_per_elem))
    assert cost.call_seconds(2**20, 2**20, 1, (1000, 1000)) == pytest.approx(expected)
    assert cost.scaled(4.0).call_seconds(2**20, 2**20, 1, (1000, 1000)) == pytest.approx(4 * expected)
    # a program's weights cost only the call that writes them to the device (its first); a segment costs its
    # dispatch alone (its inputs lie in the shared region already)
    assert cost.region_s_per_byte > 0
    assert cost.upload_seconds(10**7) == pytest.approx(1e7 * cost.region_s_per_byte)
    assert cost.call_seconds(0, 0, region_bytes=10**7) == pytest.approx(
        cost.call_s + cost.dpu_call_s + cost.upload_seconds(10**7))
    assert cost.call_seconds(0, 0) == pytest.approx(cost.call_s + cost.dpu_call_s)
    assert cost.segment_seconds() == pytest.approx(cost.segment_s)
    assert cost.scaled(2.0).segment_seconds() == pytest.approx(2 * cost.segment_s)
    bad = tmp_path / "host.json"
    bad.write_text(json.dumps({"cost": {"call_s": 1.0}}))
    with pytest.raises(TimingError, match="lacks"):
        load_host_cost(bad)
    bad.write_text("{not json")
    with pytest.raises(TimingError, match="not a host cost file"):
        load_host_cost(bad)
    with pytest.raises(TimingError, match="call_s"):
        HostCost(-1.0, 0, 0, 0, 0, 0, 0, 0, 0)


def test_int8_stage_cost_and_the_terms_added_later(tmp_path):
    cost = load_host_cost()
    # measured by bench_host.py: the int8 path's own call (no VM) is far below the VM call; CPU ops cost per MAC
    assert 0 < cost.int8_call_s < cost.call_s and cost.cpu_s_per_mac > 0
    # a stage between two others: 1 MiB in, 0.5 MiB out, as int8, 3 MB of weights: no conversion at all
    mid = cost.int8_call_seconds(2**20, 2**19, region_bytes=3_000_000)
    assert mid == pytest.approx(cost.int8_call_s + cost.dpu_call_s + 3e6 * cost.region_s_per_byte
                                + (2**20 + 2**19) * cost.dma_s_per_byte)
    # the first stage quantizes its float input, the last dequantizes its output
    assert cost.int8_call_seconds(100, 0, quant_elems=100) - cost.int8_call_seconds(100, 0) == pytest.approx(
        100 * cost.quant_s_per_elem)
    assert cost.int8_call_seconds(0, 10, dequant_elems=10) - cost.int8_call_seconds(0, 10) == pytest.approx(
        10 * cost.dequant_s_per_elem)
    assert cost.cpu_ops_s([10, 20], [1000, 0]) == pytest.approx(
        2 * cost.cpu_fixed_s + 30 * cost.cpu_s_per_elem + 1000 * cost.cpu_s_per_mac)
    # a file of the first terms only still loads (the later ones were not measured there: 0); an unknown term fails
    doc = json.loads(json.dumps({"cost": {k: v for k, v in cost.to_json().items()
                                          if k not in ("source", "scale", "int8_call_s", "cpu_s_per_mac")}}))
    (tmp_path / "old.json").write_text(json.dumps(doc))
    old = load_host_cost(tmp_path / "old.json")
    assert old.int8_call_s == 0.0 and old.cpu_s_per_mac == 0.0 and old.call_s == cost.call_s
    doc["cost"]["warp_s"] = 1.0
    (tmp_path / "odd.json").write_text(json.dumps(doc))
    with pytest.raises(TimingError, match="unknown host cost terms"):
        load_host_cost(tmp_path / "odd.json")
