"""Compile every DPU partition of a partitioned Relax module: float XGraph, calibration, quantization, code
generation; each partition function gets its program (program_blob bytes) as the attribute `tvm_dpu.program`,
which `relax.ext.dpu` (ext_module.py) embeds in TVM's module.

Calibration runs the partitioned model in the Relax VM with every DPU partition replaced by a call to
`tvm_dpu.calibration(index, ...)`, which runs the float reference of that partition's XGraph and records its
inputs; each partition then gets its fix_points from its own recorded inputs. The recording belongs to the
calibration run (a context variable), never to a process-wide table.
"""
from __future__ import annotations

import contextvars
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

import tvm_dpu.templates as tpl
from tvm_dpu.arch.arch import Arch, family_supports, require_support
from tvm_dpu.errors import DPUError
from tvm_dpu.backend.ext_module import PROGRAM_ATTR, cpu_lowering
from tvm_dpu.security.container import section_span
from tvm_dpu.util.blas import free_cores, openblas_threads
from tvm_dpu.util.phase_times import PhaseClock
from tvm_dpu.util.progress import progress_bar
from tvm_dpu.security.program_blob import plugin_summary, program_parts, unpack_plugin_program
from tvm_dpu.types import InputSpec, unique_name

CALIBRATION_FUNC = "tvm_dpu.calibration"


@dataclass
class DPUPartition:
    """One compiled DPU partition."""

    symbol: str
    float_graph: Any  # passes.from_relax.FloatSubgraph
    qgraph: Any  # the quantized XGraph (golden verification)
    sg: Any  # codegen CompiledSubgraph
    plan: Any  # fusion plan
    blob: memoryview  # program_blob bytes, what the module embeds (a read-only view of its PROGRAM_ATTR tensor)
    multicore: Any = None  # backend.multicore.MulticoreInfo when compiled for several cores
    segments: Any = None  # program_blob.Multicore: the segments and schedule the blob carries (None: one program)

    @property
    def output_shapes(self) -> list[tuple[int, ...]]:
        return [tuple(s) for s in self.float_graph.output_shapes]


@dataclass
class DPUCompileResult:
    """The partitioned module with every DPU function's program attached, and what the build learnt."""

    module: tvm.IRModule
    arch: Arch
    inputs: list[InputSpec]
    partitions: dict[str, DPUPartition]
    report: Any = None  # passes.PartitionReport (None for a module partitioned by the caller)
    subgraph_ids: dict[str, int] = field(default_factory=dict)
    info: dict = field(default_factory=dict)


def input_specs(mod: tvm.IRModule) -> list[InputSpec]:
    """Inputs of `main` (ValueError-free: DPUError for a dynamic shape)."""
    specs = []
    for p in mod["main"].params:
        ty = p.ty
        try:
            shape = tuple(int(v) for v in ty.shape.values)
        except (AttributeError, TypeError, ValueError):
            raise DPUError(f"model input {p.name!r} has no static shape; give shapes when importing") from None
        specs.append(InputSpec(p.name, shape, str(ty.dtype)))
    return specs


def codegen_functions(mod: tvm.IRModule, codegen: str) -> dict[str, relax.Function]:
    """Partition symbol -> function, for every function with Codegen=`codegen` (sorted by symbol)."""
    out = {}
    for gv, fn in mod.functions.items():
        if isinstance(fn, relax.Function) and fn.attrs is not None and str(fn.attrs.get("Codegen", "")) == codegen:
            out[gv.name_hint] = fn
    return dict(sorted(out.items()))


def available_memory_bytes() -> int:
    """Memory this process can still allocate (MemAvailable; the physical total where /proc is absent)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


#: Peak memory of a compile beyond what the process already holds, per byte of the largest feature map as
#: float32. Measured as peak RSS growth of a 4-layer 3x3 conv chain compiled at 512, 1024 and 2048 px input:
#: 6.0-6.8x (12x before the calibration reservoir drew in bounded pieces). Calibration runs the float reference
#: in float64, so the largest op holds its input and output (2 x 2x) plus an activation temporary (2x), and the
#: statistics a float32 copy and bounded draws. 8 leaves a margin for graphs that keep a skip tensor alive.
PEAK_PER_MAP_BYTE = 8


def _largest_map(mod: tvm.IRModule) -> tuple[int, str]:
    """(float32 bytes, name) of the largest tensor any Relax function of `mod` binds: main's own, and the feature
    maps inside each DPU partition, which calibration's float reference materialises too."""
    largest, where = 0, ""
    for gv, fn in mod.functions.items():
        if not isinstance(fn, relax.Function) or not hasattr(fn.body, "blocks"):
            continue
        for block in fn.body.blocks:
            for b in block.bindings:
                try:
                    n = int(np.prod([int(v) for v in b.var.ty.shape.values], dtype=np.float64))
                except (AttributeError, TypeError, ValueError):
                    continue
                if n * 4 > largest:
                    largest, where = n * 4, f"{b.var.name} in {gv.name_hint}"
    return largest, where


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            import os

            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def check_memory(mod: tvm.IRModule, inputs: list[InputSpec]) -> None:
    """Refuse shapes whose compile cannot fit in memory, before anything is allocated: the estimated peak (what
    the process holds now plus PEAK_PER_MAP_BYTE times the largest feature map of any function, as float32)
    must fit in the memory available now."""
    largest, where = _largest_map(mod)
    for s in inputs:
        n = int(np.prod(s.shape, dtype=np.float64)) * 4
        if n > largest:
            largest, where = n, f"input {s.name!r}"
    avail = available_memory_bytes()
    need = PEAK_PER_MAP_BYTE * largest
    if need > avail:
        from tvm_dpu.errors import InputError

        shapes = ", ".join(f"{s.name}={list(s.shape)}" for s in inputs)
        raise InputError(f"input shape(s) {shapes}: the largest feature map ({where}) is {largest / 2**30:.2f} GiB "
                         f"as float32, and compiling it needs about {PEAK_PER_MAP_BYTE}x that ({need / 2**30:.1f} "
                         f"GiB: the float64 calibration reference and its statistics) beyond the "
                         f"{_rss_bytes() / 2**30:.1f} GiB this process holds; {avail / 2**30:.1f} GiB are available: "
                         "use smaller input shapes")


def dpu_functions(mod: tvm.IRModule) -> dict[str, relax.Function]:
    """Partition symbol -> function, for every function with Codegen="dpu" (sorted by symbol)."""
    return codegen_functions(mod, "dpu")


def is_partitioned(mod: tvm.IRModule) -> bool:
    return bool(dpu_functions(mod))


@dataclass
class ExternalCompiler:
    """How partitions of another codegen (a custom-IP plugin) are calibrated and compiled beside the DPU's:
    `float_reference(function, symbol, inputs) -> outputs` during the calibration run, then
    `compile(function, symbol, recorded inputs) -> program bytes` (attached as the `tvm_dpu.program` attribute
    that the codegen `relax.ext.<codegen>` embeds)."""

    codegen: str
    float_reference: Callable[[relax.Function, str, list[np.ndarray]], list[np.ndarray]]
    compile: Callable[[relax.Function, str, list[list[np.ndarray]]], bytes]


# ---------------------------------------------------------------------------------------------------------
# Calibration run
# ---------------------------------------------------------------------------------------------------------
#: Evaluates one partition on float inputs during calibration (and records them): float arrays -> float arrays.
Evaluator = Callable[[list[np.ndarray]], list[np.ndarray]]


@dataclass
class _CalibrationRun:
    evaluators: list[Evaluator]  # per partition index


_CALIBRATION: contextvars.ContextVar[_CalibrationRun | None] = contextvars.ContextVar("tvm_dpu_calibration",
                                                                                      default=None)


def _calibration_call(index: int, *args: Any) -> None:
    run = _CALIBRATION.get()
    if run is None:
        raise DPUError("tvm_dpu.calibration was called outside a tvm-dpu calibration run")
    evaluate = run.evaluators[int(index)]
    n_out = len(args) - evaluate.n_inputs
    outs = evaluate([np.from_dlpack(a) for a in args[:len(args) - n_out]])
    for dst, val in zip(args[len(args) - n_out:], outs):
        dst.copyfrom(np.ascontiguousarray(np.asarray(val, dtype=np.float32).reshape(tuple(dst.shape))))


def _dpu_evaluator(fs: Any, collector: Any) -> Evaluator:
    """The partition's float reference for the calibration run; with a `StatsCollector`, the same evaluation also
    folds every feature map into the calibration statistics (one float run per sample, not two)."""
    from tvm_dpu.xgraph.float_ref import run_graph_float

    def evaluate(inputs: list[np.ndarray]) -> list[np.ndarray]:
        # the XGraph is one image; a batch of N goes through the float reference at once (its ops take any N)
        feeds = {name: np.asarray(a).reshape((-1, *fs.graph.tensors[name].shape[1:])).astype(np.float32)
                 for name, a in zip(fs.input_names, inputs)}
        res = collector.run(feeds) if collector is not None else run_graph_float(fs.graph, feeds)
        return [res[name] for name in fs.output_names]

    evaluate.n_inputs = len(fs.input_names)
    return evaluate


def _external_evaluator(ext: ExternalCompiler, fn: relax.Function, symbol: str, record: list) -> Evaluator:
    def evaluate(inputs: list[np.ndarray]) -> list[np.ndarray]:
        inputs = [np.array(a, dtype=np.float32) for a in inputs]
        record.append(inputs)
        return ext.float_reference(fn, symbol, inputs)

    evaluate.n_inputs = len(fn.params)
    return evaluate


def register_calibration() -> None:
    tvm_ffi.register_global_func(CALIBRATION_FUNC, _calibration_call, override=True)


@mutator
class _ToCalibrationCalls(PyExprMutator):
    """Calls of DPU partition functions -> call_dps_packed("tvm_dpu.calibration", (index, *args))."""

    def __init__(self, mod: tvm.IRModule, index: dict[str, int]):
        super().__init__(mod)
        self.index = index

    def visit_call_(self, call):
        call = super().visit_call_(call)
        op = call.op
        if isinstance(op, tvm.ir.GlobalVar) and op.name_hint in self.index:
            args = [relax.prim_value(self.index[op.name_hint]), *call.args]
            fields = getattr(call.ty, "fields", None)  # a tuple of outputs: DPS takes the list of tensor types
            return relax.call_dps_packed(CALIBRATION_FUNC, args, out_ty=list(fields) if fields is not None else call.ty)
        return call


def calibration_module(mod: tvm.IRModule, symbols: list[str]) -> tvm.IRModule:
    """`mod` with every DPU partition call replaced by a calibration call (partition i -> index i)."""
    index = {s: i for i, s in enumerate(symbols)}
    main = _ToCalibrationCalls(mod, index).visit_expr(mod["main"])
    out = tvm.IRModule({gv: fn for gv, fn in mod.functions.items() if gv.name_hint not in index})
    out[out.get_global_var("main")] = main
    return out.with_attrs(mod.attrs) if mod.attrs is not None else out


def run_calibration(mod: tvm.IRModule, symbols: list[str], evaluators: list[Evaluator],
                    batches: list[list[np.ndarray]], progress: bool) -> None:
    """Run the model on `batches` with `evaluators[i]` (float references that record their inputs) behind
    partition `symbols[i]`."""
    run = _CalibrationRun(evaluators)
    if not batches:
        return
    ex = tvm.compile(calibration_module(mod, symbols), target="llvm", relax_pipeline=cpu_lowering())
    vm = relax.VirtualMachine(ex, tvm.cpu())
    it = progress_bar(batches, progress, desc="calibrating", unit="batch", leave=False)
    token = _CALIBRATION.set(run)
    try:
        # the float reference's float64 products on the cores the other jobs leave free (util.blas.free_cores)
        with openblas_threads(free_cores()):
            for batch in it:
                vm["main"](*[tvm.runtime.tensor(a) for a in batch])
    finally:
        _CALIBRATION.reset(token)


# ---------------------------------------------------------------------------------------------------------
# Per-partition compile
# ---------------------------------------------------------------------------------------------------------
def program_function(params: Sequence[relax.Var], out_shapes: Sequence[Sequence[int]],
                     attrs: Mapping[str, Any]) -> relax.Function:
    """A DPU partition function as RunCodegen needs it: `params`, `attrs` (Codegen, global_symbol, the program)
    and a body that only has the right type (float32 zeros of `out_shapes`; it is never lowered or run), so the
    module does not keep a compiled partition's float weights (VGG-16: 0.5 GB) alive."""
    zeros = [relax.op.zeros(relax.ShapeExpr([int(d) for d in s]), "float32") for s in out_shapes]
    types = [relax.TensorType([int(d) for d in s], "float32") for s in out_shapes]
    body, ret = (zeros[0], types[0]) if len(zeros) == 1 else (relax.Tuple(zeros), relax.TupleType(types))
    return relax.Function(list(params), body, ret).with_attrs(dict(attrs))


def program_tensor(*parts: Any) -> tvm.runtime.Tensor:
    """The bytes `parts` (buffers, in order) as the uint8 TVM tensor a partition's PROGRAM_ATTR holds, each copied
    once straight into TVM's memory (a program is never joined into Python bytes first)."""
    views = [memoryview(p).cast("B") for p in parts]
    tensor = tvm.runtime.empty((sum(v.nbytes for v in views),), "uint8")
    out, pos = np.from_dlpack(tensor), 0
    for v in views:
        out[pos:pos + v.nbytes] = np.frombuffer(v, dtype=np.uint8)
        pos += v.nbytes
    return tensor


def _params_in_program(csg: Any, blob: memoryview) -> None:
    """Point `csg.params` at the parameter section of its packed program `blob` (a read-only view): the module's
    copy is then the only one (VGG-16: 140 MB)."""
    offset, nbytes = section_span(blob, "params")
    assert nbytes == csg.params.nbytes, "the program's params section is not the subgraph's parameters"
    csg.params = np.frombuffer(blob, dtype=np.uint8, count=nbytes, offset=offset)


#: Subgraphs of at most this many ops compare greedy's whole program even when the search settled its regions in
#: context (fallback_modes): a compile of so few ops costs next to nothing (a ResNet-50, about 70 ops, would pay
#: about a second more).
GREEDY_RECHECK_OPS = 32


def fallback_modes(plan, n_ops: int = 0) -> tuple[str, ...]:
    """The simpler plans compile_subgraph compiles and simulates against a searched `plan` of a graph of `n_ops`
    ops, keeping the fastest: the unfused one, and greedy's unless the search already settled every region where
    it differs from greedy in context (fusion.select._in_context, with the simulator as the cost source:
    `stats["in_context"]`), which is the same comparison made where it matters, so the whole greedy program is not
    compiled again. Small graphs (GREEDY_RECHECK_OPS) compare greedy's anyway: the in-context windows compare
    groupings before the lone convs get their variants, which can reverse a near tie (ShuffleNetV2's stage4
    blocks, B4096: pw_dw_pw 1,033 cycles, pw_dw and a lone pointwise conv with its split_weights variant 1,028)."""
    if plan.mode == "optimal":
        settled = plan.stats.get("in_context") is not None and n_ops > GREEDY_RECHECK_OPS
        return ("none",) if settled else ("greedy", "none")
    return ("none",) if plan.mode == "greedy" else ()


#: Templates whose plans compile_subgraph also compares with the same search without them (TemplateDef.recheck):
#: a pw_dw_pw chain keeps the next op's LOADs waiting for its last CONVs (fused_pw_dw_pw), which its piece costed
#: alone does not show (ShuffleNetV2 stage2.0 on B1152: 8,751 cycles with the chain, 8,635 without).
RECHECKED_TEMPLATES = tuple(name for name, d in tpl.registry().items() if d.recheck)

#: A simpler plan (fallback_modes) whose program is within this fraction of the fastest one's cycles is compared
#: with it after both get their conv variants (fusion.select.compile_with_variants): the variants shorten lone
#: convs only, so a plan with more of them can overtake a fused one they left just ahead (a ShuffleNetV2 block on
#: B1152: fused 2,162 cycles against 2,170 unfused, 2,133 with the unfused plan's variants).
VARIANT_MARGIN = 0.05


def compile_subgraph(graph, arch: Arch, fusion: str = "optimal"):
    """Quantized XGraph -> (CompiledSubgraph, FusionPlan) with DNNVM fusion `fusion`.

    The plan the search chooses is kept unless a simpler one (`fallback_modes`) simulates faster: fusion is never
    slower than none on the simulator, and "optimal" never slower than greedy in any region where the two differ.
    `plan.stats["simulated_fallback"]` names the plan kept instead ("greedy" or "none", or the search's own mode
    when its plan without RECHECKED_TEMPLATES is kept: then `stats["searched_without"]` names them), or is None.

    Then every conv the plan leaves alone gets the instruction-sequence variant the timing model predicts fastest
    (kernel polymorphism, fusion.select.compile_with_variants; bit-identical); `plan.stats["conv_variants"]` gives
    each candidate's predicted cycles and the choice. Plans within VARIANT_MARGIN of the fastest are compared after
    their variants."""
    from tvm_dpu.codegen.compiler import compile_graph_fused, single_op_plan
    from tvm_dpu.fusion.select import compile_with_fusion, compile_with_variants
    from tvm_dpu.timing.simulate import cycles as program_cycles

    if not family_supports(arch, "fusion"):  # no fused pipelines nor timing model to choose them by: ops alone
        plan = single_op_plan(graph)
        return compile_graph_fused(graph, arch, plan), plan
    csg, plan = compile_with_fusion(graph, arch, fusion)
    if fusion == "none" or not plan.fused():
        return compile_with_variants(graph, arch, plan, csg)
    searched = plan
    timed = [(program_cycles(csg.code, arch), None, plan, csg)]
    modes = [(m, ()) for m in fallback_modes(plan, len(graph.ops))]
    if any(tpl.get(g.template).recheck for g in plan.groups):
        modes.append((plan.mode, RECHECKED_TEMPLATES))
    for mode, without in modes:  # timed only: compiled without a copy of the weights
        c, p = compile_with_fusion(graph, arch, mode, keep_params=False, without=without)
        if p.groups == plan.groups:
            continue  # the same program
        if without:
            p.stats["searched_without"] = list(without)
        timed.append((program_cycles(c.code, arch), mode, p, c))
        del c
    best = min(timed, key=lambda t: t[0])
    close = [t for t in timed if t[0] <= best[0] * (1 + VARIANT_MARGIN)]
    finals = []
    for cyc, mode, p, c in close:
        if mode is not None:
            c = compile_graph_fused(graph, arch, p)  # now with its parameters
        c, p = compile_with_variants(graph, arch, p, c)
        finals.append((program_cycles(c.code, arch), mode, p, c))
    _, kept, plan, csg = min(finals, key=lambda t: t[0])
    if kept is not None:
        plan.stats.update(searched=searched.mode, searched_cost=searched.cost)
    plan.stats["simulated_fallback"] = kept
    return csg, plan


def _adopt(mod: tvm.IRModule, pmod: tvm.IRModule) -> bool:
    """Rewrite `mod` in place into the functions of `pmod` (partitioned from it), its `main` included, so that its
    own body no longer holds the constants the partitions hold; True if done (or `mod` is `pmod`). False, with
    `mod` untouched, when a function name of `pmod` is bound to another GlobalVar in `mod`."""
    if mod.same_as(pmod):
        return True
    names = {gv.name_hint: gv for gv in mod.functions.keys()}
    if any(gv.name_hint != "main" and not names.get(gv.name_hint, gv).same_as(gv) for gv in pmod.functions.keys()):
        return False
    for gv, fn in pmod.functions.items():
        if gv.name_hint != "main":
            mod[gv] = fn
    mod[names["main"]] = pmod["main"]
    return True


def _name_inputs(pmod: tvm.IRModule, float_graphs: dict) -> None:
    """Rename each subgraph's input tensors from the partition parameters' Relax names (lv2) to the names users
    know (the model input, the producing ONNX node or DPU output), so the program's bindings, `inspect` and the
    report show those. A name already taken in the subgraph keeps the Relax one."""
    from tvm_dpu.passes.qdq_names import input_display_names

    for sym, names in input_display_names(pmod, float_graphs).items():
        fs = float_graphs[sym]
        for i, old in enumerate(fs.input_names):
            new = names.get(old)
            if new and new != old and new not in fs.graph.tensors:
                fs.graph.rename_tensor(old, new)
                fs.input_names[i] = new


#: Longest ONNX node name kept whole in a subgraph's name (longer ones keep their head and tail).
NAME_PART_CHARS = 32


def _short(name: str) -> str:
    n = NAME_PART_CHARS
    return name if len(name) <= n else f"{name[:n // 2 - 1]}..{name[-(n // 2 - 1):]}"


def readable_names(float_graphs: Mapping[str, Any], order: Mapping[str, int] | None = None) -> dict[str, str]:
    """{partition symbol: "first..last"}: each DPU subgraph named after the first and last ONNX nodes it computes
    (in graph order), as vai_c names its subgraphs after an op, instead of the Relax symbol (hundreds of characters
    listing every fused call). Unique (a repeat gets "#2", ...) and stable (the same model gives the same names);
    a subgraph with no ONNX provenance keeps its symbol. `order`: ONNX node name -> its place in the graph."""
    out: dict[str, str] = {}
    taken: set[str] = set()
    for sym, fs in float_graphs.items():
        sources = [n for op in fs.graph.ops for n in op.source]
        if order:  # an op lists the nodes it absorbed in no particular order
            sources.sort(key=lambda n: order.get(n, len(order)))
        if not sources:
            name = sym
        else:
            first, last = _short(sources[0]), _short(sources[-1])
            name = first if first == last else f"{first}..{last}"
        out[sym] = unique_name(name, taken)
    return out


def _uncovered_summary(float_graphs: Mapping[str, Any], uncovered: Mapping[str, list], names: Mapping[str, dict],
                       calibration: Any, shown: int = 6) -> str:
    """One warning line: which DPU feature maps of a QDQ model have no scale in the file, and what calibrates them."""
    missing = []
    for sym, tensors in uncovered.items():
        for t in tensors:
            producer = next((op for op in float_graphs[sym].graph.ops if t in op.outputs), None)
            where = names.get(sym, {}).get(t) or (producer.source[-1] if producer is not None and producer.source
                                                   else None)
            missing.append(f"{t} ({where})" if where and where != t else str(t))
    total = sum(len(float_graphs[sym].graph.inputs) + sum(len(op.outputs) for op in float_graphs[sym].graph.ops)
                for sym in float_graphs)
    listed = ", ".join(missing[:shown]) + (f" and {len(missing) - shown} more" if len(missing) > shown else "")
    data = ("on the calibration data given" if calibration is not None else
            "on random normal inputs (pass calibration=... or --calib FILE.npz for real data)")
    return (f"QDQ model: {len(missing)} of {total} DPU feature maps have no scale in the file ({listed}): only "
            f"these are calibrated, {data}; the others keep the file's scales")


def _compile_arch(arch: Any, fusion: str, cores: int, segments: str) -> Arch:
    """The Arch to compile for, after checking the arguments that do not depend on the model."""
    from tvm_dpu.arch import load_arch
    from tvm_dpu.backend.multicore import SEGMENT_POLICIES, check_cores
    from tvm_dpu.fusion.select import MODES as FUSION_MODES

    if fusion not in FUSION_MODES:
        raise DPUError(f"fusion {fusion!r}: choose one of {', '.join(FUSION_MODES)}")
    arch_obj: Arch = load_arch(arch)
    require_support(arch_obj, "compile")
    from tvm_dpu.codegen.compiler import CODEGEN_ISAS
    from tvm_dpu.errors import ArchError

    try:
        iset = arch_obj.instruction_set
    except ArchError:
        iset = None
    if iset not in CODEGEN_ISAS:
        raise ArchError(f"{arch_obj.name} (fingerprint {arch_obj.fingerprint:#x}) is an ISA{arch_obj.isa} DPU: "
                        f"tvm-dpu generates {' and '.join(CODEGEN_ISAS)} code only (DPUCZDX8G ISA1, DPUCAHX8H)")
    check_cores(cores, arch_obj)
    if segments not in SEGMENT_POLICIES:
        raise DPUError(f"segments={segments!r}: choose one of {', '.join(SEGMENT_POLICIES)}")
    return arch_obj


def _float_graphs(pmod: tvm.IRModule, functions: Mapping[str, relax.Function], arch: Arch,
                  call_names: Mapping[str, list[list[str]]] | None, source_mod: tvm.IRModule | None) -> dict:
    """Each DPU function's float XGraph, large convs split, inputs and graph named for people."""
    from tvm_dpu.backend.split_conv import split_large_convs
    from tvm_dpu.frontend.provenance import source_nodes
    from tvm_dpu.passes.from_relax import build_float_xgraph

    float_graphs = {sym: build_float_xgraph(fn, sym, (call_names or {}).get(sym)) for sym, fn in functions.items()}
    for fs in float_graphs.values():  # before calibration: the partial sums get fix_points of their own
        split_large_convs(fs.graph, arch)
    _name_inputs(pmod, float_graphs)
    order = {n["name"]: i for i, n in enumerate(source_nodes(source_mod if source_mod is not None else pmod))}
    for sym, name in readable_names(float_graphs, order).items():  # the symbol stays the key; people read the name
        float_graphs[sym].graph.name = name
    return float_graphs


@dataclass
class _Calibrated:
    """What calibration left for quantization: per symbol the fix_point overrides from the model's own scales
    and the statistics collector (symbols calibrated), the plugins' recorded inputs, the batches run."""
    overrides: dict[str, Any]
    collectors: dict[str, Any]
    need_stats: set[str]
    recorded: list[list]
    batches: list


def _calibrate(pmod: tvm.IRModule, float_graphs: dict, symbols: list[str], ext_functions: dict, inputs: list,
               calibration: Any, fix_points: Mapping[str, int] | None, is_qdq: bool, source_mod: Any,
               progress: bool, clock: PhaseClock) -> _Calibrated:
    from tvm_dpu.passes.qdq_names import overrides_for, uncovered_feature_maps, xgraph_to_onnx
    from tvm_dpu.quant.calib_data import RANDOM, calibration_batches
    from tvm_dpu.quant.calibration import StatsCollector

    names: dict[str, dict[str, str]] = {}
    if fix_points:
        names = xgraph_to_onnx(source_mod if source_mod is not None else pmod, pmod, float_graphs)
        overrides = {sym: overrides_for(fs, names[sym], fix_points) or None for sym, fs in float_graphs.items()}
    else:
        overrides = {sym: None for sym in symbols}
    # A QDQ model whose annotations cover every DPU feature map needs no calibration run (nor data); where some
    # lack a scale, only those are calibrated (the quantizer's overrides keep the file's for the others).
    uncovered = {sym: uncovered_feature_maps(fs, overrides.get(sym) or {}) for sym, fs in float_graphs.items()
                 } if is_qdq else {}
    need_stats = {sym for sym in symbols if uncovered[sym]} if is_qdq else set(symbols)
    clock.lap("xgraph")
    if is_qdq and need_stats:
        warnings.warn(_uncovered_summary(float_graphs, uncovered, names, calibration), stacklevel=4)
    batches = (calibration_batches(RANDOM if is_qdq and calibration is None else calibration, inputs)
               if need_stats or ext_functions else [])
    recorded: list[list] = [[] for _ in range(len(symbols) + len(ext_functions))]
    collectors = {s: StatsCollector(float_graphs[s].graph) for s in symbols if s in need_stats}
    evaluators = [_dpu_evaluator(float_graphs[s], collectors.get(s)) for s in symbols]
    evaluators += [_external_evaluator(ext, fn, sym, recorded[len(symbols) + j])
                   for j, (sym, (fn, ext)) in enumerate(ext_functions.items())]
    run_calibration(pmod, symbols + list(ext_functions), evaluators, batches, progress)
    clock.lap("calibration")
    return _Calibrated(overrides, collectors, need_stats, recorded, batches)


def _compile_partition(sym: str, fs: Any, functions: dict[str, relax.Function], cal: _Calibrated, arch: Arch,
                       method: str, fusion: str, cores: int, segments: str, modules: Sequence[tvm.IRModule],
                       phase: Callable[[str], None]) -> tuple[DPUPartition, dict]:
    """Quantize and compile DPU partition `sym` (taken out of `functions`, so its float body is freed here); its
    float body in `modules` (the result first) becomes the program function. (The partition, its fusion
    summary.)"""
    from tvm_dpu.backend.multicore import compile_multicore
    from tvm_dpu.quant.quantize import quantize_graph

    stats = cal.collectors[sym].result() if sym in cal.need_stats else None
    phase(f"{len(fs.graph.ops)} ops: quantizing")
    qg = quantize_graph(fs.graph, stats, method=method, overrides=cal.overrides.get(sym))
    # The float weights are views of the Relax constants (from_relax); once quantized nothing reads them: the
    # views go, and the partition's float body in every module this compile may rewrite (the result, and the
    # modules handed over), so the constants are freed now rather than after code generation.
    for t in fs.graph.tensors.values():
        t.data = None
    fn = functions.pop(sym)
    params, attrs = list(fn.params), {str(k): fn.attrs[k] for k in fn.attrs.keys()}
    del fn
    stub = program_function(params, fs.output_shapes, attrs)
    for m in modules:
        m[m.get_global_var(sym)] = stub
    phase(f"{len(fs.graph.ops)} ops: fusion, code generation, timing")
    csg, plan = compile_subgraph(qg, arch, fusion)
    if cores > 1:
        phase(f"{len(fs.graph.ops)} ops: scheduling on {cores} cores")
    multicore, mc_info = (compile_multicore(sym, qg, csg, plan, arch, cores, fusion, compile_subgraph, segments)
                          if cores > 1 else (None, None))
    program = program_tensor(*program_parts(sym, csg, [tuple(s) for s in fs.output_shapes], multicore))
    # The partition keeps a read-only view of the module's own copy: the program (VGG-16: 140 MB) is held once.
    blob = np.from_dlpack(program)
    blob.flags.writeable = False
    blob = memoryview(blob)
    _params_in_program(csg, blob)
    module = modules[0]
    module[module.get_global_var(sym)] = program_function(params, fs.output_shapes, {**attrs, PROGRAM_ATTR: program})
    info = {"mode": fusion, "plan": plan.mode, "groups": [[g.template, list(g.ops)] for g in plan.fused()],
            "cost_cycles": plan.cost, **plan.stats}
    return DPUPartition(sym, fs, qg, csg, plan, blob, mc_info, multicore), info


def _compile_plugins(module: tvm.IRModule, ext_functions: dict, recorded: list[list], first: int) -> list:
    """Compile the plugins' partitions with their own compilers (on the inputs recorded in calibration)."""
    plugin_subgraphs = []
    for j, (sym, (fn, ext)) in enumerate(ext_functions.items()):
        blob = ext.compile(fn, sym, recorded[first + j])
        plugin_subgraphs.append(plugin_summary(unpack_plugin_program(blob, sym)[0]))
        module[module.get_global_var(sym)] = fn.with_attr(PROGRAM_ATTR, program_tensor(blob))
    return plugin_subgraphs


def compile_dpu_partitions(pmod: tvm.IRModule, arch: Any, *, calibration: Any = None, method: str = "mse",
                           fusion: str = "optimal", fix_points: Mapping[str, int] | None = None,
                           is_qdq: bool = False, call_names: Mapping[str, list[list[str]]] | None = None,
                           source_mod: tvm.IRModule | None = None, progress: bool = False,
                           external: Sequence[ExternalCompiler] = (), cores: int = 1,
                           segments: str = "auto", handed_over: Sequence[tvm.IRModule] = ()) -> DPUCompileResult:
    """Compile every Codegen="dpu" function of the partitioned module `pmod` for `arch`.

    `calibration`: see quant.calib_data.calibration_batches (None: random inputs, with a warning).
    `fix_points` ({ONNX tensor name: fix_point}) fix those tensors instead of calibrating them; with `is_qdq`
    a partition whose feature maps are all fixed needs no calibration. `call_names[symbol]` are the ONNX node
    names of the partition's calls (provenance for the XGraph); `source_mod` the module before partitioning (to
    map ONNX tensor names onto XGraph tensors). `external`: partitions of other codegens (plugins) calibrated in
    the same run and compiled by their own compilers. `cores` > 1 (at most the arch's core count) also cuts each
    partition into segments scheduled on that many cores when the timing model predicts a gain
    (backend/multicore.py; `segments`="always" keeps them even when predicted slower).

    `handed_over`: modules the caller gives up that hold the partitions' float weights (`pmod` itself, the module
    it was partitioned from). They are rewritten in place into `pmod`'s functions and each partition's float body
    is replaced as soon as it is quantized, which frees its weights before code generation."""
    arch_obj = _compile_arch(arch, fusion, cores, segments)
    clock = PhaseClock()
    inputs = input_specs(pmod)
    check_memory(pmod, inputs)
    functions = dpu_functions(pmod)
    symbols = list(functions)
    float_graphs = _float_graphs(pmod, functions, arch_obj, call_names, source_mod)
    ext_functions = {sym: (fn, ext) for ext in external for sym, fn in codegen_functions(pmod, ext.codegen).items()}
    cal = _calibrate(pmod, float_graphs, symbols, ext_functions, inputs, calibration, fix_points, is_qdq, source_mod,
                     progress, clock)
    releasing = [m for m in handed_over if _adopt(m, pmod)]
    partitions: dict[str, DPUPartition] = {}
    fusion_info = {}
    module = pmod.clone()  # pmod itself stays as it was
    # Quantization and code generation dominate long compiles: the bar shows where they are.
    steps = progress_bar(enumerate(symbols), progress and bool(symbols), total=len(symbols), desc="DPU subgraphs",
                         unit="subgraph", leave=False)

    def phase(text: str) -> None:  # which step a long compile of one subgraph is in, on the progress bar
        if hasattr(steps, "set_postfix_str"):
            steps.set_postfix_str(text)

    for _, sym in steps:
        partitions[sym], fusion_info[sym] = _compile_partition(
            sym, float_graphs[sym], functions, cal, arch_obj, method, fusion, cores, segments,
            (module, *releasing), phase)
    plugin_subgraphs = _compile_plugins(module, ext_functions, cal.recorded, len(symbols))
    clock.lap("quantize_codegen")
    info = {"times_s": clock.wall, "cpu_times_s": clock.cpu,
            "calibration_batches": len(cal.batches), "fusion": fusion_info, "qdq": is_qdq, "cores": cores,
            "multicore": {sym: p.multicore.to_json() for sym, p in partitions.items() if p.multicore is not None},
            "plugin_subgraphs": plugin_subgraphs}
    return DPUCompileResult(module, arch_obj, inputs, partitions, info=info)
