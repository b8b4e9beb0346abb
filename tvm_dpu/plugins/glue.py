"""How enabled plugins join the "dpu" pipeline: a claimer per plugin (its `partition` on the model's ops, before
DPU partitioning), an ExternalCompiler per plugin (calibration with its float reference, then its `compile`), the
`relax.ext.<plugin>` codegen (the compiled bytes embedded in TVM's module like a DPU program), and the blob format
of a plugin subgraph."""
from __future__ import annotations

from typing import Any

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from tvm_dpu.plugins.api import (Plugin, PluginError, PluginGraph, PluginOp, PluginSubgraph, SubgraphOp, call_plugin,
                                 checked_outputs)
from tvm_dpu.security.program_blob import PLUGIN_DISPATCH_FUNC, pack_plugin_program



# ---------------------------------------------------------------------------------------------------------
# Claims
# ---------------------------------------------------------------------------------------------------------
def attrs_to_dict(attrs: Any) -> dict:
    """A Relax op's attributes as plain Python values."""
    if attrs is None:
        return {}
    out: dict = {}
    ti = getattr(type(attrs), "__tvm_ffi_type_info__", None)
    while ti is not None:
        for f in ti.fields:
            v = getattr(attrs, f.name)
            if isinstance(v, (tvm_ffi.Array, list, tuple)):
                v = [x if isinstance(x, (int, float, str)) else (int(x) if hasattr(x, "value") else str(x))
                     for x in v]
            elif v is not None and not isinstance(v, (int, float, bool)):
                v = str(v)
            out.setdefault(f.name, v)
        ti = getattr(ti, "parent_type_info", None)
    return out


def _shape(expr: Any) -> tuple[int, ...] | None:
    try:
        return tuple(int(v) for v in expr.ty.shape.values)
    except (AttributeError, TypeError, ValueError):
        return None


def plugin_graph(mod: tvm.IRModule, infos: list, claimed: set[int]) -> PluginGraph:
    """The unclaimed ops of the tagged module's main, with provenance names and ONNX types."""
    from tvm_dpu.frontend.provenance import source_nodes
    from tvm_dpu.passes.partition import binding_node_names

    try:
        onnx_types = {str(n["name"]): str(n.get("op", "")) for n in source_nodes(mod) or []}
    except Exception:  # no provenance attribute: Relax names only
        onnx_types = {}
    by_var = {}
    ops = []
    for info in infos:
        if info.tag in claimed:
            continue
        names = binding_node_names(info)
        types = [onnx_types[n] for n in names if onnx_types.get(n)]
        op = PluginOp(tag=info.tag, name="+".join(names) or str(info.var.name),
                      type=types[-1] if types else info.op.removeprefix("relax."), relax_op=info.op,
                      attrs=attrs_to_dict(info.call.attrs),
                      input_shapes=[s for s in (_shape(a) for a in info.call.args) if s is not None],
                      output_shape=_shape(info.var))
        by_var[info.var] = op
        ops.append(op)
    for info, op in zip([i for i in infos if i.tag not in claimed], ops):
        op.inputs = [by_var[a] for a in info.call.args if isinstance(a, relax.Var) and a in by_var]
    return PluginGraph(ops)


def claimer(plugin: Plugin):
    """The partition claimer of `plugin`: its `partition` on the ops still unclaimed -> the tags it takes."""
    from tvm_dpu.passes.partition import ExternalClaim

    def claim(mod: tvm.IRModule, infos: list, claimed: set[int]) -> ExternalClaim:
        graph = plugin_graph(mod, infos, claimed)
        by_name = {o.name: o for o in graph.ops}
        tags: set[int] = set()

        def take(item: Any) -> None:
            if isinstance(item, PluginOp):
                if all(item is not o for o in graph.ops):
                    raise PluginError(f"plugin {plugin.name!r} claimed {item!r}, which is not an unclaimed op")
                tags.add(item.tag)
            elif isinstance(item, str):
                if item not in by_name:
                    raise PluginError(f"plugin {plugin.name!r} claimed op {item!r}, which the model does not have "
                                      "(or an earlier plugin took)")
                tags.add(by_name[item].tag)
            elif isinstance(item, (list, tuple, set, frozenset)):
                for x in item:
                    take(x)
            else:
                raise PluginError(f"plugin {plugin.name!r}: partition returned {item!r:.60} (a {type(item).__name__}) "
                                  "among its claims: expected ops (PluginOp), op names, or lists of them")

        take(call_plugin(plugin, "partition", plugin.partition, graph) or [])
        return ExternalClaim(plugin.name, plugin.device, tags)

    return claim


# ---------------------------------------------------------------------------------------------------------
# Subgraphs, compile, codegen
# ---------------------------------------------------------------------------------------------------------
def subgraph_of(fn: relax.Function, symbol: str) -> PluginSubgraph:
    """A plugin partition function (composites inside) as a flat list of ops."""
    from tvm_dpu.frontend.provenance import node_names
    from tvm_dpu.passes.from_relax import walk_function

    ops: list[SubgraphOp] = []
    node_list: list[str] = []

    def name_of(env: dict, a: Any) -> str:
        return env[a]  # a var's tensor name

    def arg_name(env: dict, a: Any, consts: dict, i: int) -> str:
        if isinstance(a, tvm.ir.Constant) and hasattr(a, "value") and hasattr(a.value, "numpy"):
            consts[i] = a.value.numpy()
            return f"const{i}"
        if isinstance(a, relax.Var):
            return env[a]
        return str(a)

    def op(var: relax.Var, call: relax.Call, env: dict) -> str:
        consts: dict = {}
        ins = [arg_name(env, a, consts, i) for i, a in enumerate(call.args)]
        out = f"t{len(ops)}"
        ops.append(SubgraphOp(call.op.name, attrs_to_dict(call.attrs), ins, out, consts))
        node_list.extend(n for n in node_names(call) if n not in node_list)
        return out

    def other(b: Any) -> None:
        raise PluginError(f"plugin partition {symbol}: cannot read {type(b.value).__name__} bindings")

    def walk(f: relax.Function, args: list[str]) -> str:
        return walk_function(f, args, resolve=name_of, on_op=op, on_local_call=walk, on_other=other,
                             aliases=(relax.Var,))

    ret = walk(fn, [f"in{i}" for i in range(len(fn.params))])
    out_shape = _shape(fn.body.body) if hasattr(fn.body, "body") else None
    ret_shapes = [out_shape] if out_shape is not None else []
    return PluginSubgraph(symbol, ops, [_shape(p) for p in fn.params], ret_shapes, [ret], node_list)


def external_compiler(plugin: Plugin):
    """How the DPU compile pass calibrates and compiles this plugin's partitions."""
    from tvm_dpu.backend.dpu_compile import ExternalCompiler

    def float_reference(fn: relax.Function, symbol: str, inputs: list[np.ndarray]) -> list[np.ndarray]:
        sub = subgraph_of(fn, symbol)
        outs = call_plugin(plugin, "float_reference", plugin.float_reference, sub, inputs)
        return checked_outputs(plugin, "float_reference", outs, [tuple(s) for s in sub.output_shapes])

    def compile_(fn: relax.Function, symbol: str, recorded: list[list[np.ndarray]]) -> bytes:
        sub = subgraph_of(fn, symbol)
        payload = call_plugin(plugin, "compile", plugin.compile, sub, recorded)
        if not isinstance(payload, (bytes, bytearray)):
            raise PluginError(f"plugin {plugin.name!r}: compile must return bytes, got {type(payload).__name__}")
        return pack_plugin_program(plugin.name, str(plugin.version), plugin.device, sub.symbol, sub.input_shapes,
                                   sub.output_shapes, sub.node_names, bytes(payload))

    return ExternalCompiler(plugin.name, float_reference, compile_)


def register_codegen(plugin: Plugin) -> None:
    """`relax.ext.<plugin name>`: embed each compiled plugin subgraph in TVM's module (like the DPU's)."""
    from tvm_dpu.backend.ext_module import embedding_codegen

    tvm_ffi.register_global_func(f"relax.ext.{plugin.name}", embedding_codegen(PLUGIN_DISPATCH_FUNC), override=True)


def prepare(plugins: Any) -> tuple[list, list]:
    """(claimers, external compilers) of the enabled plugins (names, objects or classes, in order)."""
    from tvm_dpu.plugins.registry import resolve

    resolved = resolve(plugins)
    for p in resolved:
        register_codegen(p)
    return [claimer(p) for p in resolved], [external_compiler(p) for p in resolved]
