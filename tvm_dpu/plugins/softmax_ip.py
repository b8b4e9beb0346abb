"""Example plugin shipped with tvm-dpu: a fixed-point softmax IP for classifier heads (the DPU has no softmax).

It claims every Softmax over the last axis of a 2-D tensor (N, C): the end of a classifier network.

Arithmetic (one definition, which the numpy reference `ref` and the IP emulator `sim` implement independently and
must agree on bit for bit):

1. The input is quantized to int8 with the fix_point f chosen at compile time from the calibration inputs (the
   largest power of two that keeps max |x| inside int8): q = DPURound(x * 2^f), saturated to [-128, 127].
2. Per row: m = max(q); d_i = m - q_i, in [0, 255].
3. e_i = LUT[d_i] with LUT[k] = round(2^15 * exp(-k * 2^-f)), a 256-entry table of uint16 computed at compile time
   (the IP's only parameter memory); e_i <= 2^15.
4. S = sum_i e_i (a 32-bit accumulator; S >= 2^15 since the maximum contributes LUT[0] = 2^15).
5. y_i = floor((e_i * 2^15 + floor(S / 2)) / S): round-half-up division, y_i in [0, 2^15].
6. The output is y_i * 2^-15 (Q15 probabilities).

`sim` models the IP as hardware would run it: one element per step through a max register, the LUT port and the
accumulator, then a restoring (shift-subtract) divider producing one quotient bit per cycle. `run` drives the IP
through the pynq API (register map below); without a board it is not exercised.

Register map of the IP (AXI-Lite, offsets in bytes): 0x00 control (bit 0 start, bit 1 done), 0x10 input
buffer address (int8, N*C), 0x18 LUT address (uint16 x 256), 0x20 output address (uint16, N*C), 0x28 C, 0x30 N.
"""
from __future__ import annotations

import struct

import numpy as np

from tvm_dpu.plugins.api import Plugin, PluginError, PluginGraph, PluginSubgraph
from tvm_dpu.plugins.registry import register_plugin
from tvm_dpu.quant.fixpoint import dpu_round

_HEADER = struct.Struct("<4sbxxxI")  # magic, fix_point, channels
_MAGIC = b"SMX1"
LUT_SIZE = 256
Q = 15  # output and LUT fraction bits


def make_lut(fix_point: int) -> np.ndarray:
    k = np.arange(LUT_SIZE, dtype=np.float64)
    return np.round((1 << Q) * np.exp(-k * 2.0 ** -fix_point)).astype(np.uint16)


def input_fix_point(max_abs: float) -> int:
    """The largest f with max_abs * 2^f <= 127, within [-8, 12] (a zero input gets 12)."""
    if not np.isfinite(max_abs) or max_abs <= 0:
        return 12
    return int(np.clip(np.floor(np.log2(127.0 / max_abs)), -8, 12))


def _parse(payload: bytes) -> tuple[int, int, np.ndarray]:
    if len(payload) != _HEADER.size + 2 * LUT_SIZE:
        raise PluginError(f"softmax_ip: payload of {len(payload)} bytes, expected {_HEADER.size + 2 * LUT_SIZE}")
    magic, fp, channels = _HEADER.unpack_from(payload, 0)
    if magic != _MAGIC:
        raise PluginError("softmax_ip: not a softmax_ip payload")
    return fp, channels, np.frombuffer(payload, dtype="<u2", offset=_HEADER.size).copy()


def _quantized_rows(x: np.ndarray, fp: int, channels: int) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    if x.shape[-1] != channels:
        raise PluginError(f"softmax_ip: input has {x.shape[-1]} channels, the subgraph was compiled for {channels}")
    return dpu_round(x.astype(np.float64) * 2.0 ** fp).reshape(-1, channels)


@register_plugin
class SoftmaxIP(Plugin):
    name = "softmax_ip"
    device = "softmax_ip"
    version = "1"

    def partition(self, graph: PluginGraph):
        return [op for op in graph.filter_by_type("Softmax", "relax.nn.softmax")
                if len(op.input_shapes) == 1 and len(op.input_shapes[0]) == 2
                and op.attrs.get("axis") in (-1, 1)]

    def float_reference(self, subgraph: PluginSubgraph, inputs: list[np.ndarray]) -> list[np.ndarray]:
        x = np.asarray(inputs[0], dtype=np.float64)
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return [(e / e.sum(axis=-1, keepdims=True)).astype(np.float32)]

    def compile(self, subgraph: PluginSubgraph, calibration: list[list[np.ndarray]]) -> bytes:
        if [op.op for op in subgraph.ops] != ["relax.nn.softmax"]:
            raise PluginError(f"softmax_ip compiles a single softmax, got {[op.op for op in subgraph.ops]}")
        channels = int(subgraph.input_shapes[0][-1])
        max_abs = max((float(np.max(np.abs(s[0]))) for s in calibration), default=0.0)
        fp = input_fix_point(max_abs)
        return _HEADER.pack(_MAGIC, fp, channels) + make_lut(fp).astype("<u2").tobytes()

    def ref(self, payload: bytes, inputs: list[np.ndarray]) -> list[np.ndarray]:
        fp, channels, lut = _parse(payload)
        q = _quantized_rows(inputs[0], fp, channels).astype(np.int32)
        d = q.max(axis=1, keepdims=True) - q
        e = lut[d].astype(np.uint64)
        s = e.sum(axis=1, keepdims=True)
        y = (e * (1 << Q) + s // 2) // s
        return [(y.astype(np.float32) * np.float32(2.0 ** -Q)).reshape(np.shape(inputs[0]))]

    def sim(self, payload: bytes, inputs: list[np.ndarray]) -> list[np.ndarray]:
        fp, channels, lut = _parse(payload)
        rows = _quantized_rows(inputs[0], fp, channels)
        out = np.zeros(rows.shape, dtype=np.uint32)
        for r, row in enumerate(rows.tolist()):
            mx = -128
            for v in row:  # pass 1: the max register
                mx = v if v > mx else mx
            acc = 0
            es = []
            for v in row:  # pass 2: LUT port and 32-bit accumulator
                e = int(lut[mx - v])
                es.append(e)
                acc = (acc + e) & 0xFFFFFFFF
            for i, e in enumerate(es):  # pass 3: restoring divider, one quotient bit per cycle
                num = (e << Q) + (acc >> 1)
                rem, quo = 0, 0
                for bit in range(47, -1, -1):
                    rem = (rem << 1) | ((num >> bit) & 1)
                    quo <<= 1
                    if rem >= acc:
                        rem -= acc
                        quo |= 1
                out[r, i] = quo
        return [(out.astype(np.float32) * np.float32(2.0 ** -Q)).reshape(np.shape(inputs[0]))]

    def run(self, payload: bytes, inputs: list[np.ndarray]) -> list[np.ndarray]:
        return [SoftmaxIPDriver.default().run(payload, inputs[0])]


class SoftmaxIPDriver:
    """The softmax IP on a Pynq board (pynq's Overlay / allocate / MMIO API; the IP named `ip_name` in the
    overlay). Needs a bitstream that contains the IP: set TVM_DPU_SOFTMAX_BITFILE."""

    _instance: "SoftmaxIPDriver | None" = None

    def __init__(self, bitfile: str, ip_name: str = "softmax_ip_0", timeout_s: float = 1.0):
        try:
            import pynq
        except ImportError:
            raise PluginError("softmax_ip 'run' needs the pynq package on the board (pip install pynq)") from None
        self.pynq = pynq
        self.overlay = pynq.Overlay(bitfile)
        if ip_name not in self.overlay.ip_dict:
            raise PluginError(f"softmax_ip: the overlay {bitfile} has no IP {ip_name!r}")
        self.mmio = pynq.MMIO(self.overlay.ip_dict[ip_name]["phys_addr"], 0x40)
        self.timeout_s = timeout_s

    @classmethod
    def default(cls) -> "SoftmaxIPDriver":
        import os

        if cls._instance is None:
            bitfile = os.environ.get("TVM_DPU_SOFTMAX_BITFILE")
            if not bitfile:
                raise PluginError("softmax_ip 'run': set TVM_DPU_SOFTMAX_BITFILE to the bitstream with the IP")
            cls._instance = cls(bitfile)
        return cls._instance

    def run(self, payload: bytes, x: np.ndarray) -> np.ndarray:
        import time

        fp, channels, lut = _parse(payload)
        rows = _quantized_rows(x, fp, channels)
        n = rows.shape[0]
        inp = self.pynq.allocate((n * channels,), dtype=np.int8)
        tab = self.pynq.allocate((LUT_SIZE,), dtype=np.uint16)
        out = self.pynq.allocate((n * channels,), dtype=np.uint16)
        try:
            inp[:] = rows.reshape(-1)
            tab[:] = lut
            inp.flush()
            tab.flush()
            for off, buf in ((0x10, inp), (0x18, tab), (0x20, out)):
                self.mmio.write(off, int(buf.physical_address) & 0xFFFFFFFF)
                self.mmio.write(off + 4, int(buf.physical_address) >> 32)
            self.mmio.write(0x28, channels)
            self.mmio.write(0x30, n)
            self.mmio.write(0x00, 1)
            deadline = time.monotonic() + self.timeout_s
            while not self.mmio.read(0x00) & 2:
                if time.monotonic() > deadline:
                    raise PluginError(f"softmax_ip did not finish within {self.timeout_s} s")
            out.invalidate()
            return (np.asarray(out, dtype=np.float32) * np.float32(2.0 ** -Q)).reshape(np.shape(x))
        finally:
            for b in (inp, tab, out):
                b.freebuffer()
