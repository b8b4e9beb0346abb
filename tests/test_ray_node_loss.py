"""A Ray node lost mid-stream (its raylet and the workers under it SIGKILLed, as when the board's machine dies), on a real local cluster of
three nodes started here (tests/ray_cluster.py): a head with the ZCU102-kind board and two nodes with the
Ultra96 kind. The node holding stage 0 dies: the stage restarts on the spare node of its kind and every frame
comes out, in order, bit-identical to the single-board run. Then that node dies too: no node of the kind is
left, and the stream stops with one error naming the stage, the node and the frame (detected through Ray's node
health check, not the 300 s start timeout). Slow: three `ray start`s and two node deaths."""
from __future__ import annotations

import os
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

pytestmark = pytest.mark.slow
NAME = "resnet18"
BOARDS = [Board("board0", "ultra96", board_ddr_bytes("ultra96"), part="zu3eg"),
          Board("board1", "zcu102", board_ddr_bytes("zcu102"), part="zu9eg")]
ZU3EG = {"dpu_board": 1, "dpu_board:zu3eg": 1}


def _node_port(node_id: str) -> int:
    return next(int(n["NodeManagerPort"]) for n in ray.nodes() if n["NodeID"] == node_id)


def test_a_lost_node_fails_over_to_a_spare_board_then_is_named_when_none_is_left(tmp_path, monkeypatch):
    if os.environ.get("RAY_ADDRESS"):
        pytest.skip("RAY_ADDRESS is set: this test starts and stops a cluster of its own")
    cluster = LocalRayCluster({"dpu_board": 1, "dpu_board:zu9eg": 1})
    try:
        cluster.start([ZU3EG, ZU3EG])
        frames = [zoo.random_input(NAME, reduced=True, seed=s) for s in range(12)]
        single = tvm_dpu.build(zoo.build_model(NAME, reduced=True), arch="zcu102", calibration=frames[:2],
                               progress=False)
        reference = [single.run(x) for x in frames]
        saved = PipelineModel.from_model(single, BOARDS).save(tmp_path / "pipe")
        cluster.wait()
        monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
        monkeypatch.setenv("RAY_ADDRESS", cluster.address)
        refresh_ray_auth()
        with PipelineModel.load(saved, executor="ray", start_timeout_s=300.0) as pipe:
            engine = pipe._engine_for_run()
            assert engine.placement == "STRICT_SPREAD"
            first = engine.nodes[0]
            outs, t0 = [], None
            for i, y in enumerate(pipe.run_stream(frames, max_in_flight=3)):
                outs.append(y)
                if i == 1:  # frames 2.. are in flight: the node of stage 0 dies under them
                    cluster.kill_node(_node_port(first))
                    t0 = time.monotonic()
            assert len(outs) == len(frames)
            assert all(len(a) == len(b) and all(np.array_equal(p, q) for p, q in zip(a, b))
                       for a, b in zip(outs, reference))
            assert engine.replays > 0 and engine.nodes[0] != first  # restarted on the spare ZU3EG node
            print(f"failover: the last {len(frames) - 2} frames out {time.monotonic() - t0:.1f} s after the kill")
            second = engine.nodes[0]
            cluster.kill_node(_node_port(second))
            t0 = time.monotonic()
            with pytest.raises(PipelineError) as err:
                list(pipe.run_stream(frames[:4], max_in_flight=2))
            print(f"no spare left: error after {time.monotonic() - t0:.1f} s: {err.value}")
        text = str(err.value)
        assert "stage 0" in text and second[:12] in text and "frame" in text
        assert "no other alive node" in text and "dpu_board:zu3eg" in text
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.wait_quietly()
        cluster.stop()
        refresh_ray_auth()
