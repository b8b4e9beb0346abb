"""DNNVM kernel fusion, the graph-level half: templates (data), Algorithm 1 (all template embeddings), the cost of
a group (from timing.analytic or the simulator) and Algorithm 2 (the execution plan: none / greedy / optimal).
The fused code generation that turns a plan into instructions lives in `tvm_dpu.codegen.compiler` (the codegen
stage); `compile_with_fusion` plans and compiles:

    >>> from tvm_dpu.fusion.select import compile_with_fusion
    >>> compiled, plan = compile_with_fusion(quantized_xgraph, arch, "optimal")
"""
from tvm_dpu.fusion.cost import cost, cost_source, tile_width
from tvm_dpu.fusion.isomorphism import all_embeddings, embeddings_vf2, find_embeddings
from tvm_dpu.fusion.opgraph import OpGraph
from tvm_dpu.fusion.select import MODES, candidates, compile_with_fusion, plan_fusion
from tvm_dpu.fusion.templates import TEMPLATES, Template

__all__ = ["MODES", "TEMPLATES", "OpGraph", "Template", "all_embeddings", "candidates", "compile_with_fusion", "cost",
           "cost_source", "embeddings_vf2", "find_embeddings", "plan_fusion", "tile_width"]
