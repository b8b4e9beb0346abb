"""Code generation of a fusion plan: `compile_graph_fused(graph, arch, plan) -> CompiledSubgraph`.

* DDR plan (`plan_ddr`): the unfused compiler's rule (inputs, outputs, liveness-reused workspace), parametrised
  by which concat inputs alias their slice (only those of `plan.concat_fused`; the others are copied by the
  concat, so plan "none" pays real copies) and by which tensors never reach DDR (intermediates kept on chip).
* Groups are emitted in plan order. Fused pipelines (fused_conv.py): conv_add (per output tile the CONVs leave
  the conv's result in VB1, the add's other operand is loaded next to it, one ELEW per ALU_PP rows adds them in
  place, the SAVEs write the add's output; the conv's output never touches DDR), hconv2/hconv3 (one input
  tile load feeds the CONVs of every member), dw_pw and conv_conv with a pointwise second conv (the first op's
  output tile in VB1 is the pointwise conv's input tile), conv_pool and pw_dw (emit_conv_pool: the conv writes
  its rows with the row-store rule straight into the row-fetch layout of the ALU consumer -- max/avg pool or
  depthwise conv -- in a circular buffer of VB1, each conv row computed once per column strip). conv_conv with
  a windowed second conv, and fused groups that do not fit the banks, are emitted member by member with the
  unfused emitters (same values).
"""
from __future__ import annotations

from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.compiler import CompiledSubgraph, TensorBinding, _emit_op, _Params, plan_ddr
from tvm_dpu.codegen.layout import REG_PARAMS, align
from tvm_dpu.codegen.program import Program
from tvm_dpu.codegen.tiling import CodegenError
from tvm_dpu.fusion.costmodel import SINGLE, Group
from tvm_dpu.codegen.fused_conv import (conv_add_fits, conv_pool_fits, conv_pw_fits, dw_pw_fits, emit_conv_add,
                                       emit_conv_pool, emit_conv_pw, emit_dw_pw, emit_hconv, hconv_fits)
from tvm_dpu.fusion.select import FusionPlan, _ordered, plan_fusion
from tvm_dpu.xgraph.graph import Graph

#: Templates with a fused emitter; the others run member by member.
FUSED_EMITTERS = ("conv_add", "hconv2", "hconv3", "dw_pw", "conv_conv", "conv_pool", "pw_dw")


def emittable(group: Group, graph: Graph, arch: Arch) -> bool:
    """Whether `group` compiles to one fused pipeline on `arch` (else it is emitted member by member)."""
    ops = [graph.op(n) for n in group.ops]
    if group.template == "conv_add":
        return conv_add_fits(arch, graph, ops[0])
    if group.template in ("hconv2", "hconv3"):
        return hconv_fits(arch, graph, ops)
    if group.template == "dw_pw":
        return dw_pw_fits(arch, graph, ops[0], ops[1])
    if group.template == "conv_conv":
        return conv_pw_fits(arch, graph, ops[0], ops[1])
    if group.template in ("conv_pool", "pw_dw"):
        return conv_pool_fits(arch, graph, ops[0], ops[1])
    return False


def compile_with_fusion(graph: Graph, arch: Arch, mode: str = "optimal") -> tuple[CompiledSubgraph, FusionPlan]:
    """Plan (with the templates that have a fused emitter, so the plan's gains are the program's) and compile:
    the one call builder.py needs for `fusion="none"|"greedy"|"optimal"`."""
    plan = plan_fusion(graph, arch, mode, FUSED_EMITTERS, emittable)
    return compile_graph_fused(graph, arch, plan), plan


def compile_graph_fused(graph: Graph, arch: Arch, plan: FusionPlan) -> CompiledSubgraph:
    """Compile `graph` for `arch` following `plan` (fusion.plan_fusion). Plan "none" gives the unfused program
    except that concats copy their inputs."""
    graph.validate()
    groups = _ordered(graph, plan.groups)  # checks coverage and acyclicity
    ops = {op.name: op for op in graph.ops}
    fused = {g for g in groups if g.template != SINGLE and emittable(g, graph, arch)}
    on_chip: set[str] = set()
    for g in fused:
        if g.template in ("conv_add", "dw_pw", "conv_conv", "conv_pool", "pw_dw"):
            on_chip.update(ops[g.ops[0]].outputs)
    # The liveness walk must follow the emission order.
    order = [ops[n] for g in groups for n in g.ops]
    emit_graph = Graph(graph.name, graph.tensors, order, graph.inputs, graph.outputs)
    span: dict[str, int] = {}
    i = 0
    for g in groups:
        i += len(g.ops)
        if g in fused:
            span.update({n: i - 1 for n in g.ops})
    fmaps, alias, sizes = plan_ddr(emit_graph, plan.concat_fused, on_chip, span)
    params = _Params()
    prog = Program()
    op_ranges = []
    for g in groups:
        start = len(prog)
        try:
            if g in fused and g.template == "conv_add":
                emit_conv_add(prog, arch, graph, ops[g.ops[0]], ops[g.ops[1]], fmaps, params)
            elif g in fused and g.template == "conv_conv":
                emit_conv_pw(prog, arch, graph, ops[g.ops[0]], ops[g.ops[1]], fmaps, params)
            elif g in fused and g.template in ("conv_pool", "pw_dw"):
                emit_conv_pool(prog, arch, graph, ops[g.ops[0]], ops[g.ops[1]], fmaps, params)
            elif g in fused and g.template == "dw_pw":
                emit_dw_pw(prog, arch, graph, ops[g.ops[0]], ops[g.ops[1]], fmaps, params)
            elif g in fused:
                emit_hconv(prog, arch, graph, [ops[n] for n in g.ops], fmaps, params)
            else:
                for n in g.ops:
                    s = len(prog)
                    _emit_op(prog, arch, graph, ops[n], fmaps, alias, params)
                    if len(g.ops) > 1:
                        op_ranges.append((n, s, len(prog)))
        except CodegenError as e:
            msg = str(e)
            raise CodegenError(msg if any(n in msg for n in g.ops) else f"group {g.template} {list(g.ops)}: {msg}") \
                from None
        if len(g.ops) == 1 or g in fused:
            op_ranges.append(("+".join(g.ops), start, len(prog)))
    prog.end()
    sizes[REG_PARAMS] = params.size
    region_sizes = {reg: align(max(size, 1), 4096) for reg, size in sizes.items()}
    binding = lambda n: TensorBinding(n, graph.tensors[n].shape, int(graph.tensors[n].fix_point), fmaps[n])
    return CompiledSubgraph(
        name=graph.name, arch=arch.name, fingerprint=arch.fingerprint, code=prog.encode(), params=params.blob(),
        region_sizes=region_sizes, inputs=[binding(n) for n in graph.inputs],
        outputs=[binding(n) for n in graph.outputs], instr_counts=prog.counts(), op_ranges=op_ranges)
