"""Fixed-point primitives of the DPU, defined once (dpu-facts.md "Integer arithmetic", isa1-semantics.md 11).

Tensors are int8 with a per-tensor power-of-two scale: value = q * 2**-fix_point. Every engine ends with
DPURound: round half toward +infinity (floor(x + 0.5)), then saturate to [-128, 127].

The golden reference (xgraph) and the instruction emulator (runtime) share only these primitives; each
implements the op semantics on its own, so a bug in one shows up as a mismatch with the other.
"""
from __future__ import annotations

import math

import numpy as np

from tvm_dpu.arch.arch import LEAKY_NUM, LEAKY_SHIFT

INT8_MIN = -128
INT8_MAX = 127

#: LeakyReLU slope forced by the quantizer (the one CONV act_type 3 hard-wires, arch.arch.LEAKY_NUM / 2**LEAKY_SHIFT).
LEAKY_ALPHA = LEAKY_NUM / (1 << LEAKY_SHIFT)

#: ReLU6 threshold of CONV/ALU act_type 4: 6 * 2**4, i.e. the output must have fix_point 4.
RELU6_FIX_POINT = 4
RELU6_MAX = 6 << RELU6_FIX_POINT

#: Hard-sigmoid multiplier (2731 / 2**14 ~ 1/6) of ALU mode 7.
HSIGMOID_MUL = 2731
HSIGMOID_SHIFT = 14


def saturate_int8(v: np.ndarray) -> np.ndarray:
    """Clamp an integer array to [-128, 127] and return it as int8."""
    # minimum(maximum()) rather than np.clip: the same values, without np.clip's per-call Python overhead, which
    # dominates on the emulator's small per-instruction arrays.
    return np.minimum(np.maximum(v, INT8_MIN), INT8_MAX).astype(np.int8)


def shift_round(v: np.ndarray, n: int) -> np.ndarray:
    """floor(v / 2**n + 0.5) for integer v, exactly (arithmetic shifts on int64); n < 0 shifts left.

    No saturation: callers saturate once, at the end, as the hardware does.
    """
    v = np.asarray(v, dtype=np.int64)
    if n > 0:
        return (v + (np.int64(1) << np.int64(n - 1))) >> np.int64(n)
    if n < 0:
        return v << np.int64(-n)
    return v


#: float64 holds every integer of magnitude <= 2**53 exactly (53-bit significand).
FLOAT64_EXACT_BITS = 53


def float_shift_round_exact(max_abs: int, n: int) -> bool:
    """Whether `floor_clamp_int8` gives shift_round(v, n) for every integer |v| <= max_abs when the caller forms
    y = v * 2**-n + 0.5 in float64 by adding exact terms (integers times 2**-n) whose partial sums, less the
    0.5, are also bounded by max_abs * 2**-n.

    y is (v + 2**(n-1)) * 2**-n: an integer of magnitude < 2**53 times a power of two, so it and every partial
    sum of such terms is exact in float64 (scaling by 2**-n changes only the exponent; n <= 64 stays far from
    underflow), and floor(y) is then exact too.
    """
    return n >= 1 and max_abs + (1 << (n - 1)) <= 1 << FLOAT64_EXACT_BITS


#: float32 holds every integer of magnitude <= 2**24 exactly (24-bit significand).
FLOAT32_EXACT_BITS = 24


def float32_shift_round_exact(max_offset: int, n: int) -> bool:
    """Whether `floor_clamp_int8` on float32 y = p + c gives DPURound(v / 2**n) clamped, as the float64 form does,
    when p is an exact float32 multiple of 2**-n and c = C * 2**-n with |C| <= max_offset (v = p * 2**n + C - 2**(n-1)).

    c is then exact (|C| <= 2**24); every multiple of 2**-n in [-256, 256] is a float32 (n <= 16), so y is exact
    there; and beyond that range float rounding, being monotonic with +-256 representable, cannot move y across
    the int8 clamps.
    """
    return 1 <= n <= FLOAT32_EXACT_BITS - 8 and max_offset <= 1 << FLOAT32_EXACT_BITS


def floor_clamp_int8(y: np.ndarray, lo: int, hi: int, out: np.ndarray) -> np.ndarray:
    """out[...] = min(max(floor(y), lo), hi) as int8 for float y; y is clamped in place (scratch).

    With y = v * 2**-n + 0.5 (see float_shift_round_exact) and [lo, hi] inside [-128, 127] this is
    DPURound of v / 2**n followed by the clamp of relu ([0, 127]) or relu6 ([0, RELU6_MAX]). Clamping before
    the floor gives the same result because lo and hi are integers.
    """
    # maximum / minimum rather than np.clip: the same values without np.clip's Python overhead (per small CONV).
    np.maximum(y, lo, out=y)
    np.minimum(y, hi, out=y)
    return np.floor(y, out=out, casting="unsafe")


def dpu_round_scaled_f32(x: np.ndarray, fix_point: int) -> np.ndarray:
    """DPURound(x * 2**fix_point) saturated to int8 for float32 `x`, equal to `dpu_round` of the float64 product
    for every float32 input, without a float64 copy (the pipeline's wire and the runner's input quantization
    spend most of their host time there: 34 ms for 802,816 elements through float64).

    Why it is exact: scaling by a power of two is exact in float32 (an overflow saturates anyway, an underflow
    leaves |y| < 0.5); clamping to [-129, 128] first cannot change the saturated result; f = floor(y) is exact and
    so is y - f (both in one binade or f = 0, Sterbenz; for y in (-1, 0) the rounded 1 + y is >= 0.5 exactly
    when y >= -0.5, since rounding is monotonic and 0.5 is a float); so f + (y - f >= 0.5) is floor(y + 0.5).
    """
    with np.errstate(over="ignore"):  # an overflow saturates below
        y = np.multiply(x, np.float32(2.0 ** fix_point), dtype=np.float32)
    np.clip(y, -129.0, 128.0, out=y)
    f = np.floor(y)
    y -= f
    f += y >= 0.5
    np.clip(f, INT8_MIN, INT8_MAX, out=f)
    return f.astype(np.int8)


def dpu_round(t: np.ndarray) -> np.ndarray:
    """DPURound of real values: floor(t + 0.5), then saturate to int8.

    For dyadic rationals (every value the DPU produces except the float avg-pool sum) this is exact in float64
    as long as |t| < 2**52.
    """
    return saturate_int8(np.floor(np.asarray(t, dtype=np.float64) + 0.5))


def avgpool_factor(kh: int, kw: int) -> tuple[int, int]:
    """(multiplier, shift) with multiplier / 2**shift ~ 1 / (kh*kw), as the DPU's average pool applies it.

    Table values from dpu-facts.md: 3x3 -> 7/64, 5x5 -> 10/256, 6x6 -> 7/256, 7x7 -> 21/1024, 14x14 -> 21/4096;
    exact for powers of two; otherwise the shift s < ceil(log2(128 k)) minimising |round(2**s / k) / 2**s - 1/k|.
    """
    k = kh * kw
    if k <= 0:
        raise ValueError(f"avg pool window {kh}x{kw} is empty")
    table = {9: (7, 6), 25: (10, 8), 36: (7, 8), 49: (21, 10), 196: (21, 12)}
    if k in table:
        return table[k]
    if k & (k - 1) == 0:
        return 1, k.bit_length() - 1
    best: tuple[float, int, int] | None = None
    for s in range(0, math.ceil(math.log2(128 * k))):
        m = round((1 << s) / k)
        if m == 0 or m > INT8_MAX:
            continue
        err = abs(m / (1 << s) - 1 / k)
        if best is None or err < best[0]:
            best = (err, m, s)
    assert best is not None
    return best[1], best[2]
