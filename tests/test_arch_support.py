"""Fingerprints whose configuration the code generator cannot honour are refused when decoded into an Arch, and
every configuration it accepts compiles programs that are bit-exact on the emulator (sampled by default, swept
with -m slow)."""
from __future__ import annotations

import itertools
import warnings

import pytest

import tvm_dpu
from tvm_dpu import zoo
from tvm_dpu.arch import load_arch
from tvm_dpu.arch.arch import _arch_table
from tvm_dpu.errors import ArchError


def _fp(index: int, alu_pp: int, bank_groups: int, augmentation: int = 1) -> int:
    return (1 << 56) | (1 << 48) | index | (alu_pp << 8) | (bank_groups << 24) | (augmentation << 26) | (1 << 28) \
        | (1 << 30)


@pytest.mark.parametrize("fp, message", [
    (_fp(7, 4, 1), r"1 image bank group\(s\).*needs at least 2"),
    (_fp(0, 8, 2), "ALU pixel parallelism 8 .* above the DPU's pixel parallelism 4"),
    (_fp(7, 15, 2), "ALU pixel parallelism 15"),
])
def test_unsupported_configurations_are_refused_at_decode(fp, message):
    with pytest.raises(ArchError, match=message):
        load_arch(fp)


def _bit_exact(fp: int) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = tvm_dpu.build(zoo.build_model("mixed_cnn", reduced=True), arch=fp, progress=False)
    m.set_verify(True)
    m.run(zoo.random_input("mixed_cnn", reduced=True))
    return all(r.mismatches == 0 for r in m.verify_results())


@pytest.mark.parametrize("fp", [_fp(0, 4, 3), _fp(7, 8, 3), _fp(4, 1, 2, 0)])
def test_accepted_non_preset_configurations_are_bit_exact(fp):
    assert _bit_exact(fp)


@pytest.mark.slow
def test_every_accepted_isa1_configuration_is_bit_exact():
    table = _arch_table()
    for index, alu_pp, groups, aug in itertools.product(sorted(table), (1, 2, 3, 4, 5, 8, 15), (1, 2, 3), (0, 1)):
        fp = _fp(index, alu_pp, groups, aug)
        try:
            load_arch(fp)
        except ArchError:
            assert groups < 2 or alu_pp > table[index].pp
            continue
        assert _bit_exact(fp), hex(fp)
