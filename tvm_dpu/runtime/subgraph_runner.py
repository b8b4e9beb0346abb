"""Running one compiled DPU subgraph from float tensors: quantize, place in DDR, execute, read back, dequantize.

This is the body of every DPU partition call (runtime/dispatch.py): the Relax VM hands float32 inputs and
pre-allocated float32 outputs; the DPU computes in int8 with power-of-two scales.
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


def run_int8(sg: CompiledSubgraph, device, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """int8 NCHW inputs -> int8 NCHW outputs of `sg`, through fresh DDR regions and `device`."""
    regions = sg.new_regions()
    for b, x in zip(sg.inputs, inputs):
        b.fmap.to_ddr(regions[b.fmap.reg_id], np.asarray(x).reshape(b.shape))
    device.execute(sg, regions)
    return [b.fmap.from_ddr(regions[b.fmap.reg_id]) for b in sg.outputs]


def _batch(sg: CompiledSubgraph, inputs: list[np.ndarray]) -> int:
    """How many images `inputs` hold: a subgraph's program computes one (its bindings' shapes), a batch runs as
    that many calls. ValueError if the inputs disagree or are not whole images."""
    counts = set()
    for b, x in zip(sg.inputs, inputs):
        per_image = int(np.prod(b.shape))
        size = int(np.asarray(x).size)
        if size == 0 or size % per_image:
            raise ValueError(f"DPU subgraph {sg.name!r}: input {b.name!r} has {size} elements, not a whole number "
                             f"of images of shape {list(b.shape)}")
        counts.add(size // per_image)
    if len(counts) != 1:
        raise ValueError(f"DPU subgraph {sg.name!r}: inputs hold different batch sizes {sorted(counts)}")
    return counts.pop()


def execute_float(sg: CompiledSubgraph, device, inputs: list[np.ndarray],
                  output_shapes: list[tuple[int, ...]]) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """float inputs (any shape with the right element count) -> (int8 inputs, int8 outputs, float outputs in
    `output_shapes`): quantize, run on `device` image by image (the program computes one image; the DPU runs
    batch 1 per core), dequantize. The int8 arrays are N x C x H x W for a batch of N."""
    if len(inputs) != len(sg.inputs):
        raise ValueError(f"DPU subgraph {sg.name!r} takes {len(sg.inputs)} inputs, got {len(inputs)}")
    n = _batch(sg, inputs)
    qin = [quantize_tensor(np.asarray(x).reshape((n, *b.shape[1:])), b.fix_point) for b, x in zip(sg.inputs, inputs)]
    per_image = [run_int8(sg, device, [q[i:i + 1] for q in qin]) for i in range(n)]
    qout = [np.concatenate([outs[k] for outs in per_image]) for k in range(len(sg.outputs))]
    outs = [dequantize_tensor(q, b.fix_point).reshape(s) for q, b, s in zip(qout, sg.outputs, output_shapes)]
    return qin, qout, outs


class SubgraphRunner:
    """One compiled DPU subgraph of a model, as the model sees it: its code (`sg`), the device it runs on, the
    quantized XGraph (`graph`, for golden verification; None when the model carries no verification data) and
    the Relax output shapes. The model's TVM module runs the code; this object verifies and reports."""

    def __init__(self, sg: CompiledSubgraph, device, graph: Graph | None = None,
                 output_shapes: list[tuple[int, ...]] | None = None, program_digest: bytes = b""):
        self.sg = sg
        #: sha256 of the program blob TVM's module embeds for this subgraph (program_blob.digest_of).
        self.program_digest = program_digest
        self.device = device
        self.graph = graph
        self.output_shapes = output_shapes or [b.shape for b in sg.outputs]
        self.verify_results: list[VerifyResult] = []

    def run_float(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Run this subgraph alone on its device: float inputs -> float outputs (Relax output shapes)."""
        return execute_float(self.sg, self.device, inputs, self.output_shapes)[2]

    def check(self, qin: list[np.ndarray], qout: list[np.ndarray]) -> VerifyResult:
        """Golden reference of `graph` on `qin` vs the device's `qout`."""
        from tvm_dpu.xgraph.golden import run_graph

        assert self.graph is not None, "verify needs the quantized XGraph"
        n = int(qin[0].shape[0]) if qin else 1
        golden = [run_graph(self.graph, {b.name: q[i:i + 1] for b, q in zip(self.sg.inputs, qin)}) for i in range(n)]
        bad = 0
        total = 0
        notes = []
        for b, q in zip(self.sg.outputs, qout):
            diff = int(np.sum(np.concatenate([g[b.name] for g in golden]) != q))
            bad += diff
            total += q.size
            if diff:
                notes.append(f"output {b.name!r}: {diff} of {q.size} elements differ")
        return VerifyResult(self.sg.name, bad, total, notes)
