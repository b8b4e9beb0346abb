"""Which ONNX tensor each XGraph tensor of a compiled model is, so ONNX-named fix_points (a QDQ model's, see
`qdq.strip_qdq`) become per-subgraph quantizer overrides.

* An op's output is the output of the last (in ONNX graph order) of the ONNX nodes in its `source`: a Conv with
  its folded Add / Relu is the Relu's output.
* A subgraph input is what the first call site of its partition function passes: a model input (the Relax
  parameter keeps the ONNX input name), the output of a CPU op (its last ONNX node), or an output of another DPU
  subgraph (that subgraph's mapping).
* Weights / bias are the inputs 1 / 2 of the op's one Conv / ConvTranspose / Gemm / MatMul node, unless some
  other node that changes them (BatchNormalization, Mul, ...) was folded into the op; with a separate bias Add
  only the weights are mapped.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import tvm
from tvm import relax

from tvm_dpu.frontend.provenance import node_names, source_nodes

_WEIGHTED = ("Conv", "ConvTranspose", "Gemm", "MatMul")
#: ONNX ops that may be merged into a conv-class XGraph op without changing its weights or bias.
_KEEPS_PARAMS = _WEIGHTED + ("Relu", "Clip", "LeakyRelu", "Reshape", "Flatten", "Identity", "Squeeze",
                             "Unsqueeze", "Dropout", "Transpose")


def xgraph_to_onnx(mod: tvm.IRModule, pmod: tvm.IRModule, subgraphs: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """{partition symbol: {XGraph tensor name: ONNX tensor name}} for the tensors that can be traced.

    `mod` is the imported module (with the ONNX source-node list), `pmod` the partitioned one, `subgraphs` the
    FloatSubgraph of each partition symbol.
    """
    nodes = source_nodes(mod)
    order = {n["name"]: i for i, n in enumerate(nodes)}
    by_name = {n["name"]: n for n in nodes}

    def last_output(names: list[str]) -> str | None:
        known = [n for n in names if n in order and by_name[n].get("outputs")]
        if not known:
            return None
        return by_name[max(known, key=order.__getitem__)]["outputs"][0]

    out: dict[str, dict[str, str]] = {}
    for sym, fs in subgraphs.items():
        m: dict[str, str] = {}
        for op in fs.graph.ops:
            t = last_output(list(op.source))
            if t is not None:
                m[op.outputs[0]] = t
            src = [by_name[n] for n in op.source if n in by_name]
            main = [n for n in src if n["op"] in _WEIGHTED]
            if len(main) == 1 and all(n["op"] in _KEEPS_PARAMS + ("Add",) for n in src):
                ins = main[0]["inputs"]
                roles = (("weights", 1),) if any(n["op"] == "Add" for n in src) else (("weights", 1), ("bias", 2))
                for role, idx in roles:
                    if role in op.params and len(ins) > idx and ins[idx]:
                        m[op.params[role]] = ins[idx]
        out[sym] = m
    _map_inputs(pmod, subgraphs, out, last_output)
    return out


def _input_sources(pmod: tvm.IRModule, symbols: Any) -> dict[str, list[tuple]]:
    """{symbol: one source per parameter of its partition function}, read off the function's first call site in
    `main` (a shared function's later sites pass the same kinds of value). A source is ``("param", name)`` (a
    model input), ``("dpu", symbol, index)`` (output `index` of another DPU partition), ``("call", node names)``
    (a CPU op, with its ONNX provenance) or ``None`` when it cannot be traced."""
    main = pmod["main"]
    bound: dict = {}
    for block in main.body.blocks:
        for b in block.bindings:
            bound[b.var] = b.value
    params = {p: str(p.name) for p in main.params}

    def dpu_call(value) -> str | None:
        if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.GlobalVar):
            sym = value.op.name_hint
            return sym if sym in symbols else None
        return None

    def source(e) -> tuple | None:
        for _ in range(64):  # follow var -> var aliases
            if e in params:
                return ("param", params[e])
            v = bound.get(e)
            if v is None:
                return None
            if isinstance(v, relax.Var):
                e = v
                continue
            index = 0
            if isinstance(v, relax.TupleGetItem):
                index, v = v.index, bound.get(v.tuple_value, v.tuple_value)
            sym = dpu_call(v)
            if sym is not None:
                return ("dpu", sym, index)
            if isinstance(v, relax.Call):
                return ("call", node_names(v))
            return None
        return None

    out: dict[str, list[tuple]] = {}
    for value in bound.values():
        sym = dpu_call(value)
        if sym is not None and sym not in out:
            out[sym] = [source(a) for a in value.args]
    return out


def _map_inputs(pmod: tvm.IRModule, subgraphs: Mapping[str, Any], out: dict[str, dict[str, str]],
                last_output) -> None:
    for sym, sources in _input_sources(pmod, subgraphs).items():
        for name, src in zip(subgraphs[sym].input_names, sources):
            t = None
            if src is None:
                continue
            if src[0] == "param":
                t = src[1]
            elif src[0] == "dpu":
                fs = subgraphs[src[1]]
                t = out[src[1]].get(fs.output_names[src[2]]) if src[2] < len(fs.output_names) else None
            else:
                t = last_output(src[1])
            if t is not None:
                out[sym].setdefault(name, t)


def input_display_names(pmod: tvm.IRModule, subgraphs: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """{symbol: {XGraph input tensor: the name a user knows it by}}: the model input's name, the ONNX node of the
    CPU op that produces it, or the producing DPU subgraph's output tensor (itself named after its ONNX node),
    instead of the Relax variable (``lv2``) the partition function's parameter happens to carry."""
    out: dict[str, dict[str, str]] = {}
    for sym, sources in _input_sources(pmod, subgraphs).items():
        names: dict[str, str] = {}
        for name, src in zip(subgraphs[sym].input_names, sources):
            if src is None:
                continue
            if src[0] == "param":
                names[name] = src[1]
            elif src[0] == "dpu":
                outs = subgraphs[src[1]].output_names
                if src[2] < len(outs):
                    names[name] = outs[src[2]]
            elif src[1]:
                names[name] = src[1][0]  # the primary node, as DPU ops are named
        out[sym] = names
    return out


def overrides_for(fs: Any, names: Mapping[str, str], fix_points: Mapping[str, int]) -> dict[str, int]:
    """Quantizer overrides of one subgraph: XGraph tensor -> fix_point, from ONNX-named `fix_points` (an XGraph
    tensor name that is itself a key of `fix_points` is taken as is)."""
    over: dict[str, int] = {}
    for t in fs.graph.tensors:
        key = t if t in fix_points else names.get(t)
        if key is not None and key in fix_points:
            over[t] = int(fix_points[key])
    return over


def uncovered_feature_maps(fs: Any, overrides: Mapping[str, int]) -> list[str]:
    """Feature maps of the subgraph without a fix_point in `overrides` (they need calibration)."""
    fmaps = list(fs.graph.inputs) + [o for op in fs.graph.ops for o in op.outputs]
    return [t for t in fmaps if t not in overrides]
