"""End-to-end compiler: ONNX -> partition -> calibrate/quantize -> DPU machine code + LLVM CPU part -> run.

Bit-exactness: the emulator's output of every DPU subgraph equals the golden reference on the same int8 inputs.
Accuracy: the whole model stays close to onnxruntime's float result (power-of-two int8 quantization).
"""
from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import onnxruntime as ort
import pytest
import tvm
from tvm import relax

import tvm_dpu
from tvm_dpu import zoo
from tvm_dpu.errors import DPUError

ARCHS = ["DPUCZDX8G_ISA1_B4096", "DPUCZDX8G_ISA1_B1152"]
REDUCED = ["resnet18", "resnet50", "googlenet", "mobilenetv2", "vgg16", "mixed_cnn"]


def _ort(model, x):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {model.graph.input[0].name: x})[0]


def _build(model, arch, n_calib=4):
    calib = [zoo.random_input(model, seed=s) for s in range(n_calib)]
    return tvm_dpu.build(model, arch=arch, calibration=calib, progress=False)


def _check_model(model, compiled, seed=100):
    x = zoo.random_input(model, seed=seed)
    compiled.set_verify(True)
    y = compiled.run(x)[0]
    results = compiled.verify_results()
    assert len(results) == len(compiled.runners) and results
    assert sum(r.mismatches for r in results) == 0, [r.first for r in results if r.mismatches]
    ref = _ort(model, x)
    assert y.shape == ref.shape
    return y, ref


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", REDUCED)
def test_reduced_zoo_bit_exact_and_close_to_float(name, arch):
    model = zoo.build_model(name, reduced=True)
    compiled = _build(model, arch)
    y, ref = _check_model(model, compiled)
    # int8 power-of-two quantization of a randomly initialised network: the logits keep their direction.
    cos = float(np.dot(y.ravel(), ref.ravel()) / (np.linalg.norm(y) * np.linalg.norm(ref) + 1e-12))
    assert cos > 0.9, cos
    rep = compiled.report()
    assert rep["subgraphs"] and all(s["instructions"] > 0 for s in rep["subgraphs"])
    assert rep["partition"]["subgraphs"] >= len(rep["subgraphs"])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50", "googlenet", "mobilenetv2"])
def test_full_size_bit_exact(name):
    model = zoo.build_model(name)
    compiled = _build(model, "DPUCZDX8G_ISA1_B4096", n_calib=2)
    y, ref = _check_model(model, compiled)
    cos = float(np.dot(y.ravel(), ref.ravel()) / (np.linalg.norm(y) * np.linalg.norm(ref) + 1e-12))
    assert cos > 0.9, cos


def test_mixed_model_runs_cpu_and_dpu_parts():
    model = zoo.build_model("mixed_cnn")
    compiled = _build(model, "zcu102")
    rep = compiled.partition_report
    assert len(compiled.runners) == rep.subgraphs == 2
    assert {n.op for n in rep.cpu_nodes} >= {"Softmax", "Sigmoid"}
    y, ref = _check_model(model, compiled)
    np.testing.assert_allclose(y.sum(), 1.0, rtol=1e-5)  # the CPU softmax ran on the DPU's output
    assert int(np.argmax(y)) == int(np.argmax(ref))


def test_random_calibration_warns():
    model = zoo.build_model("resnet18", reduced=True)
    with pytest.warns(UserWarning, match="random"):
        tvm_dpu.build(model, arch="B4096", progress=False)


def test_calibration_formats_agree():
    """A list of arrays, a stacked (N, ...) array and a dict of stacked arrays give the same fix_points."""
    model = zoo.build_model("resnet18", reduced=True)
    xs = [zoo.random_input(model, seed=s) for s in range(2)]
    a = tvm_dpu.build(model, arch="B4096", calibration=xs, progress=False)
    b = tvm_dpu.build(model, arch="B4096", calibration=np.concatenate(xs), progress=False)
    c = tvm_dpu.build(model, arch="B4096", calibration={"input": np.concatenate(xs)}, progress=False)
    fps = [[t.fix_point for r in m.runners.values() for t in r.graph.tensors.values()] for m in (a, b, c)]
    assert fps[0] == fps[1] == fps[2]
    with pytest.raises(DPUError, match="calibration data for input 'input'"):
        tvm_dpu.build(model, arch="B4096", calibration=np.zeros((2, 3, 5, 5), np.float32), progress=False)


def test_relax_module_input_and_wrong_target():
    mod = tvm_dpu.from_onnx(zoo.build_model("mixed_cnn"))
    with pytest.raises(DPUError, match="target 'cuda'"):
        tvm_dpu.build(mod, target="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = tvm_dpu.build(mod, arch="zcu102", progress=False)
    assert compiled.run(np.zeros((1, 3, 64, 64), np.float32))[0].shape == (1, 10)
    with pytest.raises(ValueError, match="shape"):
        compiled.run(np.zeros((1, 3, 32, 32), np.float32))


def test_artifact_round_trip_in_fresh_process(tmp_path):
    from tvm_dpu.runtime.artifact import export, load

    model = zoo.build_model("mixed_cnn")
    compiled = _build(model, "zcu102", n_calib=2)
    path = export(compiled, tmp_path / "m.tvmdpu")
    x = zoo.random_input(model, seed=7)
    expected = compiled.run(x)[0]
    np.save(tmp_path / "x.npy", x)
    code = f"""
import numpy as np
from tvm_dpu.runtime.artifact import load
m = load({str(path)!r})
m.set_verify(True)
y = m.run(np.load({str(tmp_path / 'x.npy')!r}))[0]
np.save({str(tmp_path / 'y.npy')!r}, y)
print(sum(r.mismatches for r in m.verify_results()))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "0"
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), expected)
    loaded = load(path)
    assert loaded.report()["subgraphs"] == compiled.report()["subgraphs"]


def test_fusion_modes_end_to_end():
    """build(..., fusion=none|greedy|optimal): all bit-exact, same outputs up to quantization, and the timing model
    never ranks optimal below greedy below none."""
    model = zoo.build_model("resnet18", reduced=True)
    calib = [zoo.random_input(model, seed=s) for s in range(2)]
    x = zoo.random_input(model, seed=5)
    cycles, outs = {}, {}
    for mode in ("none", "greedy", "optimal"):
        m = tvm_dpu.build(model, arch="B4096", calibration=calib, progress=False, fusion=mode)
        m.set_verify(True)
        outs[mode] = m.run(x)[0]
        assert sum(r.mismatches for r in m.verify_results()) == 0
        info = m.build_info["fusion"]
        assert all(v["mode"] == mode for v in info.values())
        # a searched plan is kept unless a simpler one (greedy, none) simulates faster, which stats name
        assert all(v["plan"] == (v.get("simulated_fallback") or mode) for v in info.values())
        assert all(bool(v["groups"]) == (v["plan"] != "none") for v in info.values() if v["plan"] == "none")
        cycles[mode] = m.report()["timing"]["cycles"]
    # fusion changes no value: same fix_points, same integer results
    np.testing.assert_array_equal(outs["none"], outs["optimal"])
    np.testing.assert_array_equal(outs["none"], outs["greedy"])
    assert cycles["optimal"] <= cycles["greedy"] <= cycles["none"], cycles
    with pytest.raises(DPUError, match="fusion 'fast'"):
        tvm_dpu.build(model, arch="B4096", calibration=calib, progress=False, fusion="fast")
