"""Provenance: which ONNX nodes every Relax Call came from.

Representation (chosen because it survives FuseOpsByPattern / MergeCompositeFunctions, see the byoc notes):

* Each ``relax.Call`` carries ``tvm.ir.Span(tvm.ir.SourceName(<json>), 1, 1, 1, 1)`` where ``<json>`` is a JSON
  list of ONNX node names, e.g. ``'["conv1","bn1"]'``. The first name is the *primary* node (the one the op
  mainly implements, e.g. the Conv of a folded Conv+BN); the others were merged into it.
* A folded constant (``tvm.ir.GenericConst``) may carry the same kind of span; whoever consumes it merges its names.
* The module attribute ``"tvm_dpu.source_nodes"`` holds a JSON list with one entry per original ONNX node, in graph
  order: ``{"name", "op", "inputs", "outputs"}`` plus ``"absorbed_into": <name or null>`` for a node that no Call
  carries (Identity, Dropout, Constant, shape arithmetic, a BatchNormalization folded into a Conv, ...).
  Nodes with an empty ONNX name are given the stable name ``"<OpType>_<index>"`` (index = position in graph.node).

For a Relax module built by hand (no ONNX), :func:`ensure_provenance` names every Call after the Var it is bound to
and builds the source-node list from those bindings.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import tvm
from tvm import relax

SOURCE_NODES_ATTR = "tvm_dpu.source_nodes"
#: Module attribute: JSON list of the ONNX graph's output names (the compiled model's outputs keep them).
OUTPUT_NAMES_ATTR = "tvm_dpu.output_names"


def make_span(names: Sequence[str]) -> tvm.ir.Span:
    """A span whose source name is the JSON list ``names``."""
    return tvm.ir.Span(tvm.ir.SourceName(json.dumps(list(names))), 1, 1, 1, 1)


def _names_from_span(span: tvm.ir.Span | None) -> list[str] | None:
    if span is None:
        return None
    text = str(span.source_name.name)
    if not text.startswith("["):
        return None
    try:
        names = json.loads(text)
    except ValueError:
        return None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return None
    return names


def has_provenance(expr: relax.Expr) -> bool:
    """True if ``expr`` carries a JSON node-name span."""
    return bool(_names_from_span(getattr(expr, "span", None)))


def node_names(expr: Any, var: relax.Var | None = None) -> list[str]:
    """ONNX node names recorded on ``expr`` (a Call or a Constant).

    Without provenance (a user-built Relax module) the name falls back to ``var.name`` when the binding var is
    given, else ``[]``. A list of names is returned as is.
    """
    if isinstance(expr, (list, tuple)):
        return [str(n) for n in expr]
    names = _names_from_span(getattr(expr, "span", None))
    if names:
        return names
    if var is not None:
        return [str(var.name)]
    return []


def merge(*items: Any) -> list[str]:
    """Ordered union of the node names of ``items`` (exprs or lists of names); the first name stays primary."""
    out: list[str] = []
    seen: set[str] = set()
    for item in items:
        if item is None:
            continue
        for n in node_names(item):
            if n not in seen:
                seen.add(n)
                out.append(n)
    return out


def with_nodes(call: relax.Call, names: Iterable[str]) -> relax.Call:
    """A copy of ``call`` whose span records ``names`` (type information is kept)."""
    names = list(names)
    if not names:
        return call
    ret_ty = call.ty if _has_ty(call) else None
    return relax.Call(call.op, call.args, call.attrs, call.ty_args, make_span(names), ret_ty=ret_ty)


def const_with_nodes(const: tvm.ir.GenericConst, names: Iterable[str]) -> tvm.ir.GenericConst:
    """A copy of ``const`` whose span records ``names``."""
    names = list(names)
    if not names:
        return const
    return tvm.ir.GenericConst(const.value, const.ty, make_span(names))


def _has_ty(expr: relax.Expr) -> bool:
    try:
        return expr.ty is not None
    except (AttributeError, tvm.TVMError):
        return False


def source_nodes(mod: tvm.IRModule) -> list[dict]:
    """The original ONNX nodes of ``mod`` (see module docstring); ``[]`` if the module has none recorded."""
    attrs = mod.attrs
    if attrs is None or SOURCE_NODES_ATTR not in attrs:
        return []
    return json.loads(str(attrs[SOURCE_NODES_ATTR]))


def set_source_nodes(mod: tvm.IRModule, nodes: list[dict]) -> tvm.IRModule:
    """``mod`` with the source-node list replaced."""
    return mod.with_attr(SOURCE_NODES_ATTR, json.dumps(nodes))


def output_names(mod: tvm.IRModule) -> list[str] | None:
    """The source model's output names (``"tvm_dpu.output_names"``), or None if the module has none recorded."""
    attrs = mod.attrs
    if attrs is None or OUTPUT_NAMES_ATTR not in attrs:
        return None
    return [str(n) for n in json.loads(str(attrs[OUTPUT_NAMES_ATTR]))]


def set_output_names(mod: tvm.IRModule, names: list[str]) -> tvm.IRModule:
    """``mod`` recording the source model's output names, in output order."""
    return mod.with_attr(OUTPUT_NAMES_ATTR, json.dumps(list(names)))


def referenced_names(mod: tvm.IRModule) -> set[str]:
    """Every node name carried by some Call in any Relax function of ``mod``."""
    found: set[str] = set()

    def visit(e: relax.Expr) -> None:
        if isinstance(e, relax.Call):
            found.update(_names_from_span(e.span) or ())

    for _, func in mod.functions.items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return found


def update_absorbed(mod: tvm.IRModule, absorbed: dict[str, str | None] | None = None) -> tvm.IRModule:
    """Refresh ``absorbed_into`` of the source nodes after a rewrite.

    A node that only appears as a secondary name of some Call (e.g. a BatchNormalization merged into a Conv) is
    recorded as absorbed into that Call's primary node; ``absorbed`` gives explicit entries for nodes whose Call was
    removed (Dropout, a no-op reshape, ...). Nodes that some Call lists first keep no ``absorbed_into``.
    """
    nodes = source_nodes(mod)
    if not nodes:
        return mod
    primary: set[str] = set()
    secondary: dict[str, str] = {}

    def visit(e: relax.Expr) -> None:
        if isinstance(e, relax.Call):
            names = _names_from_span(e.span)
            if names:
                primary.add(names[0])
                for n in names[1:]:
                    secondary.setdefault(n, names[0])

    for _, func in mod.functions.items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    absorbed = absorbed or {}
    by_name = {n["name"]: n for n in nodes}

    def resolve(name: str | None) -> str | None:
        # Follow chains (a Dropout absorbed into a BN that was itself folded into a Conv).
        seen: set[str] = set()
        while name is not None and name not in primary and name not in seen:
            seen.add(name)
            nxt = secondary.get(name) or absorbed.get(name) or by_name.get(name, {}).get("absorbed_into")
            if nxt is None:
                break
            name = nxt
        return name

    for n in nodes:
        name = n["name"]
        if name in primary:
            n.pop("absorbed_into", None)
        elif name in secondary or name in absorbed or "absorbed_into" in n:
            target = secondary.get(name) or absorbed.get(name) or n.get("absorbed_into")
            n["absorbed_into"] = resolve(target) if target is not None else None
    return set_source_nodes(mod, nodes)
