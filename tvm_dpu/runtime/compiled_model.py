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
    _vm: Any = None

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
        for r in self.runners.values():
            r.verify = enabled
            r.verify_results.clear()

    def verify_results(self) -> list[VerifyResult]:
        return [v for r in self.runners.values() for v in r.verify_results]

    # -- reporting ------------------------------------------------------------------------------------------
    def report(self) -> dict:
        """Partition, instruction counts per subgraph, DDR footprint."""
        subgraphs = []
        for symbol, r in self.runners.items():
            sg = r.sg
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
            })
        subgraphs.sort(key=lambda d: (d["id"] is None, d["id"] if d["id"] is not None else 0, d["symbol"]))
        return {
            "arch": self.arch.name,
            "dpu": self.arch.dpu_name,
            "fingerprint": hex(self.arch.fingerprint),
            "partition": self.partition_report.to_json() if self.partition_report is not None else None,
            "subgraphs": subgraphs,
            "ddr_total_bytes": int(sum(sum(s["ddr_bytes"].values()) for s in subgraphs)),
            "build": self.build_info,
        }


def _region_names(sizes: dict[int, int]) -> dict[str, int]:
    from tvm_dpu.codegen.layout import REGION_NAMES

    return {REGION_NAMES.get(k, f"reg{k}"): v for k, v in sorted(sizes.items())}


def _to_numpy(res: Any) -> list[np.ndarray]:
    if isinstance(res, (list, tuple)) or type(res).__name__ in ("Array", "Tuple"):
        out = []
        for r in res:
            out.extend(_to_numpy(r))
        return out
    return [res.numpy()]
