"""XGraph (quantized DPU subgraph) + fusion plan -> machine code, DDR layout and parameter blob.

Steps:
1. DDR allocation. Inputs go to REG_INPUT, outputs to REG_OUTPUT, every other feature map to REG_WORK with
   liveness-based reuse (first fit). A concat whose inputs carry the output fix_point is free: its producers
   save straight into channel slices of the concat buffer (aliases); other inputs get a copy (or a requantizing
   1x1 ALU max pool) into their slice.
2. Parameters: each conv-class op's weights and biases packed in bank order into REG_PARAMS.
3. Emission, group by group of a fusion plan (`compile_graph_fused`): a lone op with the per-engine emitters
   (conv.py, alu.py, elew.py, copy.py), a fused group with its pipeline (fused_*.py). `compile_graph` is the
   same path with a plan of single ops.
"""
from __future__ import annotations

import functools
import heapq
import importlib
from dataclasses import replace
from typing import Callable, Sequence

import numpy as np

import tvm_dpu.templates as tpl
from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.alu import AluJob, alu_job, emit_alu
from tvm_dpu.codegen import conv_variants
from tvm_dpu.codegen.conv import (AUG_MARGIN, ConvJob, augmented_weights, emit_conv, input_augmentation,
                                  piece_zero_bytes)
from tvm_dpu.codegen.copy import emit_upsample
from tvm_dpu.codegen.elew import ElewJob, emit_elew
from tvm_dpu.codegen.isa import DEFAULT_ISA
from tvm_dpu.codegen.layout import (ParamBlob, align, ceil_div, group_param, pack_channel_vector, pack_conv_weights,
                                    pack_dw_weights)
from tvm_dpu.codegen.program import Program
from tvm_dpu.codegen.fused import emittable
from tvm_dpu.codegen.tiling import CodegenError
from tvm_dpu.errors import FusionError
from tvm_dpu.ops import OpRegistryError
from tvm_dpu.ops import hook as op_hook
from tvm_dpu.types import (REG_INPUT, REG_OUTPUT, REG_PARAMS, REG_WORK, SINGLE, CompiledSubgraph, FMap, FusionPlan,
                           Group, TensorBinding)
from tvm_dpu.xgraph import ops as xops
from tvm_dpu.xgraph.graph import Graph, Op
from tvm_dpu.xgraph.validate import validate_graph


class _Allocator:
    """First-fit allocator of one DDR region with explicit frees."""

    def __init__(self) -> None:
        self.free: list[tuple[int, int]] = []  # (offset, size), sorted
        self.top = 0

    def alloc(self, size: int) -> int:
        size = align(max(size, 1))
        for i, (off, sz) in enumerate(self.free):
            if sz >= size:
                if sz == size:
                    self.free.pop(i)
                else:
                    self.free[i] = (off + size, sz - size)
                return off
        off = self.top
        self.top += size
        return off

    def release(self, off: int, size: int) -> None:
        size = align(max(size, 1))
        self.free.append((off, size))
        self.free.sort()
        merged: list[tuple[int, int]] = []
        for o, s in self.free:
            if merged and merged[-1][0] + merged[-1][1] == o:
                merged[-1] = (merged[-1][0], merged[-1][1] + s)
            else:
                merged.append((o, s))
        self.free = merged


def _dims(graph: Graph, name: str) -> tuple[int, int, int]:
    s = graph.tensors[name].shape
    if len(s) != 4 or s[0] != 1:
        raise CodegenError(f"graph {graph.name!r}: tensor {name!r} of shape {s} is not a batch-1 NCHW feature map")
    return s[2], s[3], s[1]


def plan_ddr(graph: Graph, alias_ok: frozenset[str] | set[str], on_chip: frozenset[str] | set[str] = frozenset(),
             span: dict[str, int] | None = None, margin: frozenset[str] | set[str] = frozenset()
             ) -> tuple[dict[str, FMap], dict[str, tuple[str, int]], dict[int, int]]:
    """FMap of every DDR feature map, the concat aliases (tensor -> (concat output, channel offset)) restricted
    to `alias_ok`, and the region sizes. Tensors in `on_chip` get no DDR place. `span` maps an op name to the
    index of the last op of its fused group: the group's inputs stay live (are not reused for its outputs)
    until the whole group has run, since a fused pipeline reads and writes tile by tile. Inputs in `margin` get
    conv.AUG_MARGIN free bytes before and after them (read, masked, by channel-augmented LOADs)."""
    span = span or {}
    outputs = set(graph.outputs)
    alias: dict[str, tuple[str, int]] = {}
    for op in graph.ops:
        if op.type != "concat" or xops.attr(op, "axis") % 4 != 1:
            continue
        c0 = 0
        for name in op.inputs:
            if name in alias_ok and name not in outputs and name not in alias:
                alias[name] = (op.outputs[0], c0)
            c0 += graph.tensors[name].shape[1]

    def root(name: str) -> tuple[str, int]:
        return _alias_root(alias, name)

    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, op in enumerate(graph.ops):
        for t in op.outputs:
            if t in on_chip:
                continue
            r = root(t)[0]
            first.setdefault(r, i)
            last[r] = max(last.get(r, i), i)
        for t in op.inputs:
            if graph.tensors[t].is_const or t in on_chip:
                continue
            r = root(t)[0]
            end = span.get(op.name, i)
            last[r] = max(last.get(r, end), end)
    fmaps: dict[str, FMap] = {}
    sizes = {REG_INPUT: 0, REG_OUTPUT: 0, REG_WORK: 0}
    for reg, names in ((REG_INPUT, graph.inputs), (REG_OUTPUT, graph.outputs)):
        for name in names:
            if name in fmaps:
                continue
            h, w, c = _dims(graph, name)
            m = AUG_MARGIN if name in margin else 0
            fmaps[name] = FMap.dense(reg, sizes[reg] + m, h, w, c)
            sizes[reg] += align(h * w * c + 2 * m)
    work = _Allocator()
    frees: dict[int, list[str]] = {}
    for r, i in last.items():
        frees.setdefault(i, []).append(r)
    inputs = set(graph.inputs)
    for i, op in enumerate(graph.ops):
        for t in op.outputs:
            if t in on_chip:
                continue
            r = root(t)[0]
            if r in fmaps or first.get(r) != i:
                continue
            h, w, c = _dims(graph, r)
            fmaps[r] = FMap.dense(REG_WORK, work.alloc(h * w * c), h, w, c)
        for r in frees.get(i, []):
            fm = fmaps.get(r)
            if fm is not None and fm.reg_id == REG_WORK and r not in inputs:
                work.release(fm.offset, fm.h * fm.w * fm.c)
    sizes[REG_WORK] = work.top
    for name, t in graph.tensors.items():
        if name in fmaps or t.is_const or name in on_chip:
            continue
        r, c0 = root(name)
        if r in fmaps:
            fmaps[name] = fmaps[r].channels(c0, t.shape[1])
    return fmaps, alias, sizes



def concat_fusions(graph: Graph) -> frozenset[str]:
    """Concat inputs that can be saved by their producer straight into the concat's channel slice (produced here,
    not a graph output, not requantized, used once, not itself a concat): the aliases plan_ddr may make."""
    producer = graph.producers()
    outputs = set(graph.outputs)
    fused: set[str] = set()
    for op in graph.ops:
        if op.type != "concat" or xops.attr(op, "axis") % 4 != 1:
            continue
        try:
            requant = xops.quant_params(op, graph).requant
        except Exception:  # a float graph (no fix_points yet): same fix_point assumed
            requant = [None] * len(op.inputs)
        for i, name in enumerate(op.inputs):
            if (name in producer and name not in outputs and name not in fused and requant[i] is None
                    and op.inputs.count(name) == 1 and producer[name].type != "concat"):
                fused.add(name)
    return frozenset(fused)


def group_dependencies(graph: Graph, groups: Sequence[Group]) -> tuple[dict[str, int], dict[int, int],
                                                                        dict[int, set[int]]]:
    """(op name -> its group, group -> index of its first op in graph order, group -> the groups producing its
    external inputs); FusionError unless the groups cover every op of `graph` exactly once."""
    owner: dict[str, int] = {}
    for gi, g in enumerate(groups):
        for n in g.ops:
            if n in owner:
                raise FusionError(f"fusion plan: op {n!r} is in two groups ({groups[owner[n]].template}, {g.template})")
            owner[n] = gi
    missing = [op.name for op in graph.ops if op.name not in owner]
    if missing or len(owner) != len(graph.ops):
        raise FusionError(f"fusion plan: op(s) {missing[:5]} are in no group" if missing else
                          "fusion plan: names ops that are not in the graph")
    producer = {t: owner[op.name] for op in graph.ops for t in op.outputs}
    first: dict[int, int] = {}
    for i, op in enumerate(graph.ops):
        first.setdefault(owner[op.name], i)
    deps: dict[int, set[int]] = {gi: set() for gi in range(len(groups))}
    for op in graph.ops:
        gi = owner[op.name]
        for t in op.inputs:
            p = producer.get(t)
            if p is not None and p != gi:
                deps[gi].add(p)
    return owner, first, deps


def order_groups(graph: Graph, groups: list[Group]) -> list[Group]:
    """Groups in an executable order (each after the producers of its external inputs, ties by first op in graph
    order); FusionError if the grouping is cyclic or does not cover every op exactly once."""
    _, first, deps = group_dependencies(graph, groups)
    done: set[int] = set()
    out: list[Group] = []
    users: dict[int, list[int]] = {}
    for gi, ds in deps.items():
        for d in ds:
            users.setdefault(d, []).append(gi)
    heap = [(first[gi], gi) for gi in deps if not deps[gi]]
    heapq.heapify(heap)
    remaining = {gi: len(ds) for gi, ds in deps.items()}
    while heap:
        _, gi = heapq.heappop(heap)
        done.add(gi)
        out.append(groups[gi])
        for u in users.get(gi, ()):
            remaining[u] -= 1
            if remaining[u] == 0:
                heapq.heappush(heap, (first[u], u))
    if len(out) != len(groups):
        stuck = [groups[gi].ops for gi in range(len(groups)) if gi not in done][:3]
        raise FusionError(f"fusion plan: the grouping is cyclic (groups {stuck} wait on each other)")
    return out


def compile_graph(graph: Graph, arch: Arch) -> CompiledSubgraph:
    """Compile a validated, quantized XGraph for `arch` op by op: the fused compiler with a plan of single ops
    whose legal concat inputs are saved straight into their slice."""
    return compile_graph_fused(graph, arch, single_op_plan(graph))


def single_op_plan(graph: Graph) -> FusionPlan:
    """The fusion plan of no fusion: every op alone, its legal concat inputs saved straight into their slice."""
    return FusionPlan("none", [Group(SINGLE, (op.name,)) for op in graph.ops], concat_fusions(graph))


def _on_chip_maps(fused: set[Group], ops: dict[str, Op], outputs: Sequence[str]) -> set[str]:
    """The feature maps the fused groups keep in the banks (never given a DDR place): every member's output but the
    last, for the templates that keep them (TemplateDef.on_chip), unless an op outside the group reads it or it is a
    graph output (`outputs`): then the group also SAVEs it (fused_chain's side SAVEs; fusion.fork makes such
    groups)."""
    readers: dict[str, set[str]] = {}
    for op in ops.values():
        for t in op.inputs:
            readers.setdefault(t, set()).add(op.name)
    on_chip: set[str] = set()
    for g in fused:
        if tpl.get(g.template).on_chip:
            on_chip.update(t for n in g.ops[:-1] for t in ops[n].outputs
                           if t not in outputs and readers.get(t, set()) <= set(g.ops))
    return on_chip


def _emit_fused(prog: Program, arch: Arch, graph: Graph, g: Group, ops: dict[str, Op], fmaps: dict[str, FMap],
                params: ParamBlob, plan: FusionPlan) -> None:
    """Emit fused group `g` with its template's emitter, its parameters relocated when the template asks
    (TemplateDef.relocated)."""
    emit = functools.partial(tpl.hook(g.template, "emitter"), arch=arch, graph=graph, ops=[ops[n] for n in g.ops],
                             fmaps=fmaps, variant=plan.variants.get(g.ops[0], "wide"))
    if tpl.get(g.template).relocated:
        relocated_params(prog, arch, emit, params)
    else:
        emit(prog, params)


def compile_graph_fused(graph: Graph, arch: Arch, plan: FusionPlan, keep_params: bool = True) -> CompiledSubgraph:
    """Compile `graph` for `arch` following `plan` (a fusion plan, e.g. fusion.plan_fusion's). `keep_params=False`
    gives the same code with zeroed parameters, for a program that is only timed.

    * DDR plan (`plan_ddr`): inputs, outputs, liveness-reused workspace; the concat inputs of
      `plan.concat_fused` alias their slice (the others are copied by the concat; plan "none" aliases the same
      inputs as `compile_graph`) and the intermediates a fused pipeline keeps on chip never reach DDR.
    * Groups are emitted in plan order. Fused pipelines (fused_*.py): conv_add (per output tile the CONVs leave
      the conv's result in VB1, the add's other operand is loaded next to it, one ELEW per ALU_PP rows adds them
      in place, the SAVEs write the add's output; the conv's output never touches DDR), hconv2/hconv3 (one input
      tile load feeds the CONVs of every member), dw_pw and conv_conv with a pointwise second conv (the first
      op's output tile in VB1 is the pointwise conv's input tile), conv_pool and pw_dw (emit_conv_pool: the conv
      writes its rows with the row-store rule straight into the row-fetch layout of the ALU consumer -- max/avg
      pool or depthwise conv -- in a circular buffer of VB1, each conv row computed once per column strip),
      conv_conv with a windowed second conv (emit_conv_window: the same circular buffer, read by the second
      conv's CONVs). Fused groups that do not fit the banks are emitted member by member with the unfused
      emitters (same values).
    """
    other = _isa_compiler(arch)
    if other is not None:
        return other(graph, arch, plan, keep_params)
    validate_graph(graph)
    groups = order_groups(graph, plan.groups)  # checks coverage and acyclicity
    ops = {op.name: op for op in graph.ops}
    fused = {g for g in groups if emittable(g, graph, arch)}
    on_chip = _on_chip_maps(fused, ops, graph.outputs)
    # The liveness walk must follow the emission order.
    order = [ops[n] for g in groups for n in g.ops]
    emit_graph = Graph(graph.name, graph.tensors, order, graph.inputs, graph.outputs)
    span: dict[str, int] = {}
    i = 0
    for g in groups:
        i += len(g.ops)
        if g in fused:
            span.update({n: i - 1 for n in g.ops})
    margin = {op.inputs[0] for op in graph.ops if input_augmentation(arch, graph, op) is not None}
    fmaps, alias, sizes = plan_ddr(emit_graph, plan.concat_fused, on_chip, span, margin)
    params = ParamBlob(keep=keep_params)
    prog = Program(ddr_roots=alias_roots(alias))
    op_ranges = []
    for g in groups:
        start = len(prog)
        param_start = params.size
        try:
            if g in fused:
                _emit_fused(prog, arch, graph, g, ops, fmaps, params, plan)
            else:
                for n in g.ops:
                    s = len(prog)
                    _emit_op(prog, arch, graph, ops[n], fmaps, alias, params, plan.variants.get(n, "wide"))
                    if len(g.ops) > 1:
                        op_ranges.append((n, s, len(prog)))
        except CodegenError as e:
            msg = str(e)
            if any(n in msg for n in g.ops):
                raise
            where = f"op {g.ops[0]!r} ({ops[g.ops[0]].type})" if len(g.ops) == 1 else \
                f"group {g.template} {list(g.ops)}"
            raise CodegenError(f"{where}: {msg}") from None
        if len(g.ops) == 1 or g in fused:
            op_ranges.append(("+".join(g.ops), start, len(prog)))
        for n in g.ops:  # constants an emitter did not name: the start of their group's parameters
            for t in ops[n].params.values():
                params.offsets.setdefault(t, param_start)
    return finish_subgraph(graph, arch, prog, params, fmaps, sizes, op_ranges)


def finish_subgraph(graph: Graph, arch: Arch, prog: Program, params: ParamBlob, fmaps: dict[str, FMap],
                    sizes: dict[int, int], op_ranges: list) -> CompiledSubgraph:
    """END the program and package it with its parameters, region sizes and tensor places."""
    prog.end()
    sizes[REG_PARAMS] = params.size
    region_sizes = {reg: align(max(size, 1), 4096) for reg, size in sizes.items()}
    binding = lambda n: TensorBinding(n, graph.tensors[n].shape, int(graph.tensors[n].fix_point), fmaps[n])
    return CompiledSubgraph(
        name=graph.name, arch=arch.name, fingerprint=arch.fingerprint, code=prog.encode(), params=params.blob(),
        region_sizes=region_sizes, inputs=[binding(n) for n in graph.inputs],
        outputs=[binding(n) for n in graph.outputs], instr_counts=prog.counts(), op_ranges=op_ranges,
        places=dict(fmaps), param_offsets=dict(params.offsets))


#: The compiler of each instruction set other than DPUV2 (codegen.isa.ISA_FILES names): module and function,
#: imported on first use (they build on this module's DDR plan and packaging).
ISA_COMPILERS = {"DPUV3E": ("tvm_dpu.codegen.dpuv3e_compiler", "compile_graph_v3e")}
#: Every instruction set tvm-dpu generates code for.
CODEGEN_ISAS = (DEFAULT_ISA, *ISA_COMPILERS)


def _isa_compiler(arch: Arch) -> Callable[..., CompiledSubgraph] | None:
    """The compiler of `arch`'s instruction set when it is not DPUV2 (the ISA1 path of this module); CodegenError
    naming the set when there is none."""
    isa = arch.instruction_set
    if isa == DEFAULT_ISA:
        return None
    if isa not in ISA_COMPILERS:
        raise CodegenError(f"{arch.target_label}: no code generator for instruction set {isa}")
    module, fn = ISA_COMPILERS[isa]
    return getattr(importlib.import_module(module), fn)


def param_rows(prog: Program, arch: Arch) -> tuple[int, int]:
    """(CONVW rows, BIAS rows) the parameter LOADs of `prog` fill, counted from row 0."""
    convw = arch.bank_group("CONVW")
    bias = arch.bank_group("BIAS").base_id
    rows = [0, 0]
    for e in prog.entries:
        if e.instr.name != "LOAD":
            continue
        f = e.instr.fields
        k = 0 if convw.base_id <= f["bank_id"] < convw.base_id + convw.count else 1 if f["bank_id"] == bias else -1
        if k >= 0:
            end = f["bank_addr"] + (f["length"] - 1) * f["jump_write"] + ceil_div(f["channel"], arch.icp)
            rows[k] = max(rows[k], end)
    return rows[0], rows[1]


def relocated_params(prog: Program, arch: Arch, emit: Callable[..., None], params: ParamBlob) -> None:
    """emit(prog, params) for a fused kernel that puts its parameters from row 0 of the CONVW and BIAS banks, moved
    into the half the previous op did not use (Program.next_slot, as the unfused conv alternates halves) when they
    fit one: its weight LOADs then overlap the previous op's CONVs instead of waiting for all of them, which made
    fused kernels start with a bubble their unfused members do not have. The rows are measured by emitting the
    kernel once into a scratch program (with a scratch parameter region)."""
    scratch = Program(ddr_roots=dict(prog.ddr_roots), track=False)
    emit(scratch, ParamBlob(keep=False))
    w_rows, b_rows = param_rows(scratch, arch)
    half = arch.bank_depth // 2
    if w_rows > half or b_rows > half:
        emit(prog, params)
        return
    slot = prog.next_slot("convw")
    prog.next_slot("bias")
    prog.param_shift = (slot * half, slot)
    try:
        emit(prog, params)
    finally:
        prog.param_shift = None


def _bias_of(graph: Graph, op: Op, n: int) -> np.ndarray:
    b = graph.param(op, "bias", required=False)
    return b.data if b is not None else np.zeros(n, np.int8)


def alias_roots(alias: dict[str, tuple[str, int]]) -> dict[str, str]:
    """Each aliased tensor -> the tensor whose DDR memory it is a slice of (Program.ddr_roots)."""
    return {n: _alias_root(alias, n)[0] for n in alias}


def _alias_root(alias: dict[str, tuple[str, int]], name: str) -> tuple[str, int]:
    """(the tensor whose DDR memory `name` is a slice of, its channel offset there); (name, 0) when not
    aliased."""
    c0 = 0
    while name in alias:
        name, off = alias[name]
        c0 += off
    return name, c0


def phase_split(op: Op, graph: Graph, x: FMap, y: FMap, w: np.ndarray) -> conv_variants.Decomposition | None:
    """The polyphase split of a transposed or dilated conv (w in correlation layout (O, I, kh, kw) or
    (C, 1, kh, kw), unflipped), or None for an ordinary conv."""
    what = f"op {op.name!r} ({op.type})"
    dil = tuple(int(d) for d in xops.attr(op, "dilations"))
    strides = tuple(int(s) for s in xops.attr(op, "strides"))
    pads = tuple(int(p) for p in xops.attr(op, "pads"))
    if op.type == "conv2d_transpose":
        if dil != (1, 1):
            raise CodegenError(f"{what}: dilated transposed conv is not supported by the code generator")
        return conv_variants.transposed_phases(x, y, w, strides, pads, what)  # type: ignore[arg-type]
    if dil == (1, 1):
        return None
    return conv_variants.dilated_phases(x, y, w, strides, dil, pads, what)  # type: ignore[arg-type]


def _emit_conv_op(prog: Program, arch: Arch, graph: Graph, op: Op, fmaps: dict[str, FMap], params: ParamBlob,
                  variant: str = "wide") -> None:
    """conv2d (any groups, any dilation), dense and conv2d_transpose (groups 1) on the CONV engine, with the tiles
    of `variant` (conv.CONV_VARIANTS).

    A grouped conv2d (groups G > 1, not depthwise) is G independent convs: group g reads input channels
    [g*I/G, (g+1)*I/G) and writes output channels [g*O/G, (g+1)*O/G). Each is emitted as an ordinary conv on
    channel-slice views of the input and output maps (FMap.channels, the same views a free concat saves into), so
    the LOADs fetch only the group's input channels and the SAVEs land in place in the output map: no copies, no
    split or concat op. A CONV reduces all input channels of its channel groups (isa1-semantics.md 6.2), so one
    instruction cannot mix groups; hence the decomposition rather than block-diagonal weights, which would also
    multiply the weight rows and MACs by G. A partial conv (attr in_slice, backend/split_conv.py) is emitted the
    same way on the channel-slice view of its input."""
    t = op.type
    out = op.outputs[0]
    x, y = fmaps[op.inputs[0]], fmaps[out]
    part = xops.conv_input_slice(op, graph)
    if part is not None:  # a partial conv: its LOADs fetch only its slice of the input's channels
        x = x.channels(*part)
    q = xops.quant_params(op, graph)
    w = graph.param(op, "weights").data
    groups = int(xops.attr(op, "groups")) if t != "dense" else 1
    if t == "conv2d_transpose":
        if groups != 1:
            raise CodegenError("grouped transposed conv (other than depthwise) is not supported by the code "
                               "generator yet")
        w = w.transpose(1, 0, 2, 3)  # (I, O, kh, kw) -> (O, I, kh, kw)
    bias = _bias_of(graph, op, w.shape[0])
    if t == "dense":
        w = w.reshape(xops.dense_weights_shape(op, graph))
    pack = lambda wt: pack_conv_weights(wt, arch.icp, arch.ocp)  # noqa: E731
    put = lambda wt: params.add(pack(wt), op.params["weights"])  # noqa: E731
    icg, ocg = w.shape[1], w.shape[0] // groups  # weights are (O, I/groups, kh, kw)
    for g in range(groups):
        xg, yg = (x, y) if groups == 1 else (x.channels(g * icg, icg), y.channels(g * ocg, ocg))
        wg = w[g * ocg:(g + 1) * ocg]
        b_off = params.add(pack_channel_vector(bias[g * ocg:(g + 1) * ocg], arch.ocp), op.params.get("bias", ""))
        if groups != 1:  # for the xmodel writer: each group's slices, whose weights every path packs next
            params.offsets[group_param(op.params["weights"], g)] = params.size
            if "bias" in op.params:
                params.offsets[group_param(op.params["bias"], g)] = b_off

        def job(wt: np.ndarray, w_off: int, strides: tuple[int, int], pd: tuple[int, int, int, int],
                b_off: int = b_off) -> ConvJob:
            return ConvJob(op.name, wt.shape[2], wt.shape[3], strides[0], strides[1], tuple(pd), wt.shape[1],
                           wt.shape[0], q.act_type, q.shift_cut, q.shift_bias_isa, w_off, b_off, REG_PARAMS,
                           variant)

        if t == "dense":
            emit_conv(prog, arch, job(wg, put(wg), (1, 1), (0, 0, 0, 0)), xg, yg, op.inputs[0], out)
            continue
        phases = phase_split(op, graph, xg, yg, wg)
        aug = input_augmentation(arch, graph, op) if groups == 1 else None
        if aug is not None:
            win = xops.conv_window(op, graph)
            wa = augmented_weights(wg)
            pads = (win.pads[0], 0, win.pads[2], 0)
            emit_conv(prog, arch, replace(job(wa, put(wa), (win.sh, 1), pads), aug=aug), xg, yg,
                      op.inputs[0], out)
        elif phases is None:
            win = xops.conv_window(op, graph)
            jb = job(wg, put(wg), (win.sh, win.sw), win.pads)
            if piece_zero_bytes(arch, jb, yg):  # zeros for the padding of a last row band run as PieceTiles
                jb = replace(jb, zero_offset=params.add(np.zeros(piece_zero_bytes(arch, jb, yg), np.int8)))
            emit_conv(prog, arch, jb, xg, yg, op.inputs[0], out)
        else:
            emit_phases(prog, arch, op, phases, wg, params, pack, job, emit_conv, zero_channels=1)


def _emit_dwconv_op(prog: Program, arch: Arch, graph: Graph, op: Op, fmaps: dict[str, FMap],
                    params: ParamBlob) -> None:
    """Depthwise conv (any dilation) and depthwise transposed conv on the ALU (dwconv mode)."""
    out = op.outputs[0]
    x, y = fmaps[op.inputs[0]], fmaps[out]
    q = xops.quant_params(op, graph)
    w = graph.param(op, "weights").data  # (C, 1, kh, kw) for both
    b_off = params.add(pack_channel_vector(_bias_of(graph, op, w.shape[0]), arch.icp), op.params.get("bias", ""))

    def job(wt: np.ndarray, w_off: int, strides: tuple[int, int], pd: tuple[int, int, int, int]) -> AluJob:
        return AluJob(op.name, "dwconv", wt.shape[0], wt.shape[2], wt.shape[3], strides[0], strides[1],
                      tuple(pd), act_type=q.act_type, shift_cut=q.shift_cut,
                      shift_bias=q.shift_bias_isa, w_offset=w_off, b_offset=b_off, params_reg=REG_PARAMS)

    pack = lambda wt: pack_dw_weights(wt, arch.icp)  # noqa: E731
    phases = phase_split(op, graph, x, y, w)
    if phases is None:
        win = xops.conv_window(op, graph)
        emit_alu(prog, arch, job(w, params.add(pack(w), op.params["weights"]), (win.sh, win.sw), win.pads), x, y,
                 op.inputs[0], out)
        return
    emit_phases(prog, arch, op, phases, w, params, pack, job, emit_alu, zero_channels=w.shape[0])


def emit_phases(prog: Program, arch: Arch, op: Op, phases: conv_variants.Decomposition, w: np.ndarray,
                params: ParamBlob, pack, job, emit, zero_channels: int) -> None:
    """Emit every phase conv of a decomposed op (`job(weights, w_offset, strides, pads)` builds the engine job,
    `emit` is emit_conv / emit_alu), then the outputs that only see padding."""
    out = op.outputs[0]
    # dilated: one kernel for all phases
    shared = None if op.type == "conv2d_transpose" else params.add(pack(w), op.params["weights"])
    for ph in phases.phases:
        w_off = shared if shared is not None else params.add(pack(ph.weights), op.params["weights"])
        emit(prog, arch, job(ph.weights, w_off, ph.strides, ph.pads), ph.x, ph.y, op.inputs[0], out)
    if phases.bias_only:
        # act(bias) = the op on zeros: a 1x1 conv with zero weights over a zero map kept in the params region
        # (one input channel on the CONV engine; the ALU keeps channels)
        zw = np.zeros((w.shape[0], 1, 1, 1), np.int8)
        w_off = params.add(pack(zw))
        zx = _zero_map(params, max(v.w for v in phases.bias_only), zero_channels)
        for v in phases.bias_only:
            emit(prog, arch, job(zw, w_off, (1, 1), (0, 0, 0, 0)), replace(zx, h=v.h, w=v.w), v, "params", out)


def _zero_map(params: ParamBlob, width: int, c: int) -> FMap:
    """A `width` x c map of zeros in the params region whose rows all alias one another (row pitch 0)."""
    off = params.add(np.zeros(width * c, np.int8))
    return FMap(REG_PARAMS, off, 1, width, c, c, 0)




def _emit_op(prog: Program, arch: Arch, graph: Graph, op: Op, fmaps: dict[str, FMap],
             alias: dict[str, tuple[str, int]], params: ParamBlob, variant: str = "wide") -> None:
    # the emitter of each op kind is its OpDef's `emitter` hook (tvm_dpu/ops/), one of the emit_* below
    try:
        emit = op_hook(op.type, "emitter")
    except OpRegistryError as e:
        raise CodegenError(f"op type {op.type!r} is not supported by the code generator yet ({e})") from None
    emit(prog, arch, graph, op, fmaps, alias, params, variant)


def emit_conv_class(prog: Program, arch: Arch, graph: Graph, op: Op, fmaps: dict[str, FMap],
                    alias: dict[str, tuple[str, int]], params: ParamBlob, variant: str = "wide") -> None:
    """conv2d / dense / conv2d_transpose on the CONV engine, depthwise_conv2d (and a depthwise transposed conv)
    on the ALU."""
    if op.type in ("conv2d", "dense", "conv2d_transpose") and not xops.is_depthwise(op, graph):
        _emit_conv_op(prog, arch, graph, op, fmaps, params, variant)
    else:
        _emit_dwconv_op(prog, arch, graph, op, fmaps, params)


def emit_pool(prog: Program, arch: Arch, graph: Graph, op: Op, fmaps: dict[str, FMap],
              alias: dict[str, tuple[str, int]], params: ParamBlob, variant: str = "wide") -> None:
    """max_pool2d / avg_pool2d on the ALU."""
    out = op.outputs[0]
    emit_alu(prog, arch, alu_job(arch, graph, op, params), fmaps[op.inputs[0]], fmaps[out], op.inputs[0], out)


def emit_eltwise(prog: Program, arch: Arch, graph: Graph, op: Op, fmaps: dict[str, FMap],
                 alias: dict[str, tuple[str, int]], params: ParamBlob, variant: str = "wide") -> None:
    """eltwise_add / eltwise_mul on the ELEW engine."""
    out = op.outputs[0]
    q = xops.quant_params(op, graph)
    job = ElewJob(op.name, graph.tensors[out].shape[1], q.kind, q.act_type, tuple(q.shift_read), q.shift_write)
    emit_elew(prog, arch, job, [fmaps[i] for i in op.inputs], fmaps[out], list(op.inputs), out)


def emit_concat(prog: Program, arch: Arch, graph: Graph, op: Op, fmaps: dict[str, FMap],
                alias: dict[str, tuple[str, int]], params: ParamBlob, variant: str = "wide") -> None:
    """concat along channels: each input not already saved into its slice (`alias`) is copied, or requantized
    by a 1x1 max pool where its fix_point differs."""
    out = op.outputs[0]
    y = fmaps[out]
    q = xops.quant_params(op, graph)
    axis = xops.attr(op, "axis") % 4
    if axis != 1:
        raise CodegenError(f"concat along axis {axis} is not supported by the code generator yet")
    c0 = 0
    for i, name in enumerate(op.inputs):
        c = graph.tensors[name].shape[1]
        if alias.get(name, (None,))[0] != out:
            dst = y.channels(c0, c)
            if q.requant[i] is None:
                emit_upsample(prog, arch, op.name, fmaps[name], dst, (1, 1), name, out)
            else:
                job = AluJob(op.name, "maxpool", c, shift_cut=q.requant[i].shift_cut)
                emit_alu(prog, arch, job, fmaps[name], dst, name, out)
        c0 += c


def emit_upsample_op(prog: Program, arch: Arch, graph: Graph, op: Op, fmaps: dict[str, FMap],
                     alias: dict[str, tuple[str, int]], params: ParamBlob, variant: str = "wide") -> None:
    """upsample_nearest by pixel replication."""
    out = op.outputs[0]
    xops.quant_params(op, graph)
    sh, sw = xops.attr(op, "scale")
    emit_upsample(prog, arch, op.name, fmaps[op.inputs[0]], fmaps[out], (int(sh), int(sw)), op.inputs[0], out)


def emit_activation(prog: Program, arch: Arch, graph: Graph, op: Op, fmaps: dict[str, FMap],
                    alias: dict[str, tuple[str, int]], params: ParamBlob, variant: str = "wide") -> None:
    """A standalone activation on the ALU (relu / relu6 as a unit-weight 1x1 depthwise conv)."""
    out = op.outputs[0]
    emit_alu(prog, arch, alu_job(arch, graph, op, params), fmaps[op.inputs[0]], fmaps[out], op.inputs[0], out)

