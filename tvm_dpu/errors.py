"""Exception types shared by every stage. Each names what is wrong and where; the CLI prints them without a traceback."""
from __future__ import annotations


class DPUError(Exception):
    """Base class for every error tvm-dpu raises on purpose."""


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


class FusionError(DPUError, ValueError):
    """A bad fusion request (unknown mode, a plan that does not cover the graph, a cyclic grouping)."""
