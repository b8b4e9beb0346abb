"""Cost of a fused group (or a single op): the stand-in analytic model, and the tiling rule for groups.

`cost(group, graph, arch)` is the one function the selection calls; it returns cycles. COST_SOURCE (or the
`cost_source` context manager) picks the evaluation: "simulate" compiles the group alone (compile_graph_fused)
and runs the cycle-level timing model (tvm_dpu.timing.simulate) on it, DNNVM's simulator option; "analytic"
(the default: the whole ResNet-152 search must stay well under 0.5 s) is DNNVM's "model" option:

* DDR traffic of the group: its external input feature maps (a map read by several members is loaded once:
  horizontal fusion; a conv reloads its input once per chunk of resident output-channel groups), all weights and
  biases, and the external outputs (maps consumed outside the group or graph outputs). Intermediates of a fused
  group never touch DDR. Cycles = bytes / (ddr_bytes_per_s / clock).
* Engine cycles: CONV = ceil(ic/ICP) * ceil(oc/OCP) * ceil(H/PP) * W * kh * kw; MISC (pool, depthwise, eltwise) =
  ceil(c/ICP) * ceil(H/ALU_PP) * W * taps (eltwise: number of operands).
* A group runs its engines concurrently (LOAD/SAVE, CONV and MISC overlap through double buffering), so its time
  is max(DDR, CONV, MISC) plus a pipeline fill: a fixed DDR latency plus one tile's share of that time. Ops run
  alone pay that per op; that is what fusion saves, together with the intermediate traffic.

Every number comes from the arch (PP, ICP, OCP, ALU_PP, bank depth, clock, DDR bandwidth); DDR_LATENCY is the
only constant. `tile_width` is Eq. 5-6 generalised to a group; a group with no width is infeasible.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.compiler import compile_graph_fused
from tvm_dpu.codegen.fused_conv import conv_add_fits, conv_pool_fits, dw_pw_fits, hconv_fits
from tvm_dpu.codegen.layout import ceil_div
from tvm_dpu.codegen.tiling import FIELD10
from tvm_dpu.timing.simulate import simulate
from tvm_dpu.types import SINGLE, FusionPlan, Group
from tvm_dpu.xgraph import ops as xops
from tvm_dpu.xgraph.graph import Graph, Op

#: Cycles from a LOAD's request to its first data (AXI + DDR controller), paid once per op/group pipeline.
DDR_LATENCY = 200

def _fm(graph: Graph, name: str) -> tuple[int, int, int]:
    s = graph.tensors[name].shape
    return (s[1], s[2], s[3]) if len(s) == 4 else (s[1], 1, 1)


def _window(op: Op, graph: Graph) -> tuple[int, int, int, int]:
    """(kh, kw, sh, sw) of a sliding-window op; (1, 1, 1, 1) for point ops."""
    if op.type in ("conv2d", "depthwise_conv2d", "conv2d_transpose"):
        w = xops.conv_window(op, graph)
        return w.kh, w.kw, w.sh, w.sw
    if op.type in ("max_pool2d", "avg_pool2d"):
        w = xops.pool_window(op, graph)
        return w.kh, w.kw, w.sh, w.sw
    if op.type == "dense":
        s = xops.dense_weights_shape(op, graph)
        return s[2], s[3], 1, 1
    return 1, 1, 1, 1


def _weight_rows(op: Op, graph: Graph, arch: Arch) -> tuple[int, int]:
    """(CONVW rows per output-channel group, output-channel groups) of a CONV-engine op."""
    kh, kw, _, _ = _window(op, graph)
    cin = _fm(graph, op.inputs[0])[0]
    cout = _fm(graph, op.outputs[0])[0]
    return kh * kw * ceil_div(cin, arch.icp), ceil_div(cout, arch.ocp)


@dataclass
class _Work:
    conv: float = 0.0
    misc: float = 0.0
    weights: int = 0
    reload: int = 1  # how many times the op reads its input


def _work(op: Op, graph: Graph, arch: Arch) -> _Work:
    t = op.type
    c_out, h, w = _fm(graph, op.outputs[0])
    wk = _Work()
    if t in ("conv2d", "dense", "conv2d_transpose"):
        kh, kw, _, _ = _window(op, graph)
        cin = _fm(graph, op.inputs[0])[0]
        groups = xops.attr(op, "groups") if t != "dense" else 1
        wk.conv = ceil_div(cin // groups, arch.icp) * ceil_div(c_out, arch.ocp) * ceil_div(h, arch.pp) * w * kh * kw
        rows, cg_out = _weight_rows(op, graph, arch)
        wk.reload = ceil_div(cg_out, max(1, arch.bank_depth // max(rows, 1)))
        wk.weights = graph.tensors[op.params["weights"]].data.size + c_out
    elif t in ("depthwise_conv2d", "max_pool2d", "avg_pool2d"):
        kh, kw, _, _ = _window(op, graph)
        wk.misc = ceil_div(c_out, arch.icp) * ceil_div(h, arch.alu_pp) * w * kh * kw
        if t == "depthwise_conv2d":
            wk.weights = graph.tensors[op.params["weights"]].data.size + c_out
    elif t in ("eltwise_add", "eltwise_mul", "activation"):
        wk.misc = ceil_div(c_out, arch.icp) * ceil_div(h, arch.alu_pp) * w * len(op.inputs)
    # concat / upsample: pure data movement (their LOAD/SAVE bytes are counted by the caller)
    return wk


def _bytes(graph: Graph, name: str) -> int:
    c, h, w = _fm(graph, name)
    return c * h * w


def ddr_bytes_per_cycle(arch: Arch) -> float:
    return arch.ddr_bytes_per_s / (arch.freq_mhz * 1e6)


class _Ctx:
    """Per-graph lookup tables (op by name, consumers per tensor) and the per-candidate cost cache."""

    def __init__(self, graph: Graph, arch: Arch):
        self.graph, self.arch = graph, arch
        self.ops = {op.name: op for op in graph.ops}
        self.consumers: dict[str, int] = {}
        for op in graph.ops:
            for t in set(op.inputs):
                self.consumers[t] = self.consumers.get(t, 0) + 1
        self.outputs = set(graph.outputs)
        self.cache: dict[tuple[str, ...], float] = {}


_CTX: dict[tuple[int, str], _Ctx] = {}


def _ctx(graph: Graph, arch: Arch) -> _Ctx:
    key = (id(graph), arch.name)
    c = _CTX.get(key)
    if c is None or c.graph is not graph or len(c.ops) != len(graph.ops):
        if len(_CTX) > 64:
            _CTX.clear()
        c = _CTX[key] = _Ctx(graph, arch)
    return c


#: "analytic" (the model above; fast enough for the search budget) or "simulate" (compile the group alone and
#: run tvm_dpu.timing.simulate on its program: exact for the realised code, ~100x slower).
COST_SOURCE = "analytic"


@contextmanager
def cost_source(source: str):
    """Temporarily evaluate candidates with `source` ("analytic" | "simulate")."""
    global COST_SOURCE
    if source not in ("analytic", "simulate"):
        raise ValueError(f"cost source {source!r} is not 'analytic' or 'simulate'")
    old, COST_SOURCE = COST_SOURCE, source
    try:
        yield
    finally:
        COST_SOURCE = old


def cost(group: Group, graph: Graph, arch: Arch) -> float:
    """Cycles of executing `group` (cached per candidate and cost source)."""
    c = _ctx(graph, arch)
    key = (COST_SOURCE, group.template, group.ops)
    v = c.cache.get(key)
    if v is None:
        v = c.cache[key] = simulated_cost(group, graph, arch) if COST_SOURCE == "simulate" else \
            _analytic(group, c)
    return v


def group_subgraph(graph: Graph, members: tuple[str, ...]) -> Graph:
    """The members as a graph of their own: external feature maps become its inputs, maps used outside the
    group (or graph outputs) its outputs."""
    names = set(members)
    ops = [op for op in graph.ops if op.name in names]
    produced = {t for op in ops for t in op.outputs}
    used_outside = {t for op in graph.ops if op.name not in names for t in op.inputs} | set(graph.outputs)
    inputs: list[str] = []
    for op in ops:
        for t in op.inputs:
            if not graph.tensors[t].is_const and t not in produced and t not in inputs:
                inputs.append(t)
    outputs = [t for op in ops for t in op.outputs if t in used_outside]
    used = set(inputs) | produced | {t for op in ops for t in op.inputs} | {t for op in ops for t in op.params.values()}
    return Graph(f"{graph.name}:{'+'.join(members)}", {t: graph.tensors[t] for t in used}, ops, inputs, outputs)


def simulated_cost(group: Group, graph: Graph, arch: Arch) -> float:
    """Cycles of the group's own compiled program on the timing simulator (concat alone: 0, its copies are
    charged by the plan, as in the analytic model)."""
    if len(group.ops) == 1 and graph.op(group.ops[0]).type == "concat":
        return 0.0
    sub = group_subgraph(graph, group.ops)
    compiled = compile_graph_fused(sub, arch, FusionPlan("cost", [group]))
    return float(simulate(compiled.code, arch).cycles)


def _analytic(group: Group, c: _Ctx) -> float:
    graph, arch = c.graph, c.arch
    ops = [c.ops[n] for n in group.ops]
    if len(ops) == 1 and ops[0].type == "concat":
        return 0.0  # its copies are charged per non-fused input by the plan (plan_cost)
    inside_out = {t for op in ops for t in op.outputs}
    loads: dict[str, int] = {}
    conv = misc = 0.0
    wbytes = saves = 0
    for op in ops:
        wk = _work(op, graph, arch)
        if group.template == "dw_pw" and op.type == "conv2d":
            wk.conv *= arch.pp / arch.alu_pp  # the pointwise CONVs get the ALU's ALU_PP rows per tile, not PP
        conv += wk.conv
        misc += wk.misc
        wbytes += wk.weights
        for t in op.inputs:
            if graph.tensors[t].is_const or t in inside_out:
                continue
            loads[t] = max(loads.get(t, 0), _bytes(graph, t) * wk.reload)
        for t in op.outputs:
            inner = sum(1 for o in ops if t in o.inputs)
            if t in c.outputs or c.consumers.get(t, 0) > inner:
                saves += _bytes(graph, t)
    ddr = (sum(loads.values()) + wbytes + saves) / ddr_bytes_per_cycle(arch)
    busy = max(ddr, conv, misc)
    tiles = max(1, ceil_div(_fm(graph, ops[-1].outputs[0])[1], arch.pp))
    return DDR_LATENCY + busy + busy / tiles


def copy_cost(graph: Graph, arch: Arch, tensor: str) -> float:
    """Cycles of copying one concat input into its slice (LOAD + SAVE through a bank, plan "none")."""
    return DDR_LATENCY + 2 * _bytes(graph, tensor) / ddr_bytes_per_cycle(arch)


def ops_count(graph: Graph) -> int:
    """Arithmetic operations of the graph (2 per MAC of the conv-class ops), for GOPS."""
    total = 0
    for op in graph.ops:
        if op.type in ("conv2d", "dense", "conv2d_transpose", "depthwise_conv2d"):
            _, h, w = _fm(graph, op.outputs[0])
            total += 2 * graph.tensors[op.params["weights"]].data.size * h * w
    return total


def tile_width(members: tuple[str, ...], template: str, graph: Graph, arch: Arch) -> int | None:
    """Widest output tile Tw of the group such that every tiled input, intermediate and the parameters fit their
    banks (DNNVM Eq. 5-6 with Th = PP, Toc = OCP, Tic = ICP, generalised to a group); None if no Tw fits."""
    half = arch.bank_depth // 2
    ops = [graph.op(n) for n in members]
    # parameters: every CONV-engine member's weights fully resident when an intermediate feeds a conv, else
    # at least one output-channel group of each
    conv_ops = [o for o in ops if o.type in ("conv2d", "dense")]
    feeds_conv = any(o.type in ("conv2d", "dense") and i > 0 and template != "hconv2" and template != "hconv3"
                     for i, o in enumerate(ops))
    rows = 0
    for o in conv_ops:
        r, g = _weight_rows(o, graph, arch)
        rows += r * (g if feeds_conv else 1)
    if rows > arch.bank_depth:
        return None
    if any(o.type == "depthwise_conv2d" for o in ops):
        for o in ops:
            if o.type == "depthwise_conv2d":
                kh, kw, _, _ = _window(o, graph)
                if kh * kw * ceil_div(_fm(graph, o.outputs[0])[0], arch.icp) > arch.bank_depth:
                    return None
    if template in ("hconv2", "hconv3"):
        wins = {(tuple(xops.attr(o, "strides")), tuple(xops.attr(o, "pads")), _window(o, graph)[:2]) for o in ops}
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
    last = ops[-1]
    _, _, w_out = _fm(graph, last.outputs[0])
    best = None
    for tw in range(min(w_out, FIELD10), 0, -1):
        if _fits(ops, template, graph, arch, tw, half):
            best = tw
            break
    return best


def _fits(ops: list[Op], template: str, graph: Graph, arch: Arch, tw: int, half: int) -> bool:
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
        kh, kw, sh, sw = _window(op, graph)
        in_cols = (cols - 1) * sw + kw  # F^-1(Tw)
        cin = _fm(graph, op.inputs[0])[0]
        cg = ceil_div(cin, arch.icp) if op.type in ("conv2d", "dense") else 1
        n_rows = (arch.pp - 1) * sh + kh
        wraps = ((n_rows - 1) // sh) // arch.pp + 1
        if in_cols * cg * wraps * sh > half or in_cols > FIELD10:
            return False
        cols = in_cols
    return True
