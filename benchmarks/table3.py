"""DNNVM Table 3's scope, shared by bench_fusion (the utilisation comparison) and bench_calibration (the DNNVM
validation rows): DNNVM mapped "all operations, with the exception of fully connected layers" onto the FPGA
(seed 000, section 6.1), so its GOPS are those of the rest of the network."""
from __future__ import annotations

#: How the Table 3 comparison treats fully connected layers: DNNVM mapped "all operations, with the exception of
#: fully connected layers" onto the FPGA (seed paper, section 6.1), so its GOPS are the rest of the network's.
TABLE3_SCOPE = ("conv part only: the fully connected layers (a conv2d whose kernel covers its whole unpadded input, "
                "as the frontend lowers Gemm/MatMul) are left out of both the ops (2 x MACs) and the cycles (their "
                "ops' share of the simulated program, timing.simulate op_ranges); DNNVM ran them on the CPU")


def is_fully_connected(graph, op) -> bool:
    """A fully connected layer as frontend.dense_to_conv lowers it: one output pixel from a kernel that covers the
    whole unpadded input (every output depends on every input)."""
    from tvm_dpu.xgraph import ops as xops

    if op.type == "dense":
        return True
    if op.type != "conv2d":
        return False
    _, _, h, w = graph.tensors[op.inputs[0]].shape
    _, _, ho, wo = graph.tensors[op.outputs[0]].shape
    win = xops.conv_window(op, graph)
    return (ho, wo) == (1, 1) and (win.kh, win.kw) == (h, w) and not any(win.pads)


def fc_part(graph) -> set[str]:
    """Names of the ops of the classifier: the fully connected layers and what only combines or activates their
    outputs (the ELEW add tree of an input-channel split, a ReLU, a flatten), so a split FC counts whole."""
    part: set[str] = set()
    producer = {t: op.name for op in graph.ops for t in op.outputs}
    for op in graph.ops:  # topological order
        if is_fully_connected(graph, op):
            part.add(op.name)
        elif op.inputs and not op.params and all(producer.get(t) in part for t in op.inputs):
            part.add(op.name)
    return part


def table3(graphs: list, sims: list, arch) -> dict:
    """The DNNVM-comparable figures of one plan (TABLE3_SCOPE): GOPS and utilisation of the network without its
    fully connected layers. A fused group is left out only when all its members are FC (a group mixing both
    would count as conv part: `mixed_groups` says how many there were)."""
    from tvm_dpu.timing.analytic import graph_ops
    from tvm_dpu.xgraph.ops import layer_descs

    work = fc_cycles = cycles = 0.0
    fc, mixed = [], 0
    for g, r in zip(graphs, sims):
        fc_ops = fc_part(g)
        fc += sorted(fc_ops)
        work += graph_ops([ld for ld in layer_descs(g) if ld.name not in fc_ops])
        cycles += r.cycles
        for o in r.ops:
            members = set(o.name.split("+"))
            if members <= fc_ops:
                fc_cycles += o.cycles
            elif members & fc_ops:
                mixed += 1
    peak = arch.pp * arch.icp * arch.ocp * 2 * arch.freq_mhz * 1e6
    gops = work / ((cycles - fc_cycles) / (arch.freq_mhz * 1e6)) / 1e9
    return {"scope": TABLE3_SCOPE, "fc_on_dpu": fc, "fc_cycles": fc_cycles, "ops": work, "gops": gops,
            "utilisation": gops * 1e9 / peak, "mixed_groups": mixed}
