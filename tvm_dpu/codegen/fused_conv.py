"""What the fused pipelines on the CONV engine share: which convs may be fused, their ConvJob and where their
parameters go (param_slots; the LOADs are conv.load_params), the CONVs of one tile (conv.emit_conv_groups), and
the output tiles (raster order over dense maps, tiling.raster_tiles, or image rows) with their input LOADs.

The pipelines, one module per kernel family (codegen.fused lists which template each emits):

* fused_conv_add: conv2d + eltwise add, the add done by ELEW on the conv's output tile in VB1 before SAVE;
* fused_hconv: convs sharing one input, each input tile loaded once for all of them;
* fused_dw_pw: depthwise conv (ALU) whose output tile in VB1 is the input tile of a pointwise conv;
* fused_conv_conv: conv -> conv; a pointwise second conv reads the first conv's output tile in VB1, a windowed
  one reads the circular buffer of fused_chain;
* fused_conv_pool: conv_pool / pw_dw, a conv feeding an ALU window op (max/avg pool, depthwise conv) through the
  circular buffer of fused_chain.

The tile loop is a twin of codegen.conv.emit_conv / alu.emit_alu with hooks (several jobs per input tile, an
epilogue between the CONVs and the SAVEs, a cap on the tile width, the input bank group of the CONVs). The
lead should merge them by giving conv.emit_conv those hooks (see the fusion report).
"""
from __future__ import annotations

import numpy as np

from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.conv import ConvIn, ConvJob, ConvOut, emit_conv_groups, param_resources
from tvm_dpu.codegen.layout import ParamBlob, ceil_div, pack_channel_vector, pack_conv_weights
from tvm_dpu.codegen.program import Program
from tvm_dpu.codegen.tiling import (FIELD10, OUT_GROUPS_MAX, CodegenError, RasterTile, RowPlacement, RowTile,
                                    WindowTile, emit_raster_loads, raster_tiles, split_even)
from tvm_dpu.types import REG_PARAMS, FMap
from tvm_dpu.xgraph import ops as xops
from tvm_dpu.xgraph.graph import Graph, Op


def fusable(arch: Arch, graph: Graph, op: Op) -> bool:
    """Whether conv2d `op` can be a member of a fused pipeline: groups 1, no dilation, not a partial conv (in_slice:
    its input is a channel slice the pipelines' tile loads do not take) and its output groups within one CONV
    chunk (the pipelines keep every output group of a tile resident)."""
    return (op.attrs.get("in_slice") is None and xops.attr(op, "groups") == 1
            and tuple(xops.attr(op, "dilations")) == (1, 1)
            and ceil_div(graph.tensors[op.outputs[0]].shape[1], arch.ocp) <= OUT_GROUPS_MAX)


def conv_job(arch: Arch, graph: Graph, op: Op, params: ParamBlob) -> ConvJob:
    """The ConvJob of a conv2d (weights and biases appended to `params`), as the unfused compiler builds it."""
    if not fusable(arch, graph, op):
        raise CodegenError(f"op {op.name!r}: a grouped, dilated or partial (in_slice) conv2d, or one of more than "
                           f"{OUT_GROUPS_MAX} output-channel groups, cannot be fused")
    q = xops.quant_params(op, graph)
    w = graph.param(op, "weights").data
    win = xops.conv_window(op, graph)
    b = graph.param(op, "bias", required=False)
    bias = b.data if b is not None else np.zeros(w.shape[0], np.int8)
    w_off = params.add(pack_conv_weights(w, arch.icp, arch.ocp), op.params["weights"])
    b_off = params.add(pack_channel_vector(bias, arch.ocp), op.params.get("bias", ""))
    return ConvJob(op.name, win.kh, win.kw, win.sh, win.sw, tuple(win.pads), w.shape[1], w.shape[0], q.act_type,
                   q.shift_cut, q.shift_bias_isa, w_off, b_off, REG_PARAMS)


def param_slots(prog: Program, arch: Arch, sizes: list[tuple[int, int]]) -> list[tuple[int | None, int, int]]:
    """Where the parameters of a fused kernel's members go: per member (its CONVW rows, BIAS rows), (the half of the
    CONVW / BIAS banks it lies in or None for the whole banks, its first CONVW row, its first BIAS row).

    Members fill the half the previous op did not use (Program.next_slot, as the unfused conv alternates halves),
    in order, and those that do not fit there the other half; so the first members' parameters load while the
    previous op still computes, and the rest as soon as its CONVs are done, overlapping the first members' CONVs.
    Only when the members cannot be split so do they take the whole banks (their LOADs then wait for every CONV
    before them: the kernel starts with a bubble, what made GoogLeNet's horizontally fused 1x1 convs lose to the
    unfused ones)."""
    half = arch.bank_depth // 2
    total_w, total_b = sum(w for w, _ in sizes), sum(b for _, b in sizes)
    if total_w > arch.bank_depth or total_b > arch.bank_depth:
        raise CodegenError(f"parameters of {total_w} CONVW rows / {total_b} BIAS rows do not fit the banks")
    cut = len(sizes)
    if total_w > half or total_b > half:
        w = b = 0
        cut = 0
        while cut < len(sizes) and w + sizes[cut][0] <= half and b + sizes[cut][1] <= half:
            w, b = w + sizes[cut][0], b + sizes[cut][1]
            cut += 1
        if cut == 0 or total_w - w > half or total_b - b > half:
            out, w, b = [], 0, 0
            for sw, sb in sizes:
                out.append((None, w, b))
                w, b = w + sw, b + sb
            return out
    first = prog.next_slot("convw")
    prog.next_slot("bias")
    if cut < len(sizes):  # the rest in the other half, which the next op then avoids
        prog.next_slot("convw")
        prog.next_slot("bias")
    out = []
    for k, part in ((first, sizes[:cut]), (1 - first, sizes[cut:])):
        w = b = k * half
        for sw, sb in part:
            out.append((k, w, b))
            w, b = w + sw, b + sb
    return out


def conv_geometry(graph: Graph, op: Op) -> tuple:
    win = xops.conv_window(op, graph)
    return win.kh, win.kw, win.sh, win.sw, tuple(win.pads), graph.tensors[op.inputs[0]].shape[1], op.inputs[0]


def probe(arch: Arch, graph: Graph, op: Op) -> ConvJob:
    """A ConvJob with the geometry of `op` only (for tile choice; no parameters packed)."""
    kh, kw, sh, sw, pads, cin, _ = conv_geometry(graph, op)
    return ConvJob(op.name, kh, kw, sh, sw, pads, cin, graph.tensors[op.outputs[0]].shape[1], 0, 0, 0, 0, 0)


def emit_tile_convs(prog: Program, arch: Arch, job: ConvJob, wt: WindowTile, pads: tuple[int, int, int, int],
                     v: int, length: int, n: int, buf: int, out0: int, wrow0: int = 0, brow0: int = 0,
                     slot: int | None = None, tag: str | None = None) -> None:
    """CONVINIT + the CONVs of n output-channel groups of one tile: input window `wt` in half `buf` of VB0,
    output pixels n rows apart from VB1 row out0; group gl's weights from CONVW row wrow0 + gl * (its rows), its
    bias in BIAS row brow0 + gl, both in half `slot` of those banks (None: anywhere) under `tag` (see load_params)."""
    w_res, b_res = param_resources(slot, tag)
    vb0, vb1 = arch.bank_group("VB0").base_id, arch.bank_group("VB1").base_id
    emit_conv_groups(prog, arch, job, ConvIn.of(vb0, wt.place, arch.bank_depth), ConvOut(vb1, out0, n), n, v, length,
                     wrow0, brow0, (("vb0", buf),) + w_res + b_res, (("vb1", buf),), pads)


def emit_pointwise_tile(prog: Program, arch: Arch, job: ConvJob, buf: int, base: int, v: int, length: int,
                        wrow0: int, brow0: int, y: FMap, y_res: str, p0: int, q0: int,
                        params: tuple = (("convw",), ("bias",))) -> None:
    """The pointwise second conv of a two-stage tile (dw_pw, conv_pw): its input tile, every channel group, sits
    in VB1 from `base` of half `buf`; CONVINIT, one CONV per output-channel group (weights from CONVW row wrow0,
    biases from BIAS row brow0) writing into the consumed VB0 window at `base`, and the SAVEs of its v rows.

    Not conv._emit_flat_tile, though both run 1x1 CONVs over lines of `length` pixels: that one LOADs a raster
    tile from DDR into VB0 (rows that cross image rows, a chunk of the output groups) and SAVEs runs of it; here
    the input is already in VB1, every output group is computed and the tile is image rows."""
    cg_in, cg_out = ceil_div(job.cin, arch.icp), ceil_div(job.cout, arch.ocp)
    vb0, vb1 = arch.bank_group("VB0").base_id, arch.bank_group("VB1").base_id
    place = RowPlacement(arch.pp, 1, length * cg_in, cg_in, base)
    emit_conv_groups(prog, arch, job, ConvIn.of(vb1, place, arch.bank_depth), ConvOut(vb0, base, cg_out), cg_out, v,
                     length, wrow0, brow0, (("vb1", buf),) + params, (("vb0", buf),))
    for r in range(v):
        prog.emit("SAVE", reads=(("vb0", buf),), writes=(("ddr", y_res),), bank_id=vb0 + r,
                  bank_addr=base, length=length, channel=job.cout, jump_read=cg_out,
                  jump_write=y.pixel_pitch, reg_id=y.reg_id, ddr_addr=y.addr(p0 + r, q0, 0))

def is_pointwise(graph: Graph, op: Op) -> bool:
    win = xops.conv_window(op, graph)
    return (win.kh, win.kw, win.sh, win.sw, tuple(win.pads)) == (1, 1, 1, 1, (0, 0, 0, 0))


def flattenable(job: ConvJob, *maps: FMap) -> bool:
    """Whether a pointwise conv's tiles may run over the map's pixels in raster order (flattened): a 1x1 stride-1
    unpadded conv treats every pixel alike, so a tile row can be any run of consecutive pixels when every map
    involved has its rows back to back in DDR (row pitch = width x pixel pitch). Then the CONVs are as long as the
    bank allows instead of one image row (a 14x14 map: 4 x 46 pixels per CONV instead of 4 x 14, so the fixed
    cycles of a CONV weigh 3x less) and no PP rows go unused."""
    return ((job.kh, job.kw, job.sh, job.sw, tuple(job.pads)) == (1, 1, 1, 1, (0, 0, 0, 0))
            and all(m.row_pitch == m.w * m.pixel_pitch for m in maps))


def flat_chunk(arch: Arch, cin: int, cg_out: int, n_pix: int, vpp: int, resident: int,
               rows_per_group: int = 1, fewest_chunks: bool = False) -> tuple[int, int]:
    """(output groups per chunk, L) of a flattened pointwise conv (flattenable) over n_pix pixels whose output tile
    keeps `rows_per_group` VB1 rows per pixel and resident group (2: the add's operand beside the output): the
    fewest CONVs (each pays the CONV fill: more resident groups make shorter tiles, hence more CONVs per group),
    then the fewest chunks (each loads the input again). At most `resident` groups (what the CONVW banks hold).
    Taking the most groups that fit instead (the widest conv_tile) made a 1x1 over 256 -> 1024 channels on a 14x14
    map run 430 CONVs of 10 pixels where 172 of 25 do: its fused form lost to the unfused conv and add.
    `fewest_chunks` orders the two the other way round: where a chunk's DMA outweighs the CONV fills it saves
    (YOLOX-nano's 1x1 over 32 channels on 52x52 beside an add: two chunks of 16 channels load the input twice and
    move the add's operand and output 16 of every 32 bytes), which the caller decides on the timing model."""
    half = arch.bank_depth // 2
    lin = min(FIELD10, half) // ceil_div(cin, arch.icp)
    best: tuple[tuple[int, int], int, int] | None = None
    for n in range(1, max(1, resident) + 1):
        length = min(lin, half // (rows_per_group * n), FIELD10)
        if length < 1:
            break
        key = (cg_out * ceil_div(n_pix, vpp * length), ceil_div(cg_out, n))
        if fewest_chunks:
            key = key[::-1]
        if best is None or key < best[0]:
            best = (key, n, length)
    if best is None:
        raise CodegenError(f"no flat tile of a pointwise conv over {cin} channels fits half a bank of {arch.name}")
    return best[1], best[2]


def output_tiles(flat: bool, y: FMap, vpp: int, lmax: int) -> list[RasterTile | RowTile]:
    """Output tiles: raster order (even tiles, tiling.raster_tiles) or vpp image rows x up to lmax columns."""
    if flat:
        return raster_tiles(y.h * y.w, vpp, lmax, even=True)
    return [RowTile(p0, q0, min(vpp, y.h - p0), length) for p0 in range(0, y.h, vpp)
            for q0, length in split_even(y.w, lmax)]


def emit_input_tile(prog: Program, arch: Arch, x: FMap, x_res: str, job: ConvJob, tile: RasterTile | RowTile,
                     buf: int) -> WindowTile:
    """LOAD the conv input window of one output tile into half `buf` of VB0; returns its placement. A raster
    tile: row r of the tile is the run of pixels it covers (tiling.emit_raster_loads)."""
    base = buf * (arch.bank_depth // 2)
    vb0 = arch.bank_group("VB0").base_id
    cg_in = ceil_div(job.cin, arch.icp)
    if isinstance(tile, RowTile):
        wt = WindowTile.of(arch.pp, job.kh, job.kw, job.sh, job.sw, job.pads, tile.p0, tile.vpp, tile.q0,
                           tile.length, cg_in, base)
        wt.emit_loads(prog, vb0, arch.bank_depth, x, x_res, 0, job.cin, ("vb0", buf))
        return wt
    emit_raster_loads(prog, vb0, arch.bank_depth, tile, x.w, x, x_res, 1, 1, job.cin, cg_in, base, ("vb0", buf))
    return WindowTile.of(arch.pp, 1, 1, 1, 1, (0, 0, 0, 0), 0, tile.vpp, 0, tile.length, cg_in, base)
