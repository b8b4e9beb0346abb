"""Writing a compiled model as AMD's .xmodel (an XIR graph), in vai_c's conventions, for VART's DPU runner.

The graph follows what vai_c writes for DPUCZDX8G (docs/deploy.md section 4 lists what VART reads and where each
attribute comes from here):
- root subgraph -> children with `device` USER (one `data-fix` op per model input: int8 NHWC, the fix point
  of the DPU input it feeds), DPU (one per compiled DPU partition) and CPU (the host ops between and after them);
- a DPU subgraph holds an `upload` op per input (its output tensor carries the input's `reg_id`/`ddr_addr`/
  `location`/`stride` in REG_2), the partition's quantized ops as XIR `*-fix` ops with their int8 constants as
  `const-fix` ops (a grouped conv's one per group where codegen packed it, joined by a `concat-fix`), and a
  `download` op per output (the op feeding it carries the output's DDR place in REG_3);
  its attributes carry our machine code (`mc_code`), the regions (REG_0 CONST with its bytes in
  `reg_id_to_parameter_value`, REG_1 workspace, REG_2/REG_3 interface) and the arch fingerprint;
- CPU subgraphs convert with `fix2float`/`float2fix` and hold the model's host ops where XIR has an op for them
  (CPU_OPS: reshape, transpose, concat, softmax, float conv2d with its weights as a `const` op, elementwise
  arithmetic and activations), each with the attributes XIR's op definitions require. Feature maps are NHWC on
  the DPU side; the CPU side keeps the model's NCHW (a `transpose` sits at each fix2float/float2fix of a 4-D map
  and around a CPU conv2d, which XIR defines on NHWC), so the outputs are the model's.
Any other host op makes `xmodel_graph` raise one XModelError naming every such op. Bytes are deterministic.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tvm_dpu.codegen.layout import group_param
from tvm_dpu.types import REG_INPUT, REG_OUTPUT, REG_PARAMS, REG_WORK
from tvm_dpu.xgraph.ops import dense_weights_shape, op_macs
from tvm_dpu.errors import XModelError
from tvm_dpu.xmodel.encode import encode_graph
from tvm_dpu.xmodel.reader import Attr

#: Runner libraries vai_c names in a subgraph's `runner` attribute.
DPU_RUNNER = {"ref": "libvart-cpu-runner.so", "run": "libvart-dpu-runner.so", "sim": "libvart-sim-runner.so"}
CPU_RUNNER = {"ref": "libvart-cpu-runner.so", "run": "libvart-cpu-runner.so", "sim": "libvart-cpu-runner.so"}
_CONTEXT = {REG_PARAMS: "CONST", REG_WORK: "DATA", REG_INPUT: "DATA", REG_OUTPUT: "DATA"}
_CONTEXT_V2 = {REG_PARAMS: "CONST", REG_WORK: "WORKSPACE", REG_INPUT: "INTERFACE", REG_OUTPUT: "INTERFACE"}
_SEGMENT = {REG_PARAMS: "W0", REG_WORK: "D0", REG_INPUT: "D0", REG_OUTPUT: "D0"}
#: Relax host ops with an XIR CPU op (relax op name -> XIR type, as XIR's built-in op definitions name it).
CPU_OPS = {"relax.reshape": "reshape", "relax.flatten": "flatten", "relax.permute_dims": "transpose",
           "relax.concat": "concat", "relax.nn.softmax": "softmax", "relax.nn.conv2d": "conv2d",
           "relax.add": "add", "relax.subtract": "sub", "relax.multiply": "mul", "relax.divide": "div",
           "relax.nn.relu": "relu", "relax.sigmoid": "sigmoid", "relax.tanh": "tanh",
           "relax.nn.leakyrelu": "leaky-relu", "relax.split": "strided_slice"}
#: XIR's elementwise CPU ops (numpy broadcasting of their inputs); the unary ones take no attribute.
_BINARY = ("add", "sub", "mul", "div")
_UNARY = ("relu", "sigmoid", "tanh")
_NONLINEAR = {"none": "NONE", "relu": "RELU", "relu6": "RELU6", "leaky_relu": "LEAKYRELU"}


#: What VART's DPU runner reads from a DPU subgraph and from its input/output tensors, with the AttrValue kind it
#: reads them as (Vitis-AI src/vai_runtime/vart/dpu-runner: dpu_kernel.cpp, dpu_session_base_imp.cpp,
#: dpu_runner_base_imp.cpp, imp/dpu_runner_ddr.cpp); docs/deploy.md section 4 says which are required.
VART_SUBGRAPH_ATTRS = {
    "device": "string_value", "runner": "map_string_2_string_value", "mc_code": "bytes_value",
    "children_topological_sort": "string_vec_value", "reg_id_to_context_type": "map_string_2_string_value",
    "reg_id_to_context_type_v2": "map_string_2_string_value", "reg_id_to_size": "map_string_2_int32_value",
    "reg_id_to_parameter_value": "map_string_2_bytes_value", "dpu_fingerprint": "uint64_value",
    "workload": "uint64_value", "workload_on_arch": "uint64_value"}
VART_TENSOR_ATTRS = {"reg_id": "int32_value", "ddr_addr": "int32_value", "location": "int32_value",
                     "stride": "int32_vec_value", "fix_point": "int32_value"}
#: XIR's DataType::Type numbering of Tensor.data_type.
DATA_TYPES = {"INT": 0, "UINT": 1, "XINT": 2, "XUINT": 3, "FLOAT": 4}


def _a(kind: str, value: Any) -> Attr:
    return Attr(f"{kind}_value", value)


def reg_name(reg_id: int) -> str:
    return f"REG_{reg_id}"


def _fix_attrs(fix_point: int, round_mode: str = "DPU_ROUND") -> dict:
    """The int8 quantization XIR requires on fix2float/float2fix ops (all four REQUIRED in XIR's op definitions) and
    vai_c writes on every fix tensor; vai_c rounds constants PY3_ROUND, feature maps DPU_ROUND."""
    return {"fix_point": _a("int32", int(fix_point)), "bit_width": _a("int32", 8), "if_signed": _a("bool", True),
            "round_mode": _a("string", round_mode)}


def _fix_tensor(name: str, shape: list[int], fix_point: int, round_mode: str = "DPU_ROUND") -> dict:
    return {"tensor_name": name, "tensor_dim": [int(d) for d in shape], "data_type": DATA_TYPES["XINT"],
            "tensor_bit_width": 8, "tensor_attr": _fix_attrs(fix_point, round_mode)}


def _float_tensor(name: str, shape: list[int]) -> dict:
    return {"tensor_name": name, "tensor_dim": [int(d) for d in shape], "data_type": DATA_TYPES["FLOAT"],
            "tensor_bit_width": 32, "tensor_attr": {}}


def _place(tensor: dict, reg_id: int, ddr_addr: int, location: int) -> dict:
    """`tensor` with the DDR place VART's DPU session reads for every tensor of a DPU subgraph."""
    tensor["tensor_attr"].update({"reg_id": _a("int32", int(reg_id)), "ddr_addr": _a("int32", int(ddr_addr)),
                                  "location": _a("int32", int(location))})
    return tensor


def _ddr(tensor: dict, fmap: Any) -> dict:
    """`tensor` at its feature map's DDR place (location 1) with the NHWC byte strides."""
    _place(tensor, fmap.reg_id, fmap.offset, 1)
    tensor["tensor_attr"]["stride"] = _a(
        "int32_vec", [int(fmap.h * fmap.row_pitch), int(fmap.row_pitch), int(fmap.pixel_pitch), 1])
    return tensor


def _on_chip(tensor: dict) -> dict:
    """`tensor` as vai_c marks a map that never leaves the banks: REG_1 (workspace), address 0, location 0."""
    return _place(tensor, REG_WORK, 0, 0)


def _nhwc(shape: tuple[int, ...]) -> list[int]:
    return [shape[0], shape[2], shape[3], shape[1]] if len(shape) == 4 else list(shape)


@dataclass
class _Const:
    """A Relax constant a host op reads (weights, a bias): written as an XIR float `const` op where it is used."""

    data: np.ndarray


@dataclass
class _Val:
    """A value of the model's main function as the graph being written holds it: `op` produces it, `fix` says
    int8 NHWC (with `fix_point`) or float in the model's own layout (`shape`)."""

    op: str
    shape: list[int]
    fix: bool
    fix_point: int = 0


class _Writer:
    def __init__(self, model: Any):
        self.model = model
        self.ops: list[dict] = []
        self.names: set[str] = set()
        self.children: list[dict] = []
        self.cpu_ops: list[str] = []  # the open CPU subgraph's ops
        self.unsupported: list[str] = []
        self.inputs: dict[str, tuple[int, ...]] = {s.name: tuple(s.shape) for s in model.inputs}
        self.placed_inputs: dict[str, _Val] = {}
        self.memo: dict[tuple, _Val] = {}

    # -- emission helpers -----------------------------------------------------------------------------------
    def name(self, want: str) -> str:
        n, k = want, 0
        while n in self.names:
            k += 1
            n = f"{want}_{k}"
        self.names.add(n)
        return n

    def op(self, name: str, typ: str, args: dict[str, list[str]], tensor: dict, attrs: dict | None = None,
           device: str = "CPU") -> str:
        attrs = dict(attrs or {})
        attrs["device"] = _a("string", device)
        self.ops.append({"op_name": name, "op_type": typ, "op_attr": attrs,
                         "args": [{"arg_name": k, "arg_ops": v} for k, v in args.items()],
                         "output_tensor": tensor})
        if device == "CPU":
            self.cpu_ops.append(name)
        return name

    def cpu(self, typ: str, src: str, tensor_shape: list[int], attrs: dict, want: str,
            fix_point: int | None = None) -> str:
        n = self.name(want)
        t = _float_tensor(n, tensor_shape) if fix_point is None else _fix_tensor(n, tensor_shape, fix_point)
        return self.op(n, typ, {"input": [src]}, t, attrs)

    def close_cpu(self) -> None:
        if self.cpu_ops:
            self.children.append({
                "subgraph_name": f"subgraph_{self.cpu_ops[0]}", "op_name": list(self.cpu_ops),
                "subg_attr": {"device": _a("string", "CPU"), "runner": _a("map_string_2_string", CPU_RUNNER)}})
            self.cpu_ops = []

    # -- conversions between the DPU's int8 NHWC and the host's float ---------------------------------------
    def as_float(self, v: _Val | _Const, shape: list[int], want: str = "const") -> str:
        """The op giving `v` as float in the model's layout with `shape` (a constant: a `const` op named `want`)."""
        if isinstance(v, _Const):
            return self.float_const(v.data, want)
        if not v.fix:
            return v.op if list(shape) == v.shape else self.cpu(
                "reshape", v.op, shape, {"shape": _a("int32_vec", list(shape))}, f"{v.op}_reshape")
        key = ("float", v.op, tuple(shape))
        if key in self.memo:
            return self.memo[key].op
        src = self.cpu("fix2float", v.op, v.shape, _fix_attrs(v.fix_point), f"{v.op}_fix2float")
        cur = list(v.shape)
        if len(cur) == 4 and cur[1] * cur[2] > 1:
            cur = [cur[0], cur[3], cur[1], cur[2]]
            src = self.cpu("transpose", src, cur, {"order": _a("int32_vec", [0, 3, 1, 2])}, f"{src}_nchw")
        if cur != list(shape):
            src = self.cpu("reshape", src, list(shape), {"shape": _a("int32_vec", list(shape))}, f"{src}_reshape")
        self.memo[key] = _Val(src, list(shape), False)
        return src

    def as_fix(self, v: _Val, binding: Any) -> str:
        """The op giving `v` as int8 NHWC with the DPU input `binding`'s fix point and map shape."""
        f = binding.fmap
        nhwc = [1, f.h, f.w, f.c]
        if v.fix and v.fix_point == binding.fix_point and v.shape == nhwc:
            return v.op
        key = ("fix", v.op, binding.fix_point, tuple(nhwc))
        if key in self.memo:
            return self.memo[key].op
        src = self.as_float(v, [1, f.c, f.h, f.w] if f.h * f.w > 1 else nhwc)
        if f.h * f.w > 1:
            src = self.cpu("transpose", src, nhwc, {"order": _a("int32_vec", [0, 2, 3, 1])}, f"{src}_nhwc")
        out = self.cpu("float2fix", src, nhwc, _fix_attrs(binding.fix_point), f"{src}_float2fix",
                       fix_point=binding.fix_point)
        self.memo[key] = _Val(out, nhwc, True, binding.fix_point)
        return out

    def model_input(self, name: str, binding: Any) -> _Val:
        """A model input fed straight to a DPU input: a USER `data-fix` op (int8 NHWC, the binding's fix point)."""
        f = binding.fmap
        nhwc = [1, f.h, f.w, f.c]
        have = self.placed_inputs.get(name)
        if have is not None:
            return have
        n = self.name(name)
        self.op(n, "data-fix", {}, _fix_tensor(n, nhwc, binding.fix_point),
                {"shape": _a("int32_vec", nhwc), "data_type": _a("string", "XINT8")}, device="USER")
        self.children.append({"subgraph_name": f"subgraph_{n}", "op_name": [n],
                              "subg_attr": {"device": _a("string", "USER")}})
        v = self.placed_inputs[name] = _Val(n, nhwc, True, binding.fix_point)
        return v

    # -- the DPU subgraph -----------------------------------------------------------------------------------
    def dpu(self, symbol: str, runner: Any, args: list[_Val | str]) -> list[_Val]:
        sg, graph = runner.sg, runner.graph
        if graph is None:
            raise XModelError(f"DPU partition {symbol}: the model carries no quantized graph for it (loaded from "
                              f"an artifact exported with verify_data=False): rebuild it to export an xmodel")
        if len(args) != len(sg.inputs):
            raise XModelError(f"DPU partition {symbol} takes {len(sg.inputs)} inputs, the model passes {len(args)}")
        feeds = []
        for a, b in zip(args, sg.inputs):
            if isinstance(a, str):
                feeds.append(self.model_input(a, b).op)
            else:
                feeds.append(self.as_fix(a, b))
        self.close_cpu()
        children: list[dict] = []
        producer: dict[str, str] = {}  # XGraph tensor -> XIR op producing it in this subgraph
        for k, (src, b) in enumerate(zip(feeds, sg.inputs)):
            n = self.name(f"{src}_upload_{k}")
            self.op(n, "upload", {"input": [src]}, _ddr(_fix_tensor(n, _nhwc(b.shape), b.fix_point), b.fmap),
                    device="DPU")
            producer[b.name] = n
            children.append({"subgraph_name": f"subgraph_{n}", "op_name": [n]})
        out_fmap = {b.name: b for b in sg.outputs}
        for xop in graph.ops:
            names = []
            args_map: dict[str, list[str]] = {"input": [producer[t] for t in xop.inputs]}
            for role, tname in sorted(xop.params.items()):
                made = self.const(graph, sg, xop, role, tname)
                names += made
                args_map[role] = [made[-1]]
            n = self.name(xop.name)
            t_out = graph.tensors[xop.outputs[0]]
            tensor = _fix_tensor(n, _nhwc(t_out.shape), t_out.fix_point)
            place = sg.places.get(t_out.name)
            if t_out.name in out_fmap:
                _ddr(tensor, out_fmap[t_out.name].fmap)
            elif place is not None:
                _ddr(tensor, place)
            elif sg.places:
                _on_chip(tensor)  # a map the program keeps in the banks (a fused group's intermediate)
            else:
                raise XModelError(f"DPU partition {symbol}: its compiled program records no feature-map places "
                                  f"(compiled before they were kept): rebuild the model to export an xmodel")
            typ, attrs = _xir_op(xop, graph)
            self.op(n, typ, args_map, tensor, attrs, device="DPU")
            for t in xop.outputs:
                producer[t] = n
            children.append({"subgraph_name": f"subgraph_{n}", "op_name": names + [n]})
        outs = []
        for b in sg.outputs:
            n = self.name(f"{producer[b.name]}_download_0")
            self.op(n, "download", {"input": [producer[b.name]]}, _fix_tensor(n, _nhwc(b.shape), b.fix_point),
                    device="DPU")
            children.append({"subgraph_name": f"subgraph_{n}", "op_name": [n]})
            outs.append(_Val(n, _nhwc(b.shape), True, b.fix_point))
        regs = sorted(sg.region_sizes)
        workload = 2 * sum(int(op_macs(o, graph)) for o in graph.ops)
        self.children.append({
            "subgraph_name": f"subgraph_{symbol}",
            "subg_attr": {
                "device": _a("string", "DPU"), "runner": _a("map_string_2_string", DPU_RUNNER),
                "dpu_name": _a("string", self.model.arch.dpu_name),
                "dpu_fingerprint": _a("uint64", int(sg.fingerprint)),
                "mc_code": _a("bytes", np.ascontiguousarray(sg.code, dtype="<u4").tobytes()),
                "mc_code_preload": _a("bytes", b""),
                "reg_id_to_context_type": _a("map_string_2_string", {reg_name(r): _CONTEXT[r] for r in regs}),
                "reg_id_to_context_type_v2": _a("map_string_2_string", {reg_name(r): _CONTEXT_V2[r] for r in regs}),
                "reg_id_to_hw_segment": _a("map_string_2_string", {reg_name(r): _SEGMENT[r] for r in regs}),
                "reg_id_to_size": _a("map_string_2_int32", {reg_name(r): int(sg.region_sizes[r]) for r in regs}),
                "reg_id_to_parameter_value": _a("map_string_2_bytes", {
                    reg_name(REG_PARAMS): _param_region(sg)}),
                "children_topological_sort": _a("string_vec", [c["subgraph_name"] for c in children]),
                "if_prefetch": _a("bool", False), "debug_mode": _a("string", "function"),
                # VART's tracing and XLNX_SHOW_DPU_COUNTER read it unguarded: 2 x MACs, as vai_c counts
                "workload": _a("uint64", workload), "workload_on_arch": _a("uint64", workload),
            },
            "subg_child": children})
        return outs

    def const(self, graph: Any, sg: Any, xop: Any, role: str, tname: str) -> list[str]:
        """The ops giving constant `tname` (the last one feeds `xop`): one `const-fix` op, the constant in XIR's
        layout placed in REG_0 where the program's packed copy starts; for a grouped conv, whose codegen packs each
        group's bias and weights side by side, one const-fix op per group at that group's place and a
        `concat-fix` of them (on chip) giving the whole constant to the one grouped conv2d-fix."""
        t = graph.tensors[tname]
        data = np.asarray(t.data, dtype=np.int8)
        if role == "weights" and xop.type == "dense":
            data = data.reshape(dense_weights_shape(xop, graph))
        if data.ndim == 4 and role == "weights" and xop.type == "depthwise_conv2d":
            data = data.transpose(1, 2, 3, 0)  # (C, 1, kh, kw) -> XIR's (multiplier, kh, kw, C)
        elif data.ndim == 4 and role == "weights" and xop.type == "conv2d_transpose":
            data = data.transpose(1, 2, 3, 0)  # ONNX's (I, O, kh, kw) -> XIR's OHWI
        elif data.ndim == 4:
            data = data.transpose(0, 2, 3, 1)  # OIHW -> OHWI, vai_c's layout
        groups = int(xop.attrs.get("groups", 1)) if xop.type == "conv2d" else 1
        if groups == 1:
            return [self.const_fix(sg, xop, tname, tname, data, t.fix_point)]
        # weights OHWI and bias [O] both split along O, as the groups' output channels are
        parts = [self.const_fix(sg, xop, group_param(tname, g), f"{tname}_group{g}", part, t.fix_point)
                 for g, part in enumerate(np.split(data, groups, axis=0))]
        n = self.name(tname)
        self.op(n, "concat-fix", {"input": parts}, _on_chip(_fix_tensor(n, list(data.shape), t.fix_point,
                                                                        "PY3_ROUND")),
                {"axis": _a("int32", 0)}, device="DPU")
        return parts + [n]

    def const_fix(self, sg: Any, xop: Any, key: str, want: str, data: np.ndarray, fix_point: int) -> str:
        """A `const-fix` op holding `data`, at the REG_0 offset codegen recorded for `key`."""
        if key not in sg.param_offsets:
            raise XModelError(f"DPU partition {sg.name}: constant {key!r} of op {xop.name!r} has no place in the "
                              f"program's parameter region: rebuild the model to export an xmodel")
        n = self.name(want)
        tensor = _place(_fix_tensor(n, list(data.shape), fix_point, "PY3_ROUND"), REG_PARAMS,
                        sg.param_offsets[key], 1)
        self.op(n, "const-fix", {}, tensor,
                {"data": _a("bytes", np.ascontiguousarray(data).tobytes()),
                 "shape": _a("int32_vec", list(data.shape)), "data_type": _a("string", "XINT8")}, device="DPU")
        return n

    # -- host ops -------------------------------------------------------------------------------------------
    def host(self, name: str, call: Any, args: list[Any], shapes: list[Any], out_shape: list[Any]) -> Any:
        """One Relax host op; `args` its argument values, `shapes` their Relax shapes (a list for a tuple), as is
        `out_shape` for an op giving a tuple (split: a list of values)."""
        op_name = call.op.name
        typ = CPU_OPS.get(op_name)
        tuple_out = bool(out_shape) and isinstance(out_shape[0], list)
        if typ is None:
            self.unsupported.append(f"{op_name} (Relax value {name})")
            return [_Val(name, s, False) for s in out_shape] if tuple_out else _Val(name, out_shape, False)
        if typ == "strided_slice":  # split: one slice per part along the axis
            src = self.as_float(args[0], shapes[0])
            axis = int(call.attrs.axis) % len(shapes[0])
            outs, start = [], 0
            for k, part in enumerate(out_shape):
                begin, end = [0] * len(part), list(shapes[0])
                begin[axis], end[axis] = start, start + part[axis]
                start += part[axis]
                n = self.name(f"{name}_{k}")
                self.op(n, "strided_slice", {"input": [src]}, _float_tensor(n, part),
                        {"begin": _a("int32_vec", begin), "end": _a("int32_vec", end),
                         "strides": _a("int32_vec", [1] * len(part))})
                outs.append(_Val(n, part, False))
            return outs
        if typ == "concat":
            srcs = [self.as_float(a, s, f"{name}_const{k}") for k, (a, s) in enumerate(zip(args[0], shapes[0]))]
            attrs = {"axis": _a("int32", int(call.attrs.axis))}
            n = self.name(name)
            self.op(n, "concat", {"input": srcs}, _float_tensor(n, out_shape), attrs)
            return _Val(n, out_shape, False)
        if typ == "conv2d":
            return self.conv2d(name, call, args, shapes, out_shape)
        if typ in _BINARY:
            srcs = [self.as_float(a, s, f"{name}_const{k}") for k, (a, s) in enumerate(zip(args, shapes))]
            n = self.name(name)
            self.op(n, typ, {"input": srcs}, _float_tensor(n, out_shape))
            return _Val(n, out_shape, False)
        src = args[0]
        if isinstance(src, _Const):
            self.unsupported.append(f"{op_name} (Relax value {name}) of a constant")
            return _Val(name, out_shape, False)
        src_op = self.as_float(src, shapes[0])
        if typ in _UNARY or typ == "leaky-relu":
            attrs = {"alpha": _a("float", float(call.attrs.alpha))} if typ == "leaky-relu" else {}
            n = self.name(name)
            self.op(n, typ, {"input": [src_op]}, _float_tensor(n, out_shape), attrs)
            return _Val(n, out_shape, False)
        if typ in ("reshape", "flatten"):
            attrs = {"shape": _a("int32_vec", list(out_shape))}
            typ = "reshape"
        elif typ == "transpose":
            attrs = {"order": _a("int32_vec", [int(a) for a in call.attrs.axes])}
        else:
            attrs = {"axis": _a("int32", int(call.attrs.axis))}
        n = self.name(name)
        self.op(n, typ, {"input": [src_op]}, _float_tensor(n, out_shape), attrs)
        return _Val(n, out_shape, False)


    def float_const(self, data: np.ndarray, want: str) -> str:
        """An XIR `const` op (CPU) holding `data` as float32, the type vai_c's float constants have."""
        data = np.ascontiguousarray(np.asarray(data, dtype="<f4"))
        shape = list(data.shape) or [1]
        n = self.name(want)
        return self.op(n, "const", {}, _float_tensor(n, shape),
                       {"data": _a("bytes", data.tobytes()), "shape": _a("int32_vec", shape),
                        "data_type": _a("string", "float32")})

    def conv2d(self, name: str, call: Any, args: list[Any], shapes: list[Any], out_shape: list[int]) -> _Val:
        """A float host conv (NCHW in the model) as XIR's `conv2d`, which is NHWC with OHWI weights: transposes on
        both sides keep the CPU side in the model's layout."""
        at = call.attrs
        x, w = args[0], args[1] if len(args) > 1 else None
        if not isinstance(w, _Const) or isinstance(x, _Const) or str(at.data_layout) != "NCHW" or \
                str(at.kernel_layout) != "OIHW" or len(out_shape) != 4:
            self.unsupported.append(f"relax.nn.conv2d (Relax value {name}): XIR's CPU conv2d is written only for "
                                    f"NCHW input with constant OIHW weights")
            return _Val(name, out_shape, False)
        src = self.as_float(x, shapes[0])
        b, c, h, wd = shapes[0]
        src = self.cpu("transpose", src, [b, h, wd, c], {"order": _a("int32_vec", [0, 2, 3, 1])}, f"{name}_in_nhwc")
        weights = self.float_const(w.data.transpose(0, 2, 3, 1), f"{name}_weights")
        kh, kw = w.data.shape[2:]
        p = [int(v) for v in at.padding]  # Relax: (top, left, bottom, right)
        attrs = {"kernel": _a("int32_vec", [int(kw), int(kh)]),
                 "stride": _a("int32_vec", [int(at.strides[1]), int(at.strides[0])]),
                 "dilation": _a("int32_vec", [int(at.dilation[1]), int(at.dilation[0])]),
                 "pad": _a("int32_vec", [p[1], p[3], p[0], p[2]]), "pad_mode": _a("string", "FLOOR"),
                 "group": _a("int32", int(at.groups))}
        nhwc = _nhwc(tuple(out_shape))
        n = self.name(f"{name}_nhwc")
        self.op(n, "conv2d", {"input": [src], "weights": [weights]}, _float_tensor(n, nhwc), attrs)
        out = self.cpu("transpose", n, list(out_shape), {"order": _a("int32_vec", [0, 3, 1, 2])}, name)
        return _Val(out, list(out_shape), False)


def _param_region(sg: Any) -> bytes:
    """REG_0's bytes exactly as the program sees them (the parameter blob, zero-filled to the region's size)."""
    size = int(sg.region_sizes.get(REG_PARAMS, len(sg.params)))
    out = np.zeros(size, dtype=np.uint8)
    out[: len(sg.params)] = sg.params
    return out.tobytes()


def _xir_op(xop: Any, graph: Any) -> tuple[str, dict]:
    """(XIR type, attributes) of one quantized XGraph op, in vai_c's names (pads [l, r, t, b], NHWC)."""
    a = xop.attrs
    t = xop.type
    nl = {"nonlinear": _a("string", _NONLINEAR.get(a.get("act", "none"), str(a.get("act", "none")).upper()))}

    def pad() -> dict:
        p = a.get("pads", [0, 0, 0, 0])  # XGraph: [top, left, bottom, right]
        return {"pad": _a("int32_vec", [int(p[1]), int(p[3]), int(p[0]), int(p[2])]), "pad_mode": _a("string", "FLOOR")}

    def hw(v: list) -> list[int]:
        return [int(v[1]), int(v[0])]  # XIR lists (w, h)

    if t in ("conv2d", "depthwise_conv2d", "conv2d_transpose"):
        w = graph.tensors[xop.params["weights"]].shape
        kernel = hw(w[2:4])
        attrs = {"kernel": _a("int32_vec", kernel), "stride": _a("int32_vec", hw(a.get("strides", [1, 1]))),
                 "dilation": _a("int32_vec", hw(a.get("dilations", [1, 1]))), **pad(), **nl}
        typ = {"conv2d": "conv2d-fix", "depthwise_conv2d": "depthwise-conv2d-fix",
               "conv2d_transpose": "transposed-conv2d-fix"}[t]
        if t == "conv2d" and int(a.get("groups", 1)) != 1:
            attrs["group"] = _a("int32", int(a["groups"]))
        return typ, attrs
    if t == "dense":
        _, _, h, w = graph.tensors[xop.inputs[0]].shape
        return "conv2d-fix", {"kernel": _a("int32_vec", [int(w), int(h)]), "stride": _a("int32_vec", [1, 1]),
                              "dilation": _a("int32_vec", [1, 1]), "pad": _a("int32_vec", [0, 0, 0, 0]),
                              "pad_mode": _a("string", "FLOOR"), **nl}
    if t in ("max_pool2d", "avg_pool2d"):
        kernel = a.get("kernel")
        if a.get("global"):
            kernel = graph.tensors[xop.inputs[0]].shape[2:4]
        return "pool-fix", {"type": _a("string", "MAX" if t == "max_pool2d" else "AVG"),
                            "kernel": _a("int32_vec", hw(kernel)), "stride": _a("int32_vec", hw(a.get("strides", [1, 1]))),
                            **pad()}
    if t in ("eltwise_add", "eltwise_mul"):
        return "eltwise-fix", {"type": _a("string", "ADD" if t == "eltwise_add" else "MUL"), **nl}
    if t == "concat":
        axis = {0: 0, 1: 3, 2: 1, 3: 2}[int(a.get("axis", 1))]
        return "concat-fix", {"axis": _a("int32", axis)}
    if t == "upsample_nearest":
        return "upsample-fix", {"scale": _a("float_vec", [float(a["scale"][1]), float(a["scale"][0])]),
                                "mode": _a("string", "NEAREST")}
    if t == "activation":
        mode = a.get("mode")
        if mode == "hard_sigmoid":
            return "hard-sigmoid-fix", {}
        if mode == "leaky_relu":
            return "leaky-relu-fix", {"alpha": _a("float", float(a.get("alpha", 0.1)))}
        if mode == "prelu":
            return "prelu-fix", {}
        return {"relu": "relu-fix", "relu6": "relu6-fix"}.get(mode, f"{mode}-fix"), {}
    raise XModelError(f"DPU op {xop.name!r} ({t}) has no XIR op type this writer knows")


def _shape_of(e: Any) -> list[Any]:
    """The static shape of Relax value `e`, a list of them for a tuple, [] when unknown."""
    from tvm import relax

    if isinstance(e.ty, relax.TupleType):
        return [[int(d) for d in f.shape.values] for f in e.ty.fields]
    try:
        return [int(d) for d in e.ty.shape.values]
    except (AttributeError, TypeError):
        return []


class _MainWalk:
    """The bindings of a CompiledModel's Relax `main`, each turned into the writer's DPU subgraph or host op
    (`vals`: what each Relax value became)."""

    def __init__(self, w: "_Writer", model: Any) -> None:
        self.w, self.runners = w, model.runners
        self.fn = model.relax_module["main"]
        self.vals: dict[Any, Any] = {p: str(p.name) for p in self.fn.params}  # model inputs, placed where first used

    def val(self, e: Any) -> Any:
        import tvm
        import tvm.ir.prim.expr as prim
        from tvm import relax

        if isinstance(e, relax.Tuple):
            return [self.val(f) for f in e.fields]
        if isinstance(e, tvm.ir.Constant) and hasattr(e.value, "numpy"):  # a tensor constant (GenericConst)
            return _Const(e.value.numpy())
        if isinstance(e, relax.ShapeExpr):  # reshape's target: the op's output shape says it
            return _Const(np.asarray([int(v) for v in e.values], np.int64))
        if isinstance(e, (prim.IntImm, prim.FloatImm)):  # a scalar argument (clip's bounds)
            return _Const(np.asarray(e.value))
        if e in self.vals:
            return self.vals[e]
        raise XModelError(f"main: value {e} is neither an input nor an earlier binding")

    def float_of(self, v: Any, where: str) -> Any:
        if isinstance(v, str):  # a model input read by a host op
            self.w.unsupported.append(f"{where} (host op reading model input {v!r} directly)")
            return _Val(v, list(self.w.inputs[v]), False)
        return v

    def host_call(self, name: str, e: Any, var: Any) -> Any:
        from tvm import relax

        args = [self.val(a) for a in e.args]
        args = [[self.float_of(x, name) for x in a] if isinstance(a, list) else self.float_of(a, name) for a in args]
        shapes = [[_shape_of(f) for f in a.fields] if isinstance(a, relax.Tuple) else _shape_of(a) for a in e.args]
        return self.w.host(name, e, args, shapes, _shape_of(var))

    def bind(self, b: Any) -> None:
        import tvm
        from tvm import relax

        e, name = b.value, str(b.var.name)
        if isinstance(e, relax.Call) and isinstance(e.op, relax.GlobalVar) and e.op.name_hint in self.runners:
            outs = self.w.dpu(e.op.name_hint, self.runners[e.op.name_hint], [self.val(a) for a in e.args])
            self.vals[b.var] = outs[0] if len(outs) == 1 else outs
        elif isinstance(e, relax.TupleGetItem):
            self.vals[b.var] = self.val(e.tuple_value)[e.index]
        elif isinstance(e, (relax.Tuple, relax.Var)):
            self.vals[b.var] = self.val(e)
        elif isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op):
            self.vals[b.var] = self.host_call(name, e, b.var)
        else:
            what = e.op.name_hint if isinstance(e, relax.Call) and hasattr(e.op, "name_hint") else type(e).__name__
            self.w.unsupported.append(f"{name} ({what})")
            self.vals[b.var] = _Val(name, _shape_of(b.var), False)


def xmodel_graph(model: Any) -> dict:
    """The XIR `Graph` message (as xir_schema dicts) of a CompiledModel built in this process."""
    from tvm_dpu import __version__

    if model.relax_module is None:
        raise XModelError("this model was loaded from an artifact: its host part is a compiled library with no "
                          "op graph, so it cannot be written as an xmodel; export the model right after "
                          "tvm_dpu.build")
    w = _Writer(model)
    walk = _MainWalk(w, model)
    body = walk.fn.body
    for block in body.blocks:
        for b in block.bindings:
            walk.bind(b)
    outs = walk.val(body.body)
    outs = outs if isinstance(outs, list) else [outs]
    for v, spec in zip(outs, model.output_specs()):
        if isinstance(v, str):
            w.unsupported.append(f"output {spec.name} (a model input returned unchanged)")
        else:
            w.as_float(v, list(spec.shape))
    w.close_cpu()
    if w.unsupported:
        raise XModelError(
            "cannot write this model as an xmodel: no XIR CPU op this writer maps for the host op(s) "
            f"{', '.join(w.unsupported)}. The xmodel's host part is limited to XIR's CPU ops "
            f"{', '.join(sorted(set(CPU_OPS.values())))} between DPU partitions, and model inputs must feed a DPU "
            f"partition directly: export the .tvmdpu artifact instead, or run such ops in the application on the "
            f"xmodel's outputs")
    root = {"subgraph_name": "root", "subg_attr": {}, "subg_child": w.children}
    return {"graph_name": "tvm_dpu_model",
            "op_node": w.ops, "subg_root": root,
            "graph_attr": {"origin": _a("string", "tvm-dpu"),
                           # where vai_c names its xcompiler version: `inspect` says who wrote the file from it
                           "libs_info": _a("map_string_2_string", {f"tvm-dpu.{__version__}": __version__})}}


def export_xmodel(model: Any, path: str | os.PathLike[str]) -> Path:
    """Write `model` as an .xmodel (deterministic bytes); returns the path. XModelError when part of the model
    has no XIR equivalent (the message names every such op)."""
    path = Path(path)
    data = encode_graph(xmodel_graph(model))
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path
