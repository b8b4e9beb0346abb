"""conv_add: conv2d + eltwise add, the add done by ELEW on the conv's output tile in VB1 before SAVE."""
from __future__ import annotations

from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.conv import ConvJob, load_params
from tvm_dpu.codegen.fused_conv import (conv_job, emit_input_tile, emit_tile_convs, flat_chunk, flattenable, fusable,
                                        output_tiles, param_slots, probe)
from tvm_dpu.codegen.isa import enum_code
from tvm_dpu.codegen.layout import ParamBlob, ceil_div
from tvm_dpu.codegen.program import Program
from tvm_dpu.codegen.tiling import OUT_GROUPS_MAX, CodegenError, conv_tile, split_even
from tvm_dpu.types import FMap
from tvm_dpu.xgraph import ops as xops
from tvm_dpu.xgraph.graph import Graph, Op


#: Tile chunkings of conv_add over a flattened pointwise conv (fused_conv.flat_chunk): "wide", the fewest CONVs,
#: then the fewest chunks; "one_pass", the fewest chunks (each loads the conv's input again and moves the add's
#: operand and output in narrower strided pieces), then the fewest CONVs. Which is faster depends on the CONV fill
#: against the DMA, so the fusion search times both per group (fusion.cost.simulated_cost) and the plan records
#: the choice (FusionPlan.variants, keyed by the conv). A conv that is not flattened has one chunking.
CONV_ADD_VARIANTS = ("wide", "one_pass")


def conv_add_fits(arch: Arch, graph: Graph, conv: Op) -> bool:
    if arch.icp != arch.ocp or not fusable(arch, graph, conv):
        return False
    job = probe(arch, graph, conv)
    wrows = job.kh * job.kw * ceil_div(job.cin, arch.icp)
    if wrows > arch.bank_depth:
        return False
    tile = conv_tile(arch, *job.geometry, min(ceil_div(job.cout, arch.ocp), arch.bank_depth // wrows))
    return tile is not None and arch.bank_depth // 2 // (2 * tile[2]) >= 1


def _flat_tile(arch: Arch, job: ConvJob, n_pix: int, vpp: int, variant: str) -> tuple[int, int]:
    """(output groups per chunk, L) of the flattened conv of a conv_add tiled as `variant`."""
    cg_out = ceil_div(job.cout, arch.ocp)
    wrows = job.kh * job.kw * ceil_div(job.cin, arch.icp)
    return flat_chunk(arch, job.cin, cg_out, n_pix, vpp, min(cg_out, arch.bank_depth // wrows, OUT_GROUPS_MAX), 2,
                      variant == "one_pass")


def conv_add_variants(arch: Arch, graph: Graph, conv: Op) -> tuple[str, ...]:
    """The CONV_ADD_VARIANTS that tile the conv_add of `conv` differently (a conv that is not flattened, or whose
    two orders pick the same chunking, has one), so only those need timing."""
    job = probe(arch, graph, conv)
    _, _, h, w = graph.tensors[conv.outputs[0]].shape
    tile = conv_tile(arch, *job.geometry, min(ceil_div(job.cout, arch.ocp),
                                              arch.bank_depth // (job.kh * job.kw * ceil_div(job.cin, arch.icp))))
    if tile is None or (job.kh, job.kw, job.sh, job.sw, tuple(job.pads)) != (1, 1, 1, 1, (0, 0, 0, 0)):
        return CONV_ADD_VARIANTS[:1]
    tiles = {_flat_tile(arch, job, h * w, tile[0], v) for v in CONV_ADD_VARIANTS}
    return CONV_ADD_VARIANTS if len(tiles) > 1 else CONV_ADD_VARIANTS[:1]


def group_fits(arch: Arch, graph: Graph, ops: list[Op]) -> bool:
    """The template registry's fit test of a conv_add group [conv, add]."""
    return conv_add_fits(arch, graph, ops[0])


def group_variants(arch: Arch, graph: Graph, ops: list[Op]) -> tuple[str, ...]:
    """The template registry's variants of a conv_add group: those that tile its conv differently."""
    return conv_add_variants(arch, graph, ops[0])


def emit_conv_add(prog: Program, arch: Arch, graph: Graph, conv: Op, add: Op, fmaps: dict[str, FMap],
                  params: ParamBlob, variant: str = "wide") -> None:
    """y_add = add(conv(x), other) with conv(x) kept in VB1 (fmaps has no place for the conv's output), tiled as
    `variant` (CONV_ADD_VARIANTS) says."""
    if variant not in CONV_ADD_VARIANTS:
        raise CodegenError(f"op {conv.name!r}: conv_add variant {variant!r}: choose one of "
                           f"{', '.join(CONV_ADD_VARIANTS)}")
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
    flat = flattenable(job, x, y, z)
    if flat:
        chunk, lmax = _flat_tile(arch, job, y.h * y.w, vpp, variant)
    lmax = min(lmax, half // (2 * chunk))  # the add's operand sits next to the conv's output in VB1
    if lmax < 1:
        raise CodegenError(f"op {add.name!r}: no tile leaves room for the add's operand in VB1")
    vb1 = arch.bank_group("VB1").base_id
    tiles = output_tiles(flat, y, vpp, lmax)
    buf = 0
    for g0, n in split_even(cg_out, chunk):
        [(slot, wrow0, brow0)] = param_slots(prog, arch, [(n * wrows, n)])
        load_params(prog, arch, job, g0, n, wrow0, brow0, slot=slot)
        channels = min(n * ocp, job.cout - g0 * ocp)
        for t in tiles:
            base, v, length = buf * half, t.vpp, t.length
            wt = emit_input_tile(prog, arch, x, conv.inputs[0], job, t, buf)
            opnd = base + length * n
            for r in range(v):  # the add's other operand, next to the conv's output tile
                for j0, a, cnt in t.runs(r, z.w, lambda oy, ox: z.addr(oy, ox, g0 * ocp), z.pixel_pitch):
                    prog.emit("LOAD", reads=(("ddr", other),), writes=(("vb1", buf, "operand"),),
                              bank_id=vb1 + r, bank_addr=opnd + j0 * n, length=cnt, channel=channels,
                              jump_read=z.pixel_pitch, jump_write=n, reg_id=z.reg_id, ddr_addr=a)
            emit_tile_convs(prog, arch, job, wt, (0, 0, 0, 0) if flat else wt.pads(x), v, length, n, buf, base,
                            wrow0, brow0, slot)
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


def emit_group(prog: Program, params: ParamBlob, arch: Arch, graph: Graph, ops: list[Op], fmaps: dict[str, FMap],
               variant: str) -> None:
    """The template registry's emitter of a conv_add group [conv, add]."""
    emit_conv_add(prog, arch, graph, ops[0], ops[1], fmaps, params, variant)
