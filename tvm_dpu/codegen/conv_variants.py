"""Transposed and dilated convolutions as sets of ordinary convolutions over strided DDR views (polyphase).

Neither the CONV engine nor the ALU has a dilation or an input-upsampling field, but both read and write feature
maps at any pixel / row pitch. So an op is split into phases, each an ordinary (undilated) conv whose input and
output are strided views of the real maps; the phases together write every output pixel exactly once.

Along one axis (the two axes are independent; a 2-D op has the product of their phases):

* Transposed conv, stride s, kernel K, pad_begin pb (dilation 1): output o = p + s*m with phase p in [0, s)
  receives the taps k = r + s*j, r = (p + pb) mod s, from input i = m + c - j, c = (p + pb - r) / s. That is
  a stride-1 correlation of x with the sub-kernel w[r::s] reversed (Kr = len(w[r::s]) taps), starting at input
  row m + c - Kr + 1. Output view: rows p, p + s, ... (pitch s * row_pitch).
* Dilated conv, stride s, dilation d, pad_begin pb: with g = gcd(s, d), the output phase p in [0, d/g) (o = p +
  (d/g)*m) reads input i = p*s - pb + d*((s/g)*m + k) = a + d*(q + (s/g)*m + k) where p*s - pb = d*q + a,
  0 <= a < d. That is an undilated conv with stride s/g over the input phase a (rows a, a + d, ...), starting at
  phase row q. Output view: rows p, p + d/g, ...

A window start before the view becomes top/left padding, one after it crops the input view instead; the
bottom/right padding follows from the view sizes. Outputs whose window holds only padding (transposed convs with
output_padding or kernel < stride, large pads) are not part of any phase conv: they equal act(bias) and are
listed apart (`Decomposition.bias_only`), so every phase conv needs at most kernel-1 padding per side.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from math import gcd

import numpy as np

from tvm_dpu.codegen.layout import ceil_div
from tvm_dpu.types import FMap
from tvm_dpu.codegen.tiling import CodegenError


@dataclass(frozen=True)
class AxisPhase:
    """One phase along one axis: output rows out0 + out_step*m (m < n_out) computed by an undilated conv with
    stride `stride` over the input phase (rows in0 + in_step*i, i < n_in), window m starting at phase row
    first + stride*m; its kernel is the taps `taps` of the op's kernel, reversed if `reverse`."""

    out0: int
    out_step: int
    n_out: int
    in0: int  # first input row of the input phase
    n_in: int  # rows in the input phase
    first: int  # window 0 starts at input-phase row `first` (negative = padding)
    stride: int
    taps: slice  # which kernel taps, in conv (correlation) order, e.g. slice(r, None, s) reversed
    reverse: bool


def transposed_axis(n_in: int, n_out: int, k: int, s: int, pad_begin: int) -> list[AxisPhase]:
    """Phases of a stride-s transposed conv along one axis (module docstring)."""
    phases = []
    for p in range(min(s, n_out)):
        r = (p + pad_begin) % s
        kr = len(range(r, k, s))
        c = (p + pad_begin - r) // s
        phases.append(AxisPhase(p, s, ceil_div(n_out - p, s), 0, n_in, c - kr + 1, 1, slice(r, None, s), True))
    return phases


def dilated_axis(n_in: int, n_out: int, s: int, d: int, pad_begin: int) -> list[AxisPhase]:
    """Phases of a conv with stride s and dilation d along one axis (module docstring)."""
    g = gcd(s, d)
    period, s2 = d // g, s // g
    phases = []
    for p in range(min(period, n_out)):
        q, a = divmod(p * s - pad_begin, d)
        phases.append(AxisPhase(p, period, ceil_div(n_out - p, period), a, ceil_div(n_in - a, d), q, s2,
                                slice(None), False))
    return phases


@dataclass(frozen=True)
class Phase2D:
    """One ordinary conv of a decomposed op: its input / output views, window and (sub-)kernel."""

    x: FMap
    y: FMap
    pads: tuple[int, int, int, int]  # top, left, bottom, right
    strides: tuple[int, int]
    weights: np.ndarray  # kernel in correlation order, same axes layout as given


@dataclass(frozen=True)
class Decomposition:
    """The phases of an op, plus the output views whose windows hold only padding (output = act(bias))."""

    phases: list[Phase2D]
    bias_only: list[FMap]


def _core(ph: AxisPhase, n_taps: int) -> tuple[int, int]:
    """[m_lo, m_hi) of the outputs whose window overlaps the input phase (the others read only padding)."""
    if n_taps == 0:
        return 0, 0
    m_lo = max(0, -((ph.first + n_taps - 1) // ph.stride))  # first + stride*m + taps > 0
    m_hi = min(ph.n_out, ceil_div(ph.n_in - ph.first, ph.stride))  # first + stride*m < n_in
    return m_lo, max(m_lo, m_hi)


def _axis_view(ph: AxisPhase, m_lo: int, m_hi: int, n_taps: int, what: str) -> tuple[int, int, int, int]:
    """(first input-phase row of the view, rows in view, pad_begin, pad_end) of outputs [m_lo, m_hi)."""
    start = ph.first + ph.stride * m_lo
    end = ph.first + ph.stride * (m_hi - 1) + n_taps  # exclusive, in input-phase rows
    lo, hi = max(0, start), min(ph.n_in, end)
    pad_begin, pad_end = lo - start, end - hi
    if pad_begin > n_taps - 1 or pad_end > n_taps - 1:  # cannot happen for windows that overlap the input
        raise CodegenError(f"{what}: an output phase needs padding {pad_begin}/{pad_end} beyond its "
                           f"{n_taps}-tap kernel")
    return lo, hi - lo, pad_begin, pad_end


def _out_view(y: FMap, rp: AxisPhase, cp: AxisPhase, rows: tuple[int, int], cols: tuple[int, int]) -> FMap:
    return replace(y, offset=y.addr(rp.out0 + rp.out_step * rows[0], cp.out0 + cp.out_step * cols[0]),
                   h=rows[1] - rows[0], w=cols[1] - cols[0], row_pitch=y.row_pitch * rp.out_step,
                   pixel_pitch=y.pixel_pitch * cp.out_step)


def split(x: FMap, y: FMap, w: np.ndarray, rows: list[AxisPhase], cols: list[AxisPhase], in_step: tuple[int, int],
          what: str) -> Decomposition:
    """The 2-D phases of an op from its per-axis phases; `w` is (..., kh, kw), `in_step` the (row, col) pitch of
    the input phases in input pixels (dilation, or 1)."""
    phases, fills = [], []
    for rp in rows:
        for cp in cols:
            wp = w[..., rp.taps, :][..., cp.taps]
            if rp.reverse:
                wp = wp[..., ::-1, :]
            if cp.reverse:
                wp = wp[..., ::-1]
            kh, kw = wp.shape[-2], wp.shape[-1]
            (r_lo, r_hi), (c_lo, c_hi) = _core(rp, kh), _core(cp, kw)
            # the outputs outside the core rectangle: full-width strips above / below, side strips beside it
            strips = [((0, r_lo), (0, cp.n_out)), ((r_hi, rp.n_out), (0, cp.n_out)),
                      ((r_lo, r_hi), (0, c_lo)), ((r_lo, r_hi), (c_hi, cp.n_out))]
            if r_hi == r_lo or c_hi == c_lo:
                strips = [((0, rp.n_out), (0, cp.n_out))]
            fills += [_out_view(y, rp, cp, r, c) for r, c in strips if r[1] > r[0] and c[1] > c[0]]
            if r_hi == r_lo or c_hi == c_lo:
                continue
            r0, nh, pt, pb = _axis_view(rp, r_lo, r_hi, kh, what)
            c0, nw, pl, pr = _axis_view(cp, c_lo, c_hi, kw, what)
            xv = replace(x, offset=x.addr(rp.in0 + in_step[0] * r0, cp.in0 + in_step[1] * c0), h=nh, w=nw,
                         row_pitch=x.row_pitch * in_step[0], pixel_pitch=x.pixel_pitch * in_step[1])
            phases.append(Phase2D(xv, _out_view(y, rp, cp, (r_lo, r_hi), (c_lo, c_hi)), (pt, pl, pb, pr),
                                  (rp.stride, cp.stride), np.ascontiguousarray(wp)))
    return Decomposition(phases, fills)


def transposed_phases(x: FMap, y: FMap, w_oihw: np.ndarray, strides: tuple[int, int],
                      pads: tuple[int, int, int, int], what: str) -> Decomposition:
    """Phases of a transposed conv (dilation 1) whose kernel is given in conv layout (O, I, kh, kw), unflipped
    (w_oihw[o, i] = transposed weight[i, o]); each phase's kernel comes back flipped, ready for a correlation."""
    sh, sw = strides
    kh, kw = w_oihw.shape[-2:]
    rows = transposed_axis(x.h, y.h, kh, sh, pads[0])
    cols = transposed_axis(x.w, y.w, kw, sw, pads[1])
    return split(x, y, w_oihw, rows, cols, (1, 1), what)


def dilated_phases(x: FMap, y: FMap, w: np.ndarray, strides: tuple[int, int], dilations: tuple[int, int],
                   pads: tuple[int, int, int, int], what: str) -> Decomposition:
    """Phases of a dilated conv / depthwise conv; every phase keeps the whole kernel."""
    rows = dilated_axis(x.h, y.h, strides[0], dilations[0], pads[0])
    cols = dilated_axis(x.w, y.w, strides[1], dilations[1], pads[1])
    return split(x, y, w, rows, cols, dilations, what)
