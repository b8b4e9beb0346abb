"""Golden reference: every XGraph op on whole tensors in numpy integers, exactly as the DPU computes it.

It shares only `quant.fixpoint` (rounding primitives) and `quant.rules` (the integer parameters derived from the
fix_points) with the code generator; the emulator, which runs the generated instructions, must agree with it bit
for bit. Layout is logical NCHW; accumulations are exact (int64, or float64 where provably exact).

One evaluator per op type (`EVALUATORS`, the `golden` hooks of the op registry tvm_dpu/ops/), each
`fn(op, graph, *inputs) -> output array`.
"""
from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from tvm_dpu.ops import HookTable
from tvm_dpu.xgraph.graph import Graph, GraphError, Op
from tvm_dpu.xgraph.validate import run_ops, validate_feeds

Evaluator = Callable[..., np.ndarray]

#: Op type -> golden evaluator, from the op registry (each OpDef's `golden` hook, an xgraph module).
EVALUATORS: Mapping[str, Evaluator] = HookTable("golden")


def run_op(op: Op, graph: Graph, env: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Compute one op. Inputs come from `env` (by tensor name) or, for constants, from the graph.

    Returns {output name: int8 array}. Raises GraphError for an unknown op type, a missing input or attribute,
    or an input of the wrong shape / dtype; QuantizationError when the fix_points violate a DPU constraint.
    """
    fn = EVALUATORS.get(op.type)
    if fn is None:
        raise GraphError(f"{op.where()}: unsupported op type {op.type!r} (golden knows: {', '.join(EVALUATORS)})")
    args = []
    for name in op.inputs:
        t = graph.tensor(name, op.where())
        x = env.get(name, t.data)
        if x is None:
            raise GraphError(f"{op.where()}: no value for input {name!r}")
        x = np.asarray(x)
        if x.dtype != np.int8:
            raise GraphError(f"{op.where()}: input {name!r} has dtype {x.dtype}, expected int8")
        if tuple(x.shape) != t.shape:
            raise GraphError(f"{op.where()}: input {name!r} has shape {tuple(x.shape)}, expected {t.shape}")
        args.append(x)
    out = fn(op, graph, *args)
    expected = graph.tensor(op.outputs[0], op.where()).shape
    assert out.dtype == np.int8 and tuple(out.shape) == tuple(expected), (op.name, out.dtype, out.shape, expected)
    return {op.outputs[0]: out}


def run_graph(graph: Graph, feeds: dict[str, np.ndarray], keep_all: bool = False) -> dict[str, np.ndarray]:
    """Run the whole graph on int8 `feeds` (one per graph input). Returns the graph outputs by name, or every
    computed tensor with keep_all=True (handy to find the first layer where two implementations differ)."""
    validate_feeds(graph, feeds)
    env: dict[str, np.ndarray] = {}
    for name, value in feeds.items():
        v = np.asarray(value)
        t = graph.tensors[name]
        if v.dtype != np.int8 or tuple(v.shape) != t.shape:
            raise GraphError(f"graph {graph.name!r}: feed {name!r} is {v.dtype}{tuple(v.shape)}, expected "
                             f"int8{t.shape}")
        env[name] = v
    return run_ops(graph, env, run_op, keep_all)
