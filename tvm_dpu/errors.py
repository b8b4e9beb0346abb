"""Exception types shared by every stage. Each names what is wrong and where; the CLI prints them without a traceback."""
from __future__ import annotations


def _register_with_tvm_ffi(cls: type) -> None:
    """Let `cls` cross TVM's FFI with its type: an error raised inside a TVM callback (a pass, relax.ext.dpu, the
    DPU runtime function the VM calls) reaches the caller as this class instead of a RuntimeError."""
    # Registered when tvm_ffi is imported (importing it here would cost seconds to every tvm-dpu process,
    # the CLI's --help included); a process without TVM has no FFI to cross.
    from tvm_dpu.util.import_hooks import when_imported

    when_imported("tvm_ffi", lambda ffi: ffi.register_error(f"tvm_dpu.{cls.__name__}", cls))


class DPUError(Exception):
    """Base class for every error tvm-dpu raises on purpose."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _register_with_tvm_ffi(cls)


class ArchError(DPUError, ValueError):
    """Unknown architecture name, bad fingerprint or malformed arch.json."""


class FrontendError(DPUError, ValueError):
    """A model that cannot be imported (malformed file, dynamic shape, unsupported opset, ...)."""


class PartitionError(DPUError):
    """Partitioning failed."""


class QuantizationError(DPUError, ValueError):
    """Calibration / fix_point problems (e.g. a QDQ scale that is not a power of two)."""


class ISAError(DPUError, ValueError):
    """A field value outside its encoding range, an unknown opcode, a truncated instruction stream."""


class EmulatorError(DPUError):
    """The emulator refused an instruction (bad bank id, address or length); names the instruction index and field."""


class ArtifactError(DPUError, ValueError):
    """A compiled artifact that is truncated, corrupt, of the wrong version or built for another DPU."""


_register_with_tvm_ffi(DPUError)


class InputError(DPUError, ValueError):
    """Input or calibration data that cannot be used: unreadable file, wrong names, dtype, shape, NaN/Inf."""


class RunError(DPUError, RuntimeError):
    """Running a compiled model failed inside TVM's VM (the message keeps TVM's own words)."""


class FusionError(DPUError, ValueError):
    """A bad fusion request (unknown mode, a plan that does not cover the graph, a cyclic grouping)."""


class XModelError(ArtifactError):
    """An AMD .xmodel (XIR graph) that cannot be read or run: names the field path or op and the file offset."""


def did_you_mean(word: str, choices: "list[str] | tuple[str, ...]") -> str:
    """" (did you mean 'x'?)" for the choices closest to a mistyped `word` (case-insensitive), else ""."""
    import difflib

    lowered = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(str(word).lower(), list(lowered), n=3, cutoff=0.6)
    if not close:
        return ""
    return " (did you mean " + " or ".join(repr(lowered[c]) for c in close) + "?)"
