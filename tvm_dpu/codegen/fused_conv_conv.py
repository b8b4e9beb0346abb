"""conv_conv: conv -> conv with the intermediate on chip; a pointwise second conv reads the first conv's output
tile in VB1 (emit_conv_pw), a windowed one reads fused_chain's circular buffer (emit_conv_window)."""
from __future__ import annotations

from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.conv import ConvIn, ConvOut, emit_conv_groups, emit_pool_on_save, load_params
from tvm_dpu.codegen.fused_chain import (ChainPass, ChainTile, chain_tile, emit_chain, emit_pass_saves, load_chain_conv,
                                         plain_rows)
from tvm_dpu.codegen.fused_conv_pool import pool_on_save
from tvm_dpu.codegen.fused_conv import (conv_job, emit_input_tile, emit_pointwise_tile, emit_tile_convs, fusable,
                                        is_pointwise, output_tiles, probe)
from tvm_dpu.codegen.layout import ParamBlob, ceil_div
from tvm_dpu.codegen.program import Program
from tvm_dpu.codegen.tiling import CodegenError, conv_tile
from tvm_dpu.types import FMap
from tvm_dpu.xgraph.graph import Graph, Op


def _conv_pw_tile(arch: Arch, graph: Graph, a: Op, b: Op) -> tuple[int, int] | None:
    """(vpp, L) of conv -> pointwise conv with the first conv's output tile (every channel group) kept in VB1,
    or None: both convs' weights and biases resident, the pointwise output within the consumed VB0 half."""
    if arch.icp != arch.ocp or not is_pointwise(graph, b):
        return None
    if not (fusable(arch, graph, a) and fusable(arch, graph, b)):
        return None
    ja = probe(arch, graph, a)
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
    tile = _conv_pw_tile(arch, graph, a, b)
    if tile is None:
        raise CodegenError(f"ops {a.name!r}+{b.name!r}: conv+pointwise fusion does not fit {arch.name}")
    vpp, lmax = tile
    ja, jb = conv_job(arch, graph, a, params), conv_job(arch, graph, b, params)
    half = arch.bank_depth // 2
    cg_in, cg_mid, cg_out = ceil_div(ja.cin, arch.icp), ceil_div(ja.cout, arch.ocp), ceil_div(jb.cout, arch.ocp)
    wrows_a = ja.kh * ja.kw * cg_in
    load_params(prog, arch, ja, 0, cg_mid, 0, 0, tag="a")
    x, y = fmaps[a.inputs[0]], fmaps[b.outputs[0]]
    buf = 0
    for k, t in enumerate(output_tiles(False, y, vpp, lmax)):
        base, v, length = buf * half, t.vpp, t.length
        wt = emit_input_tile(prog, arch, x, a.inputs[0], ja, t, buf)
        emit_tile_convs(prog, arch, ja, wt, wt.pads(x), v, length, cg_mid, buf, base, tag="a")
        if k == 0:
            # B's parameters after A's first CONVs in program order (the engines run apart): those CONVs need only
            # A's parameters and the first tile, and wait for no token a B LOAD posts (posted before them, it
            # would be the second on the LOAD->CONV counter, which program.Program keeps at one)
            load_params(prog, arch, jb, 0, cg_out, cg_mid * wrows_a, cg_mid, tag="b")
        emit_pointwise_tile(prog, arch, jb, buf, base, v, length, cg_mid * wrows_a, cg_mid, y, b.outputs[0], t.p0,
                            t.q0, (("convw", "b"), ("bias", "b")))
        buf ^= 1


def conv_window_tile(arch: Arch, graph: Graph, a: Op, b: Op, spare: int = 1, align: int = 1, min_strips: int = 1,
                     masked: bool = False) -> ChainTile | None:
    """Tile of conv -> windowed conv (B not pointwise), or None (chain_tile with B's weights resident after
    A's and B doing up to PP rows per CONV; `spare`, `align`, `min_strips`, `masked`: chain_tile's)."""
    if b.type != "conv2d" or not fusable(arch, graph, b) or is_pointwise(graph, b):
        return None
    jb = probe(arch, graph, b)
    cg_out = ceil_div(jb.cout, arch.ocp)
    return chain_tile(arch, graph, a, b, arch.pp, cg_out, jb.kh * jb.kw * ceil_div(jb.cin, arch.icp) * cg_out,
                      spare, align, min_strips, masked)


def conv_window_fits(arch: Arch, graph: Graph, a: Op, b: Op) -> bool:
    """Whether conv -> windowed conv fits emit_conv_window."""
    return conv_window_tile(arch, graph, a, b) is not None


def conv_conv_fits(arch: Arch, graph: Graph, a: Op, b: Op) -> bool:
    """Whether a conv_conv group has a fused emitter: emit_conv_pw (pointwise B) or emit_conv_window."""
    return conv_pw_fits(arch, graph, a, b) or conv_window_fits(arch, graph, a, b)


def group_fits(arch: Arch, graph: Graph, ops: list[Op]) -> bool:
    """The template registry's fit test of a conv_conv group [a, b]."""
    return conv_conv_fits(arch, graph, *ops)


def emit_group(prog: Program, params: ParamBlob, arch: Arch, graph: Graph, ops: list[Op], fmaps: dict[str, FMap],
               variant: str) -> None:
    """The template registry's emitter of a conv_conv group [a, b] (one emission: `variant` is "wide")."""
    emit_conv_conv(prog, arch, graph, *ops, fmaps, params)


def emit_conv_conv(prog: Program, arch: Arch, graph: Graph, a: Op, b: Op, fmaps: dict[str, FMap],
                   params: ParamBlob) -> None:
    """A conv_conv group: pointwise B through VB1 tiles (emit_conv_pw), else B's windows from a circular buffer."""
    if is_pointwise(graph, b):
        emit_conv_pw(prog, arch, graph, a, b, fmaps, params)
    else:
        emit_conv_window(prog, arch, graph, a, b, fmaps, params)


def emit_conv_window(prog: Program, arch: Arch, graph: Graph, a: Op, b: Op, fmaps: dict[str, FMap],
                     params: ParamBlob, tile: ChainTile | None = None, pool: Op | None = None) -> None:
    """conv A -> windowed conv B per strip of B's output columns (emit_chain): A's rows go to the circular
    buffer in VB1 in B's row-fetch layout, and as soon as the rows of B's next vp output rows are in, B's CONVs
    (one per output-channel group, all weights resident after A's) read their kh-row windows from it, wrapping
    through bank_addr_in..._3, and write an output slot in VB0 that SAVEs write out. A's output never touches
    DDR. With `pool` (a fused_conv_pool.halving_pool, and a `tile` of even strips and passes), the pool halves
    each output slot in place and the SAVEs write the pooled rows (fused_conv_conv_pool): B's output never touches
    DDR either."""
    tile = tile or conv_window_tile(arch, graph, a, b)
    if tile is None:
        raise CodegenError(f"ops {a.name!r}+{b.name!r}: conv+windowed conv fusion does not fit {arch.name}")
    ja, jb = conv_job(arch, graph, a, params), conv_job(arch, graph, b, params)
    cg_mid, cg_out = ceil_div(ja.cout, arch.ocp), ceil_div(jb.cout, arch.ocp)
    j_aug, wrow_b, _ = load_chain_conv(prog, arch, graph, a, ja, tile, fmaps[a.inputs[0]], params)
    load_params(prog, arch, jb, 0, cg_out, wrow_b, cg_mid)
    vb0, vb1 = arch.bank_group("VB0").base_id, arch.bank_group("VB1").base_id
    spec = None
    if pool is not None:
        spec = pool_on_save(graph, pool, fmaps[pool.outputs[0]])
        # B's output has no DDR map; emit_chain cuts strips and passes by its geometry
        _, c_b, h_b, w_b = graph.tensors[b.outputs[0]].shape
        fmaps = {**fmaps, b.outputs[0]: FMap.dense(spec.y.reg_id, 0, h_b, w_b, c_b)}
    y = fmaps[b.outputs[0]]

    def emit_pass(ps: ChainPass, ob: int, oslot: int) -> None:
        # B reads A's rows from the circular buffer (cg_mid groups per pixel, line pitch ps.e), its weights after
        # A's, its biases after A's cg_mid
        emit_conv_groups(prog, arch, jb, ConvIn(vb1 + ps.m % arch.pp, ps.a, ps.e), ConvOut(vb0, ob, cg_out), cg_out,
                         ps.v, ps.length, wrow_b, cg_mid, ps.reads + (("convw",), ("bias",)),
                         (("vb0", oslot, "out"),), (ps.p_top, ps.p_left, ps.p_bottom, ps.p_right), ps.s0)
        if spec is None:
            emit_pass_saves(prog, arch, y, b.outputs[0], ps, ob, jb.cout, cg_out, oslot)
        else:
            emit_pool_on_save(prog, arch, spec, pool.outputs[0], ("vb0", oslot, "out"), vb0, ob, ps.j0, ps.v,
                              ps.q0, ps.length, 0, cg_out, jb.cout)

    emit_chain(prog, arch, graph, a, b, tile, ja, cg_out, fmaps, emit_pass, j_aug and (j_aug, plain_rows(arch, ja)))
