"""tvm-dpu: compile CNNs for the Xilinx DPUCZDX8G (ISA1) accelerator through TVM Relax BYOC.

Public API (imported lazily, so `import tvm_dpu` stays cheap):

    build(mod, target="dpu", arch=..., calibration=...) -> CompiledModel   end-to-end compiler
    from_onnx(path, shapes=None) -> tvm.IRModule                           ONNX frontend (normalized Relax)
    partition_for_dpu(mod, arch) -> tvm.IRModule                           Relax BYOC partitioning
    partition(mod, arch) -> (tvm.IRModule, PartitionReport)
    load_arch(spec) -> Arch, list_presets()                                DPU configurations
    load(path, device="emulator"|"pynq") -> CompiledModel                  a deployed .tvmdpu artifact
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
    "load": ("tvm_dpu.runtime.artifact", "load"),
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        module, attr = _EXPORTS[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tvm_dpu' has no attribute {name!r}")
