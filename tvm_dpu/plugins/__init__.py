"""Plugins for custom IP beside the DPU (Vitis AI's plugin mechanism): see `tvm_dpu.plugins.api`.

Enable plugins per compile: `tvm_dpu.build(..., plugins=["softmax_ip"])`, `relax.get_pipeline("dpu", plugins=...)`
or `tvm-dpu compile --options '{"plugins": "softmax_ip"}'`; they run in order before DPU partitioning.
"""
from tvm_dpu.plugins.api import Plugin, PluginError, PluginGraph, PluginOp, PluginSubgraph, SubgraphOp
from tvm_dpu.plugins.registry import available_plugins, get_plugin, register_plugin
from tvm_dpu.plugins.runtime import set_runner, use_runner

__all__ = ["Plugin", "PluginError", "PluginGraph", "PluginOp", "PluginSubgraph", "SubgraphOp", "available_plugins",
           "get_plugin", "register_plugin", "set_runner", "use_runner"]
