"""tvm-dpu: compile CNNs for the Xilinx DPUCZDX8G (ISA1) accelerator through TVM Relax BYOC.

Importing the package registers the TVM plugin (at once if TVM is imported, else right after `import tvm`, so
that the CLI's start does not pay for TVM): the "dpu" target tag, the "dpu" Relax pipeline, the
`relax.ext.dpu` codegen and the runtime function the DPU partitions of a TVM module call. So

    tvm.compile(mod, target="dpu")                                             # default arch and options
    tvm.compile(mod, target="dpu", relax_pipeline=relax.get_pipeline("dpu", arch=..., calibration=...))
    ex.export_library("m.so"); relax.VirtualMachine(tvm.runtime.load_module("m.so"), tvm.cpu())

work after `import tvm_dpu` (in the deploying process too: it provides the DPU runtime).

Public API (the rest is imported lazily):

    build(mod, target="dpu", arch=..., calibration=...) -> CompiledModel   end-to-end compiler
    from_onnx(path, shapes=None) -> tvm.IRModule                           ONNX frontend (normalized Relax)
    partition_for_dpu(mod, arch) -> tvm.IRModule                           Relax BYOC partitioning
    partition(mod, arch) -> (tvm.IRModule, PartitionReport)
    load_arch(spec) -> Arch, list_presets()                                DPU configurations
    load(path, device="emulator"|"pynq") -> CompiledModel                  a deployed .tvmdpu artifact
    load("m.xmodel", device=...) -> xmodel.XModelRunner                    a vai_c-compiled AMD .xmodel
    load("m.so", trust="unsigned"|trusted_keys=...) -> CompiledModel      TVM's export_library output
    describe(ex | "m.so" | "m.tvmdpu") -> [per DPU partition: symbol, arch, instruction counts, fix_points]
    set_device("emulator"|"pynq"|device), use_device(device)              where DPU partitions of TVM modules run
    devices(arch, kind="emulator"|"pynq") -> one device per DPU core        pin models to cores
    PipelineModel.from_model(compiled, boards=N) / .load(pipeline.json)    a model split over N boards
    core_group(arch, cores) -> CoreGroup                                    several cores for one model
    create_runner(model or path) -> Runner                                  VART-style: execute_async / wait
"""
from __future__ import annotations

__version__ = "0.1.0"

_EXPORTS = {
    "build": ("tvm_dpu.builder", "build"),
    "from_onnx": ("tvm_dpu.frontend", "from_onnx"),
    "partition_for_dpu": ("tvm_dpu.passes", "partition_for_dpu"),
    "partition": ("tvm_dpu.passes", "partition"),
    "PartitionReport": ("tvm_dpu.types", "PartitionReport"),
    "load_arch": ("tvm_dpu.arch", "load_arch"),
    "list_presets": ("tvm_dpu.arch", "list_presets"),
    "Arch": ("tvm_dpu.arch", "Arch"),
    "CompiledModel": ("tvm_dpu.runtime.compiled_model", "CompiledModel"),
    "set_device": ("tvm_dpu.runtime.dispatch", "set_device"),
    "use_device": ("tvm_dpu.runtime.dispatch", "use_device"),
    "get_device": ("tvm_dpu.runtime.dispatch", "get_device"),
    "devices": ("tvm_dpu.runtime.cores", "devices"),
    "serve": ("tvm_dpu.runtime.cores", "serve"),
    "PipelineModel": ("tvm_dpu.pipeline.model", "PipelineModel"),
    "describe": ("tvm_dpu.runtime.describe", "describe"),
    "core_group": ("tvm_dpu.runtime.cores", "core_group"),
    "create_runner": ("tvm_dpu.serving.runner", "create_runner"),
}

__all__ = sorted([*_EXPORTS, "load"]) + ["__version__"]


def load(path, *args, **kwargs):
    """Load a model to run: a `.tvmdpu` artifact (runtime.artifact.load -> CompiledModel) or, by its suffix, a
    vai_c-compiled AMD `.xmodel` (xmodel.load_xmodel -> XModelRunner). Arguments as those functions take them
    (`device="emulator"|"pynq"|device object`, device options)."""
    import os

    if isinstance(path, (str, os.PathLike)) and os.fspath(path).lower().endswith(".xmodel"):
        from tvm_dpu.xmodel.runner import load_xmodel

        return load_xmodel(path, *args, **kwargs)
    from tvm_dpu.runtime.artifact import load as load_artifact

    return load_artifact(path, *args, **kwargs)


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        module, attr = _EXPORTS[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tvm_dpu' has no attribute {name!r}")


def _register_plugin() -> None:
    from tvm_dpu.backend.relax_pipeline import register
    from tvm_dpu.plugins.runtime import register_dispatcher as register_plugin_dispatcher
    from tvm_dpu.runtime.dispatch import register_dispatcher

    register_dispatcher()
    register_plugin_dispatcher()
    register()


# With TVM: the plugin is registered right after `import tvm` (or now, if TVM is already imported), so that
# importing tvm_dpu alone (the CLI) does not pay for TVM.
from tvm_dpu.util.import_hooks import when_imported as _when_imported  # noqa: E402



def _when_tvm_dpu_is_whole(fn) -> None:
    """fn() now, or, when a tvm_dpu module is half made (a TVM import from the top of one, e.g.
    backend.dpu_compile imported first, fires the hooks below), once the outermost such module has finished
    (sys.modules keeps import-start order): running it then would import that module half made."""
    import sys

    busy = [n for n, m in list(sys.modules.items()) if n.startswith("tvm_dpu.")
            and getattr(getattr(m, "__spec__", None), "_initializing", False)]
    if busy:
        _when_imported(busy[0], lambda _m: fn())
    else:
        fn()


def _name_tvm_onnx_imports() -> None:
    from tvm_dpu.frontend.onnx_import import name_tvm_imports

    name_tvm_imports()


_when_imported("tvm", lambda _tvm: _when_tvm_dpu_is_whole(_register_plugin))
# TVM's own ONNX importer carries the ONNX node names into the reports (frontend/onnx_import.name_tvm_imports).
_when_imported("tvm.relax.frontend.onnx.onnx_frontend", lambda _m: _when_tvm_dpu_is_whole(_name_tvm_onnx_imports))
