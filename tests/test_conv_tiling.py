"""The per-op CONV emitter's tiling decisions, each bit-exact against the golden reference in the emulator:
flat (raster-order) tiles of pointwise convs, channel augmentation of first-layer convs, and dependency tokens
that let the double-buffered tiles overlap."""
from __future__ import annotations

import numpy as np
import pytest

from tvm_dpu.arch import load_arch
from tvm_dpu.codegen import compiler
from tvm_dpu.codegen.compiler import compile_graph
from tvm_dpu.codegen.conv import ConvJob, augmentation, flat_length, group_swap, input_ring, piece_band
from tvm_dpu.codegen.isa import decode_program
from tvm_dpu.codegen.layout import ceil_div
from tvm_dpu.fusion.select import plan_fusion
from tvm_dpu.timing.simulate import simulate
from test_codegen import ARCHS, _B, _check


def _convs(graph, arch_name):
    code = compile_graph(graph, load_arch(arch_name)).code
    return [i for i in decode_program(code) if i.name == "CONV"]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("h,w,s,cin,cout", [(7, 7, 1, 40, 20), (14, 14, 1, 300, 70), (5, 9, 2, 24, 17),
                                            (9, 13, 2, 16, 33), (3, 1, 1, 8, 8), (28, 28, 1, 64, 130)])
def test_pointwise_flat_tiles_are_bit_exact(arch, h, w, s, cin, cout):
    """Tile rows cross image rows (7x7: 4 rows of 13 pixels, the last one partial), strided inputs, several
    output-channel chunks: the emulator equals the golden reference."""
    b = _B(h * w + s)
    b.conv(b.input(cin, h, w), cout, 1, s)
    _check(b.g, arch)


def test_pointwise_flat_tiles_need_fewer_convs():
    """A 7x7 map on PP 4: one CONV per output-channel group (4 rows x 13 pixels), not two row tiles."""
    b = _B()
    b.conv(b.input(64, 7, 7), 24, 1)
    arch = load_arch("DPUCZDX8G_ISA1_B1152")
    convs = _convs(b.g, arch.name)
    assert len(convs) == 2  # 24 outputs / OCP 12
    assert {c.fields["length"] for c in convs} == {13}
    job = ConvJob("c", 1, 1, 1, 1, (0, 0, 0, 0), 64, 24, 0, 0, 0, 0, 0)
    assert flat_length(arch, job, _fm(7, 7), 2) == 13
    assert flat_length(arch, ConvJob("c", 3, 3, 1, 1, (1, 1, 1, 1), 64, 32, 0, 0, 0, 0, 0), _fm(7, 7), 2) is None


def _fm(h, w):
    from tvm_dpu.types import FMap
    return FMap.dense(0, 0, h, w, 8)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("k,s,p,cin,hw", [(7, 2, 3, 3, 30), (3, 1, 1, 3, 17), (5, 2, 2, 1, 12), (3, 2, 0, 4, 11),
                                          (7, 2, 3, 3, 9), (3, 1, 2, 2, 6)])
def test_channel_augmented_first_layer_is_bit_exact(arch, k, s, p, cin, hw):
    """Edge items masked by pad_start / pad_end / pad_idx, items overlapping in DDR, rows in the padding."""
    b = _B(k * 31 + cin)
    b.conv(b.input(cin, hw, hw + 3), 128, k, s, p)
    _check(b.g, arch)
    loads = [i for i in decode_program(compile_graph(b.g, load_arch(arch)).code) if i.name == "LOAD"]
    assert any(i.fields["channel"] == k * cin for i in loads)  # the augmented items


def test_augmentation_shortens_the_first_layer(monkeypatch):
    """7x7/2 over RGB to 64 channels on B4096: 7 taps of one 21-channel group per column instead of 49 taps of one
    3-channel group; the simulated program is faster."""
    b = _B()
    b.conv(b.input(3, 96, 96), 64, 7, 2, 3)
    arch = load_arch("DPUCZDX8G_ISA1_B4096")
    convs = _convs(b.g, arch.name)
    assert {(c.fields["channel_group"]) for c in convs} == {2}
    from tvm_dpu.timing.params import load_params

    compute_only = load_params(arch).replace(conv_fill_cycles=0)  # the taps alone, without the per-CONV fill
    aug_code = compile_graph(b.g, arch).code
    monkeypatch.setattr(compiler, "input_augmentation", lambda *a: None)
    plain_code = compile_graph(b.g, arch).code
    assert (simulate(plain_code, arch, compute_only).engine_busy["conv"]
            > 3 * simulate(aug_code, arch, compute_only).engine_busy["conv"])  # 49 taps of 1 group -> 7 of 2
    assert simulate(plain_code, arch).cycles > 1.5 * simulate(aug_code, arch).cycles
    assert augmentation(arch, 3, 64, 7, 7, 2, 2, (3, 3, 3, 3), 3) is not None
    assert augmentation(arch, 16, 64, 3, 3, 1, 1, (1, 1, 1, 1), 16) is None  # no shorter CONV
    assert augmentation(arch, 3, 64, 7, 7, 2, 2, (3, 3, 3, 3), 4) is None  # pixels not dense in DDR
    # one output group: the CONVs would wait for the item-by-item LOADs
    assert augmentation(arch, 3, 16, 7, 7, 2, 2, (3, 3, 3, 3), 3) is None


def test_double_buffered_tiles_overlap():
    """The LOADs of tile t+1 wait only for the CONVs of tile t-1 (the buffer half they overwrite): the CONV
    engine is idle between tiles of a compute-bound conv at most once after the pipeline is full. (Once: where the
    CONVs of tile t+1 need a token from the SAVEs of tile t-1 that no chain covers, the token comes from tile t's
    first SAVE, because no counter may hold two tokens along program order: docs/dependency-protocol.md.)"""
    b = _B()
    b.conv(b.input(64, 32, 64), 64, 3, 1, 1)
    arch = load_arch("DPUCZDX8G_ISA1_B4096")
    cs = compile_graph(b.g, arch)
    r = simulate(cs.code, arch)
    conv = [i for i, n in enumerate(r.names) if n == "CONV"]
    gaps = np.array(r.start[conv[1:]]) - np.array(r.end[conv[:-1]])
    steady = gaps[len(gaps) // 4:]
    assert np.count_nonzero(steady >= 1.0) <= 1 and np.count_nonzero(steady < 1.0) >= len(steady) - 1 >= 8


# (arch, cin, h, w, k, s, p, cout): ring tiles (30 outputs), then group-swap tiles (64 outputs; the last a
# channel-augmented first layer, whose output rows bound its lines)
_WIDE_CASES = [("DPUCZDX8G_ISA1_B4096", 300, 10, 30, 3, 1, 1, 30), ("DPUCZDX8G_ISA1_B4096", 200, 9, 70, 3, 2, 1, 30),
               ("DPUCZDX8G_ISA1_B4096", 200, 9, 40, 3, 2, 1, 30), ("DPUCZDX8G_ISA1_B1152", 300, 10, 45, 3, 1, 1, 30),
               ("DPUCZDX8G_ISA1_B1152", 200, 9, 70, 3, 2, 1, 30), ("DPUCZDX8G_ISA1_B1152", 516, 6, 20, 3, 1, 1, 30),
               ("DPUCZDX8G_ISA1_B1152", 64, 8, 200, 3, 1, 1, 30),
               ("DPUCZDX8G_ISA1_B1152", 516, 14, 14, 3, 1, 1, 64), ("DPUCZDX8G_ISA1_B1152", 200, 9, 70, 3, 2, 1, 64),
               ("DPUCZDX8G_ISA1_B4096", 200, 9, 70, 3, 2, 1, 64), ("DPUCZDX8G_ISA1_B1152", 3, 9, 224, 3, 1, 1, 64)]


@pytest.mark.parametrize("arch,cin,h,w,k,s,p,cout", _WIDE_CASES)
def test_ring_and_swapped_tiles_are_bit_exact(arch, cin, h, w, k, s, p, cout):
    """Wide inputs whose line is bounded by the bank depth: the second tile of each pair starts on another bank
    of VB0 (InputRing) or reads VB1 and writes VB0 (group_swap), so some CONV's bank_id_in is not VB0's first
    bank; then a pool (ALU, bank halves) and a conv read the result."""
    b = _B(cin + k + cout)
    y = b.conv(b.input(cin, h, w), cout, k, s, p)
    _, c, hy, wy = b.shape(y)
    pooled = b.op("max_pool2d", [y], (1, c, hy // 2, wy // 2), 3, kernel=[2, 2], strides=[2, 2], pads=[0, 0, 0, 0])
    b.conv(pooled, 20, 3, 1, 1)
    _check(b.g, arch)
    first = load_arch(arch).bank_group("VB0").base_id
    convs = _convs(b.g, arch)
    assert any(c.fields["bank_id_in"] != first for c in convs)


def test_input_ring_only_where_it_gives_longer_lines():
    """3x3 stride 1 on PP 4: 6 fetched rows, 3 slot groups per bank for two tiles instead of 4; a 5x5 kernel
    (8 rows: 4 either way) keeps the halves."""
    arch = load_arch("DPUCZDX8G_ISA1_B1152")
    job = lambda k, p: ConvJob("c", k, k, 1, 1, (p,) * 4, 516, 30, 0, 0, 0, 0, 0)  # noqa: E731
    ring, length = input_ring(arch, job(3, 1), 4, 3)
    assert (ring.nk, ring.endl, length) == (6, 682, 13)
    assert input_ring(arch, job(5, 2), 4, 3) is None


def test_group_swap_only_where_it_gives_fewer_column_tiles():
    """VGG-16's conv5 on ZU2 (B1152, 516 input channels, 14 columns): the halves allow lines of 9 output columns,
    the ring 13, the swap 21: one column tile instead of two, so 4 row tiles x 43 groups = 172 CONVs, the last
    row tile (rows 12-13) as four half-row pieces of 7 columns (PieceTile); a 112-column map of 11 channel groups
    gets 60 either way (two column tiles): no swap there."""
    arch = load_arch("DPUCZDX8G_ISA1_B1152")
    job = ConvJob("c", 3, 3, 1, 1, (1,) * 4, 516, 512, 0, 0, 0, 0, 0)
    assert group_swap(arch, job, 4, 2) == 21
    b = _B(1)
    b.conv(b.input(516, 14, 14), 512, 3, 1, 1)
    convs = _convs(b.g, arch.name)
    lengths = [c.fields["length"] for c in convs]
    assert len(convs) == 4 * 43 and lengths.count(14) == 3 * 43 and lengths.count(7) == 43
    b = _B(2)
    b.conv(b.input(128, 8, 112), 24, 3, 1, 1)
    vb0 = arch.bank_group("VB0").base_id
    assert all(c.fields["bank_id_in"] // arch.pp == vb0 // arch.pp for c in _convs(b.g, arch.name))


@pytest.fixture
def recorded(monkeypatch):
    """The program builders the compiler creates from here on (compiler.Program recorded), in order."""
    from tvm_dpu.codegen import program

    progs = []

    class Recording(program.Program):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            progs.append(self)

    monkeypatch.setattr(compiler, "Program", Recording)
    return progs


def _late(p, r) -> list[tuple[int, int]]:
    """(dependency, instruction) pairs of program builder `p` whose dependency (read-after-write, write-after-read,
    write-after-write on any resource or part of it) had not completed when the instruction started in the
    simulated schedule `r`."""
    from tvm_dpu.codegen import program

    last_writer, readers, late = {}, {}, []
    for i, e in enumerate(p.entries):
        reads, writes = p._canonical(program._expand(e.reads)), p._canonical(program._expand(e.writes))
        rel = lambda x: [x] + [x[:n] for n in range(1, len(x))] + [k for k in last_writer if k[:len(x)] == x]  # noqa
        deps = [last_writer[y] for x in reads + writes for y in rel(x) if y in last_writer]
        deps += [d for w in writes for y in rel(w) for d in readers.get(y, [])]
        late += [(d, i) for d in deps if p.entries[d].engine != e.engine and r.done[d] > r.start[i] + 1e-6]
        for x in reads:
            readers.setdefault(x, []).append(i)
        for w in writes:
            last_writer[w], readers[w] = i, []
    return late


def test_swapped_and_pooled_tiles_respect_every_dependency(recorded):
    """The race check below on a block of group-swapped tiles (a 3x3 conv on a wide map), a conv with its pool
    applied before the SAVEs (conv_pool as PoolOnSave), a ring conv and a pointwise conv: no instruction starts
    before one of another engine it depends on (prefixes and parts of a resource overlap) has completed, and the
    dependency checker finds no race in the emulator's bank and DDR accesses."""
    from tvm_dpu.fusion.select import plan_fusion
    from tvm_dpu.runtime.dep_check import check_programs
    from tvm_dpu.types import FusionPlan, Group

    b = _B(7)
    x = b.conv(b.input(200, 12, 72), 40, 3, 2, 1)  # 6 x 36: swapped tiles
    y = b.conv(x, 64, 3, 1, 1)
    _, c, hy, wy = b.shape(y)
    pooled = b.op("max_pool2d", [y], (1, c, hy // 2, wy // 2), 3, kernel=[2, 2], strides=[2, 2], pads=[0, 0, 0, 0])
    z = b.conv(pooled, 64, 3, 1, 1)
    b.conv(z, 24, 1)
    arch = load_arch("DPUCZDX8G_ISA1_B1152")
    base = plan_fusion(b.g, arch, "none")
    groups = [gr for gr in base.groups if gr.ops[0] not in (b.g.ops[1].name, b.g.ops[2].name)]
    plan = FusionPlan("manual", groups[:1] + [Group("conv_pool", (b.g.ops[1].name, b.g.ops[2].name))] + groups[1:])
    assert _check(b.g, arch.name, plan=plan)["ALU"] >= 2
    cs = compiler.compile_graph_fused(b.g, arch, plan)
    r = simulate(cs.code, arch)
    assert not _late([q for q in recorded if q.track][-1], r)
    rep = check_programs(cs, arch=arch)["program"]  # the emulator's bank and DDR accesses: no race
    assert rep.ok and rep.races_checked, (rep.problems[:3], rep.races[:3])


def test_schedule_respects_every_dependency(recorded):
    """Race check of the dependency tokens on a block using every tiling above (augmented first layer, ring
    3x3, flat 1x1, pool, add): in the simulated schedule no instruction starts before an instruction of another
    engine it depends on (read-after-write, write-after-read, write-after-write on a bank half, a parameter slot or
    a DDR tensor) has completed."""
    b = _B(5)
    x = b.conv(b.input(3, 40, 200), 64, 7, 2, 3)  # 20 x 100: a ring 3x3 next
    y = b.conv(x, 64, 3, 1, 1)
    z = b.conv(y, 64, 1)
    b.op("eltwise_add", [x, z], b.shape(z), 3)
    arch = load_arch("DPUCZDX8G_ISA1_B1152")
    cs = compile_graph(b.g, arch)
    assert not _late(recorded[-1], simulate(cs.code, arch))


@pytest.mark.parametrize("even", [False, True])
@pytest.mark.parametrize("n_pix,vpp,length", [(49, 4, 13), (196, 4, 17), (196, 4, 20), (5, 4, 1), (1000, 8, 37)])
def test_raster_tiles_cover_every_pixel_once(even, n_pix, vpp, length):
    """Both policies of the one raster tiler: tiles of at most vpp non-empty rows of at most `length` pixels,
    consecutive in raster order, covering [0, n_pix) once; even tiles differ by at most one pixel per row."""
    from tvm_dpu.codegen.tiling import raster_tiles
    tiles = raster_tiles(n_pix, vpp, length, even)
    rows = [row for t in tiles for row in t.rows]
    assert all(1 <= t.vpp <= vpp and t.length <= length for t in tiles)
    assert all(1 <= cnt <= t.length for t in tiles for _, cnt in t.rows)
    assert [k for k, _ in rows] == [sum(c for _, c in rows[:i]) for i in range(len(rows))]
    assert sum(c for _, c in rows) == n_pix
    if even:
        assert max(t.length for t in tiles) - min(t.length for t in tiles) <= 1
    else:
        assert all(t.length == length for t in tiles)


def test_raster_runs_merge_only_where_ddr_is_contiguous():
    """A tile row crossing image rows is one transfer on a dense map and one per image row on a map with a gap
    between its rows (a column slice of a wider map), each starting at its image row's address."""
    from tvm_dpu.codegen.tiling import RasterTile
    from tvm_dpu.types import FMap
    tile = RasterTile(13, ((5, 13),))
    dense = FMap.dense(0, 0, 7, 7, 8)
    assert tile.runs(0, 7, dense.addr, dense.pixel_pitch) == [(0, dense.addr(0, 5), 13)]
    gapped = FMap(0, 0, 7, 7, 8, 8, 8 * 8)
    assert tile.runs(0, 7, gapped.addr, gapped.pixel_pitch) == [(0, gapped.addr(0, 5), 2), (2, gapped.addr(1, 0), 7),
                                                                 (9, gapped.addr(2, 0), 4)]


def test_augmentation_limit_is_the_hardware_channel_count():
    """One predicate for channel augmentation: items of at most 2*ICP bytes (the fingerprint's LD_AUGM,
    conv_engine.channel_augmentation = 2*ICP; 24 on B1152), only where it shortens the CONVs, and for a padded
    conv only where the LOAD's 5-bit mask fields cover its edge items (the fused path's interior columns need
    none: pads=None)."""
    from tvm_dpu.codegen.tiling import augmentable
    arch = load_arch("DPUCZDX8G_ISA1_B1152")
    assert augmentable(arch, 8, 3, 1)  # 24 bytes: 2 groups per kernel row instead of 3
    assert not augmentable(arch, 16, 3, 1)  # 48 bytes: shorter CONVs, but beyond the hardware's 24
    assert not augmentable(arch, 12, 3, 1)  # 36 bytes: 3 groups either way
    assert augmentable(arch, 3, 7, 2, (3, 3, 3, 3))
    assert not augmentable(arch, 3, 7, 2, (11, 11, 11, 11))  # pad_start 33 > 31
    assert augmentable(arch, 3, 7, 2)  # interior columns only: no masks
    assert augmentation(arch, 16, 64, 3, 3, 1, 1, (1, 1, 1, 1), 16) is None


# (arch, cin, h, w, k, s, p, cout, groups): last row bands of 2 or 1 rows cut into pieces, padded (zeros loaded
# from the conv's zero map) or not, strided, a 5x5 kernel, the halves and the group-swap placements, a grouped
# conv (channel-slice maps: pixel pitch > channels)
_PIECE_CASES = [("DPUCZDX8G_ISA1_B1152", 24, 14, 14, 3, 1, 1, 30, 1), ("DPUCZDX8G_ISA1_B1152", 40, 9, 11, 3, 1, 0, 20, 1),
                ("DPUCZDX8G_ISA1_B1152", 16, 13, 17, 3, 2, 1, 24, 1), ("DPUCZDX8G_ISA1_B4096", 32, 10, 12, 5, 1, 2, 40, 1),
                ("DPUCZDX8G_ISA1_B1152", 300, 6, 30, 3, 1, 1, 30, 1), ("DPUCZDX8G_ISA1_B1152", 48, 10, 10, 3, 1, 1, 48, 2)]


@pytest.mark.parametrize("arch,cin,h,w,k,s,p,cout,groups", _PIECE_CASES)
def test_piece_tiles_are_bit_exact_and_shorter(arch, cin, h, w, k, s, p, cout, groups):
    """A conv whose output rows leave a last band of fewer than half the PP rows: that band runs as PieceTiles
    (CONVINIT stride_h = kh, each tile row its own piece of an output row) and the CONVs of the program add up to
    fewer columns than full-width row tiles would; the emulator equals the golden reference."""
    a = load_arch(arch)
    b = _B(cin + h + k)
    x = b.input(cin, (h - 1) * s + k - 2 * p, (w - 1) * s + k - 2 * p)
    if groups == 1:
        b.conv(x, cout, k, s, p)
    else:
        wt = b.const((cout, cin // groups, k, k), 7)
        b.op("conv2d", [x], (1, cout, h, w), 3, {"weights": wt, "bias": b.const((cout,), 4)},
             strides=[s, s], pads=[p] * 4, groups=groups, act="relu")
    _check(b.g, arch)
    code = decode_program(compile_graph(b.g, a).code)
    inits = [i for i in code if i.name == "CONVINIT"]
    assert any(i.fields["stride_h"] == k != s for i in inits) or (k == s and inits)
    convs = [i for i in code if i.name == "CONV"]
    per_group = ceil_div(cout // groups, a.ocp) * groups
    assert sum(c.fields["length"] for c in convs) < per_group * ceil_div(h, a.pp) * w
    from tvm_dpu.runtime.dep_check import check_programs
    rep = check_programs(compiler.compile_graph_fused(b.g, a, plan_fusion(b.g, a, "none")), arch=a)["program"]
    assert rep.ok and rep.races_checked, (rep.problems[:3], rep.races[:3])


def test_piece_band_only_where_it_saves_conv_columns():
    """Two rows left on PP 4 (14 rows): 4 half rows of 7 in one tile; three rows left (7 rows): no pieces (4 // 3
    = 1); a band whose pieces' windows need zeros and no zero map: none."""
    from tvm_dpu.types import FMap
    arch = load_arch("DPUCZDX8G_ISA1_B1152")
    job = ConvJob("c", 3, 3, 1, 1, (1,) * 4, 64, 64, 0, 0, 0, 0, 0)
    x, y = FMap.dense(0, 0, 14, 14, 64), FMap.dense(0, 0, 14, 14, 64)
    band = piece_band(arch, job, x, y, 4, [(0, 14)], 1024, (0, 0))
    assert [(ln, [pc[0] for pc in t]) for _, ln, t in band] == [(7, [12, 12, 13, 13])]
    y7 = FMap.dense(0, 0, 7, 14, 64)
    assert piece_band(arch, job, x, y7, 4, [(0, 14)], 1024, (0, 0)) is None
    assert piece_band(arch, job, x, y, 4, [(0, 14)], 1024, None) is None
