"""ONNX -> Relax import through TVM's own importer (``tvm.relax.frontend.onnx``), with input checks that give a
clear :class:`~tvm_dpu.errors.FrontendError` and per-node provenance (see :mod:`.provenance`).

How provenance is obtained: :class:`_TracingImporter` subclasses TVM's ``ONNXGraphImporter`` and hooks
``_convert_operator`` (called once per top-level ONNX node, in graph order). The hook *emits* the converter's result
so that every node ends at a binding of its own; all bindings emitted after the previous node's output binding and
up to this node's output binding then belong to this node. A node whose outputs need no new binding (Identity,
Constant, shape arithmetic the importer folds) is recorded as absorbed: a pass-through node into the producer of
its input, any other into its first consumer that has Calls.

The hook also converts four ops directly to plain Relax ops instead of the importer's ``call_tir`` (TE) lowering,
because an opaque ``call_tir`` cannot be pattern-matched or folded later:
``Clip`` with constant bounds -> ``relax.clip``; two-input ``Min``/``Max`` -> ``relax.minimum``/``maximum``;
``Pad`` (constant mode, constant non-negative pads, no ``axes``) -> ``relax.nn.pad``.
Everything else is the importer's conversion, unchanged.

Limitation: for a graph with an ``If`` node the importer builds no dataflow block; the top-level Calls still get
provenance, the Calls inside the If branches do not (such a model cannot be partitioned anyway).
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _tvm_onnx

from ..errors import FrontendError
from ..onnx_inputs import GraphInput, checked_shapes
from . import onnx_checks
from . import provenance as prov
from .onnx_lazy import for_checker, has_lazy_weights, load_lazy, read_tensor
from .rewrite import Rewriter, bindings

_DIRECT_OPS = {"If", "Constant"}  # handled by the importer outside its converter table


def supported_opsets() -> tuple[int, int]:
    """(lowest, highest) ai.onnx opset the TVM importer implements converters for."""
    versions = set()
    for cls in _tvm_onnx._get_convert_map().values():
        for name in dir(cls):
            m = re.fullmatch(r"_impl_v(\d+)", name)
            if m:
                versions.add(int(m.group(1)))
    return (min(versions), max(versions)) if versions else (1, 1)


# ---------------------------------------------------------------------------------------------- loading & checks
@dataclass
class NamedModel:
    """A ModelProto already in memory and the name errors give it (the file it was read from), so a caller
    that read the file itself neither parses a large model twice nor gets errors about ``<in-memory model>``.

    Passing one hands the model over: the import takes the proto out (`take`), so nothing that still refers to
    the NamedModel (the caller's list, the argument tuple of a ``build(model, **options)`` call) keeps a large
    model (VGG-16: 0.5 GB of weights) alive once it is imported."""

    proto: onnx.ModelProto | None
    where: str

    def take(self) -> onnx.ModelProto:
        """The proto, which this NamedModel no longer holds; FrontendError if it was taken already."""
        if self.proto is None:
            raise FrontendError(f"{self.where}: this model was handed over already (a NamedModel is imported once)")
        proto, self.proto = self.proto, None
        return proto


def load_model(path_or_model: Any) -> tuple[onnx.ModelProto, str]:
    """(ModelProto, where) from a path, bytes, ModelProto or NamedModel; FrontendError for anything unreadable."""
    if isinstance(path_or_model, NamedModel):
        return path_or_model.take(), path_or_model.where
    if isinstance(path_or_model, onnx.ModelProto):
        return path_or_model, "<in-memory model>"
    if isinstance(path_or_model, (bytes, bytearray)):
        try:
            return onnx.load_model_from_string(bytes(path_or_model)), "<bytes>"
        except Exception as err:  # noqa: BLE001 - protobuf raises DecodeError / RuntimeWarning variants
            raise FrontendError(f"the given bytes are not a valid ONNX protobuf: {err}") from None
    if isinstance(path_or_model, (str, os.PathLike)):
        path = os.fspath(path_or_model)
        if not os.path.isfile(path):
            raise FrontendError(f"ONNX file not found: {path}")
        try:
            return load_lazy(path), path  # the large weights stay in the file until the importer reads them
        except Exception as err:  # noqa: BLE001
            raise FrontendError(f"{path} is not a valid ONNX model file (protobuf parse failed: {err})") from None
    raise FrontendError(f"expected an ONNX file path or onnx.ModelProto, got {type(path_or_model).__name__}")


def _check_model(model: onnx.ModelProto, where: str) -> None:
    if len(model.graph.node) == 0 and not model.graph.output:
        raise FrontendError(f"{where} contains no ONNX graph (empty or not an ONNX model)")
    if model.ir_version < 3:
        raise FrontendError(f"{where}: ONNX IR version {model.ir_version} is too old (TVM's importer needs >= 3)")
    lazy = has_lazy_weights(model)
    checked = for_checker(model, where) if lazy else None  # its own errors are FrontendErrors: not caught below
    try:
        if lazy:  # weights left in the file: checked without reading them again
            onnx.checker.check_model(checked)
        elif where.endswith(".onnx") and os.path.isfile(where):
            onnx.checker.check_model(where)  # path form also handles > 2 GB models with external data
        else:  # the checker wants the values in the proto
            onnx.checker.check_model(model)
    except Exception as err:  # noqa: BLE001 - onnx raises ValidationError and a few others
        text = " ".join(str(err).split()) or type(err).__name__  # the whole message, on one line
        raise FrontendError(f"{where}: onnx.checker rejected the model: {text}") from None


def with_output_shapes(model: onnx.ModelProto, where: str) -> onnx.ModelProto:
    """`model` with a shape declared on every graph output, inferred where the file has none (quantizers write
    such outputs; onnxruntime infers them, the checker does not). Unchanged when all are declared."""
    if all(o.type.tensor_type.HasField("shape") for o in model.graph.output):
        return model
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception as err:  # noqa: BLE001 - inference raises InferenceError and others
        raise FrontendError(f"{where}: graph outputs have no declared shape and ONNX shape inference failed: "
                            f"{' '.join(str(err).split())}") from None
    known = {v.name: v for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for o in out.graph.output:
        if not o.type.tensor_type.HasField("shape"):
            v = known.get(o.name)
            if v is None or not v.type.tensor_type.HasField("shape"):
                raise FrontendError(f"{where}: graph output {o.name!r} has no declared shape and ONNX shape "
                                    "inference cannot find one")
            o.type.tensor_type.shape.CopyFrom(v.type.tensor_type.shape)
    return out


def topologically_sorted(model: onnx.ModelProto, where: str) -> onnx.ModelProto:
    """`model` with its nodes in topological order (AMD Quark writes XINT8 models whose nodes are not; onnxruntime
    and the ONNX spec's evaluator accept them, the checker and TVM's importer do not). Nodes already in order keep
    it; otherwise a stable Kahn order (ties by original position). The model is returned unchanged when sorted; a
    cycle is a FrontendError naming its nodes."""
    graph = model.graph
    known = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    produced = {o: k for k, n in enumerate(graph.node) for o in n.output}
    deps = []
    for n in graph.node:
        inner = set()
        for attr in n.attribute:  # subgraph bodies (If/Loop) may read outer tensors
            for sub in list(attr.g.node if attr.HasField("g") else []) + [x for g in attr.graphs for x in g.node]:
                inner.update(sub.input)
        deps.append({produced[i] for i in list(n.input) + sorted(inner) if i not in known and i in produced})
    if all(all(d < k for d in ds) for k, ds in enumerate(deps)):
        return model
    import heapq

    users: dict[int, list[int]] = {}
    missing = [len(ds) for ds in deps]
    for k, ds in enumerate(deps):
        for d in ds:
            users.setdefault(d, []).append(k)
    ready = [k for k, m in enumerate(missing) if m == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        k = heapq.heappop(ready)
        order.append(k)
        for u in users.get(k, []):
            missing[u] -= 1
            if missing[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(graph.node):
        stuck = [graph.node[k].name or graph.node[k].op_type for k in range(len(graph.node)) if k not in set(order)]
        raise FrontendError(f"{where}: the graph has a cycle: node(s) {stuck[:8]} wait on each other (or on a node "
                            "that does)")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend([graph.node[k] for k in order])
    return out


def model_opset(model: onnx.ModelProto) -> int:
    """The model's default-domain (ai.onnx) opset, the one TVM's importer converts against."""
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    return 1


def _check_opset(model: onnx.ModelProto, where: str) -> int:
    opset = model_opset(model)
    lo, hi = supported_opsets()
    if not lo <= opset <= hi:
        raise FrontendError(f"{where}: ONNX opset {opset} is not supported by TVM's ONNX importer "
                            f"(supported ai.onnx opsets: {lo}..{hi}); re-export with an opset in that range")
    return opset


def _check_ops(graph: onnx.GraphProto, names: list[str], where: str) -> None:
    table = _tvm_onnx._get_convert_map()
    bad: dict[str, list[str]] = {}
    for node, name in zip(graph.node, names):
        if node.op_type not in table and node.op_type not in _DIRECT_OPS:
            key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
            bad.setdefault(key, []).append(name)
    if bad:
        lines = [f"  {op}: nodes {', '.join(repr(n) for n in nodes[:8])}{' ...' if len(nodes) > 8 else ''}"
                 for op, nodes in sorted(bad.items())]
        raise FrontendError(f"{where}: ONNX ops not supported by TVM's ONNX importer:\n" + "\n".join(lines))


def stable_node_names(graph: onnx.GraphProto) -> list[str]:
    """One unique name per node: its ONNX name, or ``"<OpType>_<index>"`` if empty (index in graph.node);
    a repeated name gets ``"_<index>"`` appended."""
    seen: set[str] = set()
    out = []
    for i, node in enumerate(graph.node):
        name = node.name or f"{node.op_type}_{i}"
        if name in seen:
            name = f"{name}_{i}"
        seen.add(name)
        out.append(name)
    return out


def _dims(vi: onnx.ValueInfoProto) -> list[int | str] | None:
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
        return None
    out: list[int | str] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value") and d.dim_value > 0:
            out.append(int(d.dim_value))
        else:
            out.append(d.dim_param or "?")
    return out


def _input_shapes(graph: onnx.GraphProto, shapes: dict | None, where: str) -> dict[str, list[int]]:
    inits = {t.name for t in graph.initializer}
    inputs = [GraphInput(vi.name, _dims(vi), vi.type.HasField("tensor_type")) for vi in graph.input
              if vi.name not in inits]
    return checked_shapes(inputs, shapes, where)


def parse_input_shapes(specs: list[str] | tuple[str, ...]) -> dict[str, list[int]]:
    """``["x=1,3,224,224", ...]`` (the CLI's ``--input-shape`` values) -> ``{"x": [1, 3, 224, 224]}``."""
    out: dict[str, list[int]] = {}
    for spec in specs:
        name, sep, dims = str(spec).rpartition("=")
        try:
            shape = [int(d) for d in dims.split(",")]
        except ValueError:
            shape = []
        if not sep or not name or not shape or any(d <= 0 for d in shape):
            raise FrontendError(f"bad --input-shape {spec!r}: expected NAME=D1,D2,... with positive integers, "
                                f"e.g. input=1,3,224,224")
        out[name] = shape
    return out


# ---------------------------------------------------------------------------------------------- importer hook
def _const_scalar(e: Any) -> float | None:
    if isinstance(e, tvm.ir.GenericConst):
        a = e.value.numpy()
        if a.size == 1:
            return float(a.reshape(()))
    return None


def _float_tensor(e: Any) -> bool:
    ty = getattr(e, "ty", None)
    return isinstance(ty, relax.TensorType) and str(ty.dtype).startswith("float")


def _override(op: str, inputs: list, attrs: dict, opset: int) -> relax.Expr | None:
    """Plain-Relax conversions for ops the importer lowers to opaque call_tir (see module docstring)."""
    x = inputs[0] if len(inputs) else None
    if op == "Clip" and _float_tensor(x):
        if opset < 11:
            lo, hi = float(attrs.get("min", -np.inf)), float(attrs.get("max", np.inf))
        else:
            bounds = []
            for i, default in ((1, -np.inf), (2, np.inf)):
                b = inputs[i] if len(inputs) > i else None
                v = default if b is None else _const_scalar(b)
                if v is None:
                    return None
                bounds.append(default if np.isnan(v) else v)
            lo, hi = bounds
        return relax.op.clip(x, relax.prim_value(float(lo)), relax.prim_value(float(hi)))
    if op in ("Min", "Max") and len(inputs) == 2 and all(i is not None for i in inputs):
        a, b = inputs
        if _float_tensor(a) and _float_tensor(b) and str(a.ty.dtype) == str(b.ty.dtype):
            return (relax.op.minimum if op == "Min" else relax.op.maximum)(a, b)
        return None
    if op == "Pad" and _float_tensor(x):
        mode = attrs.get("mode", b"constant")
        mode = mode.decode() if isinstance(mode, bytes) else str(mode)
        if mode != "constant" or (len(inputs) > 3 and inputs[3] is not None):
            return None
        if opset < 11:
            pads, value = list(attrs.get("pads", ())), float(attrs.get("value", 0.0))
        else:
            p = inputs[1] if len(inputs) > 1 else None
            if not isinstance(p, tvm.ir.GenericConst):
                return None
            pads = [int(v) for v in p.value.numpy().reshape(-1)]
            v = inputs[2] if len(inputs) > 2 else None
            value = 0.0 if v is None else _const_scalar(v)
            if value is None:
                return None
        rank = len(x.ty.shape.values) if hasattr(x.ty.shape, "values") else -1
        if len(pads) != 2 * rank or any(q < 0 for q in pads):
            return None
        width = [q for i in range(rank) for q in (pads[i], pads[rank + i])]
        return relax.op.nn.pad(x, width, "constant", float(value))
    return None


#: TVM's own importer class (kept when `name_tvm_imports` puts the naming one in its place).
_TVMImporter = getattr(_tvm_onnx, "_tvm_dpu_original_importer", _tvm_onnx.ONNXGraphImporter)


class _TracingImporter(_TVMImporter):
    """TVM's importer with a per-node hook: emit each node's result, map errors to the node."""

    #: Convert the ops `_override` knows to plain Relax ops (tvm_dpu.from_onnx), or keep TVM's conversions.
    overrides = True

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._subgraph_depth = 0

    def _convert_subgraph(self, bb, graph):  # noqa: D401 - importer hook
        self._subgraph_depth += 1
        try:
            return super()._convert_subgraph(bb, graph)
        finally:
            self._subgraph_depth -= 1

    def _convert_operator(self, op_name, inputs, attrs, opset):  # noqa: D401 - importer hook
        node = attrs.get("tvm_custom", {}).get("name", "?")
        if not self.overrides:
            sym = super()._convert_operator(op_name, inputs, attrs, opset)
            return self._emit(sym) if self._subgraph_depth == 0 else sym
        try:
            sym = _override(op_name, list(inputs), attrs, opset)
            if sym is not None:
                sym = self.bb.normalize(sym)
            else:
                sym = super()._convert_operator(op_name, inputs, attrs, opset)
        except FrontendError:
            raise
        except Exception as err:  # noqa: BLE001 - any converter failure becomes a user-facing error
            msg = str(err).strip().splitlines()
            raise FrontendError(f"ONNX node '{node}' ({op_name}): TVM's importer cannot convert it: "
                                f"{type(err).__name__}: {msg[-1] if msg else ''}") from None
        if self._subgraph_depth == 0:
            sym = self._emit(sym)
        return sym

    def _parse_array(self, tensor_proto):  # noqa: D401 - importer hook
        # A weight load_lazy left in the file is read straight into TVM's tensor.
        tensor = read_tensor(tensor_proto)
        return tensor if tensor is not None else super()._parse_array(tensor_proto)

    def _emit(self, sym: Any) -> Any:
        bb = self.bb
        if isinstance(sym, relax.Call):
            if isinstance(sym.ty, relax.TupleType):
                v = bb.emit(sym)
                return relax.Tuple([bb.emit(relax.TupleGetItem(v, i)) for i in range(len(sym.ty.fields))])
            if isinstance(sym.ty, relax.TensorType):
                return bb.emit(sym)
            return sym
        if isinstance(sym, relax.Var) and isinstance(sym.ty, relax.TupleType):
            return relax.Tuple([bb.emit(relax.TupleGetItem(sym, i)) for i in range(len(sym.ty.fields))])
        if isinstance(sym, relax.Tuple):
            fields = [bb.emit(f) if isinstance(f, relax.Call) and isinstance(f.ty, relax.TensorType) else f
                      for f in sym.fields]
            return relax.Tuple(fields)
        return sym


class _NamingImporter(_TracingImporter):
    """What TVM's own ``from_onnx`` uses once tvm_dpu is imported (`name_tvm_imports`): TVM's conversions and
    errors unchanged, each node's result in a binding of its own, and the ONNX node names attached as provenance,
    so the partition report, the DPU subgraph names and every report name the ONNX nodes, not ``lv22``."""

    overrides = False

    def from_onnx(self, graph, opset, *args, **kwargs):  # noqa: D401 - importer entry point
        mod = super().from_onnx(graph, opset, *args, **kwargs)
        try:
            return _attach_provenance(mod, graph, stable_node_names(graph), self._nodes)
        except Exception:  # noqa: BLE001 - names are for reports: an import TVM made never fails over them
            return mod


def name_tvm_imports() -> None:
    """Make ``tvm.relax.frontend.onnx.from_onnx`` carry ONNX node names (it looks its importer class up by name
    at each call; TVM's class stays the base). Called when that module is imported with tvm_dpu loaded."""
    if _tvm_onnx.ONNXGraphImporter is not _NamingImporter:
        _tvm_onnx._tvm_dpu_original_importer = _TVMImporter
        _tvm_onnx.ONNXGraphImporter = _NamingImporter


# ---------------------------------------------------------------------------------------------- provenance
def _out_vars(e: Any) -> list[relax.Var]:
    if isinstance(e, relax.Var):
        return [e]
    if isinstance(e, relax.Tuple):
        return [v for f in e.fields for v in _out_vars(f)]
    return []


def _binding_owners(binds: list, graph: onnx.GraphProto, names: list[str], table: dict[str, Any]
                    ) -> tuple[list[list[str] | None], dict[relax.Var, str], list[bool]]:
    """Per binding, the ONNX node it was imported for (the bindings up to a node's last output belong to it);
    per Relax var, that node's name; per node, whether it produced any binding."""
    pos = {b.var: i for i, (_, b) in enumerate(binds)}
    owner: list[list[str] | None] = [None] * len(binds)
    var_node: dict[relax.Var, str] = {}
    has_calls: list[bool] = []
    last = -1
    for node, name in zip(graph.node, names):
        ps = [pos[v] for o in node.output if o and o in table for v in _out_vars(table[o]) if v in pos]
        p = max(ps) if ps else -1
        if p > last:
            for i in range(last + 1, p + 1):
                owner[i] = [name]
                var_node[binds[i][1].var] = name
            last = p
            has_calls.append(True)
        else:
            has_calls.append(False)
    return owner, var_node, has_calls


class _Absorption:
    """Which node a node without bindings was absorbed into: the earlier node whose value it passes through, else
    its data input's producer when it returns that value, else its first consumer (breadth first) with
    bindings."""

    def __init__(self, graph: onnx.GraphProto, names: list[str], table: dict[str, Any],
                 var_node: dict[relax.Var, str], has_calls: list[bool]) -> None:
        self.graph, self.names, self.table, self.var_node, self.has_calls = graph, names, table, var_node, has_calls
        self.producer_of = {o: i for i, n in enumerate(graph.node) for o in n.output if o}
        self.consumers: dict[str, list[int]] = {}
        for i, n in enumerate(graph.node):
            for t in n.input:
                if t:
                    self.consumers.setdefault(t, []).append(i)

    def first_consumer(self, i: int) -> str | None:
        todo, seen = [i], {i}
        while todo:
            j = todo.pop(0)
            for o in self.graph.node[j].output:
                for k in self.consumers.get(o, []):
                    if k in seen:
                        continue
                    if self.has_calls[k]:
                        return self.names[k]
                    seen.add(k)
                    todo.append(k)
        return None

    def target(self, i: int) -> str | None:
        node, table = self.graph.node[i], self.table
        outs = [v for o in node.output if o in table for v in _out_vars(table[o])]
        for v in outs:  # pass-through: the output is an earlier node's value
            if v in self.var_node:
                return self.var_node[v]
        srcs = [self.producer_of[t] for t in node.input if t in self.producer_of]
        if outs and srcs and any(v.same_as(table.get(t)) for v in outs for t in node.input):
            k = srcs[0]
            if self.has_calls[k]:
                return self.names[k]
        return self.first_consumer(i)


def _source_nodes(graph: onnx.GraphProto, names: list[str], absorption: _Absorption) -> list[dict]:
    nodes = []
    for i, (node, name) in enumerate(zip(graph.node, names)):
        entry = {"name": name, "op": node.op_type, "inputs": list(node.input), "outputs": list(node.output)}
        if node.domain not in ("", "ai.onnx"):
            entry["domain"] = node.domain
        if not absorption.has_calls[i]:
            entry["absorbed_into"] = absorption.target(i)
        nodes.append(entry)
    # A pass-through chain (Identity -> Identity) must end at a node that has Calls.
    by_name = {n["name"]: n for n in nodes}
    for n in nodes:
        t, hops = n.get("absorbed_into"), 0
        while t is not None and "absorbed_into" in by_name.get(t, {}) and hops < len(nodes):
            t, hops = by_name[t]["absorbed_into"], hops + 1
        if "absorbed_into" in n:
            n["absorbed_into"] = t
    return nodes


def _attach_provenance(mod: tvm.IRModule, graph: onnx.GraphProto, names: list[str],
                       table: dict[str, Any]) -> tvm.IRModule:
    gv = mod.get_global_var("main")
    func = mod[gv]
    binds = bindings(func)
    owner, var_node, has_calls = _binding_owners(binds, graph, names, table)
    nodes = _source_nodes(graph, names, _Absorption(graph, names, table, var_node, has_calls))
    names_by_var = {binds[i][1].var: owner[i] for i in range(len(binds)) if owner[i]}

    def stamp(rw: Rewriter, var: relax.Var, value: relax.Expr):
        if isinstance(value, relax.Call) and var in names_by_var:
            return prov.with_nodes(value, names_by_var[var])
        return None

    new_func = Rewriter(func).run(stamp)
    out = tvm.IRModule({g: (new_func if g.same_as(gv) else f) for g, f in mod.functions.items()},
                       attrs=mod.attrs, global_infos=mod.global_infos)
    return prov.set_source_nodes(out, nodes)


# ---------------------------------------------------------------------------------------------- entry point
def from_onnx(path_or_model: Any, shapes: dict[str, Any] | None = None, *, normalize: bool = True) -> tvm.IRModule:
    """Import an ONNX model (file path, bytes, ``onnx.ModelProto`` or `NamedModel`) as a Relax ``IRModule``.

    Weights become constants inside ``main``'s dataflow block. ``shapes`` maps input name -> static shape and is
    required for inputs with symbolic or unknown dims. Every Call carries the names of the ONNX nodes it came from
    and the module attribute ``"tvm_dpu.source_nodes"`` lists all ONNX nodes (see :mod:`.provenance`);
    ``"tvm_dpu.output_names"`` keeps the graph's output names (what the compiled model's outputs are called).
    With ``normalize=True`` the normalization passes of :mod:`.normalize` are applied.

    Raises :class:`~tvm_dpu.errors.FrontendError` for an unreadable or invalid model, an unsupported opset or
    op, a dynamic input without ``shapes``, a ``shapes`` key that is not an input, or a node the importer rejects.
    """
    model, where = load_model(path_or_model)
    opset = _check_opset(model, where)  # before the checker: its message for a too-new opset is less clear
    sorted_model = topologically_sorted(model, where)
    if sorted_model is not model:  # check what is imported (the file on disk is in the old order)
        model, where = sorted_model, f"{where} (nodes sorted topologically)"
    shaped = with_output_shapes(model, where)
    if shaped is not model:
        model, where = shaped, where if where.startswith("<") or "(" in where else f"{where} (output shapes inferred)"
    _check_model(model, where)
    graph = model.graph
    names = stable_node_names(graph)
    _check_ops(graph, names, where)
    onnx_checks.check_io(graph, where)
    onnx_checks.check_nodes(graph, names, where)
    shape_dict = _input_shapes(graph, shapes, where)
    if any(n.name != s for n, s in zip(graph.node, names)):
        graph = onnx.GraphProto()
        graph.CopyFrom(model.graph)
        for n, s in zip(graph.node, names):
            n.name = s
    importer = _TracingImporter(shape_dict, "float32", keep_params_in_input=False, sanitize=True)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        try:
            mod = importer.from_onnx(graph, opset)
        except FrontendError:
            raise
        except Exception as err:  # noqa: BLE001
            msg = str(err).strip().splitlines()
            raise FrontendError(f"{where}: TVM's ONNX importer failed: {type(err).__name__}: "
                                f"{msg[-1] if msg else ''}") from None
    onnx_checks.check_imported(mod, graph, where)
    mod = _attach_provenance(mod, graph, names, importer._nodes)
    mod = prov.set_output_names(mod, [o.name for o in graph.output])
    if normalize:
        from .normalize import normalize as _normalize
        mod = _normalize(mod)
    return mod


__all__ = ["from_onnx", "load_model", "supported_opsets", "model_opset", "stable_node_names", "parse_input_shapes"]
