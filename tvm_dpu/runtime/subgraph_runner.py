"""Running one compiled DPU subgraph from float tensors: quantize, place in DDR, execute, read back, dequantize.

This is the body of the packed function the Relax VM calls for every DPU partition (R.call_dps_packed): the VM
hands float32 inputs and pre-allocated float32 outputs; the DPU computes in int8 with power-of-two scales.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tvm_dpu.types import CompiledSubgraph
from tvm_dpu.quant.fixpoint import dpu_round
from tvm_dpu.xgraph.graph import Graph


def quantize_tensor(x: np.ndarray, fix_point: int) -> np.ndarray:
    """float -> int8 with value = q * 2**-fix_point (DPURound, saturate)."""
    return dpu_round(np.asarray(x, dtype=np.float64) * (2.0 ** fix_point))


def dequantize_tensor(q: np.ndarray, fix_point: int) -> np.ndarray:
    return np.asarray(q, dtype=np.float32) * np.float32(2.0 ** -fix_point)


@dataclass
class VerifyResult:
    """Golden reference vs device for one call of one subgraph."""

    subgraph: str
    mismatches: int
    elements: int
    first: list[str] = field(default_factory=list)  # e.g. "op 'conv1': 3 of 4096 elements differ"


class SubgraphRunner:
    """Executes `sg` on `device`; `graph` (the quantized XGraph) is only used by verify mode."""

    def __init__(self, sg: CompiledSubgraph, device, graph: Graph | None = None,
                 output_shapes: list[tuple[int, ...]] | None = None):
        self.sg = sg
        self.device = device
        self.graph = graph
        self.output_shapes = output_shapes or [b.shape for b in sg.outputs]
        self.calls = 0
        self.verify = False
        self.verify_results: list[VerifyResult] = []

    def run_int8(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """int8 NCHW inputs -> int8 NCHW outputs, through DDR and the device."""
        regions = self.sg.new_regions()
        for b, x in zip(self.sg.inputs, inputs):
            b.fmap.to_ddr(regions[b.fmap.reg_id], np.asarray(x).reshape(b.shape))
        self.device.execute(self.sg, regions)
        return [b.fmap.from_ddr(regions[b.fmap.reg_id]) for b in self.sg.outputs]

    def run_float(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """float inputs (any shape with the right element count) -> float outputs in the Relax output shapes."""
        self.calls += 1
        if len(inputs) != len(self.sg.inputs):
            raise ValueError(f"DPU subgraph {self.sg.name!r} takes {len(self.sg.inputs)} inputs, got {len(inputs)}")
        qin = [quantize_tensor(np.asarray(x).reshape(b.shape), b.fix_point) for b, x in zip(self.sg.inputs, inputs)]
        qout = self.run_int8(qin)
        if self.verify:
            self._verify(qin, qout)
        return [dequantize_tensor(q, b.fix_point).reshape(s)
                for q, b, s in zip(qout, self.sg.outputs, self.output_shapes)]

    def _verify(self, qin: list[np.ndarray], qout: list[np.ndarray]) -> None:
        from tvm_dpu.xgraph.golden import run_graph

        assert self.graph is not None, "verify needs the quantized XGraph"
        golden = run_graph(self.graph, {b.name: q for b, q in zip(self.sg.inputs, qin)})
        bad = 0
        total = 0
        notes = []
        for b, q in zip(self.sg.outputs, qout):
            diff = int(np.sum(golden[b.name] != q))
            bad += diff
            total += q.size
            if diff:
                notes.append(f"output {b.name!r}: {diff} of {q.size} elements differ")
        self.verify_results.append(VerifyResult(self.sg.name, bad, total, notes))

    def packed(self):
        """The function to register for the Relax VM: run(*inputs, *outputs) in destination-passing style."""
        n_in = len(self.sg.inputs)

        def run(*args):
            ins = [np.from_dlpack(a) for a in args[:n_in]]
            outs = args[n_in:]
            results = self.run_float(ins)
            for dst, val in zip(outs, results):
                dst.copyfrom(np.ascontiguousarray(val, dtype=np.float32))

        return run
