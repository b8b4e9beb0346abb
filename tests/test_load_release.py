"""Loading and dropping a model releases what it took: 500 loads of one artifact map its library once (TVM never
unloads a shared library, so the runtime reuses the one already loaded for equal bytes) and RSS stays bounded."""
from __future__ import annotations

import gc

import pytest

import tvm_dpu
from tvm_dpu import zoo


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2 ** 20


def _deleted_mappings() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if "(deleted)" in line)


@pytest.fixture()
def artifact(small_artifact):
    return small_artifact


def test_500_loads_map_the_library_once_and_bound_rss(artifact):
    x = zoo.random_input("mixed_cnn", reduced=True)
    first = tvm_dpu.load(artifact)
    y = first.run(x)[0]
    del first
    gc.collect()
    rss0, maps0 = _rss_mib(), _deleted_mappings()
    for i in range(500):
        m = tvm_dpu.load(artifact)
        if i % 50 == 0:
            assert (m.run(x)[0] == y).all()  # a model sharing the library runs as the first did
        del m
    gc.collect()
    assert _deleted_mappings() == maps0
    assert _rss_mib() - rss0 < 24, f"RSS grew {_rss_mib() - rss0:.1f} MiB over 500 loads"


def test_models_sharing_a_library_keep_their_own_devices(artifact):
    from tvm_dpu.runtime.cores import core_group

    a, b = tvm_dpu.load(artifact), tvm_dpu.load(artifact)
    assert a.library is b.library
    b.pin(core_group(b.arch, 2))
    x = zoo.random_input("mixed_cnn", reduced=True)
    assert (a.run(x)[0] == b.run(x)[0]).all()
    assert a.dpu_device() is not b.dpu_device()
