"""On-chip residency across ops (issue 23): a chain of ops whose intermediate maps never leave the image banks.

vai_c keeps a small network's maps in the banks from its input LOADs to its one SAVE: each op writes its whole
output map straight into the layout its consumer reads (the row-store rule with the consumer's stride,
isa1-semantics.md 3.3), and the consumer's CONVs / ALUs read it from there. The per-op emitters instead SAVE
every map to DDR and LOAD it back tile by tile, which costs DDR traffic, LOAD/SAVE instructions and, under the
dependency protocol, the latency of every transfer in the engines' token chains.

The template "resident" is a linear chain of ops (each the only consumer of the previous one's output, no
intermediate is a graph output) of these kinds: conv2d (groups 1, no dilation, no padding), dense (a conv whose
kernel is its input map), max / avg pool (no padding) and the parameter-free ALU activations (hard-sigmoid,
leaky relu). Every map of the chain is kept whole in one image bank group (`Resident`), alternately VB0 and
VB1, each within one half of its group and never reused inside the chain:

* map 0 (the chain's input) is LOADed from DDR, one LOAD per image row (rows that follow each other in one bank
  and in DDR merged); channel-augmented (kw input pixels per
  item, conv.augmentation) when the first op is a conv that gains from it;
* op i computes from map i into map i+1: CONVs of PP output rows x the whole width per output-channel group
  (weights all resident when they fit half the CONVW banks, else streamed through the two halves in chunks of
  as many groups as fit one, the next chunk's weights loading while this one computes), ALUs of ALU_PP rows;
* the last map is SAVEd, one SAVE per image row, or one for all when one instruction wrote them into one bank.

Each image row of each map is its own resource for the dependency tracker (named under the bank half it lies
in, so the instructions of neighbouring groups that use that half are ordered with it), so an op starts on the
rows its producer has finished. `resident_fits` says whether a chain fits; the fusion search costs it on the
timing model against the plan's groups (fusion.select).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

import tvm_dpu.templates as tpl
from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.alu import ALU_MODES, AluJob, alu_job
from tvm_dpu.codegen.conv import (ConvIn, ConvJob, ConvOut, augmentation, augmented_weights, emit_conv_groups, load_biases,
                                  load_params, param_resources)
from tvm_dpu.codegen.layout import ParamBlob, ceil_div, pack_channel_vector, pack_conv_weights
from tvm_dpu.codegen.program import Program
from tvm_dpu.codegen.tiling import FIELD10, MAX_WRAPS, OUT_GROUPS_MAX, CodegenError
from tvm_dpu.types import REG_PARAMS, FMap
from tvm_dpu.xgraph import ops as xops
from tvm_dpu.xgraph.graph import Graph, Op

#: The templates of resident chains (tvm_dpu/templates/resident.py), by their emission order: RESIDENT emits each
#: unit as soon as the rows it reads are; RESIDENT_SEQ conv after conv (every unit of an op before the next conv's;
#: the chain's input LOADs still go just ahead of the CONVs that read them, the ALUs of a pool / activation and the
#: SAVEs as soon as their rows are done, so they overlap the producer's CONVs), the order of vai_c's programs.
#: Where the LOAD engine bounds the chain's start (the input and every op's weights to load), the producer's last
#: tiles then overlap the next op's weight LOADs instead of waiting behind the consumer's first tiles; the fusion
#: search costs both orders (fusion.residency) and keeps the faster.
RESIDENTS = tpl.residents()
RESIDENT, RESIDENT_SEQ = RESIDENTS

#: ALU modes a resident chain runs (those without parameters in DWCONVW).
_ALU_ACTS = ("hard_sigmoid", "leaky_relu")
_ALU_LENGTH = 2048  # ALU length: 11-bit minus field
_ALU_ENDL = 8192  # ALU jump_read_endl / jump_write_endl: 13-bit minus fields
_STRIDE_MAX = 8  # stride_offset_out is 3 bits
_SAVE_CHANNELS = 4096  # SAVE channel: 12-bit minus field


@dataclass(frozen=True)
class Resident:
    """A feature map kept whole in one image bank group, in the row-fetch layout of the op reading it with
    stride `s` (isa1-semantics.md 3.3): image row y in bank (y // s) % PP of the group, from row
    base + (y // s // PP) * s * e + (y % s) * e, pixel x `cg` rows after pixel x - 1 (channel group g at + g)."""

    tag: str  # names its rows for the dependency tracker
    vb: int  # image bank group index (0: VB0, 1: VB1)
    bank0: int  # id of the group's first bank
    half: int  # half of the group's rows the map lies in
    base: int
    h: int
    w: int
    cg: int
    s: int

    @property
    def e(self) -> int:
        """Rows between line slots (jump_read_endl / jump_write_endl)."""
        return self.w * self.cg

    def res(self, y: int) -> tuple:
        return (f"vb{self.vb}", self.half, "res", self.tag, y)

    def rows(self, y0: int, n: int) -> tuple:
        """Resources of image rows [y0, y0 + n) that exist."""
        return tuple(self.res(y) for y in range(max(0, y0), min(self.h, y0 + n)))

    def where(self, y: int, pp: int) -> tuple[int, int]:
        """(bank id, row of pixel 0) of image row y."""
        k = y // self.s
        return self.bank0 + k % pp, self.base + (k // pp) * self.s * self.e + (y % self.s) * self.e

    def fetch(self, y0: int, pp: int, depth: int) -> tuple[int, list[int]]:
        """(bank_id_in, bank_addr_in.._3) of an instruction whose first fetched row is y0 (a multiple of s)."""
        k = y0 // self.s
        return self.bank0 + k % pp, [(self.base + (k // pp + g) * self.s * self.e) % depth for g in range(MAX_WRAPS)]

    def store(self, p0: int, pp: int, depth: int) -> tuple[int, int, int]:
        """(bank_id_out, bank_addr_out, stride_offset_out) of an instruction writing rows from p0 (row-store rule
        with stride_out = s, jump_write_endl = e)."""
        k = p0 // self.s
        return self.bank0 + k % pp, (self.base + (k // pp) * self.s * self.e) % depth, p0 % self.s

    def footprint(self, pp: int) -> int:
        """Rows of every bank of the group the map occupies."""
        return ceil_div(ceil_div(self.h, self.s), pp) * self.s * self.e


@dataclass(frozen=True)
class _Step:
    """One op of a resident chain: its engine and geometry (a conv's after channel augmentation)."""

    op: Op
    kind: str  # "conv" | "alu"
    kh: int
    kw: int
    sh: int
    sw: int
    cin: int
    cout: int
    h_out: int
    w_out: int
    aug: bool = False
    item_jump: int = 0  # augmented: the conv's horizontal stride, pixels between the LOAD items of map 0
    vpp: int = 1  # output rows per instruction


def _step(arch: Arch, graph: Graph, op: Op) -> _Step | None:
    """The chain step of `op`, or None when a resident chain cannot hold it."""
    _, c_out, h_out, w_out = graph.tensors[op.outputs[0]].shape
    c_in = graph.tensors[op.inputs[0]].shape[1]
    if op.type == "conv2d":
        if (xops.is_depthwise(op, graph) or xops.attr(op, "groups") != 1 or op.attrs.get("in_slice") is not None
                or tuple(xops.attr(op, "dilations")) != (1, 1)):
            return None
        win = xops.conv_window(op, graph)
        kind = "conv"
    elif op.type == "dense":
        win = xops.conv_window(op, graph)
        kind = "conv"
    elif op.type in ("max_pool2d", "avg_pool2d"):
        win = xops.pool_window(op, graph)
        kind = "alu"
    elif op.type == "activation" and xops.attr(op, "mode") in _ALU_ACTS:
        win = xops.Window(1, 1)
        kind = "alu"
    else:
        return None
    if any(win.pads) or win.sh > _STRIDE_MAX or win.sw > _STRIDE_MAX:
        return None
    if kind == "conv" and (win.kh > 16 or win.kw > 16 or ceil_div(c_out, arch.ocp) > OUT_GROUPS_MAX):
        return None
    # One output row: the vertical stride changes nothing computed, and stride kh puts the whole window in one bank
    # (line slots E apart), so its producer or LOAD writes it with one instruction instead of one per row; only
    # for a small window, which then still fits a quarter of the bank.
    one_bank = win.kh * win.kw * ceil_div(c_in, arch.icp) <= arch.bank_depth // 4
    sh = win.kh if h_out == 1 and win.kh <= _STRIDE_MAX and one_bank else win.sh
    return _Step(op, kind, win.kh, win.kw, sh, win.sw, c_in, c_out, h_out, w_out)


def _augmented(arch: Arch, st: _Step, pixel_pitch: int) -> _Step:
    """The first conv of a chain as the kh x 1 conv over kw*cin channels it becomes on channel-augmented input
    (conv.Augment), when that is faster and possible on this input; else unchanged."""
    if st.kind != "conv" or st.op.type != "conv2d":
        return st
    if augmentation(arch, st.cin, st.cout, st.kh, st.kw, st.sh, st.sw, (0, 0, 0, 0), pixel_pitch) is None:
        return st
    return _Step(st.op, "conv", st.kh, 1, st.sh, 1, st.kw * st.cin, st.cout, st.h_out, st.w_out, aug=True,
                 item_jump=st.sw)


def _rows_ok(pp: int, b0: int, vpp: int, kh: int, sh: int, limit: int) -> bool:
    """Whether rows fetched from bank b0 (vpp output rows, kernel kh, stride sh) need at most `limit` wraps."""
    return (b0 + ((vpp - 1) * sh + kh - 1) // sh) // pp < limit


@dataclass(frozen=True)
class Chain:
    """A resident chain laid out: its steps and maps (maps[i] is step i's input, maps[-1] the saved output)."""

    steps: tuple[_Step, ...]
    maps: tuple[Resident, ...]


def _memo_step(arch: Arch, graph: Graph, op: Op, steps: dict[str, Any]) -> _Step | None:
    if op.name not in steps:
        steps[op.name] = _step(arch, graph, op)
    return steps[op.name]


def interior_rows(arch: Arch, graph: Graph, op: Op, next_op: Op, steps: dict[str, Any]) -> int | None:
    """Rows of a bank group that `op`'s output map takes in any resident chain in which `next_op` reads it: fixed
    by the two ops wherever the chain starts (plan_chain lays it out with next_op's stride), so the sum over a
    chain's inner maps only grows as the chain does, and a chain whose sum passes both groups' depth never fits.
    None when either op cannot be in a resident chain at all. `steps` as for plan_chain."""
    st, nx = _memo_step(arch, graph, op, steps), _memo_step(arch, graph, next_op, steps)
    if st is None or nx is None:
        return None
    return Resident("", 0, 0, 0, 0, st.h_out, st.w_out, ceil_div(st.cout, arch.icp), nx.sh).footprint(arch.pp)


def consumer_counts(graph: Graph) -> dict[str, int]:
    """Tensor -> how many ops read it (plan_chain's linkage test; callers asking about many chains of one graph
    count once and pass it in)."""
    consumers: dict[str, int] = {}
    for op in graph.ops:
        for t in set(op.inputs):
            consumers[t] = consumers.get(t, 0) + 1
    return consumers


def plan_chain(arch: Arch, graph: Graph, ops: list[Op], pixel_pitch: int | None = None,
               consumers: dict[str, int] | None = None, steps: dict[str, Any] | None = None) -> Chain | None:
    """The layout of the resident chain `ops`, or None when it is not one (linkage, op kinds, fields, banks).
    `pixel_pitch`: the DDR pixel pitch of the chain's input (None: packed, = its channels). `consumers`
    (consumer_counts of the graph) and `steps` (op name -> its chain step, filled here) spare a caller planning
    many chains of one graph recomputing them per chain: with them, the cost per chain is its length, not the
    graph's size."""
    if len(ops) < 2 or arch.icp != arch.ocp:  # a map's channel groups are the same rows for CONV in and out
        return None
    maps_4d = [graph.tensors[ops[0].inputs[0]].shape] + [graph.tensors[op.outputs[0]].shape for op in ops]
    if any(len(s) != 4 or s[0] != 1 for s in maps_4d):
        return None
    outputs = set(graph.outputs)
    if consumers is None:
        consumers = consumer_counts(graph)
    for a, b in zip(ops, ops[1:]):
        feeds = [t for t in b.inputs if not graph.tensors[t].is_const]
        if feeds != [a.outputs[0]] or consumers.get(a.outputs[0]) != 1 or a.outputs[0] in outputs:
            return None
    memo = {} if steps is None else steps
    chain_steps = []
    for op in ops:
        st = _memo_step(arch, graph, op, memo)
        if st is None:
            return None
        chain_steps.append(st)
    steps = chain_steps
    _, c0, h0, w0 = graph.tensors[ops[0].inputs[0]].shape
    steps[0] = _augmented(arch, steps[0], c0 if pixel_pitch is None else pixel_pitch)
    pp, depth, half, icp = arch.pp, arch.bank_depth, arch.bank_depth // 2, arch.icp
    # map geometry: (h, w, cg, s); map 0 of an augmented conv holds one item of kw*cin channels per output column
    geo = [(h0, steps[0].w_out if steps[0].aug else w0, ceil_div(steps[0].cin, icp), steps[0].sh)]
    for i, st in enumerate(steps):
        # the saved map: all rows in one bank (one SAVE) when one instruction writes them all
        last = st.h_out if st.h_out <= min(_STRIDE_MAX, pp if st.kind == "conv" else arch.alu_pp) else 1
        s_next = steps[i + 1].sh if i + 1 < len(steps) else last
        geo.append((st.h_out, st.w_out, ceil_div(st.cout, icp), s_next))
    tops = [0, 0]
    maps = []
    for i, (h, w, cg, s) in enumerate(geo):
        vb = i % 2
        m = Resident(f"{ops[0].name}#{i}", vb, arch.bank_group(f"VB{vb}").base_id, 0, 0, h, w, cg, s)
        fp = m.footprint(pp)
        start = tops[vb]
        if start // half != (start + fp - 1) // half:
            start = (start // half + 1) * half  # a map stays within one half (its resources are named under it)
        if fp > half or start + fp > depth:
            return None
        maps.append(Resident(m.tag, vb, m.bank0, start // half, start, h, w, cg, s))
        tops[vb] = start + fp
    if any(m.w > FIELD10 or m.cg > FIELD10 for m in (maps[0], maps[-1])) or steps[-1].cout > _SAVE_CHANNELS:
        return None  # LOAD / SAVE length, bank pitch and channels
    out = []
    for i, st in enumerate(steps):
        x, y = maps[i], maps[i + 1]
        if st.kind == "conv":
            cg_in = ceil_div(st.cin, icp)
            wrows = st.kh * st.kw * cg_in
            if (cg_in > 256 or st.w_out > FIELD10 or x.e > FIELD10 or y.e > FIELD10 or wrows > half
                    or ceil_div(st.cout, arch.ocp) > half):
                return None
            vmax = pp
        else:
            if x.cg > 256 or st.w_out > _ALU_LENGTH or x.e > _ALU_ENDL or y.e > _ALU_ENDL:
                return None
            vmax = arch.alu_pp
        # the most rows per instruction whose fetched rows stay within the four base addresses, from any tile start
        vpp = next((v for v in range(vmax, 0, -1)
                    if all(_rows_ok(pp, p0 % pp, v, st.kh, st.sh, MAX_WRAPS) for p0 in range(0, st.h_out, v))), 0)
        if vpp == 0:
            return None
        out.append(_Step(**{**st.__dict__, "vpp": vpp}))
    return Chain(tuple(out), tuple(maps))


def resident_fits(arch: Arch, graph: Graph, ops: list[Op], consumers: dict[str, int] | None = None,
                  steps: dict[str, Any] | None = None) -> bool:
    """Whether `ops` compile as one resident chain on `arch`, whatever the DDR layout of its input (with and
    without channel augmentation of the first conv); `consumers` / `steps` as for plan_chain."""
    return (plan_chain(arch, graph, ops, None, consumers, steps) is not None
            and plan_chain(arch, graph, ops, 0, consumers, steps) is not None)


def _conv_job(arch: Arch, graph: Graph, st: _Step, params: ParamBlob) -> ConvJob:
    """The ConvJob of a conv step (weights in the step's geometry and its biases appended to `params`)."""
    op = st.op
    q = xops.quant_params(op, graph)
    w = graph.param(op, "weights").data
    if op.type == "dense":
        w = w.reshape(xops.dense_weights_shape(op, graph))
    if st.aug:
        w = augmented_weights(w)
    b = graph.param(op, "bias", required=False)
    bias = b.data if b is not None else np.zeros(st.cout, np.int8)
    w_off = params.add(pack_conv_weights(w, arch.icp, arch.ocp), op.params["weights"])
    b_off = params.add(pack_channel_vector(bias, arch.ocp), op.params.get("bias", ""))
    return ConvJob(op.name, st.kh, st.kw, st.sh, st.sw, (0, 0, 0, 0), st.cin, st.cout, q.act_type, q.shift_cut,
                   q.shift_bias_isa, w_off, b_off, REG_PARAMS)


#: One instruction group of a chain's schedule: (rows of its input map it needs emitted before it, rows of its
#: output map it completes, the function that emits it).
_Unit = tuple[int, int, Callable[[], None]]


def _load_units(prog: Program, arch: Arch, st: _Step, m: Resident, x: FMap, x_res: str) -> list[_Unit]:
    """The LOADs of the chain's input into map 0: one per image row (items of kw*cin bytes every sw*cin bytes
    when the first conv is augmented), rows that follow each other in one bank and in DDR merged."""
    out: list[_Unit] = []
    for y0, n, bank, row in (_runs(arch, m, x) if not st.aug else
                             [(y, 1, *m.where(y, arch.pp)) for y in range(m.h)]):
        c, jr = (st.cin, st.item_jump * x.pixel_pitch) if st.aug else (x.c, x.pixel_pitch)

        def emit(y0: int = y0, n: int = n, bank: int = bank, row: int = row, c: int = c, jr: int = jr) -> None:
            prog.emit("LOAD", reads=(("ddr", x_res),), writes=m.rows(y0, n), bank_id=bank,
                      bank_addr=row % arch.bank_depth, length=n * m.w, channel=c, jump_read=jr, jump_write=m.cg,
                      reg_id=x.reg_id, ddr_addr=x.addr(y0, 0))

        out.append((0, y0 + n, emit))
    return out


def _save_units(prog: Program, arch: Arch, m: Resident, y: FMap, y_res: str, c: int) -> list[_Unit]:
    """The SAVEs of the chain's output map (rows merged as _runs does)."""
    out: list[_Unit] = []
    for y0, n, bank, row in _runs(arch, m, y):
        def emit(y0: int = y0, n: int = n, bank: int = bank, row: int = row) -> None:
            prog.emit("SAVE", reads=m.rows(y0, n), writes=(("ddr", y_res),), bank_id=bank,
                      bank_addr=row % arch.bank_depth, length=n * m.w, channel=c, jump_read=m.cg,
                      jump_write=y.pixel_pitch, reg_id=y.reg_id, ddr_addr=y.addr(y0, 0))

        out.append((y0 + n, 0, emit))
    return out


def _runs(arch: Arch, m: Resident, ddr: FMap) -> list[tuple[int, int, int, int]]:
    """Image rows of map m as transfers (first row, rows, bank id, bank row): consecutive rows merged where they
    follow each other both in one bank (line slots e apart) and in DDR, up to the 10-bit length field."""
    out: list[list[int]] = []
    for y in range(m.h):
        bank, row = m.where(y, arch.pp)
        if out:
            y0, n, b, r = out[-1]
            if (b == bank and row == r + n * m.e and ddr.addr(y, 0) == ddr.addr(y0, 0) + n * m.w * ddr.pixel_pitch
                    and (n + 1) * m.w <= FIELD10):
                out[-1][1] += 1
                continue
        out.append([y, 1, bank, row])
    return [(y0, n, b, r) for y0, n, b, r in out]


def _needs(st: _Step, h_in: int, p0: int, v: int) -> int:
    """Rows of the input map a tile of v output rows from p0 reads (their end)."""
    return min(h_in, p0 * st.sh + (v - 1) * st.sh + st.kh)


def _conv_units(prog: Program, arch: Arch, st: _Step, job: ConvJob, x: Resident,
                y: Resident) -> tuple[Callable[[], None], list[_Unit], bool]:
    """(the LOADs of the step's parameters, its CONVs as units, whether its weights stream chunk by chunk)."""
    sched = _ConvSchedule(prog, arch, st, job, x, y)
    return sched.start, sched.units(), not sched.resident


class _ConvSchedule:
    """The parameter LOADs and the CONVs of one conv step of a resident chain, from map x into map y.

    Weights are resident (every output-channel group's in one CONVW half) or streamed: in chunks of as many groups
    as fit half the CONVW banks, one LOAD per bank per chunk: every LOAD waits for its predecessor's own-engine
    token and pays its issue and burst overheads, so fewer, longer LOADs keep the LOAD engine, which such a chain
    waits on, streaming.

    With one token per engine pair along program order (program.Program), the first CONV of chunk c+1 can only
    wait for a LOAD emitted after the first CONV of chunk c: so a chunk's last LOAD (one bank) is held back until
    the next CONV of this step is emitted (`held`), and the others go as soon as their half is free. Emitted at
    once, the next chunk's first CONV would wait for the whole chunk after it (the LOAD engine's last post).

    Resident weights go group by group (`split`), so the first CONV waits for its own group's weights only, not for
    the whole op's (vai_c's programs do the same): group 0's LOADs write the whole slot (so they wait for every
    earlier reader of its rows), every later group's its own part of it, loaded two groups ahead of the CONVs
    with its last LOAD held as in the streamed case; each group's CONVs read their own part only."""

    def __init__(self, prog: Program, arch: Arch, st: _Step, job: ConvJob, x: Resident, y: Resident) -> None:
        self.prog, self.arch, self.st, self.job, self.x, self.y = prog, arch, st, job, x, y
        self.half = arch.bank_depth // 2
        self.cg_out = ceil_div(st.cout, arch.ocp)
        self.wrows = st.kh * st.kw * ceil_div(st.cin, arch.icp)
        self.resident = self.cg_out * self.wrows <= self.half
        per = max(1, min(self.cg_out, self.half // self.wrows))
        self.chunks = [(g0, min(per, self.cg_out - g0)) for g0 in range(0, self.cg_out, per)]
        self.slots: dict[int, int] = {}  # group -> CONVW half
        self.wrow_of: dict[int, int] = {}  # group -> its first weight row
        self.bslot = 0
        self.held: list[Callable[[], None]] = []
        self.n_banks = min(arch.ocp, st.cout)
        self.split = self.resident and self.cg_out > 1
        self.convw_res: dict[int, tuple] = {}
        self.loaded: set[int] = set()  # groups whose every weight LOAD has been emitted
        self.after_first: dict[int, Callable[[], None]] = {}

    def load_chunk(self, c: int) -> None:
        arch, half = self.arch, self.half
        g0, k = self.chunks[c]
        slot = self.prog.next_slot("convw")
        last = range(min(arch.ocp, self.st.cout - g0 * arch.ocp) - 1, self.n_banks)

        def load(banks: range) -> None:
            load_params(self.prog, arch, self.job, g0, k, slot * half, with_bias=False, slot=slot, banks=banks)

        if c == 0:
            load(range(self.n_banks))
        else:
            load(range(last.start))
            self.held.append(lambda: load(last))
        for g in range(g0, g0 + k):
            self.slots[g], self.wrow_of[g] = slot, slot * half + (g - g0) * self.wrows

    def load_group(self, g: int, slot: int) -> None:
        arch = self.arch
        # group 0's CONVs read their own part too: the whole slot would also be every later group's rows
        self.convw_res[g] = ("convw", slot, f"{self.st.op.name}/{g}")
        tag = None if g == 0 else self.convw_res[g][2]
        n = min(arch.ocp, self.st.cout - g * arch.ocp)

        def load(banks: range) -> None:
            load_params(self.prog, arch, self.job, g, 1, slot * self.half + g * self.wrows, with_bias=False,
                        slot=slot, tag=tag, banks=banks)

        if g == 0:
            load(range(n))
            self.loaded.add(g)
            return
        load(range(n - 1))

        def last() -> None:
            load(range(n - 1, n))
            self.loaded.add(g)

        self.held.append(last)

    def start(self) -> None:
        half, cg_out = self.half, self.cg_out
        self.bslot = self.prog.next_slot("bias")
        load_biases(self.prog, self.arch, self.job, 0, cg_out, self.bslot * half, param_resources(self.bslot)[1])
        if not self.split:
            for c in range(min(2, len(self.chunks))):
                self.load_chunk(c)
            return
        slot = self.prog.next_slot("convw")
        for g in range(cg_out):
            self.slots[g], self.wrow_of[g] = slot, slot * half + g * self.wrows
            if g >= 2:
                self.after_first[g - 2] = lambda g=g: self.load_group(g, slot)
        for g in range(min(2, cg_out)):
            self.load_group(g, slot)

    def conv(self, p0: int, v: int, g: int) -> None:
        st, x, y, depth, half = self.st, self.x, self.y, self.arch.bank_depth, self.half
        if self.split and g not in self.loaded:  # its CONVs would read rows still to be loaded
            raise CodegenError(f"{st.op.name}: output-channel group {g}'s CONVs come before its weight LOADs")
        bank_in, a = x.fetch(p0 * st.sh, self.arch.pp, depth)
        bank_out, a_out, t0 = y.store(p0, self.arch.pp, depth)
        # one group per call: its output rows wrap around the bank (mod depth), and with streamed weights a row
        # tile's groups lie apart in the schedule (Program.emit drops a CONVINIT equal to the one in force)
        emit_conv_groups(self.prog, self.arch, self.job, ConvIn(bank_in, tuple(a), x.e),
                         ConvOut(bank_out, (a_out + g) % depth, y.cg, y.e, y.s, t0), 1, v, st.w_out,
                         self.wrow_of[g], self.bslot * half + g,
                         x.rows(p0 * st.sh, (v - 1) * st.sh + st.kh) +
                         (self.convw_res.get(g, ("convw", self.slots[g])), ("bias", self.bslot)), y.rows(p0, v))
        while self.held:
            self.held.pop(0)()
        if g in self.after_first:
            self.after_first.pop(g)()

    def units(self) -> list[_Unit]:
        st = self.st
        tiles = [(p0, min(st.vpp, st.h_out - p0)) for p0 in range(0, st.h_out, st.vpp)]
        return self._tile_units(tiles) if self.resident else self._streamed_units(tiles)

    def _tile_units(self, tiles: list[tuple[int, int]]) -> list[_Unit]:
        """Resident weights: row tiles outer, so the next op can start on the first rows."""
        units: list[_Unit] = []
        for p0, v in tiles:
            def tile(p0: int = p0, v: int = v) -> None:
                for g in range(self.cg_out):
                    self.conv(p0, v, g)

            units.append((_needs(self.st, self.x.h, p0, v), p0 + v, tile))
        return units

    def _streamed_units(self, tiles: list[tuple[int, int]]) -> list[_Unit]:
        """Streamed weights: each chunk's once, the next-but-one loading once it is done."""
        cg_out, name = self.cg_out, self.st.op.name
        last_of = {g0 + k - 1: c for c, (g0, k) in enumerate(self.chunks)}
        units: list[_Unit] = []
        for g in range(cg_out):
            for k, (p0, v) in enumerate(tiles):
                def step(p0: int = p0, v: int = v, g: int = g, last: bool = k == len(tiles) - 1) -> None:
                    self.conv(p0, v, g)
                    if last and g in last_of and last_of[g] + 2 < len(self.chunks):
                        self.load_chunk(last_of[g] + 2)
                    if last and g == cg_out - 1 and self.held:  # a chunk's last LOAD never emitted: stale rows
                        raise CodegenError(f"{name}: a weight chunk's last LOAD was held past the op's last CONV")

                units.append((_needs(self.st, self.x.h, p0, v), p0 + v if g == cg_out - 1 else 0, step))
        return units


def _alu_units(prog: Program, arch: Arch, st: _Step, job: AluJob, x: Resident, y: Resident) -> list[_Unit]:
    """The ALUs of a pool / activation step from map x into map y."""
    pp, depth = arch.pp, arch.bank_depth
    out: list[_Unit] = []
    for p0 in range(0, st.h_out, st.vpp):
        v = min(st.vpp, st.h_out - p0)

        def emit(p0: int = p0, v: int = v) -> None:
            bank_in, a = x.fetch(p0 * st.sh, pp, depth)
            bank_out, a_out, t0 = y.store(p0, pp, depth)
            prog.emit("ALUINIT", exec_mode=ALU_MODES[job.mode], kernel_h=st.kh, kernel_w=st.kw, stride_h=st.sh,
                      stride_w=st.sw, stride_offset_in=0, stride_offset_out=t0, stride_out=y.s, channel_group=x.cg,
                      channel_offset=x.cg * arch.icp - st.cout, length=st.w_out, shift_prelu_p=job.shift_prelu_p,
                      act_type=job.act_type, shift_bias=job.shift_bias, shift_cut=job.shift_cut,
                      shift_prelu_n=job.shift_prelu_n, multi_factor=job.multi_factor, jump_read=x.cg,
                      jump_read_endl=x.e, jump_read_weights=x.cg, jump_write=y.cg, jump_write_endl=y.e)
            prog.emit("ALU", reads=x.rows(p0 * st.sh, (v - 1) * st.sh + st.kh), writes=y.rows(p0, v),
                      bank_id_out=bank_out, bank_addr_out=a_out, pad_bottom=st.kh - 1, valid_pixel_parallel=v,
                      bank_id_in=bank_in, bank_addr_in=a[0], pad_top=0, pad_left=0, pad_right=st.kw - 1,
                      bank_addr_in_1=a[1], kernel_d=1, bank_addr_weights=0, bank_addr_in_2=a[2], bank_addr_bias=0,
                      bank_addr_in_3=a[3])

        out.append((_needs(st, x.h, p0, v), p0 + v, emit))
    return out


def emit_group(prog: Program, params: ParamBlob, arch: Arch, graph: Graph, ops: list[Op], fmaps: dict[str, FMap],
               variant: str) -> None:
    """The template registry's emitter of a RESIDENT chain."""
    emit_resident(prog, arch, graph, ops, fmaps, params)


def emit_group_seq(prog: Program, params: ParamBlob, arch: Arch, graph: Graph, ops: list[Op],
                   fmaps: dict[str, FMap], variant: str) -> None:
    """The template registry's emitter of a RESIDENT_SEQ chain."""
    emit_resident(prog, arch, graph, ops, fmaps, params, seq=True)


def emit_resident(prog: Program, arch: Arch, graph: Graph, ops: list[Op], fmaps: dict[str, FMap],
                  params: ParamBlob, seq: bool = False) -> None:
    """Emit the chain `ops` with every intermediate map kept in the banks (see the module docstring).

    Program order follows the data: each unit (a LOAD run, a tile of CONVs, an ALU, a SAVE run) is emitted as soon
    as the rows it reads have been emitted, consumers first, so every wait names a post just before it (the
    code generator keeps each token counter at one token along program order, program.Program) and an op starts
    on the first rows of its input while its producer computes the rest (`seq`, template RESIDENT_SEQ: a conv only
    once every earlier op's units are emitted). A conv step's parameter LOADs come with its first unit, once no
    unfinished earlier step uses the CONVW / BIAS half they go to."""
    x_res, y_res = ops[0].inputs[0], ops[-1].outputs[0]
    x, y = fmaps[x_res], fmaps[y_res]
    chain = plan_chain(arch, graph, ops, x.pixel_pitch)
    if chain is None:
        raise CodegenError(f"ops {[op.name for op in ops]}: the chain does not fit the banks of {arch.name} as one "
                           "resident chain")
    steps, maps = chain.steps, chain.maps
    n = len(steps)
    starts: list[Callable[[], None] | None] = []
    units: list[list[_Unit]] = [_load_units(prog, arch, steps[0], maps[0], x, x_res)]
    streamed: list[bool] = []
    for i, st in enumerate(steps):
        if st.kind == "conv":
            start, us, stream = _conv_units(prog, arch, st, _conv_job(arch, graph, st, params), maps[i], maps[i + 1])
        else:
            start, us, stream = None, _alu_units(prog, arch, st, alu_job(arch, graph, st.op, params), maps[i],
                                                 maps[i + 1]), False
        starts.append(start)
        units.append(us)
        streamed.append(stream)
    units.append(_save_units(prog, arch, maps[-1], y, y_res, graph.tensors[y_res].shape[1]))
    # stage k: 0 the input LOADs, 1..n the steps, n+1 the SAVEs; stage k reads map k-1 and writes map k
    emitted = [0] * (n + 2)
    rows = [0] * (n + 2)  # rows of map k emitted so far
    started = [False] * n

    def done(k: int) -> bool:
        return emitted[k] == len(units[k])

    def may_start(i: int) -> bool:
        convs = [j for j in range(i) if starts[j] is not None]
        if not convs or starts[i] is None:
            return True
        last = convs[-1]
        if not all(done(j + 1) for j in convs[:-1]):
            return False
        return done(last + 1) or not (streamed[last] or streamed[i])

    while not all(done(k) for k in range(n + 2)):
        for k in range(n + 1, -1, -1):
            if done(k):
                continue
            need, produces, emit = units[k][emitted[k]]
            if k > 0 and rows[k - 1] < need or seq and 2 <= k <= n and steps[k - 1].kind == "conv" and \
                    not done(k - 1):
                continue
            i = k - 1
            if 0 <= i < n and not started[i]:
                if not may_start(i):
                    continue
                started[i] = True
                if starts[i] is not None:
                    starts[i]()
            emit()
            emitted[k] += 1
            rows[k] = max(rows[k], produces)
            break
        else:
            raise CodegenError(f"ops {[op.name for op in ops]}: the resident chain's schedule is stuck")
