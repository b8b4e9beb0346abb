"""TVM registration: the "dpu" target tag, the "dpu" Relax pipeline, the `relax.ext.dpu` codegen, and the
calibration function. `import tvm_dpu` registers all of them (`register()`), so these spellings work:

    tvm.compile(mod, target="dpu")                               # default arch, random calibration (warns)
    tvm.compile(mod, target="dpu-kv260")                         # the arch of a preset: one target tag per preset
    tvm.compile(mod, target=Target("dpu-kv260", host={"kind": "llvm", "mtriple": "aarch64-linux-gnu"}))  # the board
    with tvm.transform.PassContext(config={"relax.dpu.arch": "kv260", "relax.dpu.calibration": "calib.npz"}):
        tvm.compile(mod, target="dpu")                           # arch, calibration, fusion from the config
    tvm.compile(mod, target="dpu", relax_pipeline=relax.get_pipeline("dpu", arch=..., calibration=..., fusion=...))
    tvm.compile(tvm_dpu.partition_for_dpu(mod, arch), target="dpu", relax_pipeline=relax.get_pipeline("dpu", ...))
    tvm.compile(compiled.relax_module, target=<any CPU target>, relax_pipeline="dpu_lowering")  # programs attached

`relax.build` picks its pipeline by name ("default"), never by target, so a plain `target="dpu"` would compile
everything for the CPU. `register()` therefore wraps the "default" pipeline factory: when the target being built
carries the "dpu" key (the "dpu" tag does), the default pipeline is the DPU pipeline with default options; for
every other target it is TVM's own default pipeline, unchanged.

Where the arch comes from: the pipeline's `arch` option, the PassContext config "relax.dpu.arch" (pass_config.py)
and the target's `model` attribute (what the "dpu-<preset>" tags set); those given must name the same arch, else
DPUError; none given: DEFAULT_ARCH. Calibration and fusion likewise from their options or "relax.dpu.calibration"
/ "relax.dpu.fusion".

Cross compilation: with a target host (`Target("dpu-kv260", host=aarch64)`), the CPU part runs on the host, so
the pipeline binds every TIR function to the host target and the codegen builds the DPU partitions' objects for
the host's machine (the llvm+mtriple+keys spelling of the same target gives the same library).

The DPU pipeline: normalize and partition (unless the module is already partitioned), compile every DPU
partition (dpu_compile.py: calibration, quantization, code generation), `RunCodegen` (ext_module.py embeds each
program in a runtime module), drop the constant copies RunCodegen attaches, then TVM's default lowering of the rest.
"""
from __future__ import annotations

from typing import Any

import tvm
from tvm import relax

from tvm_dpu.backend.ext_module import TVM_DEFAULT_PIPELINE, cpu_lowering
from tvm_dpu.backend.pass_config import config_value, register_pass_config
from tvm_dpu.errors import DPUError

#: Arch used when the pipeline is not told one (tvm.compile(mod, target="dpu")).
DEFAULT_ARCH = "DPUCZDX8G_ISA1_B4096"

#: Fusion planner when neither the pipeline option nor the "relax.dpu.fusion" config chooses one.
DEFAULT_FUSION = "optimal"
#: Prefix of the per-preset target tags ("dpu-kv260", "dpu-DPUCZDX8G_ISA1_B4096", ...).
TAG_PREFIX = "dpu-"
_STATE: dict[str, Any] = {"registered": False}


def dpu_target_tags() -> dict[str, dict]:
    """Target tag -> its config: "dpu" (the default arch, or whatever the context chooses) and one per preset
    (its arch in the target's `model` attribute)."""
    from tvm_dpu.arch import list_presets

    base = {"kind": "llvm", "keys": ["dpu", "cpu"]}
    tags = {"dpu": dict(base)}
    for preset in list_presets():
        tags[TAG_PREFIX + preset] = {**base, "model": preset}
    return tags


def _target_arch(target: Any) -> str | None:
    if target is None or "dpu" not in list(target.keys):
        return None
    model = target.attrs.get("model") if "model" in target.attrs else None
    return str(model) if model else None


def resolve_arch(arch: Any = None) -> Any:
    """The arch a compile uses: `arch` (the pipeline option), the PassContext config "relax.dpu.arch" and the current
    target's `model` must agree where given (DPUError naming them otherwise); none given: DEFAULT_ARCH."""
    from tvm_dpu.arch import load_arch

    target = tvm.target.Target.current(allow_none=True)
    given = [(what, v) for what, v in (("the pipeline's arch option", arch),
                                       ('the PassContext config "relax.dpu.arch"', config_value("relax.dpu.arch")),
                                       ("the target's model attribute (a dpu-<preset> target tag sets it)",
                                        _target_arch(target))) if v is not None]
    if not given:
        return DEFAULT_ARCH
    loaded = [(what, v, load_arch(v)) for what, v in given]
    first = loaded[0]
    for other in loaded[1:]:
        if other[2] != first[2]:
            raise DPUError(f"two different DPU archs asked for: {first[1]!r} by {first[0]} and {other[1]!r} by "
                           f"{other[0]}; give one")
    return first[1]


def resolve_calibration(calibration: Any = None) -> Any:
    """`calibration` if given, else the PassContext config "relax.dpu.calibration" (an .npz path, or "random")."""
    if calibration is not None:
        return calibration
    return config_value("relax.dpu.calibration")


def resolve_fusion(fusion: str | None = None) -> str:
    return fusion or config_value("relax.dpu.fusion") or DEFAULT_FUSION


def bind_tir_to_host() -> tvm.transform.Pass:
    """With a target host (cross compilation: `Target("dpu-kv260", host=aarch64)`), every TIR function of the CPU
    part is compiled for the host: the "dpu" target's own kind is the build machine's llvm, so without this the
    kernels would be built for it and the host's linker would refuse them ("Relocations in generic ELF")."""

    @tvm.transform.module_pass(opt_level=0, name="DPUBindHost")
    def _bind(mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        target = tvm.target.Target.current(allow_none=True)
        host = getattr(target, "host", None) if target is not None else None
        if host is None or "dpu" not in list(target.keys):
            return mod
        return tvm.tirx.transform.BindTarget(tvm.target.Target(host, host=host))(mod)

    return _bind


def lower_dpu_module(mod: tvm.IRModule) -> tvm.IRModule:
    """A module whose DPU partitions carry their programs -> RunCodegen + TVM lowering."""
    mod = relax.transform.RunCodegen()(mod)
    if "const_name_to_constant" in (mod.attrs or {}):
        # RunCodegen copies the partitions' weights there; the programs already hold them (the .so would double).
        mod = mod.without_attr("const_name_to_constant")
    return bind_tir_to_host()(cpu_lowering()(mod))


def compiled_dpu_lowering() -> tvm.transform.Pass:
    """Pipeline for a module whose DPU partitions already carry programs (e.g. recompiling for another CPU)."""

    @tvm.transform.module_pass(opt_level=0, name="DPULowering")
    def _lower(mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return lower_dpu_module(mod)

    return _lower


def prepare_and_compile(mod: tvm.IRModule, *, arch: Any = DEFAULT_ARCH, calibration: Any = None,
                        fusion: str = DEFAULT_FUSION, method: str = "mse", fix_points: dict[str, int] | None = None,
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


def dpu_pipeline(arch: Any = None, calibration: Any = None, fusion: str | None = None, method: str = "mse",
                 fix_points: dict[str, int] | None = None, is_qdq: bool = False, normalize: bool = True,
                 progress: bool = False, record: list | None = None, plugins: Any = None,
                 cores: int = 1, segments: str = "auto", handed_over: bool = False) -> tvm.transform.Pass:
    """The "dpu" Relax pipeline (`relax.get_pipeline("dpu", **options)`).

    Options: `arch` (preset name, arch.json path or Arch; None: the PassContext config "relax.dpu.arch", the
    target's model (the "dpu-<preset>" tags), else DEFAULT_ARCH; see `resolve_arch`), `calibration` (arrays, dicts,
    an .npz path, ...; None: the config "relax.dpu.calibration", else random inputs with a warning), `fusion`
    ("none" | "greedy" | "optimal"; None: the config "relax.dpu.fusion", else "optimal"), `method` ("mse" |
    "minmax"), `fix_points` ({ONNX tensor name: fix_point}), `normalize` (run tvm-dpu's normalization first),
    `plugins` (custom-IP plugins by name, "a,b" or a list, applied in order before DPU partitioning), `cores`
    (DPU cores each partition's independent segments are scheduled on; 1: one program per partition) and `segments` ("auto": keep a
    partition's segments when predicted faster; "always").
    `record`, if a list, receives the DPUCompileResult (partition report, compiled subgraphs) of each run.
    `handed_over`: the module compiled is the caller's no longer (see `prepare_and_compile`); for tvm_dpu.build."""

    @tvm.transform.module_pass(opt_level=0, name="DPUPipeline")
    def _pipeline(mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        result = prepare_and_compile(mod, arch=resolve_arch(arch), calibration=resolve_calibration(calibration),
                                     fusion=resolve_fusion(fusion), method=method,
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
    for tag, config in dpu_target_tags().items():
        tvm.target.tag.register_tag(tag, config, override=True)
    register_pass_config()
    pipelines = relax.pipeline.PIPELINE_MAP
    if "dpu" not in pipelines:
        relax.register_pipeline("dpu")(dpu_pipeline)
    if "dpu_lowering" not in pipelines:
        relax.register_pipeline("dpu_lowering")(compiled_dpu_lowering)
    if TVM_DEFAULT_PIPELINE["factory"] is None:
        TVM_DEFAULT_PIPELINE["factory"] = pipelines["default"]
        pipelines["default"] = _default_for_target
    _STATE["registered"] = True
