"""The dependency checker (timing/depcheck.py) on real programs: the emulator records each instruction's bank rows
and DDR bytes, the checker looks for token problems and races (docs/dependency-protocol.md).

Addresses in a DPU program do not depend on the data, so zero inputs give the same access sets as real ones.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np

from tvm_dpu.arch import load_arch
from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.isa import DEFAULT_ISA, decode_program
from tvm_dpu.security.program_blob import Multicore
from tvm_dpu.emulator import DPUV3E_ISA, DpuV3EEmulator, Emulator
from tvm_dpu.timing.depcheck import DepReport, check
from tvm_dpu.types import CompiledSubgraph


def check_code(code: np.ndarray, arch: Arch | str | int, regions: Mapping[int, np.ndarray],
               races: bool = True) -> DepReport:
    """Check machine code `code` for `arch`; `regions` ({reg_id: uint8 array}, modified) are the DDR it runs on
    when `races` asks for the emulator's access sets (recorded by the DPUCZDX8G and the DPUV3E emulators)."""
    a = load_arch(arch)
    code = np.asarray(code, dtype=np.uint32)
    isa = a.instruction_set
    instrs = decode_program(code, isa)
    if not races:
        return check(instrs, isa=isa)
    if isa == DEFAULT_ISA:
        accesses = Emulator(a).record_accesses(code, dict(regions))
        depth = a.bank_depth
    elif isa == DPUV3E_ISA:
        emu = DpuV3EEmulator(a)
        accesses = emu.record_accesses(code, dict(regions))
        depth = emu.banks.key_depth
    else:
        return check(instrs, isa=isa)
    # The emulator stops at the first END: instructions after it never run on hardware either.
    return check(instrs[:len(accesses)], accesses, bank_depth=depth, isa=isa)


def check_subgraph(sg: CompiledSubgraph, arch: Arch | None = None, races: bool = True) -> DepReport:
    """Check a compiled subgraph's program (fresh regions: parameters copied, the rest zero)."""
    return check_code(sg.code, arch if arch is not None else sg.arch, sg.new_regions(), races)


def check_programs(sg: CompiledSubgraph, multicore: Multicore | None = None, arch: Arch | None = None,
                   races: bool = True) -> dict[str, DepReport]:
    """The subgraph's one-core program and, for a multi-core build, each segment's program: {label: report}."""
    out = {"program": check_subgraph(sg, arch, races)}
    if multicore is not None:
        for k, seg in enumerate(multicore.segments):
            out[f"segment {k}"] = check_subgraph(seg.sg, arch, races)
    return out


def check_artifact(path: str | Path, races: bool = True) -> dict[str, dict[str, DepReport]]:
    """Every DPU program of a .tvmdpu artifact (segments of multi-core builds included): {symbol: {label: report}}.
    Nothing in the artifact is executed but the DPU code, on the emulator."""
    from tvm_dpu.runtime.artifact import programs
    return {sym: check_programs(p.sg, p.multicore, races=races) for sym, p in sorted(programs(path).items())}


def format_reports(reports: dict[str, dict[str, DepReport]]) -> str:
    """One line per program: instructions, own-bit fractions, per-pair posts/waits (depth), races, problems."""
    lines = []
    for sym, per in reports.items():
        for label, rep in per.items():
            pairs = " ".join(f"{k}:{v['posts']}/{v['waits']}({v['depth']})" for k, v in rep.pairs().items())
            verdict = "ok" if rep.ok else f"{len(rep.problems)} problem(s), {len(rep.races)} race(s)"
            lines.append(f"{sym} {label}: {rep.instructions} instructions, own bits {rep.own_on:.0%}/{rep.own_by:.0%}, "
                         f"max cross depth {rep.max_cross_depth()} (run-ahead {rep.max_runahead()}), races {'checked' if rep.races_checked else 'not checked'}"
                         f": {verdict}")
            lines.append(f"  pairs posts/waits(depth): {pairs}")
            lines.extend(f"  {p}" for p in rep.problems[:10])
            lines.extend(f"  {r}" for r in rep.races[:10])
    return "\n".join(lines)
