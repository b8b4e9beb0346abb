"""Fused pipelines on the CONV engine (per output tile, intermediates stay in the image banks):

* conv_add: conv2d + eltwise add, the add done by ELEW on the conv's output tile in VB1 before SAVE;
* hconv: convs sharing one input, each input tile loaded once for all of them;
* dw_pw: depthwise conv (ALU) whose output tile in VB1 is the input tile of a pointwise conv;
* conv_conv (pointwise second conv): the first conv's output tile in VB1 is the second's input tile;
* conv_pool / pw_dw: a conv feeding an ALU window op (max/avg pool, depthwise conv) through a circular buffer
  in VB1 in the consumer's row-fetch layout (emit_conv_pool);
* conv_conv (windowed second conv): the same circular buffer read by the second conv's CONVs, whose row fetch
  takes one base address per wrap like the ALU's (emit_conv_window).

The tile loop is a twin of codegen.conv.emit_conv / alu.emit_alu with hooks (several jobs per input tile, an
epilogue between the CONVs and the SAVEs, a cap on the tile width, the input bank group of the CONVs). The
lead should merge them by giving conv.emit_conv those hooks (see the fusion report).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.conv import ConvJob, augmented_weights
from tvm_dpu.codegen.isa import enum_code
from tvm_dpu.codegen.layout import ParamBlob, ceil_div, pack_channel_vector, pack_conv_weights
from tvm_dpu.codegen.program import Program
from tvm_dpu.codegen.tiling import (FIELD10, OUT_GROUPS_MAX, CodegenError, RasterTile, RowTile, WindowTile,
                                    augmentable, conv_tile, emit_raster_loads, max_valid_rows, raster_tiles,
                                    split_even)
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


def _load_params(prog: Program, arch: Arch, job: ConvJob, g0: int, n: int, wrow0: int = 0, brow0: int = 0,
                 with_bias: bool = True) -> None:
    """LOAD the weights of output-channel groups [g0, g0+n) of `job` into CONVW rows from wrow0 (one LOAD per
    bank) and (with_bias) their biases into BIAS rows from brow0."""
    icp, ocp = arch.icp, arch.ocp
    cg_in, cg_out = ceil_div(job.cin, icp), ceil_div(job.cout, ocp)
    wrows = job.kh * job.kw * cg_in
    convw = arch.bank_group("CONVW").base_id
    for o in range(min(ocp, job.cout - g0 * ocp)):
        for i0, cnt in split_even(n * job.kh * job.kw, FIELD10):
            prog.emit("LOAD", reads=(("ddr", "params"),), writes=(("convw",),), bank_id=convw + o,
                      bank_addr=wrow0 + i0 * cg_in, length=cnt, channel=cg_in * icp, jump_read=cg_in * icp,
                      jump_write=cg_in, reg_id=job.params_reg,
                      ddr_addr=job.w_offset + ((o * cg_out + g0) * wrows + i0 * cg_in) * icp)
    if not with_bias:
        return
    prog.emit("LOAD", reads=(("ddr", "params"),), writes=(("bias",),), bank_id=arch.bank_group("BIAS").base_id,
              bank_addr=brow0, length=n, channel=ocp, jump_read=ocp, jump_write=1, reg_id=job.params_reg,
              ddr_addr=job.b_offset + g0 * ocp)


def _geometry(graph: Graph, op: Op) -> tuple:
    win = xops.conv_window(op, graph)
    return win.kh, win.kw, win.sh, win.sw, tuple(win.pads), graph.tensors[op.inputs[0]].shape[1], op.inputs[0]


def _probe(arch: Arch, graph: Graph, op: Op) -> ConvJob:
    """A ConvJob with the geometry of `op` only (for tile choice; no parameters packed)."""
    kh, kw, sh, sw, pads, cin, _ = _geometry(graph, op)
    return ConvJob(op.name, kh, kw, sh, sw, pads, cin, graph.tensors[op.outputs[0]].shape[1], 0, 0, 0, 0, 0)


def hconv_fits(arch: Arch, graph: Graph, convs: list[Op]) -> bool:
    """Whether convs sharing one input can run as one pipeline: same window geometry, all weights and biases
    resident at once, and one output tile of every member in half of VB1."""
    if len({_geometry(graph, c) for c in convs}) != 1 or arch.icp != arch.ocp:
        return False
    if not all(fusable(arch, graph, c) for c in convs):
        return False
    jobs = [_probe(arch, graph, c) for c in convs]
    cg_in = ceil_div(jobs[0].cin, arch.icp)
    total = sum(ceil_div(j.cout, arch.ocp) for j in jobs)
    if jobs[0].kh * jobs[0].kw * cg_in * total > arch.bank_depth:
        return False
    tile = conv_tile(arch, *jobs[0].geometry, total)
    return tile is not None and tile[2] == total


def conv_add_fits(arch: Arch, graph: Graph, conv: Op) -> bool:
    if arch.icp != arch.ocp or not fusable(arch, graph, conv):
        return False
    job = _probe(arch, graph, conv)
    wrows = job.kh * job.kw * ceil_div(job.cin, arch.icp)
    if wrows > arch.bank_depth:
        return False
    tile = conv_tile(arch, *job.geometry, min(ceil_div(job.cout, arch.ocp), arch.bank_depth // wrows))
    return tile is not None and arch.bank_depth // 2 // (2 * tile[2]) >= 1


def emit_hconv(prog: Program, arch: Arch, graph: Graph, convs: list[Op], fmaps: dict[str, FMap],
               params: ParamBlob) -> None:
    """Convs sharing one input (horizontal fusion): every input tile is loaded once and feeds the CONVs of all
    members (all weights resident); each member's output tile sits in its own slice of VB1 and is saved to its
    own map."""
    if not hconv_fits(arch, graph, convs):
        raise CodegenError(f"ops {[c.name for c in convs]}: horizontal fusion does not fit {arch.name}")
    jobs = [conv_job(arch, graph, c, params) for c in convs]
    x_res = convs[0].inputs[0]
    x = fmaps[x_res]
    ocp, half = arch.ocp, arch.bank_depth // 2
    cg_in = ceil_div(jobs[0].cin, arch.icp)
    wrows = jobs[0].kh * jobs[0].kw * cg_in
    ns = [ceil_div(j.cout, ocp) for j in jobs]
    first = [sum(ns[:i]) for i in range(len(ns))]  # group offset of each member (weights, biases, VB1 slice)
    vpp, lmax, _ = conv_tile(arch, *jobs[0].geometry, sum(ns))
    for j, n, f in zip(jobs, ns, first):
        _load_params(prog, arch, j, 0, n, f * wrows, f)
    vb1 = arch.bank_group("VB1").base_id
    ys = [fmaps[c.outputs[0]] for c in convs]
    job0 = jobs[0]
    flat = _flat(job0, x, *ys)
    buf = 0
    for t in _tiles(flat, ys[0], vpp, lmax):
        base, length = buf * half, t.length
        wt = _emit_input_tile(prog, arch, x, x_res, job0, t, buf)
        pads = (0, 0, 0, 0) if flat else wt.pads(x)
        for j, n, f in zip(jobs, ns, first):
            _emit_tile_convs(prog, arch, j, wt, pads, t.vpp, length, n, buf, base + f * length, f)
        for c, j, n, f, y in zip(convs, jobs, ns, first, ys):
            for r in range(t.vpp):
                for j0, a, cnt in t.runs(r, y.w, y.addr, y.pixel_pitch):
                    prog.emit("SAVE", reads=(("vb1", buf),), writes=(("ddr", c.outputs[0]),), bank_id=vb1 + r,
                              bank_addr=base + f * length + j0 * n, length=cnt, channel=j.cout, jump_read=n,
                              jump_write=y.pixel_pitch, reg_id=y.reg_id, ddr_addr=a)
        buf ^= 1


def _emit_tile_convs(prog: Program, arch: Arch, job: ConvJob, wt: WindowTile, pads: tuple[int, int, int, int],
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


def _flat(job: ConvJob, *maps: FMap) -> bool:
    """Whether a pointwise conv's tiles may run over the map's pixels in raster order (flattened): a 1x1 stride-1
    unpadded conv treats every pixel alike, so a tile row can be any run of consecutive pixels when every map
    involved has its rows back to back in DDR (row pitch = width x pixel pitch). Then the CONVs are as long as the
    bank allows instead of one image row (a 14x14 map: 4 x 46 pixels per CONV instead of 4 x 14, so the fixed
    cycles of a CONV weigh 3x less) and no PP rows go unused."""
    return ((job.kh, job.kw, job.sh, job.sw, tuple(job.pads)) == (1, 1, 1, 1, (0, 0, 0, 0))
            and all(m.row_pitch == m.w * m.pixel_pitch for m in maps))


def _tiles(flat: bool, y: FMap, vpp: int, lmax: int) -> list[RasterTile | RowTile]:
    """Output tiles: raster order (even tiles, tiling.raster_tiles) or vpp image rows x up to lmax columns."""
    if flat:
        return raster_tiles(y.h * y.w, vpp, lmax, even=True)
    return [RowTile(p0, q0, min(vpp, y.h - p0), length) for p0 in range(0, y.h, vpp)
            for q0, length in split_even(y.w, lmax)]


def _emit_input_tile(prog: Program, arch: Arch, x: FMap, x_res: str, job: ConvJob, tile: RasterTile | RowTile,
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


def _flat_convs(n_pix: int, vpp: int, lmax: int, cg_out: int) -> int:
    """CONVs a flattened pointwise conv of cg_out output groups needs over n_pix pixels."""
    return cg_out * len(raster_tiles(n_pix, vpp, lmax, even=True)) if lmax >= 1 else 1 << 30


def emit_conv_add(prog: Program, arch: Arch, graph: Graph, conv: Op, add: Op, fmaps: dict[str, FMap],
                  params: ParamBlob) -> None:
    """y_add = add(conv(x), other) with conv(x) kept in VB1 (fmaps has no place for the conv's output)."""
    if arch.icp != arch.ocp:
        raise CodegenError(f"op {add.name!r}: fusing an add into a conv needs ICP == OCP")
    t_conv = conv.outputs[0]
    k = add.inputs.index(t_conv)
    other = add.inputs[1 - k]
    q = xops.quant_params(add, graph)
    job = conv_job(arch, graph, conv, params)
    x, y, z = fmaps[conv.inputs[0]], fmaps[add.outputs[0]], fmaps[other]
    ocp = arch.ocp
    half = arch.bank_depth // 2
    cg_in = ceil_div(job.cin, arch.icp)
    cg_out = ceil_div(job.cout, ocp)
    wrows = job.kh * job.kw * cg_in
    if wrows > arch.bank_depth:
        raise CodegenError(f"op {conv.name!r}: weights need {wrows} rows per CONVW bank (> {arch.bank_depth})")
    tile = conv_tile(arch, *job.geometry, min(cg_out, arch.bank_depth // wrows))
    if tile is None:
        raise CodegenError(f"op {conv.name!r}: no conv tile fits half an image bank of {arch.name}")
    vpp, lmax, chunk = tile
    flat = _flat(job, x, y, z)
    if flat:
        # fewer resident output groups make longer CONVs (the add's operand and the output share VB1): take them
        # when that needs fewer CONVs over the map (a 1x1 over many channels on a 14x14 map), else keep the input
        # loaded once
        few = max(1, min(chunk, half // (2 * lmax)))
        n_pix = y.h * y.w
        if _flat_convs(n_pix, vpp, min(lmax, half // (2 * few)), cg_out) < \
                _flat_convs(n_pix, vpp, min(lmax, half // (2 * chunk)), cg_out):
            chunk = few
    lmax = min(lmax, half // (2 * chunk))  # the add's operand sits next to the conv's output in VB1
    if lmax < 1:
        raise CodegenError(f"op {add.name!r}: no tile leaves room for the add's operand in VB1")
    vb1 = arch.bank_group("VB1").base_id
    tiles = _tiles(flat, y, vpp, lmax)
    buf = 0
    for g0, n in split_even(cg_out, chunk):
        _load_params(prog, arch, job, g0, n)
        channels = min(n * ocp, job.cout - g0 * ocp)
        for t in tiles:
            base, v, length = buf * half, t.vpp, t.length
            wt = _emit_input_tile(prog, arch, x, conv.inputs[0], job, t, buf)
            opnd = base + length * n
            for r in range(v):  # the add's other operand, next to the conv's output tile
                for j0, a, cnt in t.runs(r, z.w, lambda oy, ox: z.addr(oy, ox, g0 * ocp), z.pixel_pitch):
                    prog.emit("LOAD", reads=(("ddr", other),), writes=(("vb1", buf, "operand"),),
                              bank_id=vb1 + r, bank_addr=opnd + j0 * n, length=cnt, channel=channels,
                              jump_read=z.pixel_pitch, jump_write=n, reg_id=z.reg_id, ddr_addr=a)
            _emit_tile_convs(prog, arch, job, wt, (0, 0, 0, 0) if flat else wt.pads(x), v, length, n, buf, base)
            addr = {k: base, 1 - k: opnd}  # operand order of the add (shift_read is per operand)
            for k0 in range(0, v, arch.alu_pp):
                rows = min(arch.alu_pp, v - k0)
                for i in range(2):
                    prog.emit("ELEWINIT", bank_id_in=vb1 + k0, share_pp=0, jump_bank=1, id=i,
                              jump_read_endl=1, bank_addr_in=addr[i], shift_read=q.shift_read[i], jump_read=n)
                prog.emit("ELEW", reads=(("vb1", buf), ("vb1", buf, "operand")), writes=(("vb1", buf),),
                          bank_id_out=vb1 + k0, elew_type=enum_code("elew_type", "add"), act_type=q.act_type,
                          length=length, valid_pixel_parallel=rows, num=2, jump_write_endl=1, bank_addr_out=base,
                          channel_group=n, shift_write=q.shift_write, jump_write=n)
            for r in range(v):
                for j0, a, cnt in t.runs(r, y.w, lambda oy, ox: y.addr(oy, ox, g0 * ocp), y.pixel_pitch):
                    prog.emit("SAVE", reads=(("vb1", buf),), writes=(("ddr", add.outputs[0]),), bank_id=vb1 + r,
                              bank_addr=base + j0 * n, length=cnt, channel=channels, jump_read=n,
                              jump_write=y.pixel_pitch, reg_id=y.reg_id, ddr_addr=a)
            buf ^= 1


def _dw_pw_tile(arch: Arch, graph: Graph, dw: Op, pw: Op) -> tuple[int, int] | None:
    """(vpp, L) of the dw_pw pipeline, or None: every channel group of the depthwise in one ALU pass, the
    pointwise weights resident, and the dw input window, the dw output (VB1) and the pw output (VB0, reusing
    the consumed window) within half a bank."""
    if arch.icp != arch.ocp or tuple(xops.attr(dw, "dilations")) != (1, 1) or not fusable(arch, graph, pw):
        return None
    win = xops.conv_window(dw, graph)
    if win.pads[0] > 15 or win.pads[1] > 15:
        return None
    half = arch.bank_depth // 2
    c = graph.tensors[dw.outputs[0]].shape[1]
    cout = graph.tensors[pw.outputs[0]].shape[1]
    cg, n_out = ceil_div(c, arch.icp), ceil_div(cout, arch.ocp)
    if win.kh * win.kw * cg > arch.bank_depth or cg * n_out > arch.bank_depth or cg + n_out > arch.bank_depth:
        return None
    try:
        vpp = max_valid_rows(arch.pp, arch.alu_pp, win.kh, win.sh)
    except CodegenError:
        return None
    n_rows = (vpp - 1) * win.sh + win.kh
    wraps = ((n_rows - 1) // win.sh) // arch.pp + 1
    w_out = graph.tensors[dw.outputs[0]].shape[3]
    for length in range(min(w_out, FIELD10), 0, -1):
        in_cols = (length - 1) * win.sw + win.kw
        if (in_cols <= FIELD10 and in_cols * cg <= 8192 and in_cols * cg * wraps * win.sh <= half
                and length * cg <= half and length * n_out <= half):
            return vpp, length
    return None


def dw_pw_fits(arch: Arch, graph: Graph, dw: Op, pw: Op) -> bool:
    return _dw_pw_tile(arch, graph, dw, pw) is not None


def emit_dw_pw(prog: Program, arch: Arch, graph: Graph, dw: Op, pw: Op, fmaps: dict[str, FMap],
               params: ParamBlob) -> None:
    """Depthwise conv (ALU) then pointwise conv (CONV) per tile: the ALU leaves all channel groups of its output
    tile in VB1, the CONVs read them there as their input tile and write into the consumed VB0 window, the SAVEs
    write the pointwise output; the depthwise output never touches DDR."""
    from tvm_dpu.codegen.alu import ALU_MODES
    from tvm_dpu.codegen.layout import pack_dw_weights
    from tvm_dpu.codegen.tiling import RowPlacement

    tile = _dw_pw_tile(arch, graph, dw, pw)
    if tile is None:
        raise CodegenError(f"ops {dw.name!r}+{pw.name!r}: depthwise+pointwise fusion does not fit {arch.name}")
    vpp, lmax = tile
    qd = xops.quant_params(dw, graph)
    win = xops.conv_window(dw, graph)
    wd = graph.param(dw, "weights").data
    c = wd.shape[0]
    bd = graph.param(dw, "bias", required=False)
    bias_d = bd.data if bd is not None else np.zeros(c, np.int8)
    wd_off = params.add(pack_dw_weights(wd, arch.icp))
    bd_off = params.add(pack_channel_vector(bias_d, arch.icp))
    job = conv_job(arch, graph, pw, params)
    cp, half = arch.icp, arch.bank_depth // 2
    cg, n_out = ceil_div(c, cp), ceil_div(job.cout, arch.ocp)
    vb0, vb1 = arch.bank_group("VB0").base_id, arch.bank_group("VB1").base_id
    taps = win.kh * win.kw
    prog.emit("LOAD", reads=(("ddr", "params"),), writes=(("dwconvw",),), bank_id=arch.bank_group("DWCONVW").base_id,
              bank_addr=0, length=taps, channel=c, jump_read=cg * cp, jump_write=cg, reg_id=REG_PARAMS,
              ddr_addr=wd_off)
    prog.emit("LOAD", reads=(("ddr", "params"),), writes=(("bias",),), bank_id=arch.bank_group("BIAS").base_id,
              bank_addr=0, length=1, channel=c, jump_read=c, jump_write=cg, reg_id=REG_PARAMS, ddr_addr=bd_off)
    _load_params(prog, arch, job, 0, n_out, 0, cg)  # pointwise biases after the depthwise ones
    x, y = fmaps[dw.inputs[0]], fmaps[pw.outputs[0]]
    buf = 0
    for p0 in range(0, y.h, vpp):
        v = min(vpp, y.h - p0)
        for q0, length in split_even(y.w, lmax):
            base = buf * half
            wt = WindowTile.of(arch.pp, win.kh, win.kw, win.sh, win.sw, tuple(win.pads), p0, v, q0, length, cg,
                               base)
            wt.emit_loads(prog, vb0, arch.bank_depth, x, dw.inputs[0], 0, c, ("vb0", buf))
            pad_top, pad_left, pad_bottom, pad_right = wt.pads(x)
            prog.emit("ALUINIT", exec_mode=ALU_MODES["dwconv"], kernel_h=win.kh, kernel_w=win.kw, stride_h=win.sh,
                      stride_w=win.sw, stride_offset_in=0, stride_offset_out=0, stride_out=1, channel_group=cg,
                      channel_offset=cg * cp - c, length=length, shift_prelu_p=0, act_type=qd.act_type,
                      shift_bias=qd.shift_bias_isa, shift_cut=qd.shift_cut, shift_prelu_n=0, multi_factor=0,
                      jump_read=cg, jump_read_endl=wt.place.endl, jump_read_weights=cg, jump_write=cg,
                      jump_write_endl=1)
            a = [b % arch.bank_depth for b in wt.place.bases()]
            prog.emit("ALU", reads=(("vb0", buf), ("dwconvw",), ("bias",)), writes=(("vb1", buf),),
                      bank_id_out=vb1, bank_addr_out=base, pad_bottom=win.kh - 1 - pad_bottom,
                      valid_pixel_parallel=v, bank_id_in=vb0, bank_addr_in=a[0], pad_top=pad_top, pad_left=pad_left,
                      pad_right=win.kw - 1 - pad_right, bank_addr_in_1=a[1], kernel_d=1, bank_addr_weights=0,
                      bank_addr_in_2=a[2], bank_addr_bias=0, bank_addr_in_3=a[3])
            place = RowPlacement(arch.pp, 1, length * cg, cg, base)
            b = [r % arch.bank_depth for r in place.bases()]
            prog.emit("CONVINIT", act_type=job.act_type, shift_cut=job.shift_cut, shift_bias=job.shift_bias,
                      jump_read=cg, jump_read_endl=place.endl, stride_out=1, jump_write=n_out, jump_write_endl=1,
                      stride_h=1, kernel_h=1, valid_pixel_parallel=v, stride_offset_in=0, stride_w=1, kernel_w=1,
                      stride_offset_out=0)
            for gl in range(n_out):
                prog.emit("CONV", reads=(("vb1", buf), ("convw",), ("bias",)), writes=(("vb0", buf),),
                          pad_left=0, pad_top=0, bank_addr_in=b[0], channel_group=cg, pad_right=0, pad_bottom=0,
                          bank_addr_out=base + gl, length=length, bank_id_in=vb1, bank_addr_weights=gl * cg,
                          bank_addr_in_1=b[1], bank_id_out=vb0, bank_addr_bias=cg + gl,
                          channel_offset=cg * cp - job.cin, bank_addr_in_3=b[3], bank_addr_in_2=b[2])
            for r in range(v):
                prog.emit("SAVE", reads=(("vb0", buf),), writes=(("ddr", pw.outputs[0]),), bank_id=vb0 + r,
                          bank_addr=base, length=length, channel=job.cout, jump_read=n_out,
                          jump_write=y.pixel_pitch, reg_id=y.reg_id, ddr_addr=y.addr(p0 + r, q0, 0))
            buf ^= 1


def _is_pointwise(graph: Graph, op: Op) -> bool:
    win = xops.conv_window(op, graph)
    return (win.kh, win.kw, win.sh, win.sw, tuple(win.pads)) == (1, 1, 1, 1, (0, 0, 0, 0))


def _conv_pw_tile(arch: Arch, graph: Graph, a: Op, b: Op) -> tuple[int, int] | None:
    """(vpp, L) of conv -> pointwise conv with the first conv's output tile (every channel group) kept in VB1,
    or None: both convs' weights and biases resident, the pointwise output within the consumed VB0 half."""
    if arch.icp != arch.ocp or not _is_pointwise(graph, b):
        return None
    if not (fusable(arch, graph, a) and fusable(arch, graph, b)):
        return None
    ja = _probe(arch, graph, a)
    cg_in, cg_mid = ceil_div(ja.cin, arch.icp), ceil_div(ja.cout, arch.ocp)
    cg_out = ceil_div(graph.tensors[b.outputs[0]].shape[1], arch.ocp)
    if ja.kh * ja.kw * cg_in * cg_mid + cg_mid * cg_out > arch.bank_depth or cg_mid + cg_out > arch.bank_depth:
        return None
    tile = conv_tile(arch, *ja.geometry, cg_mid)
    if tile is None or tile[2] != cg_mid:
        return None
    vpp, lmax, _ = tile
    lmax = min(lmax, arch.bank_depth // 2 // cg_out)
    return (vpp, lmax) if lmax >= 1 else None


def conv_pw_fits(arch: Arch, graph: Graph, a: Op, b: Op) -> bool:
    return _conv_pw_tile(arch, graph, a, b) is not None


def emit_conv_pw(prog: Program, arch: Arch, graph: Graph, a: Op, b: Op, fmaps: dict[str, FMap],
                 params: ParamBlob) -> None:
    """conv -> pointwise conv per tile: the first conv's CONVs leave all its channel groups in VB1, the pointwise
    CONVs read them there and write into the consumed VB0 window, the SAVEs write the second conv's output; the
    intermediate never touches DDR."""
    from tvm_dpu.codegen.tiling import RowPlacement

    tile = _conv_pw_tile(arch, graph, a, b)
    if tile is None:
        raise CodegenError(f"ops {a.name!r}+{b.name!r}: conv+pointwise fusion does not fit {arch.name}")
    vpp, lmax = tile
    ja, jb = conv_job(arch, graph, a, params), conv_job(arch, graph, b, params)
    icp, half = arch.icp, arch.bank_depth // 2
    cg_in, cg_mid, cg_out = ceil_div(ja.cin, icp), ceil_div(ja.cout, arch.ocp), ceil_div(jb.cout, arch.ocp)
    wrows_a = ja.kh * ja.kw * cg_in
    _load_params(prog, arch, ja, 0, cg_mid, 0, 0)
    _load_params(prog, arch, jb, 0, cg_out, cg_mid * wrows_a, cg_mid)
    vb0, vb1 = arch.bank_group("VB0").base_id, arch.bank_group("VB1").base_id
    x, y = fmaps[a.inputs[0]], fmaps[b.outputs[0]]
    buf = 0
    for p0 in range(0, y.h, vpp):
        v = min(vpp, y.h - p0)
        for q0, length in split_even(y.w, lmax):
            base = buf * half
            wt = WindowTile.of(arch.pp, ja.kh, ja.kw, ja.sh, ja.sw, ja.pads, p0, v, q0, length, cg_in, base)
            wt.emit_loads(prog, vb0, arch.bank_depth, x, a.inputs[0], 0, ja.cin, ("vb0", buf))
            _emit_tile_convs(prog, arch, ja, wt, wt.pads(x), v, length, cg_mid, buf, base)
            place = RowPlacement(arch.pp, 1, length * cg_mid, cg_mid, base)
            ib = [r % arch.bank_depth for r in place.bases()]
            prog.emit("CONVINIT", act_type=jb.act_type, shift_cut=jb.shift_cut, shift_bias=jb.shift_bias,
                      jump_read=cg_mid, jump_read_endl=place.endl, stride_out=1, jump_write=cg_out, jump_write_endl=1,
                      stride_h=1, kernel_h=1, valid_pixel_parallel=v, stride_offset_in=0, stride_w=1, kernel_w=1,
                      stride_offset_out=0)
            for gl in range(cg_out):
                prog.emit("CONV", reads=(("vb1", buf), ("convw",), ("bias",)), writes=(("vb0", buf),),
                          pad_left=0, pad_top=0, bank_addr_in=ib[0], channel_group=cg_mid, pad_right=0,
                          pad_bottom=0, bank_addr_out=base + gl, length=length, bank_id_in=vb1,
                          bank_addr_weights=cg_mid * wrows_a + gl * cg_mid, bank_addr_in_1=ib[1], bank_id_out=vb0,
                          bank_addr_bias=cg_mid + gl, channel_offset=cg_mid * icp - jb.cin, bank_addr_in_3=ib[3],
                          bank_addr_in_2=ib[2])
            for r in range(v):
                prog.emit("SAVE", reads=(("vb0", buf),), writes=(("ddr", b.outputs[0]),), bank_id=vb0 + r,
                          bank_addr=base, length=length, channel=jb.cout, jump_read=cg_out,
                          jump_write=y.pixel_pitch, reg_id=y.reg_id, ddr_addr=y.addr(p0 + r, q0, 0))
            buf ^= 1


_ALU_LENGTH = 2048  # ALU length: 11-bit minus field


@dataclass(frozen=True)
class _ChainTile:
    """Tile of a conv feeding a window consumer (ALU pool / depthwise, or a CONV) through a circular buffer in
    VB1."""
    vc: int  # conv rows per CONV (at most; a CONV never crosses a wrap of the consumer's layout)
    vp: int  # consumer rows per consumer instruction
    lp: int  # consumer columns per strip
    wraps: int  # wraps of the circular window buffer in VB1
    la: int  # conv output columns per CONV (a strip's conv columns are cut into pieces of at most la)
    a_slot: int  # rows of each half of VB0 for the conv's input window (the consumer's output slot follows it)
    la_aug: int = 0  # the same for channel-augmented CONVs (0: the conv is not augmented, see _augmentable)


def _augmentable(arch: Arch, job: ConvJob) -> bool:
    """Whether the conv's interior columns run channel-augmented (the first-layer trick, isa1-semantics 5.1): a
    LOAD item of kw*cin bytes read every sw*cin bytes of an image row (overlapping items) is the whole kernel row
    of one output column, so the CONV runs as a kh x 1 kernel over kw*cin channels (tiling.augmentable; only
    interior columns, so no padding masks)."""
    return augmentable(arch, job.cin, job.kw, job.sw)


def _augmented(job: ConvJob, w_offset: int) -> ConvJob:
    """`job` as the kh x 1 conv over kw*cin channels it is on augmented input (no left/right padding: only
    interior columns run augmented)."""
    t, _, b, _ = job.pads
    return replace(job, kw=1, sw=1, pads=(t, 0, b, 0), cin=job.kw * job.cin, w_offset=w_offset)


def _piece_cols(job: ConvJob, cg_in: int, wraps_c: int, a_slot: int, lc: int) -> int:
    """Widest conv piece (output columns) whose input window fits `a_slot` rows of every VB0 bank and the
    10-bit jump_read_endl."""
    in_c = min(FIELD10 // cg_in, max(0, a_slot) // (wraps_c * job.sh * cg_in))
    return min(lc, FIELD10, (in_c - job.kw) // job.sw + 1)


def _pool_pass_wraps(pp: int, s: int, kh: int, vp: int) -> int:
    """Most wraps (of PP*s rows) one consumer pass of vp rows can touch, whatever bank it starts at (for a CONV
    consumer this is its valid-row group check, isa1-semantics 3.3)."""
    return (pp - 1 + (s - 1 + (vp - 1) * s + kh - 1) // s) // pp + 1


def _window_of(graph: Graph, consumer: Op):
    """Window of the consumer of a conv_pool / pw_dw / windowed conv_conv group."""
    if consumer.type in ("depthwise_conv2d", "conv2d"):
        return xops.conv_window(consumer, graph)
    return xops.pool_window(consumer, graph)


def _chain_tile(arch: Arch, graph: Graph, conv: Op, consumer: Op, vmax: int, cg_out: int,
                wrows_extra: int) -> _ChainTile | None:
    """Tile of conv -> window consumer, or None. The consumer's output is cut into strips of `lp` columns (full
    height); per strip the conv computes its rows once, top to bottom, into a circular buffer of `wraps` wraps in
    VB1 laid out for the consumer's row fetch (only the strip's halo columns are recomputed). Budget: all conv
    weights resident plus `wrows_extra` CONVW rows (the consumer's); VB1 holds the circular window only; each half
    of VB0 holds one conv input window (a piece of at most `la` conv columns: a strip may need several) and one
    consumer output slot of lp pixels x cg_out rows. The consumer does up to `vmax` rows per instruction. The
    widest strip wins (fewest halo columns, fewest consumer instructions)."""
    if arch.icp != arch.ocp or not fusable(arch, graph, conv):
        return None
    win = _window_of(graph, consumer)
    if win.pads[0] > 15 or win.pads[1] > 15 or win.sh > 8:  # 4-bit pads; CONV 3-bit stride_offset_out
        return None
    jc = _probe(arch, graph, conv)
    cg_in, cg_mid = ceil_div(jc.cin, arch.icp), ceil_div(jc.cout, arch.ocp)
    aug = _augmentable(arch, jc)
    ja = _augmented(jc, 0) if aug else None
    cg_aug = ceil_div(ja.cin, arch.icp) if aug else 0
    wrows_a = jc.kh * jc.kw * cg_in + (jc.kh * cg_aug if aug else 0)  # augmented weights next to the plain ones
    if wrows_a * cg_mid + wrows_extra > arch.bank_depth or cg_mid + cg_out > arch.bank_depth:
        return None
    half, pp, depth = arch.bank_depth // 2, arch.pp, arch.bank_depth
    try:
        vc = max_valid_rows(pp, pp, jc.kh, jc.sh)
    except CodegenError:
        return None
    vp = vmax
    while vp >= 1 and _pool_pass_wraps(pp, win.sh, win.kh, vp) > 4:
        vp -= 1
    if vp < 1:
        return None
    need = _pool_pass_wraps(pp, win.sh, win.kh, vp) + 1  # the wraps a pass reads + the one the conv fills
    wraps_c = (((vc - 1) * jc.sh + jc.kh - 1) // jc.sh) // pp + 1
    wc = graph.tensors[conv.outputs[0]].shape[3]
    wp = graph.tensors[consumer.outputs[0]].shape[3]
    for n_cols in range(1, wp + 1):
        lp = ceil_div(wp, n_cols)
        in_p = (lp - 1) * win.sw + win.kw
        e, lc = in_p * cg_mid, min(in_p, wc)
        if lp > _ALU_LENGTH or lp > FIELD10 or e > FIELD10:
            continue
        a_slot = half - lp * cg_out
        la = _piece_cols(jc, cg_in, wraps_c, a_slot, lc)
        la_aug = _piece_cols(ja, cg_aug, wraps_c, a_slot, lc) if aug else 0
        wraps = depth // (win.sh * e)
        if la >= 1 and wraps >= need and (la_aug >= 1 or not aug):
            return _ChainTile(vc, vp, lp, wraps, la, a_slot, la_aug)
    return None


def _conv_pool_tile(arch: Arch, graph: Graph, conv: Op, pool: Op) -> _ChainTile | None:
    """Tile of conv -> ALU window op (max/avg pool, or depthwise conv for pw_dw), or None (_chain_tile; the
    depthwise weights in DWCONVW, its biases after the conv's)."""
    if pool.type not in ("max_pool2d", "avg_pool2d", "depthwise_conv2d"):
        return None
    if pool.type == "avg_pool2d" and xops.attr(pool, "global"):
        return None
    cg_mid = ceil_div(graph.tensors[conv.outputs[0]].shape[1], arch.ocp)
    if pool.type == "depthwise_conv2d":
        win = xops.conv_window(pool, graph)
        if (tuple(xops.attr(pool, "dilations")) != (1, 1) or win.kh * win.kw * cg_mid > arch.bank_depth
                or graph.tensors[pool.outputs[0]].shape[1] != graph.tensors[conv.outputs[0]].shape[1]):
            return None
    return _chain_tile(arch, graph, conv, pool, arch.alu_pp, cg_mid, 0)


def conv_pool_fits(arch: Arch, graph: Graph, conv: Op, pool: Op) -> bool:
    """Whether conv -> pool (or pointwise conv -> depthwise conv, template pw_dw) fits emit_conv_pool."""
    return _conv_pool_tile(arch, graph, conv, pool) is not None


def _conv_window_tile(arch: Arch, graph: Graph, a: Op, b: Op) -> _ChainTile | None:
    """Tile of conv -> windowed conv (B not pointwise), or None (_chain_tile with B's weights resident after
    A's and B doing up to PP rows per CONV)."""
    if b.type != "conv2d" or not fusable(arch, graph, b) or _is_pointwise(graph, b):
        return None
    jb = _probe(arch, graph, b)
    cg_out = ceil_div(jb.cout, arch.ocp)
    return _chain_tile(arch, graph, a, b, arch.pp, cg_out, jb.kh * jb.kw * ceil_div(jb.cin, arch.icp) * cg_out)


def conv_window_fits(arch: Arch, graph: Graph, a: Op, b: Op) -> bool:
    """Whether conv -> windowed conv fits emit_conv_window."""
    return _conv_window_tile(arch, graph, a, b) is not None


def conv_conv_fits(arch: Arch, graph: Graph, a: Op, b: Op) -> bool:
    """Whether a conv_conv group has a fused emitter: emit_conv_pw (pointwise B) or emit_conv_window."""
    return conv_pw_fits(arch, graph, a, b) or conv_window_fits(arch, graph, a, b)


def emit_conv_conv(prog: Program, arch: Arch, graph: Graph, a: Op, b: Op, fmaps: dict[str, FMap],
                   params: ParamBlob) -> None:
    """A conv_conv group: pointwise B through VB1 tiles (emit_conv_pw), else B's windows from a circular buffer."""
    if _is_pointwise(graph, b):
        emit_conv_pw(prog, arch, graph, a, b, fmaps, params)
    else:
        emit_conv_window(prog, arch, graph, a, b, fmaps, params)


@dataclass(frozen=True)
class _Pass:
    """One consumer instruction's rows of a strip, as the row-fetch rule addresses them in the circular buffer."""
    j0: int  # first consumer output row
    v: int  # consumer output rows
    q0: int  # first consumer output column (of the strip)
    m: int  # fetched row of the first input row // stride: its bank is m % PP
    s0: int  # stride_offset_in
    a: tuple[int, int, int, int]  # base address of each wrap it reads (bank_addr_in .. _3)
    reads: tuple  # the circular-buffer wraps it reads (dependency tags)
    p_top: int  # rows of top padding
    p_bottom: int  # rows of bottom padding (below the conv's last row)
    p_left: int
    p_right: int
    length: int
    e: int  # jump_read_endl: the line pitch of the buffer (strip input columns x cg_mid)


def _load_chain_conv(prog: Program, arch: Arch, graph: Graph, conv: Op, job: ConvJob, tile: _ChainTile,
                     x: FMap, params: ParamBlob) -> tuple[ConvJob | None, int]:
    """LOAD the chain conv's weights and biases (from CONVW row 0, BIAS row 0), plus its augmented weights after
    them when the tile runs it augmented and its input's pixels are packed (pixel pitch = cin: consecutive pixels
    are consecutive bytes). Returns the augmented job (or None) and the first free CONVW row."""
    cg_mid = ceil_div(job.cout, arch.ocp)
    _load_params(prog, arch, job, 0, cg_mid)
    rows = cg_mid * job.kh * job.kw * ceil_div(job.cin, arch.icp)
    if not tile.la_aug or x.pixel_pitch != job.cin:
        return None, rows
    w = graph.param(conv, "weights").data
    ja = _augmented(job, params.add(pack_conv_weights(augmented_weights(w), arch.icp, arch.ocp)))
    _load_params(prog, arch, ja, 0, cg_mid, rows, with_bias=False)
    return ja, rows + cg_mid * ja.kh * ceil_div(ja.cin, arch.icp)


def _plain_rows(arch: Arch, job: ConvJob) -> int:
    """CONVW rows of all output-channel groups of `job` (where the augmented weights start)."""
    return ceil_div(job.cout, arch.ocp) * job.kh * job.kw * ceil_div(job.cin, arch.icp)


def _conv_segments(job: ConvJob, w_in: int, c_lo: int, c_hi: int, augment: bool) -> list[tuple[int, int, bool]]:
    """[c0, c1) column ranges of the conv's output columns [c_lo, c_hi), and whether each runs augmented: only
    columns whose kernel row lies inside the image do (an augmented LOAD item cannot start left of a row's first
    pixel, and the edge columns need no mask fields)."""
    if not augment:
        return [(c_lo, c_hi, False)]
    a0 = ceil_div(job.pads[1], job.sw)
    a1 = max(a0, (w_in - job.kw + job.pads[1]) // job.sw + 1)
    cuts = sorted({c_lo, c_hi, min(max(a0, c_lo), c_hi), min(max(a1, c_lo), c_hi)})
    return [(c0, c1, a0 <= c0 and c1 <= a1) for c0, c1 in zip(cuts, cuts[1:]) if c1 > c0]


def _emit_chain(prog: Program, arch: Arch, graph: Graph, conv: Op, consumer: Op, tile: _ChainTile, job: ConvJob,
                cg_out: int, fmaps: dict[str, FMap], emit_pass, aug: tuple[ConvJob, int] | None = None) -> None:
    """The conv side of conv -> window consumer, per strip of consumer output columns. Conv output row u of the
    strip is "fetched row" u of the consumer's row-fetch layout (bank (u//S) % PP, wrap (u//S)//PP, S = the
    consumer's stride_h); wraps live in a circular buffer of VB1 whose per-wrap base addresses the consumer takes
    explicitly (bank_addr_in..._3). The CONVs (never crossing a wrap, so the row-store rule with stride_out = S,
    stride_offset_out = u % S and jump_write_endl = the line pitch places every row) compute each conv row once;
    as soon as the rows of a pass of vp consumer rows are in, `emit_pass(pass, out_addr, oslot)` emits the
    consumer's instruction(s) writing output slot `oslot` at VB0 row `out_addr` and the SAVEs. The conv's output
    never touches DDR; only the strip's halo columns are computed twice. `aug` = (augmented job, its first CONVW
    row) runs the interior columns channel-augmented (_augmentable)."""
    win = _window_of(graph, consumer)
    half, pp, sp = arch.bank_depth // 2, arch.pp, win.sh
    cg_mid = ceil_div(job.cout, arch.ocp)
    x, y = fmaps[conv.inputs[0]], fmaps[consumer.outputs[0]]
    _, _, hc, wc = graph.tensors[conv.outputs[0]].shape
    pt, pleft = win.pads[0], win.pads[1]
    cbuf, oslot = 0, 0
    for q0, length in split_even(y.w, tile.lp):
        in_p = (length - 1) * win.sw + win.kw
        e = in_p * cg_mid
        slot_rows = sp * e  # rows of one wrap in every bank
        wrap_addr = lambda w: (w % tile.wraps) * slot_rows
        x0 = q0 * win.sw - pleft
        c_lo, c_hi = max(0, x0), min(wc, x0 + in_p)
        p_left, p_right = max(0, -x0), max(0, x0 + in_p - wc)
        passes = [(j0, min(tile.vp, y.h - j0)) for j0 in range(0, y.h, tile.vp)]
        nxt = 0  # first pass not yet emitted

        def emit_ready(done: int) -> None:
            """The consumer passes whose conv rows [.., done) are all computed."""
            nonlocal nxt, oslot
            while nxt < len(passes):
                j0, v = passes[nxt]
                u0 = j0 * sp - pt
                n_fetch = (v - 1) * sp + win.kh
                if min(hc, u0 + n_fetch) > done:
                    return
                m, s0 = divmod(u0, sp)
                w0 = m // pp  # floor: a pass starting in the top padding begins in wrap -1 (rows masked)
                top_w = (min(hc, u0 + n_fetch) - 1) // sp // pp
                a = tuple(wrap_addr(w0 + g) for g in range(4))
                reads = tuple(("vb1", "win", w % tile.wraps) for w in range(max(0, w0), top_w + 1))
                ps = _Pass(j0, v, q0, m, s0, a, reads, max(0, -u0), max(0, u0 + n_fetch - hc), p_left, p_right,
                           length, e)
                emit_pass(ps, oslot * half + tile.a_slot, oslot)
                oslot ^= 1
                nxt += 1

        u = 0
        while u < hc:
            m, t0 = divmod(u, sp)
            w = m // pp
            nv = min(tile.vc, hc - u, (w + 1) * pp * sp - u)  # stay within wrap w
            if nxt < len(passes) and w - tile.wraps >= (max(0, passes[nxt][0] * sp - pt) // sp) // pp:
                raise CodegenError(f"ops {conv.name!r}+{consumer.name!r}: window buffer of {tile.wraps} wraps "
                                   f"overrun")  # the fit check's `need` rules this out
            for c0, c1, on in _conv_segments(job, x.w, c_lo, c_hi, aug is not None):
                for pc0, pl in split_even(c1 - c0, tile.la_aug if on else tile.la):
                    piece = _Piece(u, nv, c0 + pc0, pl, wrap_addr(w) + (c0 + pc0 - x0) * cg_mid, t0, m % pp,
                                   w % tile.wraps)
                    if on:
                        _emit_augmented_piece(prog, arch, x, conv.inputs[0], aug, cbuf, e, sp, piece, job)
                    else:
                        _emit_conv_piece(prog, arch, x, conv.inputs[0], job, cbuf, e, sp, piece)
                    cbuf ^= 1
            u += nv
            emit_ready(u)
        emit_ready(hc)


@dataclass(frozen=True)
class _Piece:
    """Conv rows [u, u+nv) x columns [c, c+pl) of a chain, written into the circular buffer."""
    u: int
    nv: int
    c: int
    pl: int
    out0: int  # buffer row of column c (output channel group 0)
    t0: int  # stride_offset_out: u mod the consumer's stride
    bank: int  # first VB1 bank written
    wrap: int  # buffer wrap written (dependency tag)


def _emit_conv_piece(prog: Program, arch: Arch, x: FMap, x_res: str, job: ConvJob, cbuf: int, e: int, sp: int,
                     piece: _Piece) -> None:
    """One conv piece of a chain: its input window LOADed into half `cbuf` of VB0, one CONV per output-channel
    group writing `nv` rows x `pl` columns into the circular buffer with the row-store rule (stride_out = the
    consumer's stride sp, line pitch e)."""
    cg_in = ceil_div(job.cin, arch.icp)
    ct = WindowTile.of(arch.pp, job.kh, job.kw, job.sh, job.sw, job.pads, piece.u, piece.nv, piece.c, piece.pl, cg_in,
                       cbuf * (arch.bank_depth // 2))
    ct.emit_loads(prog, arch.bank_group("VB0").base_id, arch.bank_depth, x, x_res, 0, job.cin, ("vb0", cbuf))
    pad_top, pad_left, pad_bottom, pad_right = ct.pads(x)
    _emit_piece_convs(prog, arch, job, cbuf, e, sp, piece, ct, (pad_top, pad_left, pad_bottom, pad_right), 0)


def _emit_augmented_piece(prog: Program, arch: Arch, x: FMap, x_res: str, aug: tuple[ConvJob, int], cbuf: int,
                          e: int, sp: int, piece: _Piece, job: ConvJob) -> None:
    """An interior conv piece run channel-augmented: per fetched row one LOAD of `pl` overlapping items of
    kw*cin bytes, sw*cin bytes apart (output column c's kernel row), then kh x 1 CONVs over kw*cin channels."""
    ja, wrow0 = aug
    u, nv, c, pl = piece.u, piece.nv, piece.c, piece.pl
    depth, half = arch.bank_depth, arch.bank_depth // 2
    vb0 = arch.bank_group("VB0").base_id
    cg = ceil_div(ja.cin, arch.icp)
    ct = WindowTile.of(arch.pp, ja.kh, 1, ja.sh, 1, ja.pads, u, nv, c, pl, cg, cbuf * half)
    for h in range(ct.n_rows):
        yy = ct.y0 + h
        if not 0 <= yy < x.h:
            continue  # padding rows: masked by the CONV's pad_top / pad_bottom
        bank, row0 = ct.place.where(h)
        prog.emit("LOAD", reads=(("ddr", x_res),), writes=(("vb0", cbuf),), bank_id=vb0 + bank,
                  bank_addr=row0 % depth, length=pl, channel=ja.cin, jump_read=job.sw * x.pixel_pitch,
                  jump_write=ct.place.pitch, reg_id=x.reg_id, ddr_addr=x.addr(yy, c * job.sw - job.pads[1], 0))
    pad_top, _, pad_bottom, _ = ct.pads(x)
    _emit_piece_convs(prog, arch, ja, cbuf, e, sp, piece, ct, (pad_top, 0, pad_bottom, 0), wrow0)


def _emit_piece_convs(prog: Program, arch: Arch, job: ConvJob, cbuf: int, e: int, sp: int, piece: _Piece,
                      ct: WindowTile, pads: tuple[int, int, int, int], wrow0: int) -> None:
    """CONVINIT + one CONV per output-channel group of a chain conv piece (weights from CONVW row wrow0)."""
    nv, pl, out0, t0, bank, wrap = piece.nv, piece.pl, piece.out0, piece.t0, piece.bank, piece.wrap
    cp, depth = arch.icp, arch.bank_depth
    vb0, vb1 = arch.bank_group("VB0").base_id, arch.bank_group("VB1").base_id
    cg_in, cg_mid = ceil_div(job.cin, cp), ceil_div(job.cout, arch.ocp)
    wrows = job.kh * job.kw * cg_in
    pad_top, pad_left, pad_bottom, pad_right = pads
    ia = [r % depth for r in ct.place.bases()]
    prog.emit("CONVINIT", act_type=job.act_type, shift_cut=job.shift_cut, shift_bias=job.shift_bias,
              jump_read=cg_in, jump_read_endl=ct.place.endl, stride_out=sp, jump_write=cg_mid, jump_write_endl=e,
              stride_h=job.sh, kernel_h=job.kh, valid_pixel_parallel=nv, stride_offset_in=0, stride_w=job.sw,
              kernel_w=job.kw, stride_offset_out=t0)
    for gl in range(cg_mid):
        prog.emit("CONV", reads=(("vb0", cbuf), ("convw",), ("bias",)), writes=(("vb1", "win", wrap),),
                  pad_left=pad_left, pad_top=pad_top, bank_addr_in=ia[0], channel_group=cg_in,
                  pad_right=job.kw - 1 - pad_right, pad_bottom=job.kh - 1 - pad_bottom, bank_addr_out=out0 + gl,
                  length=pl, bank_id_in=vb0, bank_addr_weights=wrow0 + gl * wrows, bank_addr_in_1=ia[1],
                  bank_id_out=vb1 + bank, bank_addr_bias=gl, channel_offset=cg_in * cp - job.cin,
                  bank_addr_in_3=ia[3], bank_addr_in_2=ia[2])


def _emit_saves(prog: Program, arch: Arch, y: FMap, tensor: str, ps: _Pass, ob: int, cout: int, cg_out: int,
                oslot: int) -> None:
    """SAVE a consumer pass's output slot (v rows in consecutive VB0 banks from `ob`) to `tensor`."""
    vb0 = arch.bank_group("VB0").base_id
    for r in range(ps.v):
        prog.emit("SAVE", reads=(("vb0", "out", oslot),), writes=(("ddr", tensor),), bank_id=vb0 + r,
                  bank_addr=ob, length=ps.length, channel=cout, jump_read=cg_out, jump_write=y.pixel_pitch,
                  reg_id=y.reg_id, ddr_addr=y.addr(ps.j0 + r, ps.q0, 0))


def emit_conv_pool(prog: Program, arch: Arch, graph: Graph, conv: Op, pool: Op, fmaps: dict[str, FMap],
                   params: ParamBlob) -> None:
    """conv -> max/avg pool (or depthwise conv) per strip of pool output columns (_emit_chain): as soon as the
    conv rows of a pass of vp pool rows are in the circular buffer, one ALU pools them and SAVEs write the
    result."""
    from tvm_dpu.codegen.alu import ALU_MODES

    tile = _conv_pool_tile(arch, graph, conv, pool)
    if tile is None:
        raise CodegenError(f"ops {conv.name!r}+{pool.name!r}: conv+pool fusion does not fit {arch.name}")
    job = conv_job(arch, graph, conv, params)
    qp = xops.quant_params(pool, graph)
    win = _window_of(graph, pool)
    mode = {"max_pool2d": "maxpool", "avg_pool2d": "avgpool", "depthwise_conv2d": "dwconv"}[pool.type]
    cp = arch.icp
    cg_mid = ceil_div(job.cout, arch.ocp)
    ja, _ = _load_chain_conv(prog, arch, graph, conv, job, tile, fmaps[conv.inputs[0]], params)
    alu_reads: tuple = ()
    if mode == "dwconv":  # depthwise weights in DWCONVW, biases after the conv's in BIAS
        from tvm_dpu.codegen.layout import pack_dw_weights

        wd = graph.param(pool, "weights").data
        bd = graph.param(pool, "bias", required=False)
        bias_d = bd.data if bd is not None else np.zeros(job.cout, np.int8)
        wd_off = params.add(pack_dw_weights(wd, cp))
        bd_off = params.add(pack_channel_vector(bias_d, cp))
        prog.emit("LOAD", reads=(("ddr", "params"),), writes=(("dwconvw",),),
                  bank_id=arch.bank_group("DWCONVW").base_id, bank_addr=0, length=win.kh * win.kw,
                  channel=job.cout, jump_read=cg_mid * cp, jump_write=cg_mid, reg_id=REG_PARAMS, ddr_addr=wd_off)
        prog.emit("LOAD", reads=(("ddr", "params"),), writes=(("bias",),), bank_id=arch.bank_group("BIAS").base_id,
                  bank_addr=cg_mid, length=1, channel=job.cout, jump_read=job.cout, jump_write=cg_mid,
                  reg_id=REG_PARAMS, ddr_addr=bd_off)
        alu_reads = (("dwconvw",), ("bias",))
        alu_q = dict(act_type=qp.act_type, shift_bias=qp.shift_bias_isa, shift_cut=qp.shift_cut, multi_factor=0)
    else:
        alu_q = dict(act_type=0, shift_bias=0, shift_cut=qp.shift_cut,
                     multi_factor=qp.multi_factor if mode == "avgpool" else 0)
    vb0, vb1 = arch.bank_group("VB0").base_id, arch.bank_group("VB1").base_id
    y = fmaps[pool.outputs[0]]

    def emit_pass(ps: _Pass, ob: int, oslot: int) -> None:
        prog.emit("ALUINIT", exec_mode=ALU_MODES[mode], kernel_h=win.kh, kernel_w=win.kw, stride_h=win.sh,
                  stride_w=win.sw, stride_offset_in=ps.s0, stride_offset_out=0, stride_out=1, channel_group=cg_mid,
                  channel_offset=cg_mid * cp - job.cout, length=ps.length, shift_prelu_p=0, shift_prelu_n=0,
                  jump_read=cg_mid, jump_read_endl=ps.e, jump_read_weights=cg_mid, jump_write=cg_mid,
                  jump_write_endl=1, **alu_q)
        prog.emit("ALU", reads=ps.reads + alu_reads, writes=(("vb0", "out", oslot),), bank_id_out=vb0,
                  bank_addr_out=ob, pad_bottom=win.kh - 1 - ps.p_bottom, valid_pixel_parallel=ps.v,
                  bank_id_in=vb1 + ps.m % arch.pp, bank_addr_in=ps.a[0], pad_top=ps.p_top, pad_left=ps.p_left,
                  pad_right=win.kw - 1 - ps.p_right, bank_addr_in_1=ps.a[1], kernel_d=1, bank_addr_weights=0,
                  bank_addr_in_2=ps.a[2], bank_addr_bias=cg_mid, bank_addr_in_3=ps.a[3])
        _emit_saves(prog, arch, y, pool.outputs[0], ps, ob, job.cout, cg_mid, oslot)

    _emit_chain(prog, arch, graph, conv, pool, tile, job, cg_mid, fmaps, emit_pass, ja and (ja, _plain_rows(arch, job)))


def emit_conv_window(prog: Program, arch: Arch, graph: Graph, a: Op, b: Op, fmaps: dict[str, FMap],
                     params: ParamBlob) -> None:
    """conv A -> windowed conv B per strip of B's output columns (_emit_chain): A's rows go to the circular
    buffer in VB1 in B's row-fetch layout, and as soon as the rows of B's next vp output rows are in, B's CONVs
    (one per output-channel group, all weights resident after A's) read their kh-row windows from it, wrapping
    through bank_addr_in..._3, and write an output slot in VB1 that SAVEs write out. A's output never touches
    DDR."""
    tile = _conv_window_tile(arch, graph, a, b)
    if tile is None:
        raise CodegenError(f"ops {a.name!r}+{b.name!r}: conv+windowed conv fusion does not fit {arch.name}")
    ja, jb = conv_job(arch, graph, a, params), conv_job(arch, graph, b, params)
    cp = arch.icp
    cg_mid, cg_out = ceil_div(ja.cout, arch.ocp), ceil_div(jb.cout, arch.ocp)
    wrows_b = jb.kh * jb.kw * cg_mid
    j_aug, wrow_b = _load_chain_conv(prog, arch, graph, a, ja, tile, fmaps[a.inputs[0]], params)
    _load_params(prog, arch, jb, 0, cg_out, wrow_b, cg_mid)
    vb0, vb1 = arch.bank_group("VB0").base_id, arch.bank_group("VB1").base_id
    y = fmaps[b.outputs[0]]

    def emit_pass(ps: _Pass, ob: int, oslot: int) -> None:
        prog.emit("CONVINIT", act_type=jb.act_type, shift_cut=jb.shift_cut, shift_bias=jb.shift_bias,
                  jump_read=cg_mid, jump_read_endl=ps.e, stride_out=1, jump_write=cg_out, jump_write_endl=1,
                  stride_h=jb.sh, kernel_h=jb.kh, valid_pixel_parallel=ps.v, stride_offset_in=ps.s0,
                  stride_w=jb.sw, kernel_w=jb.kw, stride_offset_out=0)
        for gl in range(cg_out):
            prog.emit("CONV", reads=ps.reads + (("convw",), ("bias",)), writes=(("vb0", "out", oslot),),
                      pad_left=ps.p_left, pad_top=ps.p_top, bank_addr_in=ps.a[0], channel_group=cg_mid,
                      pad_right=jb.kw - 1 - ps.p_right, pad_bottom=jb.kh - 1 - ps.p_bottom, bank_addr_out=ob + gl,
                      length=ps.length, bank_id_in=vb1 + ps.m % arch.pp, bank_addr_weights=wrow_b + gl * wrows_b,
                      bank_id_out=vb0, bank_addr_bias=cg_mid + gl, channel_offset=cg_mid * cp - jb.cin,
                      bank_addr_in_1=ps.a[1], bank_addr_in_2=ps.a[2], bank_addr_in_3=ps.a[3])
        _emit_saves(prog, arch, y, b.outputs[0], ps, ob, jb.cout, cg_out, oslot)

    _emit_chain(prog, arch, graph, a, b, tile, ja, cg_out, fmaps, emit_pass, j_aug and (j_aug, _plain_rows(arch, ja)))
