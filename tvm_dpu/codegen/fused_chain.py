"""A conv feeding a window consumer (ALU pool / depthwise, or a windowed CONV) through a circular buffer in VB1
laid out in the consumer's row-fetch layout: the tile choice (chain_tile), the conv side per strip of consumer
columns (emit_chain, channel-augmented on interior columns where tiling.augmentable allows) and the consumer
passes' SAVEs. Used by fused_conv_pool and fused_conv_conv's windowed form."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.conv import (Augment, ConvIn, ConvJob, ConvOut, augmented_weights, emit_augmented_loads,
                                  emit_conv_groups, load_biases, load_params, param_resources)
from tvm_dpu.codegen.fused_conv import fusable, probe
from tvm_dpu.codegen.layout import ParamBlob, ceil_div, pack_channel_vector, pack_conv_weights, pack_dw_weights
from tvm_dpu.codegen.program import Program
from tvm_dpu.codegen.tiling import FIELD10, CodegenError, WindowTile, augmentable, max_valid_rows, split_even
from tvm_dpu.types import REG_PARAMS, FMap
from tvm_dpu.xgraph import ops as xops
from tvm_dpu.xgraph.graph import Graph, Op


_ALU_LENGTH = 2048  # ALU length: 11-bit minus field


@dataclass(frozen=True)
class ChainTile:
    """Tile of a conv feeding a window consumer (ALU pool / depthwise, or a CONV) through a circular buffer in
    VB1."""
    vc: int  # conv rows per CONV (at most; a CONV never crosses a wrap of the consumer's layout)
    vp: int  # consumer rows per consumer instruction
    lp: int  # consumer columns per strip
    wraps: int  # wraps of the circular window buffer in VB1
    la: int  # conv output columns per CONV (a strip's conv columns are cut into pieces of at most la)
    a_slot: int  # rows of each half of VB0 for the conv's input window (the consumer's output slot follows it)
    la_aug: int = 0  # the same for channel-augmented CONVs (0: the conv is not augmented, see _augmentable)
    align: int = 1  # strips start on and passes span multiples of this many consumer columns / rows (strips)
    masked: bool = False  # augmented, the conv's edge columns too, their items' bytes in the padding masked


def strips(w: int, tile: ChainTile) -> list[tuple[int, int]]:
    """(first column, columns) of each strip of a chain whose consumer output is `w` columns wide: the fewest
    near-equal strips of at most tile.lp columns, each a multiple of tile.align (the last one clipped to `w`)."""
    a = tile.align
    return [(a * s, min(a * n, w - a * s)) for s, n in split_even(ceil_div(w, a), tile.lp // a)]


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


def window_of(graph: Graph, consumer: Op):
    """Window of the consumer of a conv_pool / pw_dw / windowed conv_conv group."""
    if consumer.type in ("depthwise_conv2d", "conv2d"):
        return xops.conv_window(consumer, graph)
    return xops.pool_window(consumer, graph)


def chain_tile(arch: Arch, graph: Graph, conv: Op, consumer: Op, vmax: int, cg_out: int,
                wrows_extra: int, spare: int = 1, align: int = 1, min_strips: int = 1, masked: bool = False
                ) -> ChainTile | None:
    """Tile of conv -> window consumer, or None. The consumer's output is cut into strips of `lp` columns (full
    height); per strip the conv computes its rows once, top to bottom, into a circular buffer of `wraps` wraps in
    VB1 laid out for the consumer's row fetch (only the strip's halo columns are recomputed). Budget: all conv
    weights resident plus `wrows_extra` CONVW rows (the consumer's); VB1 holds the circular window only; each half
    of VB0 holds one conv input window (a piece of at most `la` conv columns: a strip may need several) and one
    consumer output slot of lp pixels x cg_out rows. The consumer does up to `vmax` rows per instruction. The
    widest strip wins (fewest halo columns, fewest consumer instructions). The buffer holds the wraps one pass
    reads plus `spare` more, which the conv fills while the pass reads (with 0 the conv overwrites a wrap only
    once the passes reading it are done: less overlap, but a buffer a wrap shorter allows wider strips, hence
    fewer and longer CONVs, each paying the CONV fill once). `align`: strips of a multiple of this many columns and
    passes of a multiple of this many rows (a 2x2 stride-2 pool of each pass's output slot, fused_conv_conv_pool).
    `min_strips`: at least this many strips (the widest strip leaves the least room in VB0 for the conv's input
    window, so its pieces are narrower: a variant with more strips can be faster). `masked`: an augmented conv
    runs augmented on its edge columns too, the LOADs masking the items' bytes in the padding (conv's first-layer
    LOADs: the input needs its DDR margin, which the compiler gives where conv.input_augmentation holds), rather
    than one plain CONV per edge column and row group."""
    if arch.icp != arch.ocp or not fusable(arch, graph, conv):
        return None
    win = window_of(graph, consumer)
    if win.pads[0] > 15 or win.pads[1] > 15 or win.sh > 8:  # 4-bit pads; CONV 3-bit stride_offset_out
        return None
    jc = probe(arch, graph, conv)
    cg_in, cg_mid = ceil_div(jc.cin, arch.icp), ceil_div(jc.cout, arch.ocp)
    aug = _augmentable(arch, jc)
    masked = masked and aug and augmentable(arch, jc.cin, jc.kw, jc.sw, jc.pads)
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
    while vp >= 1 and (_pool_pass_wraps(pp, win.sh, win.kh, vp) > 4 or vp % align):
        vp -= 1
    if vp < 1:
        return None
    _, _, hc, wc = graph.tensors[conv.outputs[0]].shape
    # the wraps a pass reads + the one the conv fills, but never more than the conv's whole output takes: a map of
    # at most that many wraps is never overwritten, so no pass waits for a wrap to free (28x28 -> 14x14 stride-2
    # blocks: 2 wraps of 16 rows instead of 3, so one strip of the full width instead of two of half)
    need = min(_pool_pass_wraps(pp, win.sh, win.kh, vp) + spare, ceil_div(ceil_div(hc, win.sh), pp))
    wraps_c = (((vc - 1) * jc.sh + jc.kh - 1) // jc.sh) // pp + 1
    wp = graph.tensors[consumer.outputs[0]].shape[3]
    units = ceil_div(wp, align)
    for n_cols in range(min_strips, units + 1):
        lp = align * ceil_div(units, n_cols)
        in_p = (lp - 1) * win.sw + win.kw
        e, lc = in_p * cg_mid, min(in_p, wc)
        if lp > _ALU_LENGTH or lp > FIELD10 or e > FIELD10:
            continue
        a_slot = half - lp * cg_out
        la = _piece_cols(jc, cg_in, wraps_c, a_slot, lc)
        la_aug = _piece_cols(ja, cg_aug, wraps_c, a_slot, lc) if aug else 0
        wraps = depth // (win.sh * e)
        if la >= 1 and wraps >= need and (la_aug >= 1 or not aug):
            return ChainTile(vc, vp, lp, wraps, la, a_slot, la_aug, align, masked)
    return None


def _pass_span(j0: int, v: int, sp: int, pt: int, kh: int, hc: int, pp: int) -> tuple[int, int, int, int]:
    """(u0, n_fetch, w0, top_w) of a consumer pass of `v` output rows from row j0: its first fetched conv row
    (negative in the top padding), the rows it fetches, and the first and last buffer wraps it reads (w0 is -1
    for a pass starting in the top padding: those rows are masked)."""
    u0 = j0 * sp - pt
    n_fetch = (v - 1) * sp + kh
    return u0, n_fetch, (u0 // sp) // pp, (min(hc, u0 + n_fetch) - 1) // sp // pp


#: Tokens a chain lets a cross-engine counter hold along program order (Program.deeper_counters). Its consumer
#: passes alternate two output slots, and its CONVs cycle through the wraps of the window buffer: a pass reusing a
#: slot needs the SAVEs of the pass before last, a CONV overwriting a wrap the pass that read it, each with the
#: same pair's wait for the newer slot or wrap between them in program order. With one token the post moved to
#: the newer instruction, so every pass waited out the SAVEs (and their DDR round trip) of the pass just before
#: it, and the MISC engine, not the CONV, set the pace (PointPillars' PFN: 66 idle cycles per 416-cycle pass,
#: +5.7% over vai_c's program, whose counters reach 18).
CHAIN_COUNTER_DEPTH = 2


def _row_groups(hc: int, sp: int, pp: int, vc: int) -> list[tuple[int, int]]:
    """(first row, rows) of each conv row group of a chain strip: up to vc rows, never crossing a wrap (pp x sp
    rows)."""
    out, u = [], 0
    while u < hc:
        nv = min(vc, hc - u, (u // sp // pp + 1) * pp * sp - u)
        out.append((u, nv))
        u += nv
    return out


def wrap_res(wrap: int, slot_rows: int, half: int) -> tuple:
    """Dependency resources of wrap `wrap` of a chain's circular buffer in VB1 (`slot_rows` rows per wrap): one per
    VB1 half it lies in, named under that half, so they conflict with the other ops' ("vb1", half) tiles (wraps
    named apart from the halves let a chain's first CONVs overwrite rows an earlier op's SAVEs still read) but not
    with each other."""
    lo = wrap * slot_rows
    return tuple(("vb1", h, "win", wrap) for h in range(lo // half, (lo + slot_rows - 1) // half + 1))


@dataclass(frozen=True)
class ChainPass:
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


@dataclass(frozen=True)
class LaterGroups:
    """A chain conv's weights loaded group 0 first (load_chain_conv): the LOADs of groups 1.. come after the
    first piece's input LOADs, so the first CONV waits for its input and its own group's weight rows only, not
    for every group's (vai_c's programs load them so; PointPillars' PFN: its first CONV starts 17 cycles
    earlier)."""
    load: Callable[[], None]  # emits the LOADs of groups 1..
    reads: tuple  # per output-channel group, the CONVW rows its CONVs read


def load_chain_conv(prog: Program, arch: Arch, graph: Graph, conv: Op, job: ConvJob, tile: ChainTile,
                     x: FMap, params: ParamBlob, split: bool = False, tag: str | None = None
                     ) -> tuple[ConvJob | None, int, LaterGroups | None]:
    """LOAD the chain conv's weights and biases (from CONVW row 0, BIAS row 0), plus its augmented weights after
    them when the tile runs it augmented and its input's pixels are packed (pixel pitch = cin: consecutive pixels
    are consecutive bytes). Returns the augmented job (or None), the first free CONVW row, and, with `split`
    where the conv has several output-channel groups and runs plain, the later groups' LOADs still to emit
    (LaterGroups: emit_chain emits them) instead of emitting them here. `tag`: the rows' param_resources tag (a
    kernel whose other members' parameters follow, so the chain conv's CONVs need not wait for those LOADs)."""
    cg_mid = ceil_div(job.cout, arch.ocp)
    rows = cg_mid * job.kh * job.kw * ceil_div(job.cin, arch.icp)
    aug = tile.la_aug and x.pixel_pitch == job.cin
    if split and cg_mid > 1 and not aug:
        wrows = rows // cg_mid
        (first,), _ = param_resources(None, "g0")
        (rest,), _ = param_resources(None, "g1+")
        load_biases(prog, arch, job, 0, cg_mid, 0, (("bias",),))
        load_params(prog, arch, job, 0, 1, with_bias=False, tag="g0")
        later = lambda: load_params(prog, arch, job, 1, cg_mid - 1, wrows, with_bias=False, tag="g1+")
        return None, rows, LaterGroups(later, (first,) + (rest,) * (cg_mid - 1))
    load_params(prog, arch, job, 0, cg_mid, tag=tag)
    if not aug:
        return None, rows, None
    w = graph.param(conv, "weights").data
    ja = _augmented(job, params.add(pack_conv_weights(augmented_weights(w), arch.icp, arch.ocp)))
    load_params(prog, arch, ja, 0, cg_mid, rows, with_bias=False, tag=tag)
    return ja, rows + cg_mid * ja.kh * ceil_div(ja.cin, arch.icp), None


def load_dw_params(prog: Program, arch: Arch, graph: Graph, dw: Op, c: int, params: ParamBlob, brow: int,
                   tag: str | None = None) -> None:
    """LOAD the `c`-channel depthwise conv `dw` a chain runs on the ALU: its weights into DWCONVW from row 0, its
    biases (zeros if it has none) into BIAS rows from `brow` (after the chain conv's; `tag`: param_resources')."""
    cp, cg = arch.icp, ceil_div(c, arch.ocp)
    win = window_of(graph, dw)
    b = graph.param(dw, "bias", required=False)
    wd_off = params.add(pack_dw_weights(graph.param(dw, "weights").data, cp), dw.params["weights"])
    bd_off = params.add(pack_channel_vector(b.data if b is not None else np.zeros(c, np.int8), cp),
                        dw.params.get("bias", ""))
    prog.emit("LOAD", reads=(("ddr", "params"),), writes=(("dwconvw",),), bank_id=arch.bank_group("DWCONVW").base_id,
              bank_addr=0, length=win.kh * win.kw, channel=c, jump_read=cg * cp, jump_write=cg, reg_id=REG_PARAMS,
              ddr_addr=wd_off)
    prog.emit("LOAD", reads=(("ddr", "params"),), writes=param_resources(None, tag)[1],
              bank_id=arch.bank_group("BIAS").base_id, bank_addr=brow, length=1, channel=c, jump_read=c, jump_write=cg,
              reg_id=REG_PARAMS, ddr_addr=bd_off)


def plain_rows(arch: Arch, job: ConvJob) -> int:
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


def emit_chain(prog: Program, arch: Arch, graph: Graph, conv: Op, consumer: Op, tile: ChainTile, job: ConvJob,
                cg_out: int, fmaps: dict[str, FMap], emit_pass, aug: tuple[ConvJob, int] | None = None,
                later: LaterGroups | None = None, tag: str | None = None,
                then: Callable[[], None] | None = None) -> None:
    """The conv side of conv -> window consumer, per strip of consumer output columns. Conv output row u of the
    strip is "fetched row" u of the consumer's row-fetch layout (bank (u//S) % PP, wrap (u//S)//PP, S = the
    consumer's stride_h); wraps live in a circular buffer of VB1 whose per-wrap base addresses the consumer takes
    explicitly (bank_addr_in..._3). The CONVs (never crossing a wrap, so the row-store rule with stride_out = S,
    stride_offset_out = u % S and jump_write_endl = the line pitch places every row) compute each conv row once;
    as soon as the rows of a pass of vp consumer rows are in, `emit_pass(pass, out_addr, oslot)` emits the
    consumer's instruction(s) writing output slot `oslot` at VB0 row `out_addr` and the SAVEs. The conv's output
    never touches DDR; only the strip's halo columns are computed twice. `aug` = (augmented job, its first CONVW
    row) runs the interior columns channel-augmented (_augmentable). `later`: the weight LOADs of output-channel
    groups 1.. that load_chain_conv left to emit after the first piece's input LOADs. `tag`: the one the conv's
    parameters were loaded with (load_chain_conv); `then`: more LOADs to emit there (the other members'
    parameters, loaded under their own tags: in the LOAD engine's order they would otherwise hold the first
    piece's input, and so the first CONVs, behind them)."""
    if later is not None and aug is not None:
        raise CodegenError(f"op {conv.name!r}: weights loaded group by group with augmented pieces")
    with prog.deeper_counters(CHAIN_COUNTER_DEPTH):
        pending = ([later.load] if later is not None else []) + ([then] if then is not None else [])
        _emit_strips(prog, arch, graph, conv, consumer, tile, job, cg_out, fmaps, emit_pass, aug, later,
                     param_resources(None, tag), pending)


def _emit_strips(prog: Program, arch: Arch, graph: Graph, conv: Op, consumer: Op, tile: ChainTile, job: ConvJob,
                 cg_out: int, fmaps: dict[str, FMap], emit_pass, aug: tuple[ConvJob, int] | None,
                 later: LaterGroups | None, res: tuple, pending: list) -> None:
    win = window_of(graph, consumer)
    half, pp, sp = arch.bank_depth // 2, arch.pp, win.sh
    cg_mid = ceil_div(job.cout, arch.ocp)
    x, y = fmaps[conv.inputs[0]], fmaps[consumer.outputs[0]]
    # the conv's output has a DDR place only where a reader outside the group needs it (compiler._on_chip_maps):
    # then each strip also SAVEs the rows it computes, from the buffer, of the columns no earlier strip saved
    side = fmaps.get(conv.outputs[0])
    _, _, hc, wc = graph.tensors[conv.outputs[0]].shape
    pt, pleft = win.pads[0], win.pads[1]
    if side is not None and not side_covered(graph, conv, consumer):
        raise CodegenError(f"ops {conv.name!r}+{consumer.name!r}: the consumer's windows leave conv output columns "
                           f"uncomputed, which its readers outside the group need")
    cbuf, oslot, saved = 0, 0, 0
    for q0, length in strips(y.w, tile):
        in_p = (length - 1) * win.sw + win.kw
        e = in_p * cg_mid
        slot_rows = sp * e  # rows of one wrap in every bank
        wrap_addr = lambda w: (w % tile.wraps) * slot_rows
        x0 = q0 * win.sw - pleft
        c_lo, c_hi = max(0, x0), min(wc, x0 + in_p)
        p_left, p_right = max(0, -x0), max(0, x0 + in_p - wc)
        passes = [(j0, min(tile.vp, y.h - j0)) for j0 in range(0, y.h, tile.vp)]
        spans = [_pass_span(j0, v, sp, pt, win.kh, hc, pp) for j0, v in passes]
        groups = _row_groups(hc, sp, pp, tile.vc)
        nxt = 0  # first pass not yet emitted

        def emit_ready(done: int) -> None:
            """The consumer passes whose conv rows [.., done) are all computed."""
            nonlocal nxt, oslot
            while nxt < len(passes):
                j0, v = passes[nxt]
                u0, n_fetch, w0, top_w = spans[nxt]
                if min(hc, u0 + n_fetch) > done:
                    return
                m, s0 = divmod(u0, sp)
                a = tuple(wrap_addr(w0 + g) for g in range(4))
                reads = tuple(r for w in range(max(0, w0), top_w + 1)
                              for r in wrap_res(w % tile.wraps, slot_rows, half))
                ps = ChainPass(j0, v, q0, m, s0, a, reads, max(0, -u0), max(0, u0 + n_fetch - hc), p_left, p_right,
                           length, e)
                emit_pass(ps, oslot * half + tile.a_slot, oslot)
                oslot ^= 1
                nxt += 1

        for u, nv in groups:
            m, t0 = divmod(u, sp)
            w = m // pp
            if nxt < len(passes) and w - tile.wraps >= (max(0, passes[nxt][0] * sp - pt) // sp) // pp:
                raise CodegenError(f"ops {conv.name!r}+{consumer.name!r}: window buffer of {tile.wraps} wraps "
                                   f"overrun")  # the fit check's `need` rules this out
            segments = ([(c_lo, c_hi, True)] if tile.masked and aug is not None else
                        _conv_segments(job, x.w, c_lo, c_hi, aug is not None))
            for c0, c1, on in segments:
                for pc0, pl in split_even(c1 - c0, tile.la_aug if on else tile.la):
                    piece = _Piece(u, nv, c0 + pc0, pl, wrap_addr(w) + (c0 + pc0 - x0) * cg_mid, t0, m % pp,
                                   w % tile.wraps)
                    if on:
                        _emit_augmented_piece(prog, arch, x, conv.inputs[0], aug, cbuf, e, sp, piece, job, res,
                                              pending, tile.masked)
                    else:
                        _emit_conv_piece(prog, arch, x, conv.inputs[0], job, cbuf, e, sp, piece, pending,
                                         later.reads if later is not None else (), res)
                    cbuf ^= 1
            if side is not None and c_hi > saved:
                _emit_side_saves(prog, arch, side, conv.outputs[0], u, nv, sp, e, cg_mid, job.cout,
                                 (max(saved, c_lo) - x0, c_hi - x0, x0), lambda m: wrap_addr(m // pp),
                                 lambda m: wrap_res((m // pp) % tile.wraps, slot_rows, half))
            emit_ready(u + nv)
        emit_ready(hc)
        saved = max(saved, c_hi)


def saves_side(graph: Graph, conv: Op, consumer: Op) -> bool:
    """Whether the conv's output is also needed outside a chain group of conv -> consumer (another op reads it, or
    it is a graph output): the group then SAVEs it as well (fusion.fork makes such groups)."""
    t = conv.outputs[0]
    return t in graph.outputs or any(t in op.inputs for op in graph.ops if op is not consumer)


def side_covered(graph: Graph, conv: Op, consumer: Op) -> bool:
    """Whether a chain computes every column of the conv's output (its strips cover the columns the consumer's
    windows read; every row is computed), so it can also SAVE that output whole for readers outside the group."""
    win = window_of(graph, consumer)
    wc = graph.tensors[conv.outputs[0]].shape[3]
    wp = graph.tensors[consumer.outputs[0]].shape[3]
    return (wp - 1) * win.sw - win.pads[1] + win.kw >= wc


def _emit_side_saves(prog: Program, arch: Arch, y: FMap, tensor: str, u: int, nv: int, sp: int, e: int,
                     cg_mid: int, cout: int, cols: tuple[int, int, int], wrap_addr: Callable[[int], int],
                     wrap_reads: Callable[[int], tuple]) -> None:
    """SAVE conv rows [u, u+nv) of a strip from the circular buffer to `tensor` (its map `y`): buffer columns
    [cols[0], cols[1]) (pixel pitch cg_mid rows), image column = buffer column + cols[2]. Fetched row m = row // sp
    lies in VB1 bank m % PP, its wrap at `wrap_addr(m)`, the row (row % sp) * e rows into it (the row-fetch rule
    the consumer reads it with); one SAVE per row."""
    vb1 = arch.bank_group("VB1").base_id
    b0, b1, x0 = cols
    for r in range(u, u + nv):
        m, t = divmod(r, sp)
        prog.emit("SAVE", reads=wrap_reads(m), writes=(("ddr", tensor),), bank_id=vb1 + m % arch.pp,
                  bank_addr=wrap_addr(m) + t * e + b0 * cg_mid, length=b1 - b0, channel=cout, jump_read=cg_mid,
                  jump_write=y.pixel_pitch, reg_id=y.reg_id, ddr_addr=y.addr(r, b0 + x0, 0))


#: The parameter resources of a chain conv loaded into the whole CONVW / BIAS banks (param_resources, no tag).
PLAIN_PARAMS = param_resources(None)


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
                     piece: _Piece, pending: list, group_reads: tuple = (), res: tuple = PLAIN_PARAMS) -> None:
    """One conv piece of a chain: its input window LOADed into half `cbuf` of VB0, one CONV per output-channel
    group writing `nv` rows x `pl` columns into the circular buffer with the row-store rule (stride_out = the
    consumer's stride sp, line pitch e). `pending`: LOAD emitters still due before the CONVs (emitted and
    cleared); `group_reads`: each group's own CONVW rows (LaterGroups.reads), or () for the whole banks; `res`:
    the conv's parameter resources (param_resources)."""
    cg_in = ceil_div(job.cin, arch.icp)
    ct = WindowTile.of(arch.pp, job.kh, job.kw, job.sh, job.sw, job.pads, piece.u, piece.nv, piece.c, piece.pl, cg_in,
                       cbuf * (arch.bank_depth // 2))
    ct.emit_loads(prog, arch.bank_group("VB0").base_id, arch.bank_depth, x, x_res, 0, job.cin, ("vb0", cbuf, "in"))
    while pending:
        pending.pop(0)()
    pad_top, pad_left, pad_bottom, pad_right = ct.pads(x)
    _emit_piece_convs(prog, arch, job, cbuf, e, sp, piece, ct, (pad_top, pad_left, pad_bottom, pad_right), 0,
                      group_reads, res)


def _emit_augmented_piece(prog: Program, arch: Arch, x: FMap, x_res: str, aug: tuple[ConvJob, int], cbuf: int,
                          e: int, sp: int, piece: _Piece, job: ConvJob, res: tuple = PLAIN_PARAMS,
                          pending: list | None = None, masked: bool = False) -> None:
    """An interior conv piece run channel-augmented: per fetched row one LOAD of `pl` overlapping items of
    kw*cin bytes, sw*cin bytes apart (output column c's kernel row), then kh x 1 CONVs over kw*cin channels
    (`pending`: as _emit_conv_piece's). `masked` (ChainTile.masked): any piece, its items' bytes in the padding
    masked, loaded as the lone first-layer conv loads them (conv.emit_augmented_loads)."""
    ja, wrow0 = aug
    u, nv, c, pl = piece.u, piece.nv, piece.c, piece.pl
    depth, half = arch.bank_depth, arch.bank_depth // 2
    vb0 = arch.bank_group("VB0").base_id
    cg = ceil_div(ja.cin, arch.icp)
    ct = WindowTile.of(arch.pp, ja.kh, 1, ja.sh, 1, ja.pads, u, nv, c, pl, cg, cbuf * half)
    if masked:
        emit_augmented_loads(prog, arch, Augment(job.kw, job.sw, job.pads[1], job.cin), ct, vb0, x, x_res,
                             ("vb0", cbuf, "in"))
    for h in range(0 if masked else ct.n_rows):
        yy = ct.y0 + h
        if not 0 <= yy < x.h:
            continue  # padding rows: masked by the CONV's pad_top / pad_bottom
        bank, row0 = ct.place.where(h)
        prog.emit("LOAD", reads=(("ddr", x_res),), writes=(("vb0", cbuf, "in"),), bank_id=vb0 + bank,
                  bank_addr=row0 % depth, length=pl, channel=ja.cin, jump_read=job.sw * x.pixel_pitch,
                  jump_write=ct.place.pitch, reg_id=x.reg_id, ddr_addr=x.addr(yy, c * job.sw - job.pads[1], 0))
    while pending:
        pending.pop(0)()
    pad_top, _, pad_bottom, _ = ct.pads(x)
    _emit_piece_convs(prog, arch, ja, cbuf, e, sp, piece, ct, (pad_top, 0, pad_bottom, 0), wrow0, res=res)


def _emit_piece_convs(prog: Program, arch: Arch, job: ConvJob, cbuf: int, e: int, sp: int, piece: _Piece,
                      ct: WindowTile, pads: tuple[int, int, int, int], wrow0: int, group_reads: tuple = (),
                      res: tuple = PLAIN_PARAMS) -> None:
    """CONVINIT + one CONV per output-channel group of a chain conv piece (weights from CONVW row wrow0) into the
    circular buffer: the row-store rule with the consumer's stride sp and line pitch e. `group_reads`: each
    group's own CONVW rows, or () when every CONV reads the whole banks."""
    vb0, vb1 = arch.bank_group("VB0").base_id, arch.bank_group("VB1").base_id
    cg_mid = ceil_div(job.cout, arch.ocp)
    w_res, b_res = res
    params = b_res if group_reads else w_res + b_res
    emit_conv_groups(prog, arch, job, ConvIn.of(vb0, ct.place, arch.bank_depth),
                     ConvOut(vb1 + piece.bank, piece.out0, cg_mid, e, sp, piece.t0), cg_mid, piece.nv, piece.pl, wrow0,
                     0, (("vb0", cbuf, "in"), *params), wrap_res(piece.wrap, sp * e, arch.bank_depth // 2), pads,
                     group_reads=group_reads)


def emit_pass_saves(prog: Program, arch: Arch, y: FMap, tensor: str, ps: ChainPass, ob: int, cout: int, cg_out: int,
                oslot: int) -> None:
    """SAVE a consumer pass's output slot (v rows in consecutive VB0 banks from `ob`) to `tensor`."""
    vb0 = arch.bank_group("VB0").base_id
    for r in range(ps.v):
        prog.emit("SAVE", reads=(("vb0", oslot, "out"),), writes=(("ddr", tensor),), bank_id=vb0 + r,
                  bank_addr=ob, length=ps.length, channel=cout, jump_read=cg_out, jump_write=y.pixel_pitch,
                  reg_id=y.reg_id, ddr_addr=y.addr(ps.j0 + r, ps.q0, 0))
