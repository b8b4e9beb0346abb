"""Coarse DPU graph (XGraph): tensors with fix_points, coarse ops, subgraph tree, safe serialization and the
bit-exact golden reference of every op."""
from tvm_dpu.xgraph.golden import EVALUATORS, run_graph, run_op
from tvm_dpu.xgraph.graph import DEVICES, DTYPES, Graph, GraphError, Op, Subgraph, Tensor
from tvm_dpu.xgraph.ops import OP_SPECS, infer_shape, quant_params
from tvm_dpu.xgraph.serialize import FORMAT_VERSION, MAGIC, dumps, load, loads, save
from tvm_dpu.xgraph.validate import validate_graph

__all__ = [
    "DEVICES", "DTYPES", "EVALUATORS", "FORMAT_VERSION", "Graph", "GraphError", "MAGIC", "OP_SPECS", "Op",
    "Subgraph", "Tensor", "dumps", "infer_shape", "load", "loads", "quant_params", "run_graph", "run_op", "save", "validate_graph",
]
