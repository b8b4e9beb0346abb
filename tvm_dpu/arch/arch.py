"""The DPU architecture description: one immutable dataclass, filled from data (presets.json / arch.json).

Everything downstream (limits, codegen, emulator, timing) reads hardware parameters from an `Arch`;
nothing else hard-codes PP/ICP/OCP or bank ids.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from tvm_dpu.errors import ArchError

PRESETS_FILE = Path(__file__).with_name("presets.json")


@dataclass(frozen=True)
class BankGroup:
    """A group of on-chip banks with consecutive ids (isa1-semantics.md 2.2)."""

    name: str  # "VB0", "VB1", ..., "CONVW", "DWCONVW", "BIAS"
    kind: str  # "image" or "param"
    base_id: int
    count: int
    width: int  # bytes per row (ICP)
    depth: int  # rows (bank_depth)

    @property
    def ids(self) -> range:
        return range(self.base_id, self.base_id + self.count)


@dataclass(frozen=True)
class Arch:
    """One DPU configuration (one core) plus the board it sits on.

    Hardware fields follow the Vitis AI target description (dpu-facts.md, isa1-semantics.md 2.2).
    Board fields (clock, cores, DDR bandwidth) come from the board preset; a bare DPU preset carries
    defaults that the timing model may use.
    """

    name: str  # e.g. "DPUCZDX8G_ISA1_B4096", "zcu102", "dnnvm-zu2"
    family: str  # "DPUCZDX8G"
    isa: int  # ISA version (1 for ISA1)
    arch_index: int  # fingerprint bits 3:0 (0..7 = B512..B4096)
    pp: int  # pixel parallelism of the conv engine
    icp: int  # input channel parallelism (= bank width in bytes)
    ocp: int  # output channel parallelism
    alu_pp: int  # pixel parallelism of the ALU / eltwise engines
    bank_depth: int = 2048
    img_bank_groups: int = 2
    channel_augmentation: bool = True
    conv_leaky: bool = True  # CONV may use LeakyReLU (fingerprint bit 28)
    dw_leaky: bool = False  # ALU/depthwise may use LeakyReLU (fingerprint bit 29)
    save_argmax: bool = True  # fingerprint bit 30 (set in every shipped ISA1 target)
    # Activation codes (dpu-facts.md: 0 none, 1 relu, 2 prelu, 3 leaky, 4 relu6, 5 hsigmoid, 6 hswish)
    conv_activations: tuple[str, ...] = ("relu", "leaky_relu", "relu6")
    alu_activations: tuple[str, ...] = ("relu", "relu6")
    elew_activations: tuple[str, ...] = ("relu",)
    # Board / system parameters
    freq_mhz: float = 300.0
    cores: int = 1
    ddr_bytes_per_s: float = 17.1e9
    onchip_bytes: int | None = None  # informational (DNNVM boards quote total on-chip memory)
    board: str | None = None
    # Fingerprint bits that no field above represents for this ISA, kept for round trips. Default: ISA1 bits 23:16
    # = 0x01, as in every shipped ISA1 target, so a hand-built core equals its preset (see presets.json).
    fp_other_bits: int = 0x10000
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    # ---- derived quantities -------------------------------------------------------------
    @property
    def dpu_name(self) -> str:
        """The Vitis AI target name of the core, e.g. DPUCZDX8G_ISA1_B4096."""
        return f"{self.family}_ISA{self.isa}_B{self.ops_per_clock}"

    @property
    def target_label(self) -> str:
        """The core name plus the board, if any, for messages: "DPUCZDX8G_ISA1_B4096 (zcu102)"."""
        return f"{self.dpu_name} ({self.board})" if self.board else self.dpu_name

    @property
    def fingerprint(self) -> int:
        """The 64-bit DPU fingerprint (family, ISA, feature code) of the core; see `tvm_dpu.arch.fingerprint`."""
        from tvm_dpu.arch.fingerprint import encode_fingerprint  # the module imports Arch

        return encode_fingerprint(self)

    @property
    def ops_per_clock(self) -> int:
        return self.pp * self.icp * self.ocp * 2

    @property
    def peak_gops(self) -> float:
        """Peak GOPS of one core at the board clock."""
        return self.ops_per_clock * self.freq_mhz * 1e6 / 1e9

    @property
    def channel_parallel(self) -> int:
        """`channel_parallel` of the Vitis AI limits table (= ICP)."""
        return self.icp

    @property
    def bank_groups(self) -> tuple[BankGroup, ...]:
        """Bank groups in target-factory order: VB0..VB(n-1) (PP banks each), CONVW (OCP), DWCONVW (1), BIAS (1)."""
        groups: list[BankGroup] = []
        base = 0
        for g in range(self.img_bank_groups):
            groups.append(BankGroup(f"VB{g}", "image", base, self.pp, self.icp, self.bank_depth))
            base += self.pp
        for name, count in (("CONVW", self.ocp), ("DWCONVW", 1), ("BIAS", 1)):
            groups.append(BankGroup(name, "param", base, count, self.icp, self.bank_depth))
            base += count
        return tuple(groups)

    def bank_group(self, name: str) -> BankGroup:
        for g in self.bank_groups:
            if g.name == name:
                return g
        raise KeyError(f"{self.name} has no bank group {name!r}")

    @property
    def num_banks(self) -> int:
        last = self.bank_groups[-1]
        return last.base_id + last.count


# ---- presets (presets.json) ---------------------------------------------------------------
_SHORT_NAME = re.compile(r"B\d+", re.IGNORECASE)
_ARCH_JSON_HINT = 'an arch.json holds {"target": NAME} or {"fingerprint": "0x..."}'


def _public(entry: Mapping[str, Any]) -> dict[str, Any]:
    """Drop the '_'-prefixed note keys of a presets.json entry."""
    return {k: v for k, v in entry.items() if not k.startswith("_")}


def _arch_from_fields(name: str, fields: Mapping[str, Any]) -> Arch:
    values = dict(fields)
    for key in ("conv_activations", "alu_activations", "elew_activations"):
        if key in values:
            values[key] = tuple(values[key])
    if isinstance(values.get("fp_other_bits"), str):
        values["fp_other_bits"] = int(values["fp_other_bits"], 16)
    try:
        return Arch(name=name, **values)
    except TypeError as e:  # unknown or missing key in the data file
        raise ArchError(f"{PRESETS_FILE.name}: bad entry {name!r}: {e}") from None


@lru_cache(maxsize=1)
def _presets() -> dict[str, Arch]:
    """All presets by exact name: the DPU cores first, then the boards (data order)."""
    data = json.loads(PRESETS_FILE.read_text())
    defaults = _public(data["dpu_defaults"])
    presets: dict[str, Arch] = {}
    for name, entry in _public(data["dpus"]).items():
        arch = _arch_from_fields(name, {**defaults, **_public(entry)})
        if arch.dpu_name != name:
            raise ArchError(f"{PRESETS_FILE.name}: preset {name} has PP*ICP*OCP*2 = {arch.ops_per_clock}")
        presets[name] = arch
    for name, entry in _public(data["boards"]).items():
        fields = _public(entry)
        dpu = fields.pop("dpu")
        if dpu not in presets:
            raise ArchError(f"{PRESETS_FILE.name}: board {name} names unknown DPU preset {dpu!r}")
        presets[name] = replace(presets[dpu], name=name, board=name, **fields)
    return presets


def dpu_presets() -> tuple[Arch, ...]:
    """The bare DPU core presets (no board), in arch-index order."""
    return tuple(a for a in _presets().values() if a.board is None)


def list_presets() -> list[str]:
    """Names accepted by `load_arch`: the DPU cores (DPUCZDX8G_ISA1_B512 ...) then the boards (zcu102 ...)."""
    return list(_presets())


def _known_names() -> str:
    return ", ".join(list_presets())


def find_preset(name: str) -> Arch | None:
    """The preset called `name` (case-insensitive; "B4096" means DPUCZDX8G_ISA1_B4096), or None."""
    key = name.strip().lower()
    if _SHORT_NAME.fullmatch(key):
        key = f"dpuczdx8g_isa1_{key}"
    for preset_name, arch in _presets().items():
        if preset_name.lower() == key:
            return arch
    return None


def _from_arch_dict(spec: Mapping[str, Any], where: str) -> Arch:
    from tvm_dpu.arch.fingerprint import arch_from_fingerprint, parse_fingerprint

    unknown = sorted(str(k) for k in spec if k not in ("target", "fingerprint"))
    if unknown:
        raise ArchError(f"{where}: unknown key(s) {', '.join(unknown)}; {_ARCH_JSON_HINT}")
    if "target" not in spec and "fingerprint" not in spec:
        raise ArchError(f"{where}: no 'target' or 'fingerprint' key; {_ARCH_JSON_HINT}")
    by_target = by_fp = None
    if "target" in spec:
        target = spec["target"]
        if not isinstance(target, str):
            raise ArchError(f"{where}: 'target' must be a string, got {target!r}; known names: {_known_names()}")
        by_target = find_preset(target)
        if by_target is None:
            raise ArchError(f"{where}: unknown target {target!r}; known names: {_known_names()}")
    if "fingerprint" in spec:
        by_fp = arch_from_fingerprint(parse_fingerprint(spec["fingerprint"], where))
    if by_target is not None and by_fp is not None and by_target.fingerprint != by_fp.fingerprint:
        raise ArchError(
            f"{where}: target {spec['target']!r} (fingerprint 0x{by_target.fingerprint:016X}) does not match "
            f"fingerprint 0x{by_fp.fingerprint:016X}"
        )
    return by_target if by_target is not None else by_fp  # type: ignore[return-value]


def _from_arch_json(path: Path) -> Arch:
    if not path.is_file():
        raise ArchError(f"arch.json {str(path)!r} does not exist; known preset names: {_known_names()}")
    try:
        spec = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ArchError(
            f"{path}: malformed JSON ({e.msg} at line {e.lineno} column {e.colno}); {_ARCH_JSON_HINT}"
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ArchError(f"{path}: cannot read ({e})") from None
    if not isinstance(spec, dict):
        raise ArchError(f"{path}: expected a JSON object, got {type(spec).__name__}; {_ARCH_JSON_HINT}")
    return _from_arch_dict(spec, str(path))


def load_arch(spec: Arch | str | os.PathLike | Mapping[str, Any] | int) -> Arch:
    """Resolve an architecture spec to an `Arch`.

    `spec` is an Arch (returned as is); a preset name (case-insensitive, "B4096" is short for
    DPUCZDX8G_ISA1_B4096; see `list_presets`); a path to an arch.json holding {"target": NAME} or
    {"fingerprint": "0x..."} (an int is accepted too); such a dict; a fingerprint as int or "0x..." string.
    Anything else, or an unknown name, bad fingerprint or malformed file, raises ArchError.
    """
    from tvm_dpu.arch.fingerprint import arch_from_fingerprint, parse_fingerprint

    if isinstance(spec, Arch):
        return spec
    if isinstance(spec, Mapping):
        return _from_arch_dict(spec, "arch spec")
    if isinstance(spec, int) and not isinstance(spec, bool):
        return arch_from_fingerprint(spec)
    if isinstance(spec, os.PathLike):
        return _from_arch_json(Path(spec))
    if isinstance(spec, str):
        preset = find_preset(spec)
        if preset is not None:
            return preset
        text = spec.strip()
        if text.lower().startswith("0x"):
            return arch_from_fingerprint(parse_fingerprint(text, "arch spec"))
        if text.lower().endswith(".json") or os.sep in text or Path(text).is_file():
            return _from_arch_json(Path(text))
        raise ArchError(
            f"unknown DPU architecture {spec!r}; known names: {_known_names()} "
            "(or a path to an arch.json, or a fingerprint '0x...')"
        )
    raise ArchError(
        f"cannot make an architecture from a {type(spec).__name__}; "
        "pass a preset name, arch.json path, dict, fingerprint or Arch"
    )
