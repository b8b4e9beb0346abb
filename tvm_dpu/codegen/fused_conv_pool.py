"""conv_pool / pw_dw: a conv feeding an ALU window op (max/avg pool, depthwise conv) through fused_chain's
circular buffer, or, for a 2x2 stride-2 pool, the conv's own tiles pooled in the banks before each SAVE
(conv.PoolOnSave)."""
from __future__ import annotations

from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.fused_chain import (ChainPass, ChainTile, chain_tile, emit_chain, emit_pass_saves, load_chain_conv,
                                         load_dw_params, plain_rows, saves_side, side_covered, window_of)
from tvm_dpu.codegen.conv import PoolOnSave, augmentation, emit_conv
from tvm_dpu.codegen.fused_conv import conv_job, fusable
from tvm_dpu.codegen.layout import ParamBlob, ceil_div
from tvm_dpu.codegen.program import Program
from tvm_dpu.codegen.row_fold import FOLD_PREFIX, fold_factors, fold_of, folded_fmaps, folded_graph
from tvm_dpu.codegen.tiling import CodegenError
from tvm_dpu.types import FMap
from tvm_dpu.xgraph import ops as xops
from tvm_dpu.xgraph.graph import Graph, Op

#: Row folds timed per group (the largest that fit): each is a compile and simulation of the group.
_FOLDS_TIMED = 2

#: pw_dw's variants (fused_pw_dw_pw.PW_DW_PW_VARIANTS' names): "tight" keeps no spare wrap in the circular buffer
#: (chain_tile's spare=0), so wider strips. Offered only to fork chains (fusion.fork: the conv's output also read
#: outside the group), where it decides whether the chain wins: YOLOX-nano's 52x52 CSP output into a stride-2
#: depthwise conv on B512, 150,305 cycles as two lone ops, 164,431 chained with strips of 13 columns, 141,297 with
#: one of 26. Other groups keep their one emission (and their programs).
PW_DW_VARIANTS = ("wide", "tight")


def _conv_pool_tile(arch: Arch, graph: Graph, conv: Op, pool: Op, spare: int = 1) -> ChainTile | None:
    """Tile of conv -> ALU window op (max/avg pool, or depthwise conv for pw_dw), or None (chain_tile; the
    depthwise weights in DWCONVW, its biases after the conv's; `spare`: chain_tile's)."""
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
    return chain_tile(arch, graph, conv, pool, arch.alu_pp, cg_mid, 0, spare)


def _folded_tile(arch: Arch, graph: Graph, conv: Op, pool: Op, k: int) -> ChainTile | None:
    """Tile of the chain folded by k (row_fold), or None unless one strip takes the k folded rows whole (a strip
    of fewer would only be a smaller fold). Without a spare wrap where one is needed: the buffer then holds the wider
    rows the fold is for."""
    g, folded_pool = folded_graph(graph, conv, pool, k)
    for spare in (1, 0):
        tile = _conv_pool_tile(arch, g, conv, folded_pool, spare)
        if tile is not None and tile.lp == k:
            return tile
    return None


def fold_variants(arch: Arch, graph: Graph, conv: Op, pool: Op) -> tuple[str, ...]:
    """The "fold<k>" variants (row_fold) of conv -> whole-width pool: the largest _FOLDS_TIMED k whose folded tile
    fits (the search times them against the unfolded "wide")."""
    ks = []
    for k in fold_factors(graph, conv, pool):
        if _folded_tile(arch, graph, conv, pool, k) is None:
            break  # wider folds only need more of the buffer and the 10-bit line pitch
        ks.append(k)
    return tuple(f"{FOLD_PREFIX}{k}" for k in ks[-_FOLDS_TIMED:])


def halving_pool(graph: Graph, pool: Op) -> bool:
    """Whether `pool` is a 2x2 stride-2 unpadded max / avg pool over an even map, halving it: one ALU per pair of
    its input rows pools them in place in the banks (conv.PoolOnSave)."""
    if pool.type not in ("max_pool2d", "avg_pool2d") or pool.type == "avg_pool2d" and xops.attr(pool, "global"):
        return False
    win = window_of(graph, pool)
    _, _, h, w = graph.tensors[pool.inputs[0]].shape
    _, _, hp, wp = graph.tensors[pool.outputs[0]].shape
    return ((win.kh, win.kw, win.sh, win.sw) == (2, 2, 2, 2) and not any(win.pads) and h % 2 == 0 and w % 2 == 0
            and (hp, wp) == (h // 2, w // 2))


def pool_on_save(graph: Graph, pool: Op, y: FMap) -> PoolOnSave:
    """The PoolOnSave of a halving_pool `pool` whose output is `y` in DDR."""
    from tvm_dpu.codegen.alu import ALU_MODES

    qp = xops.quant_params(pool, graph)
    mode = "maxpool" if pool.type == "max_pool2d" else "avgpool"
    return PoolOnSave(ALU_MODES[mode], qp.shift_cut, qp.multi_factor if mode == "avgpool" else 0, y)


def _pools_on_save(arch: Arch, graph: Graph, conv: Op, pool: Op) -> bool:
    """Whether conv -> pool runs as the conv's own tiles with the pool applied before each SAVE (conv.PoolOnSave):
    a halving_pool, the conv neither channel-augmented nor pointwise (alone, a pointwise conv takes flat tiles,
    which a pool cannot follow)."""
    if not halving_pool(graph, pool) or not fusable(arch, graph, conv):
        return False
    cw = xops.conv_window(conv, graph)
    cin = graph.tensors[conv.inputs[0]].shape[1]
    if (cw.kh, cw.kw) == (1, 1) and not any(cw.pads):
        return False
    return (arch.pp >= 4 and arch.icp == arch.ocp
            and augmentation(arch, cin, 1, cw.kh, cw.kw, cw.sh, cw.sw, tuple(cw.pads), cin) is None)


def conv_pool_fits(arch: Arch, graph: Graph, conv: Op, pool: Op) -> bool:
    """Whether conv -> pool (or pointwise conv -> depthwise conv, template pw_dw) fits emit_conv_pool (a conv whose
    output is read outside the group too only as a chain that computes all of it: its strips SAVE it)."""
    if saves_side(graph, conv, pool):
        return side_covered(graph, conv, pool) and _conv_pool_tile(arch, graph, conv, pool) is not None
    return _pools_on_save(arch, graph, conv, pool) or _conv_pool_tile(arch, graph, conv, pool) is not None


def group_fits(arch: Arch, graph: Graph, ops: list[Op]) -> bool:
    """The template registry's fit test of a conv_pool / pw_dw group [conv, consumer]."""
    return conv_pool_fits(arch, graph, *ops)


def group_variants(arch: Arch, graph: Graph, ops: list[Op]) -> tuple[str, ...]:
    """The template registry's variants of a conv_pool / pw_dw group [conv, consumer]: a fork chain's (the conv's
    output also read outside the group) PW_DW_VARIANTS where its tight tile differs from its wide one; else "wide",
    then the chain's row folds (fold_variants)."""
    conv, consumer = ops
    if saves_side(graph, conv, consumer):
        tight = _conv_pool_tile(arch, graph, conv, consumer, spare=0)
        return PW_DW_VARIANTS if tight is not None and tight != _conv_pool_tile(arch, graph, conv, consumer) \
            else PW_DW_VARIANTS[:1]
    return ("wide",) + (fold_variants(arch, graph, conv, consumer) if conv_pool_fits(arch, graph, conv, consumer)
                        else ())


def emit_group(prog: Program, params: ParamBlob, arch: Arch, graph: Graph, ops: list[Op], fmaps: dict[str, FMap],
               variant: str) -> None:
    """The template registry's emitter of a conv_pool / pw_dw group [conv, consumer]: `variant` one of
    PW_DW_VARIANTS, or a row fold "fold<k>" (on maps whose rows are not one DDR run, the unfolded chain)."""
    k = fold_of(variant)
    conv, pool = ops
    folded = folded_fmaps(fmaps, conv, pool, k) if k > 1 else None
    if folded is None:
        emit_conv_pool(prog, arch, graph, conv, pool, fmaps, params, "wide" if k > 1 else variant)
        return
    tile = _folded_tile(arch, graph, conv, pool, k)
    if tile is None:
        raise CodegenError(f"ops {conv.name!r}+{pool.name!r}: no fold by {k} on {arch.name}")
    g, folded_pool = folded_graph(graph, conv, pool, k)
    emit_conv_pool(prog, arch, g, conv, folded_pool, folded, params, tile=tile)


def emit_conv_pool(prog: Program, arch: Arch, graph: Graph, conv: Op, pool: Op, fmaps: dict[str, FMap],
                   params: ParamBlob, variant: str = "wide", tile: ChainTile | None = None) -> None:
    """conv -> max/avg pool (or depthwise conv) per strip of pool output columns (emit_chain): as soon as the
    conv rows of a pass of vp pool rows are in the circular buffer, one ALU pools them and SAVEs write the
    result. `tile`: the chain's tile when the caller chose it (a row fold), else _conv_pool_tile's."""
    from tvm_dpu.codegen.alu import ALU_MODES

    if tile is None and _pools_on_save(arch, graph, conv, pool) and not saves_side(graph, conv, pool):
        # the conv's lone tiles (the widest the banks allow) with the pool before each SAVE, rather than the
        # chain's narrower tiles (each CONV pays conv_fill_cycles)
        job = conv_job(arch, graph, conv, params)
        y = fmaps[pool.outputs[0]]
        _, c, h, w = graph.tensors[conv.outputs[0]].shape
        emit_conv(prog, arch, job, fmaps[conv.inputs[0]], FMap.dense(y.reg_id, 0, h, w, c), conv.inputs[0],
                  pool.outputs[0], pool=pool_on_save(graph, pool, y))
        return
    if tile is None:
        if variant not in PW_DW_VARIANTS:
            raise CodegenError(f"op {conv.name!r}: conv_pool / pw_dw variant {variant!r}: choose one of "
                               f"{', '.join(PW_DW_VARIANTS)} or fold<k>")
        tile = _conv_pool_tile(arch, graph, conv, pool, spare=0 if variant == "tight" else 1)
    if tile is None:
        raise CodegenError(f"ops {conv.name!r}+{pool.name!r}: conv+pool fusion does not fit {arch.name}")
    job = conv_job(arch, graph, conv, params)
    qp = xops.quant_params(pool, graph)
    win = window_of(graph, pool)
    mode = {"max_pool2d": "maxpool", "avg_pool2d": "avgpool", "depthwise_conv2d": "dwconv"}[pool.type]
    cp = arch.icp
    cg_mid = ceil_div(job.cout, arch.ocp)
    # The conv's weights go group by group only where it is the program's first CONV: there its weight LOADs lie
    # on the path to the first CONV (PointPillars' PFN, ShuffleNetV2's pw -> dw subgraphs: 12-36 cycles each).
    # After other ops the extra LOAD instructions measured slower (MobileNetV2 +0.15-0.38%, YOLOv3-tiny +0.3%).
    ja, _, later = load_chain_conv(prog, arch, graph, conv, job, tile, fmaps[conv.inputs[0]], params,
                                   split=not any(e.instr.name == "CONV" for e in prog.entries))
    alu_reads: tuple = ()
    if mode == "dwconv":  # depthwise weights in DWCONVW, biases after the conv's in BIAS
        load_dw_params(prog, arch, graph, pool, job.cout, params, cg_mid)
        alu_reads = (("dwconvw",), ("bias",))
        alu_q = dict(act_type=qp.act_type, shift_bias=qp.shift_bias_isa, shift_cut=qp.shift_cut, multi_factor=0)
    else:
        alu_q = dict(act_type=0, shift_bias=0, shift_cut=qp.shift_cut,
                     multi_factor=qp.multi_factor if mode == "avgpool" else 0)
    vb0, vb1 = arch.bank_group("VB0").base_id, arch.bank_group("VB1").base_id
    y = fmaps[pool.outputs[0]]

    def emit_pass(ps: ChainPass, ob: int, oslot: int) -> None:
        prog.emit("ALUINIT", exec_mode=ALU_MODES[mode], kernel_h=win.kh, kernel_w=win.kw, stride_h=win.sh,
                  stride_w=win.sw, stride_offset_in=ps.s0, stride_offset_out=0, stride_out=1, channel_group=cg_mid,
                  channel_offset=cg_mid * cp - job.cout, length=ps.length, shift_prelu_p=0, shift_prelu_n=0,
                  jump_read=cg_mid, jump_read_endl=ps.e, jump_read_weights=cg_mid, jump_write=cg_mid,
                  jump_write_endl=1, **alu_q)
        prog.emit("ALU", reads=ps.reads + alu_reads, writes=(("vb0", oslot, "out"),), bank_id_out=vb0,
                  bank_addr_out=ob, pad_bottom=win.kh - 1 - ps.p_bottom, valid_pixel_parallel=ps.v,
                  bank_id_in=vb1 + ps.m % arch.pp, bank_addr_in=ps.a[0], pad_top=ps.p_top, pad_left=ps.p_left,
                  pad_right=win.kw - 1 - ps.p_right, bank_addr_in_1=ps.a[1], kernel_d=1, bank_addr_weights=0,
                  bank_addr_in_2=ps.a[2], bank_addr_bias=cg_mid, bank_addr_in_3=ps.a[3])
        emit_pass_saves(prog, arch, y, pool.outputs[0], ps, ob, job.cout, cg_mid, oslot)

    emit_chain(prog, arch, graph, conv, pool, tile, job, cg_mid, fmaps, emit_pass, ja and (ja, plain_rows(arch, job)),
               later)
