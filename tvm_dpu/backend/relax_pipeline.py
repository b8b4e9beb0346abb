"""TVM registration: the "dpu" target tag, the "dpu" Relax pipeline, the `relax.ext.dpu` codegen, and the
calibration function. `import tvm_dpu` registers all of them (`register()`), so these spellings work:

    tvm.compile(mod, target="dpu")                               # default arch, random calibration (warns)
    tvm.compile(mod, target="dpu", relax_pipeline=relax.get_pipeline("dpu", arch=..., calibration=..., fusion=...))
    tvm.compile(tvm_dpu.partition_for_dpu(mod, arch), target="dpu", relax_pipeline=relax.get_pipeline("dpu", ...))
    tvm.compile(compiled.relax_module, target=<any CPU target>, relax_pipeline="dpu_lowering")  # programs attached

`relax.build` picks its pipeline by name ("default"), never by target, so a plain `target="dpu"` would compile
everything for the CPU. `register()` therefore wraps the "default" pipeline factory: when the target being built
carries the "dpu" key (the "dpu" tag does), the default pipeline is the DPU pipeline with default options; for
every other target it is TVM's own default pipeline, unchanged.

The DPU pipeline: normalize and partition (unless the module is already partitioned), compile every DPU
partition (dpu_compile.py: calibration, quantization, code generation), `RunCodegen` (ext_module.py embeds each
program in a runtime module), drop the constant copies RunCodegen attaches, then TVM's default lowering of the rest.
"""
from __future__ import annotations

from typing import Any

import tvm
from tvm import relax

from tvm_dpu.backend.ext_module import TVM_DEFAULT_PIPELINE, cpu_lowering

#: Arch used when the pipeline is not told one (tvm.compile(mod, target="dpu")).
DEFAULT_ARCH = "DPUCZDX8G_ISA1_B4096"

_STATE: dict[str, Any] = {"registered": False}


def lower_dpu_module(mod: tvm.IRModule) -> tvm.IRModule:
    """A module whose DPU partitions carry their programs -> RunCodegen + TVM lowering."""
    mod = relax.transform.RunCodegen()(mod)
    if "const_name_to_constant" in (mod.attrs or {}):
        # RunCodegen copies the partitions' weights there; the programs already hold them (the .so would double).
        mod = mod.without_attr("const_name_to_constant")
    return cpu_lowering()(mod)


def compiled_dpu_lowering() -> tvm.transform.Pass:
    """Pipeline for a module whose DPU partitions already carry programs (e.g. recompiling for another CPU)."""

    @tvm.transform.module_pass(opt_level=0, name="DPULowering")
    def _lower(mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return lower_dpu_module(mod)

    return _lower


def prepare_and_compile(mod: tvm.IRModule, *, arch: Any = DEFAULT_ARCH, calibration: Any = None,
                        fusion: str = "optimal", method: str = "mse", fix_points: dict[str, int] | None = None,
                        is_qdq: bool = False, normalize: bool = True, progress: bool = False, plugins: Any = None,
                        cores: int = 1, segments: str = "auto", handed_over: bool = False):
    """Partition `mod` for `arch` (unless it already is; enabled `plugins` claim their ops first) and compile its
    DPU and plugin partitions (scheduled on `cores` DPU cores): a DPUCompileResult.

    `handed_over`: the caller gives `mod` up (tvm_dpu.build, which imported it). It is then rewritten in place
    into the partitioned module, each DPU partition's float body replaced as soon as the partition is quantized,
    so the float weights of the DPU part (VGG-16: 0.5 GB) are freed before code generation instead of living
    until the compile returns. Otherwise `mod` is left as it was."""
    from tvm_dpu.backend.dpu_compile import compile_dpu_partitions, is_partitioned
    from tvm_dpu.passes.partition import binding_node_names, partition_detailed
    from tvm_dpu.passes.report import build_report

    claimers, external = [], []
    if plugins:  # custom IP sits above the DPU flow: its glue is imported only when asked for
        from tvm_dpu.plugins.glue import prepare

        claimers, external = prepare(plugins)
    if is_partitioned(mod):
        return compile_dpu_partitions(mod, arch, calibration=calibration, method=method, fusion=fusion,
                                      fix_points=fix_points, is_qdq=is_qdq, progress=progress, external=external,
                                      cores=cores, segments=segments, handed_over=[mod] if handed_over else [])
    given = mod
    if normalize:
        from tvm_dpu.frontend import normalize as normalize_mod

        mod = normalize_mod(mod)
    part = partition_detailed(mod, arch, claimers)
    first_site = {}
    for sg in part.placement.subgraphs:  # a function may serve several identical call sites: name it by the first
        first_site.setdefault(sg.function, sg)
    call_names = {sym: [binding_node_names(part.infos[t]) for t in sg.tags] for sym, sg in first_site.items()}
    # The report reads the module as it was: built before a handed-over module is rewritten.
    report = build_report(mod, part)
    pmod = part.module
    del part  # its binding records hold the original calls, and so their constants
    released = [pmod, mod, *([given] if given is not mod else [])] if handed_over else []
    result = compile_dpu_partitions(pmod, arch, calibration=calibration, method=method, fusion=fusion,
                                    fix_points=fix_points, is_qdq=is_qdq, call_names=call_names, source_mod=mod,
                                    progress=progress, external=external, cores=cores,
                                    segments=segments, handed_over=released)
    result.report = report
    result.subgraph_ids = {sym: sg.index for sym, sg in first_site.items()}
    return result


def dpu_pipeline(arch: Any = DEFAULT_ARCH, calibration: Any = None, fusion: str = "optimal", method: str = "mse",
                 fix_points: dict[str, int] | None = None, is_qdq: bool = False, normalize: bool = True,
                 progress: bool = False, record: list | None = None, plugins: Any = None,
                 cores: int = 1, segments: str = "auto", handed_over: bool = False) -> tvm.transform.Pass:
    """The "dpu" Relax pipeline (`relax.get_pipeline("dpu", **options)`).

    Options: `arch` (preset name, arch.json path or Arch), `calibration` (arrays, dicts, an .npz path, ...; None
    calibrates on random inputs with a warning), `fusion` ("none" | "greedy" | "optimal"), `method` ("mse" |
    "minmax"), `fix_points` ({ONNX tensor name: fix_point}), `normalize` (run tvm-dpu's normalization first),
    `plugins` (custom-IP plugins by name, "a,b" or a list, applied in order before DPU partitioning), `cores`
    (DPU cores each partition's independent segments are scheduled on; 1: one program per partition) and `segments` ("auto": keep a
    partition's segments when predicted faster; "always").
    `record`, if a list, receives the DPUCompileResult (partition report, compiled subgraphs) of each run.
    `handed_over`: the module compiled is the caller's no longer (see `prepare_and_compile`); for tvm_dpu.build."""

    @tvm.transform.module_pass(opt_level=0, name="DPUPipeline")
    def _pipeline(mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        result = prepare_and_compile(mod, arch=arch, calibration=calibration, fusion=fusion, method=method,
                                     fix_points=fix_points, is_qdq=is_qdq, normalize=normalize, progress=progress,
                                     plugins=plugins, cores=cores,
                                     segments=segments, handed_over=handed_over)
        if record is not None:
            record.append(result)
        return lower_dpu_module(result.module)

    return _pipeline


def _default_for_target(**kwargs: Any) -> tvm.transform.Pass:
    """The "default" pipeline factory after register(): the DPU pipeline for targets with the "dpu" key."""
    original = TVM_DEFAULT_PIPELINE["factory"]

    @tvm.transform.module_pass(opt_level=0, name="DefaultOrDPU")
    def _pipeline(mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        target = tvm.target.Target.current(allow_none=True)
        if target is not None and "dpu" in list(target.keys):
            return dpu_pipeline()(mod)
        return original(**kwargs)(mod)

    return _pipeline


def register() -> None:
    """Register the "dpu" target tag, the "dpu" pipeline, relax.ext.dpu, the calibration and dispatch functions,
    and the target-aware "default" pipeline (idempotent)."""
    if _STATE["registered"]:
        return
    from tvm_dpu.backend.dpu_compile import register_calibration
    from tvm_dpu.backend.ext_module import register_codegen

    register_codegen()
    register_calibration()
    tvm.target.tag.register_tag("dpu", {"kind": "llvm", "keys": ["dpu", "cpu"]}, override=True)
    pipelines = relax.pipeline.PIPELINE_MAP
    if "dpu" not in pipelines:
        relax.register_pipeline("dpu")(dpu_pipeline)
    if "dpu_lowering" not in pipelines:
        relax.register_pipeline("dpu_lowering")(compiled_dpu_lowering)
    if TVM_DEFAULT_PIPELINE["factory"] is None:
        TVM_DEFAULT_PIPELINE["factory"] = pipelines["default"]
        pipelines["default"] = _default_for_target
    _STATE["registered"] = True
