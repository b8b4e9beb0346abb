"""The inverted-residual chain pointwise -> depthwise -> pointwise (codegen.fused_pw_dw_pw), alone or with the add
its project conv feeds (pw_dw_pw_add, a special case at the add's barrier as conv_add is)."""
from __future__ import annotations

from tvm_dpu.templates import ADD, CONV, DEPTHWISE, Pattern, TemplateDef, Tiling, v

_CHAIN = (v("pw", CONV, "conv_plain", "single_consumer"), v("dw", DEPTHWISE, "single_consumer"))
_HOOKS = dict(fits="fused_pw_dw_pw:group_fits", emitter="fused_pw_dw_pw:emit_group", cost="fused_cycles",
              variants="fused_pw_dw_pw:group_variants", relocated=True,
              recheck=True)  # the builder also times the plan searched without them (backend.dpu_compile)

# after pw_dw, so greedy groups as it did before this template existed and the search's in-context check
# (select._in_context) compares the two in their program, where a following op can wait for the whole chain
PW_DW_PW = TemplateDef(
    "pw_dw_pw", 60,
    Pattern("vertical", _CHAIN + (v("pw2", CONV, "pointwise"),), (("pw", "dw"), ("dw", "pw2"))),
    **_HOOKS, doc="pointwise, depthwise, pointwise conv")
# the inverted-residual block whole: its chain is the whole linear path into the add
PW_DW_PW_ADD = TemplateDef(
    "pw_dw_pw_add", 70,
    Pattern("eltwise", _CHAIN + (v("pw2", CONV, "pointwise", "single_consumer"), v("add", ADD, "add2")),
            (("pw", "dw"), ("dw", "pw2"), ("pw2", "add"))),
    **_HOOKS, tiling=Tiling(last_member=False),  # the add adds nothing to the chain's tile
    doc="pw_dw_pw and the add its project conv feeds")
