"""Virtual DPUs: the cores of one device as separate devices; several models served concurrently on them."""
from __future__ import annotations

import itertools
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tvm_dpu
from tvm_dpu import zoo
from tvm_dpu.runtime.cores import VirtualDPU, place_by_load, predicted_load_s, serve
from tvm_dpu.runtime.device import DeviceError, EmulatorDevice

ARCH = "zcu102"


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    d = tmp_path_factory.mktemp("vdpu")
    out = []
    for name in ("mixed_cnn", "resnet18"):
        model = zoo.build_model(name, reduced=True) if name == "resnet18" else zoo.build_model(name)
        compiled = tvm_dpu.build(model, arch=ARCH, progress=False,
                                 calibration=[zoo.random_input(model, seed=s) for s in range(2)])
        x = zoo.random_input(model, seed=9)
        out.append((compiled.export(d / f"{name}.tvmdpu"), x, compiled.run(x)[0]))
    return out


def test_one_virtual_dpu_per_core():
    cores = tvm_dpu.devices(ARCH)
    assert [c.core for c in cores] == [0, 1, 2] and all(isinstance(c, VirtualDPU) for c in cores)
    assert len({id(c.device) for c in cores}) == 3 and all(c.arch.name == cores[0].arch.name for c in cores)
    assert len(tvm_dpu.devices("DPUCZDX8G_ISA1_B4096")) == 1
    with pytest.raises(DeviceError, match="expected 'emulator' or 'pynq'"):
        tvm_dpu.devices(ARCH, kind="gpu")
    with pytest.raises(DeviceError, match="device kind 'emulator' takes no options"):
        tvm_dpu.devices(ARCH, kind="emulator", bitfile="dpu.bit")


def test_device_names_come_from_one_registry():
    """The CLI's --device choices, set_device, load and devices() all resolve names through DEVICE_KINDS."""
    from tvm_dpu.cli import build_parser
    from tvm_dpu.errors import DPUError
    from tvm_dpu.runtime.device_kinds import DEVICE_KINDS

    assert list(DEVICE_KINDS) == ["emulator", "pynq"]
    run = next(a for a in build_parser()._subparsers._group_actions[0].choices["run"]._actions
               if "--device" in a.option_strings)
    assert list(run.choices) == list(DEVICE_KINDS)
    assert isinstance(DEVICE_KINDS["emulator"].make(tvm_dpu.load_arch(ARCH)), EmulatorDevice)
    with pytest.raises(DPUError, match="expected 'emulator', 'pynq' or a device object"):
        tvm_dpu.set_device("gpu")
    with pytest.raises(DPUError, match="device kind 'emulator' takes no options"):
        tvm_dpu.set_device("emulator", bitfile="dpu.bit")
    assert tvm_dpu.get_device() == "emulator"


def test_three_tenants_on_three_cores_bit_identical(artifacts):
    cores = tvm_dpu.devices(ARCH)
    (a, xa, ya), (b, xb, yb) = artifacts
    models = [tvm_dpu.load(a, device=cores[0]), tvm_dpu.load(b, device=cores[1]), tvm_dpu.load(a, device=cores[2])]
    report, outs = serve(models, [xa, xb, xa], runs=3, names=["mixed0", "resnet18", "mixed2"])
    np.testing.assert_array_equal(outs[0][0], ya)
    np.testing.assert_array_equal(outs[1][0], yb)
    np.testing.assert_array_equal(outs[2][0], ya)
    per_core = {c["core"]: c["runs"] for c in report.cores}
    assert per_core == {0: 3 * len(models[0].runners), 1: 3 * len(models[1].runners), 2: 3 * len(models[2].runners)}
    assert [m["core"] for m in report.models] == [0, 1, 2] and all(m["runs_per_s"] > 0 for m in report.models)
    assert "core 2:" in report.table()


class _Exclusive(EmulatorDevice):
    """An emulator that fails if two programs ever run on it at once."""

    def __init__(self, arch):
        super().__init__(arch)
        self.active = 0
        self.max_active = 0
        self._count = threading.Lock()

    def execute(self, sg, regions):
        with self._count:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            time.sleep(0.002)
            super().execute(sg, regions)
        finally:
            with self._count:
                self.active -= 1


def test_models_sharing_a_core_take_turns(artifacts):
    (a, xa, ya), (b, xb, yb) = artifacts
    m0 = tvm_dpu.load(a)
    inner = _Exclusive(m0.arch)
    core = VirtualDPU(inner, 0)
    models = [tvm_dpu.load(a, device=core), tvm_dpu.load(b, device=core)]
    report, outs = serve(models, [xa, xb], runs=3)
    np.testing.assert_array_equal(outs[0][0], ya)
    np.testing.assert_array_equal(outs[1][0], yb)
    assert inner.max_active == 1 and report.cores[0]["runs"] == 3 * (len(models[0].runners) + len(models[1].runners))


def test_serve_needs_virtual_dpus(artifacts):
    (a, xa, _), _ = artifacts
    with pytest.raises(DeviceError, match="tvm_dpu.devices"):
        serve([tvm_dpu.load(a)], [xa], runs=1)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(0.01, 100.0), min_size=1, max_size=7), st.integers(1, 4))
def test_placement_by_predicted_load_is_within_lpt_bound(loads, cores):
    where = place_by_load(loads, cores)
    assert len(where) == len(loads) and all(0 <= c < cores for c in where)

    def busiest(assign) -> float:
        per = [0.0] * cores
        for load, c in zip(loads, assign):
            per[c] += load
        return max(per)

    best = min(busiest(a) for a in itertools.product(range(cores), repeat=len(loads)))
    assert busiest(where) <= best * (4 / 3 - 1 / (3 * cores)) + 1e-9  # Graham's bound for largest-first


def test_placement_beats_round_robin_on_skewed_tenants(artifacts):
    # two heavy and two light tenants on 2 cores: i mod N puts both heavy ones on core 0
    loads = [5.0, 4.0, 1.0, 1.0]
    assert place_by_load(loads, 2) == [0, 1, 1, 0]
    m = tvm_dpu.load(artifacts[1][0])
    assert predicted_load_s(m) == pytest.approx(m.timing().latency_s) and predicted_load_s(m) > 0
    with pytest.raises(DeviceError, match="0 cores"):
        place_by_load(loads, 0)
