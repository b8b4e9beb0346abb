"""Split a conv whose reduction is too long for one CONV instruction into partial convs summed by ELEW adds.

One CONV reduces every input channel of its window (isa1-semantics.md 6.2), so the weights of one output-channel
group, kh*kw*ceil(ic/cp) rows, must sit in one CONVW bank and ceil(ic/cp) must fit the 8-bit channel_group field
(the limits' in_size and dilation*input_channels rules). VGG-16's fc6 on B1152 (a 7x7 conv over 512 channels,
2107 rows > 2048) and fc7 / fc8 (4096 input channels > 256*12) break them. DNNVM and Vitis AI run such layers on
the DPU; so do we, when the arch's limits say the op splits (`arch.limits.input_channel_chunks`):

    y = act(conv(x, W) + b)   ->   p_k = conv(x[:, slice_k], W[:, slice_k]) (+ b on p_0)    k = 0..K-1
                                   y   = act(p_0 + ... + p_{K-1})                          ELEW add tree

Each partial conv is an XGraph conv2d / dense with attr in_slice = [c0, c] (xgraph/ops.py): its LOADs read only
its channel slice of x, so x is neither copied nor split. Each partial sum p_k is an int8 tensor of its own, so the
calibration (which runs this float graph) gives it a fix_point from its own range, and the add requantizes to the
fix_point of y; the final add applies the activation (relu or none: the ELEW engine's), the partials none. The
add tree takes up to 4 operands per ELEW add (its num field). y keeps its tensor name, so the subgraph's outputs,
the consumers and the QDQ name mapping do not change.

The pass runs on the float XGraph of each DPU partition, before calibration (backend/dpu_compile.py).
"""
from __future__ import annotations

from tvm_dpu.arch.arch import Arch
from tvm_dpu.arch.limits import check_op, input_channel_chunks
from tvm_dpu.arch.opdesc import OpDesc
from tvm_dpu.errors import DPUError
from tvm_dpu.xgraph import ops as xops
from tvm_dpu.xgraph.graph import Graph, Op, Tensor

#: Operands of one ELEW add (the instruction's 2-bit num field: 1..4).
ADD_INPUTS_MAX = 4


class SplitError(DPUError):
    """A conv that is too large for one CONV instruction and cannot be split (names the op and the reason)."""


def describe(op: Op, graph: Graph) -> OpDesc:
    """The limits' view of a conv2d / dense XGraph op (a dense as the conv it is: its kernel covers the input)."""
    win = xops.conv_window(op, graph)
    act = xops.attr(op, "act")
    return OpDesc(kind="conv2d", in_shape=xops.fmap_shape(graph, op.inputs[0], op),
                  out_shape=graph.tensors[op.outputs[0]].shape, kernel=(win.kh, win.kw), stride=(win.sh, win.sw),
                  dilation=(win.dh, win.dw), pad=tuple(win.pads),  # type: ignore[arg-type]
                  groups=int(xops.attr(op, "groups")) if op.type == "conv2d" else 1,
                  activation=None if act == "none" else act, alpha=xops.attr(op, "alpha"), name=op.name)


def split_large_convs(graph: Graph, arch: Arch) -> list[str]:
    """Rewrite, in place, every conv2d / dense of the float `graph` that one CONV cannot reduce on `arch` into
    partial convs over input-channel slices and an ELEW add tree (module docstring). Returns the names of the ops
    split. SplitError naming the op when a split is needed but cannot apply (the limits' reasons)."""
    split: list[str] = []
    out_ops: list[Op] = []
    for op in graph.ops:
        if op.type not in xops.PARTIAL_TYPES or xops.conv_input_slice(op, graph) is not None:
            out_ops.append(op)
            continue
        desc = describe(op, graph)
        slices = input_channel_chunks(arch, desc)
        if len(slices) == 1:
            out_ops.append(op)
            continue
        reasons = check_op(arch, desc)
        if not slices or reasons:
            why = "; ".join(reasons) or "its input channels cannot be split on this arch"
            raise SplitError(f"{op.where()} (model node(s) {', '.join(op.source) or op.name}): too large for one "
                             f"CONV instruction and not split: {why}")
        out_ops += _split(op, graph, slices)
        split.append(op.name)
    graph.ops = out_ops
    return split


def _split(op: Op, graph: Graph, slices: list[tuple[int, int]]) -> list[Op]:
    """The partial convs of `op` over `slices` and the add tree summing them into op's output tensor."""
    w = graph.param(op, "weights")
    assert w is not None and w.data is not None
    data = w.data.reshape(xops.dense_weights_shape(op, graph)) if op.type == "dense" else w.data
    out = graph.tensors[op.outputs[0]]
    parts: list[str] = []
    new_ops: list[Op] = []
    for k, (c0, c) in enumerate(slices):
        wk = data[:, c0:c0 + c]  # a view: the float weights are not copied
        wname = _fresh(graph, f"{w.name}/in{c0}+{c}")
        graph.add_tensor(Tensor(wname, wk.shape, w.dtype, w.fix_point, wk))
        pname = _fresh(graph, f"{out.name}/part{k}")
        graph.add_tensor(Tensor(pname, out.shape, out.dtype))
        params = {"weights": wname}
        if k == 0 and "bias" in op.params:  # the bias once, on the first partial sum
            params["bias"] = op.params["bias"]
        attrs = {**op.attrs, "in_slice": [c0, c], "act": "none"}
        new_ops.append(Op(f"{op.name}/part{k}", op.type, list(op.inputs), [pname], attrs, params, list(op.source)))
        parts.append(pname)
    new_ops += _add_tree(op, graph, parts, out.name)
    if not any(w.name in o.params.values() for o in graph.ops if o is not op):
        del graph.tensors[w.name]  # the partials read views of it
    return new_ops


def _add_tree(op: Op, graph: Graph, parts: list[str], out: str) -> list[Op]:
    """ELEW adds of at most ADD_INPUTS_MAX operands summing `parts` into `out`, op's activation on the last."""
    ops: list[Op] = []
    level = 0
    while len(parts) > ADD_INPUTS_MAX:
        nxt = []
        for j in range(0, len(parts), ADD_INPUTS_MAX):
            group = parts[j:j + ADD_INPUTS_MAX]
            if len(group) == 1:
                nxt.append(group[0])
                continue
            name = _fresh(graph, f"{out}/sum{level}_{j // ADD_INPUTS_MAX}")
            graph.add_tensor(Tensor(name, graph.tensors[out].shape, graph.tensors[out].dtype))
            ops.append(Op(f"{op.name}/sum{level}_{j // ADD_INPUTS_MAX}", "eltwise_add", group, [name],
                          {"act": "none"}, source=list(op.source)))
            nxt.append(name)
        parts, level = nxt, level + 1
    ops.append(Op(f"{op.name}/sum", "eltwise_add", parts, [out], {"act": xops.attr(op, "act")},
                  source=list(op.source)))
    return ops


def _fresh(graph: Graph, name: str) -> str:
    """`name`, or `name` with a numeric suffix when the graph already has a tensor of that name."""
    out, i = name, 1
    while out in graph.tensors:
        out, i = f"{name}.{i}", i + 1
    return out
