"""Temporary per-binding tags used while partitioning.

Identity of Relax objects is not stable across FuseOpsByPattern (it rewrites the dataflow block once per
pattern, and it de-duplicates structurally equal composite functions), but spans survive every pass we run.
So, for the duration of `partition`, the span of every Call bound in ``main`` is replaced by a tag naming
the binding's index; pattern checks read it to record rejections against the right binding, and the
original spans (the ONNX provenance) are put back before the module is returned.
"""
from __future__ import annotations

import tvm
from tvm import relax

TAG_PREFIX = "tvm_dpu.tag:"


def make_tag_span(tag: int) -> tvm.ir.Span:
    return tvm.ir.Span(tvm.ir.SourceName(f"{TAG_PREFIX}{tag}"), 0, 0, 0, 0)


def tag_of(expr: relax.Expr) -> int | None:
    """The tag stamped on `expr` by `partition`, or None (untagged expression)."""
    span = getattr(expr, "span", None)
    if span is None:
        return None
    name = str(span.source_name.name)
    if not name.startswith(TAG_PREFIX):
        return None
    return int(name[len(TAG_PREFIX):])
