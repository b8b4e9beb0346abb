"""Cutting a compiled model into one deployable model per pipeline stage.

(A model with several DPU subgraphs is split by `multi`, which reuses this module's stage functions.)

A stage is a run of chain units (`plan.chain_units`) of the model's one DPU subgraph. Its ops are taken out of
the quantized XGraph with `Graph.extract` (tensors shared, so every fix point stays what calibration chose) and
code-generated for the stage's board, so the integer arithmetic of every op is the single-board model's and the
pipelined output is bit-identical to it.

Each stage is a real TVM model: a Relax `main` whose parameters are what crosses into the stage and whose result
is what crosses out of it (the last stage: the model's outputs), calling one DPU partition whose program is
attached as `tvm_dpu.program` and compiled by the "dpu_lowering" pipeline. A tensor that skips a stage is a
parameter that the stage's `main` returns unchanged. So every stage exports, signs, loads, verifies and runs like
any other `.tvmdpu` artifact.

Between stages tensors travel as int8 with their fix point: the bytes the planner charged to the link. A stage
whose `main` is its DPU call alone (every stage but a first one with CPU ops before the DPU part and a last one
with CPU ops after it) runs as a board's runtime does (`DpuOnly`): the int8 it receives goes to the DPU as it is
and the DPU's int8 outputs leave as they are, so only the first stage quantizes (the model's float input) and
only the last dequantizes. A stage with CPU ops runs through its Relax VM on floats (`from_wire` / `to_wire`); a
stage's float outputs are exact multiples of 2**-fix_point within int8 range, so that round trip is exact too.
"""
from __future__ import annotations

import threading
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
    #: The board's FPGA part when the plan chose its DPU for a part (`--part`): the board kind a cluster places the
    #: stage on (its arch otherwise).
    part: str | None = None
    #: How the stage passes int8 through (`DpuOnly.to_json`), recorded when compiled so that a stage loaded from
    #: its artifact (no Relax module) runs the same way; None: through its Relax VM.
    int8_io: dict | None = None

    def to_json(self) -> dict:
        doc = {"index": self.index, "board": self.board, "arch": self.arch, "ops": list(self.ops),
               "inputs": list(self.inputs), "outputs": list(self.outputs),
               "wire_fix_points": dict(self.wire_fix_points), "predicted_ms": self.predicted_ms,
               "send_bytes": self.send_bytes}
        if self.part is not None:
            doc["part"] = self.part
        if self.int8_io is not None:
            doc["int8_io"] = dict(self.int8_io)
        return doc


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
    #: The artifact's bytes as checked when loaded (what executors ship; the file is never read again).
    artifact_bytes: bytes | None = None
    #: Frames this stage ran and the seconds it spent in them (for utilisation and executor overhead), and of
    #: those the seconds in the wire conversions (`from_wire` + `to_wire`; the rest is the model's run).
    runs: int = 0
    busy_s: float = 0.0
    wire_s: float = 0.0
    #: Of busy_s, the seconds the device ran the DPU program when the stage ran in phases (`execute`).
    dpu_s: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def int8_path(self) -> "DpuOnly | None":
        """How this stage passes int8 through (`DpuOnly`), or None when it runs through its Relax VM."""
        if not hasattr(self, "_int8"):
            self._int8 = DpuOnly.from_json(self.spec.int8_io, self.model) if self.spec.int8_io is not None \
                else dpu_only(self.model)
        return self._int8

    def run_payload(self, payload: dict[str, np.ndarray], fix_points: Mapping[str, int]) -> dict[str, np.ndarray]:
        """Wire payload in -> wire payload out (int8 where the tensor has a fix point; see `to_wire`)."""
        t0 = time.perf_counter()
        t1 = t2 = t0
        try:
            if self.phased():
                t1 = time.perf_counter()
                out = self.int8_path().run(self.model, payload, fix_points, self.spec)
                t2 = time.perf_counter()
                return out
            args = from_wire(payload, self.spec.inputs, fix_points)
            t1 = time.perf_counter()
            outs = self.model.run(args)
            t2 = time.perf_counter()
            return to_wire(outs, self.spec.outputs, self.spec.wire_fix_points)
        finally:
            t3 = time.perf_counter()
            with self._lock:
                self.busy_s += t3 - t0
                self.wire_s += (t1 - t0) + (t3 - t2 if t2 > t1 else 0.0)
                self.runs += 1

    # -- phases: a double-buffered stage (the local executor runs them on three threads, as a board's ARM cores
    # prepare frame f+1 and read back frame f-1 while its DPU computes frame f) -------------------------------
    def phased(self) -> bool:
        """Whether the stage passes int8 through (`DpuOnly`), so it can also run in phases (`prepare`, `execute`,
        `finish`); not while verifying, which observes the Relax VM's DPU calls."""
        return self.int8_path() is not None and not self.model._verify

    def _count(self, seconds: float, dpu: bool = False, frame_done: bool = False) -> None:
        with self._lock:  # the phases run on different threads
            self.busy_s += seconds
            if dpu:
                self.dpu_s += seconds
            if frame_done:
                self.runs += 1

    def prepare(self, payload: dict[str, np.ndarray], fix_points: Mapping[str, int]) -> dict:
        """Host, before the DPU: what arrived, placed in fresh DDR regions (`DpuOnly.prepare`)."""
        t0 = time.perf_counter()
        try:
            return self.int8_path().prepare(self.model, payload, fix_points)
        finally:
            self._count(time.perf_counter() - t0)

    def execute(self, regions: dict) -> None:
        """The DPU: the stage's program over `regions`."""
        t0 = time.perf_counter()
        try:
            self.int8_path().execute(self.model, regions)
        finally:
            self._count(time.perf_counter() - t0, dpu=True)

    def finish(self, regions: dict) -> dict[str, np.ndarray]:
        """Host, after the DPU: the wire payload out."""
        t0 = time.perf_counter()
        try:
            return self.int8_path().finish(self.model, regions, self.spec)
        finally:
            self._count(time.perf_counter() - t0, frame_done=True)

    def stats(self) -> dict:
        return {"stage": self.spec.index, "runs": self.runs, "busy_s": self.busy_s, "wire_s": self.wire_s,
                "dpu_s": self.dpu_s}


@dataclass(frozen=True)
class DpuOnly:
    """A stage model whose Relax `main` is one DPU call on its parameters returning (items of) the call's result:
    it runs as a board's runtime does, int8 in and out of the DPU's DDR with no Relax VM and no float step."""

    symbol: str
    args: tuple[str, ...]  # per DPU input (program order): the model input that feeds it
    outs: tuple[int, ...]  # per model output: the DPU output it is

    def to_json(self) -> dict:
        return {"symbol": self.symbol, "args": list(self.args), "outs": list(self.outs)}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], model: Any) -> "DpuOnly":
        """The recorded form, checked against the stage's model (its DPU program, inputs and outputs)."""
        try:
            path = cls(str(doc["symbol"]), tuple(str(a) for a in doc["args"]), tuple(int(k) for k in doc["outs"]))
        except (KeyError, TypeError, ValueError):
            raise PipelineError(f"stage int8_io {doc!r:.120}: expected symbol, args and outs") from None
        runner = model.runners.get(path.symbol)
        names = {s.name for s in model.inputs}
        if runner is None or len(path.args) != len(runner.sg.inputs) or not set(path.args) <= names \
                or len(path.outs) != len(model.output_specs()) \
                or not all(0 <= k < len(runner.sg.outputs) for k in path.outs):
            raise PipelineError(f"stage int8_io {doc!r:.120} does not match the stage's model (its DPU program "
                                f"{sorted(model.runners)}, inputs {sorted(names)})")
        return path

    def run(self, model: Any, payload: Mapping[str, np.ndarray], fix_points: Mapping[str, int],
            spec: StageSpec) -> dict[str, np.ndarray]:
        """Wire payload in -> wire payload out: int8 received with the DPU input's fix point goes in as it is (a
        float input, the model's, is quantized: the first stage's ARM does that), int8 DPU outputs leave as they
        are where the tensor crosses a link, dequantized to float32 where it is a model output. The three phases
        (`prepare`, `execute`, `finish`) in turn."""
        regions = self.prepare(model, payload, fix_points)
        self.execute(model, regions)
        return self.finish(model, regions, spec)

    def execute(self, model: Any, regions: dict) -> None:
        """The DPU's part: run the program over the regions `prepare` filled."""
        model.dpu_device().execute(model.runners[self.symbol].sg, regions)

    def prepare(self, model: Any, payload: Mapping[str, np.ndarray], fix_points: Mapping[str, int]) -> dict:
        """The host's part before the DPU: the received tensors (quantized if float) placed in fresh DDR regions."""
        from tvm_dpu.runtime.subgraph_runner import dequantize_tensor, place_int8, quantize_tensor

        sg = model.runners[self.symbol].sg
        missing = [n for n in self.args if n not in payload]
        if missing:
            raise PlanError(f"stage input(s) {missing} did not arrive (got {sorted(payload)})")
        qin = []
        for name, b in zip(self.args, sg.inputs):
            a = np.asarray(payload[name])
            if a.size != int(np.prod(b.shape)):
                raise PlanError(f"stage input {name!r}: {a.size} elements, the DPU input {b.name!r} takes "
                                f"{int(np.prod(b.shape))}")
            if a.dtype == np.int8 and fix_points.get(name) == b.fix_point:
                qin.append(a)
            else:  # float (the model's input), or int8 at another fix point (requantized exactly as the VM would)
                f = dequantize_tensor(a, fix_points[name]) if a.dtype == np.int8 else a.astype(np.float32, copy=False)
                qin.append(quantize_tensor(f, b.fix_point))
        return place_int8(sg, qin)

    def finish(self, model: Any, regions: dict, spec: StageSpec) -> dict[str, np.ndarray]:
        """The host's part after the DPU: its outputs read back, int8 for a link, float32 for a model output."""
        from tvm_dpu.runtime.subgraph_runner import dequantize_tensor, quantize_tensor, read_int8

        runner = model.runners[self.symbol]
        sg = runner.sg
        qout = read_int8(sg, regions)
        out: dict[str, np.ndarray] = {}
        for name, k in zip(spec.outputs, self.outs):
            b = sg.outputs[k]
            if name in spec.wire_fix_points and spec.wire_fix_points[name] == b.fix_point:
                out[name] = qout[k]
            else:
                f = dequantize_tensor(qout[k], b.fix_point).reshape(runner.output_shapes[k])
                out[name] = quantize_tensor(f, spec.wire_fix_points[name]) if name in spec.wire_fix_points else f
        return out


def dpu_only(model: Any) -> DpuOnly | None:
    """The `DpuOnly` form of a stage model, or None when its `main` does more than call its one DPU program on its
    parameters (CPU ops, a multi-core program, no Relax module)."""
    from tvm import relax

    mod = model.relax_module
    if mod is None or len(model.runners) != 1 or any(r.multicore is not None for r in model.runners.values()):
        return None
    main = mod["main"]
    if len(main.body.blocks) != 1 or len(main.params) != len(model.inputs):
        return None
    params = {p: s.name for p, s in zip(main.params, model.inputs)}
    made: dict[Any, list[int]] = {}  # var -> the DPU outputs it holds
    call = None
    for b in main.body.blocks[0].bindings:
        v = b.value
        if call is None and isinstance(v, relax.Call) and isinstance(v.op, relax.GlobalVar) \
                and v.op.name_hint in model.runners:
            if not all(a in params for a in v.args):
                return None
            call = (v.op.name_hint, tuple(params[a] for a in v.args))
            made[b.var] = list(range(len(model.runners[v.op.name_hint].sg.outputs)))
        elif isinstance(v, relax.TupleGetItem) and v.tuple_value in made:
            made[b.var] = [made[v.tuple_value][int(v.index)]]
        elif isinstance(v, relax.Tuple) and all(f in made for f in v.fields):
            made[b.var] = [i for f in v.fields for i in made[f]]
        elif isinstance(v, relax.Var) and v in made:
            made[b.var] = made[v]
        else:
            return None
    ret = main.body.body
    if call is None or ret not in made or len(made[ret]) != len(model.output_specs()):
        return None
    return DpuOnly(call[0], call[1], tuple(made[ret]))


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


@dataclass
class MainLayout:
    """The model's Relax `main` around its one DPU call: CPU bindings before it (`prefix`, run by the first
    stage), the call, CPU bindings after it (`suffix`, run by the last stage) and the returned expression."""

    params: list  # relax.Var, main's parameters
    prefix: list  # relax bindings before the DPU call
    call: Any  # the VarBinding of the DPU call
    suffix: list  # relax bindings after it
    ret: Any  # main's returned expression
    ret_ty: Any  # and its type
    out_index: list[int] | None  # no suffix: model output k is DPU output out_index[k]

    @property
    def args(self) -> list:
        return list(self.call.value.args)

    @property
    def plain(self) -> bool:
        """No CPU op before the DPU call and every DPU input is a model input."""
        return not self.prefix and all(any(a.same_as(p) for p in self.params) for a in self.args)


def main_layout(model: Any) -> MainLayout:
    """Split the Relax `main` of a model with one DPU subgraph at its DPU call. CPU ops may come before it (they
    then run on the first board) and after it (on the last board), provided nothing after the call reads a value
    computed before it other than through the call; PlanError naming the binding otherwise."""
    from tvm import relax

    runner = single_subgraph(model)
    mod = model.relax_module
    if mod is None:
        raise PlanError("splitting a model needs its Relax module (a model built in this process with tvm_dpu.build)")
    main = mod["main"]
    dpu = {gv.name_hint for gv, fn in mod.functions.items()
           if isinstance(fn, relax.Function) and fn.attrs is not None and fn.attrs.get("Codegen") == "dpu"}
    body = main.body
    if len(body.blocks) != 1:
        raise PlanError("a pipeline splits a model whose main function is one dataflow block")
    bindings = list(body.blocks[0].bindings)
    calls = [i for i, b in enumerate(bindings) if isinstance(b.value, relax.Call)
             and isinstance(b.value.op, relax.GlobalVar) and b.value.op.name_hint in dpu]
    if len(calls) != 1:
        raise PlanError(f"a pipeline splits a model with one DPU call; its main has {len(calls)}")
    k = calls[0]
    prefix, call, suffix = bindings[:k], bindings[k], bindings[k + 1:]
    allowed = [call.var] + [b.var for b in suffix]
    for b in suffix:
        stray = [v for v in relax.analysis.free_vars(b.value) if not any(v.same_as(a) for a in allowed)]
        if stray:
            raise PlanError(f"the CPU op binding {b.var.name} after the DPU subgraph reads "
                            f"{', '.join(v.name for v in stray)}, computed before it: a pipeline runs the CPU "
                            "ops after the DPU subgraph on the last board only")
    out_index = None if suffix else _outputs_of(body.body, call, len(runner.sg.outputs))
    return MainLayout(list(main.params), prefix, call, suffix, body.body, main.ret_ty, out_index)


def _outputs_of(expr: Any, call: Any, n: int) -> list[int]:
    """Which DPU outputs the returned expression is, when main returns the call (or its items) directly."""
    from tvm import relax

    if isinstance(expr, relax.Var) and expr.same_as(call.var):
        return list(range(n))
    if isinstance(expr, relax.Tuple):
        return [i for f in expr.fields for i in _outputs_of(f, call, n)]
    if isinstance(expr, relax.TupleGetItem) and expr.tuple_value.same_as(call.var):
        return [int(expr.index)]
    raise PlanError("the model's main returns something other than its DPU call's outputs")


def stage_specs(model: Any, plan: Plan, layout: MainLayout | None = None) -> list[StageSpec]:
    """The tensors each stage of `plan` receives and sends (see StageSpec), from `model`'s quantized XGraph
    (`layout`: `main_layout(model)`, when the caller has it)."""
    runner = single_subgraph(model)
    graph = runner.graph
    units = chain_units(model)
    by_name = {u.name: u for u in units}
    if sorted(by_name) != sorted(plan.ops) or len(plan.ops) != len(units):
        raise PlanError("the plan was not made for this model (its op chain differs)")
    units = [by_name[n] for n in plan.ops]  # the plan's order (program order or another valid one)
    layout = layout or main_layout(model)
    model_inputs = [s.name for s in model.inputs]
    rename: dict[str, str] = {}
    if layout.plain:  # the DPU inputs are model inputs: the first stage receives them under the model's names
        index = [next(i for i, p in enumerate(layout.params) if a.same_as(p)) for a in layout.args]
        rename = {t: model_inputs[i] for t, i in zip(graph.inputs, index)}
    # With CPU ops first, the DPU inputs are computed by the first stage, not received by it.
    stage_of: dict[str, int] = {t: (-1 if layout.plain else 0) for t in graph.inputs}
    final = [graph.outputs[i] for i in layout.out_index] if layout.out_index is not None else list(graph.outputs)
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
            outputs = [rename.get(t, t) for t in crossing_out]
        else:
            crossing_out = []
            outputs = ([rename.get(t, t) for t in final] if not layout.suffix
                       else [o.name for o in model.output_specs()])
        inputs = model_inputs if s == 0 and not layout.plain else [rename.get(t, t) for t in crossing_in]
        ops = [op.name for unit in units[st.first:st.end] for op in unit.ops]
        specs.append(StageSpec(
            index=s, board=st.board.name, arch=st.board.arch, part=st.board.part, ops=ops, inputs=inputs,
            outputs=outputs,
            wire_fix_points={rename.get(t, t): int(graph.tensors[t].fix_point) for t in crossing_out},
            send_bytes=sum(tensor_bytes(graph, t) for t in crossing_out)))
    return specs


def record_int8_io(spec: StageSpec, model: Any) -> None:
    """Record in `spec` whether (and how) the stage model passes int8 through, and the spec in the model's build
    info."""
    path = dpu_only(model)
    spec.int8_io = None if path is None else path.to_json()
    model.build_info["pipeline_stage"] = spec.to_json()


def tensor_ty(shape: Sequence[int]) -> Any:
    """The Relax type of a float32 tensor of `shape` (what stage functions take and return)."""
    from tvm import relax

    return relax.TensorType([int(d) for d in shape], "float32")


def dpu_function(symbol: str, blob: bytes, in_shapes: list, out_shapes: list) -> Any:
    """A DPU partition function carrying its compiled program (RunCodegen only reads its signature)."""
    from tvm import relax

    from tvm_dpu.backend.dpu_compile import program_function, program_tensor
    from tvm_dpu.backend.ext_module import PROGRAM_ATTR

    fparams = [relax.Var(f"x{i}", tensor_ty(s)) for i, s in enumerate(in_shapes)]
    return program_function(fparams, out_shapes, {"Codegen": "dpu", "global_symbol": symbol,
                                                  PROGRAM_ATTR: program_tensor(blob)})


def _stage_main(layout: MainLayout, spec: StageSpec, first: bool, last: bool, gv: Any, sub: Any, graph: Any,
                shape_of: Mapping[str, tuple[int, ...]], dpu_shapes: list, xname: Mapping[str, str]) -> Any:
    """The stage's Relax `main`: the first stage starts with main's CPU ops before the DPU call (same variables),
    the last ends with those after it, rebinding the original call variable to the DPU outputs (the ones this
    stage computed, the rest received) so they read it unchanged."""
    from tvm import relax

    bindings: list = []
    if first and not layout.plain:
        params = list(layout.params)
        bindings += layout.prefix
        value_of = {t: a for t, a in zip(graph.inputs, layout.args)}  # DPU input -> its Relax value
    else:
        params = [relax.Var(n, tensor_ty(shape_of[xname.get(n, n)])) for n in spec.inputs]
        value_of = {xname.get(n, n): p for n, p in zip(spec.inputs, params)}
    call = relax.Var("stage_dpu", tensor_ty(dpu_shapes[0]) if len(dpu_shapes) == 1 else
                     relax.TupleType([tensor_ty(s) for s in dpu_shapes]))
    bindings.append(relax.VarBinding(call, relax.Call(gv, [value_of[t] for t in sub.inputs])))

    def value(t: str) -> Any:  # a tensor computed here (item of the call) or received / computed before
        if t in sub.outputs:
            if len(sub.outputs) == 1:
                return call
            item = relax.Var(f"stage_out{len(bindings)}", tensor_ty(shape_of[t]))
            bindings.append(relax.VarBinding(item, relax.TupleGetItem(call, sub.outputs.index(t))))
            return item
        return value_of[t]

    if last and layout.suffix:
        outs = [value(t) for t in graph.outputs]
        bindings.append(relax.VarBinding(layout.call.var, outs[0] if len(outs) == 1 else relax.Tuple(outs)))
        bindings += layout.suffix
        ret, ret_ty = layout.ret, layout.ret_ty
    else:
        outs = [value(xname.get(n, n)) for n in spec.outputs]
        ret_ty = outs[0].ty if len(outs) == 1 else relax.TupleType([o.ty for o in outs])
        ret = relax.Var("stage_result", ret_ty)
        bindings.append(relax.VarBinding(ret, outs[0] if len(outs) == 1 else relax.Tuple(outs)))
    body = relax.SeqExpr([relax.DataflowBlock(bindings)], ret)
    return relax.Function(params, body, ret_ty, True).with_attrs({"num_input": len(params), "global_symbol": "main"})


def _elems(ty: Any) -> int:
    """Elements of a Relax tensor type (a tuple's fields added; 0 when the shape is unknown)."""
    fields = getattr(ty, "fields", None)
    if fields is not None:
        return sum(_elems(f) for f in fields)
    try:
        n = 1
        for v in ty.shape.values:
            n *= int(v)
        return n
    except (AttributeError, TypeError, ValueError):
        return 0


def static_shape(ty: Any) -> tuple[int, ...] | None:
    """The static shape of a Relax tensor type; None for anything else (a tuple, a dynamic shape)."""
    from tvm import relax

    if not isinstance(ty, relax.TensorType) or ty.shape is None or not hasattr(ty.shape, "values"):
        return None
    try:
        return tuple(int(d) for d in ty.shape.values)
    except (TypeError, ValueError):
        return None


def cpu_op_work(binding: Any) -> tuple[int, int] | None:
    """(output elements, multiply-accumulates) of one CPU op binding of `main` (what the host cost model charges
    it: MACs for a convolution or matrix product, none otherwise); None for a binding that calls nothing (a tuple
    item, an alias)."""
    from tvm import relax

    value = getattr(binding, "value", None)
    if not isinstance(value, relax.Call):
        return None
    out = _elems(binding.var.ty)
    op = getattr(value.op, "name", "")
    args = [getattr(a, "ty", None) for a in value.args]
    shapes = [static_shape(t) for t in args]
    macs = 0
    if op in ("relax.nn.conv2d", "relax.nn.conv2d_transpose") and len(shapes) > 1 and shapes[1]:
        w = shapes[1]
        macs = out * int(np.prod(w[1:]))
    elif op in ("relax.matmul", "relax.nn.dense", "relax.linear") and shapes and shapes[0]:
        macs = out * shapes[0][-1]
    return out, macs


def cpu_ops_seconds(cost: Any, bindings: Sequence[Any]) -> float:
    """Host seconds of the CPU ops among Relax `bindings` under the host cost model `cost`."""
    work = [w for w in map(cpu_op_work, bindings) if w is not None]
    return cost.cpu_ops_s([e for e, _ in work], [m for _, m in work])


def host_terms(model: Any, cost: Any, overlap: bool = True) -> Any:
    """The host's share of pipelining `model` (`plan.HostTerms`) under the host cost model `cost`: its input
    and output elements, the CPU ops its first stage runs before the DPU part and its last stage after, and which
    of those two run through the Relax VM (the others pass int8 through: `DpuOnly`); `overlap`: stages
    double-buffered (see plan's module docstring)."""
    from tvm_dpu.pipeline.plan import HostTerms

    layout = main_layout(model)
    ins = sum(int(np.prod(s.shape)) for s in model.inputs)
    return HostTerms(cost, ins, _elems(layout.ret_ty), cpu_ops_seconds(cost, layout.prefix),
                     cpu_ops_seconds(cost, layout.suffix), first_vm=not layout.plain,
                     last_vm=bool(layout.suffix), overlap=overlap)


def compile_stages(model: Any, plan: Plan, fusion: str = "optimal") -> list[tuple]:
    """One (StageSpec, CompiledModel) per stage of `plan`: the stage's ops code-generated for its board's arch
    (with DNNVM fusion `fusion`) and wrapped in a TVM module (see the module docstring)."""
    import tvm
    from tvm import relax

    from tvm_dpu.backend.dpu_compile import compile_subgraph
    from tvm_dpu.security.program_blob import digest_of, pack_program
    from tvm_dpu.runtime.compiled_model import CompiledModel
    from tvm_dpu.runtime.subgraph_runner import SubgraphRunner
    from tvm_dpu.timing.simulate import cycles as program_cycles

    runner = single_subgraph(model)
    graph = runner.graph
    layout = main_layout(model)
    specs = stage_specs(model, plan, layout)
    xname: dict[str, str] = {}  # model input name -> the XGraph input it is (a model whose DPU inputs are its own)
    if layout.plain:
        for t, a in zip(graph.inputs, layout.args):
            xname[model.inputs[next(i for i, p in enumerate(layout.params) if a.same_as(p))].name] = t
    # Graph outputs keep the partition's Relax shapes (what the DPU call returned), other maps the XGraph's.
    shape_of = {t: tuple(graph.tensors[t].shape) for t in graph.tensors}
    shape_of.update({t: tuple(runner.output_shapes[i]) for i, t in enumerate(graph.outputs)})
    shape_of.update({s.name: tuple(s.shape) for s in model.inputs})
    out = []
    for spec in specs:
        first, last = spec.index == 0, spec.index == len(specs) - 1
        sub = graph.extract(spec.ops, name=f"{graph.name}:stage{spec.index}")
        arch = plan.stages[spec.index].board.load()
        csg, _ = compile_subgraph(sub, arch, fusion)
        # compile_subgraph has just simulated this program to choose it: the cycle memo answers.
        spec.predicted_ms = program_cycles(csg.code, arch) / (arch.freq_mhz * 1e6) * 1e3
        symbol = f"tvm_dpu_stage{spec.index}"
        dpu_shapes = [shape_of[t] for t in sub.outputs]
        blob = pack_program(symbol, csg, dpu_shapes)
        fn = dpu_function(symbol, blob, [shape_of[t] for t in sub.inputs], dpu_shapes)
        bb = relax.BlockBuilder()
        gv = bb.add_func(fn, symbol)
        bb.add_func(_stage_main(layout, spec, first, last, gv, sub, graph, shape_of, dpu_shapes, xname), "main")
        mod = relax.transform.Normalize()(bb.get())
        ex = tvm.compile(mod, target="llvm", relax_pipeline="dpu_lowering")
        stage_runner = SubgraphRunner(csg, None, sub, dpu_shapes, digest_of(blob))
        inputs = list(model.inputs) if first and not layout.plain else \
            [InputSpec(n, shape_of[xname.get(n, n)], "float32") for n in spec.inputs]
        outputs = model.output_specs() if last and layout.suffix else \
            [InputSpec(n, shape_of[xname.get(n, n)], "float32") for n in spec.outputs]
        cm = CompiledModel(executable=ex, arch=arch, runners={symbol: stage_runner}, inputs=inputs,
                           subgraph_ids={symbol: 0}, build_info={}, relax_module=mod, outputs=outputs)
        record_int8_io(spec, cm)
        out.append((spec, cm))
    return out
