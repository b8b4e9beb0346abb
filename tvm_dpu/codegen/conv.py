"""Code generation of one conv-class op on the CONV engine (no fusion): LOAD tiles, CONVINIT/CONV, SAVE.

Schedule (DNNVM's tiling rule, Eq. 5-6, for a single layer):

* Output channels are cut into groups of OCP (one CONV computes one group for vpp rows x L columns and reduces
  every input channel and tap). As many groups as fit in the CONVW banks stay resident ("chunk"); the weights of
  a chunk are loaded once, one LOAD per CONVW bank, and its biases with one LOAD into the BIAS bank.
* The output is cut into tiles of vpp <= PP rows and L columns. The input rows a tile needs are loaded into one
  half of the first image bank group (VB0) following the row-fetch rule, the outputs go to one half of VB1; the
  halves alternate between tiles, so the loads of tile t+1 overlap the CONVs of tile t and the SAVEs of t-1
  (double buffering; the dependency tokens come from program.Program).
* L is the widest that fits: the input line (L-1)*sw + kw pixels of cg_in rows each within half a bank and the
  10-bit jump_read_endl, the output L pixels of `chunk` rows within half a bank.

Three refinements make the CONVs longer or fewer (each CONV costs conv_fill_cycles beyond its taps x groups x L,
docs/timing-model.md; `python benchmarks/bench_opcycles.py` shows where a network's cycles go):

* pointwise convs (1x1, no padding) tile the output in raster order (`flat_length`): PP tile rows of L pixels
  that may cross image rows, so small maps (7x7, 14x14) need one CONV per group where rectangles need several;
* first-layer convs over few channels are channel-augmented (`Augment`): kw input pixels per LOAD item, a
  kh x 1 conv over kw*C channels, when the CONVs it saves outweigh its item-by-item LOADs;
* windowed tiles whose fetched rows wrap the bank group unevenly place the second tile of each pair after the
  first in a ring (`InputRing`), which allows longer lines where that means fewer column tiles;
* windowed tiles whose output is small beside their input alternate between the two image bank groups
  (`group_swap`): a tile's input takes most of one group and its output the top rows of the other, so a line may
  use almost a whole group instead of half of one, where that means fewer column tiles;
* a last row band of v <= PP/2 rows (14 rows on PP 4) runs as PieceTiles (`piece_band`): each of its rows cut
  into PP // v column pieces, one per tile row, so its CONVs are that much shorter instead of computing PP - v
  idle rows (VGG-16's 14x14 layers on ZU2: 7 columns instead of 14 for rows 12-13).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.layout import ceil_div
from tvm_dpu.codegen.program import Program
from tvm_dpu.codegen.tiling import (FIELD10, MAX_WRAPS, PAD5, CodegenError, PieceTile, RasterTile, RowPlacement,
                                    WindowTile, augmentable, conv_tile, emit_raster_loads, raster_tiles, split_even)
from tvm_dpu.types import FMap
from tvm_dpu.xgraph import ops as xops
from tvm_dpu.xgraph.graph import Graph, Op

@dataclass(frozen=True)
class ConvJob:
    """Everything the emitter needs for one conv2d / dense on the CONV engine."""

    name: str
    kh: int
    kw: int
    sh: int
    sw: int
    pads: tuple[int, int, int, int]  # top, left, bottom, right
    cin: int
    cout: int
    act_type: int
    shift_cut: int
    shift_bias: int  # ISA field value
    w_offset: int  # byte offset of the packed weights in the params region (layout.pack_conv_weights)
    b_offset: int  # byte offset of the packed biases (cg_out * OCP bytes)
    params_reg: int = 0
    variant: str = "wide"  # one of CONV_VARIANTS
    aug: "Augment | None" = None  # set: this job is the channel-augmented form of a conv (see Augment)
    zero_offset: int | None = None  # params-region offset of piece_zero_bytes zero bytes (PieceTile padding)

    @property
    def geometry(self) -> tuple[int, int, int, int, int]:
        """(cin, kh, kw, sh, sw): what the tile choice (tiling.conv_tile) depends on."""
        return self.cin, self.kh, self.kw, self.sh, self.sw


#: DDR bytes kept free before and after a map a channel-augmented conv reads: its edge items read (masked) bytes
#: up to pad_left * C before a row and past the last one (at most 2*ICP <= 64, tiling.augmentable).
AUG_MARGIN = 64


@dataclass(frozen=True)
class Augment:
    """Channel augmentation of a conv over few input channels (a first layer on the RGB image): each LOAD item is
    the kw*C bytes of kw consecutive input pixels (items overlap in DDR, `jump_read` = sw*C), so the conv becomes
    a kh x 1 conv with stride (sh, 1) over kw*C channels. A CONV then spends kh*ceil(kw*C/ICP) cycles per column
    instead of kh*kw*ceil(C/ICP) (7x7 over 3 channels with ICP 12: 14 instead of 49). The LOAD's pad_start /
    pad_end / pad_idx zero the bytes of the items that lie in the left / right padding (isa1-semantics.md 5.1).
    Fields: the original kernel width, horizontal stride, left padding and input channels."""

    kw: int
    sw: int
    pad_left: int
    cin: int

    @property
    def channels(self) -> int:
        return self.kw * self.cin


#: DMA cycles per augmented LOAD item, an estimate: the items overlap in DDR, so each is a burst of its own (a
#: 4-beat address/turnaround overhead plus its data beats, on two 128-bit AXI ports: PG338, docs/timing-model.md).
def _aug_item_cycles(channels: int) -> float:
    return (ceil_div(channels, 16) + 4) / 2


def augmentation(arch: Arch, cin: int, cout: int, kh: int, kw: int, sh: int, sw: int,
                 pads: tuple[int, int, int, int], pixel_pitch: int) -> Augment | None:
    """The channel augmentation of a conv (Augment), or None when the hardware cannot run it on this input
    (tiling.augmentable; its pixels must be packed, pixel pitch = cin) or it would not be faster. Per output
    column of a tile, the plain conv's CONVs take n*kh*kw*cg cycles (n output groups) and its LOADs little (whole
    rows, contiguous); the augmented conv's CONVs take n*kh*cg' and its LOADs about rows*_aug_item_cycles (one
    burst per item), which is what a conv with few output groups is bound by."""
    if pixel_pitch != cin or not augmentable(arch, cin, kw, sw, pads):
        return None
    icp, ch = arch.icp, kw * cin
    n = ceil_div(cout, arch.ocp)
    rows = (arch.pp - 1) * sh + kh
    plain = n * kh * kw * ceil_div(cin, icp)
    augmented = max(n * kh * ceil_div(ch, icp), rows * _aug_item_cycles(ch))
    return Augment(kw, sw, pads[1], cin) if augmented < plain else None


def input_augmentation(arch: Arch, graph: Graph, op: Op) -> Augment | None:
    """The channel augmentation (conv.Augment) of an ordinary conv2d reading a subgraph input (the first layer),
    or None. Only subgraph inputs: plan_ddr gives them the DDR margin the edge items read into."""
    if op.type != "conv2d" or op.inputs[0] not in graph.inputs or xops.is_depthwise(op, graph) \
            or int(xops.attr(op, "groups")) != 1:
        return None
    win = xops.conv_window(op, graph)
    if (win.dh, win.dw) != (1, 1):
        return None
    _, cin, _, _ = graph.tensors[op.inputs[0]].shape
    cout = graph.tensors[op.outputs[0]].shape[1]
    return augmentation(arch, cin, cout, win.kh, win.kw, win.sh, win.sw, tuple(win.pads), cin)


def augmented_weights(w_oihw: np.ndarray) -> np.ndarray:
    """(O, C, kh, kw) weights as the (O, kw*C, kh, 1) weights of the augmented conv: channel j*C + c of an item is
    channel c of its j-th pixel."""
    o, c, kh, kw = w_oihw.shape
    return np.ascontiguousarray(np.asarray(w_oihw).transpose(0, 3, 1, 2).reshape(o, kw * c, kh, 1))


#: Instruction-sequence variants of a lone conv (kernel polymorphism): the same outputs, each computed by one CONV
#: instruction over all input channels and taps, so every variant is bit-identical; they differ in tile shape:
#: * "wide": the widest tile that fits the banks (tiling.conv_tile): fewest instructions;
#: * "narrow": column tiles of half that width: twice the tiles, so the next tile's LOADs and the last one's
#:   SAVEs overlap more of the CONVs (the image banks are double-buffered);
#: * "split_weights": output-channel chunks of half the resident groups: the first CONVs wait for a smaller
#:   weight LOAD and the next chunk's weights load while this one computes.
#: The compiler takes a variant per op (FusionPlan.variants); fusion.select.choose_conv_variants picks them with
#: the timing model.
CONV_VARIANTS = ("wide", "narrow", "split_weights")


@dataclass(frozen=True)
class PoolOnSave:
    """A 2x2 stride-2 max / avg pool run on each conv tile in the banks before it is saved (template conv_pool,
    fused_conv_pool): one ALU per pair of conv rows pools them in place and only the pooled rows are saved. The
    conv keeps its lone tiles (whatever emit_conv chooses: halves, ring or group swap) with even tile rows and
    columns, so fusing costs no CONV; the ALUs run on the MISC engine beside the next tile's CONVs. Fields: the
    ALU exec_mode code, shift_cut and multi_factor (avg pool), and the pooled map in DDR."""

    exec_mode: int
    shift_cut: int
    multi_factor: int
    y: FMap


def variant_tile(tile: tuple[int, int, int], variant: str) -> tuple[int, int, int]:
    """(vpp, L, chunk) of `variant` from the widest tile (see CONV_VARIANTS)."""
    vpp, lmax, chunk = tile
    if variant == "wide":
        return tile
    if variant == "narrow":
        return vpp, ceil_div(lmax, 2), chunk
    if variant == "split_weights":
        return vpp, lmax, ceil_div(chunk, 2)
    raise CodegenError(f"conv variant {variant!r}: choose one of {', '.join(CONV_VARIANTS)}")


def conv_tile_of(arch: Arch, job: ConvJob) -> tuple[tuple[int, int, int], bool] | None:
    """((vpp, L, chunk) of `job.variant`, whether the weights take half the CONVW banks), or None when no tile
    fits."""
    cg_out = ceil_div(job.cout, arch.ocp)
    wrows = job.kh * job.kw * ceil_div(job.cin, arch.icp)
    half = arch.bank_depth // 2
    # Weights (and biases) of a chunk live in one half of the CONVW (BIAS) banks when they fit, alternating halves
    # chunk by chunk and op by op, so the next chunk's weights load while this one computes; otherwise they take
    # the whole bank.
    halved = cg_out * wrows <= half or cg_out * wrows > arch.bank_depth >= 2 * wrows
    resident = min(cg_out, (half if halved else arch.bank_depth) // wrows)
    tile = conv_tile(arch, *job.geometry, resident)
    return None if tile is None else (variant_tile(tile, job.variant), halved)


def flat_length(arch: Arch, job: ConvJob, y: FMap, chunk: int) -> int | None:
    """Row length L of the flat tiling of a pointwise conv, or None when the op is not pointwise.

    A 1x1 conv without padding computes every output pixel from one input pixel, so its tile need not be a
    rectangle of the image: the output pixels in raster order are cut into tile rows of L pixels, PP rows per
    tile, a tile row crossing image rows where it must. One CONV then computes PP*L pixels whatever the map's
    width: on 7x7 and 14x14 maps that is 2-4x fewer CONV instructions (each paying conv_fill_cycles) than
    rectangles of the image's width, and no output row slots are wasted on the last row tile. L is the longest
    the banks allow (L input pixels of cg_in rows, L output pixels of `chunk` rows, each within half a bank and
    the 10-bit fields), shortened by `job.variant` and then balanced over the tiles."""
    if (job.kh, job.kw) != (1, 1) or any(job.pads) or job.aug is not None:
        return None
    half = arch.bank_depth // 2
    cg_in = ceil_div(job.cin, arch.icp)
    lmax = min(FIELD10, half) // cg_in
    lim = min(lmax, half // chunk, FIELD10)
    if lim < 1:
        return None
    lim = variant_tile((arch.pp, lim, chunk), job.variant)[1]
    pixels = y.h * y.w
    tiles = ceil_div(pixels, arch.pp * lim)
    return ceil_div(pixels, tiles * arch.pp)


@dataclass(frozen=True)
class ConvIn:
    """Where the CONVs of a tile read their input window: bank_id_in (the bank of the window's first fetched row),
    bank_addr_in, _1, _2, _3 (the row of each bank wrap's first line, within the bank) and jump_read_endl (rows
    between the line slots of one bank; the row-fetch rule, isa1-semantics.md 3.3)."""

    bank: int
    addrs: tuple[int, ...]
    endl: int

    @staticmethod
    def of(group_base: int, place: RowPlacement, depth: int) -> "ConvIn":
        """The window `place` puts in the image bank group whose first bank is `group_base`."""
        return ConvIn(group_base + place.b0, tuple(b % depth for b in place.bases()), place.endl)


@dataclass(frozen=True)
class ConvOut:
    """Where the CONVs of a tile write: bank_id_out, the row of output group 0 of the first pixel (group g at
    + g), jump_write (rows between pixels) and the row-store rule's jump_write_endl, stride_out and
    stride_offset_out: (1, 1, 0) puts output row r in bank r; a consumer's line pitch, stride and row offset lay
    the rows out for its row fetch (isa1-semantics.md 3.3)."""

    bank: int
    row0: int
    pitch: int
    endl: int = 1
    stride: int = 1
    offset: int = 0


def emit_conv_groups(prog: Program, arch: Arch, job: ConvJob, src: ConvIn, dst: ConvOut, n: int, vpp: int,
                     length: int, wrow0: int, brow0: int, reads: tuple, writes: tuple,
                     pads: tuple[int, int, int, int] = (0, 0, 0, 0), stride_offset_in: int = 0,
                     group_reads: tuple = ()) -> None:
    """CONVINIT, then one CONV per output-channel group gl < n: `job` is the conv the engine runs (kernel,
    stride, input channels, requantisation), over vpp output rows x `length` columns from `src` into `dst` (group
    gl at row dst.row0 + gl), with group gl's weights from CONVW row wrow0 + gl * kh*kw*ceil(cin/ICP) and its
    bias from BIAS row brow0 + gl. `pads`: the window's padding beyond the map (top, left, bottom, right);
    `stride_offset_in`: the input row of the first fetched row within the stride; `reads` / `writes`: every
    CONV's dependency resources (window and parameters / output rows); `group_reads`: if given, one more resource
    per group gl that only its CONV reads (its own weight rows, when they are loaded group by group).

    The one CONV emission of the code generator: the unfused conv, the fused kernels and the resident chains
    differ only in these arguments."""
    cg_in = ceil_div(job.cin, arch.icp)
    wrows = job.kh * job.kw * cg_in
    pad_top, pad_left, pad_bottom, pad_right = pads
    a = src.addrs
    prog.emit("CONVINIT", act_type=job.act_type, shift_cut=job.shift_cut, shift_bias=job.shift_bias,
              jump_read=cg_in, jump_read_endl=src.endl, stride_out=dst.stride, jump_write=dst.pitch,
              jump_write_endl=dst.endl, stride_h=job.sh, kernel_h=job.kh, valid_pixel_parallel=vpp,
              stride_offset_in=stride_offset_in, stride_w=job.sw, kernel_w=job.kw, stride_offset_out=dst.offset)
    for gl in range(n):
        prog.emit("CONV", reads=reads + (group_reads[gl],) if group_reads else reads, writes=writes,
                  pad_left=pad_left, pad_top=pad_top,
                  pad_right=job.kw - 1 - pad_right, pad_bottom=job.kh - 1 - pad_bottom, bank_id_in=src.bank,
                  bank_addr_in=a[0], bank_addr_in_1=a[1], bank_addr_in_2=a[2], bank_addr_in_3=a[3],
                  channel_group=cg_in, channel_offset=cg_in * arch.icp - job.cin, bank_id_out=dst.bank,
                  bank_addr_out=dst.row0 + gl, length=length, bank_addr_weights=wrow0 + gl * wrows,
                  bank_addr_bias=brow0 + gl)


def _emit_flat_tile(prog: Program, arch: Arch, job: ConvJob, x: FMap, y: FMap, x_res: str, y_res: str,
                    tile: RasterTile, g0: int, n: int, cg_in: int, base: int, banks: tuple[int, int, int],
                    wbase: int, params: tuple) -> None:
    """One flat tile of a pointwise conv (flat_length, tiling.raster_tiles): its input pixels packed at pixel
    pitch cg_in in image bank r for tile row r (row-fetch rule with stride 1, a single wrap), its outputs at
    pitch n in VB1 bank r. The last row may be partial: the CONV computes the slots past the end from stale bank
    rows, and nothing saves them."""
    vb0, vb1, buf = banks
    length = tile.length
    place = RowPlacement(arch.pp, 1, length * cg_in, cg_in, base)
    channels = min(n * arch.ocp, job.cout - g0 * arch.ocp)
    emit_raster_loads(prog, vb0, arch.bank_depth, tile, y.w, x, x_res, job.sh, job.sw, job.cin, cg_in, base,
                      ("vb0", buf))
    # the raster LOADs took every sh-th row and sw-th column: the CONVs run 1x1 with stride 1 over the packed pixels
    emit_conv_groups(prog, arch, replace(job, sh=1, sw=1), ConvIn.of(vb0, place, arch.bank_depth),
                     ConvOut(vb1, base, n), n, tile.vpp, length, wbase, wbase, (("vb0", buf),) + params,
                     (("vb1", buf),))
    for r in range(tile.vpp):
        for j, a_out, cnt in tile.runs(r, y.w, lambda oy, ox: y.addr(oy, ox, g0 * arch.ocp), y.pixel_pitch):
            prog.emit("SAVE", reads=(("vb1", buf),), writes=(("ddr", y_res),), bank_id=vb1 + r,
                      bank_addr=(base + j * n) % arch.bank_depth, length=cnt, channel=channels, jump_read=n,
                      jump_write=y.pixel_pitch, reg_id=y.reg_id, ddr_addr=a_out)


def emit_augmented_loads(prog: Program, arch: Arch, aug: Augment, tile: WindowTile, bank0: int, x: FMap,
                         x_res: str, buf_res: tuple) -> None:
    """The LOADs of each image row of the tile's window: item q (output column q) is the kw*C bytes from input
    column q*sw - pad_left, the bytes outside the image masked by pad_start (left) and pad_idx / pad_end (right,
    counted from the ICP-aligned end of the item, isa1-semantics.md 5.1).

    Items overlap in DDR (jump_read sw*C < kw*C), so one LOAD of them all is one AXI burst per item. When the
    item is a whole number P of item steps (kw*C = P*sw*C, e.g. 3x3 stride 1), the row goes as P LOADs instead,
    LOAD k taking items k, k+P, ...: those are back to back in DDR (jump_read = channel), one contiguous transfer
    each, written P rows apart (a 3x3 first layer on 224 columns: 3 transfers per row instead of 226 bursts)."""
    ch, jr = aug.channels, aug.sw * x.pixel_pitch
    n = tile.in_cols
    first = tile.x0 * aug.sw - aug.pad_left  # input column of item 0
    pad_start = max(0, -first) * aug.cin
    over = [first + i * aug.sw + aug.kw - x.w for i in range(n)]  # input columns past the right edge
    tail = [i for i in range(n) if over[i] > 0]
    if tail:
        pad_idx, pad_end = n - tail[0], over[tail[0]] * aug.cin + ceil_div(ch, arch.icp) * arch.icp - ch
    else:
        pad_idx, pad_end = 1, 0  # masks from the aligned end: nothing
    phases = [(0, n, pad_start, pad_end, pad_idx)]  # (first item, items, pad_start, pad_end, pad_idx)
    p = ch // jr
    if ch % jr == 0 and p > 1 and n >= p:
        i0 = n - pad_idx if tail else n  # first item with masked tail bytes
        phases = []
        for k in range(p):
            cnt = ceil_div(n - k, p)
            j0 = ceil_div(i0 - k, p)  # this phase's first masked item
            end = (1, 0) if j0 >= cnt else (cnt - j0, pad_end + jr * (k + p * j0 - i0))
            phases.append((k, cnt, max(0, pad_start - k * jr), end[1], end[0]))
        if any(e > PAD5 or i > PAD5 + 1 for _, _, _, e, i in phases):
            phases = [(0, n, pad_start, pad_end, pad_idx)]
    step = len(phases)
    for h in range(tile.n_rows):
        yy = tile.y0 + h
        if not 0 <= yy < x.h:
            continue
        bank, row0 = tile.place.where(h)
        ddr = x.addr(yy, 0) + first * x.pixel_pitch
        if ddr < 0:
            raise CodegenError(f"augmented LOAD at DDR offset {ddr}: the input map needs {AUG_MARGIN} bytes of "
                               "margin before it")
        for k, cnt, ps, pe, pi in phases:
            prog.emit("LOAD", reads=(("ddr", x_res),), writes=(buf_res,), bank_id=bank0 + bank,
                      bank_addr=(row0 + k * tile.place.pitch) % arch.bank_depth, length=cnt, channel=ch,
                      jump_read=jr * step, jump_write=tile.place.pitch * step, reg_id=x.reg_id,
                      ddr_addr=ddr + k * jr, pad_start=ps, pad_end=pe, pad_idx=pi)


def load_params(prog: Program, arch: Arch, job: ConvJob, g0: int, n: int, wrow0: int = 0, brow0: int = 0,
                 with_bias: bool = True, slot: int | None = None, tag: str | None = None,
                 banks: range | None = None) -> None:
    """LOAD the weights of output-channel groups [g0, g0+n) of `job` into CONVW rows from wrow0 (one LOAD per
    bank) and (with_bias) their biases into BIAS rows from brow0. `slot`: the rows lie in that half of the CONVW
    and BIAS banks (Program.next_slot alternates them op by op; fused_conv.param_slots places a fused kernel's
    members), so the LOADs wait only for the CONVs reading that half; None: the whole banks. `tag`: see
    param_resources. `banks`: only the weights of these CONVW banks (output channels within a group; None: all)."""
    w_res, b_res = param_resources(slot, tag)
    icp, ocp = arch.icp, arch.ocp
    cg_in, cg_out = ceil_div(job.cin, icp), ceil_div(job.cout, ocp)
    wrows = job.kh * job.kw * cg_in
    convw = arch.bank_group("CONVW").base_id
    every = range(min(ocp, job.cout - g0 * ocp))
    for o in every if banks is None else (o for o in banks if o in every):
        for i0, cnt in split_even(n * job.kh * job.kw, FIELD10):
            prog.emit("LOAD", reads=(("ddr", "params"),), writes=w_res, bank_id=convw + o,
                      bank_addr=wrow0 + i0 * cg_in, length=cnt, channel=cg_in * icp, jump_read=cg_in * icp,
                      jump_write=cg_in, reg_id=job.params_reg,
                      ddr_addr=job.w_offset + ((o * cg_out + g0) * wrows + i0 * cg_in) * icp)
    if with_bias:
        load_biases(prog, arch, job, g0, n, brow0, b_res)


def load_biases(prog: Program, arch: Arch, job: ConvJob, g0: int, n: int, brow0: int, res: tuple) -> None:
    """LOAD the biases of output-channel groups [g0, g0+n) of `job` into BIAS rows from brow0 (one LOAD; `res`:
    the dependency resources of those rows, param_resources)."""
    ocp = arch.ocp
    prog.emit("LOAD", reads=(("ddr", "params"),), writes=res, bank_id=arch.bank_group("BIAS").base_id,
              bank_addr=brow0, length=n, channel=ocp, jump_read=ocp, jump_write=1, reg_id=job.params_reg,
              ddr_addr=job.b_offset + g0 * ocp)


def param_resources(slot: int | None, tag: str | None = None) -> tuple[tuple, tuple]:
    """The dependency resources of parameters in half `slot` of the CONVW / BIAS banks (None: the whole banks);
    `tag` names one member's rows of a kernel holding several (program.SLOTTED: they do not conflict with the
    other members' but with whole slots), so its first CONVs need not wait for the others' LOADs."""
    if tag is not None:
        return ((("convw", tag),), (("bias", tag),)) if slot is None else \
            ((("convw", slot, tag),), (("bias", slot, tag),))
    if slot is None:
        return (("convw",),), (("bias",),)
    return (("convw", slot),), (("bias", slot),)


def _conv_tiling(arch: Arch, job: ConvJob, y: FMap, pool: PoolOnSave | None) -> tuple:
    """The tiling emit_conv runs: (vpp, lmax, chunk, halved, flat, ring, swap): rows and columns per tile,
    output-channel groups per weight load and whether weights are double-buffered (conv_tile_of), the flat
    raster length when the conv runs flat, the input ring or the group swap when they need fewer column tiles."""
    half = arch.bank_depth // 2
    found = conv_tile_of(arch, job)
    if found is None:
        raise CodegenError(f"op {job.name!r}: no tile of kernel {job.kh}x{job.kw}, {job.cin} input channels fits "
                           f"half an image bank ({half} rows) of {arch.name}")
    (vpp, lmax, chunk), halved = found
    if pool is not None:
        vpp -= vpp % 2
        if vpp < 2 or lmax < 2 or y.h % 2 or y.w % 2 or job.aug is not None:
            raise CodegenError(f"op {job.name!r}: the pool cannot run on this conv's tiles (PoolOnSave needs even "
                               f"tiles of at least 2 x 2 and an even {y.h}x{y.w} output)")
    flat = flat_length(arch, job, y, chunk) if pool is None else None
    ring = None
    found_ring = input_ring(arch, job, vpp, chunk) if flat is None else None
    if found_ring is not None:
        ring_l = variant_tile((vpp, found_ring[1], chunk), job.variant)[1]
        if ceil_div(y.w, ring_l) < ceil_div(y.w, lmax):  # fewer column tiles, fewer CONVs
            ring, lmax = found_ring[0], ring_l
    swap = group_swap(arch, job, vpp, chunk) if flat is None else None
    swap_chunk = chunk
    if swap is not None and chunk > 1:
        swap_chunk, swap = _swap_chunk(arch, job, y, vpp, chunk, swap)
    if swap is not None:
        swap_l = variant_tile((vpp, swap, swap_chunk), job.variant)[1]
        if ceil_div(y.w, swap_l) < ceil_div(y.w, lmax):
            ring, lmax, chunk = None, swap_l, swap_chunk
        else:
            swap = None
    return vpp, lmax, chunk, halved, flat, ring, swap


def emit_conv(prog: Program, arch: Arch, job: ConvJob, x: FMap, y: FMap, x_res: str, y_res: str,
              pool: PoolOnSave | None = None) -> None:
    """Emit the instructions computing y = conv(x) (x, y in DDR) with the tiles of `job.variant`. x_res / y_res
    name the DDR tensors for the dependency tracker. With `pool`, y only gives the conv output's size: the pooled
    map pool.y (named y_res) is what is saved (PoolOnSave)."""
    icp, ocp = arch.icp, arch.ocp
    half = arch.bank_depth // 2
    cg_in = ceil_div(job.cin, icp)
    cg_out = ceil_div(job.cout, ocp)
    wrows = job.kh * job.kw * cg_in
    if wrows > arch.bank_depth:
        raise CodegenError(f"op {job.name!r}: weights need kh*kw*ceil(ic/icp) = {wrows} rows per CONVW bank, "
                           f"more than bank_depth {arch.bank_depth}")
    vpp, lmax, chunk, halved, flat, ring, swap = _conv_tiling(arch, job, y, pool)
    vb0 = arch.bank_group("VB0").base_id
    vb1 = arch.bank_group("VB1").base_id
    row_tiles = [(p, min(vpp, y.h - p)) for p in range(0, y.h, vpp)]
    col_tiles = split_even(y.w, lmax) if pool is None else [(2 * q, 2 * n) for q, n in split_even(y.w // 2, lmax // 2)]
    widest = max(length for _, length in col_tiles)
    zero = None if job.zero_offset is None else (job.params_reg, job.zero_offset)
    pieces = None if pool is not None or job.aug is not None or ring is not None or y.h % vpp == 0 else \
        piece_band(arch, job, x, y, vpp, col_tiles, half if swap is None else arch.bank_depth - chunk * widest,
                   zero)
    buf = 0
    first = True
    # Each windowed tile's SAVEs (and pool ALUs) are emitted after the next tile's CONVs: a pair's token counter
    # holds at most one token along program order (Program._depend), so with them right after their own CONVs the
    # next tile's first CONV would wait for them (one SAVE, or the pool ALUs and a SAVE, per tile) instead of
    # the SAVEs of two tiles back, which its output half really waits for.
    pending = None
    for g0, n in split_even(cg_out, chunk):
        slot = prog.next_slot("convw") if halved else None
        wbase = 0 if slot is None else slot * half
        load_params(prog, arch, job, g0, n, wbase, wbase, slot=slot)
        w_res, b_res = param_resources(slot)
        if flat is not None:
            for tile in raster_tiles(y.h * y.w, arch.pp, flat, even=False):
                _emit_flat_tile(prog, arch, job, x, y, x_res, y_res, tile, g0, n, cg_in, buf * half,
                                (vb0, vb1, buf), wbase, w_res + b_res)
                buf ^= 1
            continue
        for p0, v in row_tiles:
            band = pieces if p0 + v == y.h else None
            for q0, length, piece in ([(q, ln, None) for q, ln in col_tiles] if band is None else band):
                if piece is not None:
                    tile = PieceTile.of(arch.pp, job.kh, job.kw, job.sh, job.sw, job.pads, piece, length, cg_in,
                                        0 if swap is not None else buf * half, zero)
                if swap is not None:
                    saves = _emit_swapped_tile(prog, arch, job, x, y, x_res, y_res, p0, v, q0, length, g0, n, cg_in,
                                               buf, arch.bank_depth - chunk * widest, first, wbase, w_res + b_res,
                                               pool, tile if piece is not None else None)
                elif piece is not None:
                    in_res = conv_reads = (("vb0", buf),)
                elif ring is None:
                    tile = WindowTile.of(arch.pp, job.kh, job.kw, job.sh, job.sw, job.pads, p0, v, q0, length,
                                         cg_in, buf * half)
                    in_res, conv_reads = (("vb0", buf),), (("vb0", buf),)
                else:
                    tile = ring.tile(arch.pp, job, p0, v, q0, length, cg_in, buf)
                    in_res, conv_reads = ring.resources(buf, first)
                if swap is None:
                    saves = _emit_tile(prog, arch, job, tile, in_res, conv_reads, x, y, x_res, y_res, p0, v, q0,
                                       length, g0, n, buf * half, (vb0, vb1, buf), wbase, w_res + b_res,
                                       pool=pool)
                first = False
                buf ^= 1
                if pending is not None:
                    pending()
                pending = saves
    if pending is not None:
        pending((("vb0",), ("vb1",)) if swap is not None else ())


def piece_band(arch: Arch, job: ConvJob, x: FMap, y: FMap, vpp: int, col_tiles: list[tuple[int, int]],
               in_rows: int, zero: tuple[int, int] | None) -> list[tuple[int, int, tuple]] | None:
    """The last row band of a windowed conv (v = y.h % vpp rows) as PieceTiles: each of its rows cut into
    vpp // v near-equal column pieces, vpp pieces per tile, as [(0, length, pieces)]; or None when that is not
    fewer CONV columns in no more CONVs than its column tiles, or does not fit: the window within `in_rows` rows
    of each bank and the 10-bit line field, the output within the widest column tile, kh within the CONV's
    stride field, a zero map (`zero`) where a window leaves the map."""
    v = y.h % vpp
    k = vpp // v if v else 0
    if k < 2 or job.kh > CONV_STRIDE_FIELD_MAX:
        return None
    p0 = y.h - v
    row_pieces = [(p0 + i, q, c) for i in range(v) for q, c in split_even(y.w, ceil_div(y.w, k))]
    tiles = [tuple(row_pieces[i:i + vpp]) for i in range(0, len(row_pieces), vpp)]
    lengths = [max(c for _, _, c in t) for t in tiles]
    if sum(lengths) >= sum(ln for _, ln in col_tiles) or len(tiles) > len(col_tiles) \
            or max(lengths) > max(ln for _, ln in col_tiles):
        return None
    cg_in = ceil_div(job.cin, arch.icp)
    out = []
    for t, ln in zip(tiles, lengths):
        tile = PieceTile.of(arch.pp, job.kh, job.kw, job.sh, job.sw, job.pads, t, ln, cg_in, 0, zero)
        if tile.place.endl > FIELD10 or tile.place.footprint(tile.n_rows) > in_rows \
                or (zero is None and tile.needs_zeros(x)):
            return None
        out.append((0, ln, t))
    return out


def piece_zero_bytes(arch: Arch, job: ConvJob, y: FMap) -> int:
    """Zero bytes the PieceTiles of `job` may load as padding (a window line of at most y.w outputs), 0 when the
    conv has no padding or no last row band that piece_band could cut (v = y.h % vpp rows with vpp // v >= 2)."""
    found = conv_tile_of(arch, job)
    if not any(job.pads) or found is None or job.aug is not None:
        return 0
    v = y.h % found[0][0]
    return ((y.w - 1) * job.sw + job.kw) * job.cin if v and found[0][0] // v >= 2 else 0


#: Largest stride_h a CONVINIT takes (the conv stride white-list 1-8): a PieceTile runs with stride_h = kh.
CONV_STRIDE_FIELD_MAX = 8


@dataclass(frozen=True)
class InputRing:
    """Input tiles placed round-robin over the image bank group instead of in bank halves.

    A tile of vpp rows fetches nk = ceil(((vpp-1)*sh + kh) / sh) line-slot groups (S = sh rows of E bank rows
    each); with the first bank always bank 0 and the tile in one half, the first nk % PP banks of the group hold
    one slot group more than the others and bound the line length. Here the second tile of a double-buffered pair
    starts on the bank after the first tile's last (row-fetch rule with b0 = bank_id_in mod PP, isa1-semantics.md
    3.3), so two tiles fill ceil(2*nk/PP) slot groups of every bank evenly: 3 instead of 4 for a 3x3 stride-1
    conv with vpp = PP = 4, i.e. lines of depth/3 rows instead of depth/4, up to a third fewer column tiles (and
    CONVs paying conv_fill_cycles). Fields: E (rows between line slots), nk."""

    endl: int
    nk: int

    def tile(self, pp: int, job: "ConvJob", p0: int, vpp: int, q0: int, length: int, cg_in: int,
             parity: int) -> WindowTile:
        start = parity * self.nk  # first slot group of this tile in the ring
        return WindowTile.of(pp, job.kh, job.kw, job.sh, job.sw, job.pads, p0, vpp, q0, length, cg_in,
                             (start // pp) * job.sh * self.endl, self.endl, start % pp)

    @staticmethod
    def resources(parity: int, first: bool) -> tuple[tuple, tuple]:
        """(what a tile's LOADs write, what its CONVs read). The ring overlaps both bank halves the other
        emitters use, ("vb0", 0) and ("vb0", 1): the op's first LOADs wait for every earlier user of them and its
        CONVs count as readers of both (the next op's LOADs wait for them), while inside the op the tiles
        alternate between the ring's own two resources."""
        own = ("vb0", "ring", parity)
        halves = (("vb0", 0), ("vb0", 1))
        return ((own,) + halves if first else (own,)), (own,) + halves


def input_ring(arch: Arch, job: "ConvJob", vpp: int, chunk: int) -> tuple[InputRing, int] | None:
    """(InputRing, widest L) when the ring placement allows a longer line than the halves (see InputRing), or
    None."""
    s, pp = job.sh, arch.pp
    nk = ((vpp - 1) * s + job.kh - 1) // s + 1
    halves_slots = 2 * ((nk - 1) // pp + 1)
    slots = ceil_div(2 * nk, pp)
    if slots >= halves_slots or (nk % pp + nk - 1) // pp + 1 > MAX_WRAPS:
        return None
    endl = min(FIELD10, arch.bank_depth // slots // s)
    in_cols = endl // ceil_div(job.cin, arch.icp)
    if in_cols < job.kw:
        return None
    lim = min((in_cols - job.kw) // job.sw + 1, arch.bank_depth // 2 // chunk, FIELD10)
    return InputRing(endl, nk), lim


def group_swap(arch: Arch, job: "ConvJob", vpp: int, chunk: int) -> int | None:
    """Widest L of a tile of vpp rows whose input (at row 0 of one image bank group, tightly placed: E = its line)
    and `chunk` output groups of L pixels (at the top of the other group) together fit one group's depth, or None
    when there are not two image bank groups or no L fits.

    The tiles alternate: tile t reads its input from group t % 2 and writes its output to group (t + 1) % 2, so
    while tile t computes, tile t+1 loads into the input rows of the other group and tile t-1's outputs (in the
    top rows of this group) are saved: the double buffering of the halves, with a line almost twice as long where
    the output needs few rows (few resident output groups, short lines of many input channel groups)."""
    if arch.img_bank_groups < 2:
        return None
    cg_in = ceil_div(job.cin, arch.icp)
    nr = (vpp - 1) * job.sh + job.kh
    slots = (((nr - 1) // job.sh) // arch.pp + 1) * job.sh  # line slots per bank (tiling.RowPlacement.footprint)
    # input slots*cg_in*((L-1)*sw + kw) rows + output chunk*L rows <= depth, line E <= the 10-bit fields
    per_l = slots * cg_in * job.sw + chunk
    lim = (arch.bank_depth - slots * cg_in * (job.kw - job.sw)) // per_l
    lim = min(lim, (FIELD10 // cg_in - job.kw) // job.sw + 1, FIELD10)
    return lim if lim >= 1 else None


def _swap_chunk(arch: Arch, job: ConvJob, y: FMap, vpp: int, chunk: int, lim: int) -> tuple[int, int]:
    """(chunk, widest L) of the group swap: half the resident output groups when that leaves room for lines
    long enough to need fewer column tiles (fewer CONVs, each paying conv_fill_cycles) and the input, loaded once
    more per extra chunk, stays cheap beside the CONVs: all its passes at most half as many bank rows as the op
    has CONV cycles (LOAD writes at least one row per cycle, while the CONVs run). VGG-16 conv2_1 on ZU2: two
    chunks of 6 and 5 groups with one column tile of 112 instead of one chunk of 11 with two."""
    half_chunk = ceil_div(chunk, 2)
    lim_h = group_swap(arch, job, vpp, half_chunk)
    if lim_h is None or ceil_div(y.w, lim_h) >= ceil_div(y.w, lim):
        return chunk, lim
    cg_in = ceil_div(job.cin, arch.icp)
    row_tiles = ceil_div(y.h, vpp)
    in_rows = row_tiles * ((vpp - 1) * job.sh + job.kh) * ((y.w - 1) * job.sw + job.kw) * cg_in
    conv_cycles = ceil_div(job.cout, arch.ocp) * row_tiles * job.kh * job.kw * cg_in * y.w
    passes = ceil_div(ceil_div(job.cout, arch.ocp), half_chunk)
    return (half_chunk, lim_h) if 2 * passes * in_rows <= conv_cycles else (chunk, lim)


def _emit_swapped_tile(prog: Program, arch: Arch, job: ConvJob, x: FMap, y: FMap, x_res: str, y_res: str, p0: int,
                       v: int, q0: int, length: int, g0: int, n: int, cg_in: int, parity: int, out_base: int,
                       first: bool, wbase: int, params: tuple, pool: PoolOnSave | None = None,
                       piece: PieceTile | None = None) -> Callable[..., None]:
    """One tile of the group-swap placement (group_swap): input in rows [0, out_base) of image bank group
    `parity`, output from row out_base of the other group.

    Resources: the input and output rows are parts of the halves the other emitters use ("vb0", 0) / ("vb0", 1)
    ..., named ("vbK", half, "in") and ("vbK", half, "out"), so they conflict with those halves but not with each
    other. The op's first LOADs also write both whole groups, so they wait for every earlier user of the image
    banks, and its last SAVE reads both (emit_conv passes `barrier`), so every later user waits for it, and through
    it for every CONV and SAVE of the op."""
    half = arch.bank_depth // 2
    groups = ("vb0", "vb1")
    gin, gout = groups[parity], groups[1 - parity]
    out_end = out_base + n * length
    in_res = tuple((gin, h, "in") for h in range(2) if h * half < out_base)
    out_res = tuple((gout, h, "out") for h in range(2) if out_base < (h + 1) * half and h * half < out_end)
    tile = piece or WindowTile.of(arch.pp, job.kh, job.kw, job.sh, job.sw, job.pads, p0, v, q0, length, cg_in, 0)
    if tile.place.footprint(tile.n_rows) > out_base:
        raise CodegenError(f"op {job.name!r}: a group-swap tile's input ({tile.place.footprint(tile.n_rows)} rows) "
                           f"overlaps its output from row {out_base}")  # group_swap's rule makes this impossible
    loads = in_res + (((groups[0],), (groups[1],)) if first else ())
    banks = (arch.bank_group(gin.upper()).base_id, arch.bank_group(gout.upper()).base_id, parity)
    return _emit_tile(prog, arch, job, tile, loads, in_res, x, y, x_res, y_res, p0, v, q0, length, g0,
                      n, out_base, banks, wbase, params, out_res, pool)


def _emit_tile(prog: Program, arch: Arch, job: ConvJob, tile: WindowTile, in_res: tuple, conv_reads: tuple,
               x: FMap, y: FMap, x_res: str, y_res: str, p0: int, vpp: int, q0: int, length: int, g0: int, n: int,
               base: int, banks: tuple[int, int, int], wbase: int, params: tuple,
               out_res: tuple | None = None, pool: PoolOnSave | None = None) -> Callable[..., None]:
    """One output tile: its input window (placed by `tile`) loaded into bank group banks[0], one CONV per
    resident output group into group banks[1] at `base`; returns what emits its vpp SAVEs (or pool ALUs and
    pooled SAVEs), for the caller to emit after the next tile's CONVs. `out_res`: the resource of the output rows
    (default the half ("vb1", buf))."""
    vb0, vb1, buf = banks
    out_res = out_res or ("vb1", buf)
    if job.aug is None:
        tile.emit_loads(prog, vb0, arch.bank_depth, x, x_res, 0, job.cin, in_res)
    else:
        emit_augmented_loads(prog, arch, job.aug, tile, vb0, x, x_res, in_res)
        x = replace(x, w=y.w, c=job.cin)  # the items: one per output column, none in the padding
    # a piece tile's rows are independent (stride_h = kh: each reads its own kh fetched rows)
    pieces = tile.pieces if isinstance(tile, PieceTile) else None
    emit_conv_groups(prog, arch, job if pieces is None else replace(job, sh=job.kh),
                     ConvIn.of(vb0, tile.place, arch.bank_depth), ConvOut(vb1, base, n), n,
                     vpp if pieces is None else len(pieces), length, wbase, wbase, conv_reads + params, (out_res,),
                     tile.pads(x))
    channels = min(n * arch.ocp, job.cout - g0 * arch.ocp)
    # (output row, column, columns, first column in the tile row): a piece's columns end its tile row
    rows = [(p0 + r, q0, length, 0) for r in range(vpp)] if pieces is None else \
        [(oy, ox, cnt, length - cnt) for oy, ox, cnt in pieces]

    def saves(barrier: tuple = ()) -> None:
        """`barrier`: resources the last SAVE reads as well."""
        if pool is not None:
            emit_pool_on_save(prog, arch, pool, y_res, out_res, vb1, base, p0, vpp, q0, length, g0, n, channels,
                               barrier)
            return
        for r, (oy, ox, cnt, skip) in enumerate(rows):
            prog.emit("SAVE", reads=(out_res,) + (barrier if r == len(rows) - 1 else ()), writes=(("ddr", y_res),),
                      bank_id=vb1 + r, bank_addr=base + skip * n,
                      length=cnt, channel=channels, jump_read=n, jump_write=y.pixel_pitch, reg_id=y.reg_id,
                      ddr_addr=y.addr(oy, ox, g0 * arch.ocp))
    return saves


def emit_pool_on_save(prog: Program, arch: Arch, pool: PoolOnSave, y_res: str, out_res: tuple, g0_bank: int,
                       base: int, p0: int, vpp: int, q0: int, length: int, g0: int, n: int, channels: int,
                       barrier: tuple = ()) -> None:
    """The PoolOnSave of one conv tile (conv row r in bank r of the group from g0_bank, from row `base`, pixels n
    rows apart): pooled row j is one ALU over conv rows 2j, 2j+1 (banks 2j, 2j+1), written in place over conv row
    2j, then one SAVE per pooled row. In place is safe: pooled pixel x overwrites conv pixel x, which the ALU read
    for pooled pixel x // 2, no later than its own inputs 2x, 2x+1."""
    for j in range(vpp // 2):
        prog.emit("ALUINIT", exec_mode=pool.exec_mode, kernel_h=2, kernel_w=2, stride_h=1, stride_w=2,
                  stride_offset_in=0, stride_offset_out=0, stride_out=1, channel_group=n,
                  channel_offset=n * arch.icp - channels, length=length // 2, shift_prelu_p=0, shift_prelu_n=0,
                  jump_read=n, jump_read_endl=n * length, jump_read_weights=n, jump_write=n, jump_write_endl=1,
                  act_type=0, shift_bias=0, shift_cut=pool.shift_cut, multi_factor=pool.multi_factor)
        prog.emit("ALU", reads=(out_res,), writes=(out_res,), bank_id_out=g0_bank + 2 * j, bank_addr_out=base,
                  pad_bottom=1, valid_pixel_parallel=1, bank_id_in=g0_bank + 2 * j, bank_addr_in=base, pad_top=0,
                  pad_left=0, pad_right=1, bank_addr_in_1=base, kernel_d=1, bank_addr_weights=0, bank_addr_in_2=base,
                  bank_addr_bias=0, bank_addr_in_3=base)
    y = pool.y
    for j in range(vpp // 2):
        prog.emit("SAVE", reads=(out_res,) + (barrier if j == vpp // 2 - 1 else ()), writes=(("ddr", y_res),),
                  bank_id=g0_bank + 2 * j, bank_addr=base,
                  length=length // 2, channel=channels, jump_read=n, jump_write=y.pixel_pitch, reg_id=y.reg_id,
                  ddr_addr=y.addr(p0 // 2 + j, q0 // 2, g0 * arch.ocp))
