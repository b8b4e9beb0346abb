"""Building the partition report (tvm_dpu.types.PartitionReport): every node of the original model, where it
runs, and why not on the DPU.

Rows follow the ORIGINAL model: the ONNX node list stored by the frontend in the module attribute
"tvm_dpu.source_nodes" (nodes removed by import-time folding inherit the placement of the node they were
absorbed into; a removed node without "absorbed_into" inherits from the producer of its first input that a
node produces, else from the first consumer of its output). A Relax module without that attribute gets one row per Op call bound in ``main``, named by
its bound variable.

A node runs on the DPU when every Relax op it became runs there (a reshape or permute_dims that is part of a
node with other ops, e.g. the reshapes around a dense-as-conv, does not decide the placement); a CPU node's
reason is that of its first op left on the CPU. Subgraph ids are 0..S-1 in the
topological order of ``main``.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING

from tvm_dpu.types import NodeReport, PartitionReport

if TYPE_CHECKING:  # pragma: no cover
    from .partition import PartitionResult

SOURCE_NODES_ATTR = "tvm_dpu.source_nodes"

# ONNX-style names for Relax ops in generic reasons when the model has no provenance.
_NOT_ON_DPU_FMT = "{op} has no DPU implementation"


# ---------------------------------------------------------------------------------------------------------
# Building the report
# ---------------------------------------------------------------------------------------------------------
def source_nodes_of(mod) -> list[dict] | None:
    """The frontend's original node list of `mod`, or None for a module without provenance."""
    try:
        from ..frontend.provenance import source_nodes
    except ImportError:
        source_nodes = None
    if source_nodes is not None:
        try:
            nodes = source_nodes(mod)
        except Exception:  # a module the frontend did not produce
            nodes = None
        if nodes:
            return [dict(n) for n in nodes]
    attrs = getattr(mod, "attrs", None)
    if attrs is None or SOURCE_NODES_ATTR not in attrs:
        return None
    raw = attrs[SOURCE_NODES_ATTR]
    return json.loads(str(raw)) if not isinstance(raw, (list, tuple)) else [dict(n) for n in raw]


def _short(op: str) -> str:
    return op.split(".")[-1]


# Layout ops that never decide a node's placement or reason when the node has other ops.
_LAYOUT_OPS = ("reshape", "permute_dims")


def _generic_reason(op_label: str, relax_op: str) -> str:
    """Reason for a CPU op no DPU pattern matched (nothing was even tried against the limits)."""
    short = _short(relax_op)
    if short == "matmul":
        return f"{op_label} stayed a matmul (not rewritten into a conv with a constant weight): no DPU pattern"
    if short in ("relu", "clip", "leakyrelu"):
        return f"{op_label} not fused into a conv/eltwise/pool (the DPU has no standalone activation of this kind)"
    return _NOT_ON_DPU_FMT.format(op=op_label)


def _binding_reason(result: "PartitionResult", tag: int, op_label: str) -> str:
    session = result.session
    if tag in session.excluded:
        return session.excluded[tag]
    if tag in session.rejections:
        return session.rejections[tag][1]
    info = result.infos[tag]
    if _short(info.op) == "call_tir" and info.call.args and hasattr(info.call.args[0], "name_hint"):
        return (f"{op_label} is a call of the TIR function {info.call.args[0].name_hint} (lowered at import, not a "
                "Relax op tvm-dpu knows how to lift back): no DPU pattern matches TIR")
    return _generic_reason(op_label, info.op)


def _note(result: "PartitionResult", tags: list[int]) -> str | None:
    """The mapping note (e.g. a grouped conv's decomposition) of the first of `tags` the checks gave one."""
    notes = result.session.notes
    return next((notes[t] for t in tags if t in notes), None)


def _relax_node_reports(result: "PartitionResult") -> list[NodeReport]:
    """One row per Relax binding, for a module without source (ONNX) nodes."""
    placement, rows = result.placement, []
    for info in result.infos:
        label = _short(info.op)
        dev = placement.device[info.tag]
        rows.append(NodeReport(name=str(info.var.name), op=label, device=dev,
                               subgraph=placement.subgraph.get(info.tag) if dev != "cpu" else None,
                               reason=None if dev != "cpu" else _binding_reason(result, info.tag, label),
                               note=_note(result, [info.tag]) if dev == "dpu" else None))
    return rows


class _SourcePlacement:
    """Where each source (ONNX) node ended up: the placement of the Relax bindings it became, or, for a node that
    became none, that of the node it was absorbed into or of a neighbour."""

    def __init__(self, result: "PartitionResult", nodes: list[dict]) -> None:
        self.result = result
        self.tags_of_node: dict[str, list[int]] = {}
        for info in result.infos:
            for n in result.session.names.get(info.tag, []):
                self.tags_of_node.setdefault(n, []).append(info.tag)
        self.by_name = {str(n["name"]): n for n in nodes}
        self.producer = {str(o): str(n["name"]) for n in nodes for o in n.get("outputs", [])}
        self.consumers: dict[str, list[str]] = {}
        for n in nodes:
            for i in n.get("inputs", []):
                self.consumers.setdefault(str(i), []).append(str(n["name"]))
        self.decided: dict[str, tuple[str, int | None, str | None]] = {}

    def neighbour(self, node: dict) -> str | None:
        """A no-op node the frontend did not attribute (e.g. Dropout): the producer of its data input,
        else the first consumer of its output (e.g. a Constant)."""
        inputs = [str(i) for i in node.get("inputs", []) if str(i) in self.producer]
        if inputs:
            return self.producer[inputs[0]]
        for o in node.get("outputs", []):
            if self.consumers.get(str(o)):
                return self.consumers[str(o)][0]
        return None

    def of_tags(self, tags: list[int], op_label: str) -> tuple[str, int | None, str | None]:
        result, placement = self.result, self.result.placement
        compute = [t for t in tags if _short(result.infos[t].op) not in _LAYOUT_OPS] or tags
        cpu = [t for t in compute if placement.device[t] == "cpu"]
        plugin = [t for t in compute if placement.device[t] not in ("cpu", "dpu")]
        if plugin:  # a custom-IP plugin claimed the node
            return placement.device[plugin[0]], placement.subgraph[plugin[0]], None
        if not cpu:
            return "dpu", placement.subgraph[compute[0]], None
        # the first op of the node left on the CPU explains it (e.g. the conv of a conv+bias)
        return "cpu", None, _binding_reason(result, cpu[0], op_label)

    def decide(self, name: str, seen: tuple = ()) -> tuple[str, int | None, str | None]:
        if name in self.decided:
            return self.decided[name]
        node = self.by_name.get(name, {"name": name, "op": "?"})
        op_label = str(node.get("op", "?"))
        tags = self.tags_of_node.get(name, [])
        if tags:
            res = self.of_tags(tags, op_label)
        else:
            target = node.get("absorbed_into") or self.neighbour(node)
            if target and target != name and target not in seen and target in self.by_name:
                res = self.decide(str(target), seen + (name,))
            else:
                res = ("cpu", None, f"{op_label} left no computation after import (folded away)")
        self.decided[name] = res
        return res


def build_report(mod, result: "PartitionResult") -> PartitionReport:
    """The report of `result` (from `partition_detailed`) for the original module `mod`."""
    arch = result.session.arch
    report = PartitionReport(arch=getattr(arch, "name", str(arch)), subgraphs=len(result.placement.subgraphs))
    nodes = source_nodes_of(mod)
    if nodes is None:
        report.nodes.extend(_relax_node_reports(result))
        return report
    for n in nodes:  # a module without ONNX provenance lists its Relax ops (normalize's ensure_provenance)
        if str(n.get("op", "")).startswith("relax."):
            n["op"] = _short(str(n["op"]))
    where = _SourcePlacement(result, nodes)
    for node in nodes:
        name = str(node["name"])
        dev, sg, reason = where.decide(name)
        note = _note(result, where.tags_of_node.get(name, [])) if dev == "dpu" else None
        report.nodes.append(NodeReport(name=name, op=str(node.get("op", "?")), device=dev, subgraph=sg, reason=reason,
                                       note=note))
    return report
