"""The object `tvm_dpu.build` and `tvm_dpu.load` return: TVM's module (the CPU part, with every DPU partition's
program embedded by the BYOC codegen), the device the DPU partitions run on, and what reports and verification
need. One `run` executes both."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import tvm
from tvm import relax

from tvm_dpu.arch.arch import Arch
from tvm_dpu.errors import DPUError, RunError
from tvm_dpu.serving.feeds import arrays_by_name, check_array
from tvm_dpu.runtime.dispatch import use_device
from tvm_dpu.runtime.subgraph_runner import SubgraphRunner, VerifyResult
from tvm_dpu.types import InputSpec


@dataclass
class CompiledModel:
    """A model compiled for the DPU: `run(inputs) -> outputs` executes the CPU part in the Relax VM and every DPU
    partition on `device` (the emulator unless a board device was given). Safe to call from many threads: each
    thread gets its own VM, and the device serialises or separates what it must."""

    executable: Any  # tvm.relax.VMExecutable (built in this process) or tvm.runtime.Module (loaded)
    arch: Arch
    runners: dict[str, SubgraphRunner]  # partition symbol -> its compiled subgraph, for reports and verification
    inputs: list[InputSpec]
    partition_report: Any = None  # passes.PartitionReport
    subgraph_ids: dict[str, int] = field(default_factory=dict)  # symbol -> report subgraph id
    build_info: dict = field(default_factory=dict)
    #: The partitioned Relax module whose DPU functions carry their programs (before RunCodegen), kept so
    #: `export(cross=...)` can build the CPU part for the board; None for a model loaded from an artifact.
    relax_module: Any = None
    #: Model outputs (name, shape, dtype) when known (from `relax_module` or the artifact).
    outputs: list[InputSpec] = field(default_factory=list)
    #: The source model's node graph for reports: [{"name", "op", "inputs": [producer node names]}], or None.
    source_graph: list[dict] | None = None
    #: Where the DPU partitions run (None: an emulator of `arch`).
    device: Any = None
    #: Subgraphs run by custom-IP plugins: [{"symbol", "plugin", "version", "device", "nodes"}].
    plugin_subgraphs: list[dict] = field(default_factory=list)
    #: fix_point of each model input and output that a DPU subgraph reads or writes directly (name -> fix_point;
    #: x = q * 2**-fix_point), for int8 I/O; None: derived from `relax_module` when first asked.
    io_fix_points: dict[str, int] | None = None
    _verify: bool = False
    _lib: Any = None
    _local: threading.local = field(default_factory=threading.local, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    # -- deployment -----------------------------------------------------------------------------------------
    def export(self, path: Any, cross: str | None = None, verify_data: bool = True, sign: Any = None) -> Any:
        """Write the deployable one-file artifact (.tvmdpu); see `tvm_dpu.runtime.artifact_export.export`.
        `cross="aarch64"` adds the library cross-compiled for aarch64 Linux; `verify_data=False` omits the
        data only golden-reference verification needs; `sign` (an Ed25519 private key file) signs the file.
        A path ending in `.xmodel` writes AMD's XIR graph for VART instead (tvm_dpu.xmodel.write; none of the
        other options apply). Returns the path."""
        if str(path).lower().endswith(".xmodel"):
            if cross is not None or sign is not None:
                raise DPUError("an .xmodel export takes no cross= or sign= (VART loads the graph itself)")
            from tvm_dpu.xmodel.write import export_xmodel

            return export_xmodel(self, path)
        from tvm_dpu.runtime.artifact_export import export

        return export(self, path, cross=cross, verify_data=verify_data, sign=sign)

    @property
    def can_verify(self) -> bool:
        """Whether every DPU subgraph carries its quantized XGraph (needed by `set_verify`)."""
        return all(r.graph is not None for r in self.runners.values())

    def output_specs(self) -> list[InputSpec]:
        """Model outputs: `outputs` (named as the source model names them: `tvm_dpu.build` sets them from the ONNX
        graph; a pipeline stage names what it sends), else from the Relax module's return type (``output_<i>``)."""
        if self.outputs:
            return list(self.outputs)
        if self.relax_module is not None:
            specs = _specs_of(self.relax_module["main"].ret_ty)
            if specs is not None:
                return specs
        return list(self.outputs)

    def tensor_fix_points(self) -> dict[str, int]:
        """`io_fix_points`: for each model input a DPU subgraph reads and each output one writes (no CPU op
        between), the fix_point of that DPU tensor; other inputs and outputs are absent (float only)."""
        if self.io_fix_points is None:
            self.io_fix_points = _io_fix_points(self) if self.relax_module is not None else {}
        return dict(self.io_fix_points)

    # -- execution ----------------------------------------------------------------------------------------
    @property
    def library(self) -> Any:
        """TVM's runtime module of this model (the executable linked once, DPU programs inside)."""
        with self._lock:
            if self._lib is None:
                ex = self.executable
                self._lib = ex.jit() if isinstance(ex, relax.VMExecutable) else ex
            return self._lib

    @property
    def vm(self) -> relax.VirtualMachine:
        """This thread's Relax VM over `library` (a VM is not safe to share between threads)."""
        vm = getattr(self._local, "vm", None)
        if vm is None:
            vm = self._local.vm = relax.VirtualMachine(self.library, tvm.cpu())
        return vm

    def dpu_device(self) -> Any:
        """The device the DPU partitions run on (an emulator of `arch` unless one was given)."""
        with self._lock:
            if self.device is None:
                from tvm_dpu.runtime.device import emulator_device

                self.device = emulator_device(self.arch)
                for r in self.runners.values():
                    r.device = self.device
            return self.device

    def pin(self, device: Any) -> None:
        """Run every DPU partition on `device` from now on (a `VirtualDPU` core, a `CoreGroup`, a Pynq device,
        ...); its DPU fingerprint must be the model's."""
        if getattr(device, "arch", None) is None or int(device.arch.fingerprint) != int(self.arch.fingerprint):
            raise DPUError(f"device {device!r} is not a DPU of this model's arch {self.arch.name} "
                           f"(fingerprint {self.arch.fingerprint:#x})")
        with self._lock:
            self.device = device
            for r in self.runners.values():
                r.device = device

    def _listed_programs(self) -> frozenset[bytes] | None:
        """Digests of the DPU programs a loaded artifact's header lists (verified against its library at load):
        the only programs a run may execute. None for a model built in this process."""
        digests = [r.program_digest for r in self.runners.values()]
        return frozenset(digests) if digests and all(digests) else None

    def _feeds(self, inputs: Any) -> list[np.ndarray]:
        names = [s.name for s in self.inputs]
        arrays = arrays_by_name(inputs, names, "model inputs")
        return [check_array(s.name, a, s.shape) for s, a in zip(self.inputs, arrays)]

    def run(self, inputs: Any, *, timer: Any = None) -> list[np.ndarray]:
        """Run the whole model. `inputs`: dict name -> array, a list in input order, or one array. `timer`, when
        given, is called as timer(symbol, start, end) after each DPU partition call (time.perf_counter())."""
        feeds = [tvm.runtime.tensor(a) for a in self._feeds(inputs)]
        try:
            with use_device(self.dpu_device(), observer=self._observe if self._verify else None,
                            programs=self._listed_programs(), timer=timer):
                res = self.vm["main"](*feeds)
        except DPUError:
            raise
        except (RuntimeError, ValueError, TypeError, IndexError, KeyError) as e:
            # TVM's VM checks shapes and dtypes itself; its errors are about this model's inputs or library.
            raise RunError(f"running the model failed in TVM's VM: {type(e).__name__}: "
                           f"{' '.join(str(e).split())[:500]}") from None
        return _to_numpy(res)

    def set_verify(self, enabled: bool = True) -> None:
        """Run the golden reference beside every DPU subgraph call and record mismatches."""
        if enabled and not self.can_verify:
            from tvm_dpu.errors import ArtifactError

            if self.build_info.get("source") == "TVM exported library":  # runtime/library_file.py
                raise ArtifactError("a TVM exported library (.so) carries no verification data (the quantized "
                                    "XGraphs): verify the .tvmdpu artifact that tvm-dpu compile (or "
                                    "CompiledModel.export) writes")
            raise ArtifactError("this model has no verification data (exported with verify_data=False / "
                                "--no-verify-data): re-export it with verification data to verify")
        with self._lock:
            self._verify = enabled
            for r in self.runners.values():
                r.verify_results.clear()

    def _observe(self, symbol: str, program: Any, qin: list, qout: list) -> None:
        runner = self.runners.get(symbol)
        if runner is None or runner.graph is None:
            from tvm_dpu.errors import DPUError

            raise DPUError(f"verify: DPU partition {symbol} ran but this model has no verification data for it")
        result = runner.check(qin, qout)
        with self._lock:
            runner.verify_results.append(result)

    def verify_results(self) -> list[VerifyResult]:
        return [v for r in self.runners.values() for v in r.verify_results]

    # -- reporting ------------------------------------------------------------------------------------------
    def timing(self):
        """Timing model of every DPU subgraph on one core (tvm_dpu.runtime.model_timing; CPU time excluded)."""
        from tvm_dpu.runtime.model_timing import simulate_model

        return simulate_model(self)

    def report(self, timing: Any = True) -> dict:
        """Partition, instruction counts per subgraph, DDR footprint and, with `timing` (True, or a ModelTiming
        already computed by `timing()`), the timing model's cycles, latency, GOPS, engine utilisation and DDR
        traffic per subgraph and in total."""
        if timing is True:
            model_timing = self.timing() if self.runners else None
        else:
            model_timing = timing or None
        subgraphs = []
        for symbol, r in self.runners.items():
            sg = r.sg
            t = model_timing.subgraphs[symbol].summary() if model_timing is not None else None
            subgraphs.append({
                "symbol": symbol,
                "id": self.subgraph_ids.get(symbol),
                "ops": len(sg.op_ranges),
                "instructions": int(sum(sg.instr_counts.values())),
                "instruction_counts": dict(sorted(sg.instr_counts.items())),
                "code_bytes": int(sg.code.nbytes),
                "param_bytes": int(len(sg.params)),
                "ddr_bytes": {name: int(size) for name, size in _region_names(sg.region_sizes).items()},
                "inputs": [{"name": b.name, "shape": list(b.shape), "fix_point": b.fix_point} for b in sg.inputs],
                "outputs": [{"name": b.name, "shape": list(b.shape), "fix_point": b.fix_point} for b in sg.outputs],
                "timing": None if t is None else {
                    "cycles": t["cycles"], "latency_ms": t["latency_ms"], "gops": t["gops"],
                    "peak_utilisation": t["peak_utilisation"], "engine_utilisation": t["engine_utilisation"],
                    "ddr_read_bytes": t["ddr_read_bytes"], "ddr_write_bytes": t["ddr_write_bytes"]},
                "multicore": None if r.multicore is None else _multicore_json(r.multicore, self.arch),
            })
        subgraphs.sort(key=lambda d: (d["id"] is None, d["id"] if d["id"] is not None else 0, d["symbol"]))
        return {
            "arch": self.arch.name,
            "dpu": self.arch.dpu_name,
            "fingerprint": hex(self.arch.fingerprint),
            **self.io_json(),
            "partition": self.partition_report.to_json() if self.partition_report is not None else None,
            "subgraphs": subgraphs,
            "ddr_total_bytes": int(sum(sum(s["ddr_bytes"].values()) for s in subgraphs)),
            "plugin_subgraphs": list(self.plugin_subgraphs),
            "timing": None if model_timing is None else {
                **{k: v for k, v in model_timing.summary().items() if k != "subgraphs"},
                **self._multicore_latency(model_timing)},
            "build": self.build_info,
        }

    def io_json(self) -> dict:
        """{"inputs", "outputs"}: the model's tensors under their source names, with fix_points where known."""
        fps = self.tensor_fix_points()
        return {kind: [{"name": s.name, "shape": list(s.shape), "dtype": s.dtype,
                        **({"fix_point": fps[s.name]} if s.name in fps else {})} for s in specs]
                for kind, specs in (("inputs", self.inputs), ("outputs", self.output_specs()))}

    def _multicore_latency(self, model_timing: Any) -> dict:
        """Predicted DPU latency on one core and on the cores the model was compiled for (segments of a
        partition on their schedule, other partitions as one program), when any partition has segments. The
        headline `latency_ms`, `cycles` and `gops` are then the build's own configuration (its cores); the
        one-core figures stay beside them."""
        cores = max((r.multicore.cores for r in self.runners.values() if r.multicore is not None), default=1)
        if cores == 1:
            return {}
        multi = sum(r.multicore.cycles if r.multicore is not None else model_timing.subgraphs[sym].cycles
                    for sym, r in self.runners.items())
        ms = 1e3 / (self.arch.freq_mhz * 1e6)
        one = model_timing.summary()
        return {"cores": cores, "latency_ms": multi * ms, "cycles": multi,
                "gops": one["gops"] * model_timing.cycles / multi if multi else one["gops"],
                "latency_basis": f"{cores} cores: segments on their predicted schedule",
                "cycles_cores_1": model_timing.cycles, "gops_cores_1": one["gops"],
                "latency_ms_cores_1": model_timing.cycles * ms, f"latency_ms_cores_{cores}": multi * ms,
                "predicted_gain_percent": 100.0 * (1.0 - multi / model_timing.cycles) if model_timing.cycles else 0.0,
                "ddr_contention": "DDR bandwidth split evenly among the cores streaming at once "
                                  "(tvm_dpu.timing.multicore)"}

    def core_timelines(self) -> dict[str, dict]:
        """Per DPU partition with segments: its schedule as Chrome trace JSON, one Perfetto track per core."""
        from tvm_dpu.timing.multicore import Slot, schedule_trace

        out = {}
        for sym, r in self.runners.items():
            mc = r.multicore
            if mc is None:
                continue
            slots = [Slot(i, g.core, g.start, g.end) for i, g in enumerate(mc.segments)]
            names = [f"seg{i}: {' '.join(op for op, _, _ in g.sg.op_ranges)[:80]}" for i, g in enumerate(mc.segments)]
            out[sym] = schedule_trace(mc.cores, slots, names, self.arch.freq_mhz * 1e6,
                                      f"DPU {self.arch.name} x{mc.cores} cores")
        return out


def _multicore_json(mc: Any, arch: Arch) -> dict:
    """report.json view of a partition's segments and their schedule (per-core timelines in cycles)."""
    ms = 1e3 / (arch.freq_mhz * 1e6)
    return {"cores": mc.cores, "segments": len(mc.segments),
            "predicted_cycles": {"cores_1": mc.single_cycles, f"cores_{mc.cores}": mc.cycles},
            "predicted_latency_ms": {"cores_1": mc.single_cycles * ms, f"cores_{mc.cores}": mc.cycles * ms},
            "timeline": [{"core": c, "segments": [{"segment": i, "start_cycle": mc.segments[i].start,
                                                   "end_cycle": mc.segments[i].end,
                                                   "ops": [op for op, _, _ in mc.segments[i].sg.op_ranges]}
                                                  for i in order]}
                         for c, order in enumerate(mc.core_order())]}


#: Relax ops that only move values: a model output computed by them from a DPU tensor keeps its fix_point.
_SHAPE_ONLY_OPS = frozenset({"relax.reshape", "relax.permute_dims", "relax.squeeze", "relax.expand_dims",
                             "relax.flatten"})


def _io_fix_points(model: CompiledModel) -> dict[str, int]:
    """Walk `main` of the model's Relax module: a parameter passed straight to a DPU partition call takes that
    partition input's fix_point, a returned value produced by one (through shape-only ops at most) takes the
    output's (a tensor read at two fix_points has none)."""
    fn = model.relax_module["main"]
    params = {p: s.name for p, s in zip(fn.params, model.inputs)}
    made: dict[Any, Any] = {}  # var -> the DPU binding (sg tensor) it holds
    found: dict[str, set[int]] = {}
    for block in getattr(fn.body, "blocks", []):
        for b in block.bindings:
            v = b.value
            if isinstance(v, relax.Call) and isinstance(v.op, relax.GlobalVar) and v.op.name_hint in model.runners:
                sg = model.runners[v.op.name_hint].sg
                for arg, binding in zip(v.args, sg.inputs):
                    if arg in params:
                        found.setdefault(params[arg], set()).add(int(binding.fix_point))
                made[b.var] = sg.outputs[0] if len(sg.outputs) == 1 else tuple(sg.outputs)
            elif isinstance(v, relax.TupleGetItem) and isinstance(made.get(v.tuple_value), tuple):
                made[b.var] = made[v.tuple_value][int(v.index)]
            elif isinstance(v, relax.Var) and v in made:
                made[b.var] = made[v]
            elif isinstance(v, relax.Tuple):
                made[b.var] = tuple(made.get(f) for f in v.fields)
            elif isinstance(v, relax.Call) and getattr(v.op, "name", None) in _SHAPE_ONLY_OPS and v.args \
                    and not isinstance(made.get(v.args[0]), (tuple, type(None))):
                made[b.var] = made[v.args[0]]  # a CPU reshape / transpose keeps the values, so the fix_point
    body = fn.body.body
    results = list(body.fields) if isinstance(body, relax.Tuple) else [body]
    if len(results) == 1 and isinstance(made.get(results[0]), tuple):
        results = list(made[results[0]])  # a partition's tuple returned as is
    else:
        results = [made.get(r) for r in results]
    for spec, binding in zip(model.output_specs(), results):
        if binding is not None and not isinstance(binding, tuple):
            found.setdefault(spec.name, set()).add(int(binding.fix_point))
    return {name: next(iter(fps)) for name, fps in found.items() if len(fps) == 1}


def _specs_of(ty: Any) -> list[InputSpec] | None:
    fields = getattr(ty, "fields", None)
    if fields is not None:
        out = []
        for f in fields:
            sub = _specs_of(f)
            if sub is None:
                return None
            out.extend(sub)
        return [InputSpec(f"output_{i}", s.shape, s.dtype) for i, s in enumerate(out)]
    try:
        return [InputSpec("output_0", tuple(int(v) for v in ty.shape.values), str(ty.dtype))]
    except (AttributeError, TypeError, ValueError):
        return None


def _region_names(sizes: dict[int, int]) -> dict[str, int]:
    from tvm_dpu.types import REGION_NAMES

    return {REGION_NAMES.get(k, f"reg{k}"): v for k, v in sorted(sizes.items())}


def _to_numpy(res: Any) -> list[np.ndarray]:
    if isinstance(res, (list, tuple)) or type(res).__name__ in ("Array", "Tuple"):
        out = []
        for r in res:
            out.extend(_to_numpy(r))
        return out
    return [res.numpy()]
