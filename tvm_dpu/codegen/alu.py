"""Code generation of ALU ops (ISA1 misc engine): max/avg pool, depthwise conv, leaky/prelu, hard-sigmoid.

Same tiling scheme as conv.py (row-fetch placement in VB0, row-store into VB1, halves alternating between tiles),
with the ALU's limits: at most alu_pp rows per instruction, 11-bit length, 13-bit line pitch, and the channels
processed in chunks of channel groups (an ALU instruction keeps channels: C = cg*CP in and out). Depthwise
weights live in the single DWCONVW bank, so a chunk is also bounded by kh*kw*cg rows there.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.isa import enum_codes
from tvm_dpu.codegen.layout import ParamBlob, ceil_div, pack_channel_vector, pack_dw_weights
from tvm_dpu.types import REG_PARAMS, FMap
from tvm_dpu.codegen.program import Program
from tvm_dpu.codegen.tiling import MAX_WRAPS, CodegenError, RowPlacement, WindowTile, max_valid_rows, split_even
from tvm_dpu.xgraph import ops as xops
from tvm_dpu.xgraph.graph import Graph, Op

#: ALUINIT exec_mode codes (isa1-semantics.md 9.2), name -> code.
ALU_MODES = enum_codes("alu_exec_mode")
_LENGTH_MAX = 2048  # 11-bit minus field
_LOAD_MAX = 1024  # LOAD / SAVE length: 10-bit minus field
_ENDL_MAX = 8192  # 13-bit minus field
_JUMP_MAX = 1024  # 10-bit minus field
_PAD_LT_MAX = 15  # 4-bit pad_left / pad_top


@dataclass(frozen=True)
class AluJob:
    """One ALU op over a whole feature map."""

    name: str
    mode: str  # key of ALU_MODES
    c: int  # channels (in = out)
    kh: int = 1
    kw: int = 1
    sh: int = 1
    sw: int = 1
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)  # top, left, bottom, right
    act_type: int = 0
    shift_cut: int = 0
    shift_bias: int = 0
    multi_factor: int = 0
    shift_prelu_p: int = 0
    shift_prelu_n: int = 0
    w_offset: int | None = None  # dwconv weights [kh][kw][cg*CP], or prelu slopes [cg*CP]
    b_offset: int | None = None  # dwconv bias [cg*CP]
    params_reg: int = 0


def alu_job(arch: Arch, graph: Graph, op: Op, params: ParamBlob) -> AluJob:
    """The AluJob of a max/avg pool or a standalone activation (relu / relu6 as a unit-weight 1x1 depthwise conv,
    hard-sigmoid, leaky relu, prelu), its parameters appended to `params`."""
    q = xops.quant_params(op, graph)
    c = graph.tensors[op.outputs[0]].shape[1]
    if op.type in ("max_pool2d", "avg_pool2d"):
        win = xops.pool_window(op, graph)
        if op.type == "max_pool2d":
            return AluJob(op.name, "maxpool", c, win.kh, win.kw, win.sh, win.sw, tuple(win.pads),
                          shift_cut=q.shift_cut)
        return AluJob(op.name, "avgpool", c, win.kh, win.kw, win.sh, win.sw, tuple(win.pads),
                      shift_cut=q.shift_cut, multi_factor=q.multi_factor)
    mode = xops.attr(op, "mode")
    if mode in ("relu", "relu6"):
        off = params.add(pack_dw_weights(np.full((c, 1, 1, 1), q.weight, np.int8), arch.icp))
        return AluJob(op.name, "dwconv_nobias", c, act_type=q.act_type, shift_cut=q.shift_cut, w_offset=off,
                      params_reg=REG_PARAMS)
    if mode == "hard_sigmoid":
        return AluJob(op.name, "hard_sigmoid", c, shift_cut=q.shift_cut, shift_bias=q.shift_bias)
    if mode == "leaky_relu":
        return AluJob(op.name, "leaky_relu", c, multi_factor=q.multi_factor, shift_prelu_p=q.shift_prelu_p,
                      shift_prelu_n=q.shift_prelu_n)
    a = graph.param(op, "alpha").data
    off = params.add(pack_channel_vector(a, arch.icp), op.params["alpha"])
    return AluJob(op.name, "prelu", c, shift_prelu_p=q.shift_prelu_p, shift_prelu_n=q.shift_prelu_n,
                  w_offset=off, params_reg=REG_PARAMS)


def _choose(arch: Arch, job: AluJob, width: int) -> tuple[int, int, int]:
    """(vpp, L, channel groups per chunk)."""
    half = arch.bank_depth // 2
    cg = ceil_div(job.c, arch.icp)
    vpp = max_valid_rows(arch.pp, arch.alu_pp, job.kh, job.sh)
    n_rows = (vpp - 1) * job.sh + job.kh
    wraps = ((n_rows - 1) // job.sh) // arch.pp + 1
    chunk = cg
    if job.mode.startswith("dwconv"):
        chunk = min(chunk, arch.bank_depth // (job.kh * job.kw))
    while chunk >= 1:
        e_max = min(_ENDL_MAX, half // (wraps * job.sh))
        in_cols = min(e_max // chunk, _LOAD_MAX)  # one LOAD per input line
        if in_cols >= job.kw and chunk <= _JUMP_MAX:
            lim = min((in_cols - job.kw) // job.sw + 1, half // chunk, _LENGTH_MAX, _LOAD_MAX, width)
            if lim >= 1:
                return vpp, lim, chunk
        chunk //= 2
    raise CodegenError(f"op {job.name!r}: no ALU tile of kernel {job.kh}x{job.kw} fits half an image bank of "
                       f"{arch.name}")


#: Bands replace the per-pass tiles of a pool only where those would read its input at least this many times
#: over: the timing model finds bands slower on pools whose tiles re-read little (3x3 pools, read 1.1-1.9 times
#: over: +4-22% cycles), as fast on YOLOX's SPP pools (5x5 to 13x13 over a 13x13 map, read 2.8 to 18 times over by
#: the tiles of PP=4 DPUs, 2.6 to 3.2 by PP=8 ones' whose 5x5 pool, at 1.85, keeps its tiles).
BAND_MIN_REREAD = 2.5


def _tile_reads(arch: Arch, job: AluJob, x: FMap, y: FMap) -> int:
    """Input pixels the per-pass tiles of `emit_alu` LOAD (rows and columns clipped to the map), summed over the
    tiles of one channel chunk."""
    vpp, lmax, _ = _choose(arch, job, y.w)
    span = lambda o0, n, s, k, pad, size: max(0, min(size, o0 * s - pad + (n - 1) * s + k) - max(0, o0 * s - pad))
    rows = sum(span(p0, min(vpp, y.h - p0), job.sh, job.kh, job.pads[0], x.h) for p0 in range(0, y.h, vpp))
    cols = sum(span(q0, n, job.sw, job.kw, job.pads[1], x.w) for q0, n in split_even(y.w, lmax))
    return rows * cols


def _band_chunk(arch: Arch, job: AluJob, x: FMap, y: FMap) -> int | None:
    """Channel groups per chunk of a pool run as bands (`_emit_bands`): every input row of the map's full width
    LOADed once per chunk into half of VB0, the passes reading it in place. The largest chunk that fits, or None
    where the per-pass tiles re-read the input less than BAND_MIN_REREAD times over or no chunk fits."""
    if job.mode not in ("maxpool", "avgpool") or job.kh <= job.sh or y.w > min(_LENGTH_MAX, _LOAD_MAX):
        return None
    if _tile_reads(arch, job, x, y) < BAND_MIN_REREAD * x.h * x.w:
        return None
    if (arch.pp - 1 + (job.kh - 1) // job.sh) // arch.pp + 1 > MAX_WRAPS:
        return None  # a one-row pass from the last bank of a wrap would fetch more than MAX_WRAPS wraps
    half = arch.bank_depth // 2
    in_cols = (y.w - 1) * job.sw + job.kw
    n_rows = (y.h - 1) * job.sh + job.kh
    for n in range(min(ceil_div(job.c, arch.icp), _JUMP_MAX), 0, -1):
        e = in_cols * n
        # the band in VB0, two output slots of one pass in VB1
        if e <= _ENDL_MAX and RowPlacement(arch.pp, job.sh, e, n, 0).footprint(n_rows) <= half \
                and 2 * y.w * n <= half:
            return n
    return None


def _emit_bands(prog: Program, arch: Arch, job: AluJob, x: FMap, y: FMap, x_res: str, y_res: str,
                chunk: int) -> None:
    """A pool over the whole map per chunk of channel groups: one LOAD per input row into half of VB0 (halves
    alternating between chunks), then passes of at most alu_pp output rows, each reading its rows of the band in
    place (bank_id_in at the pass's first fetched row, the bases of the wraps it reads: the row-fetch rule,
    isa1-semantics 3.3) as soon as its rows are in (each row its own resource), writing one of two VB1 slots, and
    SAVEs. Each input row is read from DDR once per
    chunk, where per-pass tiles read the kh - sh rows two passes share again (SPP's 13x13 max pool over a 13x13
    map on B512 read its input 18 times)."""
    cp, half, pp = arch.icp, arch.bank_depth // 2, arch.pp
    vb0, vb1 = arch.bank_group("VB0").base_id, arch.bank_group("VB1").base_id
    vpp = max_valid_rows(pp, arch.alu_pp, job.kh, job.sh)
    cg = ceil_div(job.c, cp)
    buf = 0
    for g0, n in split_even(cg, chunk):
        c0 = g0 * cp
        cc = min(n * cp, job.c - c0)
        base = buf * half
        tile = WindowTile.of(pp, job.kh, job.kw, job.sh, job.sw, job.pads, 0, y.h, 0, y.w, n, base)
        tile.emit_loads(prog, vb0, arch.bank_depth, x, x_res, c0, cc, ("vb0", buf), per_row=True)
        _, pad_left, _, pad_right = tile.pads(x)
        e = tile.place.endl
        p, slot = 0, 0
        while p < y.h:
            b0 = p % pp  # the pass's first fetched row is band row p * sh: fetched row p // 1 of stride sh
            v = min(vpp, y.h - p)
            while (b0 + ((v - 1) * job.sh + job.kh - 1) // job.sh) // pp + 1 > MAX_WRAPS:
                v -= 1
            y0 = p * job.sh - job.pads[0]
            n_rows = (v - 1) * job.sh + job.kh
            pad_top, pad_bottom = max(0, -y0), max(0, y0 + n_rows - x.h)
            a = [(base + (p // pp + g) * job.sh * e) % arch.bank_depth for g in range(MAX_WRAPS)]
            out = base + slot * y.w * n
            prog.emit("ALUINIT", exec_mode=ALU_MODES[job.mode], kernel_h=job.kh, kernel_w=job.kw, stride_h=job.sh,
                      stride_w=job.sw, stride_offset_in=0, stride_offset_out=0, stride_out=1, channel_group=n,
                      channel_offset=n * cp - cc, length=y.w, shift_prelu_p=job.shift_prelu_p,
                      act_type=job.act_type, shift_bias=job.shift_bias, shift_cut=job.shift_cut,
                      shift_prelu_n=job.shift_prelu_n, multi_factor=job.multi_factor, jump_read=n,
                      jump_read_endl=e, jump_read_weights=n, jump_write=n, jump_write_endl=1)
            rows = tuple(("vb0", buf, "row", h) for h in range(p * job.sh, p * job.sh + n_rows))
            prog.emit("ALU", reads=rows, writes=(("vb1", buf, slot),), bank_id_out=vb1, bank_addr_out=out,
                      pad_bottom=job.kh - 1 - pad_bottom, valid_pixel_parallel=v, bank_id_in=vb0 + b0,
                      bank_addr_in=a[0], pad_top=pad_top, pad_left=pad_left, pad_right=job.kw - 1 - pad_right,
                      bank_addr_in_1=a[1], kernel_d=1, bank_addr_weights=0, bank_addr_in_2=a[2], bank_addr_bias=0,
                      bank_addr_in_3=a[3])
            for r in range(v):
                prog.emit("SAVE", reads=(("vb1", buf, slot),), writes=(("ddr", y_res),), bank_id=vb1 + r,
                          bank_addr=out, length=y.w, channel=cc, jump_read=n, jump_write=y.pixel_pitch,
                          reg_id=y.reg_id, ddr_addr=y.addr(p + r, 0, c0))
            p += v
            slot ^= 1
        buf ^= 1


def emit_alu(prog: Program, arch: Arch, job: AluJob, x: FMap, y: FMap, x_res: str, y_res: str) -> None:
    """Emit y = alu_op(x) for a whole feature map."""
    if job.mode not in ALU_MODES:
        raise CodegenError(f"op {job.name!r}: unknown ALU mode {job.mode!r}")
    pt, pl, _, _ = job.pads
    if pt > _PAD_LT_MAX or pl > _PAD_LT_MAX:
        raise CodegenError(f"op {job.name!r}: pad top/left {pt}/{pl} exceed the ALU's 4-bit pad fields (15)")
    band = _band_chunk(arch, job, x, y)
    if band is not None:
        _emit_bands(prog, arch, job, x, y, x_res, y_res, band)
        return
    cp = arch.icp
    half = arch.bank_depth // 2
    vpp, lmax, chunk = _choose(arch, job, y.w)
    vb0 = arch.bank_group("VB0").base_id
    vb1 = arch.bank_group("VB1").base_id
    dwb = arch.bank_group("DWCONVW").base_id
    biasb = arch.bank_group("BIAS").base_id
    cg = ceil_div(job.c, cp)
    taps = job.kh * job.kw
    buf = 0
    for g0, n in split_even(cg, chunk):
        c0 = g0 * cp
        cc = min(n * cp, job.c - c0)
        if job.mode in ("dwconv", "dwconv_nobias"):
            prog.emit("LOAD", reads=(("ddr", "params"),), writes=(("dwconvw",),), bank_id=dwb, bank_addr=0,
                      length=taps, channel=cc, jump_read=cg * cp, jump_write=n, reg_id=job.params_reg,
                      ddr_addr=job.w_offset + c0)
        if job.mode == "prelu":
            prog.emit("LOAD", reads=(("ddr", "params"),), writes=(("dwconvw",),), bank_id=dwb, bank_addr=0,
                      length=1, channel=cc, jump_read=cc, jump_write=n, reg_id=job.params_reg,
                      ddr_addr=job.w_offset + c0)
        if job.mode == "dwconv":
            prog.emit("LOAD", reads=(("ddr", "params"),), writes=(("bias",),), bank_id=biasb, bank_addr=0,
                      length=1, channel=cc, jump_read=cc, jump_write=n, reg_id=job.params_reg,
                      ddr_addr=job.b_offset + c0)
        for p0 in range(0, y.h, vpp):
            v = min(vpp, y.h - p0)
            for q0, length in split_even(y.w, lmax):
                _tile(prog, arch, job, x, y, x_res, y_res, p0, v, q0, length, c0, cc, n, buf * half,
                      (vb0, vb1, buf))
                buf ^= 1


def _tile(prog: Program, arch: Arch, job: AluJob, x: FMap, y: FMap, x_res: str, y_res: str, p0: int, vpp: int,
          q0: int, length: int, c0: int, cc: int, n: int, base: int, banks: tuple[int, int, int]) -> None:
    vb0, vb1, buf = banks
    tile = WindowTile.of(arch.pp, job.kh, job.kw, job.sh, job.sw, job.pads, p0, vpp, q0, length, n, base)
    tile.emit_loads(prog, vb0, arch.bank_depth, x, x_res, c0, cc, ("vb0", buf))
    pad_top, pad_left, pad_bottom, pad_right = tile.pads(x)
    place = tile.place
    prog.emit("ALUINIT", exec_mode=ALU_MODES[job.mode], kernel_h=job.kh, kernel_w=job.kw, stride_h=job.sh,
              stride_w=job.sw, stride_offset_in=0, stride_offset_out=0, stride_out=1, channel_group=n,
              channel_offset=n * arch.icp - cc, length=length, shift_prelu_p=job.shift_prelu_p,
              act_type=job.act_type, shift_bias=job.shift_bias, shift_cut=job.shift_cut,
              shift_prelu_n=job.shift_prelu_n, multi_factor=job.multi_factor, jump_read=n,
              jump_read_endl=place.endl, jump_read_weights=n, jump_write=n, jump_write_endl=1)
    a = [b % arch.bank_depth for b in place.bases()]
    reads = [("vb0", buf)]
    if job.mode in ("dwconv", "dwconv_nobias", "prelu"):
        reads.append(("dwconvw",))
    if job.mode == "dwconv":
        reads.append(("bias",))
    prog.emit("ALU", reads=tuple(reads), writes=(("vb1", buf),), bank_id_out=vb1, bank_addr_out=base,
              pad_bottom=job.kh - 1 - pad_bottom, valid_pixel_parallel=vpp, bank_id_in=vb0, bank_addr_in=a[0],
              pad_top=pad_top, pad_left=pad_left, pad_right=job.kw - 1 - pad_right, bank_addr_in_1=a[1],
              kernel_d=1, bank_addr_weights=0, bank_addr_in_2=a[2], bank_addr_bias=0, bank_addr_in_3=a[3])
    for r in range(vpp):
        prog.emit("SAVE", reads=(("vb1", buf),), writes=(("ddr", y_res),), bank_id=vb1 + r, bank_addr=base,
                  length=length, channel=cc, jump_read=n, jump_write=y.pixel_pitch, reg_id=y.reg_id,
                  ddr_addr=y.addr(p0 + r, q0, c0))
