"""util.blas: how many OpenBLAS threads the load leaves worth using, and calibration's products run on them (the
setter itself: tests/test_emulator_perf.py)."""
from __future__ import annotations

import contextlib

from tvm_dpu.util.blas import free_cores


def test_free_cores_are_the_cores_less_each_whole_core_kept_busy():
    assert [free_cores(2, load) for load in (0.0, 0.6, 0.99, 1.0, 1.6, 8.0)] == [2, 2, 2, 1, 1, 1]
    assert [free_cores(8, load) for load in (0.0, 2.4, 7.6, 30.0)] == [8, 6, 1, 1]
    assert 1 <= free_cores() <= 64


def test_calibration_runs_its_products_on_the_free_cores(monkeypatch):
    import tvm_dpu
    from tvm_dpu import zoo
    from tvm_dpu.backend import dpu_compile

    counts = []

    @contextlib.contextmanager
    def record(n):
        counts.append(n)
        yield

    monkeypatch.setattr(dpu_compile, "free_cores", lambda: 1)
    monkeypatch.setattr(dpu_compile, "openblas_threads", record)
    model = zoo.build_model("mixed_cnn", reduced=True)
    tvm_dpu.build(model, arch="zcu102", calibration=[zoo.random_input(model, seed=0)], progress=False)
    assert counts == [1]
