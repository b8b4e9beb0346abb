"""DDR layout of feature maps and parameters, as the LOAD/SAVE instructions address them.

Feature maps are int8 NHWC in DDR (isa1-semantics.md 4: the runtime copies tensors in and out NHWC): byte
(y, x, c) of a map lives at `offset + y*row_pitch + x*pixel_pitch + c` in the region of base-address register
`reg_id`. A map may be a channel slice of a wider map (pixel_pitch > c): that is how a concat costs nothing,
its producers simply save into their slice. `FMap` and the region numbering (REG_*) are leaf data types in
tvm_dpu.types; this module holds the alignment rule and the packing of parameters in bank order.
"""
from __future__ import annotations

import numpy as np

#: DDR allocations are aligned so every tensor starts on an AXI beat (16 bytes).
DDR_ALIGN = 16


def align(n: int, a: int = DDR_ALIGN) -> int:
    return (n + a - 1) // a * a


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def group_param(tensor: str, group: int) -> str:
    """The ParamBlob.offsets key of group `group`'s packed slice of constant `tensor` (a grouped conv packs each
    group's bias and weights side by side, so the tensor as a whole has no one contiguous place)."""
    return f"{tensor}#group{group}"


class ParamBlob:
    """The REG_PARAMS region of a subgraph under construction: packed parameters appended at aligned offsets.
    With `keep=False` only the offsets are tracked and `blob()` is zeros: the code is the same, for programs
    compiled only to be timed (the fusion and variant comparisons), which then hold no copy of the weights."""

    def __init__(self, keep: bool = True) -> None:
        self.chunks: list[np.ndarray] = []
        self.size = 0
        self.keep = keep
        self.offsets: dict[str, int] = {}  # constant tensor -> offset of its first packed bytes

    def add(self, data: np.ndarray, tensor: str = "") -> int:
        """Append int8 `data` (AXI-beat aligned), the packed bytes of constant `tensor` if named; returns its byte
        offset in the region."""
        off = self.size
        if tensor:
            self.offsets.setdefault(tensor, off)
        b = np.asarray(data, dtype=np.int8).view(np.uint8).ravel()
        pad = align(len(b)) - len(b)
        if self.keep:
            self.chunks.append(b)
            if pad:
                self.chunks.append(np.zeros(pad, dtype=np.uint8))
        self.size += len(b) + pad
        return off

    def blob(self) -> np.ndarray:
        """The region's bytes. Each chunk is released as soon as it is copied (VGG-16's weights are 140 MB: the
        chunks and the blob are never both whole); the blob is kept, so later calls return it again."""
        if not self.keep:
            return np.zeros(self.size, dtype=np.uint8)  # calloc'd: no resident pages
        if self.chunks or not hasattr(self, "_blob"):
            if hasattr(self, "_blob"):  # chunks added after an earlier blob() follow it
                self.chunks.insert(0, self._blob)
            out = np.empty(self.size, dtype=np.uint8)
            end = self.size
            while self.chunks:
                c = self.chunks.pop()
                out[end - len(c):end] = c
                end -= len(c)
            self._blob = out
        return self._blob


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
