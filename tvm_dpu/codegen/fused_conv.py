"""What the fused pipelines on the CONV engine share: which convs may be fused, their ConvJob and parameter
LOADs, the CONVs of one tile, and the output tiles (raster order over dense maps, tiling.raster_tiles, or image
rows) with their input LOADs.

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
from tvm_dpu.codegen.conv import ConvJob
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
    w_off = params.add(pack_conv_weights(w, arch.icp, arch.ocp))
    b_off = params.add(pack_channel_vector(bias, arch.ocp))
    return ConvJob(op.name, win.kh, win.kw, win.sh, win.sw, tuple(win.pads), w.shape[1], w.shape[0], q.act_type,
                   q.shift_cut, q.shift_bias_isa, w_off, b_off, REG_PARAMS)


def load_params(prog: Program, arch: Arch, job: ConvJob, g0: int, n: int, wrow0: int = 0, brow0: int = 0,
                 with_bias: bool = True, slot: int | None = None) -> None:
    """LOAD the weights of output-channel groups [g0, g0+n) of `job` into CONVW rows from wrow0 (one LOAD per
    bank) and (with_bias) their biases into BIAS rows from brow0. `slot`: the half of the CONVW / BIAS banks the
    rows lie in (program.SLOTTED), so only the instructions using that half are waited for; None: the whole
    buffers."""
    convw_res, bias_res = (("convw",), ("bias",)) if slot is None else (("convw", slot), ("bias", slot))
    icp, ocp = arch.icp, arch.ocp
    cg_in, cg_out = ceil_div(job.cin, icp), ceil_div(job.cout, ocp)
    wrows = job.kh * job.kw * cg_in
    convw = arch.bank_group("CONVW").base_id
    for o in range(min(ocp, job.cout - g0 * ocp)):
        for i0, cnt in split_even(n * job.kh * job.kw, FIELD10):
            prog.emit("LOAD", reads=(("ddr", "params"),), writes=(convw_res,), bank_id=convw + o,
                      bank_addr=wrow0 + i0 * cg_in, length=cnt, channel=cg_in * icp, jump_read=cg_in * icp,
                      jump_write=cg_in, reg_id=job.params_reg,
                      ddr_addr=job.w_offset + ((o * cg_out + g0) * wrows + i0 * cg_in) * icp)
    if with_bias:
        load_biases(prog, arch, job, g0, n, brow0, bias_res)


def load_biases(prog: Program, arch: Arch, job: ConvJob, g0: int, n: int, brow0: int, res: tuple) -> None:
    """LOAD the biases of output-channel groups [g0, g0+n) of `job` into BIAS rows from brow0 (one LOAD; `res`
    names the BIAS rows for the dependency tracker)."""
    ocp = arch.ocp
    prog.emit("LOAD", reads=(("ddr", "params"),), writes=(res,), bank_id=arch.bank_group("BIAS").base_id,
              bank_addr=brow0, length=n, channel=ocp, jump_read=ocp, jump_write=1, reg_id=job.params_reg,
              ddr_addr=job.b_offset + g0 * ocp)


def conv_geometry(graph: Graph, op: Op) -> tuple:
    win = xops.conv_window(op, graph)
    return win.kh, win.kw, win.sh, win.sw, tuple(win.pads), graph.tensors[op.inputs[0]].shape[1], op.inputs[0]


def probe(arch: Arch, graph: Graph, op: Op) -> ConvJob:
    """A ConvJob with the geometry of `op` only (for tile choice; no parameters packed)."""
    kh, kw, sh, sw, pads, cin, _ = conv_geometry(graph, op)
    return ConvJob(op.name, kh, kw, sh, sw, pads, cin, graph.tensors[op.outputs[0]].shape[1], 0, 0, 0, 0, 0)


def emit_tile_convs(prog: Program, arch: Arch, job: ConvJob, wt: WindowTile, pads: tuple[int, int, int, int],
                     v: int, length: int, n: int, buf: int, out0: int, g_first: int = 0) -> None:
    """CONVINIT + the CONVs of n output-channel groups of one tile: input window `wt` in half `buf` of VB0,
    output pixels n rows apart from VB1 row out0; group gl's weights are resident group g_first + gl."""
    cg_in = ceil_div(job.cin, arch.icp)
    wrows = job.kh * job.kw * cg_in
    vb0, vb1 = arch.bank_group("VB0").base_id, arch.bank_group("VB1").base_id
    pad_top, pad_left, pad_bottom, pad_right = pads
    a = [b % arch.bank_depth for b in wt.place.bases()]
    prog.emit("CONVINIT", act_type=job.act_type, shift_cut=job.shift_cut, shift_bias=job.shift_bias,
              jump_read=cg_in, jump_read_endl=wt.place.endl, stride_out=1, jump_write=n, jump_write_endl=1,
              stride_h=job.sh, kernel_h=job.kh, valid_pixel_parallel=v, stride_offset_in=0, stride_w=job.sw,
              kernel_w=job.kw, stride_offset_out=0)
    for gl in range(n):
        prog.emit("CONV", reads=(("vb0", buf), ("convw",), ("bias",)), writes=(("vb1", buf),), pad_left=pad_left,
                  pad_top=pad_top, bank_addr_in=a[0], channel_group=cg_in, pad_right=job.kw - 1 - pad_right,
                  pad_bottom=job.kh - 1 - pad_bottom, bank_addr_out=out0 + gl, length=length, bank_id_in=vb0,
                  bank_addr_weights=(g_first + gl) * wrows, bank_addr_in_1=a[1], bank_id_out=vb1,
                  bank_addr_bias=g_first + gl, channel_offset=cg_in * arch.icp - job.cin, bank_addr_in_3=a[3],
                  bank_addr_in_2=a[2])



def emit_pointwise_tile(prog: Program, arch: Arch, job: ConvJob, buf: int, base: int, v: int, length: int,
                        wrow0: int, brow0: int, y: FMap, y_res: str, p0: int, q0: int) -> None:
    """The pointwise second conv of a two-stage tile (dw_pw, conv_pw): its input tile, every channel group, sits
    in VB1 from `base` of half `buf`; CONVINIT, one CONV per output-channel group (weights from CONVW row wrow0,
    biases from BIAS row brow0) writing into the consumed VB0 window at `base`, and the SAVEs of its v rows."""
    cg_in, cg_out = ceil_div(job.cin, arch.icp), ceil_div(job.cout, arch.ocp)
    vb0, vb1 = arch.bank_group("VB0").base_id, arch.bank_group("VB1").base_id
    place = RowPlacement(arch.pp, 1, length * cg_in, cg_in, base)
    ib = [r % arch.bank_depth for r in place.bases()]
    prog.emit("CONVINIT", act_type=job.act_type, shift_cut=job.shift_cut, shift_bias=job.shift_bias,
              jump_read=cg_in, jump_read_endl=place.endl, stride_out=1, jump_write=cg_out, jump_write_endl=1,
              stride_h=1, kernel_h=1, valid_pixel_parallel=v, stride_offset_in=0, stride_w=1, kernel_w=1,
              stride_offset_out=0)
    for gl in range(cg_out):
        prog.emit("CONV", reads=(("vb1", buf), ("convw",), ("bias",)), writes=(("vb0", buf),),
                  pad_left=0, pad_top=0, bank_addr_in=ib[0], channel_group=cg_in, pad_right=0, pad_bottom=0,
                  bank_addr_out=base + gl, length=length, bank_id_in=vb1, bank_addr_weights=wrow0 + gl * cg_in,
                  bank_addr_in_1=ib[1], bank_id_out=vb0, bank_addr_bias=brow0 + gl,
                  channel_offset=cg_in * arch.icp - job.cin, bank_addr_in_3=ib[3], bank_addr_in_2=ib[2])
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
