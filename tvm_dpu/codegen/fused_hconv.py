"""Horizontal fusion (templates hconv2 / hconv3): convs sharing one input, each input tile loaded once for all."""
from __future__ import annotations

from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.conv import load_params
from tvm_dpu.codegen.fused_conv import (conv_geometry, conv_job, emit_input_tile, emit_tile_convs, flattenable, fusable,
                                        output_tiles, param_slots, probe)
from tvm_dpu.codegen.layout import ParamBlob, ceil_div
from tvm_dpu.codegen.program import Program
from tvm_dpu.codegen.tiling import CodegenError, conv_tile
from tvm_dpu.types import FMap
from tvm_dpu.xgraph.graph import Graph, Op


def hconv_fits(arch: Arch, graph: Graph, convs: list[Op]) -> bool:
    """Whether convs sharing one input can run as one pipeline: same window geometry, all weights and biases
    resident at once, and one output tile of every member in half of VB1."""
    if len({conv_geometry(graph, c) for c in convs}) != 1 or arch.icp != arch.ocp:
        return False
    if not all(fusable(arch, graph, c) for c in convs):
        return False
    jobs = [probe(arch, graph, c) for c in convs]
    cg_in = ceil_div(jobs[0].cin, arch.icp)
    total = sum(ceil_div(j.cout, arch.ocp) for j in jobs)
    if jobs[0].kh * jobs[0].kw * cg_in * total > arch.bank_depth:
        return False
    tile = conv_tile(arch, *jobs[0].geometry, total)
    return tile is not None and tile[2] == total


def emit_group(prog: Program, params: ParamBlob, arch: Arch, graph: Graph, ops: list[Op], fmaps: dict[str, FMap],
               variant: str) -> None:
    """The template registry's emitter of an hconv2 / hconv3 group (one emission: `variant` is "wide")."""
    emit_hconv(prog, arch, graph, ops, fmaps, params)


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
    places = param_slots(prog, arch, [(wrows * n, n) for n in ns])
    # Member i's parameters (tagged apart) are loaded after member i-1's first CONVs in program order: the first
    # CONVs wait only for the first member's parameters and the first input tile (see fused_conv_conv.emit_conv_pw).
    load = [lambda i=i, j=j, n=n, place=place: load_params(prog, arch, j, 0, n, place[1], place[2], slot=place[0],
                                                           tag=f"m{i}")
            for i, (j, n, place) in enumerate(zip(jobs, ns, places))]
    load[0]()
    vb1 = arch.bank_group("VB1").base_id
    ys = [fmaps[c.outputs[0]] for c in convs]
    job0 = jobs[0]
    flat = flattenable(job0, x, *ys)
    buf = 0
    for k, t in enumerate(output_tiles(flat, ys[0], vpp, lmax)):
        base, length = buf * half, t.length
        wt = emit_input_tile(prog, arch, x, x_res, job0, t, buf)
        pads = (0, 0, 0, 0) if flat else wt.pads(x)
        for i, (j, n, f, (slot, wrow0, brow0)) in enumerate(zip(jobs, ns, first, places)):
            emit_tile_convs(prog, arch, j, wt, pads, t.vpp, length, n, buf, base + f * length, wrow0, brow0, slot,
                            f"m{i}")
            if k == 0 and i + 1 < len(load):
                load[i + 1]()
        for c, j, n, f, y in zip(convs, jobs, ns, first, ys):
            for r in range(t.vpp):
                for j0, a, cnt in t.runs(r, y.w, y.addr, y.pixel_pitch):
                    prog.emit("SAVE", reads=(("vb1", buf),), writes=(("ddr", c.outputs[0]),), bank_id=vb1 + r,
                              bank_addr=base + f * length + j0 * n, length=cnt, channel=j.cout, jump_read=n,
                              jump_write=y.pixel_pitch, reg_id=y.reg_id, ddr_addr=a)
        buf ^= 1
