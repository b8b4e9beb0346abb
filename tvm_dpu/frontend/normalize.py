"""Normalization of an imported Relax module into the form the DPU partitioner's patterns are written against.

``normalize(mod)`` runs, in order (each pass is also callable on its own, ``IRModule -> IRModule``):

1. :func:`ensure_provenance` - a hand-built module gets Var-name provenance (see :mod:`.provenance`);
1b. :func:`~.tir_lift.lift_tir` - ops TVM's own importers lowered to ``call_tir`` at import (Clip -> TIR
   maximum/minimum, Pad, multi-input Min/Max) lifted back to Relax ops (tvm-dpu's importer never emits them);
2. :func:`~.const_fold.fold_constants` - numpy folding of constant subexpressions (no LLVM JIT);
3. :func:`~.cleanup.remove_noops` - Dropout, identity reshape/cast removed, reshape chains merged;
4. :func:`~.fold_bn.batch_norm_to_affine` - inference BN -> per-channel multiply + add;
5. :func:`~.fold_bn.fold_affine` - per-channel scale/shift (BN, Scale, bias, Sub/Div by constants) folded into the
   preceding conv2d / conv2d_transpose / matmul; a scalar input scale folded into the weight;
6. :func:`~.fold_pad.fold_pad` - constant-zero Pad folded into the following conv2d's padding (conv only);
7. :func:`~.dense_to_conv.dense_to_conv` - Gemm/MatMul with constant weight on ``[N, K]`` -> conv2d (+ reshapes);
8. :func:`~.pool.mean_to_avg_pool` - spatial mean / GlobalAveragePool -> avg_pool2d (+ reshape);
9. :func:`~.activation.canonicalize_activations` - Clip/Min/Max/Relu chains -> relu or clip; torch.export's hard swish
   ``(x * clip(x + 3, 0, 6)) / 6`` -> ``x * (clip(x + 3, 0, 6) / 6)``;
10. remove_noops again, ``relax.transform.CanonicalizeBindings`` and ``DeadCodeElimination``, unused PrimFuncs
    dropped.
(``normalize`` chains these rules per binding in one sweep, see :data:`RULES`; the passes give the same result.)

Normalized form (what ``main`` of a conv/BN/ReLU network contains afterwards; all NCHW / OIHW):

* ``conv2d(x, W)`` with ``W`` a constant; padding includes any folded zero Pad; optionally followed by
  ``add(., b)`` with ``b`` a constant of shape ``[1, O, 1, 1]`` (the bias, BN/Scale already folded into W and b).
  Depthwise = ``groups == C == O``. ``conv2d_transpose`` (IOHW) likewise with its bias ``[1, O, 1, 1]``.
* activations: ``nn.relu(x)``, ``clip(x, lo, hi)`` (ReLU6 is ``clip(x, 0, 6)``), ``nn.leakyrelu(x, alpha)``;
* ``nn.max_pool2d``, ``nn.avg_pool2d`` (global average pooling = avg_pool2d with kernel H x W, then
  ``reshape(., [N, C])`` if the ONNX op dropped the spatial dims);
* ``add(a, b)`` of two activations (eltwise), ``concat``, ``reshape`` (Flatten / Reshape stay reshapes), ``nn.softmax``;
* a fully connected layer is ``conv2d`` with kernel H x W over the 4-D tensor before a Flatten, or
  ``reshape([N, K, 1, 1]) -> conv2d 1x1``, then optional bias add ``[1, M, 1, 1]`` and ``reshape(., [N, M])``;
* a BN that follows no conv remains as ``multiply(x, s) + add(., b)`` with ``[1, C, 1, 1]`` constants;
* everything else the importer emitted is left as it was (it will run on the CPU).
Every Call carries provenance; nodes whose Calls disappeared are marked ``absorbed_into`` in the module's
``"tvm_dpu.source_nodes"`` attribute.
"""
from __future__ import annotations


import tvm
from tvm import relax

from . import provenance as prov
from .activation import canonicalize_activations
from .cleanup import remove_noops
from .const_fold import fold_constants
from .dense_to_conv import dense_to_conv
from .fold_bn import batch_norm_to_affine, fold_affine, fold_batch_norm
from .fold_pad import fold_pad
from .pool import absorb_dpu_avgpool_scale, mean_to_avg_pool
from .activation import rule as _act_rule
from .cleanup import rule as _noop_rule
from .const_fold import rule as _fold_rule
from .dense_to_conv import keeps_weight_transpose
from .dense_to_conv import rule as _dense_rule
from .fold_bn import affine_rule as _affine_rule, bn_rule as _bn_rule
from .fold_pad import rule as _pad_rule
from .pool import dpu_scale_rule as _dpu_scale_rule
from .pool import rule as _mean_rule
from .rewrite import Rewriter, bindings, vars_in, rewrite_module
from .tir_lift import lift_tir, rule_for as _lift_rule_for


def ensure_provenance(mod: tvm.IRModule) -> tvm.IRModule:
    """Give every Call without node names the name of the Var it is bound to (hand-built Relax modules); if the
    module has no source-node list, build one from those bindings (op = Relax op name)."""
    need = False
    for _, func in mod.functions.items():
        if isinstance(func, relax.Function):
            for _, b in bindings(func):
                if isinstance(b.value, relax.Call) and not prov.has_provenance(b.value):
                    need = True
                    break
    out = mod
    if need:
        new = {}
        for gv, func in mod.functions.items():
            if isinstance(func, relax.Function) and not (func.attrs is not None and "Codegen" in func.attrs):
                new[gv] = Rewriter(func).run(lambda rw, var, value: None)  # stamps var names on unnamed Calls
        out = tvm.IRModule({gv: new.get(gv, f) for gv, f in mod.functions.items()}, attrs=mod.attrs,
                           global_infos=mod.global_infos)
    if not prov.source_nodes(out) and (out.attrs is None or prov.SOURCE_NODES_ATTR not in out.attrs):
        nodes = []
        for _, func in out.functions.items():
            if not isinstance(func, relax.Function):
                continue
            for _, b in bindings(func):
                if isinstance(b.value, relax.Call):
                    refs: list = []
                    vars_in(b.value, refs)
                    op = b.value.op
                    for n in prov.node_names(b.value):
                        nodes.append({"name": n, "op": str(op.name) if isinstance(op, tvm.ir.Op) else str(op),
                                      "inputs": [str(r.name) for r in refs], "outputs": [str(b.var.name)]})
        seen, uniq = set(), []
        for n in nodes:
            if n["name"] not in seen:
                seen.add(n["name"])
                uniq.append(n)
        out = prov.set_source_nodes(out, uniq)
    return out


def remove_unused_functions(mod: tvm.IRModule) -> tvm.IRModule:
    """Drop PrimFuncs no Relax function refers to any more (e.g. TE kernels of folded importer ops)."""
    used: set[str] = set()

    def visit(e):
        if isinstance(e, tvm.ir.GlobalVar):
            used.add(str(e.name_hint))

    for _, f in mod.functions.items():
        if isinstance(f, relax.Function):
            relax.analysis.post_order_visit(f, visit)
    keep = {gv: f for gv, f in mod.functions.items() if isinstance(f, relax.Function) or str(gv.name_hint) in used}
    if len(keep) == len(mod.functions):
        return mod
    return tvm.IRModule(keep, attrs=mod.attrs, global_infos=mod.global_infos)


PASSES = (
    ("lift_tir", lift_tir),
    ("fold_constants", fold_constants),
    ("remove_noops", remove_noops),
    ("batch_norm_to_affine", batch_norm_to_affine),
    ("fold_affine", fold_affine),
    ("fold_pad", fold_pad),
    ("dense_to_conv", dense_to_conv),
    ("mean_to_avg_pool", mean_to_avg_pool),
    ("absorb_dpu_avgpool_scale", absorb_dpu_avgpool_scale),
    ("canonicalize_activations", canonicalize_activations),
    ("remove_noops", remove_noops),
)


def _const_rule(rw, var, value):
    """const_fold's rule, except for a Gemm weight's transpose that _dense_rule reads as a view (in the chained
    sweep only; with separate passes it is folded first, which gives the same weights)."""
    return None if keeps_weight_transpose(rw, var, value) else _fold_rule(rw, var, value)


# The same rewrites as PASSES, chained per binding so that normalize() needs one sweep (+ one clean-up sweep)
# instead of nine: each rule sees the already-rewritten producers, so chains still fold completely.
RULES = (_const_rule, _noop_rule, _bn_rule, _affine_rule, _pad_rule, _dense_rule, _mean_rule, _dpu_scale_rule,
         _act_rule)


#: Module attribute normalize() sets: the module is in normalized form, and normalizing it again changes nothing.
#: (The rules are not idempotent in general: a second sweep can fold what the first left, e.g. an input scale into
#: a dense that only became a conv late in the first sweep; so the partition report, partition_for_dpu and the
#: pipeline, which all normalize, must see the module tvm_dpu.build compiles, normalized once.)
NORMALIZED_ATTR = "tvm_dpu.normalized"


def is_normalized(mod: tvm.IRModule) -> bool:
    return mod.attrs is not None and NORMALIZED_ATTR in mod.attrs and bool(mod.attrs[NORMALIZED_ATTR])


def normalize(mod: tvm.IRModule, *, separate_passes: bool = False) -> tvm.IRModule:
    """Run all normalization passes (see module docstring for the order and the resulting form); a module
    normalized already (`NORMALIZED_ATTR`) comes back unchanged (a new module object with the same functions).

    By default the rules run chained in one sweep (same result, ~4x faster); ``separate_passes=True`` runs
    :data:`PASSES` one after the other (for debugging a single rewrite).
    """
    if is_normalized(mod):  # a module of its own all the same: callers may rewrite it in place (tvm_dpu.build)
        return tvm.IRModule(dict(mod.functions), attrs=mod.attrs, global_infos=mod.global_infos)
    mod = ensure_provenance(mod)
    if separate_passes:
        for _, p in PASSES:
            mod = p(mod)
    else:
        mod = rewrite_module(mod, (_lift_rule_for(mod), *RULES))
        mod = rewrite_module(mod, (_noop_rule, _act_rule))
    mod = relax.transform.CanonicalizeBindings()(mod)
    # e.g. the unused indices torch.export's max_pool2d_with_indices leaves (zeros_like), once the tuple is resolved
    mod = relax.transform.DeadCodeElimination()(mod)
    mod = remove_unused_functions(mod)
    return prov.update_absorbed(mod).with_attr(NORMALIZED_ATTR, True)


__all__ = ["normalize", "is_normalized", "NORMALIZED_ATTR", "ensure_provenance", "remove_unused_functions", "lift_tir", "fold_constants", "remove_noops",
           "batch_norm_to_affine", "fold_affine", "fold_batch_norm", "fold_pad", "dense_to_conv",
           "mean_to_avg_pool", "canonicalize_activations", "PASSES"]
