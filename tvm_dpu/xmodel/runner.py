"""Running a vai_c .xmodel: DPU subgraphs on a DPU device (the emulator or a Pynq board), CPU subgraphs on the
host (cpu_ops.py, or a plugin's `cpu` runner for custom op types), in topological order.

A DPU subgraph runs as VART's DPU runner runs it: one DDR buffer per register region, sized by
`reg_id_to_size`, the CONST region filled with `reg_id_to_parameter_value`; each input (an `upload` op's output)
is written at its `ddr_addr` with the tensor's byte strides, the machine code runs, and each output (the tensor a
`download` op reads) is read back the same way. The architecture is the one `dpu_fingerprint` names.

Nothing in an .xmodel is executable on the host (the machine code runs on the DPU or its emulator; CPU ops are
interpreted by name), so the trust policy for native libraries does not apply to it.
"""
from __future__ import annotations

import heapq
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..errors import DPUError, XModelError
from ..serving.feeds import arrays_by_name, check_array
from ..types import CompiledSubgraph, InputSpec
from .cpu_ops import CPU_OPS, quantize, run_cpu_op
from .model import DpuSubgraph, XModel, XOp, XSubgraph, XTensor, read_xmodel

#: Op types that hand data over without computing (their value is their input's).
_PASS_THROUGH = ("upload", "download")


def _dtype_of(t: XTensor) -> str:
    return "float32" if t.dtype.startswith("float") else "int8"


def tensor_view(region: np.ndarray, t: XTensor, where: str) -> np.ndarray:
    """The bytes of tensor `t` inside its DDR `region` (an int8 view with `t.strides`, writeable), after checking
    that every element lies inside the region."""
    t.check_placement(region.size, where)
    return as_strided(region[t.ddr_addr:].view(np.int8), shape=t.shape, strides=t.byte_strides())


@dataclass
class DpuProgram:
    """A DPU subgraph prepared for a device: the project's CompiledSubgraph (code and region sizes) plus the
    initial contents of its regions."""
    sub: DpuSubgraph
    sg: CompiledSubgraph
    init: dict[int, np.ndarray]

    def new_regions(self) -> dict[int, np.ndarray]:
        return {rid: buf.copy() for rid, buf in self.init.items()}


def _program(model: XModel, sub: DpuSubgraph, arch_name: str) -> DpuProgram:
    where = f"{model.source}: DPU subgraph {sub.name!r}"
    if sub.mc_code_preload:
        raise XModelError(f"{where}: mc_code_preload ({len(sub.mc_code_preload)} bytes) is not supported: "
                          "tvm-dpu runs programs without a preload stage")
    init = {}
    for r in sub.regions.values():
        buf = np.zeros(r.size, np.uint8)
        if r.data:
            buf[:len(r.data)] = np.frombuffer(r.data, np.uint8)
        init[r.reg_id] = buf
    code = np.frombuffer(sub.mc_code, "<u4").astype(np.uint32)
    params = init.get(0, np.zeros(0, np.uint8))
    sg = CompiledSubgraph(sub.name, arch_name, sub.fingerprint, code, params,
                          {rid: b.size for rid, b in init.items()}, [], [])
    return DpuProgram(sub, sg, init)


def _topological(model: XModel, nodes: list[XSubgraph]) -> list[XSubgraph]:
    """`nodes` ordered so each runs after the subgraphs producing its inputs (file order among equals)."""
    owner = {op: i for i, s in enumerate(nodes) for op in s.all_ops()}
    deps = [set() for _ in nodes]
    for i, s in enumerate(nodes):
        for name in s.all_ops():
            for src in model.op(name).input_ops:
                j = owner.get(src)
                if j is None:
                    raise XModelError(f"{model.source}: op {src!r} (read by {name!r}) is in no subgraph")
                if j != i:
                    deps[i].add(j)
    order, done = [], set()
    while len(order) < len(nodes):
        ready = [i for i in range(len(nodes)) if i not in done and deps[i] <= done]
        if not ready:
            stuck = [nodes[i].name for i in range(len(nodes)) if i not in done]
            raise XModelError(f"{model.source}: the subgraphs {stuck} depend on each other in a cycle")
        done.add(ready[0])
        order.append(nodes[ready[0]])
    return order


def _ops_in_order(model: XModel, names: list[str]) -> list[XOp]:
    """The ops `names` in dependency order, file order among the ready ones (inputs from outside the list count as
    available). Linear in ops and edges: a chain of thousands of ops is ordered in milliseconds."""
    inside = {n: i for i, n in enumerate(names)}
    waiting = [0] * len(names)
    readers: list[list[int]] = [[] for _ in names]
    for i, n in enumerate(names):
        for src in set(model.op(n).input_ops):
            j = inside.get(src)
            if j is not None:
                waiting[i] += 1
                readers[j].append(i)
    ready = [i for i in range(len(names)) if not waiting[i]]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(model.op(names[i]))
        for r in readers[i]:
            waiting[r] -= 1
            if not waiting[r]:
                heapq.heappush(ready, r)
    if len(order) < len(names):
        pending = [n for i, n in enumerate(names) if waiting[i]]
        raise XModelError(f"{model.source}: the ops {pending[:5]} depend on each other in a cycle")
    return order


@dataclass
class XModelRunner:
    """A vai_c .xmodel ready to run (what `tvm_dpu.load("m.xmodel")` returns). `run(inputs) -> outputs`:
    inputs are float32 (quantized with each input's fix_point and DPU rounding, as `data-fix` does), outputs are
    the values of the graph's final ops (float32 after a fix2float, else int8)."""

    model: XModel
    device: Any
    programs: dict[str, DpuProgram]
    order: list[XSubgraph]
    inputs: list[InputSpec]
    outputs: list[InputSpec]
    plugin_runners: dict[str, Any] = field(default_factory=dict)
    last_stats: dict[str, Any] = field(default_factory=dict)
    #: DPU subgraph -> check(int8 inputs, int8 outputs as the program left them) -> VerifyResult, run after every
    #: execute of that subgraph (`run --verify` on a file tvm-dpu wrote: compare.golden_checks)
    checks: dict[str, Callable[[list[np.ndarray], list[np.ndarray]], Any]] = field(default_factory=dict)
    verify_results: list[Any] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def arch(self):
        return self.device.arch

    def output_specs(self) -> list[InputSpec]:
        return list(self.outputs)

    def tensor_fix_points(self) -> dict[str, int]:
        """fix_point of each model input and output (op name -> fix_point) that has one."""
        ops = {s.name for s in (*self.inputs, *self.outputs)}
        return {op.name: int(op.output.fix_point) for op in self.model.ops
                if op.name in ops and op.output.fix_point is not None}

    def run(self, inputs: Any, *, timer: Any = None) -> list[np.ndarray]:
        """Run the model on float inputs (dict name -> array, a list in input order, or one array). `timer`, when
        given, is called as timer(subgraph name, start, end) after each DPU subgraph (time.perf_counter())."""
        names = [s.name for s in self.inputs]
        arrays = [check_array(s.name, a, s.shape) for s, a in
                  zip(self.inputs, arrays_by_name(inputs, names, "model inputs"))]
        values = self.run_values(dict(zip(names, arrays)), timer=timer)
        return [values[s.name] for s in self.outputs]

    def run_values(self, feeds: Mapping[str, np.ndarray], quantized: bool = False,
                   timer: Any = None) -> dict[str, np.ndarray]:
        """The value of every op computed on the host or read back from a DPU (op name -> array), from float
        inputs (int8 ones when `quantized`) keyed by input op name."""
        values: dict[str, np.ndarray] = {}
        for sg in self.order:
            if sg.device == "USER":
                for op in _ops_in_order(self.model, sg.all_ops()):
                    values[op.name] = self._user_input(op, feeds, quantized)
            elif sg.device == "DPU":
                start = time.perf_counter()
                self._run_dpu(self.programs[sg.name], values)
                if timer is not None:
                    timer(sg.name, start, time.perf_counter())
            else:
                for op in _ops_in_order(self.model, sg.all_ops()):
                    if op.type in _PASS_THROUGH:
                        values[op.name] = values[op.input_ops[0]]
                        continue
                    try:
                        args = [values[n] for n in op.input_ops]
                    except KeyError as e:
                        raise XModelError(f"{self.model.source}: op {op.name!r} reads {e.args[0]!r}, which has "
                                          "no value when it runs") from None
                    values[op.name] = run_cpu_op(op, args, self.model, self._plugin_runner(op))
        return values

    def _user_input(self, op: XOp, feeds: Mapping[str, np.ndarray], quantized: bool) -> np.ndarray:
        if op.name not in feeds:
            raise XModelError(f"{self.model.source}: no value given for input {op.name!r}")
        x = np.asarray(feeds[op.name]).reshape(op.output.shape)
        if op.output.dtype.startswith("float"):
            return x.astype(np.float32)
        if quantized:
            if x.dtype != np.int8:
                raise XModelError(f"input {op.name!r}: int8 expected, got {x.dtype}")
            return x
        fp = op.output.fix_point
        if fp is None:
            raise XModelError(f"{self.model.source}: input {op.name!r} has no fix_point")
        return quantize(x, fp, str(op.output.attrs.get("round_mode", "DPU_ROUND")))

    def _run_dpu(self, prog: DpuProgram, values: dict[str, np.ndarray]) -> None:
        where = f"{self.model.source}: DPU subgraph {prog.sub.name!r}"
        regions = prog.new_regions()
        q_in = []
        for t in prog.sub.inputs:
            upload = self.model.op(t.op)
            src = values.get(upload.input_ops[0]) if upload.input_ops else None
            if src is None:
                raise XModelError(f"{where}: input {t.name!r} has no value when the subgraph runs")
            if src.dtype != np.int8:
                raise XModelError(f"{where}: input {t.name!r} is {src.dtype}, the DPU reads int8")
            q_in.append(src.reshape(t.shape))
            tensor_view(regions[t.reg_id], t, where)[...] = q_in[-1]
        try:
            self.device.execute(prog.sg, regions)
        except DPUError as e:
            raise type(e)(f"{where}: {e}") from None
        stats = getattr(self.device, "last_stats", None)
        if stats is not None and not stats.ended:
            raise XModelError(f"{where}: the program stopped after {stats.instructions} instructions without "
                              "reaching END: its outputs are not valid")
        with self._lock:
            self.last_stats[prog.sub.name] = stats
        q_out = []
        for t in prog.sub.outputs:
            out = tensor_view(regions[t.reg_id], t, where).copy()
            q_out.append(out)
            values[t.op] = out
            for d in self.model.consumers(t.op):
                if d.type == "download":
                    values[d.name] = out.reshape(d.output.shape)
        check = self.checks.get(prog.sub.name)
        if check is not None:
            result = check(q_in, q_out)
            with self._lock:
                self.verify_results.append(result)

    def _plugin_runner(self, op: XOp) -> Any:
        if op.type in CPU_OPS:
            return None
        if op.type not in self.plugin_runners:
            from ..plugins.registry import plugin_for_cpu_op

            plugin = plugin_for_cpu_op(op.type)
            self.plugin_runners[op.type] = None if plugin is None else _checked_plugin_call(plugin)
        return self.plugin_runners[op.type]


def _checked_plugin_call(plugin: Any) -> Any:
    def call(op_type: str, name: str, attrs: dict, inputs: list, shape: tuple) -> np.ndarray:
        try:
            return plugin.cpu(op_type, name, attrs, inputs, shape)
        except DPUError:
            raise
        except Exception as e:  # noqa: BLE001 - a plugin's own failure, reported with where it happened
            raise XModelError(f"plugin {plugin.name!r} failed computing {op_type} op {name!r}: "
                              f"{type(e).__name__}: {e}") from None
    return call


def emulator_device(arch: Any) -> Any:
    """The emulator of `arch`'s instruction set as a device (runtime.device.emulator_device)."""
    from ..runtime.device import emulator_device as make

    return make(arch)


def _device(device: Any, arch: Any, options: dict, source: str) -> Any:
    if device == "emulator":
        if options:
            raise XModelError(f"device='emulator' takes no options (got {sorted(options)})")
        return emulator_device(arch)
    if device == "pynq":
        from ..runtime.pynq_driver import PynqDevice

        device = PynqDevice(**options)
    elif isinstance(device, str):
        raise XModelError(f"device={device!r}: expected 'emulator', 'pynq' or a device object")
    dev_arch = getattr(device, "arch", None)
    if dev_arch is None or not callable(getattr(device, "execute", None)):
        raise XModelError(f"device {device!r} is not a DPU device (needs .arch and .execute(sg, regions))")
    if int(dev_arch.fingerprint) != int(arch.fingerprint):
        raise XModelError(f"{source}: compiled for DPU fingerprint {arch.fingerprint:#x} ({arch.name}) but the "
                          f"device has {int(dev_arch.fingerprint):#x} ({dev_arch.name})")
    return device


def load_xmodel(path_or_model: str | os.PathLike | bytes | XModel, device: Any = "emulator",
                **device_options: Any) -> XModelRunner:
    """A vai_c .xmodel ready to run on `device` ("emulator", "pynq" with `device_options`, or a device object
    whose DPU fingerprint is the xmodel's)."""
    from ..arch import load_arch
    from ..arch.arch import require_support

    model = path_or_model if isinstance(path_or_model, XModel) else read_xmodel(path_or_model)
    subs = model.dpu_subgraphs()
    fingerprints = {s.fingerprint for s in subs}
    if len(fingerprints) > 1:
        raise XModelError(f"{model.source}: DPU subgraphs for several DPUs {sorted(hex(f) for f in fingerprints)}")
    arch = None
    if subs:
        try:
            arch = load_arch(subs[0].fingerprint)
        except DPUError as e:
            raise XModelError(f"{model.source}: DPU fingerprint {subs[0].fingerprint:#x}: {e}") from None
        try:
            require_support(arch, "run")
            arch.instruction_set  # noqa: B018 - a core with no instruction table (DPUCZDX8G ISA0) is refused here
        except DPUError as e:
            raise XModelError(f"{model.source}: {e}") from None
    dev = _device(device, arch, device_options, model.source) if arch is not None else None
    programs = {s.name: _program(model, s, arch.name) for s in subs}
    order = _topological(model, [c for c in model.root.children if c.device in ("USER", "DPU", "CPU")])
    inputs = [InputSpec(op.name, op.output.shape, "float32") for sg in model.user_subgraphs()
              for op in _ops_in_order(model, sg.all_ops())]
    consumed = {n for op in model.ops for n in op.input_ops}
    placed = {n for sg in order for n in sg.all_ops()}
    outputs = [InputSpec(op.name, op.output.shape, _dtype_of(op.output)) for op in model.ops
               if op.name not in consumed and op.name in placed and op.type not in ("const", "const-fix")]
    return XModelRunner(model, dev, programs, order, inputs, outputs)


__all__ = ["DpuProgram", "XModelRunner", "emulator_device", "load_xmodel", "tensor_view"]
