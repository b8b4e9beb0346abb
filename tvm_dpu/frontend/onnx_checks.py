"""Checks of an ONNX model against the ONNX operator specification, before and right after TVM imports it.

onnx.checker validates the protobuf and the types of attributes, not their values, and TVM's importer accepts
values the spec forbids (negative pads, zero dilations, a kernel_shape that contradicts the weights) and computes
something. Each check here names the node (or graph input/output) and the rule of the spec it breaks, so the user
gets one clear FrontendError instead of a silently different model or a traceback from deep inside TVM.
"""
from __future__ import annotations

from typing import Any

import onnx
from tvm import relax

from ..errors import FrontendError

#: Element types a model input may have: tvm-dpu feeds float32 (float16/float64/integer arrays are cast to it).
FLOAT_INPUTS = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.FLOAT16: "float16",
                onnx.TensorProto.DOUBLE: "float64"}
#: Element types a model output may have (what a compiled artifact declares and its loader accepts).
OUTPUT_TYPES = {onnx.TensorProto.FLOAT: "float32"}
#: Ops with a sliding window whose pads / strides / dilations / kernel_shape the spec constrains.
_WINDOWED = {"Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "MaxPool", "AveragePool", "LpPool"}
_WEIGHTED = {"Conv", "ConvTranspose", "ConvInteger", "QLinearConv"}


def _type_name(elem_type: int) -> str:
    return onnx.helper.tensor_dtype_to_np_dtype(elem_type).name if elem_type else "undefined"


def check_io(graph: onnx.GraphProto, where: str) -> None:
    """Graph inputs must be float tensors, outputs float32, and there must be at least one input: what the
    runtime feeds and what a compiled artifact can declare."""
    inits = {t.name for t in graph.initializer}
    inputs = [vi for vi in graph.input if vi.name not in inits]
    if not inputs:
        raise FrontendError(f"{where}: the model has no inputs (every graph input is an initializer): there is "
                            "nothing to run it on")
    for vi in inputs:
        t = vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else 0
        if t not in FLOAT_INPUTS:
            raise FrontendError(f"{where}: input {vi.name!r} has element type {_type_name(t)}: tvm-dpu compiles "
                                f"networks with float inputs ({', '.join(FLOAT_INPUTS.values())}); cast "
                                "integer inputs inside the model instead")
    for vi in graph.output:
        t = vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else 0
        if t not in OUTPUT_TYPES:
            raise FrontendError(f"{where}: output {vi.name!r} has element type {_type_name(t)}: a compiled model's "
                                f"outputs are {', '.join(OUTPUT_TYPES.values())} (e.g. return the scores and take "
                                "ArgMax on the host)")


def _ints(node: onnx.NodeProto, name: str) -> list[int] | None:
    for a in node.attribute:
        if a.name == name:
            return list(a.ints)
    return None


def _int(node: onnx.NodeProto, name: str, default: int) -> int:
    for a in node.attribute:
        if a.name == name:
            return int(a.i)
    return default


def check_nodes(graph: onnx.GraphProto, names: list[str], where: str) -> None:
    """Attribute values of windowed ops against the ONNX operator spec (Conv, ConvTranspose, pools)."""
    weights = {t.name: list(t.dims) for t in graph.initializer}
    for node, name in zip(graph.node, names):
        if node.op_type not in _WINDOWED:
            continue
        here = f"{where}: node {name!r} ({node.op_type})"
        kernel = _ints(node, "kernel_shape")
        w = weights.get(node.input[1]) if node.op_type in _WEIGHTED and len(node.input) > 1 else None
        if node.op_type == "QLinearConv" and len(node.input) > 3:
            w = weights.get(node.input[3])
        spatial = len(kernel) if kernel is not None else (len(w) - 2 if w is not None else None)
        if kernel is not None and any(k < 1 for k in kernel):
            raise FrontendError(f"{here}: kernel_shape {kernel} has a dimension below 1")
        if kernel is not None and w is not None and len(w) >= 3 and list(w[2:]) != kernel:
            raise FrontendError(f"{here}: kernel_shape {kernel} contradicts the weight {node.input[1]!r} of shape "
                                f"{w} (the spec requires kernel_shape == W.shape[2:])")
        pads = _ints(node, "pads")
        if pads is not None:
            if any(p < 0 for p in pads):
                raise FrontendError(f"{here}: pads {pads} has a negative value (the spec requires pads >= 0)")
            if spatial is not None and len(pads) != 2 * spatial:
                raise FrontendError(f"{here}: pads {pads} has {len(pads)} values; {2 * spatial} expected (a begin "
                                    f"and an end for each of the {spatial} spatial axes)")
        for attr in ("strides", "dilations"):
            vals = _ints(node, attr)
            if vals is None:
                continue
            if any(v < 1 for v in vals):
                raise FrontendError(f"{here}: {attr} {vals} has a value below 1 (the spec requires {attr} >= 1)")
            if spatial is not None and len(vals) != spatial:
                raise FrontendError(f"{here}: {attr} {vals} has {len(vals)} values; {spatial} expected (one per "
                                    "spatial axis)")
        group = _int(node, "group", 1)
        if group < 1:
            raise FrontendError(f"{here}: group {group} is below 1")
        if w is not None and node.op_type in ("Conv", "ConvInteger", "QLinearConv") and w[0] % group:
            raise FrontendError(f"{here}: the weight's {w[0]} output channels are not divisible by group {group}")


def check_imported(mod: Any, graph: onnx.GraphProto, where: str) -> None:
    """After TVM's import: no data-dependent shapes (the DPU compiler needs static ones), and each graph output's
    declared static shape equal to the shape the model computes."""
    main = mod["main"]
    dynamic = [b for block in getattr(main.body, "blocks", []) for b in block.bindings
               if isinstance(b, relax.MatchCast)]
    if dynamic:
        dyn_ops = sorted({n.op_type for n in graph.node if n.op_type in ("NonZero", "Unique", "Compress",
                                                                          "NonMaxSuppression", "TopK")})
        hint = f" (ops with data-dependent output shapes here: {', '.join(dyn_ops)})" if dyn_ops else ""
        raise FrontendError(f"{where}: the model computes {len(dynamic)} tensor(s) whose shape depends on the "
                            f"input data{hint}; the DPU compiler needs every shape static")
    ret = main.ret_ty
    fields = list(ret.fields) if getattr(ret, "fields", None) is not None else [ret]
    if len(fields) != len(graph.output):
        return  # the importer merged or split outputs: nothing to compare one to one
    for vi, sinfo in zip(graph.output, fields):
        declared = [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim] \
            if vi.type.tensor_type.HasField("shape") else None
        shape = getattr(sinfo, "shape", None)
        values = getattr(shape, "values", None)
        if declared is None or values is None:
            continue
        computed = [int(v) if hasattr(v, "value") else None for v in values]
        clash = len(declared) != len(computed) or any(
            d is not None and d > 0 and c is not None and d != c for d, c in zip(declared, computed))
        if clash:
            shown = [d if d else "?" for d in declared]
            raise FrontendError(f"{where}: output {vi.name!r} is declared with shape {shown} but the model "
                                f"computes {computed}: fix the graph's output declaration")
