"""Frontend: ONNX import (TVM's importer + checks + provenance) and numpy-only normalization passes.

Public API::

    from_onnx(path_or_model, shapes=None, *, normalize=True) -> tvm.IRModule
    normalize(mod) -> tvm.IRModule            # and each pass on its own, see .normalize
    source_nodes(mod) -> list[dict]           # original ONNX nodes, with "absorbed_into" where applicable
    node_names(expr, var=None) -> list[str]   # ONNX node names carried by a Call
"""
from .normalize import (
    PASSES,
    batch_norm_to_affine,
    canonicalize_activations,
    dense_to_conv,
    ensure_provenance,
    fold_affine,
    fold_batch_norm,
    fold_constants,
    fold_pad,
    lift_tir,
    mean_to_avg_pool,
    normalize,
    remove_noops,
)
from .onnx_import import from_onnx, model_opset, parse_input_shapes, stable_node_names, supported_opsets
from .provenance import SOURCE_NODES_ATTR, merge, node_names, source_nodes, with_nodes

__all__ = [
    "from_onnx", "normalize", "source_nodes", "node_names", "with_nodes", "merge", "SOURCE_NODES_ATTR",
    "supported_opsets", "model_opset", "parse_input_shapes", "stable_node_names", "ensure_provenance",
    "fold_constants", "remove_noops", "lift_tir",
    "batch_norm_to_affine", "fold_affine", "fold_batch_norm", "fold_pad", "dense_to_conv", "mean_to_avg_pool",
    "canonicalize_activations", "PASSES",
]
