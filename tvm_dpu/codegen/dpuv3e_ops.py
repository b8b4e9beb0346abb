"""Per-op lowering for the DPUV3E instruction set (DPUCAHX8H: Alveo U50 / U50LV / U280): the `isa_emitters` hooks
of the op registry (tvm_dpu/ops/) for "DPUV3E", each with the ISA1 emitters' signature
``fn(prog, arch, graph, op, fmaps, alias, params, variant)``.

Every op runs alone (no fused pipelines on this family yet): its tiles' inputs are LOADed from DDR into VB0, the
engine computes into VB1 and the SAVEs write the output back (dpuv3e_tiles). What each engine does is AMD's
simulator's (emulator/dpuv3e.py reads it): CONV with CONVINIT, its weights loaded 16 output channels at a time
through the two DDR ports (channels 0-7 from ddr_addr, 8-15 from ddr_addr_1, as vai_c's U50 programs load them);
POOL (max, average) and ELEW (add) on engines of their own with one output row each; depthwise convs on the
DPTWISE engine where the target has one (_DWC), on the CONV engine with one 16-channel diagonal block per channel
group otherwise; concat by producers saving into their slice, or a 1x1 max POOL that copies (and requantizes).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.compiler import emit_phases, phase_split
from tvm_dpu.codegen.dpuv3e_fields import SHIFT_BIAS_NEGATIVE, SHIFT_SPLIT, WEIGHT_LOAD_BANK, avg_table_exact
from tvm_dpu.codegen.dpuv3e_tiles import (MAX_ELEW_LENGTH, MAX_LENGTH, Banks, Window, addr_fields, cgroups,
                                          in_window, load_rows, load_window, pads_of, plan_tiles, save_tile)
from tvm_dpu.codegen.isa import enum_code
from tvm_dpu.codegen.layout import ParamBlob, group_param, pack_channel_vector, pack_dw_weights
from tvm_dpu.codegen.program import Program
from tvm_dpu.codegen.tiling import CodegenError
from tvm_dpu.quant.fixpoint import avgpool_factor
from tvm_dpu.types import REG_PARAMS, FMap
from tvm_dpu.xgraph import ops as xops
from tvm_dpu.xgraph.graph import Graph, Op


def scale_field(e: int, what: str) -> int:
    """The 4-bit POOL shift_cut / ELEW shift_write of a scale 2**e; CodegenError naming `what` beyond 2**+-7."""
    if 0 <= e < SHIFT_SPLIT:
        return e
    if -SHIFT_SPLIT < e < 0:
        return SHIFT_SPLIT - e
    raise CodegenError(f"{what}: scale 2**{e} is outside the DPUV3E field's 2**-7 .. 2**7")


def shift_bias_field(shift_bias: int) -> int:
    """CONVINIT / DWINIT shift_bias of a bias weighing 2**shift_bias accumulator units."""
    return shift_bias if shift_bias >= 0 else SHIFT_BIAS_NEGATIVE - shift_bias


def _engine(arch: Arch, name: str, what: str) -> dict:
    spec = arch.extra.get("engines", {}).get(name)
    if spec is None:
        raise CodegenError(f"{what}: {arch.target_label} has no {name} engine")
    return spec


@dataclass(frozen=True)
class ConvSpec:
    """One CONV-engine convolution: window, channels, where its packed parameters are, its requantization."""

    name: str
    win: Window
    cin: int
    cout: int
    w_off: int
    b_off: int
    act_type: int
    shift_cut: int
    shift_bias: int


def pack_ohwi(w: np.ndarray, icp: int, ocp: int) -> np.ndarray:
    """Conv weights (O, I, kh, kw) as vai_c's U50 programs lay them out: output channel after output channel, each
    kh x kw taps of I channels (zero padded to whole ICP groups), output channels padded to whole OCP groups, so
    channels 0..OCP/2-1 and OCP/2..OCP-1 of a group are two runs one weight LOAD reads through its two ports."""
    o, ci, kh, kw = w.shape
    buf = np.zeros((cgroups(o, ocp) * ocp, kh, kw, cgroups(ci, icp) * icp), np.int8)
    buf[:o, :, :, :ci] = np.asarray(w, np.int8).transpose(0, 2, 3, 1)
    return buf.reshape(-1)


def _weights(slot: int | None, k: int | None = None) -> tuple:
    """The CONVW resource of output-channel group `k`'s weights in half `slot` (None: the whole buffer; `k` None:
    the whole half): resident groups are parts of their half, so one loads while a CONV reads another."""
    return ("convw",) if slot is None else ("convw", slot) if k is None else ("convw", slot, k)


def _load_weights(prog: Program, arch: Arch, s: ConvSpec, k: int, bank_row: int, slot: int | None,
                  part: bool = False) -> None:
    cg_in = cgroups(s.cin, arch.icp)
    per_oc = s.win.kh * s.win.kw * cg_in * arch.icp
    n_oc = min(arch.ocp, s.cout - k * arch.ocp)
    ddr = s.w_off + k * arch.ocp * per_oc
    half = arch.ocp // 2
    prog.emit("LOAD", reads=[("ddr", "params")], writes=[_weights(slot, k if part else None)],
              comment=f"{s.name} weights {k}", bank_id=WEIGHT_LOAD_BANK, bank_addr=bank_row,
              length=s.win.kh * s.win.kw, channel=cg_in * arch.icp, jump_read=cg_in * arch.icp, jump_write=cg_in,
              jump_read_endl=per_oc, output_channel_num=n_oc, pad_idx=1, ddr_addr=ddr, reg_id=REG_PARAMS,
              ddr_addr_1=ddr + half * per_oc if n_oc > half else ddr, reg_id_1=REG_PARAMS)


def _load_vector(prog: Program, bank: int, row: int, off: int, nbytes: int, res: tuple, comment: str) -> None:
    prog.emit("LOAD", reads=[("ddr", "params")], writes=[res], comment=comment, bank_id=bank, bank_addr=row,
              length=1, channel=nbytes, jump_read=nbytes, jump_write=1, pad_idx=1, ddr_addr=off, reg_id=REG_PARAMS)


@dataclass(frozen=True)
class PoolAfter:
    """A max / average pool whose windows tile the conv's output (kernel == stride, no padding), run on each conv
    tile in the banks (vai_c's conv + pool kernel): the conv stores its rows S to a bank (CONVINIT stride_out),
    the pool reads them there and only its output is saved."""

    name: str
    win: Window
    pool_type: int
    shift_cut: int
    y: FMap
    y_name: str


def emit_conv_v3e(prog: Program, arch: Arch, s: ConvSpec, x: FMap, y: FMap, x_name: str, y_name: str,
                  pool: PoolAfter | None = None) -> None:
    """Tile by tile: LOAD the input window, then per group of OCP output channels (weights resident for the op
    when all fit half the weight banks, else loaded per tile into alternating halves) one CONV of PP rows; SAVE
    the tile, or pool each group as soon as its CONV is done (`pool`) and SAVE each pool row after its last
    group's POOL."""
    conv = _engine(arch, "conv", s.name)
    wb, bb = arch.bank_group(conv["weight_bank"]), arch.bank_group(conv["bias_bank"])
    banks = Banks.of(arch)
    cg_in, cg_out = cgroups(s.cin, arch.icp), cgroups(s.cout, arch.ocp)
    rows_w = s.win.kh * s.win.kw * cg_in
    if rows_w > wb.depth or cg_out > bb.depth // 2:
        raise CodegenError(f"op {s.name!r}: {s.win.kh}x{s.win.kw} taps of {s.cin} channels need {rows_w} weight "
                           f"rows per output-channel group ({wb.depth} on {arch.target_label}; an input-channel "
                           f"split is not implemented for DPUV3E)")
    # the program's first op: nothing runs while its weights load, so only group 0's load ahead of its first tile
    # and the others' just before their first CONV, loading while the CONV before computes; a later op's load
    # while the op before it computes
    defer = len(prog) == 0
    b_slot = prog.next_slot("bias")
    b_row = b_slot * (bb.depth // 2)
    _load_vector(prog, bb.base_id, b_row, s.b_off, cg_out * arch.ocp, ("bias", b_slot), f"{s.name} bias")
    half = wb.depth // 2
    resident = cg_out * rows_w <= half
    if resident:
        w_slot = prog.next_slot("convw")
        for k in range(1 if defer else cg_out):
            _load_weights(prog, arch, s, k, w_slot * half + k * rows_w, w_slot, part=True)
    what = f"op {s.name!r}"
    sh, sw = (pool.win.sh, pool.win.sw) if pool else (1, 1)
    # with a pool: whole pool windows per tile, the conv rows S to a bank and the pool's rows after them
    rows, out_rows = (arch.pp // sh * sh, cg_out * (sh + 1)) if pool else (arch.pp, cg_out)
    for n, t in enumerate(plan_tiles(prog, banks, s.win, y.h, y.w, cg_in, out_rows, rows, MAX_LENGTH, what,
                                     col_align=sw)):
        iw = in_window(banks, s.win, t, cg_in)
        load_window(prog, banks, s.win, t, iw, x, x_name, cg_in, s.name)
        prog.emit("CONVINIT", jump_read=cg_in, jump_read_endl=iw.endl, jump_write=cg_out,
                  jump_write_endl=t.cols * cg_out, stride_out=sh, kernel_h=s.win.kh, kernel_w=s.win.kw,
                  stride_h=s.win.sh, stride_w=s.win.sw, valid_pixel_parallel=t.rows, shift_cut=s.shift_cut,
                  shift_bias=s.shift_bias, act_type=s.act_type)
        for k in range(cg_out):
            if resident:
                slot, w_row = w_slot, w_slot * half + k * rows_w
                if defer and n == 0 and k > 0:
                    _load_weights(prog, arch, s, k, w_row, slot, part=True)
            else:
                slot = prog.next_slot("convw") if rows_w <= half else None
                w_row = 0 if slot is None else slot * half
                _load_weights(prog, arch, s, k, w_row, slot)
            prog.emit("CONV", reads=[("vb_in", t.in_half), _weights(slot, k if resident else None),
                                     ("bias", b_slot)], writes=[_out_group(t, k)], comment=s.name,
                      **addr_fields(banks, iw, 0), bank_id_out=banks.vb_out, bank_addr_out=banks.out_base(t) + k,
                      channel_group=cg_in, length=t.cols, channel_offset=cg_in * arch.icp - s.cin,
                      bank_addr_weights=w_row, bank_addr_bias=b_row + k, **pads_of(s.win, iw, x, 0, t.rows))
            if pool is not None:
                _pool_group(prog, banks, pool, t, cg_out, k)
        if pool is None:
            save_tile(prog, banks, t, y, y_name, cg_out, s.name)


def _out_group(t, k: int) -> tuple:
    """The resource of output-channel group `k` of tile `t`'s conv output in VB1 (a part of its half): the pool of
    one group reads it while the CONV of the next computes."""
    return ("vb_out", t.out_half, "g", k)


def _pool_span(banks: Banks, p: PoolAfter, t, cg: int) -> tuple[int, int, int, int, int]:
    """(conv rows' base, pool rows' base, conv row pitch, pool rows, pool columns) of conv tile `t` in VB1: its rows
    S to a bank, `t.cols * cg` rows each, the pool's rows after them, one pool row per bank; the pool rows and
    columns whose windows the tile holds whole."""
    sh, sw = p.win.sh, p.win.sw
    endl = t.cols * cg
    return (banks.out_base(t), banks.out_base(t) + sh * endl, endl, min(t.rows // sh, p.y.h - t.r0 // sh),
            min(t.cols // sw, p.y.w - t.c0 // sw))


def _pool_group(prog: Program, banks: Banks, p: PoolAfter, t, cg: int, k: int) -> None:
    """POOL output-channel group `k` of a conv tile in VB1 as soon as its CONV is done (`_pool_span`): one channel
    group from row k of each pixel's `cg`, so the pool of a group overlaps the CONV of the next and only the last
    group's pool follows the tile's last CONV; after the last group's POOL of a row, that row's SAVE."""
    base, dst, endl, rows, cols = _pool_span(banks, p, t, cg)
    prog.emit("POOLINIT", jump_read=cg, jump_write=cg, kernel_h=p.win.kh, kernel_w=p.win.kw, stride_h=p.win.sh,
              stride_w=p.win.sw, shift_cut=p.shift_cut, pool_type=p.pool_type, valid_pixel_parallel=1, stride_out=1)
    for j in range(rows):
        res = ("vb_out", t.out_half, "pool", j)
        prog.emit("POOL", reads=[_out_group(t, k)], writes=[res], comment=p.name,
                  bank_id_in=banks.vb_out + j, bank_addr_in=base + k, bank_addr_in_1=base + k,
                  bank_addr_in_2=base + k, bank_addr_in_3=base + k, bank_id_out=banks.vb_out + j,
                  bank_addr_out=dst + k, jump_read_endl=endl, jump_write_endl=1, length=cols, channel_group=1,
                  pad_top=0, pad_left=0, pad_bottom=p.win.kh - 1, pad_right=p.win.kw - 1)
        if k == cg - 1:
            y = t.r0 // p.win.sh + j
            prog.emit("SAVE", reads=[res], writes=[("ddr", p.y_name)], comment=p.name, bank_id=banks.vb_out + j,
                      bank_addr=dst, length=cols, channel=p.y.c, jump_read=cg, jump_write=p.y.pixel_pitch,
                      ddr_addr=p.y.addr(y, t.c0 // p.win.sw), reg_id=p.y.reg_id)


def fusable_pool(conv: Op, pool: Op, graph: Graph) -> bool:
    """Whether `pool` can run on `conv`'s tiles in the banks (emit_conv_pool): an ordinary conv2d whose output only
    `pool` reads, a max pool (or an exactly dividing average pool) whose windows tile it, at most PP rows tall."""
    if conv.type != "conv2d" or int(xops.attr(conv, "groups")) != 1 or xops.conv_input_slice(conv, graph) \
            or pool.type not in ("max_pool2d", "avg_pool2d") or pool.inputs != [conv.outputs[0]]:
        return False
    cw, pw = xops.conv_window(conv, graph), xops.pool_window(pool, graph)
    return (cw.dh, cw.dw) == (1, 1) and (pw.kh, pw.kw) == (pw.sh, pw.sw) and not any(pw.pads) and pw.kh <= 8 \
        and (pool.type == "max_pool2d" or avg_table_exact(pw.kh, pw.kw))


def emit_conv_pool(prog: Program, arch: Arch, graph: Graph, conv: Op, pool: Op, fmaps: dict[str, FMap],
                   params: ParamBlob) -> None:
    """conv2d then a pool that `fusable_pool` accepts, the conv's output never leaving the banks."""
    w = graph.param(conv, "weights").data
    spec = _conv_spec(conv, graph, params, arch, w, _bias(graph, conv, w.shape[0]),
                      _window(xops.conv_window(conv, graph)))
    pw = xops.pool_window(pool, graph)
    kind, e = _pool_scale(pool, graph, pw)
    y = graph.tensors[conv.outputs[0]].shape  # the conv's output: only its geometry (it gets no DDR place)
    after = PoolAfter(pool.name, Window(pw.kh, pw.kw, pw.sh, pw.sw), kind, scale_field(e, f"op {pool.name!r}"),
                      fmaps[pool.outputs[0]], pool.outputs[0])
    emit_conv_v3e(prog, arch, spec, fmaps[conv.inputs[0]], FMap.dense(0, 0, y[2], y[3], y[1]), conv.inputs[0],
                  conv.outputs[0], after)


def _conv_spec(op: Op, graph: Graph, params: ParamBlob, arch: Arch, w: np.ndarray, bias: np.ndarray,
               win: Window, tag: str = "") -> ConvSpec:
    q = xops.quant_params(op, graph)
    w_off = params.add(pack_ohwi(w, arch.icp, arch.ocp), op.params["weights"] if not tag else "")
    b_off = params.add(pack_channel_vector(bias, arch.ocp), op.params.get("bias", "") if not tag else "")
    return ConvSpec(op.name + tag, win, w.shape[1], w.shape[0], w_off, b_off, q.act_type, q.shift_cut,
                    shift_bias_field(q.shift_bias))


def _bias(graph: Graph, op: Op, n: int) -> np.ndarray:
    b = graph.param(op, "bias", required=False)
    return b.data if b is not None else np.zeros(n, np.int8)


def _window(win) -> Window:
    if (win.dh, win.dw) != (1, 1):
        raise CodegenError("dilated depthwise convolution is not supported by the DPUV3E code generator")
    return Window(win.kh, win.kw, win.sh, win.sw, pads=tuple(win.pads))


def emit_conv(prog: Program, arch: Arch, graph: Graph, op: Op, fmaps: dict[str, FMap],
              alias: dict[str, tuple[str, int]], params: ParamBlob, variant: str = "wide") -> None:
    """conv2d (grouped: one conv per group on channel slices, as the ISA1 emitter does) and dense on CONV;
    depthwise_conv2d on DPTWISE or, without that engine, as diagonal 16-channel convs."""
    if xops.is_depthwise(op, graph):
        if "dwconv" in arch.extra.get("engines", {}):
            return _emit_dptwise(prog, arch, graph, op, fmaps, params)
        return _emit_dw_as_conv(prog, arch, graph, op, fmaps, params)
    if op.type == "conv2d_transpose" and int(xops.attr(op, "groups")) != 1:
        raise CodegenError("grouped transposed conv is not supported by the DPUV3E code generator")
    x, y = fmaps[op.inputs[0]], fmaps[op.outputs[0]]
    part = xops.conv_input_slice(op, graph)
    if part is not None:
        x = x.channels(*part)
    w = graph.param(op, "weights").data
    if op.type == "dense":
        w = w.reshape(xops.dense_weights_shape(op, graph))
    elif op.type == "conv2d_transpose":
        w = w.transpose(1, 0, 2, 3)  # (I, O, kh, kw) -> (O, I, kh, kw)
    groups = int(xops.attr(op, "groups")) if op.type != "dense" else 1
    bias = _bias(graph, op, w.shape[0])
    icg, ocg = w.shape[1], w.shape[0] // groups
    for g in range(groups):
        xg, yg = (x, y) if groups == 1 else (x.channels(g * icg, icg), y.channels(g * ocg, ocg))
        sl = slice(g * ocg, (g + 1) * ocg)
        phases = None if op.type == "dense" else phase_split(op, graph, xg, yg, w[sl])
        if phases is not None:  # transposed or dilated: stride phases of ordinary convs (as on DPUCZDX8G)
            _emit_conv_phases(prog, arch, graph, op, phases, w[sl], bias[sl], params)
            continue
        win = _window(xops.conv_window(op, graph))
        spec = _conv_spec(op, graph, params, arch, w[sl], bias[sl], win, "" if groups == 1 else f"/g{g}")
        if groups != 1:  # for the xmodel writer: each group's slices (the whole tensors have no one place)
            params.offsets[group_param(op.params["weights"], g)] = spec.w_off
            if "bias" in op.params:
                params.offsets[group_param(op.params["bias"], g)] = spec.b_off
        emit_conv_v3e(prog, arch, spec, xg, yg, op.inputs[0], op.outputs[0])


def _emit_conv_phases(prog: Program, arch: Arch, graph: Graph, op: Op, phases, w: np.ndarray, bias: np.ndarray,
                      params: ParamBlob) -> None:
    """The phase convs of a transposed or dilated conv (compiler.emit_phases: the DPUCZDX8G decomposition) on
    CONV, with the op's bias and requantization."""
    q = xops.quant_params(op, graph)
    b_off = params.add(pack_channel_vector(bias, arch.ocp), op.params.get("bias", ""))

    def job(wt: np.ndarray, w_off: int, strides: tuple[int, int], pads: tuple[int, int, int, int]) -> ConvSpec:
        win = Window(wt.shape[2], wt.shape[3], strides[0], strides[1], pads=tuple(pads))
        return ConvSpec(op.name, win, wt.shape[1], wt.shape[0], w_off, b_off, q.act_type, q.shift_cut,
                        shift_bias_field(q.shift_bias))

    emit_phases(prog, arch, op, phases, w, params, lambda wt: pack_ohwi(wt, arch.icp, arch.ocp), job, emit_conv_v3e,
                zero_channels=1)


def _emit_dw_as_conv(prog: Program, arch: Arch, graph: Graph, op: Op, fmaps: dict[str, FMap],
                     params: ParamBlob) -> None:
    """Depthwise conv on the CONV engine: channel group g is a conv of its <= ICP channels whose weights are zero
    off the diagonal (the same products and sums as the depthwise op, so the same integers)."""
    x, y = fmaps[op.inputs[0]], fmaps[op.outputs[0]]
    w = graph.param(op, "weights").data  # (C, 1, kh, kw)
    bias = _bias(graph, op, w.shape[0])
    win = _window(xops.conv_window(op, graph))
    c = w.shape[0]
    for c0 in range(0, c, arch.icp):
        n = min(arch.icp, c - c0)
        diag = np.zeros((n, n) + w.shape[2:], np.int8)
        diag[np.arange(n), np.arange(n)] = w[c0:c0 + n, 0]
        spec = _conv_spec(op, graph, params, arch, diag, bias[c0:c0 + n], win, f"/c{c0}")
        emit_conv_v3e(prog, arch, spec, x.channels(c0, n), y.channels(c0, n), op.inputs[0], op.outputs[0])


def _emit_dptwise(prog: Program, arch: Arch, graph: Graph, op: Op, fmaps: dict[str, FMap],
                  params: ParamBlob) -> None:
    """Depthwise conv on the DPTWISE engine (_DWC): weights [kh][kw][cg*CP] in the DWCONVW bank and biases in
    DWCONVB (halves alternating between ops), one DPTWISE per engine-PP output rows of a tile."""
    dw = _engine(arch, "dwconv", op.name)
    wb, bb = arch.bank_group(dw["weight_bank"]), arch.bank_group(dw["bias_bank"])
    x, y = fmaps[op.inputs[0]], fmaps[op.outputs[0]]
    w = graph.param(op, "weights").data
    c, cp = w.shape[0], dw["cp"]
    cg = cgroups(c, cp)
    win = _window(xops.conv_window(op, graph))
    q = xops.quant_params(op, graph)
    rows_w = win.kh * win.kw * cg
    if rows_w > wb.depth or cg > bb.depth // 2:
        raise CodegenError(f"op {op.name!r}: {c} channels of a {win.kh}x{win.kw} depthwise kernel do not fit the "
                           f"{wb.name} / {bb.name} banks of {arch.target_label}")
    # weights in alternating halves of DWCONVW while they fit one (the next op's load overlaps this one's work)
    w_slot = prog.next_slot("dwconvw") if rows_w <= wb.depth // 2 else None
    b_slot = prog.next_slot("dwconvb")
    w_row, b_row = (w_slot or 0) * (wb.depth // 2), b_slot * (bb.depth // 2)
    w_res = ("dww",) if w_slot is None else ("dww", w_slot)
    prog.emit("LOAD", reads=[("ddr", "params")], writes=[w_res], comment=f"{op.name} weights",
              bank_id=wb.base_id, bank_addr=w_row, length=win.kh * win.kw, channel=cg * cp, jump_read=cg * cp,
              jump_write=cg, pad_idx=1, ddr_addr=params.add(pack_dw_weights(w, cp), op.params["weights"]),
              reg_id=REG_PARAMS)
    b_off = params.add(pack_channel_vector(_bias(graph, op, c), cp), op.params.get("bias", ""))
    _load_vector(prog, bb.base_id, b_row, b_off, cg * cp, ("dwb", b_slot), f"{op.name} bias")
    banks = Banks.of(arch)
    for t in plan_tiles(prog, banks, win, y.h, y.w, cg, cg, arch.pp, MAX_LENGTH, f"op {op.name!r}"):
        iw = in_window(banks, win, t, cg)
        load_window(prog, banks, win, t, iw, x, op.inputs[0], cg, op.name)
        for a in range(0, t.rows, dw["pp"]):
            v = min(dw["pp"], t.rows - a)
            prog.emit("DWINIT", jump_read=cg, jump_read_endl=iw.endl, jump_write=cg, jump_write_endl=1,
                      stride_out=1, kernel_h=win.kh, kernel_w=win.kw, stride_h=win.sh, stride_w=win.sw,
                      valid_pixel_parallel=v, shift_cut=q.shift_cut, shift_bias=shift_bias_field(q.shift_bias),
                      act_type=q.act_type)
            prog.emit("DPTWISE", reads=[("vb_in", t.in_half), w_res, ("dwb", b_slot)],
                      writes=[("vb_out", t.out_half)], comment=op.name, **addr_fields(banks, iw, a),
                      bank_id_out=banks.vb_out + a, bank_addr_out=banks.out_base(t), channel_group=cg,
                      length=t.cols, channel_offset=cg * cp - c, bank_addr_weights=w_row, bank_addr_bias=b_row,
                      **pads_of(win, iw, x, a, v))
        save_tile(prog, banks, t, y, y_name=op.outputs[0], cg_out=cg, comment=op.name)


def emit_window_pool(prog: Program, arch: Arch, name: str, win: Window, pool_type: int, shift_cut: int,
                     x: FMap, y: FMap, x_name: str, y_name: str) -> None:
    """POOLINIT, then per tile its LOADs, one POOL per output row (the pool engine's PP is 1) and the SAVEs."""
    pool = _engine(arch, "pool", name)
    cg = cgroups(x.c, pool["cp"])
    banks = Banks.of(arch)
    for t in plan_tiles(prog, banks, win, y.h, y.w, cg, cg, arch.pp, MAX_LENGTH, f"op {name!r}"):
        iw = in_window(banks, win, t, cg)
        load_window(prog, banks, win, t, iw, x, x_name, cg, name)
        prog.emit("POOLINIT", jump_read=cg, jump_write=cg, kernel_h=win.kh, kernel_w=win.kw, stride_h=win.sh,
                  stride_w=win.sw, shift_cut=shift_cut, pool_type=pool_type, valid_pixel_parallel=1, stride_out=1)
        for r in range(t.rows):
            prog.emit("POOL", reads=[("vb_in", t.in_half)], writes=[("vb_out", t.out_half)], comment=name,
                      **addr_fields(banks, iw, r), bank_id_out=banks.vb_out + r, bank_addr_out=banks.out_base(t),
                      jump_read_endl=iw.endl, jump_write_endl=1, length=t.cols, channel_group=cg,
                      **pads_of(win, iw, x, r, 1))
        save_tile(prog, banks, t, y, y_name, cg, name)


def emit_pool(prog: Program, arch: Arch, graph: Graph, op: Op, fmaps: dict[str, FMap],
              alias: dict[str, tuple[str, int]], params: ParamBlob, variant: str = "wide") -> None:
    """max_pool2d / avg_pool2d on the pool engine."""
    pw = xops.pool_window(op, graph)
    win = Window(pw.kh, pw.kw, pw.sh, pw.sw, pads=tuple(pw.pads))
    kind, e = _pool_scale(op, graph, pw)
    emit_window_pool(prog, arch, op.name, win, kind, scale_field(e, f"op {op.name!r}"), fmaps[op.inputs[0]],
                     fmaps[op.outputs[0]], op.inputs[0], op.outputs[0])


def _pool_scale(op: Op, graph: Graph, win) -> tuple[int, int]:
    """(POOLINIT pool_type, the exponent e of the 2**e scale) of a max / average pool."""
    q = xops.quant_params(op, graph)
    if op.type == "max_pool2d":
        return enum_code("pool_type", "maxpool"), q.exponent
    if not avg_table_exact(win.kh, win.kw):
        raise CodegenError(f"op {op.name!r}: a {win.kh}x{win.kw} average pool divides by another factor on DPUV3E "
                           f"than the DPU's reciprocal table (square 3, 5, 6, 7 or a power-of-two window)")
    return enum_code("pool_type", "avgpool"), q.exponent + avgpool_factor(win.kh, win.kw)[1]


def emit_eltwise(prog: Program, arch: Arch, graph: Graph, op: Op, fmaps: dict[str, FMap],
                 alias: dict[str, tuple[str, int]], params: ParamBlob, variant: str = "wide") -> None:
    """eltwise_add on the ELEW engine: per tile, each input's rows in VB0 (row r in bank r, input after input),
    per output row one ELEWINIT per input and one ELEW."""
    q = xops.quant_params(op, graph)
    what = f"op {op.name!r}"
    if q.kind != "add":
        raise CodegenError(f"{what}: eltwise {q.kind} is not supported on DPUV3E (its ELEW engine adds only)")
    elew = _engine(arch, "elew", op.name)
    xs, y = [fmaps[n] for n in op.inputs], fmaps[op.outputs[0]]
    cg = cgroups(y.c, elew["cp"])
    shift_write = scale_field(q.write_exp, what)
    banks = Banks.of(arch)
    for t in plan_tiles(prog, banks, Window(1, 1), y.h, y.w, len(xs) * cg, cg, arch.pp, MAX_ELEW_LENGTH, what):
        base = [banks.in_base(t) + i * t.cols * cg for i in range(len(xs))]
        for x, name, b in zip(xs, op.inputs, base):
            load_rows(prog, banks, t, x, name, cg, b, op.name)
        for r in range(t.rows):
            for i, b in enumerate(base):
                prog.emit("ELEWINIT", reads=[("vb_in", t.in_half)], comment=op.name, id=i,
                          bank_id_in=banks.vb_in + r, bank_addr_in=b, jump_read=cg, jump_read_endl=1,
                          shift_read=q.shift_read[i])
            prog.emit("ELEW", reads=[("vb_in", t.in_half)], writes=[("vb_out", t.out_half)], comment=op.name,
                      bank_id_out=banks.vb_out + r, bank_addr_out=banks.out_base(t), length=t.cols,
                      channel_group=cg, jump_write=cg, jump_write_endl=1, valid_pixel_parallel=1, num=len(xs),
                      shift_write=shift_write, act_type=q.act_type)
        save_tile(prog, banks, t, y, op.outputs[0], cg, op.name)


def emit_concat(prog: Program, arch: Arch, graph: Graph, op: Op, fmaps: dict[str, FMap],
                alias: dict[str, tuple[str, int]], params: ParamBlob, variant: str = "wide") -> None:
    """concat along channels: inputs their producer did not save into their slice (`alias`) are copied by a 1x1
    max POOL, which also requantizes an input of another fix_point."""
    out = op.outputs[0]
    axis = xops.attr(op, "axis") % 4
    if axis != 1:
        raise CodegenError(f"concat along axis {axis} is not supported by the DPUV3E code generator")
    q = xops.quant_params(op, graph)
    y = fmaps[out]
    c0 = 0
    for i, name in enumerate(op.inputs):
        c = graph.tensors[name].shape[1]
        if alias.get(name, (None,))[0] != out:
            e = 0 if q.requant[i] is None else q.requant[i].exponent
            emit_window_pool(prog, arch, op.name, Window(1, 1), enum_code("pool_type", "maxpool"),
                             scale_field(e, f"op {op.name!r}"), fmaps[name], y.channels(c0, c), name, out)
        c0 += c

