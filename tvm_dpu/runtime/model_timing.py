"""The timing model of a whole compiled model: every DPU subgraph on the cycle-level simulator, back to back.

Here rather than in timing/ because counting a subgraph's real operations (for GOPS) reads its XGraph, which the
timing stage does not import; the runtime holds both the compiled subgraphs and their graphs.
"""
from __future__ import annotations

from typing import Any

from tvm_dpu.arch import load_arch
from tvm_dpu.arch.arch import Arch
from tvm_dpu.timing.analytic import graph_ops
from tvm_dpu.timing.params import TimingParams
from tvm_dpu.timing.simulate import ModelTiming, simulate_subgraph
from tvm_dpu.xgraph.ops import layer_descs


def simulate_model(model: Any, arch: Arch | str | None = None, params: TimingParams | None = None) -> ModelTiming:
    """Simulate every DPU subgraph of a tvm_dpu `CompiledModel` (model.runners -> .sg) on one core of `arch`
    (default: the model's arch). GOPS counts the real ops of each subgraph's XGraph when the runner keeps it.
    CPU time (ops left on the CPU, pre/post-processing) is left out."""
    a = load_arch(arch if arch is not None else model.arch)
    out = {}
    for sym, runner in model.runners.items():
        g = getattr(runner, "graph", None)
        ops = graph_ops(layer_descs(g)) if g is not None else None
        out[sym] = simulate_subgraph(runner.sg, a, params, ops)
    return ModelTiming(out)
