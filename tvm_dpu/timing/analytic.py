"""Fast analytic latency estimate per layer from an XGraph: DNNVM's cost model (arXiv version, Eq. 1-10).

For each op: Acomp (Eq. 1, 2*MACs), the tiled data exchange Aac = alpha_in*beta_in + alpha_p*beta_p +
alpha_o*beta_out (Eq. 2-8) with the tile <Tw, Th, Tic, Toc> our code generator picks (codegen.tiling.conv_tile), and
CTC = Acomp / Aac (Eq. 9). The layer's cycles are a roofline: max(compute cycles, transfer cycles), where compute
cycles count the engine's PP/ICP/OCP granularity (as cost.py) and transfer cycles move the LOAD bytes and the SAVE
bytes at the per-engine rate (one ICP-byte bank row per cycle, within the core's AXI/DDR rate). Layers run one
after another (no overlap between layers). Deviation from our schedule: Eq. 6 reloads parameters per spatial tile;
our code keeps a chunk of output-channel weights resident, so alpha_p = ceil(OC/Toc) here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tvm_dpu.arch import load_arch
from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.tiling import conv_tile
from tvm_dpu.timing.params import MachineModel, TimingParams, machine
from tvm_dpu.xgraph import ops as xops
from tvm_dpu.xgraph.graph import Graph, Op

_CONV = ("conv2d", "dense")


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def op_macs(op: Op, graph: Graph) -> int:
    """Multiply-accumulates of one op (conv2d, dense, depthwise_conv2d; 0 for the others)."""
    if op.type == "dense":
        o, c, h, w = xops.dense_weights_shape(op, graph)
        return int(o * c * h * w)
    if op.type in ("conv2d", "depthwise_conv2d"):
        wshape = graph.param(op, "weights").shape
        _, oc, oh, ow = graph.tensors[op.outputs[0]].shape
        per_out = int(np.prod(wshape[1:]))  # (ic/groups)*kh*kw; depthwise weights are (C, 1, kh, kw)
        return int(oc * oh * ow * per_out)
    return 0


def graph_ops(graph: Graph) -> float:
    """Acomp of the whole graph (Eq. 1): 2 x MACs of its conv-class ops."""
    return float(sum(2 * op_macs(op, graph) for op in graph.ops))


@dataclass
class LayerEstimate:
    """Analytic estimate of one op."""

    name: str
    type: str
    ops: float  # Acomp (Eq. 1)
    load_bytes: float  # alpha_in*beta_in + alpha_p*beta_p
    save_bytes: float  # alpha_o*beta_out
    compute_cycles: float
    transfer_cycles: float
    tile: tuple[int, int, int, int] | None = None  # (Tw, Th, Tic, Toc) for conv-class ops

    @property
    def cycles(self) -> float:
        return max(self.compute_cycles, self.transfer_cycles)

    @property
    def ctc(self) -> float:
        """Computation to communication ratio (Eq. 9), ops per byte."""
        acc = self.load_bytes + self.save_bytes
        return self.ops / acc if acc else float("inf")


@dataclass
class AnalyticResult:
    """Per-layer estimates and totals (layers back to back)."""

    arch: str
    freq_hz: float
    layers: list[LayerEstimate] = field(default_factory=list)

    @property
    def cycles(self) -> float:
        return sum(l.cycles for l in self.layers)

    @property
    def latency_s(self) -> float:
        return self.cycles / self.freq_hz

    @property
    def total_ops(self) -> float:
        return sum(l.ops for l in self.layers)

    @property
    def gops(self) -> float:
        return self.total_ops / self.latency_s / 1e9 if self.cycles else 0.0


def _transfer(m: MachineModel, load: float, save: float) -> float:
    per_engine = float(m.arch.icp) * m.params.dma_bank_rows_per_cycle  # bank side: ICP-byte rows per cycle
    total = m.dma_beats_per_cycle * m.axi_bytes
    return max(load / min(per_engine, total), save / min(per_engine, total), (load + save) / total)


def _conv_layer(m: MachineModel, op: Op, g: Graph) -> LayerEstimate:
    a, p = m.arch, m.params
    _, ic, ih, iw = g.tensors[op.inputs[0]].shape
    _, oc, oh, ow = g.tensors[op.outputs[0]].shape
    if op.type == "dense":
        kh, kw, sh, sw, pads = ih, iw, 1, 1, (0, 0, 0, 0)
    else:
        win = xops.conv_window(op, g)
        kh, kw, sh, sw, pads = win.kh, win.kw, win.sh, win.sw, win.pads
    cg_in, cg_out = _ceil(ic, a.icp), _ceil(oc, a.ocp)
    resident = max(1, min(cg_out, a.bank_depth // max(1, kh * kw * cg_in)))
    tile = conv_tile(a, ic, kh, kw, sh, sw, resident)
    vpp, tw, chunk = tile if tile is not None else (a.pp, ow, 1)
    tw = _ceil(ow, _ceil(ow, tw))  # the columns are split evenly (codegen split_even)
    th, toc, tic = min(vpp, oh), min(chunk * a.ocp, cg_out * a.ocp), ic
    trips = _ceil(ow, tw) * _ceil(oh, th)
    beta_in = tic * min(iw, (tw - 1) * sw + kw) * min(ih, (th - 1) * sh + kh)  # Eq. 3
    alpha_in = _ceil(oc, toc) * _ceil(ic, tic) * trips  # Eq. 4
    beta_p = (kw * kh * tic + 1) * toc  # Eq. 5
    alpha_p = _ceil(oc, toc)  # Eq. 6 with weights resident per output-channel chunk (our schedule)
    beta_out = toc * tw * th  # Eq. 7
    alpha_o = _ceil(oc, toc) * trips  # Eq. 8
    load = alpha_in * beta_in + min(alpha_p * beta_p, (kw * kh * ic + 1) * cg_out * a.ocp)
    save = min(alpha_o * beta_out, oc * oh * ow)
    compute = cg_out * trips * (kh * kw * cg_in * tw + p.conv_fill_cycles)
    return LayerEstimate(op.name, op.type, 2.0 * op_macs(op, g), load, save, compute, _transfer(m, load, save),
                         (tw, th, tic, toc))


def _alu_layer(m: MachineModel, op: Op, g: Graph) -> LayerEstimate:
    a, p = m.arch, m.params
    ins = [g.tensors[i].shape for i in op.inputs if i in g.tensors and len(g.tensors[i].shape) == 4]
    out = g.tensors[op.outputs[0]].shape
    _, c, oh, ow = out if len(out) == 4 else (1, int(np.prod(out[1:])), 1, 1)
    cg = _ceil(c, a.icp)
    load = float(sum(int(np.prod(s[1:])) for s in ins))
    save = float(c * oh * ow)
    taps, per_pixel = 1, 1
    if op.type in ("max_pool2d", "avg_pool2d", "depthwise_conv2d"):
        win = xops.conv_window(op, g) if op.type == "depthwise_conv2d" else xops.pool_window(op, g)
        taps = win.kh * win.kw
        if op.type == "depthwise_conv2d":
            load += c * (taps + 1)
    elif op.type in ("eltwise_add", "eltwise_mul"):
        per_pixel = _ceil(len(op.inputs), max(1, p.elew_inputs_per_cycle))
    elif op.type == "concat":
        # concat inputs saved straight into the output's channel slices cost nothing (codegen aliasing)
        load = save = 0.0
    rows = _ceil(oh, a.alu_pp)
    compute = 0.0 if op.type in ("concat", "upsample_nearest") else rows * (ow * taps * cg * per_pixel +
                                                                              p.alu_fill_cycles)
    return LayerEstimate(op.name, op.type, 2.0 * op_macs(op, g), load, save, compute, _transfer(m, load, save))


def analytic_estimate(graph: Graph, arch: Arch | str, params: TimingParams | None = None) -> AnalyticResult:
    """DNNVM-style analytic estimate of every op of a (quantized or float) XGraph on one core of `arch`."""
    m = machine(load_arch(arch), params)
    res = AnalyticResult(m.arch.name, m.freq_hz)
    for op in graph.ops:
        if op.type in _CONV:
            res.layers.append(_conv_layer(m, op, graph))
        else:
            res.layers.append(_alu_layer(m, op, graph))
    return res


def compare(analytic: AnalyticResult, sim: Any) -> dict[str, Any]:
    """Deviation of the analytic estimate from a simulator TimingResult with per-op timings (same op names):
    total relative deviation and per-layer (analytic cycles, simulated cycles)."""
    per_op = {o.name: o.cycles for o in getattr(sim, "ops", [])}
    rows = [{"name": l.name, "type": l.type, "analytic_cycles": l.cycles, "sim_cycles": per_op.get(l.name)}
            for l in analytic.layers]
    dev = (analytic.cycles - sim.cycles) / sim.cycles if sim.cycles else float("nan")
    return {"analytic_cycles": analytic.cycles, "sim_cycles": sim.cycles, "relative_deviation": dev, "layers": rows}
