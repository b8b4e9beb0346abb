"""The "ray" pipeline executor: one Ray actor per stage (pip install 'tvm-dpu[cluster]').

Cluster. With `address` (or `RAY_ADDRESS` in the environment) the engine joins that cluster and asks it for nothing
but what the stages need; a process already connected (`ray.init(...)` by the caller) is used as it is; otherwise
`ray.init()` starts a real local cluster offering one board resource per stage (Ray has no local mode any more).

Boards. Each stage takes one unit of `resource` (default "dpu_board") and, when the cluster advertises board kinds,
one unit of "<resource>:<kind>", the kind being the stage's FPGA part when the plan knows it (`--part`), else its
DPU arch: a board node is started with `ray start --resources='{"dpu_board": 1, "dpu_board:zu9eg": 1}'`. A plan
whose boards differ cannot run on a cluster that advertises no kinds (a stage could land on the wrong board) unless
`board_kinds=False`. The stages' bundles form one placement group in board order, STRICT_SPREAD (every stage on a
node of its own) when the cluster has a node per stage, PACK otherwise (`placement` overrides); a group the
cluster could hold but that is not granted within `acquire_timeout_s` (another pipeline holds the boards) is an
error naming what is missing, not a wait.

Failures. Actors restart up to `max_restarts` times (Ray re-runs their constructor in the same bundle). A frame is a
chain of actor calls, each taking the previous call's result (an ObjectRef, so tensors go from board to board
through Ray's object store); the driver keeps every frame's input until the frame is collected. When a stage's
actor dies, the driver waits for it to come back and replays every frame in flight from the first stage, in
order, so no frame is lost and the order holds (stages are stateless between frames, so a replay computes the same
bytes). An actor that cannot come back, a stage that raises, or a frame that takes longer than `timeout_s` is a
PipelineError naming the stage, its board and the frame. A node that dies (its raylet killed, the machine lost)
takes its stages' actors with it: Ray moves their bundles to another alive node with the same board resources
when one exists, the actors restart there and the frames in flight are replayed in order; when none exists, the
error names the stage, the node and the frame as soon as Ray reports the node dead (seconds: Ray's health check),
not after `start_timeout_s`.
"""
from __future__ import annotations

import os
import socket
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

DEFAULT_RESOURCE = "dpu_board"
#: Seconds between checks of a stage's node while its actor does not answer.
NODE_CHECK_S = 1.0
PLACEMENTS = ("auto", "strict_spread", "spread", "pack", "strict_pack")


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

    def ping(self) -> dict:
        import ray

        return {"where": self.where, "pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id()}

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


@dataclass
class _Frame:
    seq: int
    payload: dict  # the first stage's input, kept for a replay
    refs: list  # one ObjectRef per stage: that stage's output
    replays: int = 0


def board_kind(spec: Any) -> str:
    """The board kind a stage needs: its FPGA part when the plan records one, else its DPU arch."""
    return getattr(spec, "part", None) or spec.arch


class RayEngine:
    """Runs a PipelineModel's stages as Ray actors (see the module docstring).

    `address`: a cluster to join (default `RAY_ADDRESS`; neither: the cluster this process is connected to, or a
    new local one); `resource`: the board resource; `board_kinds`: "auto" (ask for "<resource>:<kind>" when the
    cluster advertises kinds), True (always) or False (never); `placement`: "auto" or a Ray placement strategy;
    `max_restarts`: restarts per stage actor, after which its stage fails the stream; `acquire_timeout_s`: how long
    to wait for busy boards; `start_timeout_s`: for the actors to load their artifacts; `timeout_s`: for one frame;
    `device` / `device_options`: what each actor drives ("emulator", or "pynq" on the boards)."""

    def __init__(self, pipe: Any, address: str | None = None, resource: str = DEFAULT_RESOURCE,
                 device: Any = "emulator", device_options: dict | None = None, trusted_keys: Any = None,
                 timeout_s: float = 600.0, init_options: dict | None = None, board_kinds: bool | str = "auto",
                 placement: str = "auto", max_restarts: int = 3, acquire_timeout_s: float = 10.0,
                 start_timeout_s: float = 300.0):
        from tvm_dpu.pipeline.stages import PipelineError

        try:
            import ray
        except ImportError:
            raise PipelineError("executor='ray' needs Ray: pip install 'tvm-dpu[cluster]'") from None
        if placement not in PLACEMENTS:
            raise PipelineError(f"placement {placement!r}: choose one of {', '.join(PLACEMENTS)}")
        if board_kinds not in ("auto", True, False):
            raise PipelineError(f"board_kinds {board_kinds!r}: choose 'auto', True or False")
        if int(max_restarts) < 0:
            raise PipelineError(f"max_restarts = {max_restarts}: must be at least 0")
        self.ray = ray
        self.timeout_s = float(timeout_s)
        self.max_restarts = int(max_restarts)
        self.start_timeout_s = float(start_timeout_s)
        #: Frames replayed after a stage's actor restarted (over the engine's life).
        self.replays = 0
        self._owns_cluster = self._connected = False
        self.actors: list = []
        self._pg: Any = None
        specs = [st.spec for st in pipe.stages]
        self.specs = [f"{s.board}, {s.arch}" for s in specs]
        kinds = [board_kind(s) for s in specs]
        n = len(specs)
        address = address or os.environ.get("RAY_ADDRESS") or None
        if not ray.is_initialized():
            if address is None:
                resources = {resource: n}
                if board_kinds is not False:
                    for k in kinds:
                        resources[f"{resource}:{k}"] = resources.get(f"{resource}:{k}", 0) + 1
                options = {"num_cpus": min(os.cpu_count() or 1, 4), "resources": resources,
                           "include_dashboard": False, "object_store_memory": 256 * 1024 * 1024,
                           "log_to_driver": False}
                options.update(init_options or {})
                ray.init(**options)
                self._owns_cluster = True
            else:
                # Joining a cluster: it has its own CPUs and resources, which Ray refuses to be told again.
                try:
                    ray.init(address=address, **(init_options or {}))
                except Exception as e:  # noqa: BLE001 - any failure to connect is the user's cluster address
                    raise PipelineError(f"cannot join the Ray cluster at {address!r}: "
                                        f"{' '.join(str(e).split())[:400]}") from None
                self._connected = True
        try:
            self._place(kinds, resource, board_kinds, placement, float(acquire_timeout_s))
            self._start(pipe, device, device_options, trusted_keys)
        except BaseException:
            self.close()
            raise

    # -- placement ----------------------------------------------------------------------------------------------
    def _place(self, kinds: list[str], resource: str, board_kinds: bool | str, placement: str,
               acquire_timeout_s: float) -> None:
        from ray.util.placement_group import placement_group, remove_placement_group

        from tvm_dpu.pipeline.stages import PipelineError

        ray, n = self.ray, len(kinds)
        total = ray.cluster_resources()
        if total.get(resource, 0) < n:
            raise PipelineError(f"the Ray cluster offers {total.get(resource, 0):g} {resource!r} resource(s); this "
                                f"pipeline has {n} stages, one per board (start each board's node with "
                                f"ray start --resources='{{\"{resource}\": 1}}')")
        advertised = sorted(k[len(resource) + 1:] for k in total if k.startswith(f"{resource}:"))
        if board_kinds == "auto":
            board_kinds = bool(advertised)
            if not board_kinds and len(set(kinds)) > 1:
                raise PipelineError(f"the stages need different boards ({', '.join(sorted(set(kinds)))}) but the Ray "
                                    f"cluster's nodes advertise no board kind, so a stage could land on the wrong "
                                    f"board: start each board's node with ray start --resources='{{\"{resource}\": "
                                    f"1, \"{resource}:{kinds[0]}\": 1}}' (or pass board_kinds=False to place stages "
                                    "on any board)")
        self.bundles = [{resource: 1.0, **({f"{resource}:{k}": 1.0} if board_kinds else {})} for k in kinds]
        if board_kinds:
            need: dict[str, int] = {}
            for k in kinds:
                need[k] = need.get(k, 0) + 1
            short = [f"stage(s) {[i for i, kk in enumerate(kinds) if kk == k]} need {c} {resource}:{k}, the "
                     f"cluster has {total.get(f'{resource}:{k}', 0):g}"
                     for k, c in need.items() if total.get(f"{resource}:{k}", 0) < c]
            if short:
                raise PipelineError(f"the Ray cluster lacks boards of the kinds this pipeline needs: {'; '.join(short)} "
                                    f"(kinds advertised: {', '.join(advertised) or 'none'})")
        board_nodes = [nd for nd in ray.nodes() if nd.get("Alive") and nd.get("Resources", {}).get(resource, 0) > 0]
        if placement == "auto":
            placement = "strict_spread" if len(board_nodes) >= n else "pack"
        elif placement == "strict_spread" and len(board_nodes) < n:
            raise PipelineError(f"placement 'strict_spread' puts each of the {n} stages on a node of its own; the "
                                f"Ray cluster has {len(board_nodes)} node(s) offering {resource!r}")
        self.placement = placement.upper()
        self._pg = placement_group(self.bundles, strategy=self.placement, name="")
        if not self._pg.wait(acquire_timeout_s):
            free = ray.available_resources()
            missing = [f"stage {i} ({self.specs[i]}): " + ", ".join(f"{k} (free {free.get(k, 0):g})" for k in b)
                       for i, b in enumerate(self.bundles)]
            remove_placement_group(self._pg)
            self._pg = None
            raise PipelineError(f"the Ray cluster's boards are busy: no {self.placement} placement of the {n} stages "
                                f"within {acquire_timeout_s:g} s (another pipeline or job holds them); the stages "
                                f"ask for {'; '.join(missing)}")

    def _start(self, pipe: Any, device: Any, device_options: dict | None, trusted_keys: Any) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from tvm_dpu.pipeline.stages import PipelineError

        ray = self.ray
        actor_cls = ray.remote(_StageActor)
        # The artifacts go into the object store once and the engine keeps their references: Ray re-runs a
        # restarted actor's constructor with its arguments, which it would otherwise have freed after the first.
        self._artifacts = []
        with tempfile.TemporaryDirectory(prefix="tvm_dpu_pipeline_") as tmp:
            for i, st in enumerate(pipe.stages):
                data = ray.put(stage_artifact_bytes(st, Path(tmp)))
                self._artifacts.append(data)
                strategy = PlacementGroupSchedulingStrategy(self._pg, placement_group_bundle_index=i)
                # The driver replays frames itself (in order); Ray retrying a task on its own would not keep it.
                self.actors.append(actor_cls.options(
                    num_cpus=0, resources=self.bundles[i], scheduling_strategy=strategy,
                    max_restarts=self.max_restarts, max_task_retries=0).remote(
                        st.spec.index, data, st.spec.to_json(), pipe.fix_points, device, dict(device_options or {}),
                        trusted_keys))
        self.where: list[str] = []
        self.nodes: list[str] = []
        for i, actor in enumerate(self.actors):
            try:
                info = ray.get(actor.ping.remote(), timeout=self.start_timeout_s)
            except Exception as e:  # noqa: BLE001 - a stage that cannot load its artifact, or never starts
                raise PipelineError(f"starting the stage actors failed: stage {i} ({self.specs[i]}): "
                                    f"{_cause_text(e)}") from None
            self.where.append(info["where"])
            self.nodes.append(info["node_id"])

    # -- frames -------------------------------------------------------------------------------------------------
    def _submit(self, frame: _Frame) -> None:
        ref: Any = frame.payload
        frame.refs = []
        for actor in self.actors:
            ref = actor.run.remote(frame.seq, ref)
            frame.refs.append(ref)

    def stream(self, payloads: Iterable[dict], max_in_flight: int) -> Iterator[dict]:
        from tvm_dpu.pipeline.stages import PipelineError

        if not self.actors:
            raise PipelineError("this pipeline's Ray executor is closed")
        # Frames still in flight when the stream stops (an error, or the consumer stopped) are left to finish:
        # cancelling queued actor calls breaks the actors' per-caller call ordering for later streams.
        pending: deque[_Frame] = deque()
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
            frame = _Frame(seq, payload, [])
            self._submit(frame)
            pending.append(frame)
            seq += 1
            if len(pending) >= max_in_flight:
                yield self._collect(pending)
        # Frames already in flight are valid: deliver them before reporting the bad one, as the local executor does.
        while pending:
            yield self._collect(pending)
        if bad_input is not None:
            raise bad_input

    def _collect(self, pending: deque) -> dict:
        """The oldest frame's output; a stage actor that died is waited for and every frame in flight replayed."""
        from tvm_dpu.pipeline.stages import PipelineError

        ray = self.ray
        frame = pending[0]
        while True:
            try:
                out = ray.get(frame.refs[-1], timeout=self.timeout_s)
                pending.popleft()
                return out
            except ray.exceptions.GetTimeoutError:
                stuck = self._first_unfinished(frame)
                raise PipelineError(f"frame {frame.seq}: stage {stuck} ({self.specs[stuck]}) gave no result within "
                                    f"{self.timeout_s:g} s (its actor is stuck or its node is gone)") from None
            except ray.exceptions.RayActorError:
                stage = self._failed_stage(frame)
                self._await_restart(stage, frame.seq)
                if frame.replays >= self.max_restarts + 1:
                    raise PipelineError(f"frame {frame.seq}: stage {stage} ({self.specs[stage]}) lost it "
                                        f"{frame.replays + 1} times (its actor keeps dying)") from None
                for f in pending:  # the restarted actor lost its queue; later stages' inputs may be gone too
                    f.replays += 1
                    self._submit(f)
                self.replays += len(pending)
            except ray.exceptions.RayTaskError as e:  # the stage raised: its PipelineError names stage and frame
                raise PipelineError(_cause_text(e)) from None
            except ray.exceptions.RayError as e:
                stage = self._failed_stage(frame)
                raise PipelineError(f"frame {frame.seq}: stage {stage} ({self.specs[stage]}): "
                                    f"{_cause_text(e)}") from None

    def _first_unfinished(self, frame: _Frame) -> int:
        ready, _ = self.ray.wait(list(frame.refs), num_returns=len(frame.refs), timeout=0)
        done = {r.hex() for r in ready}
        return next((i for i, r in enumerate(frame.refs) if r.hex() not in done), len(frame.refs) - 1)

    def _failed_stage(self, frame: _Frame) -> int:
        """The first stage whose output of `frame` is an error (the later stages only passed it on)."""
        for i, ref in enumerate(frame.refs):
            try:
                self.ray.get(ref, timeout=min(self.timeout_s, 60.0))
            except Exception:  # noqa: BLE001 - this stage's output is the error
                return i
        return len(frame.refs) - 1

    def _await_restart(self, stage: int, seq: int) -> None:
        """Wait for stage `stage`'s actor to answer again after it died: Ray restarts it in its bundle, on the same
        node, or, when that node is gone, on another node with the same board resources (Ray moves the bundle).
        With its node dead and no such node, the wait ends at once with an error naming stage, node and frame
        instead of lasting `start_timeout_s`."""
        from tvm_dpu.pipeline.stages import PipelineError

        ray = self.ray
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            try:
                # Short pings: between them the node's liveness is checked (a lost node is known in seconds).
                info = ray.get(self.actors[stage].ping.remote(),
                               timeout=max(0.5, min(NODE_CHECK_S, deadline - time.monotonic())))
                self.where[stage], self.nodes[stage] = info["where"], info["node_id"]
                return
            except ray.exceptions.ActorDiedError:
                raise PipelineError(f"frame {seq}: the Ray actor of stage {stage} ({self.specs[stage]}) died and "
                                    f"cannot restart (max_restarts={self.max_restarts} used up, or its node is "
                                    "gone); close() and load the pipeline again") from None
            except (ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError) as e:
                self._check_node(stage, seq)
                if time.monotonic() > deadline:
                    raise PipelineError(f"frame {seq}: the Ray actor of stage {stage} ({self.specs[stage]}) did not "
                                        f"come back within {self.start_timeout_s:g} s: {_cause_text(e)}") from None
                time.sleep(0.1)

    def _check_node(self, stage: int, seq: int) -> None:
        """PipelineError when stage `stage`'s node is dead and no other alive node can take its bundle (its board
        resources, on a node holding no other stage when the placement spreads them)."""
        from tvm_dpu.pipeline.stages import PipelineError

        nodes = self.ray.nodes()
        node = self.nodes[stage]
        if any(n.get("NodeID") == node and n.get("Alive") for n in nodes):
            return
        others = {self.nodes[j] for j in range(len(self.nodes)) if j != stage}
        spread = self.placement in ("STRICT_SPREAD", "SPREAD")
        bundle = self.bundles[stage]
        hosts = [n for n in nodes if n.get("Alive") and n.get("NodeID") != node
                 and not (spread and n.get("NodeID") in others)
                 and all(n.get("Resources", {}).get(k, 0) >= v for k, v in bundle.items())]
        if not hosts:
            need = ", ".join(f"{k}: {v:g}" for k, v in bundle.items())
            raise PipelineError(f"frame {seq}: stage {stage} ({self.specs[stage]}) lost its node {node[:12]} "
                                f"(Ray actor was on {self.where[stage]}): the node died and no other alive node "
                                f"offers {{{need}}} to restart the stage on; start one (ray start "
                                f"--address=... --resources=...) and load the pipeline again") from None

    def stats(self) -> list[dict]:
        """Per stage: frames run and seconds spent in them (measured in the actors, since their last start)."""
        from tvm_dpu.pipeline.stages import PipelineError

        out = []
        for i, actor in enumerate(self.actors):
            try:
                out.append(self.ray.get(actor.stats.remote(), timeout=self.timeout_s))
            except Exception as e:  # noqa: BLE001 - a gone actor: named
                raise PipelineError(f"stage {i} ({self.specs[i]}): no statistics: {_cause_text(e)}") from None
        return out

    def close(self) -> None:
        for a in self.actors:
            try:
                self.ray.kill(a)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.actors = []
        self._artifacts = []
        if self._pg is not None:
            from ray.util.placement_group import remove_placement_group

            try:
                remove_placement_group(self._pg)
            except Exception:  # noqa: BLE001 - the cluster is gone
                pass
            self._pg = None
        if self._owns_cluster or self._connected:
            self.ray.shutdown()
            self._owns_cluster = self._connected = False


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
