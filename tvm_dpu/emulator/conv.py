"""CONV (with the most recent CONVINIT), isa1-semantics.md 6, plus the window fetch shared with the ALU."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from tvm_dpu.arch.arch import LEAKY_NUM, LEAKY_SHIFT
from tvm_dpu.codegen.isa import enum_codes
from tvm_dpu.quant.fixpoint import (FLOAT32_EXACT_BITS, INT8_MAX, INT8_MIN, RELU6_MAX, float32_shift_round_exact,
                                    float_shift_round_exact, floor_clamp_int8, saturate_int8, shift_round)
from tvm_dpu.emulator.banks import all_distinct, fetch_rows, piece_reader, store_rows
from tvm_dpu.emulator import gemm as emu_gemm
from tvm_dpu.emulator.threads import blas_threads, max_threads, run_parts, thread_count

if TYPE_CHECKING:
    from tvm_dpu.codegen.isa import Instr
    from tvm_dpu.emulator.banks import Banks
    from tvm_dpu.emulator.context import Core, Ctx, Step

#: CONV kernel / stride white-lists of conv_limit (defaults "1-16" / "1-8").
CONV_KERNEL_MAX = 16
CONV_STRIDE_MAX = 8
SHIFT_BIAS_MAX = 20
#: Highest bank-address slot (bank_addr_in, _1, _2, _3).
MAX_ADDR_GROUP = 3
_ACT = enum_codes("act_type")
ACT_NONE, ACT_RELU, ACT_LEAKY, ACT_RELU6 = _ACT["none"], _ACT["relu"], _ACT["leaky_relu"], _ACT["relu6"]
#: The act_type codes the CONV and ALU engines compute (6.4: prelu, hard_sigmoid, hard_swish need parameters DPUV2
#: does not encode).
ENGINE_ACTS = frozenset({ACT_NONE, ACT_RELU, ACT_LEAKY, ACT_RELU6})


def activate(v: np.ndarray, shift: int, act: int) -> np.ndarray:
    """DPURound(act(v / 2**shift)) for integer v, exactly; act one of ENGINE_ACTS (none, relu, leaky, relu6)."""
    out = shift_round(v, shift)
    if act == ACT_RELU:
        out = np.maximum(out, 0)
    elif act == ACT_RELU6:
        out = np.clip(out, 0, RELU6_MAX)
    elif act == ACT_LEAKY:
        neg = shift_round(v * LEAKY_NUM, shift + LEAKY_SHIFT)
        out = np.where(v < 0, neg, out)
    return saturate_int8(out)


#: |int8 * int8| <= 2**14 ((-128) * (-128)); float32 holds every integer up to 2**FLOAT32_EXACT_BITS exactly.
INT8_PRODUCT_BITS = 14
#: Reduction chunk of the float32 GEMM: any partial sum of <= 1024 int8 products is an integer of magnitude
#: <= 2**24, so it is exact in float32 whatever order (or FMA) BLAS adds in; chunks add up exactly in float64.
GEMM_CHUNK = 1 << (FLOAT32_EXACT_BITS - INT8_PRODUCT_BITS)
#: A CONV GEMM is shared between threads (emu_threads) from this many multiply-accumulates, in blocks of at least
#: this many rows (else of OCP-column groups): below that, handing work over costs more than it saves.
PARALLEL_MIN_MACS = 2_000_000
PARALLEL_MIN_ROWS = 32
#: Parts per thread: smaller parts let the calling thread take over those a worker slowed by other load has not
#: started (emu_threads.run_parts).
PARTS_PER_THREAD = 2
#: x xor INT8_SIGN_BIT is the byte of x + 128 (int8 x): the unsigned operand of the int8 kernel; a zero pad is
#: this byte there.
INT8_SIGN_BIT = 0x80
#: act_type -> the int8 clamp of the rounded CONV output: none, relu, relu6 (leaky takes the integer path).
CLAMPS = {ACT_NONE: (INT8_MIN, INT8_MAX), ACT_RELU: (0, INT8_MAX), ACT_RELU6: (0, RELU6_MAX)}


def exact_matmul_t(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """a (M, K) @ w (N, K).T for float32 arrays holding int8 values, as exact int64."""
    k = a.shape[1]
    if k <= GEMM_CHUNK:
        return np.matmul(a, w.T).astype(np.int64)
    acc = np.matmul(a[:, :GEMM_CHUNK], w[:, :GEMM_CHUNK].T).astype(np.float64)
    for c in range(GEMM_CHUNK, k, GEMM_CHUNK):
        acc += np.matmul(a[:, c:c + GEMM_CHUNK], w[:, c:c + GEMM_CHUNK].T)
    return acc.astype(np.int64)


def _check_conv(emu: "Core", ctx: "Ctx", g: dict, f: dict) -> None:
    """The CONVINIT / CONV field checks of the simulator (white-lists, PP, offsets, activation, channel mask)."""
    kh, kw, sh, sw = g["kernel_h"], g["kernel_w"], g["stride_h"], g["stride_w"]
    ctx.check(kh <= CONV_KERNEL_MAX and kw <= CONV_KERNEL_MAX, None,
              f"CONVINIT kernel {kh}x{kw} outside the conv kernel_size white-list 1-{CONV_KERNEL_MAX}")
    ctx.check(sh <= CONV_STRIDE_MAX and sw <= CONV_STRIDE_MAX, None,
              f"CONVINIT stride {sh}x{sw} outside the conv stride white-list 1-{CONV_STRIDE_MAX}")
    vpp, pp = g["valid_pixel_parallel"], emu.arch.pp
    ctx.check(vpp <= pp, None, f"CONVINIT valid_pixel_parallel={vpp} > PP={pp}")
    ctx.check(g["stride_offset_in"] < sh, None,
              f"CONVINIT stride_offset_in={g['stride_offset_in']} must be < stride_h={sh}")
    ctx.check(g["shift_bias"] <= SHIFT_BIAS_MAX, None,
              f"CONVINIT shift_bias={g['shift_bias']} > {SHIFT_BIAS_MAX}")
    act = g["act_type"]
    ctx.check(act in emu.allowed_acts("conv") and act in ENGINE_ACTS, None,
              f"CONVINIT act_type={act} not allowed on {emu.arch.name} CONV "
              f"(allowed {sorted(emu.allowed_acts('conv'))})")
    cin = f["channel_group"] * emu.arch.icp
    ctx.check(f["channel_offset"] <= cin, "channel_offset", f"masks more than the {cin} input channels")


def _param_keys(banks: "Banks", f: dict, ntap: int, cg: int, ocp: int) -> tuple[np.ndarray, np.ndarray]:
    """Bank row keys of a CONV's weights, (ocp, ntap * cg): CONVW bank o, tap t at row bank_addr_weights + t*cg,
    Cin bytes (6.4); and of its bias: OCP bytes of BIAS."""
    taps = f["bank_addr_weights"] + np.arange(ntap, dtype=np.int64) * cg
    wbanks = banks.base_id["CONVW"] + np.arange(ocp, dtype=np.int64)
    wkeys = banks.keys(wbanks[:, None], taps[None, :], cg).reshape(ocp, -1)
    bias_keys = banks.keys(np.int64(banks.base_id["BIAS"]), np.int64(f["bank_addr_bias"]), -(-ocp // banks.width))
    return wkeys, bias_keys


def _out_keys(banks: "Banks", bank_out: int, pp: int, g: dict, f: dict, ocp: int) -> np.ndarray:
    """Bank row keys a CONV writes, (vpp * L, rows of OCP bytes): the row-store rule (3.3) per output pixel."""
    vpp, L = g["valid_pixel_parallel"], f["length"]
    obanks, orows = store_rows(bank_out, pp, vpp, g["stride_out"], g["stride_offset_out"], g["jump_write_endl"],
                               f["bank_addr_out"])
    rows = orows[:, None] + np.arange(L, dtype=np.int64)[None, :] * g["jump_write"]
    return banks.keys(obanks[:, None], rows, -(-ocp // banks.width)).reshape(vpp * L, -1)


def _gemm_input(xbuf: np.ndarray, shape: tuple, M: int, K: int, direct: bool, int8: bool
                ) -> tuple[np.ndarray, np.ndarray | None]:
    """The (M, K) GEMM input of a CONV and the window-shaped buffer im2col copies into (None when the gathered
    window itself is the input)."""
    if direct:
        return xbuf.reshape(M, K), None  # the gathered window is the GEMM input
    if int8:
        # K padded to the kernel's step: the pad columns meet zero weights.
        a = emu_gemm.aligned_zeros((M, emu_gemm.padded(K, 1)[0]), np.uint8)
        return a, a[:, :K].reshape(shape)
    abuf = np.empty(shape, np.float32)
    return abuf.reshape(M, K), abuf


def plan_conv(emu: "Core", ctx: "Ctx", init: "Instr | None") -> "ConvStep":
    """Check a CONV under CONVINIT `init` and precompute its gathers; returns the step that performs it."""
    f = ctx.ins.fields
    ctx.check(init is not None, None, "no CONVINIT before this CONV")
    g = init.fields
    arch = emu.arch
    banks = emu.banks
    pp, icp, ocp = arch.pp, arch.icp, arch.ocp
    bank_in = emu.check_image_bank(ctx, "bank_id_in")
    bank_out = emu.check_image_bank(ctx, "bank_id_out")
    _check_conv(emu, ctx, g, f)
    kh, kw, sh, sw = g["kernel_h"], g["kernel_w"], g["stride_h"], g["stride_w"]
    vpp, cg, L = g["valid_pixel_parallel"], f["channel_group"], f["length"]
    act = g["act_type"]
    cin = cg * icp
    choff = f["channel_offset"]
    # The masked tail channels read as zero (6.3), so their products are zero: the GEMM leaves them out.
    cuse = cin - choff
    real_h = (vpp - 1) * sh + kh
    src_w = (L - 1) * sw + kw
    M, K = vpp * L, kh * kw * cuse
    # The int8 kernel (emu_gemm) for none/relu/relu6 while its int32 lanes cannot wrap and its int64 epilogue
    # holds the shift; leaky (and the float32 BLAS setting) take the float / integer paths of ConvBatch.
    int8 = (act in CLAMPS and K <= emu_gemm.K_MAX and g["shift_cut"] + 1 <= emu_gemm.SHIFT_MAX
            and emu_gemm.available())
    # The window is gathered into a buffer of this step (steps are per emulator, and an emulator serves one
    # thread), so the im2col view below is made once, not per run.
    xbuf = emu_gemm.aligned_empty((real_h, src_w, cg, banks.width), np.uint8)
    pads = pad_slices(real_h, src_w, kh, kw, f["pad_top"], f["pad_left"], f["pad_bottom"], f["pad_right"])
    gather_x, window_keys = window_gather(
        emu, ctx, bank_id=bank_in, height=real_h, width=src_w, nrow=cg, stride_h=sh, offset_in=g["stride_offset_in"],
        endl=g["jump_read_endl"], jump=g["jump_read"],
        bases=(f["bank_addr_in"], f["bank_addr_in_1"], f["bank_addr_in_2"], f["bank_addr_in_3"]),
        used=window_use(real_h, src_w, kh, kw, sh, sw, pads, cg, 1, icp, choff) if banks.trace is not None else None)
    ntap = kh * kw
    wkeys, bias_keys = _param_keys(banks, f, ntap, cg, ocp)
    # (vpp, L, kh, kw, Cin) windows of the (real_h, src_w, Cin) input, as strides of its C-contiguous copy.
    win_shape = (vpp, L, kh, kw, cin)
    win_strides = (sh * src_w * cin, sw * cin, src_w * cin, cin, 1)
    plain = kh == kw == sh == sw == 1
    out_keys = _out_keys(banks, bank_out, pp, g, f, ocp)
    emu.stats.macs += M * ocp * ntap * cin

    # The int8 kernel reads x + 128 (the byte xor 0x80, emu_gemm): the gathered window is flipped in place.
    x = (xbuf if int8 else xbuf.view(np.int8)).reshape(real_h, src_w, cin)
    pad_value = INT8_SIGN_BIT if int8 else 0
    # (vpp, L, ...) windows: for a 1x1 stride-1 CONV the window (vpp rows, L columns) is the input itself.
    window = x if plain else as_strided(x, win_shape, win_strides, writeable=False)
    window = window[..., :cuse]
    direct = int8 and plain and emu_gemm.padded(K, 1)[0] == K == cin
    a, abuf = _gemm_input(xbuf, window.shape, M, K, direct, int8)

    def gather() -> None:
        """Gather the window into this step's buffer and pad it."""
        gather_x(xbuf)
        if int8:
            np.bitwise_xor(xbuf, INT8_SIGN_BIT, out=xbuf)
        for p in pads:
            x[p] = pad_value

    def im2col(v0: int, v1: int) -> np.ndarray:
        """Rows of the (M, K) im2col matrix (masked channels left out) for output rows v0..v1-1 of the gathered
        window: float32, or for the int8 kernel the (M, Kp) x + 128 bytes; parts of one CONV may fill disjoint row
        ranges concurrently."""
        if not direct:
            np.copyto(abuf[v0:v1], window[v0:v1])
        return a[v0 * L:v1 * L]

    # What a run of CONVs reading the same window needs to be done as one GEMM (batch_conv_run).
    window_id = tuple(sorted((k, v) for k, v in f.items() if k not in _PER_CONV_FIELDS))
    return ConvStep(emu, window_id, (init.name, tuple(g.items())), gather, im2col, int8, wkeys, bias_keys,
                    out_keys, vpp, ocp, ntap, cuse, g["shift_bias"],
                    g["shift_cut"] + 1, act, window_keys.reshape(-1),
                    np.concatenate([wkeys.reshape(-1), bias_keys.reshape(-1)]), out_keys.reshape(-1))


#: CONV fields that may differ between CONVs reading the same input window (each CONV's own weights, bias and
#: output rows); the dependency tokens do not change what the emulator computes.
_PER_CONV_FIELDS = frozenset({"bank_addr_weights", "bank_addr_bias", "bank_addr_out", "bank_id_out", "dpdon",
                              "dpdby"})


@dataclass(eq=False)
class ConvStep:
    """A planned CONV: callable as its own step, and the parts `batch_conv_run` combines."""

    emu: "Core"
    window_id: tuple  # the fields that fix the input window, padding and masking
    init_id: tuple  # the CONVINIT in force
    gather: Callable[[], None]  # fetch and pad the input window
    im2col: Callable[[int, int], np.ndarray]  # output rows v0..v1-1 -> their rows of the GEMM input
    int8: bool  # the GEMM runs on emu_gemm's int8 kernel (the input holds x + 128 bytes)
    wkeys: np.ndarray  # (OCP, taps * cg) CONVW row keys of the weights
    bias_keys: np.ndarray  # (rows,) BIAS row keys of the OCP biases
    out_keys: np.ndarray  # (M, rows per pixel) bank row keys `write` writes
    vpp: int
    ocp: int
    ntap: int
    cuse: int  # input channels used (the unmasked ones)
    shift_bias: int
    shift: int  # shift_cut + 1
    act: int
    reads: np.ndarray  # bank row keys of the window
    param_reads: np.ndarray  # bank row keys of the weights and bias
    writes: np.ndarray  # bank row keys written
    #: The DDR region all its weights and biases were LOADed from in this program, when they were
    #: (core._mark_loaded_params)
    const_rid: int | None = None
    _alone: "Callable[[object], None] | None" = None

    def fill_a(self) -> np.ndarray:
        """The whole (M, K) float32 GEMM input of this CONV's window."""
        self.gather()
        return self.im2col(0, self.vpp)

    @property
    def K(self) -> int:
        """Reduction length: taps * used input channels."""
        return self.ntap * self.cuse

    def __call__(self, regions: object) -> None:
        if self._alone is None:
            self._alone = batch_conv_run([self])
        self._alone(regions)


def can_batch(run: list[ConvStep]) -> bool:
    """Whether the adjacent CONVs `run` may be computed together: same window and CONVINIT, and no CONV writes a
    bank row any CONV of the run reads (so computing all before writing any changes nothing)."""
    first = run[0]
    if any(c.window_id != first.window_id or c.init_id != first.init_id for c in run[1:]):
        return False
    written = np.concatenate([c.writes for c in run])
    read = np.concatenate([first.reads] + [c.param_reads for c in run])
    return not np.isin(written, read).any()


def batch_conv_run(run: list[ConvStep]) -> Callable[[object], None]:
    """One step computing the adjacent CONVs `run` (checked with `can_batch`) as the hardware would one after
    the other: the window is gathered once and all their output channels come from one GEMM, whose integers are
    those of the separate GEMMs (each output is the same exact dot product); outputs are written as in program
    order."""
    return ConvBatch(run).step


class ConvBatch:
    """The GEMM of a run of CONVs sharing a window, with their weights kept as float32 between runs.

    The float32 weights are remade only when the int8 weights in the banks differ from the ones they were made
    from (a program reloads the same weights every run, and comparing bytes costs less than converting them).
    When the requantisation is exact in float64 (`float_shift_round_exact`, always so for real layers) the
    weights are prescaled by 2**(1 - N) (N = shift_cut + 1), which changes only exponents: the GEMM then yields
    2*ACC / 2**N, the bias and the rounding half are added in float64 and one floor-and-clamp gives the output.
    Otherwise (leaky, or shifts too wide for float64) the exact integer path of `activate` is taken.
    """

    def __init__(self, run: list[ConvStep]):
        first = run[0]
        self.run = run
        n, ocp, K, N = len(run), first.ocp, first.K, first.shift
        self.emu = first.emu
        self.sb, self.N, self.act = first.shift_bias, N, first.act
        banks = self.emu.banks
        # All weights of the run as (OCP, n, taps * Cin) bytes: a view when each CONVW bank holds each CONV's as
        # one run of rows, the CONVs' runs evenly spaced (the compiler's and vai_c's layouts), else gathered.
        wkeys = np.stack([c.wkeys for c in run], axis=1)
        self.read_w = banks.row_reader(wkeys, wkeys.shape[-1] * banks.width)
        self.wshape = (ocp, n, first.ntap, wkeys.shape[-1] * banks.width // first.ntap)
        self.wsnap: bytes | None = None  # the bank bytes `wt` was made from
        # The DDR region of the weights and biases when every CONV of the run LOADed all of them from that one
        # region, and the constant array (Emulator.run's `constant`) they were last checked against.
        rids = {c.const_rid for c in run}
        self.const_rid: int | None = rids.pop() if len(rids) == 1 else None
        self.const_src: np.ndarray | None = None
        # (K, n * OCP): the GEMM's right operand C-contiguous, which BLAS multiplies fastest (left untouched, so
        # never paged in, when the int8 kernel runs the GEMM).
        self.wt = np.zeros((K, n * ocp), np.float32)
        self.read_bias = banks.row_reader(np.stack([c.bias_keys for c in run]), ocp)
        self.bsnap: bytes | None = None  # the biases `c` was made from
        self.c = np.zeros(0)
        max_v = 2 * K * (1 << INT8_PRODUCT_BITS) - INT8_MIN * (1 << self.sb)  # |2*ACC + B*2**sb|
        self.float_path = self.act in CLAMPS and float_shift_round_exact(max_v, N)
        self.wscale = np.float32(2.0 ** (1 - N)) if self.float_path else np.float32(1)
        # One float32 chunk and small shifts (every real layer but the widest): the requantisation in float32 too.
        self.float32_requant = self.float_path and K <= GEMM_CHUNK and float32_shift_round_exact(
            -INT8_MIN * (1 << self.sb) + (1 << (N - 1)), N)
        # the blocks when the step is shared between threads, and the one block it is otherwise (thread_count is
        # decided run by run; cutting a GEMM costs a single thread ~25% more)
        self.parts = _split(first.vpp, first.out_keys.shape[0] // first.vpp, n * ocp, K, ocp)
        self.write = _batch_writer(run)
        if first.int8:
            self._init_int8(n * ocp)

    def _init_int8(self, cols: int) -> None:
        """Buffers of the int8 kernel (emu_gemm) and their TVM views, made once: packed weights, per-column
        offsets, the int8 output."""
        first = self.run[0]
        kp, np_ = emu_gemm.padded(first.K, cols)
        self.bp = emu_gemm.aligned_zeros((np_ // emu_gemm.COLS, kp // emu_gemm.KSTEP, 64), np.int8)
        self.wsum = np.zeros(np_, np.int64)
        self.off = emu_gemm.aligned_zeros((np_,), np.int64)
        self.y = emu_gemm.aligned_empty((first.out_keys.shape[0], np_), np.int8)
        self.y_cols = self.y[:, :cols].view(np.uint8)
        # the kernel call with its arguments bound once (a few microseconds per CONV run less)
        a = first.im2col(0, first.vpp).view(np.int32)
        self.gemm = functools.partial(emu_gemm.gemm_requant, *(emu_gemm.to_tensor(v) for v in (a, self.bp, self.off,
                                                                                                 self.y)),
                                      self.N, *CLAMPS[self.act])

    def weights(self) -> np.ndarray:
        """The run's (K, n * OCP) float32 weights (scaled by `wscale`), remade when the banks' bytes changed."""
        raw = self.read_w()
        # Comparing the bytes (one copy, one memcmp) costs a few microseconds less per CONV than np.array_equal,
        # which vai_c's programs (a thousand small CONVs, weights reloaded each run) feel.
        snap = raw.tobytes()
        if snap == self.wsnap:
            return self.wt
        self.wsnap = snap
        self.bsnap = None  # the int8 kernel's offsets depend on the weights too
        first = self.run[0]
        w = raw.view(np.int8).reshape(self.wshape)[..., :first.cuse].transpose(2, 3, 1, 0)  # (taps, cuse, n, OCP)
        if first.int8:
            self.wsum = emu_gemm.pack_weights(w.reshape(first.K, -1), self.bp)
        else:
            np.multiply(w, self.wscale, out=self.wt.reshape(w.shape), casting="unsafe")
        return self.wt

    def bias(self) -> np.ndarray:
        """The run's n * OCP int8 biases."""
        return self.read_bias().view(np.int8).reshape(-1)

    def offsets(self) -> np.ndarray:
        """c = (B*2**sb + 2**(N-1)) * 2**-N per output column (float64), remade when the biases change. Each is an
        integer below 2**53 times a power of two: exact."""
        b = self.bias()
        snap = b.tobytes()
        if snap != self.bsnap:
            self.bsnap = snap
            if self.run[0].int8:
                self.off[...] = emu_gemm.offsets(self.wsum, b, self.sb, self.N)
                return self.off
            self.c = b.astype(np.float64) * 2.0 ** (self.sb - self.N) + 0.5
            if self.float32_requant:
                self.c = self.c.astype(np.float32)  # exact: see float32_shift_round_exact
        return self.c

    def constant_source(self, regions: "Mapping[int, np.ndarray]") -> np.ndarray | None:
        """The array the run's weights and biases were LOADed from in this run when the caller declared it
        constant (Emulator.run's `constant`), else None."""
        rid = self.const_rid
        return regions[rid] if rid is not None and rid in self.emu.constant else None

    def step(self, regions: "Mapping[int, np.ndarray]") -> None:
        # Weights and biases LOADed from the constant array they were last compared against are those bytes
        # again: not compared (ResNet-50 reloads 25 MB of weights per image; comparing costs a copy and a read).
        source = self.constant_source(regions)
        checked = source is not None and source is self.const_src
        if not checked:
            self.const_src = None
            wt = self.weights()
            c = self.offsets()
            self.const_src = source  # the prepared weights and offsets are now this array's
        else:
            wt, c = self.wt, (self.off if self.run[0].int8 else self.c)
        first = self.run[0]
        first.gather()
        if first.int8:
            first.im2col(0, first.vpp)
            self.gemm()
            self.write(self.y_cols)
            return
        if not self.float_path:
            acc = exact_matmul_t(first.im2col(0, first.vpp), wt.T)
            out = activate(2 * acc + (self.bias().astype(np.int64) << self.sb), self.N, self.act)
            self.write(out.view(np.uint8))
            return
        length = first.out_keys.shape[0] // first.vpp
        out = self.emu.scratch("conv_out", (first.vpp * length, wt.shape[1]), np.int8)
        if len(self.parts) == 1 or thread_count() == 1:
            # On this thread, whose BLAS threads `Emulator.run` has set: no job list, no thread hand-over.
            self._requant(first.im2col(0, first.vpp), wt, c, out, self.emu.scratch("conv_y0", out.shape, np.float64),
                          self.emu.scratch("conv_part0", out.shape, np.float32))
            self.write(out.view(np.uint8))
            return
        parts = self.parts
        a = None if parts[0][1] is None else first.im2col(0, first.vpp)  # column parts share all rows
        jobs = []
        for i, (vrows, cols) in enumerate(parts):
            rows = slice(vrows.start * length, vrows.stop * length)
            cols = cols or slice(None)
            shape = (rows.stop - rows.start, wt[:, cols].shape[1])
            y = self.emu.scratch(f"conv_y{i}", shape, np.float64)
            part = self.emu.scratch(f"conv_part{i}", shape, np.float32)
            lhs = a[rows] if a is not None else functools.partial(first.im2col, vrows.start, vrows.stop)
            jobs.append(functools.partial(self._gemm_requant, lhs, wt[:, cols], c[cols], out[rows, cols], y, part))
        run_parts(jobs)
        self.write(out.view(np.uint8))

    def _gemm_requant(self, a: "np.ndarray | Callable[[], np.ndarray]", wt: np.ndarray, c: np.ndarray,
                      out: np.ndarray, y: np.ndarray, part: np.ndarray) -> None:
        """out = DPURound(act((2*ACC + B*2**sb) / 2**N)) for a block of the output (see the class docstring);
        `a` is the block's GEMM input rows or the function making them; y and part are float64 / float32 work
        arrays of out's shape."""
        with blas_threads():
            self._requant(a() if callable(a) else a, wt, c, out, y, part)

    def _requant(self, a: np.ndarray, wt: np.ndarray, c: np.ndarray, out: np.ndarray, y: np.ndarray,
                 part: np.ndarray) -> None:
        """`_gemm_requant` on the GEMM input rows `a`, with BLAS as the calling thread has it."""
        k = a.shape[1]
        if self.float32_requant:
            np.matmul(a, wt, out=part)
            np.add(part, c, out=part)
            y = part
        elif k <= GEMM_CHUNK:
            np.matmul(a, wt, out=part)
            np.add(part, c, out=y)
        else:
            y[...] = c
            for s in range(0, k, GEMM_CHUNK):
                np.matmul(a[:, s:s + GEMM_CHUNK], wt[s:s + GEMM_CHUNK], out=part)
                y += part
        floor_clamp_int8(y, *CLAMPS[self.act], out)


def _split(vpp: int, length: int, n: int, k: int, ocp: int) -> list[tuple[slice, slice | None]]:
    """Blocks (output rows of the window, GEMM columns or None for all) of a CONV run's GEMM, PARTS_PER_THREAD per
    thread (`max_threads`): whole output rows when there are enough (each part then also makes its own GEMM input
    rows), else whole OCP-column groups; a single block when the GEMM is too small to share."""
    parts = max_threads()
    if parts > 1:
        parts *= PARTS_PER_THREAD
    m = vpp * length
    if parts == 1 or m * n * k < PARALLEL_MIN_MACS:
        return [(slice(0, vpp), None)]
    if vpp >= parts and m >= parts * PARALLEL_MIN_ROWS:
        cuts = [vpp * i // parts for i in range(parts + 1)]
        return [(slice(a, b), None) for a, b in zip(cuts, cuts[1:])]
    groups = n // ocp
    parts = min(parts, groups)
    cuts = [groups * i // parts * ocp for i in range(parts + 1)]
    return [(slice(0, vpp), slice(a, b)) for a, b in zip(cuts, cuts[1:])]


def _batch_writer(run: list[ConvStep]) -> Callable[[np.ndarray], None]:
    """Writes the (M, n * OCP) output of a run: one scatter (a strided view when the rows are regular) when no two
    CONVs write the same bank row, else CONV by CONV in program order (the later write wins)."""
    first = run[0]
    ocp, n = first.ocp, len(run)
    keys = np.stack([c.out_keys for c in run], axis=1)  # (M, n, rows per pixel)
    if all_distinct(keys):
        lead = (first.vpp, -1, n)
        write = first.emu.banks.row_writer(keys.reshape(lead + keys.shape[-1:]), ocp)
        return lambda out: write(out.reshape(lead + (ocp,)))

    banks = first.emu.banks
    writers = [banks.row_writer(c.out_keys, ocp) for c in run]

    def write_each(out: np.ndarray) -> None:
        for i, write in enumerate(writers):
            write(out[:, i * ocp:(i + 1) * ocp])
    return write_each


def window_gather(emu: "Core", ctx: "Ctx", *, bank_id: int, height: int, width: int, nrow: int,
                        stride_h: int, offset_in: int, endl: int, jump: int, bases: tuple[int, ...],
                        used: np.ndarray | None = None) -> tuple[Callable[..., np.ndarray], np.ndarray]:
    """A function gathering the (height, width, nrow, row width) uint8 input window (row-fetch rule, 3.3) as a
    fresh array, or into an `out` array of that shape, and the bank row keys (height, width, nrow) it gathers.

    While the emulator records accesses, only the rows the instruction's result depends on are recorded as read:
    those where `used` (broadcast to the keys' shape; None: all) is True. The dependency checker must not order
    an instruction after a write whose bytes it throws away (docs/dependency-protocol.md)."""
    banks = emu.banks
    rm = fetch_rows(bank_id, emu.arch.pp, height, stride_h, offset_in, endl, bases)
    if height and int(rm.groups.max()) > MAX_ADDR_GROUP:
        raise ctx.error("bank_id_in", f"window of {height} rows (stride {stride_h}, stride_offset_in {offset_in}) "
                                      f"wraps the bank group {int(rm.groups.max())} times from bank {bank_id}; "
                                      f"at most {MAX_ADDR_GROUP} wraps (bank_addr_in_1..3)")
    rows = rm.rows[:, None] + np.arange(width, dtype=np.int64)[None, :] * jump
    keys = banks.keys(rm.banks[:, None], rows, nrow)  # (height, width, nrow)
    if banks.trace is not None:
        banks.trace.bank_reads.append((keys if used is None else keys[np.broadcast_to(used, keys.shape)])
                                      .reshape(-1))
    all_rows = banks.rows
    pieces = banks.affine_pieces(keys)
    if pieces is not None:
        # A few strided blocks of rows (the window's rows cycle through a bank group): copied straight into the
        # caller's buffer, without an index array or a temporary.
        return piece_reader(pieces, keys.shape[:-1] + (nrow * banks.width,), nrow * banks.width), keys
    if keys.size:
        starts = keys[:, 0, 0]
        step = np.arange(width, dtype=np.int64)[:, None] * jump + np.arange(nrow, dtype=np.int64)
        if np.array_equal(keys, starts[:, None, None] + step):
            # No row of the window wraps its bank: every image row is a strided block of rows.
            blocks = banks.row_blocks(width, nrow, jump)
            starts = np.ascontiguousarray(starts, dtype=np.intp)
            return _taker(blocks, starts), keys
    return _taker(all_rows, np.ascontiguousarray(keys, dtype=np.intp)), keys


def window_use(height: int, width: int, kh: int, kw: int, sh: int, sw: int, pads: "Sequence[tuple[slice, ...]]",
               cg: int, depth: int, cp: int, masked: int) -> np.ndarray:
    """(height, width, cg * depth) bool: which bank rows of a fetched window (each pixel cg * depth rows of cp
    channels) an output depends on. Not: positions padding overwrites (`pads`); rows and columns no kernel window
    covers (a stride larger than the kernel); a pixel's rows all of whose channels `masked` (channel_offset: the
    last `masked` channels of each of the depth blocks of cg * cp channels) replaces by the pad value."""
    used = np.ones((height, width, 1), bool)
    for region in pads:
        used[region] = False
    used &= (np.arange(height) % sh < kh)[:, None, None]
    used &= (np.arange(width) % sw < kw)[None, :, None]
    if masked > 0:
        used = used & ((np.arange(cg * depth) % cg) * cp < cg * cp - masked)
    return used


def _taker(source: np.ndarray, index: np.ndarray) -> Callable[..., np.ndarray]:
    """`take(out=None)`: source[index] along axis 0, copied into `out` when given. (np.take(out=) would first
    make the strided `source` contiguous: the whole bank memory.)"""
    def take(out: np.ndarray | None = None) -> np.ndarray:
        if out is None:
            return source[index]
        out[...] = source[index]
        return out
    return take


def pad_slices(h: int, w: int, kh: int, kw: int, top: int, left: int, bottom_last: int,
                right_last: int) -> list[tuple[slice, ...]]:
    """The non-empty regions of an (h, w) window that padding overwrites (6.3, with the 'last valid index'
    right/bottom encoding), as index tuples."""
    bottom = max(0, h - kh + bottom_last + 1)
    right = max(0, w - kw + right_last + 1)
    out = []
    if top > 0:
        out.append((slice(0, top),))
    if left > 0:
        out.append((slice(None), slice(0, left)))
    if bottom < h:
        out.append((slice(bottom, None),))
    if right < w:
        out.append((slice(None), slice(right, None)))
    return out
