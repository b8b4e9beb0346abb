"""DNNVM kernel fusion, the graph-level half: templates (data), Algorithm 1 (all template embeddings), the cost of
a group and Algorithm 2 (the execution plan: none / greedy / optimal). The fused code generation that turns a plan
into instructions lives in `tvm_dpu.codegen.fused` (the codegen stage):

    >>> from tvm_dpu.codegen.fused import compile_with_fusion
    >>> compiled, plan = compile_with_fusion(quantized_xgraph, arch, "optimal")
"""
from tvm_dpu.fusion.costmodel import Group, cost, cost_source, tile_width
from tvm_dpu.fusion.isomorphism import all_embeddings, embeddings_vf2, find_embeddings
from tvm_dpu.fusion.opgraph import OpGraph
from tvm_dpu.fusion.select import MODES, FusionError, FusionPlan, candidates, plan_fusion
from tvm_dpu.fusion.templates import TEMPLATES, Template

__all__ = ["MODES", "TEMPLATES", "FusionError", "FusionPlan", "Group", "OpGraph", "Template", "all_embeddings",
           "candidates", "cost", "cost_source", "embeddings_vf2", "find_embeddings", "plan_fusion", "tile_width"]
