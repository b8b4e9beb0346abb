"""The CONV GEMM in int8 on the host's VNNI dot-product unit, with the CONV requantisation fused: a kernel TVM
compiles once per process (a few hundred ms) from the TIR below.

Why: the emulator spends most of a ResNet-50 run in CONV GEMMs. float32 BLAS is exact for int8 products but
runs at about 48 GMAC/s on one core of the Zen 4 this project is measured on; `vpdpbusd` (AVX-512 VNNI) does 64
int8 multiply-accumulates per instruction and the kernel below reaches about 220 GMAC/s.

Exactness: vpdpbusd multiplies an unsigned byte by a signed byte and adds groups of four products into int32
lanes with wrap-around, no saturation. The signed input x is fed as u = x + 128 (its byte xor 0x80), so the
int32 lane holds sum((x + 128) * w) = ACC + 128 * sum(w): |value| <= K * 255 * 128, an exact int32 for
K <= `K_MAX`; the per-column 128 * sum(w) is taken off in the int64 epilogue, which then computes the CONV
output DPURound(act((2*ACC + B*2**sb) / 2**N)) = clamp(floor((2*ACC + B*2**sb + 2**(N-1)) / 2**N)) with an
arithmetic shift (isa1-semantics.md 6.4; the same formula as emu_conv's float path).

Where the host has no AVX-512 VNNI (or TVM_DPU_EMU_GEMM=float32), `available()` is False and emu_conv keeps its
float32 BLAS path. Both paths are bit-exact, so the choice only costs or saves time.

Cold start: building the kernel needs TVM, and importing TVM (1.7 s with a warm disk cache, 6.4 s cold) and building
it (0.8 s) cost more than the float32 GEMM loses on one run of a small network (MNIST: 230 instructions). So "auto"
uses the kernel only where TVM is already imported in the process (compiling, a loaded artifact's CPU library, the
test suite): `tvm-dpu run m.xmodel` stays on numpy. TVM_DPU_EMU_GEMM=int8 imports TVM for the kernel anyway (long runs
of big networks, where 4.5x faster GEMMs repay the import).
"""
from __future__ import annotations

import functools
import os
import sys
import threading
import warnings
from typing import Callable

import numpy as np

from tvm_dpu.errors import EmulatorError

#: Output rows one kernel block keeps in registers (8 zmm accumulators of 16 int32 columns).
ROWS = 8
#: Output columns per accumulator and reduction elements per vpdpbusd lane.
COLS, KSTEP = 16, 4
#: Largest reduction length whose int32 lanes cannot wrap: K * 255 * 128 < 2**31.
K_MAX = (2**31 - 1) // (255 * 128)
#: Largest shift (shift_cut + 1, up to 64 in CONVINIT's 6-bit field) the int64 epilogue takes: 2**(N-1) and
#: 2*ACC + B*2**sb + 2**(N-1) stay below 2**63, and an int64 shift by N is defined.
SHIFT_MAX = 62
#: DLPack hands TVM only 64-byte aligned buffers.
ALIGN = 64
#: Environment switch: "auto" (default) uses the int8 kernel where the CPU has AVX-512 VNNI and TVM is already
#: imported; "int8" imports TVM for it if need be; "float32" keeps the float32 BLAS GEMM.
ENV = "TVM_DPU_EMU_GEMM"
MODES = ("auto", "int8", "float32")
_FEATURES = ("avx512f", "avx512bw", "avx512vnni")


def aligned_empty(shape: tuple[int, ...], dtype: "np.dtype | type") -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on an ALIGN-byte boundary."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    buf = np.empty(nbytes + ALIGN, np.uint8)
    off = (-buf.ctypes.data) % ALIGN
    return buf[off:off + nbytes].view(dtype).reshape(shape)


def aligned_zeros(shape: tuple[int, ...], dtype: "np.dtype | type") -> np.ndarray:
    """aligned_empty, zero-filled."""
    out = aligned_empty(shape, dtype)
    out[...] = 0
    return out


def available() -> bool:
    """Whether CONV GEMMs run on the int8 kernel in this process (see the module docstring)."""
    mode = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise EmulatorError(f"{ENV}={mode!r}: expected one of {', '.join(map(repr, MODES))}")
    if mode == "float32" or (mode == "auto" and "tvm" not in sys.modules):
        return False
    return _kernel() is not None


@functools.lru_cache(maxsize=1)
def _kernel() -> "Callable | None":
    """The compiled kernel, or None when the host CPU lacks the instructions it needs."""
    import tvm
    from tvm.target import codegen

    cpu = codegen.llvm_get_system_cpu()
    target = tvm.target.Target({"kind": "llvm", "mcpu": cpu})
    if not codegen.target_has_features(list(_FEATURES), target):
        return None
    try:
        return tvm.compile(_tir(), target=target)["dpu_conv_gemm"]
    except Exception as e:  # noqa: BLE001 - any TVM/LLVM build failure only costs speed: the float32 GEMM is exact
        warnings.warn(f"tvm-dpu emulator: int8 GEMM kernel did not build for {cpu} ({type(e).__name__}: "
                      f"{str(e).splitlines()[0] if str(e) else ''}); CONVs use the float32 GEMM", RuntimeWarning)
        return None


def _tir():
    """The kernel: out[m, c] = clamp((2 * (sum_k u[m, k] * w[k, c]) + off[c]) >> shift, lo, hi) as int8, where
    A holds u four bytes per int32, B the weights packed by `pack_weights`, off the per-column int64 offsets
    (`offsets`). Blocks of ROWS rows, then the remaining rows one at a time."""
    from tvm.script import tirx as T

    R = ROWS

    @T.prim_func
    def dpu_conv_gemm(a: T.handle, b: T.handle, o: T.handle, y: T.handle, shift: T.int32, lo: T.int32,
                      hi: T.int32):
        T.func_attr({"global_symbol": "dpu_conv_gemm", "tirx.noalias": True})
        m = T.int32()
        n16 = T.int32()
        k4 = T.int32()
        A = T.match_buffer(a, (m, k4), "int32")
        B = T.match_buffer(b, (n16, k4, 64), "int8")
        Off = T.match_buffer(o, (n16 * 16,), "int64")
        Y = T.match_buffer(y, (m, n16 * 16), "int8")
        acc = T.alloc_buffer((R, 16), "int32", scope="local")
        acc1 = T.alloc_buffer((16,), "int32", scope="local")
        for j in range(n16):
            for i in range(m // R):
                for r in T.unroll(R):
                    acc[r, T.ramp(0, 1, 16)] = T.broadcast(T.int32(0), 16)
                for k in range(k4):
                    for r in T.unroll(R):
                        acc[r, T.ramp(0, 1, 16)] = T.call_llvm_pure_intrin(
                            "int32x16", "llvm.x86.avx512.vpdpbusd.512", acc[r, T.ramp(0, 1, 16)],
                            T.reinterpret("int8x64", T.broadcast(A[i * R + r, k], 16)), B[j, k, T.ramp(0, 1, 64)])
                for r in T.unroll(R):
                    for c in T.vectorized(16):
                        Y[i * R + r, j * 16 + c] = T.Cast("int8", T.max(T.min(T.shift_right(
                            T.Cast("int64", acc[r, c]) * T.int64(2) + Off[j * 16 + c], T.Cast("int64", shift)),
                            T.Cast("int64", hi)), T.Cast("int64", lo)))
            for i in range(m - m // R * R):
                acc1[T.ramp(0, 1, 16)] = T.broadcast(T.int32(0), 16)
                for k in range(k4):
                    acc1[T.ramp(0, 1, 16)] = T.call_llvm_pure_intrin(
                        "int32x16", "llvm.x86.avx512.vpdpbusd.512", acc1[T.ramp(0, 1, 16)],
                        T.reinterpret("int8x64", T.broadcast(A[m // R * R + i, k], 16)), B[j, k, T.ramp(0, 1, 64)])
                for c in T.vectorized(16):
                    Y[m // R * R + i, j * 16 + c] = T.Cast("int8", T.max(T.min(T.shift_right(
                        T.Cast("int64", acc1[c]) * T.int64(2) + Off[j * 16 + c], T.Cast("int64", shift)),
                        T.Cast("int64", hi)), T.Cast("int64", lo)))

    return dpu_conv_gemm


#: Largest kh * kw * kernel_d the depthwise kernel unrolls (a 7x7 window); larger windows keep the tap loops.
DW_UNROLL_MAX = 49
#: Output pixels of a row the depthwise kernel computes together (the remainder one by one).
DW_PIXELS = 4
#: Depthwise kernels are built while programs compile, which threads sharing a device do concurrently: one build
#: at a time.
_DW_BUILD = threading.Lock()


@functools.lru_cache(maxsize=None)
def dw_kernel(kh: int, kw: int, depth: int, w16: bool, int32_epilogue: bool) -> "Callable | None":
    """The depthwise kernel (`_dw_tir`) of one window shape, built when first asked for (about 0.1 s; a network
    has a few shapes) beside the GEMM kernel, which must be `available()`."""
    import tvm
    from tvm.target import codegen

    target = tvm.target.Target({"kind": "llvm", "mcpu": codegen.llvm_get_system_cpu()})
    try:
        with _DW_BUILD:
            return tvm.compile(_dw_tir(kh, kw, depth, w16, int32_epilogue), target=target)["dpu_dwconv"]
    except Exception as e:  # noqa: BLE001 - as for _kernel: numpy's depthwise path is exact too
        warnings.warn(f"tvm-dpu emulator: depthwise kernel did not build ({type(e).__name__}); the ALU uses numpy",
                      RuntimeWarning)
        return None


def _dw_tir(kh: int, kw: int, depth: int, w16: bool, int32_epilogue: bool):
    """Depthwise conv of an ALU (isa1-semantics.md 9.2) on one gathered, padded window, for a (kh, kw, depth)
    window fixed at build time: per output pixel and group of COLS channels, ACC[c] = sum_{i, j, k}
    X[v*sh + i, l*sw + j, k, c] * W[i, j, k, c] in an int32 register (the caller checks it cannot wrap), then
    Y[v, l, c] = clamp((ACC * mul + (B[c] << sb) + half) >> shift, lo, hi), in int32 when the caller has checked
    that no term of it can wrap (`int32_epilogue`), else in int64. W is the int8 weights, or dwconv_w16's int16
    values held as int32 (`w16`); B the int8 biases (zeros and sb = 0 for the modes without bias). C is a multiple
    of COLS. Against one loop nest over a memory accumulator this is about 2.5x faster: the taps unrolled (up to
    DW_UNROLL_MAX), DW_PIXELS neighbouring pixels per pass (each weight vector loaded once for them)."""
    from tvm.script import tirx as T

    taps = T.unroll if kh * kw * depth <= DW_UNROLL_MAX else T.serial
    wdtype = "int32" if w16 else "int8"
    acc_t = "int32" if int32_epilogue else "int64"
    P = DW_PIXELS

    @T.prim_func
    def dpu_dwconv(x: T.handle, w: T.handle, b: T.handle, y: T.handle, sh: T.int32, sw: T.int32, mul: T.int32,
                   sb: T.int32, half: T.int64, shift: T.int32, lo: T.int32, hi: T.int32):
        T.func_attr({"global_symbol": "dpu_dwconv", "tirx.noalias": True})
        h = T.int32()
        wd = T.int32()
        cc = T.int32()
        vpp = T.int32()
        length = T.int32()
        X = T.match_buffer(x, (h, wd, depth, cc), "int8")
        W = T.match_buffer(w, (kh, kw, depth, cc), wdtype)
        B = T.match_buffer(b, (cc,), "int8")
        Y = T.match_buffer(y, (vpp, length, cc), "int8")
        acc = T.alloc_buffer((P, COLS), "int32", scope="local")
        acc1 = T.alloc_buffer((COLS,), "int32", scope="local")
        for v in range(vpp):
            for c0 in range(cc // COLS):
                for lb in range(length // P):
                    for u in T.unroll(P):
                        for c1 in T.vectorized(COLS):
                            acc[u, c1] = 0
                    for i in taps(kh):
                        for j in taps(kw):
                            for k in taps(depth):
                                for u in T.unroll(P):
                                    for c1 in T.vectorized(COLS):
                                        acc[u, c1] = acc[u, c1] + T.Cast(
                                            "int32", X[v * sh + i, (lb * P + u) * sw + j, k, c0 * COLS + c1]) \
                                            * T.Cast("int32", W[i, j, k, c0 * COLS + c1])
                    for u in T.unroll(P):
                        for c1 in T.vectorized(COLS):
                            Y[v, lb * P + u, c0 * COLS + c1] = T.Cast("int8", T.max(T.min(T.shift_right(
                                T.Cast(acc_t, acc[u, c1]) * T.Cast(acc_t, mul)
                                + T.shift_left(T.Cast(acc_t, B[c0 * COLS + c1]), T.Cast(acc_t, sb))
                                + T.Cast(acc_t, half), T.Cast(acc_t, shift)), T.Cast(acc_t, hi)), T.Cast(acc_t, lo)))
                for lt in range(length - length // P * P):
                    for c1 in T.vectorized(COLS):
                        acc1[c1] = 0
                    for i in taps(kh):
                        for j in taps(kw):
                            for k in taps(depth):
                                for c1 in T.vectorized(COLS):
                                    acc1[c1] = acc1[c1] + T.Cast(
                                        "int32", X[v * sh + i, (length // P * P + lt) * sw + j, k, c0 * COLS + c1]) \
                                        * T.Cast("int32", W[i, j, k, c0 * COLS + c1])
                    for c1 in T.vectorized(COLS):
                        Y[v, length // P * P + lt, c0 * COLS + c1] = T.Cast("int8", T.max(T.min(T.shift_right(
                            T.Cast(acc_t, acc1[c1]) * T.Cast(acc_t, mul)
                            + T.shift_left(T.Cast(acc_t, B[c0 * COLS + c1]), T.Cast(acc_t, sb))
                            + T.Cast(acc_t, half), T.Cast(acc_t, shift)), T.Cast(acc_t, hi)), T.Cast(acc_t, lo)))

    return dpu_dwconv


def padded(k: int, n: int) -> tuple[int, int]:
    """(K, N) rounded up to the kernel's KSTEP and COLS."""
    return -(-k // KSTEP) * KSTEP, -(-n // COLS) * COLS


def pack_weights(w: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Pack (K, N) int8 weights into `out` ((Np/16, Kp/4, 64) int8, `padded`): block j, step k holds columns
    16j..16j+15, each as its four weights k*4..k*4+3 (vpdpbusd's operand layout); padding is zero. Returns the
    per-column sum of the weights (int64, Np), for `offsets`."""
    k, n = w.shape
    kp, np_ = padded(k, n)
    full = np.zeros((kp, np_), np.int8)
    full[:k, :n] = w
    out.reshape(np_ // COLS, kp // KSTEP, COLS, KSTEP)[...] = full.reshape(kp // KSTEP, KSTEP, np_ // COLS, COLS) \
        .transpose(2, 0, 3, 1)
    return full.sum(axis=0, dtype=np.int64)


def offsets(wsum: np.ndarray, bias: np.ndarray, shift_bias: int, shift: int) -> np.ndarray:
    """Per-column int64 epilogue offsets: B * 2**sb + 2**(N-1) - 2 * 128 * sum(w) (the u = x + 128 bias of the
    kernel's input undone; see the module docstring). `bias` may be shorter than `wsum` (padding columns)."""
    off = -256 * wsum
    off[:bias.size] += bias.astype(np.int64) << shift_bias
    off += 1 << (shift - 1)
    return off


def to_tensor(x: np.ndarray):
    """A zero-copy TVM view of the ALIGN-aligned, C-contiguous array `x`, made once per buffer."""
    import tvm

    return tvm.runtime.from_dlpack(x)


def gemm_requant(a, b, off, y, shift: int, lo: int, hi: int) -> None:
    """Run the kernel on TVM views (`to_tensor`) of A (M, Kp/4) int32-packed u bytes, B (`pack_weights`),
    off (`offsets`) and the int8 output Y (M, Np)."""
    _kernel()(a, b, off, y, shift, lo, hi)
