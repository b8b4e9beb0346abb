"""The DPU architecture description: one immutable dataclass, filled from data (presets.json / arch.json).

Everything downstream (limits, codegen, emulator, timing) reads hardware parameters from an `Arch`;
nothing else hard-codes PP/ICP/OCP or bank ids. The 64-bit DPU fingerprint codec lives here too (last section):
an Arch encodes its fingerprint and a fingerprint selects or builds an Arch, so the two are one module.
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

from tvm_dpu.errors import ArchError, did_you_mean
from tvm_dpu.schema import SchemaError, parse_json
from tvm_dpu.security.safe_io import read_regular

#: An arch.json is a few hundred bytes; the bound keeps a wrong file (a model, an image) from being parsed.
MAX_ARCH_JSON_BYTES = 1 << 20

PRESETS_FILE = Path(__file__).with_name("presets.json")
FAMILIES_FILE = Path(__file__).with_name("families.json")

#: LeakyReLU slope hard-wired in CONV act_type 3 (26/256): a fact of the hardware, so the limit checks (which
#: reject other slopes) and the fixed-point arithmetic (quant.fixpoint) both take it from here.
LEAKY_NUM = 26
LEAKY_SHIFT = 8


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
    # Activation names per engine: names of the ISA act_type table (codegen/isa_fields.json "enums"); the emulator
    # refuses a name that table does not have
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
    # A core of a family AMD's factory knows only by registered targets (families.json): the target's name, and its
    # bank groups as the prototxt lists them (empty: the DPUCZDX8G layout `bank_groups` derives)
    target: str | None = None
    banks: tuple[BankGroup, ...] = ()
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    # ---- derived quantities -------------------------------------------------------------
    @property
    def dpu_name(self) -> str:
        """The Vitis AI target name of the core, e.g. DPUCZDX8G_ISA1_B4096 or DPUCAHX8H_ISA2_DWC."""
        return self.target or f"{self.family}_ISA{self.isa}_B{self.ops_per_clock}"

    @property
    def target_label(self) -> str:
        """The core name plus the board, if any, for messages: "DPUCZDX8G_ISA1_B4096 (zcu102)"."""
        return f"{self.dpu_name} ({self.board})" if self.board else self.dpu_name

    @property
    def fingerprint(self) -> int:
        """The 64-bit DPU fingerprint (family, ISA, feature code) of the core; see `encode_fingerprint`."""
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
        """Bank groups in target-factory order: the target's own list if it has one (`banks`), else the DPUCZDX8G
        layout VB0..VB(n-1) (PP banks each), CONVW (OCP), DWCONVW (1), BIAS (1)."""
        if self.banks:
            return self.banks
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
    def instruction_set(self) -> str:
        """The name of the core's instruction set ("DPUV2", "DPUV3E"), a field table of codegen.isa; ArchError if
        tvm-dpu has no table for this family and ISA version."""
        fam = families().get(self.family)
        iset = None if fam is None else fam.instruction_sets.get(self.isa)
        if iset is None:
            raise ArchError(f"{self.target_label}: tvm-dpu has no instruction table for {self.family} ISA{self.isa}")
        return iset

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
    extra = {}
    if "fingerprint_aliases" in values:
        extra["fingerprint_aliases"] = tuple(int(a, 16) for a in values.pop("fingerprint_aliases"))
    if "engines" in values:  # per-engine parallelism and parameter banks of a registered target (emulator.dpuv3e)
        extra["engines"] = values.pop("engines")
    try:
        if "banks" in values:
            values["banks"] = tuple(BankGroup(*g) for g in values["banks"])
        return Arch(name=name, extra=extra, **values)
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


@lru_cache(maxsize=1)
def _family_targets() -> dict[str, Arch]:
    """The registered targets of the other families (presets.json "family_targets") and the cards carrying them
    ("family_boards"), by name."""
    data = json.loads(PRESETS_FILE.read_text())
    targets: dict[str, Arch] = {}
    for name, entry in _public(data["family_targets"]).items():
        arch = _arch_from_fields(name, _public(entry))
        fam = families().get(arch.family)
        if arch.dpu_name != name or fam is None or fam.fingerprint != "registered":
            raise ArchError(f"{PRESETS_FILE.name}: family target {name} must name itself and a registered family")
        targets[name] = arch
    for name, entry in _public(data.get("family_boards", {})).items():
        fields = _public(entry)
        dpu = fields.pop("dpu")
        if dpu not in targets:
            raise ArchError(f"{PRESETS_FILE.name}: family board {name} names unknown family target {dpu!r}")
        targets[name] = replace(targets[dpu], name=name, board=name, **fields)
    return targets


def family_targets() -> tuple[Arch, ...]:
    """The cores of the other families tvm-dpu knows (DPUCAHX8H_ISA2, ...): load_arch finds them by name or
    fingerprint, but they are not compile targets (`list_presets`) until their family's code generator exists."""
    return tuple(a for a in _family_targets().values() if a.board is None)


def family_boards() -> tuple[Arch, ...]:
    """The cards carrying those cores (u50, u50lv, u280: presets.json "family_boards"), found by name."""
    return tuple(a for a in _family_targets().values() if a.board is not None)


def dpu_presets() -> tuple[Arch, ...]:
    """The bare DPU core presets (no board), in arch-index order."""
    return tuple(a for a in _presets().values() if a.board is None)


def list_presets() -> list[str]:
    """Names accepted by `load_arch`: the DPU cores (DPUCZDX8G_ISA1_B512 ...) then the boards (zcu102 ...)."""
    return list(_presets())


def _short_names() -> list[str]:
    """The preset names and the short core names ("B4096") `find_preset` also accepts."""
    names = list_presets()
    return names + [n.rsplit("_", 1)[-1] for n in names if n.startswith("DPUCZDX8G_ISA1_")]


def _known_names() -> str:
    return ", ".join(list_presets()) + f" (not compile targets yet: {', '.join(_family_targets())})"


def find_preset(name: str) -> Arch | None:
    """The preset or family target called `name` (case-insensitive; "B4096" means DPUCZDX8G_ISA1_B4096), or None."""
    key = name.strip().lower()
    if _SHORT_NAME.fullmatch(key):
        key = f"dpuczdx8g_isa1_{key}"
    for preset_name, arch in (*_presets().items(), *_family_targets().items()):
        if preset_name.lower() == key:
            return arch
    return None


def _from_arch_dict(spec: Mapping[str, Any], where: str) -> Arch:
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
    if not path.exists():
        raise ArchError(f"arch.json {str(path)!r} does not exist; known preset names: {_known_names()}")
    try:
        spec = parse_json(read_regular(path, "JSON file", ArchError), MAX_ARCH_JSON_BYTES)
    except SchemaError as e:
        raise ArchError(f"{path}: {e}; {_ARCH_JSON_HINT}") from None
    except OSError as e:
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
            f"unknown DPU architecture {spec!r}{did_you_mean(text, _short_names())}; known names: {_known_names()} "
            "(or a path to an arch.json, or a fingerprint '0x...')"
        )
    raise ArchError(
        f"cannot make an architecture from a {type(spec).__name__}; "
        "pass a preset name, arch.json path, dict, fingerprint or Arch"
    )


# -------------------------------------------------------------------------------------------------------------
# The 64-bit DPU fingerprint: decode it to fields, build an `Arch` from it, encode an `Arch` back.
#
# Layout (dpu-facts.md "arch.json and fingerprint", isa1-semantics.md 2.2, and the Vitis AI target factory
# functions for DPUCZDX8G ISA0 / ISA1, read for facts):
#
#     bits 63:56  family (families.json: 0x01 DPUCZDX8G, 0x02 DPUCAHX8H, ... 0x09 DPUCV2DX8G)
#     bits 55:48  ISA version
#     bits 47:0   feature code; its meaning depends on the ISA:
#
#     bits    ISA1 (create_target_DPUCZDX8G_ISA1)     ISA0 (create_target_v2)
#     3:0     arch index 0-7 = B512 ... B4096         same
#     11:8    ALU (and eltwise) pixel parallelism     pool engine pixel parallelism
#     15:12   -                                       depthwise engine pixel parallelism (0 = no engine)
#     19:16   -                                       eltwise engine pixel parallelism
#     25:24   image bank groups                       same
#     26      channel augmentation (2*ICP)            same
#     27      load mean-value reduction: both factories leave it commented out (decoded, not used)
#     28      CONV LeakyReLU                          same
#     29      ALU LeakyReLU                           CONV ReLU6
#     30      SAVE argmax                             average pool
#     31      -                                       depthwise ReLU6
#     33:32   CONV write parallelism (2^n)            -
#     35:34   ALU write parallelism (2^n)             -
#     36      -                                       eltwise multiply
#     37      -                                       pool max-reduce (downsample)
#
# Family 0 is accepted as DPUCZDX8G: the conformance vectors (shared/conformance/isa1, made with AMD's simulator
# from the target factory's DPUCZDX8G_ISA1 prototxts) write the fingerprint as isa << 48 | feature_code, i.e. the
# target's own isa_version and feature_code fields without the type byte that the factory adds on top, and no
# DPU type uses code 0. An `Arch` always encodes the canonical family 0x01, so 0x0001... round-trips to 0x0101....
#
# The other families: AMD's factory decodes no DPUCAHX8H feature code field by field; it knows the fingerprints of
# its registered targets only, and so does tvm-dpu (families.json "fingerprint": "registered", presets.json
# "family_targets"): such a fingerprint selects its target or is refused naming the family and its known targets.
# -------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Family:
    """One DPU family (families.json): fingerprint type code, instruction set per ISA version, how its fingerprints
    are decoded ("fields" or "registered"), what tvm-dpu can do with it and, if not everything, what is missing."""

    name: str
    code: int
    instruction_sets: Mapping[int, str | None]
    fingerprint: str
    compile: bool
    run: bool
    missing: str = ""
    #: whether the code generator has fused pipelines (fusion templates) for the family; without, every op is
    #: emitted alone whatever fusion mode is asked for
    fusion: bool = True


@lru_cache(maxsize=1)
def families() -> dict[str, Family]:
    """Every DPU family of AMD's target factory, by name (families.json)."""
    data = _public(json.loads(FAMILIES_FILE.read_text())["families"])
    return {name: Family(name, int(e["code"]), {int(k): v for k, v in e["instruction_sets"].items()},
                         e["fingerprint"], bool(e["compile"]), bool(e["run"]), e.get("missing", ""),
                         bool(e.get("fusion", e["compile"])))
            for name, e in data.items()}


FAMILY_CODES = {f.code: f.name for f in families().values()}
SUPPORTED_FAMILY = "DPUCZDX8G"
#: What `require_support` checks: capability (a Family attribute) -> the verb of its message.
_CAPABILITIES = {"compile": "generate code for", "run": "run programs of"}


def require_support(arch: Arch, capability: str) -> None:
    """ArchError naming the core, its family and what is missing, unless tvm-dpu can `capability` ("compile" or
    "run") for the family. The one place a stage asks which family it is given."""
    fam = families().get(arch.family)
    if fam is None:
        raise ArchError(f"{arch.target_label}: unknown DPU family {arch.family!r}")
    if not getattr(fam, capability):
        iset = fam.instruction_sets.get(arch.isa)
        what = f"{fam.name} ISA{arch.isa}" + (f" (instruction set {iset})" if iset else "")
        raise ArchError(f"{arch.target_label}: tvm-dpu cannot {_CAPABILITIES[capability]} {what} yet: {fam.missing}")
def family_supports(arch: Arch, capability: str) -> bool:
    """Whether tvm-dpu can `capability` ("compile", "run", "fusion": a Family flag) for `arch`'s family (False for
    an unknown family): what a stage asks instead of which family it is given."""
    fam = families().get(arch.family)
    return bool(fam is not None and getattr(fam, capability))


SUPPORTED_ISAS = (0, 1)

# Bits an Arch field represents, per ISA (arch index, bits 11:8, bank groups, augmentation, conv leaky; plus,
# on ISA1, dw leaky and argmax). Every other bit lives in Arch.fp_other_bits.
_ARCH_FIELD_MASK = {1: 0x7700_0F0F, 0: 0x1700_0F0F}
# Bits the factory of each ISA reads (bit 27 included: named in both factories, then commented out).
_KNOWN_MASK = {1: 0x0F_7F00_0F0F, 0: 0x30_FF0F_FF0F}
_FEATURE_MASK = (1 << 48) - 1


def _bit(fp: int, n: int) -> bool:
    return bool((fp >> n) & 1)


def _arch_table() -> dict[int, Arch]:
    """Arch index -> DPU preset: the ARCH table (PP, ICP, OCP) is defined once, in presets.json."""
    return {a.arch_index: a for a in dpu_presets()}


def parse_fingerprint(value: Any, where: str = "fingerprint") -> int:
    """A fingerprint from an int or a hexadecimal string ("0x101000016010407", the 0x is optional)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ArchError(
            f"{where}: fingerprint must be a hex string like \"0x101000016010407\" or an int, got {value!r}"
        )
    if isinstance(value, str):
        text = value.strip()
        digits = text[2:] if text.lower().startswith("0x") else text
        try:
            value = int(digits, 16)
        except ValueError:
            raise ArchError(f"{where}: fingerprint {text!r} is not a hexadecimal number") from None
    if not 0 <= value < 1 << 64:
        raise ArchError(f"{where}: fingerprint {value:#x} does not fit in 64 bits")
    return value


def decode_fingerprint(fp: int | str) -> dict[str, Any]:
    """Decode a DPUCZDX8G fingerprint into its fields.

    Always present: fingerprint (canonical, family 0 -> 0x01), family_code (as given), family, isa,
    feature_code, arch_index, arch_name ("B4096"), pp, icp, ocp, alu_pp (bits 11:8: ALU/eltwise PP on ISA1,
    pool PP on ISA0), img_bank_groups, channel_augmentation, load_mean, conv_leaky, dw_leaky, save_argmax,
    other_bits (bits no Arch field holds), unknown_bits (bits no factory reads).
    ISA1 adds conv_wp, alu_wp. ISA0 adds pool_pp, dwconv_pp, eltwise_pp, conv_relu6, pool_avg, dwconv_relu6,
    eltwise_mult, pool_max_reduce (dw_leaky and save_argmax are then False: ISA0 has neither).
    A fingerprint of a family with registered targets only (DPUCAHX8H) decodes to fingerprint, family_code, family,
    isa, feature_code, target (its registered target's name) and instruction_set.
    Raises ArchError naming the field and value when the fingerprint is neither a DPUCZDX8G ISA0/ISA1 one nor a
    registered target's.
    """
    fp = parse_fingerprint(fp)
    where = f"fingerprint 0x{fp:016X}"
    family_code = fp >> 56
    if family_code not in (0, 0x01):
        return _decode_registered(fp, where)
    isa = (fp >> 48) & 0xFF
    if isa not in SUPPORTED_ISAS:
        raise ArchError(f"{where}: ISA version field (bits 55:48) = {isa}; {SUPPORTED_FAMILY} has ISA 0 and ISA 1")
    table = _arch_table()
    arch_index = fp & 0xF
    if arch_index not in table:
        known = ", ".join(f"{i} = B{a.ops_per_clock}" for i, a in sorted(table.items()))
        raise ArchError(f"{where}: arch index field (bits 3:0) = {arch_index}; known DPUCZDX8G indices: {known}")
    core = table[arch_index]
    img_bank_groups = (fp >> 24) & 0x3
    if img_bank_groups == 0:
        raise ArchError(f"{where}: image bank groups field (bits 25:24) = 0; a DPU needs at least one")
    alu_pp = (fp >> 8) & 0xF
    if isa == 1 and alu_pp == 0:
        raise ArchError(f"{where}: ALU pixel parallelism field (bits 11:8) = 0; an ISA1 DPU has an ALU engine")
    feature_code = fp & _FEATURE_MASK
    fields: dict[str, Any] = {
        "fingerprint": (0x01 << 56) | (fp & ((1 << 56) - 1)),
        "family_code": family_code,
        "family": SUPPORTED_FAMILY,
        "isa": isa,
        "feature_code": feature_code,
        "arch_index": arch_index,
        "arch_name": f"B{core.ops_per_clock}",
        "pp": core.pp,
        "icp": core.icp,
        "ocp": core.ocp,
        "alu_pp": alu_pp,
        "img_bank_groups": img_bank_groups,
        "channel_augmentation": _bit(fp, 26),
        "load_mean": _bit(fp, 27),
        "conv_leaky": _bit(fp, 28),
        "dw_leaky": isa == 1 and _bit(fp, 29),
        "save_argmax": isa == 1 and _bit(fp, 30),
        "other_bits": feature_code & ~_ARCH_FIELD_MASK[isa],
        "unknown_bits": feature_code & ~_KNOWN_MASK[isa],
    }
    if isa == 1:
        fields["conv_wp"] = 1 << ((fp >> 32) & 0x3)
        fields["alu_wp"] = 1 << ((fp >> 34) & 0x3)
    else:
        fields.update(
            pool_pp=alu_pp,
            dwconv_pp=(fp >> 12) & 0xF,
            eltwise_pp=(fp >> 16) & 0xF,
            conv_relu6=_bit(fp, 29),
            pool_avg=_bit(fp, 30),
            dwconv_relu6=_bit(fp, 31),
            eltwise_mult=_bit(fp, 36),
            pool_max_reduce=_bit(fp, 37),
        )
    return fields


def _registered_target(fp: int) -> Arch | None:
    for target in family_targets():
        if fp == target.fingerprint or fp in target.extra.get("fingerprint_aliases", ()):
            return target
    return None


def _decode_registered(fp: int, where: str) -> dict[str, Any]:
    """decode_fingerprint for the families AMD's factory knows by registered targets only."""
    family_code = fp >> 56
    name = FAMILY_CODES.get(family_code)
    if name is None:
        known = ", ".join(f"0x{c:02X} {n}" for c, n in sorted(FAMILY_CODES.items()))
        raise ArchError(f"{where}: family field (bits 63:56) = 0x{family_code:02X} is no DPU family (known: {known})")
    fam = families()[name]
    if fam.fingerprint != "registered":
        raise ArchError(f"{where}: family field (bits 63:56) = 0x{family_code:02X} ({name}); tvm-dpu decodes no "
                        f"{name} fingerprint yet ({fam.missing}); it compiles for {_compiled_families()}")
    target = _registered_target(fp)
    if target is None:
        known = ", ".join(f"{t.dpu_name} 0x{t.fingerprint:016X}" for t in family_targets()
                          if t.family == name)
        raise ArchError(f"{where}: family field (bits 63:56) = 0x{family_code:02X} ({name}); AMD's target factory "
                        f"knows {name} by its registered targets only, and this is none of them (known: {known}); "
                        f"tvm-dpu compiles for {_compiled_families()}")
    return {"fingerprint": target.fingerprint, "family_code": family_code, "family": name, "isa": target.isa,
            "feature_code": fp & _FEATURE_MASK, "target": target.dpu_name, "instruction_set": target.instruction_set}


def _compiled_families() -> str:
    """The families tvm-dpu generates code for, as the messages name them: "0x01 DPUCZDX8G, 0x02 DPUCAHX8H"."""
    return ", ".join(f"0x{f.code:02X} {f.name}" for f in families().values() if f.compile)


def _activations(fields: dict[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(CONV, ALU-or-depthwise) activation lists as the target factory builds them from the flags."""
    conv = ["relu"] + (["leaky_relu"] if fields["conv_leaky"] else [])
    if fields["isa"] == 1:
        conv.append("relu6")
        alu = ["relu"] + (["leaky_relu"] if fields["dw_leaky"] else []) + ["relu6"]
    else:
        conv += ["relu6"] if fields["conv_relu6"] else []
        alu = [] if fields["dwconv_pp"] == 0 else ["relu"] + (["relu6"] if fields["dwconv_relu6"] else [])
    return tuple(conv), tuple(alu)


def _check_codegen_supports(fields: dict[str, Any], fp: int) -> None:
    """Refuse, at decode, a fingerprint whose configuration the code generator cannot honour, rather than fail at
    compile (a KeyError) or emit programs the emulator refuses or that compute wrong results. Found by compiling
    and verifying a model on ISA1 combinations of these fields (tests/test_arch_support.py)."""
    where = f"fingerprint 0x{fp:016X}"
    if fields["isa"] == 1 and fields["img_bank_groups"] < 2:
        raise ArchError(f"{where}: {fields['img_bank_groups']} image bank group(s) (bits 25:24); tvm-dpu's code "
                        "generator double-buffers feature maps across two image bank groups and needs at least 2")
    if fields["isa"] == 1 and not 1 <= fields["alu_pp"] <= fields["pp"]:
        raise ArchError(f"{where}: ALU pixel parallelism {fields['alu_pp']} (bits 11:8) is above the DPU's pixel "
                        f"parallelism {fields['pp']}: ALU instructions address at most PP pixel rows")


def arch_from_fingerprint(fp: int | str) -> Arch:
    """The `Arch` a fingerprint describes: the DPU preset with that fingerprint if there is one, else a core
    named like the target factory does (DPUCZDX8G_ISA1_B4096_0101000016010407) with the bare-preset board
    defaults (clock, cores, DDR)."""
    fields = decode_fingerprint(fp)
    if "target" in fields:
        return _family_targets()[fields["target"]]
    canonical = fields["fingerprint"]
    presets = dpu_presets()
    for preset in presets:
        if preset.fingerprint == canonical:
            return preset
    _check_codegen_supports(fields, canonical)
    conv_acts, alu_acts = _activations(fields)
    template = presets[0]
    return Arch(
        name=f"{fields['family']}_ISA{fields['isa']}_{fields['arch_name']}_{canonical:016X}",
        family=fields["family"],
        isa=fields["isa"],
        arch_index=fields["arch_index"],
        pp=fields["pp"],
        icp=fields["icp"],
        ocp=fields["ocp"],
        alu_pp=fields["alu_pp"],
        bank_depth=template.bank_depth,
        img_bank_groups=fields["img_bank_groups"],
        channel_augmentation=fields["channel_augmentation"],
        conv_leaky=fields["conv_leaky"],
        dw_leaky=fields["dw_leaky"],
        save_argmax=fields["save_argmax"],
        conv_activations=conv_acts,
        alu_activations=alu_acts,
        elew_activations=("relu",),
        freq_mhz=template.freq_mhz,
        cores=template.cores,
        ddr_bytes_per_s=template.ddr_bytes_per_s,
        fp_other_bits=fields["other_bits"],
    )


def encode_fingerprint(arch: Arch) -> int:
    """The fingerprint of `arch` (DPUCZDX8G: family 0x01 and its fields; a registered target's family: type, ISA
    version and its whole feature code); ArchError if a field cannot be encoded."""
    fam = families().get(arch.family)
    if fam is None or fam.fingerprint == "none":
        coded = ", ".join(f.name for f in families().values() if f.fingerprint != "none")
        raise ArchError(f"{arch.name}: family {arch.family!r} cannot be encoded; tvm-dpu encodes {coded}")
    if fam.fingerprint == "registered":
        if not 0 <= arch.isa <= 0xFF or arch.fp_other_bits & ~_FEATURE_MASK:
            raise ArchError(f"{arch.name}: ISA {arch.isa} / feature code 0x{arch.fp_other_bits:X} do not fit")
        return (fam.code << 56) | (arch.isa << 48) | arch.fp_other_bits
    family_code = fam.code
    if arch.isa not in SUPPORTED_ISAS:
        raise ArchError(f"{arch.name}: ISA {arch.isa} cannot be encoded; {SUPPORTED_FAMILY} has ISA 0 and ISA 1")
    core = _arch_table().get(arch.arch_index)
    if core is None or (core.pp, core.icp, core.ocp) != (arch.pp, arch.icp, arch.ocp):
        raise ArchError(
            f"{arch.name}: arch_index {arch.arch_index} with PP {arch.pp}, ICP {arch.icp}, OCP {arch.ocp} "
            "is not an entry of the DPUCZDX8G ARCH table"
        )
    for field_name, value, limit in (("alu_pp", arch.alu_pp, 15), ("img_bank_groups", arch.img_bank_groups, 3)):
        if not 0 <= value <= limit:
            raise ArchError(f"{arch.name}: {field_name} {value} does not fit its fingerprint field [0,{limit}]")
    if arch.isa == 0 and (arch.dw_leaky or arch.save_argmax):
        raise ArchError(f"{arch.name}: ISA0 has no depthwise LeakyReLU or SAVE argmax (bits 29/30 mean other things)")
    if arch.fp_other_bits & ~(_FEATURE_MASK & ~_ARCH_FIELD_MASK[arch.isa]):
        raise ArchError(f"{arch.name}: fp_other_bits 0x{arch.fp_other_bits:X} overlap the fields or exceed 48 bits")
    fp = (family_code << 56) | (arch.isa << 48) | arch.arch_index | (arch.alu_pp << 8)
    fp |= (arch.img_bank_groups << 24) | (int(arch.channel_augmentation) << 26) | (int(arch.conv_leaky) << 28)
    if arch.isa == 1:
        fp |= (int(arch.dw_leaky) << 29) | (int(arch.save_argmax) << 30)
    return fp | arch.fp_other_bits
