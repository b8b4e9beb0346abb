"""Pipelines of models with several DPU subgraphs, and CPU ops before, between and after them.

The model's Relax `main` (one dataflow block) is read as a chain of steps in binding order: a CPU binding is one
step (run by a board's ARM cores: a pipeline stage is a whole board, PS and PL); a DPU call is one step per chain
unit of its subgraph (`plan.runner_units`), so a stage may also end inside a subgraph. The planner (`plan_chain`)
cuts the chain into one stage per board as for one subgraph: per-step times (the timing model's for DPU units, the
CPU cost hook's for CPU steps), weights, working sets and the bytes live across each cut.

A value crossing a cut is either an XGraph tensor between two pieces of one subgraph (sent as int8 with its fix
point) or a Relax variable of `main` (a CPU op's result, a DPU call's output or a model input): sent as int8 when it
is a DPU output (its values are int8 multiples of 2**-fix_point), float32 otherwise. A non-tensor value (a tuple)
never crosses: a cut that would send one is not offered to the planner.

Each stage is a real TVM model like a single-subgraph stage (`stages`): a Relax `main` whose parameters are what it
receives, binding the received Relax variables to the original variables, then the stage's CPU bindings unchanged
and one DPU call per piece of a subgraph (its ops extracted from the quantized XGraph and code-generated for the
stage's board), rebinding a DPU call's original variable once its last piece has run. So every op's integer
arithmetic, and every CPU op, is the single-board model's, and the output is bit-identical to it.

CPU cost: the measured host cost model (tvm_dpu.timing.host, the one every pipeline figure uses): a CPU step costs
its stage's ARM cores `cpu_op_seconds` (per op, per output element and per multiply-accumulate, as fitted on
TVM-compiled CPU ops by benchmarks/bench_host.py), counted as host time, not DPU time; every stage also pays the
host terms of a stage that runs through its Relax VM (`plan.HostTerms`). `plan_steps(..., cpu_cost=f)` takes any
`f(binding) -> seconds` instead.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from tvm_dpu.pipeline.plan import (Board, HostTerms, Link, OpCost, Plan, PlanError, plan_chain, runner_units,
                                   tensor_bytes)
from tvm_dpu.pipeline.stages import static_shape
from tvm_dpu.types import unique_name

#: Bytes charged to a cut that would send a non-tensor value: no plan takes it.
_NO_CUT = 1 << 60


def _elems(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def cpu_op_seconds(binding: Any, cost: Any = None) -> float:
    """Predicted seconds of one CPU binding on its stage's host under the host cost model `cost` (default the
    measured one): 0 for a binding that calls nothing."""
    from tvm_dpu.pipeline.stages import cpu_ops_seconds
    from tvm_dpu.timing.host import load_host_cost

    return cpu_ops_seconds(cost if cost is not None else load_host_cost(), [binding])


@dataclass
class Step:
    """One step of the chain: a CPU binding, or one chain unit of DPU subgraph `graph_index`."""

    name: str
    binding: Any  # the Relax binding (the DPU call's, for a DPU unit)
    uses: list[str]
    defines: list[str]
    graph_index: int | None = None
    unit: Any = None  # plan.ChainUnit
    closes_call: bool = False  # the DPU call's last unit: the call's variable is bound after it


@dataclass
class Steps:
    """A model's `main` as a chain of steps, with every value a step defines or uses (by key)."""

    steps: list[Step]
    runners: list[Any]  # SubgraphRunner per DPU call, in call order
    calls: list[Any]  # the DPU call binding per subgraph
    var_of: dict[str, Any]  # key -> Relax Var (values of main)
    key_of: dict[Any, str]  # Relax Var -> key
    shape_of: dict[str, tuple[int, ...] | None]
    fix_point_of: dict[str, int]  # keys sent as int8
    bytes_of: dict[str, int]
    final_uses: list[str]
    params: list[Any]
    ret: Any
    ret_ty: Any
    input_key: list[dict[str, str]] = field(default_factory=list)  # per subgraph: graph input tensor -> key

    def tensor_key(self, g: int, t: str) -> str:
        """The key of XGraph tensor `t` of subgraph `g` (a graph input: the Relax value fed to it)."""
        return self.input_key[g].get(t, f"sg{g}:{t}")


def model_steps(model: Any) -> Steps:
    """The steps of `model`'s Relax `main` (see module docstring); PlanError when it cannot be split."""
    from tvm import relax

    mod = model.relax_module
    if mod is None:
        raise PlanError("splitting a model needs its Relax module (a model built in this process with tvm_dpu.build)")
    for symbol, r in model.runners.items():
        if r.graph is None:
            raise PlanError(f"splitting a model needs the quantized XGraph of every DPU subgraph ({symbol} has none: "
                            "an artifact without verification data)")
    main = mod["main"]
    body = main.body
    if len(body.blocks) != 1:
        raise PlanError("a pipeline splits a model whose main function is one dataflow block")
    key_of: dict[Any, str] = {}
    taken: set[str] = set()

    def name(v: Any, want: str) -> str:
        key_of[v] = key = unique_name(want, taken)
        return key

    for p, spec in zip(main.params, model.inputs):  # stage 0 receives them under the model's input names
        name(p, spec.name)
    out = Steps([], [], [], {}, key_of, {}, {}, {}, [], list(main.params), body.body, main.ret_ty)
    for b in body.blocks[0].bindings:
        name(b.var, b.var.name)
    for v, key in key_of.items():
        out.var_of[key] = v
        out.shape_of[key] = static_shape(v.ty)
    dpu_call_of: dict[Any, tuple[int, int | None]] = {}  # DPU output var -> (subgraph, output index or None)
    for b in body.blocks[0].bindings:
        value = b.value
        is_dpu = isinstance(value, relax.Call) and isinstance(value.op, relax.GlobalVar) and \
            value.op.name_hint in model.runners
        if not is_dpu:
            if isinstance(value, relax.TupleGetItem) and value.tuple_value in dpu_call_of:
                dpu_call_of[b.var] = (dpu_call_of[value.tuple_value][0], int(value.index))
            uses = sorted({key_of[v] for v in relax.analysis.free_vars(value)})
            out.steps.append(Step(f"cpu:{key_of[b.var]}", b, uses, [key_of[b.var]]))
            continue
        g = len(out.runners)
        runner = model.runners[value.op.name_hint]
        graph = runner.graph
        out.runners.append(runner)
        out.calls.append(b)
        if len(value.args) != len(graph.inputs) or not all(isinstance(a, relax.Var) for a in value.args):
            raise PlanError(f"DPU call {b.var.name}: its arguments are not one variable per subgraph input")
        out.input_key.append({t: key_of[a] for t, a in zip(graph.inputs, value.args)})
        dpu_call_of[b.var] = (g, None if len(graph.outputs) > 1 else 0)
        for i, t in enumerate(graph.outputs):
            out.shape_of[f"sg{g}:{t}"] = tuple(runner.output_shapes[i])
        for t, tensor in graph.tensors.items():
            out.shape_of.setdefault(f"sg{g}:{t}", tuple(tensor.shape))
            if tensor.fix_point is not None and tensor.dtype == "int8" and t not in graph.inputs:
                out.fix_point_of[f"sg{g}:{t}"] = int(tensor.fix_point)
                out.bytes_of[f"sg{g}:{t}"] = tensor_bytes(graph, t)
        units = runner_units(runner)
        for u, unit in enumerate(units):
            uses = sorted({out.tensor_key(g, t) for op in unit.ops for t in op.inputs if not graph.tensors[t].is_const})
            defines = [f"sg{g}:{t}" for op in unit.ops for t in op.outputs]
            last = u == len(units) - 1
            if last:
                uses = sorted(set(uses) | {out.tensor_key(g, t) for t in graph.outputs})
                defines.append(key_of[b.var])
            out.steps.append(Step(f"sg{g}:{unit.name}", b, uses, defines, g, unit, last))
    for var, (g, i) in dpu_call_of.items():  # a DPU output travels as the int8 it is
        t = out.runners[g].graph.outputs[i] if i is not None else None
        if t is not None and f"sg{g}:{t}" in out.fix_point_of:
            out.fix_point_of[key_of[var]] = out.fix_point_of[f"sg{g}:{t}"]
    for key, shape in out.shape_of.items():
        if key not in out.bytes_of:
            out.bytes_of[key] = _NO_CUT if shape is None else \
                _elems(shape) * (1 if key in out.fix_point_of else 4)
    out.final_uses = sorted({key_of[v] for v in relax.analysis.free_vars(body.body)})
    return out


def _liveness(steps: Steps) -> tuple[dict[str, int], dict[str, int]]:
    """Per key: the step defining it (-1: a model input) and the last step using it (len(steps): the output)."""
    produced: dict[str, int] = {steps.key_of[p]: -1 for p in steps.params}
    last_use: dict[str, int] = {}
    for i, st in enumerate(steps.steps):
        for k in st.uses:
            last_use[k] = max(last_use.get(k, -1), i)
        for k in st.defines:
            produced.setdefault(k, i)
    for k in steps.final_uses:
        last_use[k] = len(steps.steps)
    return produced, last_use


def step_chain(model: Any, boards: Sequence[Board], cpu_cost: Callable[[Any], float] | None = None,
               steps: Steps | None = None) -> list[OpCost]:
    """The planner's chain (`OpCost` per step) of a model with any number of DPU subgraphs: DPU units timed by the
    timing model per board arch, CPU steps by `cpu_cost` (default `cpu_op_seconds` under the measured host cost
    model) as host time, the same on every board."""
    from tvm_dpu.timing.simulate import simulate

    steps = steps or model_steps(model)
    cpu_cost = cpu_cost or _default_cpu_cost()
    archs = {b.arch: b for b in boards}
    unit_s: dict[tuple[int, str], list[float]] = {}
    for g, runner in enumerate(steps.runners):
        for a, b in archs.items():
            timing = simulate(runner.sg.code, b.load(), op_ranges=runner.sg.op_ranges)
            unit_s[(g, a)] = [ot.cycles / timing.freq_hz for ot in timing.ops]
    produced, last_use = _liveness(steps)
    unit_index: dict[int, int] = {}
    out = []
    for i, st in enumerate(steps.steps):
        host_s = 0.0
        if st.graph_index is None:
            host_s = float(cpu_cost(st.binding))
            seconds = {a: 0.0 for a in archs}
            param_bytes = 0
            work = sum(steps.bytes_of[k] for k in set(st.uses) | set(st.defines) if steps.bytes_of[k] < _NO_CUT)
        else:
            g = st.graph_index
            u = unit_index.get(g, 0)
            unit_index[g] = u + 1
            seconds = {a: unit_s[(g, a)][u] for a in archs}
            graph = steps.runners[g].graph
            param_bytes = sum(tensor_bytes(graph, t) for op in st.unit.ops for t in op.params.values())
            fmaps = {t for op in st.unit.ops for t in list(op.inputs) + list(op.outputs)
                     if t in graph.tensors and graph.tensors[t].data is None}
            work = sum(tensor_bytes(graph, t) for t in fmaps)
        cut = sum(steps.bytes_of[k] for k, p in produced.items() if p <= i < last_use.get(k, -1))
        out.append(OpCost(st.name, seconds, param_bytes, work, min(cut, _NO_CUT), host_s))
    return out


def _default_cpu_cost() -> Callable[[Any], float]:
    from tvm_dpu.timing.host import load_host_cost

    cost = load_host_cost()
    return lambda binding: cpu_op_seconds(binding, cost)


def step_host_terms(model: Any, cost: Any, overlap: bool = True) -> HostTerms:
    """The host terms of a step pipeline: every stage runs through its Relax VM (CPU steps and several DPU pieces
    may share it), receiving the model's float inputs first and returning its outputs last; its CPU steps are in
    the chain."""
    ins = sum(_elems(s.shape) for s in model.inputs)
    outs = sum(_elems(s.shape) for s in model.output_specs())
    return HostTerms(cost, ins, outs, first_vm=True, last_vm=True, middle_vm=True, overlap=overlap)


def plan_steps(model: Any, boards: Sequence[Board], link: Link, cpu_cost: Callable[[Any], float] | None = None,
               host_cost: Any = True) -> Plan:
    """The best plan of a model with several DPU subgraphs over `boards` (see `plan_chain`). `host_cost`: the host
    cost model charged per stage and for the CPU steps (True: the measured one; a `HostCost`; None: CPU steps by
    `cpu_cost` only)."""
    host = None
    if host_cost is not None and host_cost is not False:
        from tvm_dpu.timing.host import load_host_cost

        cost = load_host_cost() if host_cost is True else host_cost
        host = step_host_terms(model, cost)
        if cpu_cost is None:
            cpu_cost = lambda binding: cpu_op_seconds(binding, cost)  # noqa: E731 - one cost model for both
    return plan_chain(step_chain(model, boards, cpu_cost), boards, link, host)


class _Stage:
    """One stage of a step plan being built: its Relax bindings (CPU steps of the model, DPU pieces compiled for
    the stage's board), the environment of tensor keys to Relax values, its runners and predicted time."""

    def __init__(self, steps: Any, s: int, arch: Any, fusion: str) -> None:
        from tvm import relax

        self.steps, self.s, self.arch, self.fusion = steps, s, arch, fusion
        self.bb = relax.BlockBuilder()
        self.bindings: list = []
        self.env: dict[str, Any] = {}
        self.params: list = []
        self.runners: dict[str, Any] = {}
        self.predicted_s = 0.0

    def take_inputs(self, inputs: list[str]) -> None:
        from tvm import relax

        from tvm_dpu.pipeline.stages import tensor_ty

        steps = self.steps
        for key in inputs:
            if steps.shape_of.get(key) is None:
                raise PlanError(f"stage {self.s} would receive {key!r}, which is not a tensor")
            p = relax.Var(key.replace(":", "_"), tensor_ty(steps.shape_of[key]))
            self.params.append(p)
            if key in steps.var_of:  # the stage's bindings read the original variable
                self.bindings.append(relax.VarBinding(steps.var_of[key], p))
            self.env[key] = steps.var_of.get(key, p)

    def add_steps(self, first: int, end: int, cpu_cost: Callable[[Any], float]) -> None:
        """The model's steps [first, end): CPU bindings as they are, each run of one DPU subgraph's steps as one
        compiled piece."""
        steps, i = self.steps, first
        while i < end:
            step = steps.steps[i]
            if step.graph_index is None:
                self.bindings.append(step.binding)
                self.env[step.defines[0]] = step.binding.var
                self.predicted_s += float(cpu_cost(step.binding))
                i += 1
                continue
            j = i
            while j < end and steps.steps[j].graph_index == step.graph_index:
                j += 1
            self.add_piece(step.graph_index, steps.steps[i:j])
            i = j

    def add_piece(self, g: int, piece: list) -> None:
        """The ops of DPU subgraph `g` in `piece`, extracted, compiled for the stage's board and called."""
        from tvm import relax

        from tvm_dpu.backend.dpu_compile import compile_subgraph
        from tvm_dpu.pipeline.stages import dpu_function, tensor_ty
        from tvm_dpu.security.program_blob import digest_of, pack_program
        from tvm_dpu.runtime.subgraph_runner import SubgraphRunner
        from tvm_dpu.timing.simulate import cycles as program_cycles

        steps, s, arch, env = self.steps, self.s, self.arch, self.env
        graph = steps.runners[g].graph
        sub = graph.extract([op.name for p_ in piece for op in p_.unit.ops], name=f"{graph.name}:stage{s}")
        csg, _ = compile_subgraph(sub, arch, self.fusion)
        self.predicted_s += program_cycles(csg.code, arch) / (arch.freq_mhz * 1e6)
        symbol = f"tvm_dpu_stage{s}_sg{g}"
        out_shapes = [steps.shape_of[f"sg{g}:{t}"] for t in sub.outputs]
        in_keys = [steps.tensor_key(g, t) for t in sub.inputs]
        blob = pack_program(symbol, csg, out_shapes)
        gv = self.bb.add_func(dpu_function(symbol, blob, [steps.shape_of[key] for key in in_keys], out_shapes), symbol)
        call = relax.Var(f"stage_sg{g}", tensor_ty(out_shapes[0]) if len(out_shapes) == 1 else
                         relax.TupleType([tensor_ty(x) for x in out_shapes]))
        self.bindings.append(relax.VarBinding(call, relax.Call(gv, [env[key] for key in in_keys])))
        for n, t in enumerate(sub.outputs):
            if len(sub.outputs) == 1:
                env[f"sg{g}:{t}"] = call
            else:
                item = relax.Var(f"stage_sg{g}_{n}", tensor_ty(out_shapes[n]))
                self.bindings.append(relax.VarBinding(item, relax.TupleGetItem(call, n)))
                env[f"sg{g}:{t}"] = item
        self.runners[symbol] = SubgraphRunner(csg, None, sub, out_shapes, digest_of(blob))
        if piece[-1].closes_call:  # the model's own call variable, as its CPU ops read it
            outs = [env[f"sg{g}:{t}"] for t in graph.outputs]
            var = steps.calls[g].var
            self.bindings.append(relax.VarBinding(var, outs[0] if len(outs) == 1 else relax.Tuple(outs)))
            env[steps.key_of[var]] = var

    def module(self, model: Any, outputs: list[str] | None) -> Any:
        """The stage's IRModule: main returns `outputs` (None: the model's own result, the last stage), with the
        model's CPU functions its bindings call."""
        from tvm import relax

        bindings, steps = self.bindings, self.steps
        cpu_funcs: dict = {}
        for b in bindings:  # CPU functions of the model the stage's bindings call
            for gv in relax.analysis.all_global_vars(b.value):
                if gv.name_hint not in model.runners and not gv.name_hint.startswith("tvm_dpu_stage"):
                    cpu_funcs[gv] = model.relax_module[gv]
        if outputs is None:
            ret, ret_ty = steps.ret, steps.ret_ty
        else:
            missing = [key for key in outputs if key not in self.env]
            if missing:
                raise PlanError(f"stage {self.s} cannot send {missing}")
            values = [self.env[key] for key in outputs]
            ret_ty = values[0].ty if len(values) == 1 else relax.TupleType([v.ty for v in values])
            ret = relax.Var("stage_result", ret_ty)
            bindings.append(relax.VarBinding(ret, values[0] if len(values) == 1 else relax.Tuple(values)))
        body = relax.SeqExpr([relax.DataflowBlock(bindings)], ret)
        main = relax.Function(self.params, body, ret_ty, True).with_attrs({"num_input": len(self.params),
                                                                          "global_symbol": "main"})
        self.bb.add_func(main, "main")
        mod = self.bb.get()
        for gv, fn in cpu_funcs.items():
            mod[gv] = fn
        return relax.transform.Normalize()(mod)


def _stage_io(model: Any, steps: Any, s: int, k: int, first: int, end: int, produced: dict, last_use: dict
              ) -> tuple[list[str], list[str]]:
    """The tensor keys stage `s` of `k` (steps [first, end)) receives and sends."""
    live = sorted(produced.items(), key=lambda kv: (kv[1], kv[0]))
    inputs = [key for key, p in live if p < first <= last_use.get(key, -1)]
    if s == 0:  # the first stage takes the model's inputs as the model does
        inputs = [i.name for i in model.inputs if i.name in inputs]
    if s < k - 1:
        outputs = [key for key, p in live if p < end <= last_use.get(key, -1)]
    else:
        outputs = [o.name for o in model.output_specs()]
    return inputs, outputs


def compile_step_stages(model: Any, plan: Plan, fusion: str = "optimal",
                        cpu_cost: Callable[[Any], float] | None = None) -> list[tuple]:
    """One (StageSpec, CompiledModel) per stage of `plan` (made by `plan_steps` for this model)."""
    import tvm

    from tvm_dpu.pipeline.stages import StageSpec, record_int8_io
    from tvm_dpu.runtime.compiled_model import CompiledModel
    from tvm_dpu.types import InputSpec

    steps = model_steps(model)
    if [s.name for s in steps.steps] != list(plan.ops):
        raise PlanError("the plan was not made for this model (its step chain differs)")
    cpu_cost = cpu_cost or _default_cpu_cost()
    produced, last_use = _liveness(steps)
    k = len(plan.stages)
    model_inputs = {s.name: s for s in model.inputs}
    out = []
    for s, st in enumerate(plan.stages):
        arch = st.board.load()
        first, end = st.first, st.end
        inputs, outputs = _stage_io(model, steps, s, k, first, end, produced, last_use)
        stage = _Stage(steps, s, arch, fusion)
        stage.take_inputs(inputs)
        stage.add_steps(first, end, cpu_cost)
        mod = stage.module(model, outputs if s < k - 1 else None)
        ex = tvm.compile(mod, target="llvm", relax_pipeline="dpu_lowering")
        spec = StageSpec(
            index=s, board=st.board.name, arch=st.board.arch, part=st.board.part,
            ops=[x.name for x in steps.steps[first:end]], inputs=inputs, outputs=outputs,
            wire_fix_points={key: steps.fix_point_of[key] for key in outputs
                             if key in steps.fix_point_of and s < k - 1},
            predicted_ms=stage.predicted_s * 1e3,
            send_bytes=sum(steps.bytes_of[key] for key in outputs) if s < k - 1 else 0)
        in_specs = [model_inputs[key] if key in model_inputs and s == 0 else
                    InputSpec(key, steps.shape_of[key], "float32") for key in inputs]
        out_specs = model.output_specs() if s == k - 1 else \
            [InputSpec(key, steps.shape_of[key], "float32") for key in outputs]
        cm = CompiledModel(executable=ex, arch=arch, runners=stage.runners, inputs=in_specs,
                           subgraph_ids={sym: n for n, sym in enumerate(stage.runners)},
                           build_info={}, relax_module=mod, outputs=out_specs)
        record_int8_io(spec, cm)
        out.append((spec, cm))
    return out
