"""The VART-style runner (tvm_dpu.serving.runner) and `tvm-dpu benchmark`: tensor descriptions with fix_points,
execute_async / wait, int8 and float buffers, VART's batch handling, threads, and the same for .xmodel files."""
from __future__ import annotations

import json
import threading
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvm_dpu
from tvm_dpu.cli import main
from tvm_dpu.errors import DPUError, InputError
from tvm_dpu.serving.runner import TensorInfo, create_runner

XMODEL = Path(__file__).resolve().parent / "data" / "xmodel" / "dpu_pynq" / "dpu_mnist_classifier.xmodel"


def conv_model(batch: int = 1, out_name: str = "y", softmax: bool = False) -> onnx.ModelProto:
    """x -> Conv 3x3 -> Relu -> y (all on the DPU), or -> Softmax -> y (the output on the CPU)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1] * 4),
             helper.make_node("Relu", ["c"], ["r" if softmax else out_name], name="relu")]
    if softmax:
        nodes.append(helper.make_node("Softmax", ["r"], [out_name], name="softmax", axis=1))
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])],
                              [helper.make_tensor_value_info(out_name, TensorProto.FLOAT, [batch, 8, 8, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _build(model, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # random calibration
        return tvm_dpu.build(model, arch="B4096", progress=False, **kw)


@pytest.fixture(scope="module")
def built():
    return _build(conv_model())


@pytest.fixture(scope="module")
def artifact(built, tmp_path_factory):
    return built.export(tmp_path_factory.mktemp("runner") / "conv.tvmdpu")


def _samples(n: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 3, 8, 8)).astype(np.float32)


def test_tensor_descriptions_carry_names_shapes_and_fix_points(built, artifact):
    (sg,) = built.runners.values()
    for model in (built, artifact):  # the fix_points survive export (artifact header)
        r = create_runner(model)
        assert r.get_input_tensors() == [TensorInfo("x", (1, 3, 8, 8), "float32", sg.sg.inputs[0].fix_point)]
        assert r.get_output_tensors() == [TensorInfo("y", (1, 8, 8, 8), "float32", sg.sg.outputs[0].fix_point)]
        r.close()


def test_execute_async_and_wait_float_and_int8(built):
    r = create_runner(built)
    (tin,), (tout,) = r.get_input_tensors(), r.get_output_tensors()
    x = _samples(1)
    want = built.run(x)[0]
    out = np.zeros(tout.shape, np.float32)
    job = r.execute_async([x], [out])
    assert r.wait(job) == 0
    np.testing.assert_array_equal(out, want)
    # int8 buffers: q = x * 2**fix_point; the DPU sees exactly the int8 values given
    q = np.clip(np.rint(x * 2.0 ** tin.fix_point), -128, 127).astype(np.int8)
    q_out = np.zeros(tout.shape, np.int8)
    r.wait(r.execute_async({"x": q}, {"y": q_out}))
    y = built.run(q.astype(np.float32) * 2.0 ** -tin.fix_point)[0]
    scaled = y * 2.0 ** tout.fix_point
    assert np.array_equal(scaled, np.rint(scaled))  # the DPU's int8 output, exactly representable
    np.testing.assert_array_equal(q_out, scaled.astype(np.int8))
    with pytest.raises(DPUError, match="not pending"):
        r.wait(job)  # a job is waited for once
    r.close()


def test_int8_buffer_of_a_cpu_tensor_is_refused():
    model = _build(conv_model(softmax=True))
    r = create_runner(model)
    assert r.get_output_tensors()[0].fix_point is None  # Softmax on the CPU: no int8 view
    with pytest.raises(InputError, match="'y' has no fix_point"):
        r.execute_async([_samples(1)], [np.zeros((1, 8, 8, 8), np.int8)])
    with pytest.raises(InputError, match=r"expected \(n, 3, 8, 8\)"):
        r.execute_async([np.zeros((1, 3, 8, 9), np.float32)])
    r.close()


def test_batch_handled_as_vart_does():
    """A batch-4 model takes any number of samples: fewer run as one padded batch, more as several batches."""
    model = _build(conv_model(batch=4), calibration=_samples(3))  # 3 batch-1 samples calibrate it
    r = create_runner(model)
    assert r.get_input_tensors()[0].batch == 4
    x = _samples(6, seed=2)
    (y,) = r.run([x])
    assert y.shape == (6, 8, 8, 8)
    first = model.run(x[:4])[0]
    rest = model.run(np.concatenate([x[4:], np.zeros((2, 3, 8, 8), np.float32)]))[0][:2]
    np.testing.assert_array_equal(y, np.concatenate([first, rest]))
    (one,) = r.run([x[:1]])
    np.testing.assert_array_equal(one, first[:1])
    r.close()


def test_calibration_regroups_batch_1_samples(tmp_path):
    """Batch-1 samples in an .npz (N, 3, 8, 8) or (N, 1, 3, 8, 8) calibrate a batch-4 model (no 'expected
    (4, 3, 8, 8)'); the last batch is filled with samples from the start, so the ranges are the samples' own."""
    x = _samples(5, seed=3)
    for arr in (x, x[:, None]):
        np.savez(tmp_path / "c.npz", x=arr)
        model = _build(conv_model(batch=4), calibration=str(tmp_path / "c.npz"))
        assert model.runners
    from tvm_dpu.quant.calib_data import calibration_batches
    from tvm_dpu.types import InputSpec

    batches = calibration_batches(x, [InputSpec("x", (4, 3, 8, 8))])
    assert [b[0].shape for b in batches] == [(4, 3, 8, 8)] * 2
    np.testing.assert_array_equal(batches[1][0], x[[4, 0, 1, 2]])


def test_threads_submit_and_wait_at_once(built):
    r = create_runner(built, num_threads=3)
    xs = [_samples(1, seed=10 + i) for i in range(12)]
    want = [built.run(x)[0] for x in xs]
    got: dict[int, np.ndarray] = {}

    def client(k: int) -> None:
        for i in range(k, 12, 4):
            got[i] = r.run([xs[i]])[0]

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    r.close()
    assert sorted(got) == list(range(12))
    for i in range(12):
        np.testing.assert_array_equal(got[i], want[i])


def test_xmodel_runner_int8_and_float():
    from tvm_dpu.xmodel.runner import load_xmodel

    xm = load_xmodel(XMODEL)
    r = create_runner(str(XMODEL))
    (tin,) = r.get_input_tensors()
    assert tin.fix_point is not None and tin.shape[0] == 1
    x = np.random.default_rng(4).uniform(0, 1, tin.shape).astype(np.float32)
    want = xm.run(x)
    got = r.run([x])
    assert [g.dtype for g in got] == [w.dtype for w in want]  # buffers in the model's own dtypes
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    q = np.clip(np.rint(x * 2.0 ** tin.fix_point), -128, 127).astype(np.int8)
    np.testing.assert_array_equal(r.run([q])[0], xm.run(q.astype(np.float32) * 2.0 ** -tin.fix_point)[0])
    r.close()


def test_benchmark_reports_parts_and_prediction(artifact, tmp_path, capsys):
    out = tmp_path / "b.json"
    assert main(["benchmark", str(artifact), "--threads", "2", "--runs", "3", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "runs/s" in text and "p99" in text and "dpu sg0" in text and "timing model" in text
    d = json.loads(out.read_text())
    assert d["jobs"] == 6 and d["threads"] == 2 and d["throughput_jobs_per_s"] > 0
    lat = d["latency_ms"]
    assert 0 < lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
    parts = {(p["kind"], p["name"]): p for p in d["parts"]}
    assert set(parts) == {("cpu", "start..sg0"), ("dpu", "sg0"), ("cpu", "sg0..end")}
    assert all(p["calls"] == 6 for p in parts.values())  # warm-up runs are not counted
    assert parts[("dpu", "sg0")]["predicted_ms"] == pytest.approx(d["predicted_dpu_latency_ms"]) and \
        d["predicted_dpu_latency_ms"] > 0


def test_benchmark_of_an_xmodel(capsys):
    assert main(["benchmark", str(XMODEL), "--runs", "2", "--warmup", "0"]) == 0
    text = capsys.readouterr().out
    assert "1 thread(s) x 2 run(s)" in text and "dpu subgraph_" in text


def test_wait_with_a_timeout_keeps_the_job_and_uint8_pixels_are_values(built):
    import time as _time

    r = create_runner(built)
    release = threading.Event()
    real_run = built.run

    def slow_run(*a, **k):
        release.wait(10)
        return real_run(*a, **k)

    r.model = type("Slow", (), {"run": staticmethod(slow_run)})()
    job = r.execute_async([_samples(1)])
    t0 = _time.perf_counter()
    with pytest.raises(TimeoutError):
        r.wait(job, timeout=0.05)
    assert _time.perf_counter() - t0 < 5
    release.set()
    assert r.wait(job) == 0  # still pending after the timeout, done now
    r.model = built
    pixels = np.random.default_rng(5).integers(0, 255, (1, 3, 8, 8), dtype=np.uint8)
    np.testing.assert_array_equal(r.run([pixels])[0], built.run(pixels.astype(np.float32))[0])
    r.close()
