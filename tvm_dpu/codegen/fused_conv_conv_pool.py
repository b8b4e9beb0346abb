"""conv_conv_pool: conv -> windowed conv -> 2x2 stride-2 pool (VGG's blocks) with both
intermediate maps on chip, streamed in row strips whatever the map size. The first two ops run as conv_conv's
windowed form (fused_conv_conv.emit_conv_window: the first conv fills a circular buffer of rows in VB1 in the
second's row-fetch layout); each pass of the second conv writes an output slot of an even number of rows x an even
strip of columns in VB0, which the pool halves in place (conv.emit_pool_on_save, one ALU per row pair) before the
SAVEs: only the first conv's input is LOADed and only the pool's output SAVEd.

Both convs run on the CONV engine, in program order, so the buffer needs no spare wrap for the first conv to fill
while the second reads (chain_tile's spare=0). A first layer (conv.input_augmentation) runs channel-augmented on
every column, its edge items masked (ChainTile.masked). The search times the strip count
(CONV_CONV_POOL_VARIANTS): the widest strip leaves the least room in VB0 for the first conv's input window, hence
narrower pieces and more CONVs.

Where it pays: blocks whose maps cost more DDR time than their convs CONV time, so that keeping both maps on chip
repays the strips' extra CONVs (each pays the CONV fill; the first conv recomputes the halo columns): few channels
over large maps on a large DPU. On VGG-16 (B4096) only the conv1 block gains."""
from __future__ import annotations

from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.conv import input_augmentation
from tvm_dpu.codegen.fused_chain import ChainTile
from tvm_dpu.codegen.fused_conv_conv import conv_window_tile, emit_conv_window
from tvm_dpu.codegen.fused_conv_pool import halving_pool
from tvm_dpu.codegen.layout import ParamBlob, ceil_div
from tvm_dpu.codegen.program import Program
from tvm_dpu.codegen.tiling import CodegenError
from tvm_dpu.types import FMap
from tvm_dpu.xgraph.graph import Graph, Op

#: Variant -> strips beyond the fewest that fit. The fusion search times those whose tiles differ (group_variants).
#: Measured (the group alone, B4096): a 16 -> 16 -> 16 channel block over 112 x 112 takes 37,896 cycles "wide" (one
#: strip), 43,725 "narrow"; VGG-16's conv1 block 1,088,532 "wide" (two strips of 112), 1,137,958 "narrow".
CONV_CONV_POOL_VARIANTS = {"wide": 0, "narrow": 1}


def _tile(arch: Arch, graph: Graph, a: Op, b: Op, pool: Op, variant: str = "wide") -> ChainTile | None:
    """The chain tile of a -> b with strips and passes of even width and height (a pass's rows pair up for the
    pool) in `variant`'s strips, or None where the pool is not a halving_pool of b's output (or no such tile
    fits)."""
    if pool.inputs[0] != b.outputs[0] or not halving_pool(graph, pool) or arch.icp != arch.ocp:
        return None
    more = CONV_CONV_POOL_VARIANTS[variant]
    # a first layer's edge columns run augmented too where the compiler gives its input the DDR margin
    masked = input_augmentation(arch, graph, a) is not None
    tile = conv_window_tile(arch, graph, a, b, spare=0, align=2, masked=masked)
    if tile is None or not more:
        return tile
    strips = ceil_div(graph.tensors[b.outputs[0]].shape[3], tile.lp)
    return conv_window_tile(arch, graph, a, b, spare=0, align=2, min_strips=strips + more, masked=masked)


def group_fits(arch: Arch, graph: Graph, ops: list[Op]) -> bool:
    """The template registry's fit test of a conv_conv_pool group [a, b, pool]."""
    return _tile(arch, graph, *ops) is not None


def group_variants(arch: Arch, graph: Graph, ops: list[Op]) -> tuple[str, ...]:
    """The template registry's variants of a conv_conv_pool group: the CONV_CONV_POOL_VARIANTS whose tiles
    differ ("wide" first)."""
    tiles = {v: _tile(arch, graph, *ops, v) for v in CONV_CONV_POOL_VARIANTS}
    out: list[str] = []
    for v, t in tiles.items():
        if t is not None and all(tiles[u] != t for u in out):
            out.append(v)
    return tuple(out)


def emit_group(prog: Program, params: ParamBlob, arch: Arch, graph: Graph, ops: list[Op], fmaps: dict[str, FMap],
               variant: str) -> None:
    """The template registry's emitter of a conv_conv_pool group [a, b, pool] in `variant`'s strips."""
    a, b, pool = ops
    if variant not in CONV_CONV_POOL_VARIANTS:
        raise CodegenError(f"op {a.name!r}: conv_conv_pool variant {variant!r}: choose one of "
                           f"{', '.join(CONV_CONV_POOL_VARIANTS)}")
    tile = _tile(arch, graph, a, b, pool, variant)
    if tile is None:
        raise CodegenError(f"ops {a.name!r}+{b.name!r}+{pool.name!r}: conv+conv+pool fusion does not fit "
                           f"{arch.name} in {variant} strips")
    emit_conv_window(prog, arch, graph, a, b, fmaps, params, tile, pool)
