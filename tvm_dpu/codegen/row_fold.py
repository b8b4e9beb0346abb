"""Row folding of a conv -> whole-width pool chain (PointPillars' PFN: a 1x1 conv over a 12000 x 100 map, then a
1 x 100 max pool of stride 100).

Where a 1x1 stride-1 unpadded conv feeds a pool whose window and stride span the whole width (kh = sh = 1,
kw = sw = W), every output pixel depends on one input row only, and in the DPU's HWC layout k consecutive rows of a
map with row pitch W * pixel pitch are one DDR run. So the chain computes the same bytes on a folded view: H/k rows
of k*W columns, the pool (its 1 x W window strided by W) giving k outputs per folded row. Fewer, wider CONVs each pay the
CONV engine's fill once (the PFN's 12000 CONVs of 100 columns are held back by it).

The fold is a codegen view (the chain's three tensors reshaped, their FMaps re-pitched), not a graph rewrite: the
graph, its golden reference and every other stage keep the NCHW shapes; only fused_conv_pool's emitter sees it.
The emission variants "fold<k>" let the fusion search time each k against the unfolded "wide"."""
from __future__ import annotations

from dataclasses import replace

from tvm_dpu.types import FMap
from tvm_dpu.xgraph import ops as xops
from tvm_dpu.xgraph.graph import Graph, Op, Tensor

FOLD_PREFIX = "fold"


def foldable_width(graph: Graph, conv: Op, pool: Op) -> int | None:
    """W when conv -> pool has the foldable form (1x1 stride-1 unpadded undilated conv, unpadded max / avg pool of
    kernel 1 x W and stride 1 down the rows over a conv output of width W), else None."""
    if (conv.type != "conv2d" or pool.type not in ("max_pool2d", "avg_pool2d")
            or pool.type == "avg_pool2d" and xops.attr(pool, "global")):
        return None
    cw, pw = xops.conv_window(conv, graph), xops.pool_window(pool, graph)
    _, _, h, w = graph.tensors[conv.outputs[0]].shape
    if ((cw.kh, cw.kw, cw.sh, cw.sw, cw.dh, cw.dw) != (1,) * 6 or any(cw.pads)
            or graph.tensors[conv.inputs[0]].shape[2:] != (h, w)):
        return None
    # a window of the whole width has one position whatever its stride (vai_c's PFN says 1)
    if ((pw.kh, pw.sh, pw.kw) != (1, 1, w) or any(pw.pads) or graph.tensors[pool.outputs[0]].shape[2:] != (h, 1)):
        return None
    return w


def fold_factors(graph: Graph, conv: Op, pool: Op) -> list[int]:
    """The k > 1 the chain may fold by (k divides H), ascending; [] where it does not fold."""
    if foldable_width(graph, conv, pool) is None:
        return []
    h = graph.tensors[conv.outputs[0]].shape[2]
    return [k for k in range(2, h + 1) if h % k == 0]


def fold_of(variant: str) -> int:
    """The fold factor of an emission variant ("fold<k>" -> k; any other -> 1)."""
    return int(variant[len(FOLD_PREFIX):]) if variant.startswith(FOLD_PREFIX) else 1


def folded_graph(graph: Graph, conv: Op, pool: Op, k: int) -> tuple[Graph, Op]:
    """`graph` seen with the chain's input, conv output and pool output folded by k ((1, C, H, W) -> (1, C, H/k,
    k*W)), and the pool in it: its 1 x W window now strided by W."""
    w = graph.tensors[conv.outputs[0]].shape[3]
    tensors = dict(graph.tensors)
    for name in (conv.inputs[0], conv.outputs[0], pool.outputs[0]):
        n, c, h, wd = tensors[name].shape
        tensors[name] = Tensor(name, (n, c, h // k, k * wd), tensors[name].dtype, tensors[name].fix_point)
    folded_pool = replace(pool, attrs={**pool.attrs, "strides": [1, w]})
    ops = [folded_pool if op is pool else op for op in graph.ops]
    return replace(graph, tensors=tensors, ops=ops), folded_pool


def folded_fmap(m: FMap, k: int) -> FMap | None:
    """`m` as H/k rows of k*W pixels, or None where its rows are not one DDR run (row pitch != W * pixel pitch:
    a map with padded rows cannot fold)."""
    if m.h % k or m.row_pitch != m.w * m.pixel_pitch:
        return None
    return replace(m, h=m.h // k, w=m.w * k, row_pitch=m.row_pitch * k)


def folded_fmaps(fmaps: dict[str, FMap], conv: Op, pool: Op, k: int) -> dict[str, FMap] | None:
    """`fmaps` with the chain's input and pool output folded by k (folded_fmap), or None where one does not fold."""
    out = dict(fmaps)
    for name in (conv.inputs[0], pool.outputs[0]):
        f = folded_fmap(fmaps[name], k)
        if f is None:
            return None
        out[name] = f
    return out
