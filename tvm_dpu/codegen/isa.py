"""DPU instruction encoding and decoding, generated from one field table per instruction set.

One encoder/decoder serves every instruction set; each set is data, a field table in this package (`ISA_FILES`):
"DPUV2" (DPUCZDX8G ISA1, isa_fields.json, a transcription of the VART simulator's `dpuv2.xml`,
isa1-semantics.md 1.2-1.4) and "DPUV3E" (DPUCAHX8H ISA2, isa_fields_dpuv3e.json, from the simulator's
`dpuv3e.xml`). Every function takes `isa=` and defaults to DPUV2, the set the code generator and emulator implement.
Field values in an `Instr` are always the TRUE values: a `minus` field holding 8 means 8 items and is stored as 7.
Words are uint32, word 0 of an instruction first; opcode is bits [31:28] of word 0, dpdon [27:24], dpdby [23:20]
(the same header in every table; a table with another header is refused).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from types import MappingProxyType
from typing import Iterable, Iterator, Mapping, Sequence

import numpy as np

from tvm_dpu.errors import ISAError

#: Engine (dependency category) bits of dpdon / dpdby: bit i = category i (isa1-semantics.md 10).
LOAD = 1
SAVE = 2
CONV = 4
MISC = 8
ENGINE_BITS: dict[str, int] = {"load": LOAD, "save": SAVE, "conv": CONV, "misc": MISC}


@dataclass(frozen=True)
class FieldSpec:
    """One bit field of an instruction: `len` bits at bit `pos` of word `word`; `minus` stores value - 1."""

    name: str
    word: int
    pos: int
    len: int
    minus: bool

    @property
    def min_value(self) -> int:
        return 1 if self.minus else 0

    @property
    def max_value(self) -> int:
        return (1 << self.len) if self.minus else (1 << self.len) - 1


@dataclass(frozen=True)
class InstrSpec:
    """Layout of one instruction type."""

    name: str
    opcode: int
    words: int
    category: str  # load / save / conv / misc
    fields: tuple[FieldSpec, ...]

    @property
    def field_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    @property
    def engine(self) -> int:
        """Engine bit (LOAD/SAVE/CONV/MISC) of this instruction's category."""
        return ENGINE_BITS[self.category]


@dataclass(eq=False)
class Instr:
    """One instruction: its upper-case name, true field values and the dpdon/dpdby engine masks."""

    name: str
    fields: dict[str, int] = field(default_factory=dict)
    dpdon: int = 0
    dpdby: int = 0

    def __getitem__(self, key: str) -> int:
        return self.fields[key]

    def __eq__(self, other: object) -> bool:
        # by value, so that a shared (read-only) instruction equals the same one decoded afresh
        if not isinstance(other, Instr):
            return NotImplemented
        return (self.name, self.fields, self.dpdon, self.dpdby) == (other.name, other.fields, other.dpdon,
                                                                    other.dpdby)

    __hash__ = None  # mutable


class _ReadOnlyFields(dict):
    """The fields of a shared instruction: a dict (reads at dict speed, equal to a plain dict) that refuses
    changes."""

    def _refuse(self, *args, **kwargs):
        raise ISAError("a shared decoded instruction is read-only (decode without shared=True to change it)")

    __setitem__ = __delitem__ = update = pop = popitem = setdefault = clear = __ior__ = _refuse

    def __reduce__(self):  # unpickling fills a dict through __setitem__ otherwise
        return _ReadOnlyFields, (dict(self),)


class _SharedInstr(Instr):
    """An Instr that iter_program(shared=True) hands to every program holding its words: read-only."""

    def __setattr__(self, name: str, value: object) -> None:
        raise ISAError(f"{self.name}: a shared decoded instruction is read-only (decode without shared=True to "
                       "change it)")

    __delattr__ = __setattr__


def _read_only(ins: Instr) -> _SharedInstr:
    out = object.__new__(_SharedInstr)
    for name, value in (("name", ins.name), ("fields", _ReadOnlyFields(ins.fields)), ("dpdon", ins.dpdon),
                        ("dpdby", ins.dpdby)):
        object.__setattr__(out, name, value)
    return out


#: Instruction set name -> its field table in this package. The name is the table's own "isa" key.
ISA_FILES: Mapping[str, str] = MappingProxyType({"DPUV2": "isa_fields.json", "DPUV3E": "isa_fields_dpuv3e.json"})
DEFAULT_ISA = "DPUV2"
#: The header every table must have (bit position, width): encode and decode place these fields directly.
_HEADER = {"opcode": [28, 4], "dpdon": [24, 4], "dpdby": [20, 4]}


@lru_cache(maxsize=None)
def _doc(isa: str = DEFAULT_ISA) -> dict:
    try:
        fname = ISA_FILES[isa]
    except KeyError:
        raise ISAError(f"unknown instruction set {isa!r} (known: {', '.join(ISA_FILES)})") from None
    doc = json.loads(resources.files("tvm_dpu.codegen").joinpath(fname).read_text())
    if doc.get("isa") != isa or doc.get("header") != _HEADER:
        raise ISAError(f"{fname}: expected instruction set {isa!r} with header {_HEADER}, got {doc.get('isa')!r} "
                       f"with {doc.get('header')}")
    return doc


@lru_cache(maxsize=None)
def enum_codes(kind: str) -> Mapping[str, int]:
    """name -> code of the ISA enumeration `kind` ("act_type", "elew_type", "alu_exec_mode", "pool_type"), as
    isa_fields.json lists it; read-only. ISAError for an unknown enumeration."""
    enums = {k: v for k, v in _doc()["enums"].items() if not k.startswith("_")}
    if kind not in enums:
        raise ISAError(f"unknown ISA enumeration {kind!r} (known: {', '.join(enums)})")
    return MappingProxyType({name: int(code) for name, code in enums[kind].items()})


def enum_code(kind: str, name: str) -> int:
    """The code of `name` in the ISA enumeration `kind`; ISAError naming the known names if it has none."""
    codes = enum_codes(kind)
    try:
        return codes[name]
    except KeyError:
        raise ISAError(f"{kind} {name!r} is not an ISA1 {kind} (known: {', '.join(codes)})") from None


def enum_name(kind: str, code: int) -> str:
    """The name of `code` in the ISA enumeration `kind`; ISAError if no name has that code."""
    for name, c in enum_codes(kind).items():
        if c == code:
            return name
    raise ISAError(f"{kind} {code} is not an ISA1 {kind} code (known: {dict(enum_codes(kind))})")


@lru_cache(maxsize=None)
def _table(isa: str = DEFAULT_ISA) -> tuple[dict[str, InstrSpec], dict[int, InstrSpec]]:
    doc = _doc(isa)
    by_name: dict[str, InstrSpec] = {}
    by_opcode: dict[int, InstrSpec] = {}
    for ins in doc["instructions"]:
        spec = InstrSpec(
            name=ins["name"],
            opcode=int(ins["opcode"]),
            words=int(ins["words"]),
            category=ins["category"],
            fields=tuple(FieldSpec(f["name"], int(f["word"]), int(f["pos"]), int(f["len"]), bool(f["minus"]))
                         for f in ins["fields"]),
        )
        by_name[spec.name] = spec
        by_opcode[spec.opcode] = spec
    return by_name, by_opcode


def instr_specs(isa: str = DEFAULT_ISA) -> dict[str, InstrSpec]:
    """All instruction layouts of instruction set `isa` by upper-case name (LOAD, SAVE, CONVINIT, ..., END)."""
    return dict(_table(isa)[0])


def instr_spec(name: str, isa: str = DEFAULT_ISA) -> InstrSpec:
    """Layout of instruction `name` of instruction set `isa`; ISAError if unknown."""
    try:
        return _table(isa)[0][name]
    except KeyError:
        raise ISAError(f"unknown instruction {name!r} in {isa} (known: {', '.join(_table(isa)[0])})") from None


def engine_mask(*names: str) -> int:
    """4-bit dependency mask from engine names, e.g. engine_mask("load", "conv") == 5."""
    m = 0
    for n in names:
        try:
            m |= ENGINE_BITS[n.lower()]
        except KeyError:
            raise ISAError(f"unknown engine {n!r} (known: load, save, conv, misc)") from None
    return m


def engine_names(mask: int) -> tuple[str, ...]:
    """Engine names set in a 4-bit dependency mask, in bit order."""
    if not 0 <= mask <= 15:
        raise ISAError(f"dependency mask {mask} outside 0..15")
    return tuple(n for n, b in ENGINE_BITS.items() if mask & b)


def mask_to_str(mask: int) -> str:
    """The AC-text form of a mask: 4 binary digits, leftmost = bit 3 (MISC)."""
    if not 0 <= mask <= 15:
        raise ISAError(f"dependency mask {mask} outside 0..15")
    return format(mask, "04b")


def mask_from_str(s: str) -> int:
    """Parse a 4-digit binary dependency string such as '0101'."""
    if len(s) != 4 or any(ch not in "01" for ch in s):
        raise ISAError(f"dependency mask {s!r} is not 4 binary digits")
    return int(s, 2)


#: Per instruction set, per instruction name: (spec, field names, [(name, word, pos, mask, lo, hi, minus)]), built
#: on first use so encoding a long program does not walk the field objects again for every instruction.
_ENCODERS: dict[str, dict[str, tuple]] = {isa: {} for isa in ISA_FILES}


def _encoder(name: str, isa: str = DEFAULT_ISA) -> tuple:
    encoders = _ENCODERS.get(isa)
    enc = None if encoders is None else encoders.get(name)
    if enc is None:
        spec = instr_spec(name, isa)  # raises for an unknown set or name
        enc = _ENCODERS[isa][name] = (spec, frozenset(spec.field_names), [
            (f.name, f.word, f.pos, (1 << f.len) - 1, f.min_value, f.max_value, f.minus) for f in spec.fields])
    return enc


def encode(instr: Instr, isa: str = DEFAULT_ISA) -> list[int]:
    """Machine words of one instruction of instruction set `isa`. ISAError names the instruction and field on any
    bad value."""
    spec, names, fields = _encoder(instr.name, isa)
    values = instr.fields
    if len(values) != len(names) or not names.issuperset(values):
        unknown = set(values) - names
        if unknown:
            raise ISAError(f"{instr.name}: unknown field(s) {', '.join(sorted(unknown))}")
    for dep_name, dep in (("dpdon", instr.dpdon), ("dpdby", instr.dpdby)):
        if not isinstance(dep, (int, np.integer)) or not 0 <= int(dep) <= 15:
            raise ISAError(f"{instr.name}: {dep_name}={dep!r} outside 0..15")
    words = [0] * spec.words
    words[0] = (spec.opcode << 28) | (int(instr.dpdon) << 24) | (int(instr.dpdby) << 20)
    for fname, word, pos, mask, lo, hi, minus in fields:
        try:
            v = values[fname]
        except KeyError:
            raise ISAError(f"{instr.name}: missing field {fname}") from None
        if v.__class__ is not int:
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise ISAError(f"{instr.name}: field {fname}={v!r} is not an integer")
            v = int(v)
        if not lo <= v <= hi:
            raise ISAError(f"{instr.name}: field {fname}={v} outside {lo}..{hi}" + (" (minus field)" if minus else ""))
        words[word] |= ((v - 1 if minus else v) & mask) << pos
    return words


def decode(words: Sequence[int], pos: int = 0, isa: str = DEFAULT_ISA) -> tuple[Instr, int]:
    """Decode the instruction of instruction set `isa` starting at word `pos`; returns (Instr, number of words)."""
    if pos >= len(words):
        raise ISAError(f"word {pos}: no instruction (stream has {len(words)} words)")
    w0 = int(words[pos])
    opcode = (w0 >> 28) & 0xF
    spec = _table(isa)[1].get(opcode)
    if spec is None:
        raise ISAError(f"word {pos}: unknown opcode 0x{opcode:X} (word 0x{w0:08X}) in {isa}")
    if pos + spec.words > len(words):
        raise ISAError(f"word {pos}: truncated {spec.name} (needs {spec.words} words, "
                       f"{len(words) - pos} left)")
    ws = [int(words[pos + i]) for i in range(spec.words)]
    fields = {}
    for f in spec.fields:
        v = (ws[f.word] >> f.pos) & ((1 << f.len) - 1)
        fields[f.name] = v + 1 if f.minus else v
    return Instr(spec.name, fields, (w0 >> 24) & 0xF, (w0 >> 20) & 0xF), spec.words


def encode_program(instrs: Iterable[Instr], isa: str = DEFAULT_ISA) -> np.ndarray:
    """Concatenated machine words (uint32) of a program; ISAError names the instruction index."""
    out: list[int] = []
    for i, ins in enumerate(instrs):
        try:
            out.extend(encode(ins, isa))
        except ISAError as e:
            raise ISAError(f"instruction {i}: {e}") from None
    return np.asarray(out, dtype=np.uint32)


def iter_program(code: Sequence[int] | np.ndarray, shared: bool = False,
                 isa: str = DEFAULT_ISA) -> Iterator[tuple[int, Instr]]:
    """Yield (word offset, Instr) for every instruction of a machine-code stream of instruction set `isa` (errors
    name the word offset).
    `shared`: each distinct instruction is decoded once per process and the same read-only Instr (ISAError on a
    change) is yielded wherever its words recur, in this program or another: for readers that never change one
    (codegen.relocate reads the same instructions over and over)."""
    words = np.asarray(code, dtype=np.uint32).ravel().tolist()
    pos = 0
    while pos < len(words):
        ins, n = _decode_shared(words, pos, isa) if shared else decode(words, pos, isa)
        yield pos, ins
        pos += n


def decode_program(code: Sequence[int] | np.ndarray, isa: str = DEFAULT_ISA) -> list[Instr]:
    """Decode a whole machine-code stream of instruction set `isa` (errors name the word offset)."""
    return [ins for _, ins in iter_program(code, isa=isa)]


#: Per instruction set, read-only decoded instructions by their words, for iter_program(shared=True) (bounded; a
#: dict read is thread-safe, a race between two writers only decodes twice).
_SHARED: dict[str, dict[tuple[int, ...], _SharedInstr]] = {isa: {} for isa in ISA_FILES}
_SHARED_MAX = 1 << 16


def _decode_shared(words: list[int], pos: int, isa: str = DEFAULT_ISA) -> tuple[Instr, int]:
    spec = _table(isa)[1].get((words[pos] >> 28) & 0xF)  # raises for an unknown set
    cache = _SHARED[isa]
    if spec is not None:
        # a truncated tail is a shorter tuple, never a key: the opcode fixes the length of every stored one
        ins = cache.get(tuple(words[pos:pos + spec.words]))
        if ins is not None:
            return ins, spec.words
    ins, n = decode(words, pos, isa)  # raises on a bad or truncated instruction
    if len(cache) >= _SHARED_MAX:
        cache.clear()
    shared = cache[tuple(words[pos:pos + n])] = _read_only(ins)
    return shared, n


@lru_cache(maxsize=None)
def _defaults(name: str, isa: str = DEFAULT_ISA) -> dict[str, int]:
    return {f.name: f.min_value for f in instr_spec(name, isa).fields}


def make_instr(name: str, dpdon: int = 0, dpdby: int = 0, isa: str = DEFAULT_ISA, **fields: int) -> Instr:
    """Build an Instr of instruction set `isa` with every field defaulted to its minimum (0, or 1 for minus fields),
    overridden by `fields`."""
    defaults = _defaults(name, isa)  # the code generator builds ~10^5 instructions per network: no per-call table walk
    if not defaults.keys() >= fields.keys():
        unknown = [k for k in fields if k not in defaults]
        raise ISAError(f"{name}: unknown field(s) {', '.join(sorted(unknown))}")
    vals = dict(defaults)
    vals.update(fields)
    for k, v in fields.items():
        if type(v) is not int:
            vals[k] = int(v)  # numpy integers become ints
    return Instr(name, vals, dpdon, dpdby)


#: make_encoded's results by (name, the caller's field names, their values): a network's code builds the same field
#: sets over and over (ResNet-50: 31k distinct among 104k instructions). Bounded; a dict read is thread-safe, a race
#: between two writers only builds twice.
_BUILT: dict[tuple, tuple[str, Mapping[str, int], tuple[int, ...] | None]] = {}
_BUILT_MAX = 1 << 16  # about 1.1 KB an entry


def make_encoded(name: str, fields: Mapping[str, object], isa: str = DEFAULT_ISA
                 ) -> tuple[Instr, tuple[int, ...] | None]:
    """make_instr(name, **fields) and its machine words with dpdon = dpdby = 0 (None if a field is out of range:
    encode raises for it). The Instr is new, its masks the caller's to set; its fields are read-only (ISAError on
    a change, which would leave the words stale) and shared with every instruction built from the same fields.
    Raises as make_instr does."""
    key = (isa, name, tuple(fields), tuple(fields.values()))
    try:
        hit = _BUILT.get(key)
    except TypeError:  # an unhashable value: make_instr names it
        hit, key = None, None
    if hit is None:
        hit = _build(name, fields, isa)
        if key is not None:
            if len(_BUILT) >= _BUILT_MAX:
                _BUILT.clear()
            _BUILT[key] = hit
    return Instr(hit[0], hit[1]), hit[2]


def _build(name: str, fields: Mapping[str, object], isa: str = DEFAULT_ISA
           ) -> tuple[str, Mapping[str, int], tuple[int, ...] | None]:
    """make_encoded without its cache: make_instr's values and encode's words in one pass over the fields."""
    vals = make_instr(name, isa=isa, **fields).fields
    spec, _, layout = _encoder(name, isa)
    words = [0] * spec.words
    words[0] = spec.opcode << 28
    for fname, word, pos, mask, lo, hi, minus in layout:
        v = vals[fname]
        if not lo <= v <= hi:
            return name, _ReadOnlyFields(vals), None
        words[word] |= ((v - 1 if minus else v) & mask) << pos
    return name, _ReadOnlyFields(vals), tuple(words)

