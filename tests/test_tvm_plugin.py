"""tvm-dpu as a TVM plugin: the spellings a TVM user types, the DPU code inside TVM's own module, export_library /
load_module in a fresh process, and models that keep their own code."""
from __future__ import annotations

import gc
import subprocess
import sys
import warnings
import weakref

import numpy as np
import onnxruntime as ort
import pytest
import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx as tvm_from_onnx

import tvm_dpu
from tvm_dpu import zoo
from tvm_dpu.arch import load_arch
from tvm_dpu.errors import DPUError, QuantizationError
from tvm_dpu.runtime.device import EmulatorDevice

ARCH = "zcu102"


class SpyDevice(EmulatorDevice):
    """An emulator that counts the DPU subgraph calls it executes."""

    def __init__(self, arch):
        super().__init__(load_arch(arch))
        self.calls = 0

    def execute(self, sg, regions):
        self.calls += 1
        super().execute(sg, regions)


@pytest.fixture(scope="module")
def reference(model, calib):
    """tvm_dpu.build's output for the options the TVM spellings use."""
    x = zoo.random_input(model, seed=9)
    compiled = tvm_dpu.build(model, arch=ARCH, calibration=calib, fusion="greedy", progress=False)
    return x, compiled.run(x)[0]


def _run(ex, x, device=None):
    vm = relax.VirtualMachine(ex, tvm.cpu())
    if device is None:
        return vm["main"](tvm.runtime.tensor(x)).numpy()
    with tvm_dpu.use_device(device):
        return vm["main"](tvm.runtime.tensor(x)).numpy()


def test_plain_target_dpu_offloads_with_default_arch(model):
    """tvm.compile(mod, target="dpu") on TVM's own ONNX import: DPU code for the default arch, calibrated on random
    data with a warning; never a silent CPU-only build."""
    mod = tvm_from_onnx(model)
    with pytest.warns(UserWarning, match="no calibration data"):
        ex = tvm.compile(mod, target="dpu")
    spy = SpyDevice("DPUCZDX8G_ISA1_B4096")
    x = zoo.random_input(model, seed=1)
    y = _run(ex, x, spy)
    assert spy.calls == 2  # mixed_cnn has two DPU subgraphs
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {model.graph.input[0].name: x})[0]
    cos = float(np.dot(y.ravel(), ref.ravel()) / (np.linalg.norm(y) * np.linalg.norm(ref)))
    assert cos > 0.9


def test_other_targets_keep_tvms_default_pipeline(model):
    spy = SpyDevice(ARCH)
    ex = tvm.compile(tvm_from_onnx(model), target="llvm")
    _run(ex, zoo.random_input(model, seed=1), spy)
    assert spy.calls == 0


def test_pipeline_with_options_equals_build(model, calib, reference):
    x, ref = reference
    pipeline = relax.get_pipeline("dpu", arch=ARCH, calibration=calib, fusion="greedy")
    ex = tvm.compile(tvm_from_onnx(model), target="dpu", relax_pipeline=pipeline)
    np.testing.assert_array_equal(_run(ex, x), ref)


def test_partition_then_compile_equals_build(model, calib, reference):
    x, ref = reference
    p = tvm_dpu.partition_for_dpu(tvm_dpu.from_onnx(model), ARCH)
    ex = tvm.compile(p, target="dpu", relax_pipeline=relax.get_pipeline("dpu", arch=ARCH, calibration=calib,
                                                                        fusion="greedy"))
    np.testing.assert_array_equal(_run(ex, x), ref)


def test_export_library_runs_in_a_fresh_process(model, calib, reference, tmp_path):
    x, ref = reference
    ex = tvm.compile(tvm_from_onnx(model), target="dpu",
                     relax_pipeline=relax.get_pipeline("dpu", arch=ARCH, calibration=calib, fusion="greedy"))
    ex.export_library(str(tmp_path / "m.so"))
    np.save(tmp_path / "x.npy", x)
    code = f"""
import numpy as np, tvm, tvm_dpu
from tvm import relax
tvm_dpu.set_device("emulator")
lib = tvm.runtime.load_module({str(tmp_path / 'm.so')!r})
y = relax.VirtualMachine(lib, tvm.cpu())["main"](tvm.runtime.tensor(np.load({str(tmp_path / 'x.npy')!r})))
np.save({str(tmp_path / 'y.npy')!r}, y.numpy())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), ref)
    # Without tvm_dpu imported, the module says what it needs instead of crashing.
    bare = f"""
import numpy as np, tvm
from tvm import relax
lib = tvm.runtime.load_module({str(tmp_path / 'm.so')!r})
relax.VirtualMachine(lib, tvm.cpu())["main"](tvm.runtime.tensor(np.load({str(tmp_path / 'x.npy')!r})))
"""
    out = subprocess.run([sys.executable, "-c", bare], capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "needs the tvm-dpu runtime: import tvm_dpu" in out.stderr


def test_two_models_keep_their_own_code(model):
    """Same graph (so the same partition symbols), different calibration: running A after compiling B gives A's
    output, and nothing is registered per model."""
    x = zoo.random_input(model, seed=3)
    mod = tvm_from_onnx(model)
    globals_before = set(tvm_ffi.registry.list_global_func_names())
    ex_a = tvm.compile(mod, target="dpu", relax_pipeline=relax.get_pipeline(
        "dpu", arch=ARCH, calibration=[zoo.random_input(model, seed=s) for s in range(2)]))
    y_a = _run(ex_a, x)
    ex_b = tvm.compile(mod, target="dpu", relax_pipeline=relax.get_pipeline(
        "dpu", arch=ARCH, calibration=[10.0 * zoo.random_input(model, seed=s) for s in range(30, 32)]))
    y_b = _run(ex_b, x)
    assert not np.array_equal(y_a, y_b)  # the calibrations differ, so the programs do
    np.testing.assert_array_equal(_run(ex_a, x), y_a)  # a fresh VM of A after B was compiled: A's code
    assert set(tvm_ffi.registry.list_global_func_names()) == globals_before


def test_compiled_model_is_not_kept_alive(model, calib):
    compiled = tvm_dpu.build(model, arch=ARCH, calibration=calib, progress=False)
    compiled.run(zoo.random_input(model, seed=1))
    ref = weakref.ref(compiled)
    del compiled
    gc.collect()
    assert ref() is None


def test_device_with_another_fingerprint_is_refused(model, calib, reference):
    x, _ = reference
    ex = tvm.compile(tvm_from_onnx(model), target="dpu",
                     relax_pipeline=relax.get_pipeline("dpu", arch=ARCH, calibration=calib))
    with pytest.raises(DPUError, match="compiled for DPU fingerprint .* but the device has"):
        _run(ex, x, EmulatorDevice(load_arch("DPUCZDX8G_ISA1_B1152")))


def test_project_errors_cross_tvm_with_their_type(model):
    """An error raised inside the pipeline (a TVM pass) reaches the caller as the project's error type."""
    with pytest.raises(DPUError, match="calibration data for input"):
        tvm.compile(tvm_from_onnx(model), target="dpu",
                    relax_pipeline=relax.get_pipeline("dpu", arch=ARCH, calibration=np.zeros((2, 3, 5, 5))))
    with pytest.raises(DPUError, match="fusion 'best'"):
        tvm.compile(tvm_from_onnx(model), target="dpu", relax_pipeline=relax.get_pipeline("dpu", fusion="best"))
    assert issubclass(QuantizationError, DPUError)


def test_runcodegen_without_the_dpu_pipeline_says_how(model):
    p = tvm_dpu.partition_for_dpu(tvm_dpu.from_onnx(model), ARCH)
    with pytest.raises(DPUError, match="has no compiled program: compile DPU partitions with"):
        relax.transform.RunCodegen()(p)


def test_many_threads_share_one_model(model, calib):
    """One CompiledModel called from 8 threads (each gets its own VM): every output equals the sequential one."""
    from concurrent.futures import ThreadPoolExecutor

    compiled = tvm_dpu.build(model, arch=ARCH, calibration=calib, progress=False)
    xs = [zoo.random_input(model, seed=s) for s in range(4)]
    expected = [compiled.run(x)[0] for x in xs]
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda i: (i % 4, compiled.run(xs[i % 4])[0]), range(32)))
    for i, y in results:
        np.testing.assert_array_equal(y, expected[i])
