"""The object `tvm_dpu.build` returns: the CPU part as a Relax VM executable, every DPU subgraph compiled, one
`run` for both."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import tvm
from tvm import relax

from tvm_dpu.arch.arch import Arch
from tvm_dpu.runtime.subgraph_runner import SubgraphRunner, VerifyResult
from tvm_dpu.runtime.tvm_glue import register_packed


@dataclass(frozen=True)
class InputSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"


@dataclass
class CompiledModel:
    """A model compiled for the DPU: `run(inputs) -> outputs` executes the CPU part in the Relax VM and every DPU
    partition on the device (the emulator unless a board device was given)."""

    executable: Any  # tvm.relax.VMExecutable
    arch: Arch
    runners: dict[str, SubgraphRunner]  # partition symbol -> runner
    inputs: list[InputSpec]
    partition_report: Any = None  # passes.PartitionReport
    subgraph_ids: dict[str, int] = field(default_factory=dict)  # symbol -> report subgraph id
    build_info: dict = field(default_factory=dict)
    #: The lowered Relax module of the CPU part (with the DPU calls), kept so `export(cross=...)` can recompile it
    #: for the board; None for a model loaded from an artifact.
    cpu_module: Any = None
    #: Model outputs (name, shape, dtype) when known (from `cpu_module` or the artifact).
    outputs: list[InputSpec] = field(default_factory=list)
    #: The source model's node graph for reports: [{"name", "op", "inputs": [producer node names]}], or None.
    source_graph: list[dict] | None = None
    _vm: Any = None

    # -- deployment -----------------------------------------------------------------------------------------
    def export(self, path: Any, cross: str | None = None, verify_data: bool = True) -> Any:
        """Write the deployable one-file artifact (.tvmdpu); see `tvm_dpu.runtime.artifact.export`.
        `cross="aarch64"` adds the CPU library cross-compiled for aarch64 Linux; `verify_data=False` omits the
        data only golden-reference verification needs. Returns the path."""
        from tvm_dpu.runtime.artifact import export

        return export(self, path, cross=cross, verify_data=verify_data)

    @property
    def can_verify(self) -> bool:
        """Whether every DPU subgraph carries its quantized XGraph (needed by `set_verify`)."""
        return all(r.graph is not None for r in self.runners.values())

    def output_specs(self) -> list[InputSpec]:
        """Model outputs: from the lowered module's return type when present, else `outputs`."""
        if self.cpu_module is not None:
            specs = _specs_of(self.cpu_module["main"].ret_ty)
            if specs is not None:
                return specs
        return list(self.outputs)

    # -- execution ----------------------------------------------------------------------------------------
    def register_functions(self) -> None:
        """Register this model's DPU functions (must precede VM construction; the VM binds them then)."""
        for symbol, runner in self.runners.items():
            register_packed(symbol, runner.packed())

    @property
    def vm(self) -> relax.VirtualMachine:
        """The Relax VM running the CPU part; it calls this model's DPU runners."""
        if self._vm is None:
            self.register_functions()
            self._vm = relax.VirtualMachine(self.executable, tvm.cpu())
        return self._vm

    def _feeds(self, inputs: Any) -> list[np.ndarray]:
        if isinstance(inputs, Mapping):
            missing = [s.name for s in self.inputs if s.name not in inputs]
            if missing:
                raise ValueError(f"missing model input(s) {missing}; the model takes "
                                 f"{[(s.name, s.shape) for s in self.inputs]}")
            arrays = [inputs[s.name] for s in self.inputs]
        elif isinstance(inputs, np.ndarray) or not isinstance(inputs, Sequence):
            arrays = [inputs]
        else:
            arrays = list(inputs)
        if len(arrays) != len(self.inputs):
            raise ValueError(f"the model takes {len(self.inputs)} input(s) {[s.name for s in self.inputs]}, "
                             f"got {len(arrays)}")
        out = []
        for spec, a in zip(self.inputs, arrays):
            a = np.asarray(a, dtype=spec.dtype)
            if tuple(a.shape) != tuple(spec.shape):
                raise ValueError(f"input {spec.name!r} has shape {tuple(a.shape)}, expected {spec.shape}")
            out.append(np.ascontiguousarray(a))
        return out

    def run(self, inputs: Any) -> list[np.ndarray]:
        """Run the whole model. `inputs`: dict name -> array, a list in input order, or one array."""
        res = self.vm["main"](*[tvm.runtime.tensor(a) for a in self._feeds(inputs)])
        return _to_numpy(res)

    def set_verify(self, enabled: bool = True) -> None:
        """Run the golden reference beside every DPU subgraph call and record mismatches."""
        if enabled and not self.can_verify:
            from tvm_dpu.errors import ArtifactError

            raise ArtifactError("this model has no verification data (exported with verify_data=False / "
                                "--no-verify-data): re-export it with verification data to verify")
        for r in self.runners.values():
            r.verify = enabled
            r.verify_results.clear()

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
            })
        subgraphs.sort(key=lambda d: (d["id"] is None, d["id"] if d["id"] is not None else 0, d["symbol"]))
        return {
            "arch": self.arch.name,
            "dpu": self.arch.dpu_name,
            "fingerprint": hex(self.arch.fingerprint),
            "partition": self.partition_report.to_json() if self.partition_report is not None else None,
            "subgraphs": subgraphs,
            "ddr_total_bytes": int(sum(sum(s["ddr_bytes"].values()) for s in subgraphs)),
            "timing": None if model_timing is None else {
                k: v for k, v in model_timing.summary().items() if k != "subgraphs"},
            "build": self.build_info,
        }


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
