"""pw_dw_pw: conv -> depthwise conv -> pointwise conv with both intermediate maps on chip, the shape of
MobileNet-style inverted bottlenecks and of YOLOX's CSP bottlenecks and head branches (vai_c keeps both maps in the
banks there). The first two ops run as pw_dw does (fused_chain: the conv fills a circular buffer in VB1, one ALU
per pass of the depthwise rows); each pass's depthwise output slot in VB0 is the input tile of the pointwise CONVs,
which write their output beside it in the same slot; the SAVEs write only the pointwise conv's output.

pw_dw_pw_add is the inverted-residual block whole: the same chain with the block's residual add, whose other
operand (the block input, or any map already in DDR) is LOADed beside the pointwise output in the slot; one ELEW
per ALU_PP rows adds it in place and the SAVEs write the add's output, so the pointwise output never touches DDR
either (vai_c fuses the project conv with the add the same way)."""
from __future__ import annotations

from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.conv import ConvIn, ConvJob, ConvOut, emit_conv_groups, load_params, param_resources
from tvm_dpu.codegen.fused_chain import (ChainPass, ChainTile, chain_tile, emit_chain, load_chain_conv, load_dw_params,
                                         plain_rows, saves_side, side_covered, window_of)
from tvm_dpu.codegen.fused_conv import conv_job, fusable, is_pointwise, probe
from tvm_dpu.codegen.layout import ParamBlob, ceil_div
from tvm_dpu.codegen.program import Program
from tvm_dpu.codegen.tiling import CodegenError, RowPlacement
from tvm_dpu.types import FMap
from tvm_dpu.xgraph import ops as xops
from tvm_dpu.xgraph.graph import Graph, Op


#: When a full slot's pointwise CONVs are emitted: "wide", after the chain conv's CONVs for the next rows (in the
#: CONV engine's order they then follow those, so the ALU that those rows feed does not wait behind them); "eager",
#: right after the slot's last depthwise pass (fewer slots in flight, which small maps with few passes prefer);
#: "tight", wide's order with a circular buffer of only the wraps one depthwise pass reads (chain_tile's spare=0):
#: wider strips, so fewer and longer CONVs (MobileNetV2's 112x112 -> 56x56 block on B4096: one strip of 56
#: columns instead of three of 19, 91,447 -> 74,771 cycles alone) but less overlap of the conv with the passes.
#: The fusion search times those that differ per group (fusion.cost.simulated_cost, group_variants); the plan
#: records the choice (FusionPlan.variants, keyed by the group's first conv).
PW_DW_PW_VARIANTS = ("wide", "eager", "tight")
#: Pointwise weights of at least this many bytes are LOADed (with the depthwise parameters) after the chain conv's
#: first input, not before it: in the LOAD engine's order they would hold that input, and so the first CONVs,
#: behind them. Smaller ones load first: in a program, the chain's input is usually the kernel before's output, so
#: its LOAD waits for that kernel's SAVEs, and parameters queued behind it arrive later than they could. Measured:
#: MobileNetV2 KV260's 14x14 and 7x7 blocks (24.6 kB and 153.6 kB) gain (the whole program, deferring every chain:
#: 737,495 -> 728,591 cycles); YOLOX-nano B1024's 26x26 CSP bottlenecks (4 kB) lose (2,400,348 -> 2,404,518).
DEFER_PARAM_BYTES = 16384


def _tile(arch: Arch, graph: Graph, a: Op, dw: Op, pw: Op, add: Op | None = None, spare: int = 1
          ) -> ChainTile | None:
    """Tile of a -> dw -> pw (-> add), or None: chain_tile of a -> dw with each pass's output slot holding the
    depthwise output (cg_mid rows per pixel), the pointwise output after it (cg_pw rows per pixel) and, with `add`,
    the add's other operand after that (cg_pw rows per pixel), the pointwise weights resident after a's, its biases
    after the depthwise ones; `spare`: chain_tile's."""
    if dw.type != "depthwise_conv2d" or pw.type != "conv2d" or not is_pointwise(graph, pw):
        return None
    if not fusable(arch, graph, pw) or tuple(xops.attr(dw, "dilations")) != (1, 1):
        return None
    c_mid = graph.tensors[a.outputs[0]].shape[1]
    if graph.tensors[dw.outputs[0]].shape[1] != c_mid or probe(arch, graph, pw).cin != c_mid:
        return None
    cg_mid = ceil_div(c_mid, arch.ocp)
    cg_pw = ceil_div(graph.tensors[pw.outputs[0]].shape[1], arch.ocp)
    n_pw = 2 if add is not None else 1  # the add's operand sits after the pointwise output
    if add is not None and not _residual(graph, pw, add):
        return None
    win = window_of(graph, dw)
    if win.kh * win.kw * cg_mid > arch.bank_depth or 2 * cg_mid + n_pw * cg_pw > arch.bank_depth:
        return None
    return chain_tile(arch, graph, a, dw, arch.alu_pp, cg_mid + n_pw * cg_pw, cg_mid * cg_pw, spare)


def _variant_tile(arch: Arch, graph: Graph, ops: tuple[Op, ...], variant: str) -> ChainTile | None:
    """The tile `variant` runs: "tight"'s buffer has no spare wrap; the others keep one where it fits."""
    return (None if variant == "tight" else _tile(arch, graph, *ops)) or _tile(arch, graph, *ops, spare=0)


def group_variants(arch: Arch, graph: Graph, ops: list[Op]) -> tuple[str, ...]:
    """The template registry's variants of a pw_dw_pw / pw_dw_pw_add group [a, dw, pw(, add)]: the
    PW_DW_PW_VARIANTS that emit different programs, "tight" only where its tile differs from the others' (so only
    those need timing)."""
    tight = _variant_tile(arch, graph, tuple(ops), "tight")
    return PW_DW_PW_VARIANTS if tight != _variant_tile(arch, graph, tuple(ops), "wide") else PW_DW_PW_VARIANTS[:2]


def _residual(graph: Graph, pw: Op, add: Op) -> bool:
    """Whether `add` adds pw's output to another map of its shape (an ELEW reads both in the same layout)."""
    if add.type != "eltwise_add" or len(add.inputs) != 2 or pw.outputs[0] not in add.inputs:
        return False
    other = add.inputs[1 - add.inputs.index(pw.outputs[0])]
    return other != pw.outputs[0] and graph.tensors[other].shape == graph.tensors[pw.outputs[0]].shape


def pw_dw_pw_fits(arch: Arch, graph: Graph, a: Op, dw: Op, pw: Op, add: Op | None = None) -> bool:
    """Whether conv -> depthwise -> pointwise (-> residual add) fits emit_pw_dw_pw (a conv whose output is read
    outside the group too only where the chain computes all of it: its strips SAVE it)."""
    if saves_side(graph, a, dw) and not side_covered(graph, a, dw):
        return False
    return _variant_tile(arch, graph, (a, dw, pw, add), "wide") is not None


def group_fits(arch: Arch, graph: Graph, ops: list[Op]) -> bool:
    """The template registry's fit test of a pw_dw_pw / pw_dw_pw_add group [a, dw, pw(, add)]."""
    return pw_dw_pw_fits(arch, graph, *ops)


def emit_group(prog: Program, params: ParamBlob, arch: Arch, graph: Graph, ops: list[Op], fmaps: dict[str, FMap],
               variant: str) -> None:
    """The template registry's emitter of a pw_dw_pw / pw_dw_pw_add group [a, dw, pw(, add)]."""
    a, dw, pw, *add = ops
    emit_pw_dw_pw(prog, arch, graph, a, dw, pw, fmaps, params, variant, *add)


def emit_pw_dw_pw(prog: Program, arch: Arch, graph: Graph, a: Op, dw: Op, pw: Op, fmaps: dict[str, FMap],
                  params: ParamBlob, variant: str = "wide", add: Op | None = None) -> None:
    """a -> dw -> pw (-> add) per strip of output columns (emit_chain): per pass, one ALU writes the depthwise rows
    into the pass's VB0 output slot, the pointwise CONVs (every output group, weights resident) read them there and
    write the slot's second part, and SAVEs write that to the pointwise conv's output (with `add`: to the add's,
    after _emit_residual adds the other operand in place), when `variant` (PW_DW_PW_VARIANTS) says. Neither a's
    nor the depthwise output touches DDR, nor, with `add`, the pointwise output."""
    if variant not in PW_DW_PW_VARIANTS:
        raise CodegenError(f"op {a.name!r}: pw_dw_pw variant {variant!r}: choose one of "
                           f"{', '.join(PW_DW_PW_VARIANTS)}")

    tile = _variant_tile(arch, graph, (a, dw, pw, add), variant)
    if tile is None:
        names = "+".join(repr(o.name) for o in (a, dw, pw, add) if o is not None)
        raise CodegenError(f"ops {names}: conv+depthwise+pointwise{'+add' if add else ''} fusion does not fit "
                           f"{arch.name}")
    job = conv_job(arch, graph, a, params)
    jp = conv_job(arch, graph, pw, params)
    cg_mid, cg_pw = ceil_div(job.cout, arch.ocp), ceil_div(jp.cout, arch.ocp)
    # Each member's parameter rows carry their own tag (conv.param_resources). Where the pointwise weights are large
    # (DEFER_PARAM_BYTES), they and the depthwise parameters are LOADed after the first piece's input (emit_chain's
    # `then`), so the chain conv's first CONVs wait for their own weights and input only. Depthwise weights in
    # DWCONVW, its biases after a's in BIAS, the pointwise biases after those.
    ja, wrow_pw, _ = load_chain_conv(prog, arch, graph, a, job, tile, fmaps[a.inputs[0]], params, tag="a")

    def load_others() -> None:
        load_dw_params(prog, arch, graph, dw, job.cout, params, cg_mid, tag="dw")
        load_params(prog, arch, jp, 0, cg_pw, wrow_pw, 2 * cg_mid, tag="pw")
    defer = jp.cin * jp.cout >= DEFER_PARAM_BYTES
    if not defer:
        load_others()
    y = fmaps[(add or pw).outputs[0]]
    # the depthwise output has no DDR map; emit_chain cuts strips and passes by its geometry
    _, c_dw, h_dw, w_dw = graph.tensors[dw.outputs[0]].shape
    chain_maps = {**fmaps, dw.outputs[0]: FMap.dense(y.reg_id, 0, h_dw, w_dw, c_dw)}
    slots = _Slots(prog, arch, graph, dw, pw, add, fmaps, tile, job, jp, wrow_pw, variant)
    emit_chain(prog, arch, graph, a, dw, tile, job, cg_mid + cg_pw, chain_maps, slots.emit_pass,
               ja and (ja, plain_rows(arch, job)), tag="a", then=load_others if defer else None)
    slots.finish()


class _Slots:
    """emit_pw_dw_pw's consumer side: the depthwise passes emit_chain hands over, written into two VB0 output slots
    in turn (one per PP rows of one strip), each full slot's pointwise CONVs, residual add and SAVEs."""

    def __init__(self, prog: Program, arch: Arch, graph: Graph, dw: Op, pw: Op, add: Op | None,
                 fmaps: dict[str, FMap], tile: ChainTile, job: ConvJob, jp: ConvJob, wrow_pw: int, variant: str):
        self.prog, self.arch, self.graph, self.dw, self.pw, self.add, self.fmaps = prog, arch, graph, dw, pw, add, fmaps
        self.tile, self.job, self.jp, self.wrow_pw, self.variant = tile, job, jp, wrow_pw, variant
        self.cg_mid, self.cg_pw = ceil_div(job.cout, arch.ocp), ceil_div(jp.cout, arch.ocp)
        self.y_name = (add or pw).outputs[0]
        self.y = fmaps[self.y_name]
        self.out_off = tile.lp * self.cg_mid  # the pointwise output's rows within a slot, after the depthwise output
        self.vb0, self.half = arch.bank_group("VB0").base_id, arch.bank_depth // 2
        self.pw_res = param_resources(None, "pw")
        self.pair = 2 * arch.alu_pp <= arch.pp  # two depthwise passes fill the PP rows of one pointwise CONV
        self.held: list[ChainPass] = []  # the passes written into slot `slot` so far
        self.ready: list[tuple[list[ChainPass], int]] = []  # a full slot whose pointwise CONVs are not emitted yet
        self.slot = 0
        # With `add`, a flushed slot's ELEWs wait for its pointwise CONVs; emitted right after them, they would hold
        # the MISC engine (in order) and so the next depthwise pass behind those CONVs. They are emitted after the
        # next depthwise pass instead (the ELEWs read and write the slot's pointwise and operand rows, which that
        # pass does not touch), or before the next pointwise CONVs, whichever comes first.
        self.tails: list = []
        self.emitted = 0  # program length after the last pass: more means emit_chain has emitted conv CONVs since
        self.chain_done = self.fenced = False  # emit_chain has returned; a flush has read both VB0 halves

    def close(self) -> None:
        """The held passes' slot is full: its pointwise CONVs wait (flush) and the next passes take the other slot."""
        if self.held:
            self.ready.append((list(self.held), self.slot))
            self.held.clear()
            self.slot ^= 1

    def flush(self, keep: int = 0) -> None:
        """The pointwise CONVs over the full slots but the newest `keep` (consecutive rows of one strip, from bank
        0) and their SAVEs."""
        arch, cg_mid, cg_pw, y = self.arch, self.cg_mid, self.cg_pw, self.y
        while len(self.ready) > keep:
            self.drain()
            passes, sl = self.ready.pop(0)
            ob, v, first = sl * self.half + self.tile.a_slot, sum(p.v for p in passes), passes[0]
            place = RowPlacement(arch.pp, 1, first.length * cg_mid, cg_mid, ob)
            # The first pointwise CONVs after the chain conv's last CONVs (in the CONV engine's order) stand for
            # every VB0 row those read: the next op's tiles are named by VB0 half (or bank under it), not by this
            # kernel's regions ("in" / "out"), so its LOADs wait for these CONVs, hence for all the chain's.
            last = passes[-1].j0 + passes[-1].v == y.h and first.q0 + first.length == y.w
            tail = self.chain_done or last or self.fenced
            halves = (("vb0", 0), ("vb0", 1)) if tail and not self.fenced else ()
            self.fenced = self.fenced or bool(halves)
            # the chain's last SAVEs stand for its slots' rows the same way (the next kernel's slots and input
            # windows lie elsewhere in the halves than this kernel's: its writes must wait for these reads)
            save_fence = (("vb0", 0), ("vb0", 1)) if tail else ()
            emit_conv_groups(self.prog, arch, self.jp, ConvIn.of(self.vb0, place, arch.bank_depth),
                             ConvOut(self.vb0, ob + self.out_off, cg_pw), cg_pw, v, first.length, self.wrow_pw,
                             2 * cg_mid, (("vb0", sl, "out"), *self.pw_res[0], *self.pw_res[1]) + halves,
                             (("vb0", sl, "pw"),))
            self.tails.append((passes, sl, ob, save_fence))
            if self.add is None:
                self.drain()

    def drain(self) -> None:
        """The flushed slots' residual adds (with `add`) and SAVEs not emitted yet."""
        while self.tails:
            passes, sl, ob, save_fence = self.tails.pop(0)
            first, v, y = passes[0], sum(p.v for p in passes), self.y
            if self.add is not None:
                _emit_residual(self.prog, self.arch, self.graph, self.pw, self.add, self.fmaps, passes,
                               ob + self.out_off, self.tile.lp * self.cg_pw, self.cg_pw, sl)
            for r in range(v):
                self.prog.emit("SAVE", reads=(("vb0", sl, "pw"),) + save_fence, writes=(("ddr", self.y_name),),
                               bank_id=self.vb0 + r, bank_addr=ob + self.out_off, length=first.length,
                               channel=self.jp.cout, jump_read=self.cg_pw, jump_write=y.pixel_pitch, reg_id=y.reg_id,
                               ddr_addr=y.addr(first.j0 + r, first.q0, 0))

    def emit_pass(self, ps: ChainPass, _ob: int, _oslot: int) -> None:
        """emit_chain's consumer pass `ps`."""
        # "wide": a full slot's pointwise CONVs wait until the chain conv's CONVs for the next rows are emitted;
        # a slot about to be written again is flushed first
        if len(self.prog) > self.emitted:
            self.flush()
        last = self.held[-1] if self.held else None
        if last is not None and not (last.q0 == ps.q0 and last.j0 + last.v == ps.j0):
            self.close()  # a slot holds consecutive rows of one strip
        if self.ready and self.ready[0][1] == self.slot:
            self.flush(len(self.ready) - 1)
        _emit_dw_pass(self.prog, self.arch, self.graph, self.dw, self.job.cout, ps, self.slot,
                      self.slot * self.half + self.tile.a_slot, sum(p.v for p in self.held))
        self.drain()
        self.held.append(ps)
        if not self.pair or len(self.held) == 2 or ps.v < self.arch.alu_pp:
            self.close()
            if self.variant == "eager":
                self.flush()
        self.emitted = len(self.prog)

    def finish(self) -> None:
        """After emit_chain: the last slot's pointwise CONVs, adds and SAVEs."""
        self.chain_done = True
        self.close()
        self.flush()
        self.drain()


def _emit_dw_pass(prog: Program, arch: Arch, graph: Graph, dw: Op, c: int, ps: ChainPass, slot: int, ob: int,
                  row: int) -> None:
    """The depthwise ALU of one chain pass over the `c` channels of the circular buffer in VB1, writing VB0 rows
    from bank `row` at `ob` (slot `slot`): weights in DWCONVW from row 0, biases after the chain conv's."""
    from tvm_dpu.codegen.alu import ALU_MODES

    cg = ceil_div(c, arch.ocp)
    qd, win = xops.quant_params(dw, graph), window_of(graph, dw)
    vb0, vb1 = arch.bank_group("VB0").base_id, arch.bank_group("VB1").base_id
    prog.emit("ALUINIT", exec_mode=ALU_MODES["dwconv"], kernel_h=win.kh, kernel_w=win.kw, stride_h=win.sh,
              stride_w=win.sw, stride_offset_in=ps.s0, stride_offset_out=0, stride_out=1, channel_group=cg,
              channel_offset=cg * arch.icp - c, length=ps.length, shift_prelu_p=0, shift_prelu_n=0, jump_read=cg,
              jump_read_endl=ps.e, jump_read_weights=cg, jump_write=cg, jump_write_endl=1, act_type=qd.act_type,
              shift_bias=qd.shift_bias_isa, shift_cut=qd.shift_cut, multi_factor=0)
    dw_params = (("dwconvw",), *param_resources(None, "dw")[1])
    prog.emit("ALU", reads=ps.reads + dw_params, writes=(("vb0", slot, "out"),),
              bank_id_out=vb0 + row, bank_addr_out=ob, pad_bottom=win.kh - 1 - ps.p_bottom, valid_pixel_parallel=ps.v,
              bank_id_in=vb1 + ps.m % arch.pp, bank_addr_in=ps.a[0], pad_top=ps.p_top, pad_left=ps.p_left,
              pad_right=win.kw - 1 - ps.p_right, bank_addr_in_1=ps.a[1], kernel_d=1, bank_addr_weights=0,
              bank_addr_in_2=ps.a[2], bank_addr_bias=cg, bank_addr_in_3=ps.a[3])


def _emit_residual(prog: Program, arch: Arch, graph: Graph, pw: Op, add: Op, fmaps: dict[str, FMap],
                   passes: list[ChainPass], base: int, gap: int, cg: int, sl: int) -> None:
    """The residual add of a full slot: the other operand's rows of the slot's pixels LOADed `gap` rows after the
    pointwise output (at `base` in VB0 banks 0.., cg rows per pixel), then one ELEW per ALU_PP rows adding the two
    in place (operand order and shifts as the add has them)."""
    from tvm_dpu.codegen.isa import enum_code

    vb0 = arch.bank_group("VB0").base_id
    k = add.inputs.index(pw.outputs[0])
    other = add.inputs[1 - k]
    z, q = fmaps[other], xops.quant_params(add, graph)
    first, v = passes[0], sum(p.v for p in passes)
    c = graph.tensors[other].shape[1]
    for r in range(v):
        prog.emit("LOAD", reads=(("ddr", other),), writes=(("vb0", sl, "operand"),), bank_id=vb0 + r,
                  bank_addr=base + gap, length=first.length, channel=c, jump_read=z.pixel_pitch, jump_write=cg,
                  reg_id=z.reg_id, ddr_addr=z.addr(first.j0 + r, first.q0, 0))
    addr = {k: base, 1 - k: base + gap}
    for k0 in range(0, v, arch.alu_pp):
        for i in range(2):
            prog.emit("ELEWINIT", bank_id_in=vb0 + k0, share_pp=0, jump_bank=1, id=i, jump_read_endl=1,
                      bank_addr_in=addr[i], shift_read=q.shift_read[i], jump_read=cg)
        prog.emit("ELEW", reads=(("vb0", sl, "pw"), ("vb0", sl, "operand")), writes=(("vb0", sl, "pw"),),
                  bank_id_out=vb0 + k0, elew_type=enum_code("elew_type", "add"), act_type=q.act_type,
                  length=first.length, valid_pixel_parallel=min(arch.alu_pp, v - k0), num=2, jump_write_endl=1,
                  bank_addr_out=base, channel_group=cg, shift_write=q.shift_write, jump_write=cg)
