"""A standalone activation on the ALU: leaky_relu, prelu, hard_sigmoid (the ALU's own modes) and relu / relu6
(a 1x1 depthwise conv with a unit weight and the fused act). Activations fused into a conv or eltwise op are that
op's ``act`` attribute, not this kind. prelu params: alpha (C,) int8 slopes. "dpu.sigmoid" is matched only so the
partition report can say why the DPU cannot run it."""
from __future__ import annotations

from tvm_dpu.ops import OpDef, OpSpec

#: The `mode` values of an activation op.
ACTIVATION_MODES = ("leaky_relu", "prelu", "hard_sigmoid", "relu", "relu6")

ACTIVATION = OpDef(
    "activation", OpSpec({"alpha": None}, required=("mode",), optional_params=("alpha",)),
    golden="golden_misc:eval_activation", float_ref="eval_activation", quant="quant_activation",
    fix_points="fp_activation", cost="alu_layer", work="pass_work", emitter="emit_activation",
    patterns=("dpu.activation", "dpu.hard_sigmoid", "dpu.sigmoid"),
    relax_ops=("relax.nn.relu", "relax.clip", "relax.nn.leakyrelu"))
