"""Text form of DPUV2 programs: a disassembly listing and the matching assembler.

One instruction per line, in the AC-text style of the conformance `listing` (true field values):

    <index> @<word offset>  NAME dpdon=XXXX dpdby=XXXX field=value ...

`assemble` accepts lines with or without the "<index> @<offset>" prefix (so a conformance listing assembles
as is); blank lines and text after '#' are ignored.
"""
from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from tvm_dpu.codegen.isa import DEFAULT_ISA, Instr, instr_spec, iter_program, mask_from_str, mask_to_str
from tvm_dpu.errors import ISAError

_PREFIX = re.compile(r"^\s*\d+\s+@\d+\s+")


def format_instr(ins: Instr, isa: str = DEFAULT_ISA) -> str:
    """`NAME dpdon=XXXX dpdby=XXXX field=value ...` with fields in the order of instruction set `isa`'s table."""
    spec = instr_spec(ins.name, isa)
    parts = [ins.name, f"dpdon={mask_to_str(ins.dpdon)}", f"dpdby={mask_to_str(ins.dpdby)}"]
    for f in spec.fields:
        parts.append(f"{f.name}={ins.fields[f.name]}" if f.name in ins.fields else f"{f.name}=?")
    return " ".join(parts)


def disassemble(code_or_instrs: np.ndarray | Sequence[int] | Sequence[Instr], isa: str = DEFAULT_ISA) -> str:
    """Listing of machine code (uint32 words) or of a list of Instr of instruction set `isa`, one line per
    instruction."""
    items = list(code_or_instrs) if not isinstance(code_or_instrs, np.ndarray) else None
    lines = []
    if items is not None and items and isinstance(items[0], Instr):
        off = 0
        for i, ins in enumerate(items):
            lines.append(f"{i:6d} @{off:07d}  {format_instr(ins, isa)}")
            off += instr_spec(ins.name, isa).words
    else:
        for i, (off, ins) in enumerate(iter_program(code_or_instrs, isa=isa)):
            lines.append(f"{i:6d} @{off:07d}  {format_instr(ins, isa)}")
    return "\n".join(lines) + ("\n" if lines else "")


def parse_line(line: str, lineno: int = 1) -> Instr | None:
    """Parse one listing line; None for blank/comment lines. ISAError names the line number."""
    text = line.split("#", 1)[0].strip()
    if not text:
        return None
    text = _PREFIX.sub("", text)
    toks = text.replace(",", " ").replace(";", " ").split()
    name = toks[0].upper()
    try:
        spec = instr_spec(name)
    except ISAError as e:
        raise ISAError(f"line {lineno}: {e}") from None
    fields: dict[str, int] = {}
    dpd: dict[str, int] = {}
    for tok in toks[1:]:
        if "=" not in tok:
            raise ISAError(f"line {lineno}: expected name=value, got {tok!r}")
        key, val = tok.split("=", 1)
        try:
            if key in ("dpdon", "dpdby"):
                dpd[key] = mask_from_str(val)
                continue
            if key in fields:
                raise ISAError(f"field {key} given twice")
            fields[key] = int(val, 0)
        except ValueError as e:
            raise ISAError(f"line {lineno}: {name}: bad value for {key}: {e}") from None
    unknown = set(fields) - set(spec.field_names)
    if unknown:
        raise ISAError(f"line {lineno}: {name}: unknown field(s) {', '.join(sorted(unknown))}")
    missing = [f for f in spec.field_names if f not in fields]
    if missing:
        raise ISAError(f"line {lineno}: {name}: missing field(s) {', '.join(missing)}")
    for f in spec.fields:
        if not f.min_value <= fields[f.name] <= f.max_value:
            raise ISAError(f"line {lineno}: {name}: field {f.name}={fields[f.name]} outside "
                           f"{f.min_value}..{f.max_value}")
    return Instr(name, {f: fields[f] for f in spec.field_names}, dpd.get("dpdon", 0), dpd.get("dpdby", 0))


def assemble(text: str) -> list[Instr]:
    """Parse a listing (as produced by `disassemble`, or the conformance `listing`) into instructions."""
    out = []
    for n, line in enumerate(text.splitlines(), start=1):
        ins = parse_line(line, n)
        if ins is not None:
            out.append(ins)
    return out
