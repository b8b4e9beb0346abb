"""Pools run as bands (codegen.alu._emit_bands): the whole map's rows LOADed once per channel chunk, the passes
reading them in place. Bit-exact, clean under the dependency checker, and each input byte read from DDR once where
per-pass tiles read the rows neighbouring passes share again (YOLOX's SPP pools)."""
from __future__ import annotations

import pytest

from tvm_dpu.arch import load_arch
import tvm_dpu.codegen.alu as alu
from tvm_dpu.codegen.alu import _band_chunk, alu_job
from tvm_dpu.codegen.layout import ParamBlob
from tvm_dpu.runtime.dep_check import check_programs
from tvm_dpu.timing.simulate import simulate_subgraph
from tvm_dpu.types import SINGLE, FMap, FusionPlan, Group
from tvm_dpu.xgraph.validate import validate_graph
from conftest import emulator_vs_golden
from test_codegen import _B

ARCHS = ["DPUCZDX8G_ISA1_B512", "DPUCZDX8G_ISA1_B1152", "DPUCZDX8G_ISA1_B4096"]

CASES = [  # (type, channels, h, w, kernel, stride, pad)
    ("max_pool2d", 128, 13, 13, 13, 1, 6),  # YOLOX-nano's SPP
    ("max_pool2d", 128, 13, 13, 5, 1, 2),
    ("max_pool2d", 40, 11, 9, 3, 2, 1),  # strided, channels not a multiple of ICP
    ("avg_pool2d", 24, 10, 12, 3, 1, 1),
    ("max_pool2d", 16, 30, 7, 9, 1, 4),  # rows over many wraps
]


def _pool(kind: str, c: int, h: int, w: int, k: int, s: int, p: int, seed: int):
    b = _B(seed)
    x = b.input(c, h, w)
    ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    b.g.outputs = [b.op(kind, [x], (1, c, ho, wo), 4, kernel=[k, k], strides=[s, s], pads=[p] * 4)]
    validate_graph(b.g)
    return b.g


@pytest.mark.parametrize("arch_name", ARCHS)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_band_pool_bit_exact_clean_and_reads_once(arch_name, case, monkeypatch):
    """Every case as bands (whatever the re-read gate says): exact, clean, each input byte read once."""
    monkeypatch.setattr(alu, "BAND_MIN_REREAD", 0.0)
    g, arch = _pool(*CASES[case], seed=case), load_arch(arch_name)
    op = g.ops[0]
    _, c, h, w = g.tensors[op.inputs[0]].shape
    _, _, ho, wo = g.tensors[op.outputs[0]].shape
    assert _bands(g, arch) is not None
    result = emulator_vs_golden(g, arch, FusionPlan("none", [Group(SINGLE, (op.name,))]), seed=case)
    assert result.bad == 0
    for label, rep in check_programs(result.compiled, None, arch).items():
        assert rep.ok and rep.races_checked, (label, rep.problems[:3], rep.races[:3])
    stats = simulate_subgraph(result.compiled)
    assert stats.ddr_read_bytes == c * h * w
    assert stats.ddr_write_bytes == c * ho * wo


def _bands(g, arch) -> int | None:
    op = g.ops[0]
    _, c, h, w = g.tensors[op.inputs[0]].shape
    _, _, ho, wo = g.tensors[op.outputs[0]].shape
    return _band_chunk(arch, alu_job(arch, g, op, ParamBlob()), FMap.dense(0, 0, h, w, c), FMap.dense(0, 0, ho, wo, c))


def test_bands_only_where_tiles_reread_the_input():
    """The gate (BAND_MIN_REREAD): SPP's 13x13 pool bands on every arch, its 5x5 one where PP is small (B512's
    tiles read the map 2.8 times over, B4096's 1.8), a 3x3 pool over 26x26 and a 2x2 stride-2 pool (passes share
    no row) keep the tiles."""
    b512, b4096 = load_arch("DPUCZDX8G_ISA1_B512"), load_arch("DPUCZDX8G_ISA1_B4096")
    assert _bands(_pool(*CASES[0], seed=0), b512) and _bands(_pool(*CASES[0], seed=0), b4096)
    assert _bands(_pool(*CASES[1], seed=0), b512) and _bands(_pool(*CASES[1], seed=0), b4096) is None
    assert _bands(_pool("max_pool2d", 64, 26, 26, 3, 1, 1, seed=0), b4096) is None
    assert _bands(_pool("max_pool2d", 32, 12, 12, 2, 2, 0, seed=0), b4096) is None
