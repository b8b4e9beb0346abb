"""The "ray" pipeline executor: one Ray actor per stage (pip install 'tvm-dpu[cluster]').

Each actor loads its stage's `.tvmdpu` artifact (sent as bytes; loaded with every artifact check) and drives its
board: the emulator by default, or `device="pynq"` on a cluster whose nodes are the boards. Actors ask for one
unit of a custom resource (`resource`, default "dpu_board") and no CPU, so on a real cluster each stage lands on a
node started with `ray start --resources='{"dpu_board": 1}'`; without an address, `ray.init()` starts a real local
cluster that offers one such unit per stage (Ray has no local mode any more).

A frame is a chain of actor calls, each taking the previous call's result (an ObjectRef, so tensors go from board
to board through Ray's object store, not through the driver). A stage's failure is raised by its actor as a
PipelineError naming the stage and frame; Ray hands it to every later call of that frame, and the driver raises
it when it collects that frame. Results are collected in frame order.
"""
from __future__ import annotations

import os
import socket
import tempfile
from collections import deque
from pathlib import Path
from typing import Any, Iterable, Iterator

DEFAULT_RESOURCE = "dpu_board"


class _StageActor:
    """One stage on one Ray worker (wrapped with ray.remote at engine start)."""

    def __init__(self, index: int, artifact: bytes, spec: dict, fix_points: dict, device: Any,
                 device_options: dict, trusted_keys: Any):
        from tvm_dpu.pipeline.stages import PipelineStage, StageSpec
        from tvm_dpu.runtime.artifact import load

        # The driver loaded these exact bytes under the trust policy (and checked them against the manifest): an
        # actor on another machine, whose config knows nothing of the driver's builds, trusts what the driver did,
        # and still checks signatures itself when keys are given.
        model = load(f"<stage {index} artifact>", device=device, trusted_keys=trusted_keys, data=artifact,
                     trust="unsigned", **device_options)
        self.stage = PipelineStage(StageSpec(**spec), model)
        self.fix_points = fix_points
        self.where = f"{socket.gethostname()}:{os.getpid()}"

    def ping(self) -> str:
        return self.where

    def stats(self) -> dict:
        return {**self.stage.stats(), "where": self.where}

    def run(self, seq: int, payload: dict) -> dict:
        from tvm_dpu.pipeline.stages import PipelineError

        try:
            return self.stage.run_payload(payload, self.fix_points)
        except Exception as e:  # noqa: BLE001 - re-raised with the stage's name for the driver
            s = self.stage.spec
            raise PipelineError(f"stage {s.index} ({s.board}, {s.arch}, Ray actor on {self.where}) failed on frame "
                                f"{seq}: {type(e).__name__}: {e}") from None


class RayEngine:
    """Runs a PipelineModel's stages as Ray actors. `address`: a cluster to join (None: join the one this process
    is connected to, or start a local cluster); `resource`: the custom resource each actor takes one unit of;
    `device` / `device_options`: what each actor drives ("emulator", or "pynq" on the boards); `timeout_s`: how
    long to wait for one frame before reporting the cluster stuck."""

    def __init__(self, pipe: Any, address: str | None = None, resource: str = DEFAULT_RESOURCE,
                 device: Any = "emulator", device_options: dict | None = None, trusted_keys: Any = None,
                 timeout_s: float = 600.0, init_options: dict | None = None):
        from tvm_dpu.pipeline.stages import PipelineError

        try:
            import ray
        except ImportError:
            raise PipelineError("executor='ray' needs Ray: pip install 'tvm-dpu[cluster]'") from None
        self.ray = ray
        self.timeout_s = float(timeout_s)
        self._owns_cluster = False
        n = len(pipe.stages)
        if not ray.is_initialized():
            if address is None:
                options = {"num_cpus": min(os.cpu_count() or 1, 4), "resources": {resource: n},
                           "include_dashboard": False, "object_store_memory": 256 * 1024 * 1024,
                           "log_to_driver": False}
                options.update(init_options or {})
                ray.init(**options)
                self._owns_cluster = True
            else:
                ray.init(address=address, **(init_options or {}))
        available = ray.cluster_resources().get(resource, 0)
        if available < n:
            raise PipelineError(f"the Ray cluster offers {available:g} {resource!r} resource(s); this pipeline has "
                                f"{n} stages, one per board (start each board's node with "
                                f"ray start --resources='{{\"{resource}\": 1}}')")
        actor_cls = ray.remote(_StageActor).options(num_cpus=0, resources={resource: 1})
        self.actors = []
        self.specs = [f"{st.spec.board}, {st.spec.arch}" for st in pipe.stages]
        with tempfile.TemporaryDirectory(prefix="tvm_dpu_pipeline_") as tmp:
            for st in pipe.stages:
                data = stage_artifact_bytes(st, Path(tmp))
                self.actors.append(actor_cls.remote(st.spec.index, data, st.spec.to_json(), pipe.fix_points,
                                                    device, dict(device_options or {}), trusted_keys))
        try:
            self.where = ray.get([a.ping.remote() for a in self.actors], timeout=self.timeout_s)
        except Exception as e:  # noqa: BLE001 - a stage that cannot load its artifact
            self.close()
            raise PipelineError(f"starting the stage actors failed: {_cause_text(e)}") from None

    def stream(self, payloads: Iterable[dict], max_in_flight: int) -> Iterator[dict]:
        # Frames still in flight when the stream stops (an error, or the consumer stopped) are left to finish:
        # cancelling queued actor calls breaks the actors' per-caller call ordering for later streams.
        pending: deque = deque()
        frames = iter(payloads)
        bad_input: BaseException | None = None
        seq = 0
        while True:
            try:
                payload = next(frames)
            except StopIteration:
                break
            except Exception as e:  # noqa: BLE001 - a bad frame: raised after the valid frames before it
                bad_input = e
                break
            ref: Any = payload
            for actor in self.actors:
                ref = actor.run.remote(seq, ref)
            pending.append((seq, ref))
            seq += 1
            if len(pending) >= max_in_flight:
                yield self._collect(*pending.popleft())
        # Frames already in flight are valid: deliver them before reporting the bad one, as the local executor does.
        while pending:
            yield self._collect(*pending.popleft())
        if bad_input is not None:
            raise bad_input

    def stats(self) -> list[dict]:
        """Per stage: frames run and seconds spent in them (measured in the actors)."""
        return self.ray.get([a.stats.remote() for a in self.actors], timeout=self.timeout_s)

    def _collect(self, seq: int, ref: Any) -> dict:
        from tvm_dpu.pipeline.stages import PipelineError

        try:
            return self.ray.get(ref, timeout=self.timeout_s)
        except self.ray.exceptions.GetTimeoutError:
            raise PipelineError(f"frame {seq}: no result within {self.timeout_s:g} s (a stage actor is stuck or "
                                "its node is gone)") from None
        except self.ray.exceptions.RayActorError:
            dead = self._dead_stages()
            which = ", ".join(f"stage {i} ({self.specs[i]})" for i in dead) or "a stage"
            raise PipelineError(f"frame {seq}: the Ray actor of {which} died (its process or node is gone); frames "
                                "in flight through it are lost: close() and load the pipeline again") from None
        except self.ray.exceptions.RayError as e:
            raise PipelineError(f"frame {seq}: {_cause_text(e)}") from None

    def _dead_stages(self) -> list[int]:
        dead = []
        for i, actor in enumerate(self.actors):
            try:
                self.ray.get(actor.ping.remote(), timeout=min(self.timeout_s, 10.0))
            except Exception:  # noqa: BLE001 - any failure to answer a ping: that stage is gone
                dead.append(i)
        return dead

    def close(self) -> None:
        for a in getattr(self, "actors", []):
            try:
                self.ray.kill(a)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.actors = []
        if self._owns_cluster:
            self.ray.shutdown()
            self._owns_cluster = False


def stage_artifact_bytes(stage: Any, tmp: Path) -> bytes:
    """The stage's artifact bytes: those checked when it was loaded (never the file read again), or the model
    exported to `tmp` when it was built in this process."""
    checked = getattr(stage, "artifact_bytes", None)
    if checked is not None:
        return checked
    path = stage.model.export(tmp / f"stage{stage.spec.index}.tvmdpu")
    return Path(path).read_bytes()


def _cause_text(e: BaseException) -> str:
    """The message of the exception behind a Ray error (a stage's PipelineError names the stage itself)."""
    cause = getattr(e, "cause", None)
    while cause is not None and getattr(cause, "cause", None) is not None:
        cause = cause.cause
    if cause is not None:
        return str(cause)
    return " ".join(str(e).split())[:800]
