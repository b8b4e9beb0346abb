"""DNNVM kernel fusion: templates (data), Algorithm 1 (all template embeddings), the cost of a group,
Algorithm 2 (the execution plan: none / greedy / optimal) and fused code generation.

    >>> from tvm_dpu.fusion import compile_with_fusion
    >>> compiled, plan = compile_with_fusion(quantized_xgraph, arch, "optimal")
"""
from tvm_dpu.fusion.codegen import FUSED_EMITTERS, compile_graph_fused, compile_with_fusion, emittable, plan_ddr
from tvm_dpu.fusion.costmodel import Group, cost, cost_source, tile_width
from tvm_dpu.fusion.isomorphism import all_embeddings, embeddings_vf2, find_embeddings
from tvm_dpu.fusion.opgraph import OpGraph
from tvm_dpu.fusion.select import MODES, FusionError, FusionPlan, candidates, plan_fusion
from tvm_dpu.fusion.templates import TEMPLATES, Template

__all__ = ["FUSED_EMITTERS", "MODES", "TEMPLATES", "FusionError", "FusionPlan", "Group", "OpGraph", "Template",
           "all_embeddings", "candidates", "compile_graph_fused", "compile_with_fusion", "cost",
           "cost_source", "embeddings_vf2", "emittable", "find_embeddings", "plan_ddr", "plan_fusion", "tile_width"]
