"""The cost of a candidate group for the fusion search, and whether its tiles fit the banks.

`cost(group, graph, arch)` is the one function the selection calls; it returns cycles. The `cost_source`
context manager picks the evaluation: "analytic" (the default) is DNNVM's "model" option, the group
view of the one analytic cost model (tvm_dpu.timing.analytic.group_cycles); "simulate" compiles the group alone
(compile_graph_fused) and runs the cycle-level timing model (tvm_dpu.timing.simulate) on it, DNNVM's simulator
option. `tile_width` is Eq. 5-6 generalised to a group (with the fused emitters' own bank budgets); a group with no
width is infeasible.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.compiler import compile_graph_fused
from tvm_dpu.codegen.fused_conv_add import conv_add_fits
from tvm_dpu.codegen.fused_conv_pool import conv_pool_fits
from tvm_dpu.codegen.fused_dw_pw import dw_pw_fits
from tvm_dpu.codegen.fused_hconv import hconv_fits
from tvm_dpu.codegen.layout import ceil_div
from tvm_dpu.codegen.resident import RESIDENT
from tvm_dpu.codegen.tiling import FIELD10
from tvm_dpu.timing.analytic import copy_cycles, group_cycles, weight_rows
from tvm_dpu.timing.simulate import cycles as program_cycles
from tvm_dpu.types import FusionPlan, Group, LayerDesc, TensorDesc
from tvm_dpu.xgraph import ops as xops
from tvm_dpu.xgraph.graph import Graph


class _Ctx:
    """Per-graph lookup tables (each op's cost-model view, consumers per tensor) and the per-candidate cost
    cache."""

    def __init__(self, graph: Graph, arch: Arch):
        self.graph, self.arch = graph, arch
        self.layers = {op.name: xops.layer_desc(op, graph) for op in graph.ops}
        self.consumers: dict[str, int] = {}
        for op in graph.ops:
            for t in set(op.inputs):
                self.consumers[t] = self.consumers.get(t, 0) + 1
        self.outputs = frozenset(graph.outputs)
        self.cache: dict[tuple[str, ...], float] = {}


_CTX: dict[tuple[int, str], _Ctx] = {}


def _ctx(graph: Graph, arch: Arch) -> _Ctx:
    key = (id(graph), arch.name)
    c = _CTX.get(key)
    if c is None or c.graph is not graph or len(c.layers) != len(graph.ops):
        if len(_CTX) > 64:
            _CTX.clear()
        c = _CTX[key] = _Ctx(graph, arch)
    return c


#: "analytic" (timing.analytic.group_cycles: DNNVM's model option, microseconds per candidate) or "simulate"
#: (compile the group alone and run tvm_dpu.timing.simulate on its program: exact for the realised code, including
#: the CONVs a fused emitter's smaller tiles add). A context variable, so concurrent builds in several threads
#: each see their own; the default is the analytic model, the builder searches with "simulate"
#: (fusion.select.compile_with_fusion).
_COST_SOURCE: ContextVar[str] = ContextVar("tvm_dpu_fusion_cost_source", default="analytic")


@contextmanager
def cost_source(source: str):
    """Evaluate candidates with `source` ("analytic" | "simulate") in this block (this thread / context only)."""
    if source not in ("analytic", "simulate"):
        raise ValueError(f"cost source {source!r} is not 'analytic' or 'simulate'")
    token = _COST_SOURCE.set(source)
    try:
        yield
    finally:
        _COST_SOURCE.reset(token)


def cost_source_name() -> str:
    """The cost source in effect ("analytic" | "simulate")."""
    return _COST_SOURCE.get()


def cost(group: Group, graph: Graph, arch: Arch) -> float:
    """Cycles of executing `group` (cached per candidate and cost source)."""
    c = _ctx(graph, arch)
    source = _COST_SOURCE.get()
    key = (source, group.template, group.ops)
    v = c.cache.get(key)
    if v is None:
        # a resident chain has no analytic model: its gain is latency and overlap, which only the simulator sees
        v = c.cache[key] = simulated_cost(group, graph, arch) if source == "simulate" or group.template == RESIDENT \
            else \
            group_cycles([c.layers[n] for n in group.ops], group.template, arch, c.consumers, c.outputs)
    return v


def simulated_cost(group: Group, graph: Graph, arch: Arch) -> float:
    """Cycles of the group's own compiled program on the timing simulator (concat alone: 0, its copies are
    charged by the plan, as in the analytic model)."""
    if len(group.ops) == 1 and graph.op(group.ops[0]).type == "concat":
        return 0.0
    sub = graph.extract(group.ops)
    compiled = compile_graph_fused(sub, arch, FusionPlan("cost", [group]), keep_params=False)
    return program_cycles(compiled.code, arch)


def copy_cost(graph: Graph, arch: Arch, tensor: str) -> float:
    """Cycles of copying one concat input into its slice (LOAD + SAVE through a bank, plan "none")."""
    return copy_cycles(TensorDesc(tensor, tuple(graph.tensors[tensor].shape)).nbytes, arch)


def tile_width(members: tuple[str, ...], template: str, graph: Graph, arch: Arch) -> int | None:
    """Widest output tile Tw of the group such that every tiled input, intermediate and the parameters fit their
    banks (DNNVM Eq. 5-6 with Th = PP, Toc = OCP, Tic = ICP, generalised to a group); None if no Tw fits."""
    half = arch.bank_depth // 2
    ops = [graph.op(n) for n in members]
    layers = [_ctx(graph, arch).layers[n] for n in members]
    # parameters: every CONV-engine member's weights fully resident when an intermediate feeds a conv, else
    # at least one output-channel group of each
    conv_ops = [o for o in layers if o.type in ("conv2d", "dense")]
    feeds_conv = any(o.type in ("conv2d", "dense") and i > 0 and template != "hconv2" and template != "hconv3"
                     for i, o in enumerate(layers))
    rows = 0
    for o in conv_ops:
        r, g = weight_rows(o, arch)
        rows += r * (g if feeds_conv else 1)
    if rows > arch.bank_depth:
        return None
    for o in layers:
        if o.type == "depthwise_conv2d":
            kh, kw, _, _ = o.window
            if kh * kw * ceil_div(o.outputs[0].chw[0], arch.icp) > arch.bank_depth:
                return None
    if template in ("hconv2", "hconv3"):
        wins = {(tuple(xops.attr(o, "strides")), tuple(xops.attr(o, "pads")), lo.window[:2])
                for o, lo in zip(ops, layers)}
        if len(wins) != 1:
            return None  # one input tile serves every member only with one window geometry
        if not hconv_fits(arch, graph, ops):
            return None
    if template == "dw_pw":
        if not dw_pw_fits(arch, graph, ops[0], ops[1]):
            return None
    if template == "conv_add":
        if not conv_add_fits(arch, graph, ops[0]):
            return None
    if template in ("conv_pool", "pw_dw"):
        if not conv_pool_fits(arch, graph, ops[0], ops[1]):
            return None
    _, _, w_out = layers[-1].outputs[0].chw
    best = None
    for tw in range(min(w_out, FIELD10), 0, -1):
        if _fits(layers, template, arch, tw, half):
            best = tw
            break
    return best


def _fits(ops: list[LayerDesc], template: str, arch: Arch, tw: int, half: int) -> bool:
    cols = tw
    # output tile (Eq. 6 line 1): one OCP group of Tw pixels per row, plus the loaded eltwise operand
    out_groups = len(ops) if template.startswith("hconv") else 1
    if template == "conv_add":
        out_groups = 2
    if cols * out_groups > half:
        return False
    chain = [ops[0]] if template.startswith("hconv") else ops
    for i in range(len(chain) - 1, -1, -1):
        op = chain[i]
        kh, kw, sh, sw = op.window
        in_cols = (cols - 1) * sw + kw  # F^-1(Tw)
        cin = op.inputs[0].chw[0]
        cg = ceil_div(cin, arch.icp) if op.type in ("conv2d", "dense") else 1
        n_rows = (arch.pp - 1) * sh + kh
        wraps = ((n_rows - 1) // sh) // arch.pp + 1
        if in_cols * cg * wraps * sh > half or in_cols > FIELD10:
            return False
        cols = in_cols
    return True
