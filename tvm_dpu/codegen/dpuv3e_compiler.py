"""XGraph -> DPUV3E machine code (DPUCAHX8H), the compiler codegen.compiler.compile_graph_fused hands an Arch of
that instruction set to (compiler.ISA_COMPILERS).

The same DDR plan and packaging as the DPUV2 path (compiler.plan_ddr, finish_subgraph); the ops are lowered one by
one by their "DPUV3E" emitters (OpDef.isa_emitters, codegen/dpuv3e_ops.py). Fused pipelines are not implemented
for this family: a fusion plan's groups are emitted member by member, in the plan's order, and only its concat
aliases (producers saving straight into their slice of a concat) are kept. Dependency tokens follow the project's
protocol (codegen.program), which vai_c's U50 programs also satisfy (docs/dependency-protocol.md, "DPUCAHX8H").
"""
from __future__ import annotations

from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.compiler import alias_roots, finish_subgraph, order_groups, plan_ddr
from tvm_dpu.codegen.layout import ParamBlob
from tvm_dpu.codegen.program import Program
from tvm_dpu.codegen.tiling import CodegenError
from tvm_dpu.ops import OpRegistryError, isa_emitter
from tvm_dpu.types import CompiledSubgraph, FusionPlan
from tvm_dpu.xgraph.graph import Graph
from tvm_dpu.xgraph.validate import validate_graph

ISA = "DPUV3E"


def compile_graph_v3e(graph: Graph, arch: Arch, plan: FusionPlan, keep_params: bool = True) -> CompiledSubgraph:
    """Compile `graph` for a DPUV3E core, op after op in the order of `plan`'s groups."""
    validate_graph(graph)
    groups = order_groups(graph, plan.groups)
    ops = {op.name: op for op in graph.ops}
    order = [ops[n] for g in groups for n in g.ops]
    emit_graph = Graph(graph.name, graph.tensors, order, graph.inputs, graph.outputs)
    fmaps, alias, sizes = plan_ddr(emit_graph, plan.concat_fused)
    params = ParamBlob(keep=keep_params)
    prog = Program(ddr_roots=alias_roots(alias), isa=ISA)
    op_ranges = []
    for op in order:
        start, param_start = len(prog), params.size
        try:
            emit = isa_emitter(op.type, ISA)
        except OpRegistryError as e:
            raise CodegenError(f"op {op.name!r} ({op.type}): not supported by the {ISA} code generator of "
                               f"{arch.target_label} ({e})") from None
        try:
            emit(prog, arch, graph, op, fmaps, alias, params, plan.variants.get(op.name, "wide"))
        except CodegenError as e:
            msg = str(e)
            raise CodegenError(msg if op.name in msg else f"op {op.name!r} ({op.type}): {msg}") from None
        op_ranges.append((op.name, start, len(prog)))
        for t in op.params.values():  # constants an emitter did not name: where its op's parameters start
            params.offsets.setdefault(t, param_start)
    return finish_subgraph(graph, arch, prog, params, fmaps, sizes, op_ranges)
