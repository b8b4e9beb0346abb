"""Which fusion templates have a fused emitter (the fused_*.py modules), and whether a group fits it on an arch.

The fused compiler (compiler.compile_graph_fused) emits a group as one pipeline when `emittable`, else member by
member; the fusion search asks the same question to keep only plans whose gains the program realises."""
from __future__ import annotations

from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.fused_conv_add import conv_add_fits
from tvm_dpu.codegen.fused_conv_conv import conv_conv_fits
from tvm_dpu.codegen.fused_conv_pool import conv_pool_fits
from tvm_dpu.codegen.fused_dw_pw import dw_pw_fits
from tvm_dpu.codegen.fused_hconv import hconv_fits
from tvm_dpu.codegen.fused_pw_dw_pw import PW_DW_PW_TEMPLATES, pw_dw_pw_fits
from tvm_dpu.codegen.resident import RESIDENTS, resident_fits
from tvm_dpu.types import Group
from tvm_dpu.xgraph.graph import Graph

#: Templates with a fused emitter; the others run member by member.
FUSED_EMITTERS = ("conv_add", "hconv2", "hconv3", "dw_pw", "conv_conv", "conv_pool", "pw_dw", "pw_dw_pw",
                  "pw_dw_pw_add")


def emittable(group: Group, graph: Graph, arch: Arch) -> bool:
    """Whether `group` compiles to one fused pipeline on `arch` (else it is emitted member by member)."""
    ops = [graph.op(n) for n in group.ops]
    if group.template == "conv_add":
        return conv_add_fits(arch, graph, ops[0])
    if group.template in ("hconv2", "hconv3"):
        return hconv_fits(arch, graph, ops)
    if group.template == "dw_pw":
        return dw_pw_fits(arch, graph, ops[0], ops[1])
    if group.template == "conv_conv":
        return conv_conv_fits(arch, graph, ops[0], ops[1])
    if group.template in ("conv_pool", "pw_dw"):
        return conv_pool_fits(arch, graph, ops[0], ops[1])
    if group.template in PW_DW_PW_TEMPLATES:
        return pw_dw_pw_fits(arch, graph, *ops)
    if group.template in RESIDENTS:
        return resident_fits(arch, graph, ops)
    return False
