"""pw_dw_pw: conv -> depthwise conv -> pointwise conv with both intermediate maps on chip, the shape of
MobileNet-style inverted bottlenecks and of YOLOX's CSP bottlenecks and head branches (vai_c keeps both maps in the
banks there). The first two ops run as pw_dw does (fused_chain: the conv fills a circular buffer in VB1, one ALU
per pass of the depthwise rows); each pass's depthwise output slot in VB0 is the input tile of the pointwise CONVs,
which write their output beside it in the same slot; the SAVEs write only the pointwise conv's output."""
from __future__ import annotations

from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.conv import ConvIn, ConvOut, emit_conv_groups, load_params
from tvm_dpu.codegen.fused_chain import (ChainPass, ChainTile, chain_tile, emit_chain, load_chain_conv, load_dw_params,
                                         plain_rows, window_of)
from tvm_dpu.codegen.fused_conv import conv_job, fusable, is_pointwise, probe
from tvm_dpu.codegen.layout import ParamBlob, ceil_div
from tvm_dpu.codegen.program import Program
from tvm_dpu.codegen.tiling import CodegenError, RowPlacement
from tvm_dpu.types import FMap
from tvm_dpu.xgraph import ops as xops
from tvm_dpu.xgraph.graph import Graph, Op


#: When a full slot's pointwise CONVs are emitted: "wide", after the chain conv's CONVs for the next rows (in the
#: CONV engine's order they then follow those, so the ALU that those rows feed does not wait behind them); "eager",
#: right after the slot's last depthwise pass (fewer slots in flight, which small maps with few passes prefer).
#: The fusion search times both per group (fusion.cost.simulated_cost); the plan records the choice
#: (FusionPlan.variants, keyed by the group's first conv).
PW_DW_PW_VARIANTS = ("wide", "eager")


def _tile(arch: Arch, graph: Graph, a: Op, dw: Op, pw: Op) -> ChainTile | None:
    """Tile of a -> dw -> pw, or None: chain_tile of a -> dw with each pass's output slot holding the depthwise
    output (cg_mid rows per pixel) and the pointwise output after it (cg_pw rows per pixel), the pointwise weights
    resident after a's, its biases after the depthwise ones."""
    if dw.type != "depthwise_conv2d" or pw.type != "conv2d" or not is_pointwise(graph, pw):
        return None
    if not fusable(arch, graph, pw) or tuple(xops.attr(dw, "dilations")) != (1, 1):
        return None
    c_mid = graph.tensors[a.outputs[0]].shape[1]
    if graph.tensors[dw.outputs[0]].shape[1] != c_mid or probe(arch, graph, pw).cin != c_mid:
        return None
    cg_mid = ceil_div(c_mid, arch.ocp)
    cg_pw = ceil_div(graph.tensors[pw.outputs[0]].shape[1], arch.ocp)
    win = window_of(graph, dw)
    if win.kh * win.kw * cg_mid > arch.bank_depth or 2 * cg_mid + cg_pw > arch.bank_depth:
        return None
    return chain_tile(arch, graph, a, dw, arch.alu_pp, cg_mid + cg_pw, cg_mid * cg_pw)


def pw_dw_pw_fits(arch: Arch, graph: Graph, a: Op, dw: Op, pw: Op) -> bool:
    """Whether conv -> depthwise -> pointwise fits emit_pw_dw_pw."""
    return _tile(arch, graph, a, dw, pw) is not None


def emit_pw_dw_pw(prog: Program, arch: Arch, graph: Graph, a: Op, dw: Op, pw: Op, fmaps: dict[str, FMap],
                  params: ParamBlob, variant: str = "wide") -> None:
    """a -> dw -> pw per strip of output columns (emit_chain): per pass, one ALU writes the depthwise rows into
    the pass's VB0 output slot, the pointwise CONVs (every output group, weights resident) read them there and write
    the slot's second part, and SAVEs write that to the pointwise conv's output, when `variant`
    (PW_DW_PW_VARIANTS) says. Neither a's nor the depthwise output touches DDR."""
    from tvm_dpu.codegen.alu import ALU_MODES

    if variant not in PW_DW_PW_VARIANTS:
        raise CodegenError(f"op {a.name!r}: pw_dw_pw variant {variant!r}: choose one of "
                           f"{', '.join(PW_DW_PW_VARIANTS)}")

    tile = _tile(arch, graph, a, dw, pw)
    if tile is None:
        raise CodegenError(f"ops {a.name!r}+{dw.name!r}+{pw.name!r}: conv+depthwise+pointwise fusion does not fit "
                           f"{arch.name}")
    job = conv_job(arch, graph, a, params)
    jp = conv_job(arch, graph, pw, params)
    cp = arch.icp
    cg_mid, cg_pw = ceil_div(job.cout, arch.ocp), ceil_div(jp.cout, arch.ocp)
    ja, wrow_pw, _ = load_chain_conv(prog, arch, graph, a, job, tile, fmaps[a.inputs[0]], params)
    # depthwise weights in DWCONVW, its biases after a's in BIAS, the pointwise biases after those
    qd = xops.quant_params(dw, graph)
    win = window_of(graph, dw)
    load_dw_params(prog, arch, graph, dw, job.cout, params, cg_mid)
    load_params(prog, arch, jp, 0, cg_pw, wrow_pw, 2 * cg_mid)
    vb0, vb1 = arch.bank_group("VB0").base_id, arch.bank_group("VB1").base_id
    y = fmaps[pw.outputs[0]]
    # the depthwise output has no DDR map; emit_chain cuts strips and passes by its geometry
    _, c_dw, h_dw, w_dw = graph.tensors[dw.outputs[0]].shape
    chain_maps = {**fmaps, dw.outputs[0]: FMap.dense(y.reg_id, 0, h_dw, w_dw, c_dw)}
    out_off = tile.lp * cg_mid  # the pointwise output's rows within a slot, after the depthwise output

    half = arch.bank_depth // 2
    pair = 2 * arch.alu_pp <= arch.pp  # two depthwise passes fill the PP rows of one pointwise CONV
    held: list[ChainPass] = []  # the passes written into slot `slot` so far
    ready: list[tuple[list[ChainPass], int]] = []  # a full slot whose pointwise CONVs are not emitted yet
    slot = 0

    def close() -> None:
        """The held passes' slot is full: its pointwise CONVs wait (flush) and the next passes take the other slot."""
        nonlocal slot
        if held:
            ready.append((list(held), slot))
            held.clear()
            slot ^= 1

    def flush(keep: int = 0) -> None:
        """The pointwise CONVs over the full slots but the newest `keep` (consecutive rows of one strip, from bank
        0) and their SAVEs."""
        while len(ready) > keep:
            passes, sl = ready.pop(0)
            ob, v, first = sl * half + tile.a_slot, sum(p.v for p in passes), passes[0]
            place = RowPlacement(arch.pp, 1, first.length * cg_mid, cg_mid, ob)
            # The first pointwise CONVs after the chain conv's last CONVs (in the CONV engine's order) stand for
            # every VB0 row those read: the next op's tiles are named by VB0 half (or bank under it), not by this
            # kernel's regions ("in" / "out"), so its LOADs wait for these CONVs, hence for all the chain's.
            last = passes[-1].j0 + passes[-1].v == y.h and first.q0 + first.length == y.w
            halves = (("vb0", 0), ("vb0", 1)) if (chain_done[0] or last) and not fenced[0] else ()
            fenced[0] = fenced[0] or bool(halves)
            emit_conv_groups(prog, arch, jp, ConvIn.of(vb0, place, arch.bank_depth),
                             ConvOut(vb0, ob + out_off, cg_pw), cg_pw, v, first.length, wrow_pw, 2 * cg_mid,
                             (("vb0", sl, "out"), ("convw",), ("bias",)) + halves, (("vb0", sl, "pw"),))
            for r in range(v):
                prog.emit("SAVE", reads=(("vb0", sl, "pw"),), writes=(("ddr", pw.outputs[0]),), bank_id=vb0 + r,
                          bank_addr=ob + out_off, length=first.length, channel=jp.cout, jump_read=cg_pw,
                          jump_write=y.pixel_pitch, reg_id=y.reg_id, ddr_addr=y.addr(first.j0 + r, first.q0, 0))

    emitted = [0]  # program length after the last pass: more means emit_chain has emitted conv CONVs since
    chain_done, fenced = [False], [False]  # emit_chain has returned; a flush has read both VB0 halves

    def emit_pass(ps: ChainPass, _ob: int, _oslot: int) -> None:
        # "wide": a full slot's pointwise CONVs wait until the chain conv's CONVs for the next rows are emitted;
        # a slot about to be written again is flushed first
        if len(prog) > emitted[0]:
            flush()
        last = held[-1] if held else None
        if last is not None and not (last.q0 == ps.q0 and last.j0 + last.v == ps.j0):
            close()  # a slot holds consecutive rows of one strip
        if ready and ready[0][1] == slot:
            flush(len(ready) - 1)
        ob, row = slot * half + tile.a_slot, sum(p.v for p in held)
        prog.emit("ALUINIT", exec_mode=ALU_MODES["dwconv"], kernel_h=win.kh, kernel_w=win.kw, stride_h=win.sh,
                  stride_w=win.sw, stride_offset_in=ps.s0, stride_offset_out=0, stride_out=1, channel_group=cg_mid,
                  channel_offset=cg_mid * cp - job.cout, length=ps.length, shift_prelu_p=0, shift_prelu_n=0,
                  jump_read=cg_mid, jump_read_endl=ps.e, jump_read_weights=cg_mid, jump_write=cg_mid,
                  jump_write_endl=1, act_type=qd.act_type, shift_bias=qd.shift_bias_isa, shift_cut=qd.shift_cut,
                  multi_factor=0)
        prog.emit("ALU", reads=ps.reads + (("dwconvw",), ("bias",)), writes=(("vb0", slot, "out"),),
                  bank_id_out=vb0 + row, bank_addr_out=ob, pad_bottom=win.kh - 1 - ps.p_bottom,
                  valid_pixel_parallel=ps.v, bank_id_in=vb1 + ps.m % arch.pp, bank_addr_in=ps.a[0], pad_top=ps.p_top,
                  pad_left=ps.p_left, pad_right=win.kw - 1 - ps.p_right, bank_addr_in_1=ps.a[1], kernel_d=1,
                  bank_addr_weights=0, bank_addr_in_2=ps.a[2], bank_addr_bias=cg_mid, bank_addr_in_3=ps.a[3])
        held.append(ps)
        if not pair or len(held) == 2 or ps.v < arch.alu_pp:
            close()
            if variant == "eager":
                flush()
        emitted[0] = len(prog)

    emit_chain(prog, arch, graph, a, dw, tile, job, cg_mid + cg_pw, chain_maps, emit_pass,
               ja and (ja, plain_rows(arch, job)))
    chain_done[0] = True
    close()
    flush()
