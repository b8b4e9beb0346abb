"""dw_pw: a depthwise conv (ALU) whose output tile in VB1 is the input tile of a pointwise conv (CONV)."""
from __future__ import annotations

from typing import Any

import numpy as np

from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.conv import load_params
from tvm_dpu.codegen.fused_conv import conv_job, emit_pointwise_tile, fusable, is_pointwise
from tvm_dpu.codegen.layout import ParamBlob, ceil_div, pack_channel_vector
from tvm_dpu.codegen.program import Program
from tvm_dpu.codegen.tiling import FIELD10, CodegenError, WindowTile, max_valid_rows, split_even
from tvm_dpu.types import REG_PARAMS, FMap
from tvm_dpu.xgraph import ops as xops
from tvm_dpu.xgraph.graph import Graph, Op


def _dw_pw_tile(arch: Arch, graph: Graph, dw: Op, pw: Op) -> tuple[int, int] | None:
    """(vpp, L) of the dw_pw pipeline's ALU passes, or None: every channel group of the depthwise in one ALU
    pass, the pointwise weights resident, and the dw input window, the dw output (VB1) and the pw output (VB0,
    reusing the consumed window) within half a bank. The pointwise CONVs of a tile cover `tile_rows` of them."""
    if (arch.icp != arch.ocp or tuple(xops.attr(dw, "dilations")) != (1, 1) or not fusable(arch, graph, pw)
            or not is_pointwise(graph, pw)):  # emit_pointwise_tile reads the ALU's output pixel by pixel
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


def group_fits(arch: Arch, graph: Graph, ops: list[Op]) -> bool:
    """The template registry's fit test of a dw_pw group [dw, pw]."""
    return dw_pw_fits(arch, graph, *ops)


def emit_group(prog: Program, params: ParamBlob, arch: Arch, graph: Graph, ops: list[Op], fmaps: dict[str, FMap],
               variant: str) -> None:
    """The template registry's emitter of a dw_pw group [dw, pw] (one emission: `variant` is "wide")."""
    emit_dw_pw(prog, arch, graph, *ops, fmaps, params)


def emit_dw_pw(prog: Program, arch: Arch, graph: Graph, dw: Op, pw: Op, fmaps: dict[str, FMap],
               params: ParamBlob) -> None:
    """Depthwise conv (ALU) then pointwise conv (CONV) per tile: the ALU leaves all channel groups of its output
    tile in VB1, the CONVs read them there as their input tile and write into the consumed VB0 window, the SAVEs
    write the pointwise output; the depthwise output never touches DDR."""
    from tvm_dpu.codegen.layout import pack_dw_weights

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
    wd_off = params.add(pack_dw_weights(wd, arch.icp), dw.params["weights"])
    bd_off = params.add(pack_channel_vector(bias_d, arch.icp), dw.params.get("bias", ""))
    job = conv_job(arch, graph, pw, params)
    half = arch.bank_depth // 2
    cg, n_out = ceil_div(c, arch.icp), ceil_div(job.cout, arch.ocp)
    taps = win.kh * win.kw
    prog.emit("LOAD", reads=(("ddr", "params"),), writes=(("dwconvw",),), bank_id=arch.bank_group("DWCONVW").base_id,
              bank_addr=0, length=taps, channel=c, jump_read=cg * arch.icp, jump_write=cg, reg_id=REG_PARAMS,
              ddr_addr=wd_off)
    prog.emit("LOAD", reads=(("ddr", "params"),), writes=(("bias",),), bank_id=arch.bank_group("BIAS").base_id,
              bank_addr=0, length=1, channel=c, jump_read=c, jump_write=cg, reg_id=REG_PARAMS, ddr_addr=bd_off)
    load_params(prog, arch, job, 0, n_out, 0, cg)  # pointwise biases after the depthwise ones
    x, y = fmaps[dw.inputs[0]], fmaps[pw.outputs[0]]
    rows = tile_rows(arch, vpp)
    buf = 0
    for p0 in range(0, y.h, rows):
        v = min(rows, y.h - p0)
        for q0, length in split_even(y.w, lmax):
            base = buf * half
            _emit_dw_passes(prog, arch, dw, qd, win, x, cg, c, buf, base, p0, v, vpp, q0, length)
            emit_pointwise_tile(prog, arch, job, buf, base, v, length, 0, cg, y, pw.outputs[0], p0, q0)
            buf ^= 1


def tile_rows(arch: Arch, vpp: int) -> int:
    """Output rows per dw_pw tile: as many ALU passes of `vpp` rows as the CONV's PP banks hold. The ALU's pixel
    parallelism is half the CONV's on the ISA1 DPUs (alu_pp), so one pass per tile ran every pointwise CONV on
    half its rows and paid twice the CONV fills of the unfused pointwise conv (ShuffleNetV2's stage3.0 on
    dnnvm-zu2: 4 CONVs of 136 cycles where the unfused conv runs 2; the fused group lost to its members)."""
    return vpp * max(1, arch.pp // vpp)


def _emit_dw_passes(prog: Program, arch: Arch, dw: Op, qd: Any, win: Any, x: FMap, cg: int, c: int, buf: int,
                    base: int, p0: int, v: int, vpp: int, q0: int, length: int) -> None:
    """The depthwise ALU passes of one tile (output rows p0 .. p0+v, `vpp` per pass), pass j writing its rows to
    VB1 banks from j*vpp. Each pass's input window gets its own rows of VB0's half when they all fit (so a
    pass's LOADs need not wait for the previous pass's ALU), else they share `base`."""
    from tvm_dpu.codegen.alu import ALU_MODES

    vb0, vb1 = arch.bank_group("VB0").base_id, arch.bank_group("VB1").base_id
    half = arch.bank_depth // 2
    starts = list(range(0, v, vpp))

    def window(r0: int, row0: int) -> WindowTile:
        return WindowTile.of(arch.pp, win.kh, win.kw, win.sh, win.sw, tuple(win.pads), p0 + r0, min(vpp, v - r0), q0,
                             length, cg, row0)

    tiles = [window(r0, base) for r0 in starts]
    steps = [t.place.footprint(t.n_rows) for t in tiles]
    apart = sum(steps) <= half
    for j, (r0, wt) in enumerate(zip(starts, tiles)):
        if apart and j:
            wt = window(r0, base + sum(steps[:j]))
        # A window of its own rows is its own resource, so its LOADs do not wait for the earlier passes' ALUs;
        # the pointwise CONV's write of ("vb0", buf) still waits for every pass (a name's parts lie in it).
        win_res = ("vb0", buf, "dw", j) if apart else ("vb0", buf)
        vs = min(vpp, v - r0)
        wt.emit_loads(prog, vb0, arch.bank_depth, x, dw.inputs[0], 0, c, win_res)
        pad_top, pad_left, pad_bottom, pad_right = wt.pads(x)
        prog.emit("ALUINIT", exec_mode=ALU_MODES["dwconv"], kernel_h=win.kh, kernel_w=win.kw, stride_h=win.sh,
                  stride_w=win.sw, stride_offset_in=0, stride_offset_out=0, stride_out=1, channel_group=cg,
                  channel_offset=cg * arch.icp - c, length=length, shift_prelu_p=0, act_type=qd.act_type,
                  shift_bias=qd.shift_bias_isa, shift_cut=qd.shift_cut, shift_prelu_n=0, multi_factor=0,
                  jump_read=cg, jump_read_endl=wt.place.endl, jump_read_weights=cg, jump_write=cg,
                  jump_write_endl=1)
        a = [b % arch.bank_depth for b in wt.place.bases()]
        prog.emit("ALU", reads=(win_res, ("dwconvw",), ("bias",)), writes=(("vb1", buf),),
                  bank_id_out=vb1 + r0, bank_addr_out=base, pad_bottom=win.kh - 1 - pad_bottom,
                  valid_pixel_parallel=vs, bank_id_in=vb0, bank_addr_in=a[0], pad_top=pad_top, pad_left=pad_left,
                  pad_right=win.kw - 1 - pad_right, bank_addr_in_1=a[1], kernel_d=1, bank_addr_weights=0,
                  bank_addr_in_2=a[2], bank_addr_bias=0, bank_addr_in_3=a[3])
