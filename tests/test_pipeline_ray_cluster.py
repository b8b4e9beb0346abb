"""The Ray executor against a real Ray cluster started here with `ray start --head` plus a second node with
resources of its own (tests/ray_cluster.py; only what this module started is stopped): joining it through
RAY_ADDRESS (the CLI included), mixed boards each placed on a node of its kind in a STRICT_SPREAD placement group,
a stage actor killed mid-stream (restarted, its frames replayed: none lost, order kept), restarts used up, busy
boards and a stuck frame, every error naming the stage. The cluster costs about 20 s to start: the default run
keeps one test (joining, placement, bit-exact stream); the others are slow."""
from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'tvm-dpu[cluster]')")

import tvm_dpu  # noqa: E402
from tvm_dpu import zoo  # noqa: E402
from tvm_dpu.pipeline import Board  # noqa: E402
from tvm_dpu.pipeline.model import PipelineError, PipelineModel  # noqa: E402
from tvm_dpu.pipeline.plan import board_ddr_bytes  # noqa: E402

from ray_cluster import LocalRayCluster, refresh_ray_auth  # noqa: E402

NAME = "resnet18"
#: Stage 0 runs on an Ultra96 (ZU3EG), stage 1 on a ZCU102 (ZU9EG): the head node is the ZU9EG board and the
#: second node the ZU3EG one, so placing stages in node order would put both on the wrong board.
BOARDS = [Board("board0", "ultra96", board_ddr_bytes("ultra96"), part="zu3eg"),
          Board("board1", "zcu102", board_ddr_bytes("zcu102"), part="zu9eg")]


@pytest.fixture(scope="module")
def starting():
    """The module's cluster, starting in the background while the models build (see `cluster`)."""
    if os.environ.get("RAY_ADDRESS"):
        pytest.skip("RAY_ADDRESS is set: these tests start and stop a cluster of their own")
    c = LocalRayCluster({"dpu_board": 1, "dpu_board:zu9eg": 1})
    try:
        c.start([{"dpu_board": 1, "dpu_board:zu3eg": 1}])
        yield c
    finally:
        if ray.is_initialized():
            ray.shutdown()
        c.wait_quietly()
        c.stop()


@pytest.fixture(scope="module")
def cluster(starting, saved):
    """The running cluster (two nodes), with RAY_ADDRESS naming it."""
    starting.wait()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_AUTH_MODE", "disabled")
        mp.setenv("RAY_ADDRESS", starting.address)
        refresh_ray_auth()
        yield starting
    refresh_ray_auth()  # as the environment was, for later in-process clusters


@pytest.fixture(scope="module")
def built(starting):
    """(frames, the single-board model, its outputs on them)."""
    frames = [zoo.random_input(NAME, reduced=True, seed=s) for s in range(8)]
    single = tvm_dpu.build(zoo.build_model(NAME, reduced=True), arch="zcu102", calibration=frames[:2], progress=False)
    return frames, single, [single.run(x) for x in frames]


@pytest.fixture(scope="module")
def frames(built):
    return built[0]


@pytest.fixture(scope="module")
def reference(built):
    return built[2]


@pytest.fixture(scope="module")
def saved(starting, built, tmp_path_factory):
    return PipelineModel.from_model(built[1], BOARDS).save(tmp_path_factory.mktemp("pipe"))


def _same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def _pid(engine, stage):
    return ray.get(engine.actors[stage].ping.remote(), timeout=30)["pid"]


def test_joins_ray_address_and_places_each_stage_on_its_board_kind(cluster, saved, frames, reference):
    pipe = PipelineModel.load(saved, executor="ray")
    try:
        outs = list(pipe.run_stream(frames, max_in_flight=3))
        assert len(outs) == len(frames) and all(_same(g, r) for g, r in zip(outs, reference))
        engine = pipe._engine_for_run()
        assert engine._connected and not engine._owns_cluster  # joined, did not start a cluster
        assert engine.placement == "STRICT_SPREAD"
        resources = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
        assert len(set(engine.nodes)) == 2  # one node per stage
        for node, kind in zip(engine.nodes, ("zu3eg", "zu9eg")):
            assert resources[node].get(f"dpu_board:{kind}") == 1  # each stage on a board of its kind
    finally:
        pipe.close()
    assert not ray.is_initialized()  # the engine left the cluster it joined


@pytest.mark.slow
def test_a_killed_stage_actor_restarts_and_its_frames_are_replayed(cluster, saved, frames, reference):
    pipe = PipelineModel.load(saved, executor="ray", max_restarts=2)
    try:
        engine = pipe._engine_for_run()
        before = _pid(engine, 1)
        got = []
        for out in pipe.run_stream(frames, max_in_flight=4):
            got.append(out)
            if len(got) == 1:  # frames 1..3 are in flight: stage 1's process dies under them
                os.kill(before, signal.SIGKILL)
        assert len(got) == len(frames) and all(_same(g, r) for g, r in zip(got, reference))  # none lost, in order
        assert engine.replays >= 1 and _pid(engine, 1) != before
        assert _same(pipe.run(frames[2]), reference[2])  # later streams run on the restarted actor
    finally:
        pipe.close()


@pytest.mark.slow
def test_a_stage_out_of_restarts_is_named(cluster, saved, frames):
    with PipelineModel.load(saved, executor="ray", max_restarts=0) as pipe:
        os.kill(_pid(pipe._engine_for_run(), 1), signal.SIGKILL)
        with pytest.raises(PipelineError, match=r"frame 0: the Ray actor of stage 1 \(board1, zcu102\) died and "
                           r"cannot restart"):
            list(pipe.run_stream(frames[:3], max_in_flight=2))


@pytest.mark.slow
def test_busy_boards_fail_in_seconds_naming_the_stages(cluster, saved, frames):
    with PipelineModel.load(saved, executor="ray") as holder:
        holder.run(frames[0])  # holds both boards
        other = PipelineModel.load(saved, executor="ray", acquire_timeout_s=2.0)
        t0 = time.monotonic()
        with pytest.raises(PipelineError, match=r"boards are busy: no STRICT_SPREAD placement of the 2 stages within "
                           r"2 s .*stage 0 \(board0, ultra96\): dpu_board \(free 0\), dpu_board:zu3eg"):
            other.run(frames[0])
        assert time.monotonic() - t0 < 20


@pytest.mark.slow
def test_a_stuck_frame_names_the_stage(cluster, saved, frames):
    with PipelineModel.load(saved, executor="ray", timeout_s=0.001) as pipe, \
            pytest.raises(PipelineError, match=r"frame 0: stage 0 \(board0, ultra96\) gave no result within 0.001 s"):
        pipe.run(frames[0])


@pytest.mark.slow
def test_missing_board_kind_is_refused_before_placing(cluster, built):
    boards = [Board("board0", "zcu102", board_ddr_bytes("zcu102"), part="zu7ev"), BOARDS[1]]
    pipe = PipelineModel.from_model(built[1], boards, executor="ray")
    with pytest.raises(PipelineError, match=r"lacks boards of the kinds .*stage\(s\) \[0\] need 1 dpu_board:zu7ev, "
                       r"the cluster has 0 \(kinds advertised: zu3eg, zu9eg\)"):
        pipe.run(np.zeros(pipe.inputs[0].shape, np.float32))
    assert not ray.is_initialized()


@pytest.mark.slow
def test_cli_run_joins_the_cluster_of_ray_address(cluster, saved, capsys):
    from tvm_dpu.cli import main

    assert main(["run", str(saved), "--executor", "ray"]) == 0
    assert "ran 2 stages with the ray executor" in capsys.readouterr().out


@pytest.mark.slow
def test_a_model_with_several_dpu_subgraphs_on_the_cluster(cluster):
    from pathlib import Path

    examples = Path(__file__).resolve().parent.parent / "examples"
    frames = [np.asarray(x)[None] for x in np.load(examples / "mixed_cnn_calib.npz")["input"][:4]]
    model = tvm_dpu.build(str(examples / "mixed_cnn.onnx"), arch="zcu102", calibration=frames[:2], progress=False)
    pipe = PipelineModel.from_model(model, BOARDS, executor="ray")
    try:
        outs = list(pipe.run_stream(frames, max_in_flight=2))
        assert all(_same(g, model.run(x)) for g, x in zip(outs, frames)) and len(outs) == len(frames)
    finally:
        pipe.close()
