"""Cutting a compiled model into one deployable model per pipeline stage.

A stage is a run of chain units (`plan.chain_units`) of the model's one DPU subgraph. Its ops are taken out of
the quantized XGraph with `Graph.extract` (tensors shared, so every fix point stays what calibration chose) and
code-generated for the stage's board, so the integer arithmetic of every op is the single-board model's and the
pipelined output is bit-identical to it.

Each stage is a real TVM model: a Relax `main` whose parameters are what crosses into the stage and whose result
is what crosses out of it (the last stage: the model's outputs), calling one DPU partition whose program is
attached as `tvm_dpu.program` and compiled by the "dpu_lowering" pipeline. A tensor that skips a stage is a
parameter that the stage's `main` returns unchanged. So every stage exports, signs, loads, verifies and runs like
any other `.tvmdpu` artifact.

Between stages tensors travel as int8 with their fix point (`to_wire` / `from_wire`): the bytes the planner
charged to the link. A stage's float outputs are exact multiples of 2**-fix_point within int8 range, so the
round trip is exact.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from tvm_dpu.errors import DPUError
from tvm_dpu.pipeline.plan import Plan, PlanError, chain_units, single_subgraph, tensor_bytes
from tvm_dpu.types import InputSpec


@dataclass
class StageSpec:
    """What a stage consumes and produces. `inputs` / `outputs` name tensors of the model's quantized XGraph,
    except stage 0's inputs, which are the model's input names; `wire_fix_points` gives the fix point of every
    tensor a stage sends to the next (absent for the last stage's outputs, which leave as float)."""

    index: int
    board: str
    arch: str
    ops: list[str]
    inputs: list[str]
    outputs: list[str]
    wire_fix_points: dict[str, int] = field(default_factory=dict)
    predicted_ms: float = 0.0
    send_bytes: int = 0

    def to_json(self) -> dict:
        return {"index": self.index, "board": self.board, "arch": self.arch, "ops": list(self.ops),
                "inputs": list(self.inputs), "outputs": list(self.outputs),
                "wire_fix_points": dict(self.wire_fix_points), "predicted_ms": self.predicted_ms,
                "send_bytes": self.send_bytes}


class PipelineError(DPUError, RuntimeError):
    """A stage failed while running a stream (the message names the stage and the frame), or a pipeline file is
    malformed."""


@dataclass
class PipelineStage:
    """One stage: what it consumes and produces (`spec`) and the compiled model that runs it."""

    spec: StageSpec
    model: Any  # CompiledModel
    #: The .tvmdpu file the stage was loaded from (None: built in this process).
    artifact: Path | None = None
    #: Frames this stage ran and the seconds it spent in them (for utilisation and executor overhead).
    runs: int = 0
    busy_s: float = 0.0

    def run_payload(self, payload: dict[str, np.ndarray], fix_points: Mapping[str, int]) -> dict[str, np.ndarray]:
        """Wire payload in -> wire payload out (see `to_wire`)."""
        t0 = time.perf_counter()
        try:
            outs = self.model.run(from_wire(payload, self.spec.inputs, fix_points))
            return to_wire(outs, self.spec.outputs, self.spec.wire_fix_points)
        finally:
            # One executor thread / actor runs a stage, so these counters have one writer.
            self.busy_s += time.perf_counter() - t0
            self.runs += 1

    def stats(self) -> dict:
        return {"stage": self.spec.index, "runs": self.runs, "busy_s": self.busy_s}


def to_wire(arrays: Sequence[np.ndarray], names: Sequence[str], fix_points: Mapping[str, int]) -> dict[str, Any]:
    """A stage's float outputs -> what goes over the link: int8 where the tensor has a fix point (exact: the values
    are int8 multiples of 2**-fix_point), float32 otherwise (the model's final outputs)."""
    from tvm_dpu.runtime.subgraph_runner import quantize_tensor

    out: dict[str, Any] = {}
    for name, a in zip(names, arrays):
        out[name] = quantize_tensor(a, fix_points[name]) if name in fix_points else np.asarray(a, np.float32)
    return out


def from_wire(payload: Mapping[str, np.ndarray], names: Sequence[str], fix_points: Mapping[str, int]) -> list:
    """What arrived over the link -> the float arrays a stage's `main` takes, in `names` order."""
    from tvm_dpu.runtime.subgraph_runner import dequantize_tensor

    missing = [n for n in names if n not in payload]
    if missing:
        raise PlanError(f"stage input(s) {missing} did not arrive (got {sorted(payload)})")
    return [dequantize_tensor(payload[n], fix_points[n]) if n in fix_points and payload[n].dtype == np.int8
            else np.asarray(payload[n], np.float32) for n in names]


def _call_layout(model: Any) -> tuple[list[int], list[int]]:
    """For a model whose Relax `main` is one call of its DPU partition: which main parameter feeds each partition
    input, and which partition output each model output is. PlanError naming the CPU ops otherwise."""
    from tvm import relax

    runner = single_subgraph(model)
    mod = model.relax_module
    if mod is None:
        raise PlanError("splitting a model needs its Relax module (a model built in this process with tvm_dpu.build)")
    main = mod["main"]
    cpu = []
    if model.partition_report is not None:
        cpu = [f"{n.name} ({n.op})" for n in model.partition_report.nodes if n.device != "dpu"]
    where = (f": its CPU op(s) {', '.join(cpu[:6])}{' ...' if len(cpu) > 6 else ''} would need a CPU stage"
             if cpu else "")
    body = main.body
    bindings = [b for block in body.blocks for b in block.bindings]
    calls = [b for b in bindings if isinstance(b.value, relax.Call) and isinstance(b.value.op, relax.GlobalVar)]
    if len(calls) != 1:
        raise PlanError(f"a pipeline splits a model whose whole computation is one DPU subgraph{where}")
    call = calls[0]
    params = list(main.params)
    arg_index = []
    for a in call.value.args:
        if not any(a.same_as(p) for p in params):
            raise PlanError(f"a pipeline splits a model whose whole computation is one DPU subgraph{where}")
        arg_index.append(next(i for i, p in enumerate(params) if a.same_as(p)))
    items = {}
    for b in bindings:
        if b is call:
            continue
        v = b.value
        if isinstance(v, relax.TupleGetItem) and v.tuple_value.same_as(call.var):
            items[b.var] = int(v.index)
        elif not isinstance(v, (relax.Tuple, relax.Var)):
            raise PlanError(f"a pipeline splits a model whose whole computation is one DPU subgraph{where}")

    def outputs_of(expr: Any) -> list[int]:
        if isinstance(expr, relax.Var) and expr.same_as(call.var):
            return list(range(len(runner.sg.outputs)))
        if isinstance(expr, relax.Var):
            for var, idx in items.items():
                if var.same_as(expr):
                    return [idx]
            for b in bindings:
                if b.var.same_as(expr):
                    return outputs_of(b.value)
        if isinstance(expr, relax.Tuple):
            return [i for f in expr.fields for i in outputs_of(f)]
        if isinstance(expr, relax.TupleGetItem) and expr.tuple_value.same_as(call.var):
            return [int(expr.index)]
        raise PlanError(f"a pipeline splits a model whose whole computation is one DPU subgraph{where}")

    return arg_index, outputs_of(body.body)


def stage_specs(model: Any, plan: Plan) -> list[StageSpec]:
    """The tensors each stage of `plan` receives and sends (see StageSpec), from `model`'s quantized XGraph."""
    runner = single_subgraph(model)
    graph = runner.graph
    units = chain_units(model)
    if [u.name for u in units] != list(plan.ops):
        raise PlanError("the plan was not made for this model (its op chain differs)")
    arg_index, out_index = _call_layout(model)
    model_inputs = [model.inputs[i].name for i in arg_index]  # model input feeding each XGraph input
    rename = dict(zip(graph.inputs, model_inputs))
    final = [graph.outputs[i] for i in out_index]
    stage_of: dict[str, int] = {t: -1 for t in graph.inputs}
    last_use: dict[str, int] = {}
    k = len(plan.stages)
    for s, st in enumerate(plan.stages):
        for unit in units[st.first:st.end]:
            for op in unit.ops:
                for t in op.inputs:
                    if not graph.tensors[t].is_const:
                        last_use[t] = max(last_use.get(t, -1), s)
                for t in op.outputs:
                    stage_of[t] = s
    for t in final:
        last_use[t] = k
    specs = []
    for s, st in enumerate(plan.stages):
        crossing_in = [t for t in stage_of if stage_of[t] < s <= last_use.get(t, -1)]
        if s < k - 1:
            crossing_out = [t for t in stage_of if stage_of[t] <= s < last_use.get(t, -1)]
        else:
            crossing_out = list(final)
        ops = [op.name for unit in units[st.first:st.end] for op in unit.ops]
        specs.append(StageSpec(
            index=s, board=st.board.name, arch=st.board.arch, ops=ops,
            inputs=[rename.get(t, t) for t in crossing_in], outputs=[rename.get(t, t) for t in crossing_out],
            wire_fix_points={rename.get(t, t): int(graph.tensors[t].fix_point) for t in crossing_out
                             if s < k - 1},
            send_bytes=sum(tensor_bytes(graph, t) for t in crossing_out) if s < k - 1 else 0))
    return specs


def _stage_module(symbol: str, blob: bytes, params: list[tuple[str, tuple[int, ...]]], dpu_args: list[int],
                  dpu_out_shapes: list[tuple[int, ...]], results: list[tuple[str, int]]) -> Any:
    """The stage's Relax module: `main(params) -> results`, each result either ("dpu", output index) or
    ("param", parameter index), through one DPU partition `symbol` carrying `blob`."""
    import tvm
    from tvm import relax

    from tvm_dpu.passes.ext_module import PROGRAM_ATTR

    def tensor_ty(shape: tuple[int, ...]) -> Any:
        return relax.TensorType([int(d) for d in shape], "float32")

    fparams = [relax.Var(f"x{i}", tensor_ty(params[j][1])) for i, j in enumerate(dpu_args)]
    # RunCodegen replaces this function by the DPU program; only its signature is ever used, so the body just
    # has the right type (it is never lowered or run).
    zeros = [relax.op.zeros(relax.ShapeExpr([int(d) for d in s]), "float32") for s in dpu_out_shapes]
    body = zeros[0] if len(zeros) == 1 else relax.Tuple(zeros)
    ret_ty = tensor_ty(dpu_out_shapes[0]) if len(zeros) == 1 else \
        relax.TupleType([tensor_ty(s) for s in dpu_out_shapes])
    fn = relax.Function(fparams, body, ret_ty)
    fn = fn.with_attrs({"Codegen": "dpu", "global_symbol": symbol,
                        PROGRAM_ATTR: tvm.runtime.tensor(np.frombuffer(blob, dtype=np.uint8).copy())})
    bb = relax.BlockBuilder()
    gv = bb.add_func(fn, symbol)
    mparams = [relax.Var(name, tensor_ty(shape)) for name, shape in params]
    with bb.function("main", mparams, attrs={"num_input": len(mparams)}):
        with bb.dataflow():
            call = bb.emit(relax.Call(gv, [mparams[j] for j in dpu_args]))
            outs = []
            for kind, i in results:
                if kind == "param":
                    outs.append(mparams[i])
                elif len(dpu_out_shapes) == 1:
                    outs.append(call)
                else:
                    outs.append(bb.emit(relax.TupleGetItem(call, i)))
            ret = bb.emit_output(outs[0] if len(outs) == 1 else relax.Tuple(outs))
        bb.emit_func_output(ret)
    return bb.get()


def compile_stages(model: Any, plan: Plan, fusion: str = "optimal", progress: bool = False) -> list[tuple]:
    """One (StageSpec, CompiledModel) per stage of `plan`: the stage's ops code-generated for its board's arch
    (with DNNVM fusion `fusion`) and wrapped in a TVM module (see the module docstring)."""
    import tvm

    from tvm_dpu.passes.dpu_compile import compile_subgraph
    from tvm_dpu.program_blob import digest_of, pack_program
    from tvm_dpu.runtime.compiled_model import CompiledModel
    from tvm_dpu.runtime.subgraph_runner import SubgraphRunner
    from tvm_dpu.timing.simulate import simulate

    runner = single_subgraph(model)
    graph = runner.graph
    specs = stage_specs(model, plan)
    arg_index, out_index = _call_layout(model)
    xname = dict(zip([model.inputs[i].name for i in arg_index], graph.inputs))  # model input -> XGraph input
    model_shape = {s.name: tuple(s.shape) for s in model.inputs}
    final = [graph.outputs[i] for i in out_index]
    final_shape = {graph.outputs[i]: tuple(runner.output_shapes[i]) for i in range(len(graph.outputs))}
    out = []
    for spec in specs:
        sub = graph.extract(spec.ops, name=f"{graph.name}:stage{spec.index}")
        arch = plan.stages[spec.index].board.load()
        csg, _ = compile_subgraph(sub, arch, fusion)
        timing = simulate(csg.code, arch)
        spec.predicted_ms = timing.cycles / timing.freq_hz * 1e3
        last = spec.index == len(specs) - 1
        shape_of = {t: final_shape[t] if last and t in final else tuple(graph.tensors[t].shape) for t in sub.outputs}
        symbol = f"tvm_dpu_stage{spec.index}"
        blob = pack_program(symbol, csg, [shape_of[t] for t in sub.outputs])
        xinputs = [xname.get(n, n) for n in spec.inputs]
        params = [(n, model_shape.get(n) or tuple(graph.tensors[x].shape)) for n, x in zip(spec.inputs, xinputs)]
        dpu_args = [xinputs.index(t) for t in sub.inputs]
        results = []
        for n in spec.outputs:
            x = xname.get(n, n)
            results.append(("dpu", sub.outputs.index(x)) if x in sub.outputs else ("param", xinputs.index(x)))
        mod = _stage_module(symbol, blob, params, dpu_args, [shape_of[t] for t in sub.outputs], results)
        ex = tvm.compile(mod, target="llvm", relax_pipeline="dpu_lowering")
        stage_runner = SubgraphRunner(csg, None, sub, [shape_of[t] for t in sub.outputs], digest_of(blob))
        outputs = [InputSpec(n, shape_of.get(xname.get(n, n)) or params[xinputs.index(xname.get(n, n))][1],
                             "float32") for n in spec.outputs]
        cm = CompiledModel(executable=ex, arch=arch, runners={symbol: stage_runner},
                           inputs=[InputSpec(n, s, "float32") for n, s in params], subgraph_ids={symbol: 0},
                           build_info={"pipeline_stage": spec.to_json()}, relax_module=mod, outputs=outputs)
        out.append((spec, cm))
    return out
