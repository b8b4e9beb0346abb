"""`tvm_dpu.build`: the end-to-end compiler (frontend -> partition -> per DPU subgraph: XGraph, calibration,
quantization, code generation -> CPU remainder by TVM LLVM -> one runnable object).

Calibration runs the partitioned model in the Relax VM with every DPU partition replaced by the float reference of
its XGraph, recording each partition's inputs; each subgraph then gets its fix_points from its own recorded inputs.
The same VM executable serves the final model: only the packed functions behind the partition symbols change.
"""
from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import tvm
from tvm import relax

from tvm_dpu.arch import load_arch
from tvm_dpu.arch.arch import Arch
from tvm_dpu.errors import DPUError
from tvm_dpu.fusion.select import MODES as FUSION_MODES
from tvm_dpu.passes.partition import binding_node_names, partition_detailed
from tvm_dpu.passes.report import build_report
from tvm_dpu.passes.qdq_names import overrides_for, uncovered_feature_maps, xgraph_to_onnx
from tvm_dpu.runtime.compiled_model import CompiledModel, InputSpec
from tvm_dpu.runtime.device import EmulatorDevice
from tvm_dpu.runtime.subgraph_runner import SubgraphRunner
from tvm_dpu.runtime.tvm_glue import codegen_hook, register, register_packed

#: Random calibration batches used when the caller gives no data (with a warning: fix_points will be poor).
RANDOM_CALIBRATION_BATCHES = 2


def _input_specs(mod: tvm.IRModule) -> list[InputSpec]:
    main = mod["main"]
    specs = []
    for p in main.params:
        ty = p.ty
        try:
            shape = tuple(int(v) for v in ty.shape.values)
        except (AttributeError, TypeError, ValueError):
            raise DPUError(f"model input {p.name!r} has no static shape; give shapes when importing") from None
        specs.append(InputSpec(p.name, shape, str(ty.dtype)))
    return specs


def calibration_batches(calibration: Any, inputs: list[InputSpec], progress: bool = False) -> list[list[np.ndarray]]:
    """Normalize calibration data to a list of batches (one array per model input, in input order).

    Accepted: None (random normal inputs, with a warning), an array or dict of arrays with the input shapes or with
    a leading sample axis (each sample becomes one batch), an .npz path, or an iterable of arrays / dicts.
    """
    if calibration is None:
        warnings.warn("no calibration data: calibrating on random normal inputs; fix_points will not suit real "
                      "data (pass calibration=... or --calib FILE.npz)", stacklevel=3)
        rng = np.random.default_rng(0)
        return [[rng.standard_normal(s.shape).astype(np.float32) for s in inputs]
                for _ in range(RANDOM_CALIBRATION_BATCHES)]
    if isinstance(calibration, (str, Path)):
        with np.load(calibration, allow_pickle=False) as z:
            calibration = {k: z[k] for k in z.files}
    if isinstance(calibration, np.ndarray) or isinstance(calibration, Mapping):
        arrays = _by_input(calibration, inputs)
        samples = []
        n = None
        per_input = []
        for a, s in zip(arrays, inputs):
            if tuple(a.shape) == tuple(s.shape):
                per_input.append([a])
            elif tuple(a.shape[1:]) == tuple(s.shape[1:]) and a.shape[0] % s.shape[0] == 0:
                k = s.shape[0]
                per_input.append([a[i:i + k] for i in range(0, a.shape[0], k)])
            elif tuple(a.shape[1:]) == tuple(s.shape):
                per_input.append([a[i] for i in range(a.shape[0])])
            else:
                raise DPUError(f"calibration data for input {s.name!r} has shape {a.shape}; expected {s.shape} "
                               f"or (N, ...) samples of it")
            n = len(per_input[-1]) if n is None else min(n, len(per_input[-1]))
        for i in range(n or 0):
            samples.append([np.asarray(p[i], dtype=np.float32).reshape(s.shape) for p, s in zip(per_input, inputs)])
        return samples
    out = []
    for item in calibration:
        arrays = _by_input(item, inputs)
        for a, s in zip(arrays, inputs):
            if a.size != int(np.prod(s.shape)):
                raise DPUError(f"calibration sample for input {s.name!r} has shape {a.shape}; expected {s.shape}")
        out.append([np.asarray(a, dtype=np.float32).reshape(s.shape) for a, s in zip(arrays, inputs)])
    if not out:
        raise DPUError("calibration data is empty")
    return out


def _by_input(item: Any, inputs: list[InputSpec]) -> list[np.ndarray]:
    if isinstance(item, Mapping):
        missing = [s.name for s in inputs if s.name not in item]
        if missing:
            raise DPUError(f"calibration data lacks input(s) {missing} (has {sorted(item)})")
        return [np.asarray(item[s.name]) for s in inputs]
    if len(inputs) != 1:
        raise DPUError(f"the model has {len(inputs)} inputs {[s.name for s in inputs]}: give calibration samples "
                       "as dicts name -> array")
    return [np.asarray(item)]


def _prepare(mod: Any, shapes: dict | None) -> tvm.IRModule:
    """Accept an ONNX path / ModelProto (imported and normalized) or a Relax IRModule (normalized)."""
    from tvm_dpu.frontend import from_onnx, normalize

    if isinstance(mod, tvm.IRModule):
        return normalize(mod)
    return from_onnx(mod, shapes)


def _strip_qdq_input(mod: Any, fix_points: dict[str, int] | None) -> tuple[Any, dict[str, int] | None, bool]:
    """A QDQ ONNX model (path or ModelProto with QuantizeLinear / DequantizeLinear nodes) becomes its float model
    and its fix_points (the caller's `fix_points` win on conflicts). Returns (model, fix_points, is_qdq)."""
    import onnx

    from tvm_dpu.quant.qdq import strip_qdq

    if isinstance(mod, (str, Path)):
        proto = onnx.load(str(mod))
    elif isinstance(mod, onnx.ModelProto):
        proto = mod
    else:
        return mod, fix_points, False
    if not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in proto.graph.node):
        return mod, fix_points, False
    float_model, qdq_fps = strip_qdq(proto)
    return float_model, {**qdq_fps, **(fix_points or {})}, True


def build_partitioned(mod: Any, *, arch: Any = "DPUCZDX8G_ISA1_B4096", calibration: Any = None,
                      shapes: dict | None = None, method: str = "mse", progress: bool = True,
                      device: Any = None, fix_points: dict[str, int] | None = None,
                      fusion: str = "optimal") -> tuple[tvm.IRModule, CompiledModel]:
    """Everything of `build` except the final LLVM compile: returns (module with DPU calls, model without
    executable).

    `fix_points` are keyed by ONNX tensor names (or XGraph tensor names); a QDQ ONNX model brings its own."""
    from tvm_dpu.quant.calibration import collect_stats
    from tvm_dpu.quant.quantize import quantize_graph
    from tvm_dpu.xgraph.float_ref import run_graph_float
    from tvm_dpu.passes.from_relax import build_float_xgraph

    register()
    if fusion not in FUSION_MODES:
        raise DPUError(f"fusion {fusion!r}: choose one of {', '.join(FUSION_MODES)}")
    t0 = time.perf_counter()
    arch_obj: Arch = load_arch(arch)
    mod, fix_points, is_qdq = _strip_qdq_input(mod, fix_points)
    mod = _prepare(mod, shapes)
    inputs = _input_specs(mod)
    t_import = time.perf_counter()
    result = partition_detailed(mod, arch_obj)
    report = build_report(mod, result)
    pmod = result.module
    t_part = time.perf_counter()
    # A partition function may serve several identical call sites; its XGraph is named after the first one.
    first_site = {}
    for sg in result.placement.subgraphs:
        first_site.setdefault(sg.function, sg)
    ids = {sym: sg.index for sym, sg in first_site.items()}
    subgraphs: dict[str, Any] = {}

    def collect(sym: str, fn: relax.Function) -> None:
        site = first_site.get(sym)
        names = [binding_node_names(result.infos[t]) for t in site.tags] if site is not None else None
        subgraphs[sym] = build_float_xgraph(fn, sym, names)

    with codegen_hook(collect):
        lowered = relax.transform.RunCodegen()(pmod)
    if "const_name_to_constant" in (lowered.attrs or {}):
        lowered = lowered.without_attr("const_name_to_constant")
    t_xg = time.perf_counter()
    model = CompiledModel(executable=None, arch=arch_obj, runners={}, inputs=inputs, partition_report=report,
                          subgraph_ids=ids)
    model.build_info = {"times_s": {"import_normalize": t_import - t0, "partition": t_part - t_import,
                                    "xgraph": t_xg - t_part}}
    overrides = _overrides(mod, pmod, subgraphs, fix_points)
    model.build_info["qdq"] = is_qdq
    # A QDQ model whose annotations cover every DPU feature map needs no calibration run (nor data).
    need_stats = {sym for sym, fs in subgraphs.items()
                  if not is_qdq or uncovered_feature_maps(fs, overrides.get(sym) or {})}
    return lowered, _calibrate_and_compile(model, lowered, subgraphs, calibration, method, progress, device,
                                           overrides, need_stats, collect_stats, quantize_graph, run_graph_float,
                                           fusion)


def _overrides(mod: tvm.IRModule, pmod: tvm.IRModule, subgraphs: dict[str, Any],
               fix_points: dict[str, int] | None) -> dict[str, dict[str, int] | None]:
    """Per-subgraph quantizer overrides from ONNX-named fix_points (qdq_names)."""
    if not fix_points:
        return {sym: None for sym in subgraphs}
    names = xgraph_to_onnx(mod, pmod, subgraphs)
    return {sym: overrides_for(fs, names[sym], fix_points) or None for sym, fs in subgraphs.items()}


def compile_subgraph(graph, arch: Arch, fusion: str = "optimal"):
    """Quantized XGraph -> (CompiledSubgraph, FusionPlan) with DNNVM fusion `fusion`.

    "optimal" keeps the execution-path search's plan only when the timing model finds it no slower than the greedy
    plan (the search ranks plans with an analytic cost; the simulator is the judge), so optimal is never below
    greedy in simulated throughput; `plan.stats["simulated_fallback"]` says when greedy's plan was kept."""
    from tvm_dpu.fusion.select import compile_with_fusion
    from tvm_dpu.timing.simulate import simulate

    csg, plan = compile_with_fusion(graph, arch, fusion)
    if fusion == "optimal":
        g_csg, g_plan = compile_with_fusion(graph, arch, "greedy")
        fallback = simulate(g_csg.code, arch).cycles < simulate(csg.code, arch).cycles
        if fallback:
            csg, plan = g_csg, g_plan
        plan.stats["simulated_fallback"] = fallback
    return csg, plan


def _calibrate_and_compile(model, lowered, subgraphs, calibration, method, progress, device, overrides, need_stats,
                           collect_stats, quantize_graph, run_graph_float, fusion) -> CompiledModel:

    t0 = time.perf_counter()
    ex = tvm.compile(lowered, target="llvm")
    model.executable = ex
    t_cpu = time.perf_counter()
    recorded: dict[str, list[dict[str, np.ndarray]]] = {sym: [] for sym in subgraphs}
    for sym, fs in subgraphs.items():
        register_packed(sym, _float_runner(fs, recorded[sym], run_graph_float))
    batches = calibration_batches(calibration, model.inputs) if need_stats else []
    if need_stats:
        vm = relax.VirtualMachine(ex, tvm.cpu())
        it = batches
        if progress:
            from tqdm import tqdm

            it = tqdm(batches, desc="calibrating", unit="batch", file=sys.stderr, leave=False)
        for batch in it:
            vm["main"](*[tvm.runtime.tensor(a) for a in batch])
    t_cal = time.perf_counter()
    dev = device if device is not None else EmulatorDevice(model.arch)
    for sym, fs in subgraphs.items():
        stats = collect_stats(fs.graph, recorded[sym], progress=False) if sym in need_stats else None
        qg = quantize_graph(fs.graph, stats, method=method, overrides=overrides.get(sym))
        csg, plan = compile_subgraph(qg, model.arch, fusion)
        model.runners[sym] = SubgraphRunner(csg, dev, qg, [tuple(s) for s in fs.output_shapes])
        model.build_info.setdefault("fusion", {})[sym] = {
            "mode": fusion, "plan": plan.mode, "groups": [[g.template, list(g.ops)] for g in plan.fused()],
            "cost_cycles": plan.cost, **plan.stats}
    t_dpu = time.perf_counter()
    model.build_info["times_s"].update({"cpu_compile": t_cpu - t0, "calibration": t_cal - t_cpu,
                                        "quantize_codegen": t_dpu - t_cal})
    model.build_info["calibration_batches"] = len(batches)
    return model


def _float_runner(fs, record: list, run_graph_float):
    n_in = len(fs.input_names)

    def run(*args):
        feeds = {}
        for name, a in zip(fs.input_names, args[:n_in]):
            shape = fs.graph.tensors[name].shape
            feeds[name] = np.from_dlpack(a).reshape(shape).astype(np.float32)
        record.append(feeds)
        res = run_graph_float(fs.graph, feeds)
        for dst, name, shape in zip(args[n_in:], fs.output_names, fs.output_shapes):
            dst.copyfrom(np.ascontiguousarray(np.asarray(res[name], dtype=np.float32).reshape(shape)))

    return run


def build(mod: Any, target: str = "dpu", *, arch: Any = "DPUCZDX8G_ISA1_B4096", calibration: Any = None,
          shapes: dict | None = None, method: str = "mse", progress: bool = True, device: Any = None,
          fix_points: dict[str, int] | None = None, fusion: str = "optimal") -> CompiledModel:
    """Compile `mod` (a Relax IRModule, an ONNX file path or ModelProto) for the DPU.

    The DPU-capable parts become DPU machine code (calibrated on `calibration`: an iterable of input dicts or
    arrays, a dict/array with a leading sample axis, or an .npz path; random inputs with a warning if None); the
    rest is compiled by TVM for LLVM. Returns a `CompiledModel` whose `run(inputs)` executes both, with every DPU
    subgraph on the emulator (or `device`).

    `fix_points` ({ONNX tensor name: fix_point}, e.g. the second result of `quant.qdq.strip_qdq`) fix those
    tensors instead of calibrating them. A QDQ ONNX model (QuantizeLinear / DequantizeLinear with power-of-two
    scales) is stripped and its own fix_points used; when they cover every DPU feature map nothing is calibrated.
    A non-power-of-two scale is a QuantizationError naming the tensor.

    `fusion` chooses DNNVM's kernel fusion: "none" (every op on its own, concats copied), "greedy" (first template
    match wins) or "optimal" (Algorithm 2's execution-path search; the default).
    """
    if target not in ("dpu", "DPU"):
        raise DPUError(f"target {target!r}: tvm_dpu.build compiles for target 'dpu' (the CPU part uses LLVM)")
    lowered, model = build_partitioned(mod, arch=arch, calibration=calibration, shapes=shapes, method=method,
                                       progress=progress, device=device, fix_points=fix_points, fusion=fusion)
    model.cpu_module = lowered  # kept so export(..., cross=...) can recompile the CPU part for the board
    return model
