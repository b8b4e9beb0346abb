"""DPU configurations as data (presets.json, arch.json, fingerprint) and per-target operator limits."""
from tvm_dpu.arch.arch import Arch, BankGroup, list_presets, load_arch
from tvm_dpu.arch.arch import arch_from_fingerprint, decode_fingerprint
from tvm_dpu.arch.limits import check_op
from tvm_dpu.arch.opdesc import OpDesc

__all__ = [
    "Arch",
    "BankGroup",
    "OpDesc",
    "load_arch",
    "list_presets",
    "decode_fingerprint",
    "arch_from_fingerprint",
    "check_op",
]
