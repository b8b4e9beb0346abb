"""`tvm_dpu.build`: the one-call compiler. It imports the model (ONNX file or ModelProto, QDQ stripped to its
float model and fix_points; or a Relax IRModule), then compiles it with TVM exactly as a TVM user would:
`tvm.compile(mod, target="dpu", relax_pipeline=<the "dpu" pipeline>)` (backend/relax_pipeline.py: partition, per DPU
partition calibration, quantization and code generation, `relax.ext.dpu` embedding each program in TVM's
module, LLVM for the rest). The returned `CompiledModel` runs that executable; nothing is compiled twice and no
other path produces DPU code.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import tvm

from tvm_dpu.errors import DPUError
from tvm_dpu.util.phase_times import PhaseClock
from tvm_dpu.backend.relax_pipeline import dpu_pipeline, dpu_target_tags, register
from tvm_dpu.security.program_blob import digest_of
from tvm_dpu.runtime.compiled_model import CompiledModel
from tvm_dpu.runtime.subgraph_runner import SubgraphRunner


def _prepare(mod: Any, shapes: dict | None, normalized: bool = True) -> tvm.IRModule:
    """Accept an ONNX path / ModelProto (imported) or a Relax IRModule; normalized unless `normalized` is False."""
    from tvm_dpu.frontend import from_onnx, normalize

    if isinstance(mod, tvm.IRModule):
        return normalize(mod) if normalized else mod
    return from_onnx(mod, shapes, normalize=normalized)


def _strip_qdq_input(mod: Any, fix_points: dict[str, int] | None,
                     requantize: bool = False) -> tuple[Any, dict[str, int] | None, bool]:
    """A QDQ ONNX model (path or ModelProto with QuantizeLinear / DequantizeLinear nodes) becomes its float model
    and its fix_points (the caller's `fix_points` win on conflicts). Returns (model, fix_points, is_qdq).

    Scales that are not powers of two (onnxruntime-style) are rounded up to powers of two, with a warning giving
    the error this adds; with `requantize` the quantization is dropped instead and the float model calibrated."""
    import onnx

    from tvm_dpu.quant.qdq import strip_qdq

    from tvm_dpu.frontend.onnx_import import NamedModel, load_model, topologically_sorted
    from tvm_dpu.frontend.onnx_lazy import with_weights

    if isinstance(mod, (str, Path, onnx.ModelProto, NamedModel)):
        proto, where = load_model(str(mod) if isinstance(mod, Path) else mod)
    else:
        return mod, fix_points, False
    if not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in proto.graph.node):
        return NamedModel(proto, where), fix_points, False  # the import reuses the parsed file
    # Quark writes XINT8 models whose nodes are not in topological order; stripping walks them in order. It reads
    # the weights from the proto. What is imported is no longer the file: named so, the import checks it (not
    # the file on disk, whose order the checker rejects).
    sorted_proto = topologically_sorted(with_weights(proto), where)
    stripped = f"{where} (Q/DQ stripped)"
    if requantize:
        float_model, _ = strip_qdq(sorted_proto, scales="float")
        return NamedModel(float_model, stripped), fix_points, False
    rounded: list = []
    float_model, qdq_fps = strip_qdq(sorted_proto, scales="round", rounded=rounded)
    if rounded:
        warnings.warn(rounding_summary(rounded), stacklevel=3)
    return NamedModel(float_model, stripped), {**qdq_fps, **(fix_points or {})}, True


def rounding_summary(rounded: list) -> str:
    """One warning line on the QDQ scales `strip_qdq(scales="round")` rounded to powers of two."""
    worst = max(rounded, key=lambda r: r.step_ratio)
    consts = [r for r in rounded if r.constant_error is not None]
    text = (f"{len(rounded)} QDQ scale(s) are not powers of two (float-scale quantization): rounded up to powers "
            f"of two, the DPU's step up to {worst.step_ratio:.2f}x the quantizer's (tensor {worst.tensor!r}: "
            f"{worst.scale:.6g} -> 2^-{worst.fix_point})")
    if consts:
        c = max(consts, key=lambda r: r.constant_error)
        text += (f"; {len(consts)} int8 constant(s) re-quantized, worst error {100 * c.constant_error:.2f}% of the "
                 f"tensor's largest magnitude ({c.tensor!r})")
    return text + "; requantize=True (tvm-dpu --requantize) calibrates the float model instead"


def import_model(mod: Any, shapes: dict | None = None, fix_points: dict[str, int] | None = None,
                 normalized: bool = True, requantize: bool = False) -> tuple[tvm.IRModule, dict[str, int] | None, bool]:
    """What every compile (and `tvm-dpu partition`) starts from: (normalized Relax module, fix_points, is_qdq).
    A QDQ ONNX model is stripped to its float model first and brings its own fix_points (none with
    `requantize`: it is calibrated). `normalized=False` leaves normalization to the caller (`build` runs it once
    the parsed ONNX model can be freed)."""
    mod, fix_points, is_qdq = _strip_qdq_input(mod, fix_points, requantize)
    return _prepare(mod, shapes, normalized), fix_points, is_qdq


def build(mod: Any, target: str = "dpu", *, arch: Any = None, calibration: Any = None,
          shapes: dict | None = None, method: str = "mse", progress: bool = True, device: Any = None,
          fix_points: dict[str, int] | None = None, fusion: str = "optimal", plugins: Any = None,
          cores: int = 1, segments: str = "auto", requantize: bool = False) -> CompiledModel:
    """Compile `mod` (a Relax IRModule, an ONNX file path or ModelProto) for the DPU.

    `target`: "dpu" or a per-preset tag such as "dpu-kv260"; `arch` (preset name, arch.json path or Arch), when
    None, comes from the tag, the PassContext config "relax.dpu.arch", else the default (B4096); given twice and
    differently is a DPUError.

    The DPU-capable parts become DPU machine code (calibrated on `calibration`: an iterable of input dicts or
    arrays, a dict/array with a leading sample axis, or an .npz path; random inputs with a warning if None); the
    rest is compiled by TVM for LLVM. Returns a `CompiledModel` whose `run(inputs)` executes both, with every DPU
    subgraph on the emulator (or `device`); `compiled.executable` is the TVM executable (`export_library` works).

    `fix_points` ({ONNX tensor name: fix_point}, e.g. the second result of `quant.qdq.strip_qdq`) fix those
    tensors instead of calibrating them. A QDQ ONNX model (QuantizeLinear / DequantizeLinear with power-of-two
    scales) is stripped and its own fix_points used; when they cover every DPU feature map nothing is calibrated.
    Scales that are not powers of two (onnxruntime-style QDQ) are rounded up to powers of two, with a warning
    saying how much coarser the steps get and how much the int8 constants change; `requantize=True` strips the
    quantization instead and calibrates the float model on `calibration`.

    `fusion` chooses DNNVM's kernel fusion: "none" (every op on its own; legal concat inputs saved into their
    slice), "greedy" (first template match wins) or "optimal" (Algorithm 2's execution-path search; the default).

    `plugins`: custom-IP plugins (names, "a,b", or Plugin objects; see tvm_dpu.plugins), applied in order before
    DPU partitioning; the ops they claim run on their IP (their "sim" runner on the emulator).

    `cores` (1 to the arch's core count, e.g. 3 on zcu102): schedule the independent work of each DPU partition
    (Inception branches, shortcut convs, independent subgraphs) on that many cores of one device. Each partition
    is cut into segments, compiled, and list-scheduled on the timing model with DDR contention charged; the
    program keeps the segments when they are predicted faster than one program on one core. Without `device`
    the model runs on `cores` emulated cores (a `CoreGroup`); outputs are bit-identical to cores=1.
    `segments="always"` keeps the segments even where one program is predicted faster (to measure the runtime).
    """
    register()
    tags = dpu_target_tags()
    target = "dpu" if str(target).lower() == "dpu" else str(target)
    if target not in tags:
        raise DPUError(f"target {target!r}: tvm_dpu.build compiles for a DPU target: 'dpu' or a per-preset tag "
                       f"({', '.join(t for t in tags if t != 'dpu')}); the CPU part uses LLVM")
    clock = PhaseClock()
    from tvm_dpu.frontend import normalize
    from tvm_dpu.frontend.provenance import output_names

    mod, fix_points, is_qdq = import_model(mod, shapes, fix_points, normalized=False, requantize=requantize)
    # Normalized here, not inside the import: the parsed ONNX model (VGG-16: 0.5 GB) is freed by now, so it is not
    # held beside the folded weights.
    mod = normalize(mod)
    names = output_names(mod)
    clock.lap("import_normalize")
    record: list = []
    pipeline = dpu_pipeline(arch=arch, calibration=calibration, fusion=fusion, method=method, fix_points=fix_points,
                            is_qdq=is_qdq, normalize=False, progress=progress, record=record, plugins=plugins,
                            cores=cores, segments=segments, handed_over=True)
    # `mod` is this build's own: the pipeline releases its DPU float weights as the partitions are quantized.
    ex = tvm.compile(mod, target=target, relax_pipeline=pipeline)
    clock.lap("pipeline")
    (result,) = record
    model = _compiled_model(ex, result, device, cores, clock)
    model.outputs = _named_outputs(model, names)
    return model


def _compiled_model(ex: Any, result: Any, device: Any, cores: int, clock: PhaseClock) -> CompiledModel:
    """The CompiledModel of a finished pipeline run `result` (its partitions, report and build info): the DPU
    subgraphs run on `device`, else on `cores` emulated cores."""
    if device is None and cores > 1:
        from tvm_dpu.runtime.cores import core_group

        device = core_group(result.arch, cores)
    elif device is None:
        from tvm_dpu.runtime.device import emulator_device

        device = emulator_device(result.arch)
    runners = {sym: SubgraphRunner(p.sg, device, p.qgraph, p.output_shapes, digest_of(p.blob), p.segments)
               for sym, p in result.partitions.items()}
    info = dict(result.info)
    plugin_subgraphs = info.pop("plugin_subgraphs")
    # the pipeline's time less the DPU compile's own phases is partitioning and the CPU part's compile
    for key, laps in (("times_s", clock.wall), ("cpu_times_s", clock.cpu)):
        times = dict(info.pop(key))
        times.update({"import_normalize": laps["import_normalize"],
                      "partition_and_cpu_compile": laps["pipeline"] - sum(times.values())})
        info[key] = times
    return CompiledModel(executable=ex, arch=result.arch, runners=runners, inputs=result.inputs,
                         partition_report=result.report, subgraph_ids=result.subgraph_ids, build_info=info,
                         relax_module=result.module, device=device, plugin_subgraphs=plugin_subgraphs)


def _named_outputs(model: CompiledModel, names: list[str] | None) -> list:
    """The model's output specs under the source model's output names (ONNX graph outputs), when it has them."""
    from tvm_dpu.types import InputSpec

    specs = model.output_specs()
    if names is None or len(names) != len(specs) or len(set(names)) != len(names):
        return specs
    return [InputSpec(n, s.shape, s.dtype) for n, s in zip(names, specs)]
