"""vai_c's program beside tvm-dpu's for the same quantized network: `tvm-dpu compare m.xmodel`.

Each DPU subgraph of the xmodel is rebuilt as a QDQ ONNX model: its int8 constants (read from the CONST region at
their `ddr_addr`) behind DequantizeLinear with scale 2**-fix_point, every feature map behind a QuantizeLinear /
DequantizeLinear pair with its tensor's fix point. tvm-dpu compiles it (the QDQ import takes those fix points,
nothing is calibrated), so both compilers compute on the same numbers. Both programs then run on the emulator on
the same random int8 inputs; the result holds the int8 output differences, the instructions per engine, the DDR
bytes each program moved and the timing model's cycles (or the timing model's error, reported, not raised).

Equal outputs prove little when the outputs do not depend on the input (an untrained head whose outputs are all
zero, a saturated layer): vai_c's outputs are checked across the inputs tried, and a constant or all-zero output
gets a warning. Where vai_c's program leaves intermediate maps in DDR (location 1, at a place no other tensor of
the region shares) or the file carries per-layer programs (debug mode: `mc_code` on the DPU subgraph's children,
run one after another as VART's debug mode runs them), each such map is compared with tvm-dpu's golden reference
(xgraph.golden on the rebuilt network) layer by layer.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..errors import DPUError, XModelError
from ..quant.rules import SHIFT_BIAS_MIN
from ..types import CompiledSubgraph
from .model import DpuSubgraph, XModel, XOp, XTensor, read_xmodel

#: XIR DPU op types the rebuild covers.
REBUILDS = ("conv2d-fix", "depthwise-conv2d-fix", "pool-fix", "eltwise-fix", "concat-fix", "upsample-fix",
            "reshape-fix", "hard-sigmoid-fix")
_SKIP = ("upload", "download", "const-fix")
_ENGINES = ("LOAD", "SAVE", "CONV", "MISC")
#: vai_c's LEAKYRELU slope: 26/256, the DPU's fixed leaky-relu alpha.
LEAKY_ALPHA = 26 / 256
#: Random int8 inputs each subgraph runs on: enough to see an output that does not depend on its input.
INPUTS = 3
#: What vai_c's outputs are compared with when tvm-dpu compiles for the subgraph's DPU.
OURS = "tvm-dpu's program"
#: Byte the data regions are filled with to find which bytes of DDR a program writes (_Layers.unwritten).
CANARY = 0xA5


@dataclass
class ProgramStats:
    """One compiler's program(s) for a DPU subgraph: static instructions per engine, DDR bytes one run moved
    (emulator counters), timing-model cycles or why there are none."""

    instructions: dict[str, int]
    ddr_read_bytes: int
    ddr_write_bytes: int
    cycles: float | None
    timing_error: str | None = None
    programs: int = 1
    #: cycles each engine is busy on the timing model (summed over the programs; empty without a prediction)
    engine_busy: dict[str, float] = field(default_factory=dict)

    @property
    def overlap(self) -> float | None:
        """Engine-busy cycles per cycle (1.0: the engines take turns; higher: they work side by side)."""
        return sum(self.engine_busy.values()) / self.cycles if self.cycles and self.engine_busy else None


@dataclass
class LayerCheck:
    """One intermediate map of vai_c's program against tvm-dpu's golden reference for the same op: `read` says
    where vai_c's map was read (DDR after the whole program, or after the per-layer program of a child)."""
    op: str
    differing: int
    total: int
    read: str


@dataclass
class SubgraphComparison:
    """`differing` / `total`: int8 output elements over all `inputs` tried (the DDR and cycle figures are one
    run's). `warnings`: why equal outputs prove little here; `layers`: intermediate maps compared, and
    `layers_not_compared` the location-1 maps that were not, with the reason."""
    name: str
    differing: int
    total: int
    vai_c: ProgramStats
    ours: ProgramStats
    notes: list[str] = field(default_factory=list)
    inputs: int = 1
    warnings: list[str] = field(default_factory=list)
    layers: list[LayerCheck] = field(default_factory=list)
    layers_not_compared: dict[str, str] = field(default_factory=dict)
    #: what vai_c's outputs were compared with: tvm-dpu's program, or (a family tvm-dpu cannot compile for yet)
    #: tvm-dpu's golden reference of the same quantized ops
    against: str = OURS
    #: per vai_c layer group (joined where one of our kernels spans several): xmodel.groups.GroupRow.to_dict()
    groups: list[dict[str, Any]] = field(default_factory=list)
    #: why there are no group rows (the timing model failed on a program), or None
    groups_error: str | None = None
    #: the network's DDR floor on the timing model (timing.floor.DdrFloor as a dict: the subgraph's inputs and
    #: weights read once, its outputs written once, at the arch's DDR rate), or None where it is not timed
    ddr_floor: dict[str, Any] | None = None

    @property
    def layers_equal(self) -> bool:
        return all(c.differing == 0 for c in self.layers)

    @property
    def outputs_equal(self) -> bool:
        return self.differing == 0

    @property
    def cycle_ratio(self) -> float | None:
        """ours / vai_c's predicted cycles (None when either has no prediction)."""
        if self.ours.cycles is None or not self.vai_c.cycles:
            return None
        return self.ours.cycles / self.vai_c.cycles


@dataclass
class Comparison:
    path: str
    arch: str
    subgraphs: list[SubgraphComparison]
    #: DPU subgraphs that could not be compared -> why (one clear reason each)
    not_compared: dict[str, str] = field(default_factory=dict)

    def table(self) -> str:
        """A plain-text side-by-side table, one block per DPU subgraph."""
        lines = [f"{self.path} ({self.arch})"]
        for s in self.subgraphs:
            lines.append(f"DPU subgraph {s.name}: int8 outputs {'equal' if s.outputs_equal else 'DIFFER'} "
                         f"({s.differing} of {s.total} elements differ over {s.inputs} random inputs)"
                         + ("" if s.against == OURS else f": vai_c's against {s.against}"))
            lines += [f"  WARNING: {w}" for w in s.warnings]
            for c in s.layers:
                lines.append(f"  layer {c.op}: {'equal' if c.differing == 0 else 'DIFFERS'} ({c.differing} of "
                             f"{c.total} elements differ; vai_c's map read {c.read})")
            lines += [f"  layer {op}: not compared: {why}" for op, why in s.layers_not_compared.items()]
            lines.append(f"  {'':10}{'vai_c':>14}{'tvm-dpu':>14}")
            rows = [(e, s.vai_c.instructions.get(e, 0), s.ours.instructions.get(e, 0)) for e in _ENGINES]
            rows += [("DDR read", s.vai_c.ddr_read_bytes, s.ours.ddr_read_bytes),
                     ("DDR write", s.vai_c.ddr_write_bytes, s.ours.ddr_write_bytes)]
            for label, theirs, ours in rows:  # no program of ours (a DPU tvm-dpu cannot compile for): n/a
                lines.append(f"  {label:10}{theirs:>14}{ours if s.ours.programs else 'n/a':>14}")
            cyc = [f"{p.cycles:.0f}" if p.cycles is not None else "n/a" for p in (s.vai_c, s.ours)]
            lines.append(f"  {'cycles':10}{cyc[0]:>14}{cyc[1]:>14}")
            r = s.cycle_ratio
            lines.append(f"  ratio ours/vai_c: {r:.3f}" if r is not None else "  ratio ours/vai_c: n/a")
            for p, who in ((s.vai_c, "vai_c"), (s.ours, "tvm-dpu")):
                if p.timing_error:
                    lines.append(f"  timing model on {who}'s program: {p.timing_error}")
            lines += [f"  note: {n}" for n in s.notes]
        for name, why in self.not_compared.items():
            lines.append(f"DPU subgraph {name}: not compared: {why}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """The comparison as JSON-ready data (`tvm-dpu compare --json`)."""
        from dataclasses import asdict

        subs = [{**asdict(s), "outputs_equal": s.outputs_equal, "layers_equal": s.layers_equal,
                 "cycle_ratio": s.cycle_ratio} for s in self.subgraphs]
        return {"path": self.path, "arch": self.arch, "subgraphs": subs, "not_compared": self.not_compared}


# -- rebuilding the quantized network as QDQ ONNX ----------------------------------------------------------------
def _nchw(shape: tuple[int, ...]) -> list[int]:
    return [shape[0], shape[3], shape[1], shape[2]] if len(shape) == 4 else list(shape)


def _hw(v: Any, default: int) -> list[int]:
    """XIR's (w, h) pair as ONNX's (h, w)."""
    v = list(v) if v is not None else [default, default]
    return [int(v[1]), int(v[0])]


def _is_const(xm: XModel, op: XOp) -> bool:
    """A const-fix op, or a concat-fix of them (how tvm-dpu writes a grouped conv's per-group constants)."""
    return op.type == "const-fix" or (op.type == "concat-fix" and bool(op.input_ops) and
                                      all(_is_const(xm, xm.op(n)) for n in op.input_ops))


def _const_data(xm: XModel, d: DpuSubgraph, op: XOp) -> np.ndarray:
    """The int8 values of a const-fix op: its `data` attribute, else its bytes in the CONST region; of a concat-fix
    of constants, theirs joined."""
    if op.type == "concat-fix":
        return np.concatenate([_const_data(xm, d, xm.op(n)) for n in op.inputs.get("input", [])],
                              axis=int(op.attrs.get("axis", 0)))
    t = op.output
    n = int(np.prod(t.shape))
    data = op.attrs.get("data")
    if isinstance(data, bytes) and len(data) == n:
        return np.frombuffer(data, np.int8).reshape(t.shape)
    values = d.const_values(t)
    if values is None:
        raise XModelError(f"{xm.source}: const op {op.name!r} has neither data nor bytes in a CONST region")
    return values


class _Rebuild:
    def __init__(self, xm: XModel, d: DpuSubgraph):
        from onnx import helper, numpy_helper

        self.h, self.nh = helper, numpy_helper
        self.xm, self.d = xm, d
        self.nodes: list = []
        self.inits: list = []
        self.notes: list[str] = []
        self.k = 0

    def init(self, name: str, v: np.ndarray) -> str:
        self.inits.append(self.nh.from_array(np.asarray(v), name))
        return name

    def qdq(self, src: str, fix_point: int, out: str) -> str:
        s = self.init(f"{out}__s", np.float32(2.0 ** -fix_point))
        z = self.init(f"{out}__z", np.int8(0))
        self.nodes += [self.h.make_node("QuantizeLinear", [src, s, z], [f"{out}__q"], name=f"Q_{out}"),
                       self.h.make_node("DequantizeLinear", [f"{out}__q", s, z], [out], name=f"DQ_{out}")]
        return out

    def const(self, op: XOp, layout: str, max_fix_point: int | None = None) -> str:
        """DequantizeLinear of a const-fix op's int8 values (weights OHWI -> OIHW). `max_fix_point`: the highest
        fix point tvm-dpu's rules allow this constant (a bias: fp_in + fp_w + 1, quant.rules.SHIFT_BIAS_MIN); a
        higher one is lowered where that is exact (every value divisible by the power of two it drops), else
        refused."""
        q = _const_data(self.xm, self.d, op)
        if layout == "OHWI":
            q = q.transpose(0, 3, 1, 2)
        elif layout == "depthwise":  # XIR depthwise weights (multiplier, kh, kw, C) -> (C*multiplier, 1, kh, kw)
            q = q.transpose(3, 0, 1, 2).reshape(-1, 1, q.shape[1], q.shape[2])
        fp = op.output.fix_point
        if fp is None:
            raise XModelError(f"{self.xm.source}: const op {op.name!r} has no fix_point")
        if max_fix_point is not None and fp > max_fix_point:
            k = fp - max_fix_point
            if np.any(q.astype(np.int32) % (1 << k)):
                raise XModelError(
                    f"{self.xm.source}: bias {op.name!r} has fix_point {fp} > {max_fix_point}, the most the DPU's "
                    f"shift_bias field (>= 0) allows, and the odd bias values make lowering it inexact")
            self.notes.append(f"bias {op.name!r}: fix_point {fp} > {max_fix_point}, the most the DPU's shift_bias "
                              f"field allows; rebuilt exactly as values / {1 << k} at fix_point {max_fix_point}")
            q = (q.astype(np.int32) >> k).astype(np.int8)
            fp = max_fix_point
        qn = self.init(f"{op.name}__int8", np.ascontiguousarray(q, np.int8))
        s = self.init(f"{op.name}__s", np.float32(2.0 ** -fp))
        z = self.init(f"{op.name}__z", np.zeros((), np.int8))
        self.nodes.append(self.h.make_node("DequantizeLinear", [qn, s, z], [op.name], name=f"DQ_{op.name}"))
        return op.name

    def node(self, typ: str, ins: list[str], name: str, **attrs: Any) -> str:
        out = f"{name}__{typ.lower()}{self.k}"
        self.k += 1
        self.nodes.append(self.h.make_node(typ, ins, [out], name=out, **attrs))
        return out

    def act(self, src: str, op: XOp) -> str:
        nl = str(op.attrs.get("nonlinear", "NONE")).upper()
        if nl in ("NONE", ""):
            return src
        if nl == "RELU":
            return self.node("Relu", [src], op.name)
        if nl == "LEAKYRELU":
            return self.node("LeakyRelu", [src], op.name, alpha=LEAKY_ALPHA)
        if nl == "RELU6":
            lo, hi = self.init(f"{op.name}__lo", np.float32(0)), self.init(f"{op.name}__hi", np.float32(6))
            return self.node("Clip", [src, lo, hi], op.name)
        raise XModelError(f"{self.xm.source}: op {op.name!r} ({op.type}): nonlinear {nl} has no rebuild")

    def op(self, op: XOp) -> str:
        a, t = op.attrs, op.type
        ins = op.inputs.get("input", [])
        if t in ("conv2d-fix", "depthwise-conv2d-fix"):
            w = self.const(self.xm.op(op.inputs["weights"][0]), "OHWI" if t == "conv2d-fix" else "depthwise")
            args = [ins[0], w]
            if op.inputs.get("bias"):
                top = self.xm.op(ins[0]).output.fix_point + self.xm.op(op.inputs["weights"][0]).output.fix_point
                args.append(self.const(self.xm.op(op.inputs["bias"][0]), "flat", top - SHIFT_BIAS_MIN))
            p = [int(x) for x in a.get("pad", [0, 0, 0, 0])]  # [l, r, t, b]
            kw = {"pads": [p[2], p[0], p[3], p[1]], "strides": _hw(a.get("stride"), 1),
                  "dilations": _hw(a.get("dilation"), 1), "kernel_shape": _hw(a.get("kernel"), 1)}
            if t == "depthwise-conv2d-fix":
                kw["group"] = int(self.xm.op(ins[0]).output.shape[-1])
            elif int(a.get("group", 1)) != 1:
                kw["group"] = int(a["group"])
            return self.act(self.node("Conv", args, op.name, **kw), op)
        if t == "pool-fix":
            p = [int(x) for x in a.get("pad", [0, 0, 0, 0])]
            kw = {"pads": [p[2], p[0], p[3], p[1]], "strides": _hw(a.get("stride"), 1),
                  "kernel_shape": _hw(a.get("kernel"), 1)}
            kind = str(a.get("type", "MAX")).upper()
            if kind == "MAX":
                return self.node("MaxPool", ins, op.name, **kw)
            if kind == "AVG":
                return self.node("AveragePool", ins, op.name, count_include_pad=1, **kw)
            raise XModelError(f"{self.xm.source}: pool op {op.name!r} of type {kind} has no rebuild")
        if t == "eltwise-fix":
            kind = str(a.get("type", "ADD")).upper()
            if kind != "ADD":
                raise XModelError(f"{self.xm.source}: eltwise op {op.name!r} of type {kind} has no rebuild")
            out = ins[0]
            for x in ins[1:]:
                out = self.node("Add", [out, x], op.name)
            return self.act(out, op)
        if t == "concat-fix":
            axis = int(a.get("axis", -1)) % 4
            return self.node("Concat", ins, op.name, axis={0: 0, 1: 2, 2: 3, 3: 1}[axis])
        if t == "upsample-fix":
            sc = [float(x) for x in a.get("scale", [1, 1])]
            scales = self.init(f"{op.name}__scales", np.asarray([1, 1, sc[1], sc[0]], np.float32))
            return self.node("Resize", [ins[0], "", scales], op.name, mode="nearest",
                             coordinate_transformation_mode="asymmetric", nearest_mode="floor")
        if t == "reshape-fix":
            src = self.xm.op(ins[0]).output.shape
            if len(src) == 4 and src[1] * src[2] != 1:
                raise XModelError(f"{self.xm.source}: reshape op {op.name!r} of a {list(src)} map: only a map with "
                                  f"1x1 spatial size reshapes the same in NHWC and NCHW")
            shape = self.init(f"{op.name}__shape", np.asarray(_nchw(op.output.shape), np.int64))
            return self.node("Reshape", [ins[0], shape], op.name)
        if t == "hard-sigmoid-fix":
            return self.node("HardSigmoid", ins, op.name, alpha=1.0 / 6, beta=0.5)
        raise XModelError(f"{self.xm.source}: DPU op {op.name!r} of type {t!r} cannot be rebuilt as ONNX "
                          f"(the rebuild behind compare and run --verify handles {', '.join(REBUILDS)})")


def _topological(xm: XModel, names: list[str]) -> list[XOp]:
    inside = set(names)
    done: set[str] = set()
    out: list[XOp] = []

    def visit(n: str, stack: tuple = ()) -> None:
        if n in done or n not in inside:
            return
        if n in stack:
            raise XModelError(f"{xm.source}: ops form a cycle through {n!r}")
        for m in xm.op(n).input_ops:
            visit(m, stack + (n,))
        done.add(n)
        out.append(xm.op(n))

    for n in names:
        visit(n)
    return out


def feed_name(upload_op: str) -> str:
    """The rebuilt network's input for an upload op: a valid identifier, because TVM's ONNX importer renames any
    other input name (`branch_a.conv_upload_0` becomes `branch_a_conv_upload_0`) and a feed under the file's name
    would then miss it."""
    name = re.sub(r"\W", "_", upload_op)
    return f"{name if name[:1].isalpha() or name[:1] == '_' else 'in_' + name}__in"


def rebuild_qdq(xm: XModel, d: DpuSubgraph) -> tuple[Any, list[XTensor], list[XTensor], list[str]]:
    """(QDQ ONNX model, its inputs' DPU tensors, its outputs' DPU tensors, notes on what was re-expressed) of the
    DPU subgraph `d`. ONNX names: each input is named after its upload op, each output after the op producing
    it."""
    from onnx import TensorProto, helper

    r = _Rebuild(xm, d)
    ops = _topological(xm, d.subgraph.all_ops())
    graph_in = []
    for op in ops:
        if op.type == "upload":
            t = op.output
            graph_in.append(helper.make_tensor_value_info(feed_name(op.name), TensorProto.FLOAT, _nchw(t.shape)))
            r.qdq(feed_name(op.name), t.fix_point, op.name)
    if len({i.name for i in graph_in}) != len(graph_in):
        raise XModelError(f"{xm.source}: DPU subgraph {d.name!r}: two upload ops' names differ only in characters "
                          f"an ONNX input name cannot keep ({[i.name for i in graph_in]})")
    for op in ops:
        if op.type in _SKIP or _is_const(xm, op):
            continue
        if op.output.fix_point is None:
            raise XModelError(f"{xm.source}: op {op.name!r} has no output fix_point")
        r.qdq(r.op(op), op.output.fix_point, op.name)
    graph_out = [helper.make_tensor_value_info(t.op, TensorProto.FLOAT, _nchw(t.shape)) for t in d.outputs]
    g = helper.make_graph(r.nodes, d.name.replace("/", "_"), graph_in, graph_out, r.inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)
    return model, d.inputs, d.outputs, r.notes


# -- running and measuring ------------------------------------------------------------------------------------
def _to_nchw(a: np.ndarray) -> np.ndarray:
    return a.transpose(0, 3, 1, 2) if a.ndim == 4 else a


def _to_nhwc(a: np.ndarray) -> np.ndarray:
    return a.transpose(0, 2, 3, 1) if a.ndim == 4 else a


def _engines(code: np.ndarray, isa: str = "DPUV2") -> dict[str, int]:
    from ..codegen.isa import decode_program, instr_spec

    c = Counter(instr_spec(ins.name, isa).category.upper() for ins in decode_program(code, isa))
    return {e: int(c.get(e, 0)) for e in _ENGINES}


def ddr_floor(xm: XModel, d: DpuSubgraph, arch: Any) -> dict[str, Any] | None:
    """timing.floor.ddr_floor of DPU subgraph `d` (its upload tensors and constants read, its download tensors
    written) as a dict, or None for a DPU without a timing model."""
    from dataclasses import asdict

    from ..timing.floor import ddr_floor as floor

    weights = sum(xm.op(o).output.nbytes for o in d.subgraph.all_ops() if xm.op(o).type == "const-fix")
    try:
        return asdict(floor(arch, sum(t.nbytes for t in d.inputs), sum(t.nbytes for t in d.outputs), weights))
    except DPUError:
        return None


def _timing(codes: list[tuple[np.ndarray, Any]], arch: Any) -> tuple[float | None, str | None, dict[str, float]]:
    """(cycles, None, engine busy cycles) of the programs on the timing model, or (None, why, {})."""
    from ..timing.simulate import simulate

    try:
        runs = [simulate(code, arch, op_ranges=ranges) for code, ranges in codes]
    except DPUError as e:
        return None, f"{type(e).__name__}: {' '.join(str(e).split())[:300]}", {}
    busy: Counter = Counter()
    for r in runs:
        busy.update(r.engine_busy)
    return float(sum(r.cycles for r in runs)), None, {k: float(v) for k, v in busy.items()}


class _CountingDevice:
    """The emulator, adding up what every program it runs moves over DDR."""

    def __init__(self, arch: Any):
        from .runner import emulator_device

        self.arch = arch
        self.inner = emulator_device(arch)
        self.read = self.written = 0

    def execute(self, sg: CompiledSubgraph, regions: dict[int, np.ndarray]) -> None:
        self.inner.execute(sg, regions)
        self.read += self.inner.last_stats.load_bytes
        self.written += self.inner.last_stats.save_bytes


def _extent(t: XTensor) -> tuple[int, int]:
    """[first, end) bytes of `t` in its region (strided where it has strides)."""
    strides = t.strides or tuple(int(np.prod(t.shape[i + 1:])) for i in range(len(t.shape)))
    return t.ddr_addr, t.ddr_addr + sum((n - 1) * st for n, st in zip(t.shape, strides)) + 1


class _Layers:
    """vai_c's intermediate maps against tvm-dpu's golden reference on the rebuilt network, accumulated over the
    inputs tried (see the module docstring)."""

    def __init__(self, xm: XModel, d: DpuSubgraph, theirs: Any, ours: Any, where: str):
        import dataclasses

        self.xm, self.d, self.theirs, self.where = xm, d, theirs, where
        self.checks: dict[str, LayerCheck] = {}
        self.skipped: dict[str, str] = {}
        runners = list(ours.runners.values())
        self.graph = runners[0].graph if len(runners) == 1 else None
        outs = {t.name for t in d.outputs}
        self.maps = [op for op in _topological(xm, d.subgraph.all_ops()) if op.type not in _SKIP
                     and op.output.location == 1 and op.output.name not in outs and op.output.reg_id in d.regions]
        # the last XGraph op the rebuild named after an XIR op computes that op's map (conv, then its activation)
        self.golden_name = {o.rsplit("__", 1)[0]: o for gop in (self.graph.ops if self.graph else ())
                            for o in gop.outputs}
        order = d.attrs.get("children_topological_sort") or [c.name for c in d.subgraph.children]
        by_name = {c.name: c for c in d.subgraph.children}
        #: debug mode's per-layer programs: (child, its program as a CompiledSubgraph), in VART's order
        self.steps = [(by_name[n], dataclasses.replace(
            theirs.sg, name=n, code=np.frombuffer(by_name[n].attrs["mc_code"], "<u4").astype(np.uint32)))
            for n in order if n in by_name and isinstance(by_name[n].attrs.get("mc_code"), bytes)]
        if self.graph is None:
            self.skipped.update({op.name: f"tvm-dpu compiled the rebuilt network into {len(runners)} partitions, "
                                 "so there is no one golden graph to read its map from" for op in self.maps})
        elif not self.steps:
            self.release_overlaps()

    def release_overlaps(self) -> None:
        """Release mode: a map read from DDR after the whole program is the op's only where no other tensor of
        the subgraph shares its bytes (a later write could have replaced it)."""
        placed = [self.xm.op(n).output for n in self.d.subgraph.all_ops()]
        placed = [t for t in placed if t.reg_id is not None and t.ddr_addr is not None]
        for op in self.maps:
            a0, a1 = _extent(op.output)
            other = next((t for t in placed if t.name != op.output.name and t.reg_id == op.output.reg_id
                          and _extent(t)[0] < a1 and a0 < _extent(t)[1]), None)
            if other is not None:
                self.skipped[op.name] = (f"shares REG_{op.output.reg_id} bytes with {other.name!r}, so the map left "
                                         "in DDR after the program may be another tensor's")

    def run(self, device: Any, ins: list[XTensor], q_in: list[np.ndarray], regions: dict[int, np.ndarray]) -> None:
        """Compare the maps of one input: `regions` are vai_c's DDR after its whole program ran on `q_in`."""
        from ..xgraph.golden import run_graph
        from .runner import tensor_view

        if self.graph is None or not self.maps:
            return
        golden = run_graph(self.graph, {feed_name(t.op): _to_nchw(q) for t, q in zip(ins, q_in)}, keep_all=True)
        if not self.steps:
            self.unwritten(device, ins, q_in, regions)
            for op in self.maps:
                self.check(op, golden, regions, "in DDR after the program")
            return
        regions = self.theirs.new_regions()
        for t, q in zip(ins, q_in):
            tensor_view(regions[t.reg_id], t, self.where)[...] = q
        done = set()
        for child, sg in self.steps:
            device.execute(sg, regions)
            names = set(child.all_ops())
            for op in self.maps:
                if op.name in names and op.name not in done:
                    done.add(op.name)
                    self.check(op, golden, regions, f"after the per-layer program {child.name!r}")
        for op in self.maps:
            if op.name not in done:
                self.skipped[op.name] = "no per-layer program of the debug-mode children computes it"

    def unwritten(self, device: Any, ins: list[XTensor], q_in: list[np.ndarray],
                  regions: dict[int, np.ndarray]) -> None:
        """Release mode: run vai_c's program again with its data regions filled with a canary byte; a map whose
        bytes differ between the two runs was not (wholly) written to DDR by the program (vai_c marks maps
        location 1 that its release program keeps on chip), so there is nothing of it to compare."""
        from .runner import tensor_view

        canary = self.theirs.new_regions()
        for rid, buf in canary.items():
            if rid in self.d.regions and self.d.regions[rid].context_type != "CONST":
                buf[...] = CANARY
        for t, q in zip(ins, q_in):
            tensor_view(canary[t.reg_id], t, self.where)[...] = q
        device.execute(self.theirs.sg, canary)
        for op in self.maps:
            t = op.output
            if op.name in self.skipped:
                continue
            n = int(np.sum(tensor_view(regions[t.reg_id], t, self.where) != tensor_view(canary[t.reg_id], t,
                                                                                        self.where)))
            if n:
                self.skipped[op.name] = (f"vai_c's program leaves {n} of its {int(np.prod(t.shape))} bytes in DDR "
                                         "unwritten (its release program keeps the map on chip)")

    def check(self, op: XOp, golden: dict[str, np.ndarray], regions: dict[int, np.ndarray], read: str) -> None:
        from .runner import tensor_view

        if op.name in self.skipped:
            return
        t = op.output
        g = golden.get(self.golden_name.get(op.name, ""))
        if g is None or g.size != int(np.prod(t.shape)):
            self.skipped[op.name] = "the rebuilt network has no golden tensor of its shape for it"
            return
        want = _to_nhwc(g).reshape(t.shape)
        got = tensor_view(regions[t.reg_id], t, self.where)
        c = self.checks.setdefault(op.name, LayerCheck(op.name, 0, 0, read))
        c.differing += int(np.sum(got != want))
        c.total += int(want.size)


def _input_warnings(outs: list[XTensor], seen: list[list[np.ndarray]]) -> list[str]:
    """Why equal outputs prove little: vai_c's outputs that are all zero, or the same for every input tried."""
    warnings = []
    n = len(seen)
    for j, t in enumerate(outs):
        runs = [s[j] for s in seen]
        if not any(r.any() for r in runs):
            warnings.append(f"vai_c's output {t.name!r} is all zero for each of the {n} inputs tried: equal outputs "
                            "prove nothing about the layers before it")
        elif n > 1 and all(np.array_equal(runs[0], r) for r in runs[1:]):
            warnings.append(f"vai_c's output {t.name!r} is the same for each of the {n} inputs tried (it does not "
                            "depend on the input): equal outputs prove nothing about the layers before it")
    return warnings


def reference_arch(arch: Any) -> Any:
    """The core tvm-dpu builds a subgraph's golden reference for: `arch` itself, or, for a family tvm-dpu runs but
    cannot compile for yet (DPUCAHX8H), the DPUCZDX8G ISA1 core of the same PP, ICP and OCP. The core only decides
    which ops the DPU takes (its limits); the XGraph's integer semantics (xgraph.golden) are the DPU's arithmetic,
    which AMD's simulator shares between the two families (Calc::DPURound, CONV's bias and shift, the average
    pool's reciprocal table for square kernels, ELEW's read and write shifts)."""
    from ..arch import load_arch
    from ..arch.arch import require_support

    try:
        require_support(arch, "compile")
        return arch
    except DPUError as e:
        why = str(e)
    try:
        ref = load_arch(f"DPUCZDX8G_ISA1_B{arch.ops_per_clock}")
    except DPUError:
        ref = None
    if ref is None or (ref.pp, ref.icp, ref.ocp) != (arch.pp, arch.icp, arch.ocp):
        raise XModelError(f"{why}; and no DPUCZDX8G ISA1 core has its PP {arch.pp}, ICP {arch.icp}, OCP {arch.ocp} "
                          "to build the golden reference for")
    return ref


def _golden_outputs(graph: Any, ins: list[XTensor], outs: list[XTensor], q_in: list[np.ndarray]) -> list[np.ndarray]:
    """tvm-dpu's golden reference (xgraph.golden) of the rebuilt subgraph on int8 inputs in the DPU's layout, as
    int8 outputs in the DPU's layout."""
    from ..xgraph.golden import run_graph

    golden = run_graph(graph, {feed_name(t.op): _to_nchw(q) for t, q in zip(ins, q_in)})
    return [_to_nhwc(golden[name]).reshape(t.shape) for t, name in zip(outs, graph.outputs)]


def _reference_graph(xm: XModel, d: DpuSubgraph, build: Any, outs: list[XTensor]) -> Any:
    """The one XGraph of tvm-dpu's build of the rebuilt subgraph, its outputs' fix points checked against the
    file's (XModelError when there is no such graph: no golden reference for the subgraph)."""
    runners = list(build.runners.values())
    graph = runners[0].graph if len(runners) == 1 else None
    if graph is None or len(graph.outputs) != len(outs):
        raise XModelError(f"{xm.source}: DPU subgraph {d.name!r}: its ops rebuilt did not compile to one DPU "
                          f"partition with its {len(outs)} output(s), so there is no golden reference for it")
    for t, name in zip(outs, graph.outputs):
        if graph.tensors[name].fix_point != t.fix_point:
            raise XModelError(f"{xm.source}: DPU subgraph {d.name!r}: output {t.name!r} has fix_point "
                              f"{t.fix_point}, the rebuilt network's {graph.tensors[name].fix_point}")
    return graph


def _count_differing(outs: list[XTensor], got: list[np.ndarray], want: list[np.ndarray]) -> int:
    return sum(int(np.sum(g.reshape(w.shape) != w)) for t, g, w in zip(outs, got, want))


def compare_subgraph(xm: XModel, d: DpuSubgraph, seed: int = 0, inputs: int = INPUTS) -> SubgraphComparison:
    """Rebuild, compile and run one DPU subgraph of vai_c's against tvm-dpu's on `inputs` random int8 inputs (see
    the module docstring). For a DPU tvm-dpu cannot compile for yet, vai_c's outputs are compared with tvm-dpu's
    golden reference of the same quantized ops (`reference_arch`), and tvm-dpu's column stays empty."""
    import tvm_dpu

    from ..arch.arch import arch_from_fingerprint
    from .runner import load_xmodel, tensor_view

    if inputs < 1:
        raise XModelError(f"compare: {inputs} inputs: at least one is needed")
    arch = arch_from_fingerprint(d.fingerprint)
    try:
        arch.instruction_set  # noqa: B018 - no instruction table (DPUCZDX8G ISA0): nothing to decode or emulate
    except DPUError as e:
        raise XModelError(f"{xm.source}: DPU subgraph {d.name!r}: {e}") from None
    ref = reference_arch(arch)
    own = ref is arch
    where = f"{xm.source}: DPU subgraph {d.name!r}"
    theirs = load_xmodel(xm).programs[d.name]  # regions initialised as the xmodel runner does
    onnx_model, ins, outs, notes = rebuild_qdq(xm, d)
    ours = tvm_dpu.build(onnx_model, arch=ref, progress=False)
    graph = None if own else _reference_graph(xm, d, ours, outs)
    layers = _Layers(xm, d, theirs, ours, where)
    rng = np.random.default_rng(seed)
    dev, odev = _CountingDevice(arch), _CountingDevice(ref)
    if own:
        ours.pin(odev)
    differing = total = 0
    seen: list[list[np.ndarray]] = []
    moved: list[tuple[int, int]] = []  # (read, written) DDR bytes of the first run: vai_c's, ours
    for _ in range(inputs):
        q_in = [rng.integers(-128, 128, t.shape, dtype=np.int8) for t in ins]  # the DPU's layout (NHWC)
        regions = theirs.new_regions()
        for t, q in zip(ins, q_in):
            tensor_view(regions[t.reg_id], t, where)[...] = q
        dev.execute(theirs.sg, regions)
        q_theirs = [tensor_view(regions[t.reg_id], t, where).copy() for t in outs]
        seen.append(q_theirs)
        if own:
            floats = ours.run({feed_name(t.op): _to_nchw(q).astype(np.float32) * np.float32(2.0 ** -t.fix_point)
                               for t, q in zip(ins, q_in)})
            want = [_to_nhwc(np.clip(np.rint(np.asarray(f, np.float64) * 2.0 ** t.fix_point), -128, 127)
                             .astype(np.int8)) for t, f in zip(outs, floats)]
        else:
            want = _golden_outputs(graph, ins, outs, q_in)
        if not moved:
            moved = [(dev.read, dev.written), (odev.read, odev.written)]
        differing += _count_differing(outs, q_theirs, want)
        total += sum(int(q.size) for q in q_theirs)
        layers.run(dev.inner, ins, q_in, regions)
    cyc, err, busy = _timing([(theirs.sg.code, None)], arch)
    vai = ProgramStats(_engines(theirs.sg.code, arch.instruction_set), *moved[0], cyc, err, engine_busy=busy)
    if not own:
        notes.append(f"tvm-dpu compiles no program for {arch.dpu_name} yet ({reference_missing(arch)}): vai_c's "
                     f"outputs are compared with tvm-dpu's golden reference of the subgraph's own quantized ops, "
                     f"built for {ref.dpu_name} (the same PP x ICP x OCP and integer arithmetic)")
        return SubgraphComparison(d.name, differing, total, vai, ProgramStats({}, 0, 0, None, programs=0), notes,
                                  inputs, _input_warnings(outs, seen), list(layers.checks.values()), layers.skipped,
                                  against="tvm-dpu's golden reference")
    out = _with_groups(_with_ours(d, differing, total, vai, ours, arch, moved[1], notes, inputs,
                                  _input_warnings(outs, seen), layers), xm, d, ours, arch)
    out.ddr_floor = ddr_floor(xm, d, arch)
    return out


def reference_missing(arch: Any) -> str:
    """What tvm-dpu lacks to compile for `arch`'s family (families.json `missing`)."""
    from ..arch.arch import families

    return families()[arch.family].missing or "not supported"


def _with_ours(d: DpuSubgraph, differing: int, total: int, vai: ProgramStats, ours: Any, arch: Any,
               moved: tuple[int, int], notes: list[str], inputs: int, warnings: list[str],
               layers: "_Layers") -> SubgraphComparison:
    counts: Counter = Counter()
    for r in ours.runners.values():
        counts.update(_engines(r.sg.code, arch.instruction_set))
    if len(ours.runners) != 1:
        notes.append(f"tvm-dpu compiled the rebuilt network into {len(ours.runners)} DPU partitions")
    cyc, err, busy = _timing([(r.sg.code, r.sg.op_ranges) for r in ours.runners.values()], arch)
    mine = ProgramStats({e: int(counts.get(e, 0)) for e in _ENGINES}, *moved, cyc, err,
                        programs=len(ours.runners), engine_busy=busy)
    return SubgraphComparison(d.name, differing, total, vai, mine, notes, inputs, warnings,
                              list(layers.checks.values()), layers.skipped)


def _with_groups(out: SubgraphComparison, xm: XModel, d: DpuSubgraph, ours: Any, arch: Any) -> SubgraphComparison:
    """`out` with its per-layer-group rows (xmodel.groups) where tvm-dpu compiled one DPU partition."""
    if len(ours.runners) == 1:
        from .groups import try_group_rows

        (r,) = ours.runners.values()
        rows, out.groups_error = try_group_rows(xm, d, r.sg.code, r.sg.op_ranges, arch)
        out.groups = [g.to_dict() for g in rows]
    return out


def golden_checks(xm: XModel) -> dict[str, Callable[[list[np.ndarray], list[np.ndarray]], Any]]:
    """For an xmodel tvm-dpu wrote (its DPU ops carry their int8 constants, fix points and attributes): per DPU
    subgraph, a check(int8 inputs, int8 outputs) -> VerifyResult of the program's outputs against tvm-dpu's golden
    reference (xgraph.golden) of the quantized network rebuilt from the file's ops (rebuild_qdq, compiled back by
    tvm-dpu, for `reference_arch` of the subgraph's DPU, to get its quantized XGraph). The reference reads nothing
    of the file's machine code."""
    import tvm_dpu

    from ..arch.arch import arch_from_fingerprint
    from ..runtime.subgraph_runner import VerifyResult

    out: dict[str, Callable[[list[np.ndarray], list[np.ndarray]], Any]] = {}
    for d in xm.dpu_subgraphs():
        onnx_model, ins, outs, _ = rebuild_qdq(xm, d)
        build = tvm_dpu.build(onnx_model, arch=reference_arch(arch_from_fingerprint(d.fingerprint)), progress=False)
        graph = _reference_graph(xm, d, build, outs)

        def check(q_in: list[np.ndarray], q_out: list[np.ndarray], d: DpuSubgraph = d, ins: list = ins,
                  outs: list = outs, graph: Any = graph) -> VerifyResult:
            bad, total, notes = 0, 0, []
            for t, want, q in zip(outs, _golden_outputs(graph, ins, outs, q_in), q_out):
                diff = int(np.sum(want.reshape(q.shape) != q))
                bad, total = bad + diff, total + q.size
                if diff:
                    notes.append(f"output {t.name!r}: {diff} of {q.size} elements differ")
            return VerifyResult(d.name, bad, total, notes)

        out[d.name] = check
    return out


def compare(path: Any, seed: int = 0, inputs: int = INPUTS) -> Comparison:
    """Every DPU subgraph of the xmodel at `path`: vai_c's program against tvm-dpu's compile of the same
    quantized ops on `inputs` random int8 inputs (`compare_subgraph`)."""
    from ..arch.arch import arch_from_fingerprint, require_support

    xm = read_xmodel(path)
    dpus = xm.dpu_subgraphs()
    if not dpus:
        raise XModelError(f"{xm.source}: no DPU subgraph to compare")
    arch = arch_from_fingerprint(dpus[0].fingerprint)
    try:
        require_support(arch, "run")  # a family tvm-dpu cannot run or compile for yet: say so once, for the file
    except DPUError as e:
        raise XModelError(f"{xm.source}: {e}") from None
    out = Comparison(str(path), arch.name, [])
    for d in dpus:
        try:
            out.subgraphs.append(compare_subgraph(xm, d, seed, inputs))
        except XModelError as e:  # this subgraph cannot be rebuilt or run: say why, compare the others
            out.not_compared[d.name] = str(e).removeprefix(f"{xm.source}: ")
    return out
