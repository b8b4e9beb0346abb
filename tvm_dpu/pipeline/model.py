"""`PipelineModel`: a model cut into stages, one per board, run with frames pipelined across the boards.

    pipe = PipelineModel.from_model(compiled, boards=3, link="serial-8.5g")   # plan + per-stage compile
    pipe.run(x)                                    # one frame, bit-identical to compiled.run(x)
    for y in pipe.run_stream(frames, max_in_flight=4): ...   # outputs in frame order
    pipe.save("out/")                              # stage<i>.tvmdpu + pipeline.json
    PipelineModel.load("out/pipeline.json", executor="ray")

Executors (`executor=`): "local" (tvm_dpu.pipeline.local: a thread and a bounded queue per stage, each stage on
its own emulator or device; the default) and "ray" (tvm_dpu.pipeline.ray_executor: one Ray actor per stage).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from tvm_dpu.pipeline.plan import (Board, Plan, PlanError, board_ddr_bytes, default_link, load_link, plan_model,
                                   stage_times_ms)
from tvm_dpu.pipeline.stages import PipelineError, PipelineStage, StageSpec, compile_stages
from tvm_dpu.security.safe_io import read_regular
from tvm_dpu.types import InputSpec

FORMAT = "tvm-dpu-pipeline"
VERSION = 1
#: Detached Ed25519 signature of pipeline.json (the artifact signature trailer over the manifest's bytes).
SIGNATURE_FILE = "pipeline.sig"
#: A release version: dotted whole numbers ("3", "1.4", "2.0.11"), compared number by number.
RELEASE_VERSION = re.compile(r"\d{1,9}(\.\d{1,9}){0,3}")


def release_key(version: str, where: str = "release version") -> tuple[int, ...]:
    """The comparable form of a release version; PipelineError if it is not dotted whole numbers."""
    if not isinstance(version, str) or not RELEASE_VERSION.fullmatch(version):
        raise PipelineError(f"{where} {version!r:.40}: expected dotted whole numbers such as 3 or 1.4.2")
    return tuple(int(p) for p in version.split("."))


def release_of(version: str = "0") -> dict[str, str]:
    """The release identity written into pipeline.json (under its signature): `version` and the build time (UTC,
    from $SOURCE_DATE_EPOCH when set, so a reproducible build writes the same bytes)."""
    import datetime

    release_key(version)
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    try:
        when = datetime.datetime.fromtimestamp(int(epoch) if epoch else time.time(), datetime.timezone.utc)
    except (ValueError, OverflowError, OSError):
        raise PipelineError(f"SOURCE_DATE_EPOCH={epoch!r:.40} is not a time in seconds") from None
    return {"version": version, "built": when.strftime("%Y-%m-%dT%H:%M:%SZ")}
MAX_MANIFEST_BYTES = 64 << 20
EXECUTORS = ("local", "ray")


def boards_for(archs: Sequence[str] | str, n: int | None = None, ddr_bytes: int | None = None) -> list[Board]:
    """Boards of a pipeline: `archs` is one arch / board preset for all `n` boards or one per board; each board's
    DDR from its board preset (`links.json`) unless `ddr_bytes` is given."""
    if isinstance(archs, str):
        archs = [a.strip() for a in archs.split(",") if a.strip()]
    archs = list(archs)
    if n is None:
        n = len(archs)
    if n < 1:
        raise PlanError(f"boards = {n}: a pipeline needs at least one board")
    if len(archs) == 1:
        archs = archs * n
    if len(archs) != n:
        raise PlanError(f"{len(archs)} archs given for {n} boards: give one arch, or one per board")
    return [Board(f"board{i}", a, ddr_bytes if ddr_bytes is not None else board_ddr_bytes(a))
            for i, a in enumerate(archs)]


def _by_steps(model: Any) -> bool:
    """Whether `model` is split as a chain of CPU and DPU steps (`multi`): any number of DPU subgraphs other than
    one, or one whose CPU ops the single-subgraph split (`stages.main_layout`) cannot place."""
    if len(model.runners) != 1:
        return True
    from tvm_dpu.pipeline.stages import main_layout

    try:
        main_layout(model)
    except PlanError:
        return True
    return False


class PipelineModel:
    """A model cut into pipeline stages (see module docstring). Safe to call from many threads: every call of
    `run` / `run_stream` gets its own frames through the stages."""

    def __init__(self, stages: Sequence[PipelineStage], inputs: Sequence[InputSpec], plan: dict | None = None,
                 executor: str = "local", executor_options: dict | None = None):
        if executor not in EXECUTORS:
            raise PipelineError(f"executor {executor!r}: choose one of {', '.join(EXECUTORS)}")
        self.stages = list(stages)
        self.inputs = list(inputs)
        self.plan = plan or {}
        self.executor = executor
        self.executor_options = dict(executor_options or {})
        #: {"version", "built"} of the release this pipeline was loaded from (None: built in this process)
        self.release: dict[str, str] | None = None
        #: fix point of every tensor that crosses a link
        self.fix_points: dict[str, int] = {}
        for st in self.stages:
            self.fix_points.update(st.spec.wire_fix_points)
        self._check_chain()
        self._engine: Any = None
        self._engine_lock = threading.Lock()

    def _check_chain(self) -> None:
        have = {s.name for s in self.inputs}
        for st in self.stages:
            missing = [t for t in st.spec.inputs if t not in have]
            if missing:
                raise PipelineError(f"stage {st.spec.index} needs {missing}, which no earlier stage sends")
            have = set(st.spec.outputs)

    # -- construction --------------------------------------------------------------------------------------
    @classmethod
    def from_model(cls, model: Any, boards: int | Sequence[Board] = 2, link: str | None = None,
                   arch: Sequence[str] | str | None = None, ddr_bytes: int | None = None, fusion: str = "optimal",
                   executor: str = "local", host_cost: Any = True, **executor_options: Any) -> "PipelineModel":
        """Plan `model` (a `CompiledModel`; with several DPU subgraphs and CPU ops between them, see `multi`) over
        `boards` (a count of boards of `arch`,
        default the model's arch, or Board objects) with the link model `link`, and compile each stage for its
        board. `link`: a link model of links.json (default `plan.default_link(executor)`: Ray's object store
        over GbE for the Ray executor, the paper's serial link otherwise). `host_cost`: the host cost model the
        plan charges per stage (True: the measured one, tvm_dpu.timing.host; a `HostCost`; None: DPU and link
        time only)."""
        link = link or default_link(executor)
        if isinstance(boards, int):
            boards = boards_for(arch or model.arch.name, boards, ddr_bytes)
        if _by_steps(model):
            # several DPU subgraphs, CPU ops between them: steps costed by the same host cost model
            from tvm_dpu.pipeline.multi import plan_steps

            plan = plan_steps(model, boards, load_link(link), host_cost=host_cost)
        else:
            host = None
            if host_cost is not None and host_cost is not False:
                from tvm_dpu.pipeline.stages import host_terms
                from tvm_dpu.timing.host import load_host_cost

                host = host_terms(model, load_host_cost() if host_cost is True else host_cost)
            plan = plan_model(model, boards, load_link(link), host)
        return cls.from_plan(model, plan, fusion, executor, **executor_options)

    @classmethod
    def from_plan(cls, model: Any, plan: Plan, fusion: str = "optimal", executor: str = "local",
                  **executor_options: Any) -> "PipelineModel":
        if _by_steps(model):
            from tvm_dpu.pipeline.multi import compile_step_stages

            compiled = compile_step_stages(model, plan, fusion)
        else:
            compiled = compile_stages(model, plan, fusion)
        stages = [PipelineStage(spec, cm) for spec, cm in compiled]
        return cls(stages, model.inputs, plan.to_json(), executor, executor_options)

    # -- execution ------------------------------------------------------------------------------------------
    def _engine_for_run(self) -> Any:
        with self._engine_lock:
            if self._engine is None:
                if self.executor == "ray":
                    from tvm_dpu.pipeline.ray_executor import RayEngine

                    self._engine = RayEngine(self, **self.executor_options)
                else:
                    from tvm_dpu.pipeline.local import LocalEngine

                    self._engine = LocalEngine(self, **self.executor_options)
            return self._engine

    def _first_payload(self, frame: Any) -> dict[str, np.ndarray]:
        from tvm_dpu.serving.feeds import arrays_by_name, check_array

        names = [s.name for s in self.inputs]
        arrays = arrays_by_name(frame, names, "pipeline inputs")
        return {s.name: check_array(s.name, a, s.shape) for s, a in zip(self.inputs, arrays)}

    def run(self, inputs: Any) -> list[np.ndarray]:
        """One frame through every stage: the model's outputs (float32), bit-identical to the single-board run."""
        return next(iter(self.run_stream([inputs], max_in_flight=1)))

    def run_stream(self, frames: Iterable[Any], max_in_flight: int = 4) -> Iterator[list[np.ndarray]]:
        """Outputs of `frames` in order, with up to `max_in_flight` frames inside the pipeline at once. A stage
        that raises stops the stream with a PipelineError naming the stage and frame; frames before it are
        yielded, none after it."""
        if int(max_in_flight) < 1:
            raise PipelineError(f"max_in_flight = {max_in_flight}: must be at least 1")
        payloads = (self._first_payload(f) for f in frames)
        last = self.stages[-1].spec.outputs
        for out in self._engine_for_run().stream(payloads, int(max_in_flight)):
            yield [np.asarray(out[n]) for n in last]

    def stage_stats(self) -> list[dict]:
        """Per stage: {"stage", "runs", "busy_s"} counted where the stage runs (this process, or its Ray actor),
        since the executor started."""
        return self._engine_for_run().stats()

    def close(self) -> None:
        """Release the executor (stage threads, Ray actors); the model can run again afterwards."""
        with self._engine_lock:
            engine, self._engine = self._engine, None
        if engine is not None:
            engine.close()

    def __enter__(self) -> "PipelineModel":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- reporting ------------------------------------------------------------------------------------------
    def stage_periods_ms(self) -> list[tuple[float, float, float]]:
        """Per stage: (compute ms, send ms, period ms) under the plan's link model."""
        return stage_times_ms([st.spec.to_json() for st in self.stages], self.plan.get("link"))

    def table(self) -> str:
        """The stages as a text table: board, arch, ops, predicted ms, bytes sent, link ms."""
        rows = [f"{'stage':>5} {'board':<8} {'arch':<22} {'ops':>4}  {'first op':<22} {'last op':<22} "
                f"{'pred ms':>8} {'sent B':>9} {'link ms':>8}"]
        periods = self.stage_periods_ms()
        for st, (_, send, _) in zip(self.stages, periods):
            s = st.spec
            rows.append(f"{s.index:>5} {s.board:<8} {s.arch:<22} {len(s.ops):>4}  {s.ops[0][:22]:<22} "
                        f"{s.ops[-1][:22]:<22} {s.predicted_ms:>8.3f} {s.send_bytes:>9} {send:>8.3f}")
        worst = max(range(len(periods)), key=lambda i: periods[i][2])
        bottleneck = periods[worst][2]
        rows.append(f"bottleneck: stage {worst} ({bottleneck:.3f} ms per frame) -> predicted "
                    f"{1e3 / bottleneck if bottleneck > 0 else float('inf'):.1f} frames/s over link "
                    f"{self.plan.get('link')}; latency {sum(c + l for c, l, _ in periods):.3f} ms")
        if self.plan.get("bottleneck"):
            rows.append(f"planned with host time: {self.plan['fps']:.1f} frames/s, bottleneck {self.plan['bottleneck']}")
        return "\n".join(rows)

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION,
                "inputs": [{"name": s.name, "shape": list(s.shape), "dtype": s.dtype} for s in self.inputs],
                "plan": self.plan, "stages": [st.spec.to_json() for st in self.stages]}

    # -- files ----------------------------------------------------------------------------------------------
    def save(self, outdir: str | os.PathLike[str], sign: Any = None, verify_data: bool = True,
             release: str = "0") -> Path:
        """Write one artifact per stage (`stage<i>.tvmdpu`) and `pipeline.json` (stages, their files' sha256,
        the plan, the release identity: `release` version and build time) into `outdir`; returns the path of
        pipeline.json."""
        outdir = Path(outdir)
        outdir.mkdir(parents=True, exist_ok=True)
        doc = self.to_json()
        doc["release"] = release_of(release)
        for st, d in zip(self.stages, doc["stages"]):
            name = f"stage{st.spec.index}.tvmdpu"
            st.model.export(outdir / name, verify_data=verify_data, sign=sign)
            d["artifact"] = name
            d["sha256"] = hashlib.sha256((outdir / name).read_bytes()).hexdigest()
        path = outdir / "pipeline.json"
        manifest = (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()
        path.write_bytes(manifest)
        sig_path = outdir / SIGNATURE_FILE
        if sign is not None:
            # The manifest (stage order, wire fix points, each stage's sha256) is signed as one unit, so no stage
            # can be swapped, reordered or given other fix points without breaking the signature.
            from tvm_dpu.security import signing

            sig_path.write_bytes(signing.sign(manifest, sign)[len(manifest):])
        elif sig_path.exists():
            sig_path.unlink()  # a stale signature of an earlier save would not match this manifest
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str], executor: str = "local", device: Any = "emulator",
             device_options: dict | None = None, trusted_keys: Any = None, trust: str = "auto",
             min_release: str | None = None, **executor_options: Any) -> "PipelineModel":
        """Load a pipeline written by `save` (pipeline.json, or the directory holding it). Every stage artifact
        is checked against the sha256 pipeline.json records before it is loaded (and loaded with the usual
        artifact checks, signatures with `trusted_keys`). `device` / `device_options`: what runs each stage
        ("emulator", or "pynq" with e.g. bitfile=...): with the local executor here, with "ray" in each stage's
        actor (on its board), the driver then keeping emulator copies only to check the files."""
        from tvm_dpu.runtime.artifact import load as load_artifact

        from tvm_dpu.security.trust import configured_keys

        path = Path(path)
        if path.is_dir():
            path = path / "pipeline.json"
        keys = trusted_keys
        if keys is None and trust != "unsigned":  # a trusted-keys file makes the manifest's signature mandatory too
            keys = configured_keys()
        doc = read_pipeline_json(path, keys)
        if min_release is not None:
            release_key(min_release, "min_release")
            have = doc.get("release", {}).get("version")
            if have is None or release_key(have) < release_key(min_release):
                raise PipelineError(f"{path}: release {have or '(none recorded)'} is older than the required "
                                    f"{min_release}: refusing a downgrade")
        stages = []
        for d in doc["stages"]:
            file = path.parent / d["artifact"]
            try:
                data = read_regular(file, "artifact", PipelineError)
            except PipelineError as e:
                raise PipelineError(f"{path}: stage {d['index']}: {e}") from None
            if hashlib.sha256(data).hexdigest() != d["sha256"]:
                raise PipelineError(f"{path}: stage {d['index']}: {d['artifact']} does not match the sha256 "
                                    "pipeline.json records (modified or from another pipeline)")
            spec = StageSpec(index=d["index"], board=d["board"], arch=d["arch"], ops=d["ops"], inputs=d["inputs"],
                             outputs=d["outputs"], wire_fix_points=d["wire_fix_points"],
                             predicted_ms=d["predicted_ms"], send_bytes=d["send_bytes"], part=d.get("part"),
                             int8_io=d.get("int8_io"))
            # The bytes just checked are the bytes loaded (here and, for Ray, shipped to the actors): the file is
            # never read again, so replacing it after this check changes nothing.
            options = dict(device_options or {}) if executor == "local" else {}
            local = load_artifact(file, device=device if executor == "local" else "emulator",
                                  trusted_keys=trusted_keys, data=data, trust=trust, **options)
            stages.append(PipelineStage(spec, local, file, artifact_bytes=data))
        _check_wire_fix_points(path, stages)
        inputs = [InputSpec(i["name"], tuple(i["shape"]), i["dtype"]) for i in doc["inputs"]]
        if executor == "ray":
            executor_options.update(device=device, device_options=device_options or {}, trusted_keys=trusted_keys)
        pipe = cls(stages, inputs, doc["plan"], executor, executor_options)
        pipe.release = doc.get("release")
        return pipe


def _check_wire_fix_points(path: Path, stages: list[PipelineStage]) -> None:
    """PipelineError unless every wire fix point in pipeline.json is the one the sending stage's artifact and the
    receiving stage's artifact record for that tensor (their headers are covered by their own checksums, so an
    edited manifest cannot change how int8 on a link is read, signed or not)."""
    for st, nxt in zip(stages, stages[1:] + [None]):
        for who in (st, nxt):
            if who is None:
                continue
            fps = who.model.tensor_fix_points()
            for name, fp in st.spec.wire_fix_points.items():
                if name in fps and fps[name] != fp:
                    raise PipelineError(f"{path}: stage {st.spec.index} sends {name!r} at fix point {fp}, but stage "
                                        f"{who.spec.index}'s artifact records {fps[name]}: pipeline.json was edited "
                                        "or mixes pipelines")


def read_pipeline_json(path: Path, trusted_keys: Any = None) -> dict:
    """pipeline.json, checked against its schema (types, ranges, plain file names) before anything uses it. With
    `trusted_keys`, its detached signature (`pipeline.sig` beside it, written by `save(sign=...)`) must be valid
    and made by one of them; the bytes verified are the bytes parsed."""
    from tvm_dpu.schema import SchemaError, need_dict, need_int, need_list, need_str, parse_json

    raw = read_regular(path, "pipeline manifest", PipelineError)
    if trusted_keys is not None:
        from tvm_dpu.security import signing

        sig_path = path.parent / SIGNATURE_FILE
        if not os.path.lexists(sig_path):
            raise signing.SignatureError(f"{path}: the pipeline manifest is not signed ({SIGNATURE_FILE} is "
                                         "missing), and a signature is required")
        trailer = read_regular(sig_path, "signature", signing.SignatureError)
        raw = signing.verify(raw + trailer, trusted_keys, f"{path} (with {SIGNATURE_FILE})")
    try:
        doc = parse_json(raw, MAX_MANIFEST_BYTES)
    except SchemaError as e:
        raise PipelineError(f"{path}: not a pipeline file ({e})") from None
    try:
        need_dict(doc, "pipeline.json")
        if doc.get("format") != FORMAT:
            raise SchemaError(f"format must be {FORMAT!r}, got {doc.get('format')!r:.40}")
        need_int(doc.get("version"), "version", VERSION, VERSION)
        for i, spec in enumerate(need_list(doc.get("inputs"), "inputs")):
            need_dict(spec, f"inputs[{i}]")
            need_str(spec.get("name"), f"inputs[{i}].name")
            for j, d in enumerate(need_list(spec.get("shape"), f"inputs[{i}].shape")):
                need_int(d, f"inputs[{i}].shape[{j}]", 1, 1 << 31)
            if spec.get("dtype") != "float32":
                raise SchemaError(f"inputs[{i}].dtype must be 'float32'")
        stages = need_list(doc.get("stages"), "stages")
        if not stages:
            raise SchemaError("stages must not be empty")
        for i, d in enumerate(stages):
            where = f"stages[{i}]"
            need_dict(d, where)
            need_int(d.get("index"), f"{where}.index", i, i)
            for key in ("board", "arch", "artifact", "sha256"):
                need_str(d.get(key), f"{where}.{key}")
            if "part" in d:
                need_str(d["part"], f"{where}.part")
            if "int8_io" in d:
                io = need_dict(d["int8_io"], f"{where}.int8_io")
                need_str(io.get("symbol"), f"{where}.int8_io.symbol")
                for j, v in enumerate(need_list(io.get("args"), f"{where}.int8_io.args")):
                    need_str(v, f"{where}.int8_io.args[{j}]")
                for j, v in enumerate(need_list(io.get("outs"), f"{where}.int8_io.outs")):
                    need_int(v, f"{where}.int8_io.outs[{j}]", 0, 1 << 20)
            if Path(d["artifact"]).name != d["artifact"] or d["artifact"] in (".", ".."):
                raise SchemaError(f"{where}.artifact must be a file name beside pipeline.json, got "
                                  f"{d['artifact']!r:.60}")
            for key in ("ops", "inputs", "outputs"):
                for j, v in enumerate(need_list(d.get(key), f"{where}.{key}")):
                    need_str(v, f"{where}.{key}[{j}]")
            for name, fp in need_dict(d.get("wire_fix_points"), f"{where}.wire_fix_points").items():
                need_int(fp, f"{where}.wire_fix_points[{name!r}]", -64, 64)
            if not isinstance(d.get("predicted_ms"), (int, float)) or isinstance(d.get("predicted_ms"), bool):
                raise SchemaError(f"{where}.predicted_ms must be a number")
            need_int(d.get("send_bytes"), f"{where}.send_bytes", 0, 1 << 40)
        need_dict(doc.get("plan", {}), "plan")
        if "release" in doc:
            rel = need_dict(doc["release"], "release")
            need_str(rel.get("built"), "release.built")
            if not isinstance(rel.get("version"), str) or not RELEASE_VERSION.fullmatch(rel["version"]):
                raise SchemaError(f"release.version must be dotted whole numbers, got {rel.get('version')!r:.40}")
    except SchemaError as e:
        raise PipelineError(f"{path}: {e}") from None
    return doc
