"""conv_conv_pool: conv -> windowed conv -> 2x2 stride-2 pool (VGG's blocks) with both intermediate maps on chip,
streamed in row strips whatever the map size. The first two ops run as conv_conv's windowed form
(fused_conv_conv.emit_conv_window: the first conv fills a circular buffer of rows in VB1 in the second's row-fetch
layout); each pass of the second conv writes an output slot of an even number of rows x an even strip of columns in
VB0, which the pool halves in place (conv.emit_pool_on_save, one ALU per row pair) before the SAVEs: only the first
conv's input is LOADed and only the pool's output SAVEd."""
from __future__ import annotations

from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.fused_chain import ChainTile
from tvm_dpu.codegen.fused_conv_conv import conv_window_tile, emit_conv_window
from tvm_dpu.codegen.fused_conv_pool import halving_pool
from tvm_dpu.codegen.layout import ParamBlob
from tvm_dpu.codegen.program import Program
from tvm_dpu.codegen.tiling import CodegenError
from tvm_dpu.types import FMap
from tvm_dpu.xgraph.graph import Graph, Op


def _tile(arch: Arch, graph: Graph, a: Op, b: Op, pool: Op) -> ChainTile | None:
    """The chain tile of a -> b with strips and passes of even width and height (a pass's rows pair up for the
    pool), or None where the pool is not a halving_pool of b's output."""
    if pool.inputs[0] != b.outputs[0] or not halving_pool(graph, pool) or arch.icp != arch.ocp:
        return None
    return conv_window_tile(arch, graph, a, b, align=2)


def group_fits(arch: Arch, graph: Graph, ops: list[Op]) -> bool:
    """The template registry's fit test of a conv_conv_pool group [a, b, pool]."""
    return _tile(arch, graph, *ops) is not None


def emit_group(prog: Program, params: ParamBlob, arch: Arch, graph: Graph, ops: list[Op], fmaps: dict[str, FMap],
               variant: str) -> None:
    """The template registry's emitter of a conv_conv_pool group [a, b, pool] (one emission: `variant` is
    "wide")."""
    a, b, pool = ops
    tile = _tile(arch, graph, a, b, pool)
    if tile is None:
        raise CodegenError(f"ops {a.name!r}+{b.name!r}+{pool.name!r}: conv+conv+pool fusion does not fit "
                           f"{arch.name}")
    emit_conv_window(prog, arch, graph, a, b, fmaps, params, tile, pool)
