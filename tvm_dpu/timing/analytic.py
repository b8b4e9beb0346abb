"""The analytic DNNVM cost model (arXiv version, Eq. 1-10), at two granularities, over `types.LayerDesc`.

Both views read an op through `LayerDesc` (built from the XGraph by `xgraph.ops.layer_desc`), so this module needs
no XGraph; every number comes from the arch (PP, ICP, OCP, ALU_PP, bank depth, clock, DDR bandwidth) and the
timing parameters.

Per layer (`analytic_estimate`, for reports and the comparison with the simulator): for each op, Acomp (Eq. 1,
2*MACs), the tiled data exchange Aac = alpha_in*beta_in + alpha_p*beta_p + alpha_o*beta_out (Eq. 2-8) with the
tile <Tw, Th, Tic, Toc> our code generator picks (codegen.tiling.conv_tile), and CTC = Acomp / Aac (Eq. 9). The
layer's cycles are a roofline: max(compute cycles, transfer cycles), where compute cycles count the engine's
PP/ICP/OCP granularity (as cost.py) and transfer cycles move the LOAD bytes and the SAVE bytes at the per-engine
rate (one ICP-byte bank row per cycle, within the core's AXI/DDR rate). Layers run one after another (no overlap
between layers). Deviation from our schedule: Eq. 6 reloads parameters per spatial tile; our code keeps a chunk of
output-channel weights resident, so alpha_p = ceil(OC/Toc) here.

Per group (`group_cycles`, the cost the fusion search ranks candidates with; fast enough for the whole
ResNet-152 search to stay well under 0.5 s):

* DDR traffic of the group: its external input feature maps (a map read by several members is loaded once:
  horizontal fusion; a conv reloads its input once per chunk of resident output-channel groups), all weights and
  biases, and the external outputs (maps consumed outside the group or graph outputs). Intermediates of a fused
  group never touch DDR. Cycles = bytes / (ddr_bytes_per_s / clock).
* Engine cycles: CONV = ceil(ic/ICP) * ceil(oc/OCP) * ceil(H/PP) * W * kh * kw; MISC (pool, depthwise, eltwise) =
  ceil(c/ICP) * ceil(H/ALU_PP) * W * taps (eltwise: number of operands).
* A group runs its engines concurrently (LOAD/SAVE, CONV and MISC overlap through double buffering), so its time
  is max(DDR, CONV, MISC) plus a pipeline fill: a fixed DDR latency plus one tile's share of that time. Ops run
  alone pay that per op; that is what fusion saves, together with the intermediate traffic. DDR_LATENCY is the
  only constant.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tvm_dpu.arch import load_arch
from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.tiling import conv_tile
from tvm_dpu.ops import hook as op_hook
from tvm_dpu.ops import kinds as op_kinds
from tvm_dpu.templates import hook as template_hook
from tvm_dpu.timing.params import MachineModel, TimingParams, machine
from tvm_dpu.types import LayerDesc

#: Cycles from a LOAD's request to its first data (AXI + DDR controller), paid once per op/group pipeline.
DDR_LATENCY = 200


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def graph_ops(layers: Sequence[LayerDesc]) -> float:
    """Acomp of a graph (Eq. 1): 2 x MACs of its conv-class ops."""
    return float(sum(2 * layer.macs for layer in layers))


# -- per layer ------------------------------------------------------------------------------------------------
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


def conv_layer(m: MachineModel, op: LayerDesc) -> LayerEstimate:
    """Estimate of a CONV-engine op (conv2d, dense): the DNNVM tiling model (Eqs. 3-8)."""
    a, p = m.arch, m.params
    _, ic, ih, iw = op.inputs[0].shape
    _, oc, oh, ow = op.outputs[0].shape
    # a grouped conv2d runs as `g` independent group convs (codegen.compiler._emit_conv_op): cost one, times g
    g = op.groups if op.type == "conv2d" and op.groups > 1 else 1
    ic, oc = ic // g, oc // g
    kh, kw, sh, sw = op.window
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
    load, save, compute = g * load, g * save, g * compute
    return LayerEstimate(op.name, op.type, 2.0 * op.macs, load, save, compute, _transfer(m, load, save),
                         (tw, th, tic, toc))


def _pass_layer(m: MachineModel, op: LayerDesc, taps: int = 1, per_pixel: int = 1, extra_load: float = 0.0,
                moves: bool = True, computes: bool = True) -> LayerEstimate:
    """One pass over an ALU / ELEW / copy op's output rows: `taps` window positions and `per_pixel` input reads per
    output pixel; `moves` False when the op's bytes are never loaded or saved (aliased), `computes` False when no
    engine computes it (a copy)."""
    a, p = m.arch, m.params
    ins = [t.shape for t in op.inputs if len(t.shape) == 4]
    out = op.outputs[0].shape
    _, c, oh, ow = out if len(out) == 4 else (1, int(np.prod(out[1:])), 1, 1)
    load = float(sum(int(np.prod(s[1:])) for s in ins)) + extra_load if moves else 0.0
    save = float(c * oh * ow) if moves else 0.0
    compute = _ceil(oh, a.alu_pp) * (ow * taps * _ceil(c, a.icp) * per_pixel + p.alu_fill_cycles) if computes else 0.0
    return LayerEstimate(op.name, op.type, 2.0 * op.macs, load, save, compute, _transfer(m, load, save))


def alu_layer(m: MachineModel, op: LayerDesc) -> LayerEstimate:
    """Estimate of an op the ALU runs in one pass of one tap per pixel (activations, a plugin's kinds)."""
    return _pass_layer(m, op)


def window_layer(m: MachineModel, op: LayerDesc) -> LayerEstimate:
    """A pool on the ALU: one pass with kh*kw taps per output pixel."""
    return _pass_layer(m, op, taps=op.window[0] * op.window[1])


def depthwise_layer(m: MachineModel, op: LayerDesc) -> LayerEstimate:
    """A depthwise conv on the ALU: a pool's pass plus its per-channel weights and bias."""
    taps = op.window[0] * op.window[1]
    return _pass_layer(m, op, taps=taps, extra_load=float(op.outputs[0].chw[0] * (taps + 1)))


def elew_layer(m: MachineModel, op: LayerDesc) -> LayerEstimate:
    """An element-wise op: each output pixel reads its inputs, `elew_inputs_per_cycle` at a time."""
    return _pass_layer(m, op, per_pixel=_ceil(len(op.inputs), max(1, m.params.elew_inputs_per_cycle)))


def concat_layer(m: MachineModel, op: LayerDesc) -> LayerEstimate:
    """concat inputs saved straight into the output's channel slices cost nothing (codegen aliasing)."""
    return _pass_layer(m, op, moves=False, computes=False)


def copy_layer(m: MachineModel, op: LayerDesc) -> LayerEstimate:
    """A data-movement op (nearest upsampling): its LOAD and SAVE, no compute."""
    return _pass_layer(m, op, computes=False)


def analytic_estimate(layers: Sequence[LayerDesc], arch: Arch | str,
                      params: TimingParams | None = None) -> AnalyticResult:
    """DNNVM-style analytic estimate of every op of a graph (`xgraph.ops.layer_descs(graph)`, quantized or
    float) on one core of `arch`."""
    m = machine(load_arch(arch), params)
    res = AnalyticResult(m.arch.name, m.freq_hz)
    for op in layers:
        # each kind's `cost` hook (tvm_dpu/ops/); a layer of a kind the registry lacks (a plugin's) is costed as
        # one pass over its rows
        cost = op_hook(op.type, "cost") if op.type in op_kinds() else alu_layer
        res.layers.append(cost(m, op))
    return res


def compare(analytic: AnalyticResult, sim: Any) -> dict[str, Any]:
    """Deviation of the analytic estimate from a simulator TimingResult with per-op timings (same op names):
    total relative deviation and per-layer (analytic cycles, simulated cycles)."""
    per_op = {o.name: o.cycles for o in getattr(sim, "ops", [])}
    rows = [{"name": l.name, "type": l.type, "analytic_cycles": l.cycles, "sim_cycles": per_op.get(l.name)}
            for l in analytic.layers]
    dev = (analytic.cycles - sim.cycles) / sim.cycles if sim.cycles else float("nan")
    return {"analytic_cycles": analytic.cycles, "sim_cycles": sim.cycles, "relative_deviation": dev, "layers": rows}


# -- per fused group ------------------------------------------------------------------------------------------
def ddr_bytes_per_cycle(arch: Arch) -> float:
    return arch.ddr_bytes_per_s / (arch.freq_mhz * 1e6)


def weight_rows(op: LayerDesc, arch: Arch) -> tuple[int, int]:
    """(CONVW rows per output-channel group, output-channel groups) of a CONV-engine op."""
    kh, kw, _, _ = op.window
    return kh * kw * _ceil(op.inputs[0].chw[0], arch.icp), _ceil(op.outputs[0].chw[0], arch.ocp)


@dataclass
class _Work:
    conv: float = 0.0
    misc: float = 0.0
    weights: int = 0
    reload: int = 1  # how many times the op reads its input


def conv_work(op: LayerDesc, arch: Arch) -> _Work:
    """A CONV-engine op in a fused group: its MACs per cycle, its weights, and how often the input is re-read
    (once per block of output-channel groups whose weights fit a bank)."""
    kh, kw, _, _ = op.window
    c_out, h, w = op.outputs[0].chw
    cin = op.inputs[0].chw[0]
    rows, cg_out = weight_rows(op, arch)
    return _Work(conv=_ceil(cin // op.groups, arch.icp) * _ceil(c_out, arch.ocp) * _ceil(h, arch.pp) * w * kh * kw,
                 weights=op.weights + c_out, reload=_ceil(cg_out, max(1, arch.bank_depth // max(rows, 1))))


def window_work(op: LayerDesc, arch: Arch) -> _Work:
    """A pool on the ALU: kh*kw taps per output pixel."""
    kh, kw, _, _ = op.window
    c_out, h, w = op.outputs[0].chw
    return _Work(misc=_ceil(c_out, arch.icp) * _ceil(h, arch.alu_pp) * w * kh * kw)


def depthwise_work(op: LayerDesc, arch: Arch) -> _Work:
    """A depthwise conv on the ALU: a pool's taps plus its per-channel weights and bias."""
    wk = window_work(op, arch)
    wk.weights = op.weights + op.outputs[0].chw[0]
    return wk


def pass_work(op: LayerDesc, arch: Arch) -> _Work:
    """An element-wise op or activation on the ALU: one read per input per output pixel."""
    c_out, h, w = op.outputs[0].chw
    return _Work(misc=_ceil(c_out, arch.icp) * _ceil(h, arch.alu_pp) * w * len(op.inputs))


def move_work(op: LayerDesc, arch: Arch) -> _Work:
    """concat / upsample: pure data movement (their LOAD/SAVE bytes are counted by the caller)."""
    return _Work()


def _work(op: LayerDesc, arch: Arch) -> _Work:
    # each kind's `work` hook (tvm_dpu/ops/); a plugin's kind is data movement here, as before the registry
    return op_hook(op.type, "work")(op, arch) if op.type in op_kinds() else move_work(op, arch)


def group_cycles(members: Sequence[LayerDesc], template: str, arch: Arch, consumers: Mapping[str, int],
                 graph_outputs: set[str] | frozenset[str]) -> float:
    """Cycles of running `members` (topological order) as one group of `template` ("single" for one op alone), by
    the template's cost hook (tvm_dpu/templates/). `consumers` counts the ops reading each tensor in the whole graph
    and `graph_outputs` names its outputs: together they say which outputs leave the group (and are saved)."""
    return template_hook(template, "cost")(members, arch, consumers, graph_outputs)


def fused_cycles(members: Sequence[LayerDesc], arch: Arch, consumers: Mapping[str, int],
                 graph_outputs: set[str] | frozenset[str], alu_rows: bool = False) -> float:
    """The cost hook of most templates: the members' work on each engine and their DDR traffic (inputs from outside
    the group, weights, outputs that leave it) overlapped, plus the latency and one tile's share of the busiest
    engine. `alu_rows`: the conv members compute the ALU's ALU_PP rows per tile, not PP."""
    if len(members) == 1 and members[0].type == "concat":
        return 0.0  # its copies are charged per non-fused input by the plan (copy_cycles)
    inside_out = {t.name for op in members for t in op.outputs}
    loads: dict[str, int] = {}
    conv = misc = 0.0
    wbytes = saves = 0
    for op in members:
        wk = _work(op, arch)
        if alu_rows and op.type == "conv2d":
            wk.conv *= arch.pp / arch.alu_pp
        conv += wk.conv
        misc += wk.misc
        wbytes += wk.weights
        for t in op.inputs:
            if t.const or t.name in inside_out:
                continue
            loads[t.name] = max(loads.get(t.name, 0), t.nbytes * wk.reload)
        for t in op.outputs:
            inner = sum(1 for o in members if any(i.name == t.name for i in o.inputs))
            if t.name in graph_outputs or consumers.get(t.name, 0) > inner:
                saves += t.nbytes
    ddr = (sum(loads.values()) + wbytes + saves) / ddr_bytes_per_cycle(arch)
    busy = max(ddr, conv, misc)
    tiles = max(1, _ceil(members[-1].outputs[0].chw[1], arch.pp))
    return DDR_LATENCY + busy + busy / tiles


def dw_pw_cycles(members: Sequence[LayerDesc], arch: Arch, consumers: Mapping[str, int],
                 graph_outputs: set[str] | frozenset[str]) -> float:
    """The cost hook of dw_pw: the pointwise CONVs get the depthwise ALU's ALU_PP rows per tile, not PP."""
    return fused_cycles(members, arch, consumers, graph_outputs, alu_rows=True)


def copy_cycles(nbytes: int, arch: Arch) -> float:
    """Cycles of copying `nbytes` of a concat input into its slice (LOAD + SAVE through a bank, plan "none")."""
    return DDR_LATENCY + 2 * nbytes / ddr_bytes_per_cycle(arch)
