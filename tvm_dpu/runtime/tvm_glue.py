"""TVM integration: the `relax.ext.dpu` codegen hook, the `dpu` relax pipeline and the `dpu` target tag.

`relax.transform.RunCodegen` hands every partition function with Codegen="dpu" to `relax.ext.dpu`. The hook
itself only collects them (symbol -> Relax function) for the build that is running (a context variable), because
compiling a DPU subgraph needs calibration data that only the build has. The build then registers one packed
function per symbol; the Relax VM resolves them when it is constructed, so registration always happens right before
a VM is created (see tvm-relax-byoc-notes.md section 6).
"""
from __future__ import annotations

import contextvars
from contextlib import contextmanager
from typing import Callable, Iterator

import tvm
from tvm import relax

from tvm_dpu.errors import DPUError

_ACTIVE_HOOK: contextvars.ContextVar[Callable | None] = contextvars.ContextVar("tvm_dpu_codegen_hook", default=None)


@contextmanager
def codegen_hook(fn: Callable[[str, relax.Function], None]) -> Iterator[None]:
    """Within the block, every function RunCodegen passes to relax.ext.dpu is given to fn(symbol, function)."""
    token = _ACTIVE_HOOK.set(fn)
    try:
        yield
    finally:
        _ACTIVE_HOOK.reset(token)


def _dpu_codegen(functions, options, constant_names):
    hook = _ACTIVE_HOOK.get()
    if hook is None:
        raise DPUError("relax.ext.dpu was called outside a tvm-dpu build: use tvm_dpu.build(mod, ...) or "
                       "tvm.compile(mod, target='dpu', relax_pipeline='dpu')")
    for f in functions:
        hook(str(f.attrs["global_symbol"]), f)
    return []


def register_packed(symbol: str, fn: Callable) -> None:
    """(Re)register the packed function the VM will call for a DPU partition."""
    tvm.register_global_func(symbol, fn, override=True)


_REGISTERED = False


def register() -> None:
    """Register relax.ext.dpu, the 'dpu' relax pipeline and the 'dpu' target tag (idempotent)."""
    global _REGISTERED
    if _REGISTERED:
        return
    tvm.register_global_func("relax.ext.dpu", _dpu_codegen, override=True)
    tvm.target.tag.register_tag("dpu", {"kind": "llvm", "keys": ["dpu", "cpu"]}, override=True)
    if "dpu" not in relax.pipeline.PIPELINE_MAP:
        relax.register_pipeline("dpu")(_dpu_pipeline)
    _REGISTERED = True


def _dpu_pipeline(arch="DPUCZDX8G_ISA1_B4096", calibration=None, **build_options):
    """Relax pipeline 'dpu': partition, compile the DPU subgraphs (calibrating on `calibration`, or on random
    inputs with a warning), register their runtime functions, then the default LLVM lowering of the rest.

    Use: tvm.compile(mod, target="dpu", relax_pipeline="dpu"), or relax.get_pipeline("dpu", arch=..., calibration=...)
    for options. The VM created from the result calls the emulator for every DPU partition.
    """

    @tvm.transform.module_pass(opt_level=0, name="DPUPipeline")
    def _pipeline(mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        from tvm_dpu.builder import build_partitioned

        lowered, model = build_partitioned(mod, arch=arch, calibration=calibration, **build_options)
        model.register_functions()
        _KEEP_ALIVE.append(model)
        return relax.get_pipeline("default")(lowered)

    return _pipeline


#: Models built through the pipeline stay referenced so their registered runners outlive the pass.
_KEEP_ALIVE: list = []
