"""ISA1 conformance: the emulator against AMD sim-runner outputs, the encoder against sim-runner's assembler.

Vectors: tests/data/isa1_conformance (a copy of the project's shared/conformance/isa1, produced with AMD's ISA1
simulator; format and provenance in its README.md).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.asm import assemble
from tvm_dpu.codegen.isa import Instr, decode, encode, encode_program, mask_from_str
from tvm_dpu.emulator.core import Emulator

CONF_DIR = Path(__file__).resolve().parent / "data" / "isa1_conformance"

CASES = json.loads((CONF_DIR / "cases.json").read_text())
ENCODINGS = json.loads((CONF_DIR / "encoding.json").read_text())


def arch_from_case(arch_json: str) -> Arch:
    """An Arch built from a case's arch JSON (name, pp, icp, ocp, alu_pp, bank_depth, img_bank_groups, fingerprint)."""
    a = json.loads(arch_json)
    fp = int(a["fingerprint"], 16)
    return Arch(name=a["name"], family="DPUCZDX8G", isa=(fp >> 48) & 0xFF, arch_index=fp & 0xF, pp=a["pp"],
                icp=a["icp"], ocp=a["ocp"], alu_pp=a["alu_pp"], bank_depth=a["bank_depth"],
                img_bank_groups=a["img_bank_groups"])


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_case(case):
    data = np.load(CONF_DIR / f"{case['name']}.npz")
    arch = arch_from_case(str(data["arch"]))
    assert arch.name == case["arch"]
    code = data["code"]
    # The listing is the same program in text form: our assembler must produce the same words.
    assert np.array_equal(encode_program(assemble(str(data["listing"]))), code)
    regions = {r: data[f"reg{r}_in"].copy() for r in case["regs_in"]}
    stats = Emulator(arch).run(code, regions)
    assert stats.ended
    problems = []
    for r in case["regs_out"]:
        want = data[f"reg{r}_out"]
        got = regions[r]
        assert got.shape == want.shape
        diff = np.flatnonzero(got != want)
        if diff.size:
            firsts = ", ".join(f"@{o}: got {got[o]} want {want[o]}" for o in diff[:8])
            problems.append(f"reg{r}: {diff.size} of {want.size} bytes differ (first: {firsts})")
    assert not problems, f"{case['name']} ({case['description']}):\n" + "\n".join(problems)


@pytest.mark.parametrize("vec", ENCODINGS, ids=[f"{v['instr']}-{i}" for i, v in enumerate(ENCODINGS)])
def test_encoding(vec):
    ins = Instr(vec["instr"], dict(vec["fields"]), mask_from_str(vec["dpdon"]), mask_from_str(vec["dpdby"]))
    assert encode(ins) == vec["words"]
    back, n = decode(vec["words"])
    assert n == len(vec["words"])
    assert back == ins


@pytest.mark.parametrize("name", sorted({c["arch"] for c in CASES}))
def test_presets_agree_with_case_arch(name):
    """The project's presets (tvm_dpu.arch.load_arch, by name and by fingerprint) describe the same hardware."""
    from tvm_dpu import arch as arch_mod
    case = next(c for c in CASES if c["arch"] == name)
    arch_json = str(np.load(CONF_DIR / f"{case['name']}.npz")["arch"])
    ref = arch_from_case(arch_json)
    for spec in (name, json.loads(arch_json)["fingerprint"]):
        got = arch_mod.load_arch(spec)
        assert (got.pp, got.icp, got.ocp, got.alu_pp, got.bank_depth, got.img_bank_groups) == \
            (ref.pp, ref.icp, ref.ocp, ref.alu_pp, ref.bank_depth, ref.img_bank_groups), spec
        assert got.bank_groups == ref.bank_groups
