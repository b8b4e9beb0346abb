"""Multi-board pipelines: stage models bit-identical to the single-board run (local and Ray executors),
streaming in order with bounded frames in flight, a failing stage named in the error with no hang, pipeline
files checked before use, the CLI, and design-space exploration."""
from __future__ import annotations

import json
import threading

import numpy as np
import pytest

import tvm_dpu
from tvm_dpu import zoo
from tvm_dpu.errors import DPUError
from tvm_dpu.pipeline import Board, PlanError
from tvm_dpu.pipeline.dse import algorithm1, device_budget, explore, resource_table
from tvm_dpu.pipeline.model import PipelineError, PipelineModel, boards_for

NAME = "resnet50"


@pytest.fixture(scope="module")
def frames():
    return [zoo.random_input(NAME, reduced=True, seed=s) for s in range(5)]


@pytest.fixture(scope="module")
def single(frames):
    return tvm_dpu.build(zoo.build_model(NAME, reduced=True), arch="zcu102", calibration=frames[:2], progress=False)


@pytest.fixture(scope="module")
def reference(single, frames):
    return [single.run(x) for x in frames]


@pytest.fixture(scope="module")
def pipe3(single):
    return PipelineModel.from_model(single, boards=3)


@pytest.fixture(scope="module")
def saved(pipe3, tmp_path_factory):
    return pipe3.save(tmp_path_factory.mktemp("pipe"))


def _same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def test_stages_cover_the_model_once_and_chain(pipe3, single):
    ops = [op for st in pipe3.stages for op in st.spec.ops]
    graph = next(iter(single.runners.values())).graph
    assert sorted(ops) == sorted(op.name for op in graph.ops) and len(ops) == len(set(ops))
    assert pipe3.stages[0].spec.inputs == [s.name for s in single.inputs]
    for a, b in zip(pipe3.stages, pipe3.stages[1:]):
        assert a.spec.outputs == b.spec.inputs  # what one stage sends is exactly what the next takes
        assert set(a.spec.wire_fix_points) == set(a.spec.outputs) and a.spec.send_bytes > 0
    assert pipe3.stages[-1].spec.send_bytes == 0 and pipe3.stages[-1].spec.wire_fix_points == {}


def test_local_stream_is_bit_identical_and_in_order(pipe3, frames, reference):
    outs = list(pipe3.run_stream(frames, max_in_flight=3))
    assert len(outs) == len(frames)
    for got, want in zip(outs, reference):
        assert _same(got, want)
    assert _same(pipe3.run(frames[1]), reference[1])


def test_concurrent_streams_and_close(single, frames, reference):
    pipe = PipelineModel.from_model(single, boards=2)
    results = {}

    def consume(k):
        order = [(k + i) % len(frames) for i in range(len(frames))]
        results[k] = (order, list(pipe.run_stream([frames[i] for i in order], max_in_flight=2)))

    threads = [threading.Thread(target=consume, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for order, outs in results.values():
        assert all(_same(o, reference[i]) for i, o in zip(order, outs))
    threads = list(pipe._engine_for_run()._threads)
    assert len(threads) == 2 and all(t.is_alive() for t in threads)  # one long-lived thread per stage
    pipe.close()
    assert not any(t.is_alive() for t in threads)
    assert _same(pipe.run(frames[0]), reference[0])  # runs again after close
    pipe.close()


def test_max_in_flight_bounds_frames_inside(pipe3, frames):
    pulled = []

    def source():
        for i, x in enumerate(frames):
            pulled.append(i)
            yield x

    for k in (1, 2):
        pulled.clear()
        for i, _ in enumerate(pipe3.run_stream(source(), max_in_flight=k)):
            assert len(pulled) <= i + 1 + k
    with pytest.raises(PipelineError, match="max_in_flight"):
        list(pipe3.run_stream(frames, max_in_flight=0))


def test_heterogeneous_boards_bit_identical(single, frames, reference):
    boards = boards_for("zcu102,ultra96,dnnvm-zu2")
    pipe = PipelineModel.from_model(single, boards)
    assert [st.model.arch.name for st in pipe.stages] == [b.load().name for b in boards]
    assert _same(pipe.run(frames[0]), reference[0])


@pytest.mark.parametrize("overlap,phase", [(False, "run_payload"), (True, "execute"), (True, "prepare"),
                                           (True, "finish")])
def test_failing_stage_stops_stream_naming_stage_and_frame(single, frames, reference, overlap, phase):
    # overlap: the stage double-buffered on three threads (each phase can fail); else one thread runs it whole
    pipe = PipelineModel.from_model(single, boards=3, overlap=overlap)
    stage = pipe.stages[1]
    original = getattr(stage, phase)
    seen = []

    def flaky(*args):
        seen.append(1)
        if len(seen) == 3:
            raise RuntimeError("DPU timeout (injected)")
        return original(*args)

    setattr(stage, phase, flaky)
    got = []
    with pytest.raises(PipelineError, match=r"stage 1 \(board1, zcu102\) failed on frame 2: RuntimeError: DPU "
                                            r"timeout \(injected\)"):
        for out in pipe.run_stream(frames, max_in_flight=2):
            got.append(out)
    assert len(got) == 2 and all(_same(g, r) for g, r in zip(got, reference))  # nothing lost or reordered
    setattr(stage, phase, original)
    assert _same(pipe.run(frames[3]), reference[3])  # the stages keep serving after a failed frame
    pipe.close()


def test_bad_frame_is_an_input_error(pipe3, frames):
    bad = np.zeros((1, 3, 32, 32), np.float32)
    got = []
    with pytest.raises(DPUError, match="input"):
        for out in pipe3.run_stream([frames[0], bad, frames[1]]):
            got.append(out)
    assert len(got) == 1


def _with_cpu_ends() -> "onnx.ModelProto":
    """Reduced ResNet-18 with a CPU op before its DPU part (Sigmoid: no exp on the DPU) and one after (Softmax)."""
    from onnx import helper

    m = zoo.build_model("resnet18", reduced=True)
    g = m.graph
    inp, out = g.input[0].name, g.output[0].name
    for n in g.node:
        n.input[:] = ["pre" if x == inp else x for x in n.input]
        n.output[:] = ["logits" if x == out else x for x in n.output]
    g.node.insert(0, helper.make_node("Sigmoid", [inp], ["pre"], name="pre_sigmoid"))
    g.node.append(helper.make_node("Softmax", ["logits"], [out], name="post_softmax", axis=1))
    return m


def test_cpu_ops_before_and_after_the_dpu_run_on_the_first_and_last_board(tmp_path):
    xs = [zoo.random_input("resnet18", reduced=True, seed=s) for s in range(3)]
    single = tvm_dpu.build(_with_cpu_ends(), arch="zcu102", calibration=xs[:2], progress=False)
    cpu = {n.name for n in single.partition_report.nodes if n.device != "dpu"}
    assert cpu == {"pre_sigmoid", "post_softmax"} and len(single.runners) == 1
    want = [single.run(x) for x in xs]
    for n in (1, 3):
        pipe = PipelineModel.from_model(single, boards=n)
        assert pipe.stages[0].spec.inputs == ["input"]
        assert pipe.stages[-1].model.output_specs()[0].shape == (1, 10)
        outs = list(pipe.run_stream(xs))
        assert all(_same(o, w) for o, w in zip(outs, want))
        np.testing.assert_allclose(outs[0][0].sum(), 1.0, rtol=1e-5)  # the softmax ran on the last board
        pipe.close()
    loaded = PipelineModel.load(pipe.save(tmp_path))
    assert _same(loaded.run(xs[1]), want[1])


def test_model_with_several_dpu_subgraphs_is_pipelined(model, calib):
    # tests/test_pipeline_multi.py covers these models; here: no longer refused, and exact
    mixed = tvm_dpu.build(model, arch="zcu102", calibration=calib, progress=False)
    assert len(mixed.runners) == 2
    with PipelineModel.from_model(mixed, boards=2) as pipe:
        assert _same(pipe.run(calib[1]), mixed.run(calib[1]))


def test_too_many_boards_and_unknown_board(single):
    n = len(next(iter(single.runners.values())).sg.op_ranges)
    with pytest.raises(PlanError, match="cannot fill"):
        PipelineModel.from_model(single, boards=n + 1)
    with pytest.raises(PlanError, match="DDR size unknown"):
        boards_for("B1152", 2)
    with pytest.raises(PlanError, match="one per board"):
        boards_for("zcu102,zcu104", 3)


def test_stage_memory_checked_against_board_ddr(single):
    with pytest.raises(PlanError, match="memory"):
        PipelineModel.from_model(single, boards=2, ddr_bytes=4096)


def test_save_load_round_trip_and_stage_artifacts_verify(saved, frames, reference):
    pipe = PipelineModel.load(saved)
    assert _same(pipe.run(frames[2]), reference[2])
    doc = json.loads(saved.read_text())
    assert [s["artifact"] for s in doc["stages"]] == ["stage0.tvmdpu", "stage1.tvmdpu", "stage2.tvmdpu"]
    stage1 = tvm_dpu.load(saved.parent / "stage1.tvmdpu")  # each stage is an ordinary artifact
    stage1.set_verify(True)
    x = [np.zeros(s.shape, np.float32) + 0.25 for s in stage1.inputs]
    stage1.run(x)
    assert [r.mismatches for r in stage1.verify_results()] == [0]


def test_save_is_deterministic(pipe3, tmp_path, monkeypatch):
    # pipeline.json records its build time (the release identity): fixed the reproducible-builds way
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1764633600")
    a = pipe3.save(tmp_path / "a")
    b = pipe3.save(tmp_path / "b")
    assert a.read_bytes() == b.read_bytes()
    for i in range(len(pipe3.stages)):
        assert (a.parent / f"stage{i}.tvmdpu").read_bytes() == (b.parent / f"stage{i}.tvmdpu").read_bytes()


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["stages"][0].update(artifact="../stage0.tvmdpu"), "file name beside pipeline.json"),
    (lambda d: d["stages"][1].update(sha256="0" * 64), "does not match the sha256"),
    (lambda d: d["stages"][1].update(index=7), r"stages\[1\].index"),
    (lambda d: d.update(format="other"), "format"),
    (lambda d: d["stages"][0]["wire_fix_points"].update(x=1000), "wire_fix_points"),
    (lambda d: d["stages"][2].update(artifact="missing.tvmdpu"), "missing"),
])
def test_tampered_pipeline_file_is_refused(saved, tmp_path, edit, message):
    import shutil

    for f in saved.parent.iterdir():
        shutil.copy(f, tmp_path / f.name)
    doc = json.loads(saved.read_text())
    edit(doc)
    (tmp_path / "pipeline.json").write_text(json.dumps(doc))
    with pytest.raises(PipelineError, match=message):
        PipelineModel.load(tmp_path / "pipeline.json")


def test_modified_stage_artifact_is_refused(saved, tmp_path):
    import shutil

    for f in saved.parent.iterdir():
        shutil.copy(f, tmp_path / f.name)
    data = bytearray((tmp_path / "stage1.tvmdpu").read_bytes())
    data[-10] ^= 1
    (tmp_path / "stage1.tvmdpu").write_bytes(bytes(data))
    with pytest.raises(PipelineError, match="stage 1: stage1.tvmdpu does not match"):
        PipelineModel.load(tmp_path)


# -- Ray executor: a real local Ray cluster -------------------------------------------------------------------
@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'tvm-dpu[cluster]')")
    ray.init(num_cpus=2, resources={"dpu_board": 4}, include_dashboard=False, log_to_driver=False,
             object_store_memory=128 * 1024 * 1024)
    yield ray
    ray.shutdown()


def test_ray_stream_bit_identical_and_errors_name_the_stage(ray_cluster, saved, frames, reference):
    pipe = PipelineModel.load(saved, executor="ray")
    try:
        outs = list(pipe.run_stream(frames, max_in_flight=2))
        assert all(_same(g, r) for g, r in zip(outs, reference)) and len(outs) == len(frames)
        engine = pipe._engine_for_run()
        assert len(engine.actors) == 3 and len(engine.where) == 3
        good = [pipe._first_payload(x) for x in frames[:2]]
        bad = {"input": np.zeros((1, 3, 8, 8), np.float32)}  # reaches stage 0's actor as it is
        got = []
        with pytest.raises(PipelineError, match=r"stage 0 \(board0, zcu102, Ray actor on .*\) failed on frame 2"):
            for out in engine.stream(good + [bad, good[0]], 2):
                got.append(out)
        assert len(got) == 2
        assert _same(pipe.run(frames[3]), reference[3])  # the actors survive a failed frame
    finally:
        pipe.close()


def _with_bad_frame(frames, at):
    """`frames` with a NaN frame at index `at` (refused when the stream reaches it, like any bad input)."""
    bad = np.full_like(frames[0], np.nan)
    return frames[:at] + [bad] + frames[at:]


@pytest.mark.parametrize("executor", ["local", "ray"])
def test_a_bad_frame_mid_stream_delivers_the_valid_frames_in_flight(request, executor, saved, frames, reference):
    if executor == "ray":
        request.getfixturevalue("ray_cluster")
    pipe = PipelineModel.load(saved, executor=executor)
    try:
        got = []
        with pytest.raises(DPUError, match="NaN"):
            for out in pipe.run_stream(_with_bad_frame(frames, 3), max_in_flight=3):
                got.append(out)
        # Every frame fed before the bad one is delivered, in order, before the error.
        assert len(got) == 3 and all(_same(g, r) for g, r in zip(got, reference))
        assert _same(pipe.run(frames[4]), reference[4])  # and the pipeline keeps working
    finally:
        pipe.close()


def test_a_killed_stage_actor_is_named_with_the_frame(ray_cluster, saved, frames):
    import ray

    pipe = PipelineModel.load(saved, executor="ray")
    try:
        pipe.run(frames[0])  # actors up
        engine = pipe._engine_for_run()
        ray.kill(engine.actors[1])
        with pytest.raises(PipelineError, match=r"frame 0: the Ray actor of stage 1 \(board1, zcu102\) died"):
            list(pipe.run_stream(frames[:2], max_in_flight=2))
    finally:
        pipe.close()


def test_ray_needs_the_board_resource(ray_cluster, saved):
    pipe = PipelineModel.load(saved, executor="ray", resource="fpga_that_nobody_has")
    with pytest.raises(PipelineError, match="offers 0 'fpga_that_nobody_has'"):
        pipe.run(np.zeros(pipe.inputs[0].shape, np.float32))


def test_ray_actor_that_cannot_load_is_reported(ray_cluster, saved):
    pipe = PipelineModel.load(saved, executor="ray", device="pynq")
    with pytest.raises(PipelineError, match="starting the stage actors failed"):
        pipe.run(np.zeros(pipe.inputs[0].shape, np.float32))


# -- CLI ---------------------------------------------------------------------------------------------------------
def test_cli_pipeline_run_report(tmp_path, frames, capsys):
    from tvm_dpu.cli import main

    onnx_path = zoo.save_model(NAME, tmp_path / "r.onnx", reduced=True)
    np.savez(tmp_path / "calib.npz", input=np.concatenate(frames[:2]))
    out = tmp_path / "out"
    assert main(["pipeline", str(onnx_path), "--arch", "zcu102", "--boards", "2", "--calib",
                 str(tmp_path / "calib.npz"), "-o", str(out), "-q"]) == 0
    text = capsys.readouterr().out
    assert "bit-identical to the single-board run" in text and "bottleneck: stage" in text
    assert {p.name for p in out.iterdir()} >= {"stage0.tvmdpu", "stage1.tvmdpu", "pipeline.json", "pipeline.html"}
    np.savez(tmp_path / "x.npz", input=frames[0])
    assert main(["run", str(out / "pipeline.json"), "--input", str(tmp_path / "x.npz"), "-o",
                 str(tmp_path / "y.npz")]) == 0
    assert "ran 2 stages with the local executor" in capsys.readouterr().out
    assert main(["report", str(out), "-o", str(tmp_path / "p.html")]) == 0
    html = (tmp_path / "p.html").read_text()
    assert "2-board pipeline" in html and "stage1.tvmdpu" in html
    assert main(["pipeline", str(onnx_path), "--boards", "2", "-o", str(out), "-q"]) == 2
    assert "either --arch" in capsys.readouterr().err
    assert main(["pipeline", str(onnx_path), "--arch", "zcu102", "--boards", "2", "--link", "wifi", "-o",
                 str(out), "-q"]) == 2
    assert "link 'wifi'" in capsys.readouterr().err


def test_cli_pipeline_with_parts_picks_boards_by_dse(tmp_path, capsys):
    from tvm_dpu.cli import main

    onnx_path = zoo.save_model(NAME, tmp_path / "r.onnx", reduced=True)
    assert main(["pipeline", str(onnx_path), "--part", "zu3eg,zu9eg", "--boards", "2", "-o", str(tmp_path / "o"),
                 "-q"]) == 0
    text = capsys.readouterr().out
    assert "zu3eg -> B" in text and "zu9eg -> B4096@300MHz" in text and "bit-identical" in text


def test_cli_dse(tmp_path, capsys):
    from tvm_dpu.cli import main

    onnx_path = zoo.save_model(NAME, tmp_path / "r.onnx", reduced=True)
    assert main(["dse", str(onnx_path), "--part", "zu3eg", "--json", str(tmp_path / "d.json"), "-q"]) == 0
    text = capsys.readouterr().out
    assert "Algorithm 1 (DSP only) would pick B1024" in text and "rank dpu" in text
    assert "zu3eg as its board (ultra96) builds it" in text and "287 MHz" in text
    rows = json.loads((tmp_path / "d.json").read_text())
    # a part alone is explored less its platform reserve (the shell's and interconnect's 17,110 LUT), at its
    # board's clock
    assert rows and all(r["lut"] <= 70560 - 17110 and r["dsp"] <= 360 and r["bram36k"] <= 216
                        and r["freq_mhz"] == 287 for r in rows)
    assert main(["dse", str(onnx_path), "--dsp", "50", "--bram", "10", "-q"]) == 2
    assert "no DPU configuration fits" in capsys.readouterr().err


# -- design-space exploration -----------------------------------------------------------------------------------
def test_algorithm1_doubles_to_and_ti_within_the_dsp_budget():
    # To x Ti <= 2 x DSP: 98 DSP -> 128 MACs (none of the DPUs is that small), 194 -> 256 = B512,
    # 360 -> 512 = B1024 (PP 8 x 8 x 8), 2520 -> 4096 = B4096 (largest: 2048 MACs).
    assert algorithm1(60) is None
    assert algorithm1(194) == "B512"
    assert algorithm1(360) == "B1024"
    assert algorithm1(2520) == "B4096"


def test_explore_respects_the_budget_and_ranks_by_throughput(single):
    table = resource_table()
    assert set(table) == {"B512", "B800", "B1024", "B1152", "B1600", "B2304", "B3136", "B4096"}
    budget = device_budget("zu3eg")
    cands = explore(single, budget["dsp"], budget["bram36k"], budget["lut"])
    for c in cands:
        cost = table[c.dpu]
        assert c.dsp == c.cores * cost["dsp"] <= budget["dsp"]
        assert c.bram36k <= budget["bram36k"] and c.lut <= budget["lut"]
    assert [c.fps for c in cands] == sorted((c.fps for c in cands), reverse=True)
    big = explore(single, *[device_budget("zu9eg")[k] for k in ("dsp", "bram36k", "lut")])
    assert big[0].fps >= cands[0].fps  # a larger budget never predicts less
    one = [c for c in cands if c.cores == 1]
    assert {c.dpu for c in one} == {"B512", "B800", "B1024", "B1152", "B1600"}  # B2304 needs 386 DSP > 360
    slow_ddr = explore(single, budget["dsp"], budget["bram36k"], ddr_bytes_per_s=1e6)
    # One core is already slowed by the DDR in the timing model; several cores cannot share more than it gives.
    multi = [c for c in slow_ddr if c.cores > 1]
    assert multi and all(c.ddr_bound and c.fps == pytest.approx(1e6 / c.ddr_bus_bytes_per_frame) for c in multi)
    assert all(c.ddr_bus_bytes_per_frame >= c.ddr_bytes_per_frame for c in multi)  # overheads never save bytes
    with pytest.raises(PlanError, match="no DPU configuration fits"):
        explore(single, 10, 10)


def test_stages_pass_int8_through_as_a_board_does(single, saved, frames, reference, monkeypatch):
    """Only the first stage quantizes (the float input) and only the last dequantizes (the model output); between
    them the DPU's int8 goes over the link and into the next DPU as it is, with no Relax VM call, in a pipeline
    built here and one loaded from its files (which record the int8 form in pipeline.json)."""
    from tvm_dpu.runtime import compiled_model, subgraph_runner

    calls = {"quantize": 0, "dequantize": 0, "vm": 0}

    def count(name, fn):
        def wrapped(*a, **k):
            calls[name] += 1
            return fn(*a, **k)
        return wrapped

    monkeypatch.setattr(subgraph_runner, "quantize_tensor", count("quantize", subgraph_runner.quantize_tensor))
    monkeypatch.setattr(subgraph_runner, "dequantize_tensor", count("dequantize", subgraph_runner.dequantize_tensor))
    monkeypatch.setattr(compiled_model.CompiledModel, "run", count("vm", compiled_model.CompiledModel.run))
    for pipe in (PipelineModel.from_model(single, boards=3), PipelineModel.load(saved)):
        assert all(st.int8_path() is not None for st in pipe.stages)
        assert all(st.spec.int8_io is not None for st in pipe.stages)
        payload = pipe._first_payload(frames[0])
        for st in pipe.stages[:-1]:
            payload = st.run_payload(payload, pipe.fix_points)
            assert all(a.dtype == np.int8 for a in payload.values())  # int8 over every link
        for k in calls:
            calls[k] = 0
        with pipe:
            got = list(pipe.run_stream(frames, max_in_flight=3))
        assert all(_same(g, r) for g, r in zip(got, reference))
        assert calls == {"quantize": len(frames), "dequantize": len(frames), "vm": 0}


def test_int8_form_that_does_not_match_the_stage_is_refused(saved, tmp_path):
    import shutil

    for f in saved.parent.iterdir():
        shutil.copy(f, tmp_path / f.name)
    doc = json.loads((tmp_path / "pipeline.json").read_text())
    doc["stages"][1]["int8_io"]["args"] = ["no_such_input"]
    (tmp_path / "pipeline.json").write_text(json.dumps(doc))
    pipe = PipelineModel.load(tmp_path / "pipeline.json")
    with pytest.raises(PipelineError, match="int8_io .* does not match the stage's model"):
        pipe.stages[1].int8_path()


def test_double_buffered_stage_overlaps_host_and_dpu(single, frames, reference):
    """A stage that passes int8 through runs its host phases beside its DPU (as a board's ARM cores do): with a
    DPU phase and a host phase of 60 ms each, 6 frames take about 7 x 60 ms, not 12 x 60 ms; bit-identical and in
    order either way."""
    import time

    def slow(pipe):
        st = pipe.stages[0]
        prepare, execute = st.prepare, st.execute

        def slow_prepare(*a):
            time.sleep(0.06)
            return prepare(*a)

        def slow_execute(*a):
            time.sleep(0.06)
            return execute(*a)

        st.prepare, st.execute = slow_prepare, slow_execute
        st.run_payload = lambda payload, fp: st.finish((slow_execute(r := slow_prepare(payload, fp)), r)[1])
        return pipe

    walls = {}
    for overlap in (False, True):
        pipe = slow(PipelineModel.from_model(single, boards=1, overlap=overlap))
        assert pipe.stages[0].phased()
        list(pipe.run_stream(frames[:1]))  # threads started, libraries linked
        t0 = time.perf_counter()
        got = list(pipe.run_stream(frames, max_in_flight=4))
        walls[overlap] = time.perf_counter() - t0
        assert all(_same(g, r) for g, r in zip(got, reference))
        pipe.close()
    assert walls[False] >= 10 * 0.06  # one thread: host and DPU in turn
    assert walls[True] < walls[False] - 3 * 0.06  # three threads: the sleeps overlap
