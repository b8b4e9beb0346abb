"""XGraph -> DPUV3E machine code (DPUCAHX8H), the compiler codegen.compiler.compile_graph_fused hands an Arch of
that instruction set to (compiler.ISA_COMPILERS).

The same DDR plan and packaging as the DPUV2 path (compiler.plan_ddr, finish_subgraph); the ops are lowered one by
one by their "DPUV3E" emitters (OpDef.isa_emitters, codegen/dpuv3e_ops.py). The fusion templates are not
implemented for this family: a fusion plan's groups are emitted member by member, in the plan's order, and only
its concat aliases (producers saving straight into their slice of a concat) are kept. One pair is always fused,
as vai_c's U50 programs fuse it: a conv2d whose output only a pool tiling it reads (dpuv3e_ops.fusable_pool) runs
with that pool on each of its tiles in the banks. Dependency tokens follow the project's protocol
(codegen.program), which vai_c's U50 programs also satisfy (docs/dependency-protocol.md, "DPUCAHX8H").
"""
from __future__ import annotations

from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.compiler import alias_roots, finish_subgraph, order_groups, plan_ddr
from tvm_dpu.codegen.dpuv3e_ops import emit_conv_pool, fusable_pool
from tvm_dpu.codegen.layout import ParamBlob
from tvm_dpu.codegen.program import Program
from tvm_dpu.codegen.tiling import CodegenError
from tvm_dpu.ops import OpRegistryError, isa_emitter
from tvm_dpu.types import CompiledSubgraph, FusionPlan
from tvm_dpu.xgraph.graph import Graph, Op
from tvm_dpu.xgraph.validate import validate_graph

ISA = "DPUV3E"
#: Tokens a cross-engine counter may hold along program order here (Program.deeper_counters; within the code
#: generator's commitment, timing.depcheck.CODEGEN_COUNTER_DEPTH): a conv's tile LOADs its input rows newest first,
#: so its first LOAD waits for the producer's SAVE it needs; with one token that wait would move to a SAVE of a
#: later op whenever the tile before also waited on a SAVE (the second tile of a conv after a conv waited for the
#: whole next op's tile).
COUNTER_DEPTH = 2
#: The DDR dependency grain (Program.ddr_block): a conv's tiles are bands of at most PP rows of small maps (vai_c's
#: U50 programs run MNIST- to PointPillars-size ones), so 4096-byte blocks spanned rows of the producer's next
#: tile and made a consumer's first tile wait for SAVEs it does not read; 256 bytes is within a row of 16 pixels
#: of 16 channels.
DDR_BLOCK = 256


def conv_pool_pairs(graph: Graph, order: list[Op], alias: frozenset[str] | set[str]) -> dict[str, Op]:
    """conv name -> the pool run on its tiles: consecutive in `order`, the conv's output read by the pool alone
    and neither a subgraph output nor saved into a concat."""
    readers: dict[str, int] = {}
    for op in order:
        for t in op.inputs:
            readers[t] = readers.get(t, 0) + 1
    pairs = {}
    for a, b in zip(order, order[1:]):
        t = a.outputs[0]
        if readers.get(t) == 1 and t not in graph.outputs and t not in alias and fusable_pool(a, b, graph):
            pairs[a.name] = b
    return pairs


def compile_graph_v3e(graph: Graph, arch: Arch, plan: FusionPlan, keep_params: bool = True) -> CompiledSubgraph:
    """Compile `graph` for a DPUV3E core, op after op in the order of `plan`'s groups."""
    validate_graph(graph)
    groups = order_groups(graph, plan.groups)
    ops = {op.name: op for op in graph.ops}
    order = [ops[n] for g in groups for n in g.ops]
    emit_graph = Graph(graph.name, graph.tensors, order, graph.inputs, graph.outputs)
    pairs = conv_pool_pairs(graph, order, plan.concat_fused)
    on_chip = {ops[n].outputs[0] for n in pairs}
    fmaps, alias, sizes = plan_ddr(emit_graph, plan.concat_fused, on_chip)
    params = ParamBlob(keep=keep_params)
    prog = Program(ddr_roots=alias_roots(alias), isa=ISA, ddr_block=DDR_BLOCK)
    op_ranges = []
    fused = {p.name for p in pairs.values()}
    with prog.deeper_counters(COUNTER_DEPTH):
        for op in order:
            if op.name in fused:
                continue
            start, param_start = len(prog), params.size
            _emit(prog, arch, graph, op, pairs.get(op.name), fmaps, alias, params, plan)
            name = op.name if op.name not in pairs else f"{op.name}+{pairs[op.name].name}"
            op_ranges.append((name, start, len(prog)))
            for t in op.params.values():  # constants an emitter did not name: where its op's parameters start
                params.offsets.setdefault(t, param_start)
    return finish_subgraph(graph, arch, prog, params, fmaps, sizes, op_ranges)


def _emit(prog: Program, arch: Arch, graph: Graph, op: Op, pool: Op | None, fmaps: dict, alias: dict,
          params: ParamBlob, plan: FusionPlan) -> None:
    """Emit `op` (with the pool fused to it, if any); CodegenError naming the op when it cannot be."""
    try:
        emit = isa_emitter(op.type, ISA)
    except OpRegistryError as e:
        raise CodegenError(f"op {op.name!r} ({op.type}): not supported by the {ISA} code generator of "
                           f"{arch.target_label} ({e})") from None
    try:
        if pool is not None:
            emit_conv_pool(prog, arch, graph, op, pool, fmaps, params)
        else:
            emit(prog, arch, graph, op, fmaps, alias, params, plan.variants.get(op.name, "wide"))
    except CodegenError as e:
        msg = str(e)
        raise CodegenError(msg if op.name in msg else f"op {op.name!r} ({op.type}): {msg}") from None
