"""DDR layout of feature maps and parameters, as the LOAD/SAVE instructions address them.

Feature maps are int8 NHWC in DDR (isa1-semantics.md 4: the runtime copies tensors in and out NHWC): byte
(y, x, c) of a map lives at `offset + y*row_pitch + x*pixel_pitch + c` in the region of base-address register
`reg_id`. A map may be a channel slice of a wider map (pixel_pitch > c): that is how a concat costs nothing,
its producers simply save into their slice.

Register assignment of a compiled subgraph (data, fixed for the whole project):
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

#: reg_id of each DDR region of a compiled DPU subgraph.
REG_PARAMS = 0  # weights, biases, slopes (constant, laid out in bank order)
REG_WORK = 1  # intermediate feature maps (liveness-reused)
REG_INPUT = 2  # subgraph inputs
REG_OUTPUT = 3  # subgraph outputs
REGION_NAMES = {REG_PARAMS: "params", REG_WORK: "workspace", REG_INPUT: "input", REG_OUTPUT: "output"}

#: DDR allocations are aligned so every tensor starts on an AXI beat (16 bytes).
DDR_ALIGN = 16


def align(n: int, a: int = DDR_ALIGN) -> int:
    return (n + a - 1) // a * a


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class FMap:
    """An int8 NHWC feature map (batch 1) in a DDR region."""

    reg_id: int
    offset: int
    h: int
    w: int
    c: int
    pixel_pitch: int
    row_pitch: int

    @staticmethod
    def dense(reg_id: int, offset: int, h: int, w: int, c: int) -> "FMap":
        return FMap(reg_id, offset, h, w, c, c, w * c)

    def addr(self, y: int, x: int, c: int = 0) -> int:
        return self.offset + y * self.row_pitch + x * self.pixel_pitch + c

    @property
    def nbytes(self) -> int:
        """Extent in bytes from the first to one past the last byte of the map."""
        return (self.h - 1) * self.row_pitch + (self.w - 1) * self.pixel_pitch + self.c

    def channels(self, c0: int, c: int) -> "FMap":
        """The view of channels [c0, c0 + c)."""
        return replace(self, offset=self.offset + c0, c=c)

    def to_ddr(self, region: np.ndarray, nchw: np.ndarray) -> None:
        """Write an int8 (1, C, H, W) array into `region` at this map's place."""
        t = np.ascontiguousarray(np.asarray(nchw, dtype=np.int8).reshape(self.c, self.h, self.w).transpose(1, 2, 0))
        view = self._view(region)
        view[...] = t.view(np.uint8)

    def from_ddr(self, region: np.ndarray) -> np.ndarray:
        """Read this map out of `region` as an int8 (1, C, H, W) array."""
        return self._view(region).view(np.int8).transpose(2, 0, 1)[None].copy()

    def _view(self, region: np.ndarray) -> np.ndarray:
        # as_strided trusts its arguments: a map reaching past its region would read or write foreign memory.
        if self.offset < 0 or min(self.h, self.w, self.c) < 1 or self.pixel_pitch < self.c or \
                self.row_pitch < (self.w - 1) * self.pixel_pitch + self.c or \
                self.offset + self.nbytes > region.size:
            raise ValueError(f"feature map {self} does not lie inside its DDR region of {region.size} bytes")
        return np.lib.stride_tricks.as_strided(region[self.offset:], shape=(self.h, self.w, self.c),
                                               strides=(self.row_pitch, self.pixel_pitch, 1), writeable=True)


def pack_conv_weights(w_oihw: np.ndarray, icp: int, ocp: int) -> np.ndarray:
    """CONVW bank order: [o_local < OCP][group][kh][kw][cg*ICP], zero padded (isa1-semantics.md 3.4).

    Bank o of output-channel group g holds output channel g*OCP + o; within it, kernel tap (i, j) occupies cg
    rows of ICP input channels. Keeping all groups of one bank contiguous lets one LOAD per bank fill every
    resident group.
    """
    o, ci, kh, kw = w_oihw.shape
    cg_in = ceil_div(ci, icp)
    cg_out = ceil_div(o, ocp)
    buf = np.zeros((cg_out * ocp, kh, kw, cg_in * icp), dtype=np.int8)
    buf[:o, :, :, :ci] = np.asarray(w_oihw, dtype=np.int8).transpose(0, 2, 3, 1)
    # [g][o_local] -> [o_local][g]
    buf = buf.reshape(cg_out, ocp, kh, kw, cg_in * icp).transpose(1, 0, 2, 3, 4)
    return np.ascontiguousarray(buf).reshape(-1)


def pack_channel_vector(v: np.ndarray, width: int) -> np.ndarray:
    """A per-channel int8 vector (bias, slope) zero padded to whole bank rows of `width` bytes."""
    n = ceil_div(len(v), width) * width
    out = np.zeros(n, dtype=np.int8)
    out[: len(v)] = np.asarray(v, dtype=np.int8)
    return out


def pack_dw_weights(w_c1hw: np.ndarray, cp: int) -> np.ndarray:
    """DWCONVW order for ALU dwconv with kernel_d = 1: [kh][kw][cg*CP] (tap (i, j) at row (i*kw + j)*cg)."""
    c, _, kh, kw = w_c1hw.shape
    cg = ceil_div(c, cp)
    buf = np.zeros((kh, kw, cg * cp), dtype=np.int8)
    buf[:, :, :c] = np.asarray(w_c1hw, dtype=np.int8)[:, 0].transpose(1, 2, 0)
    return buf.reshape(-1)
