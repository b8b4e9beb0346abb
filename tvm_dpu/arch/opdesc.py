"""A framework-neutral description of one coarse operator, as the limit checks see it.

The partitioner (passes/) builds an `OpDesc` from a matched Relax pattern; `arch.limits.check_op`
answers with the reasons (if any) the selected DPU cannot run it.
"""
from __future__ import annotations

from dataclasses import dataclass

from tvm_dpu.ops import limit_kinds

#: Coarse op kinds understood by the limit checks: every XGraph op kind of the op registry (tvm_dpu/ops/) plus
#: the special cases the limits table checks on their own (each OpDef's `limit_kinds`): "global_avg_pool" (an
#: avg_pool2d whose kernel is the input H x W) and "depthwise_conv2d_transpose" (groups == in == out channels).
#: "dense" is checked as a 1x1 conv over a 1x1 feature map; "activation" is a standalone activation on the ALU
#: (`activation` names it; "sigmoid" is checked so the report can say why not).
OP_KINDS = limit_kinds()


@dataclass(frozen=True)
class OpDesc:
    """One operator with the parameters the DPU limits depend on. Shapes are NCHW."""

    kind: str
    in_shape: tuple[int, ...]  # N, C, H, W of the (first) input
    out_shape: tuple[int, ...]  # N, C, H, W of the output
    kernel: tuple[int, int] = (1, 1)  # kh, kw
    stride: tuple[int, int] = (1, 1)  # sh, sw
    dilation: tuple[int, int] = (1, 1)  # dh, dw
    pad: tuple[int, int, int, int] = (0, 0, 0, 0)  # top, left, bottom, right
    groups: int = 1
    # None, a fused act ("relu", "relu6", "leaky_relu", "hard_swish") or, for kind "activation", a mode of
    # tvm_dpu.ops.activation.ACTIVATION_MODES; "sigmoid" is checked so the report can say why not
    activation: str | None = None
    alpha: float | None = None  # LeakyReLU slope
    num_inputs: int = 1  # eltwise / concat
    in_shape2: tuple[int, ...] | None = None  # eltwise: the second operand's shape when it differs (broadcast)
    scale: tuple[int, int] | None = None  # upsample factor (h, w)
    ceil_mode: bool = False
    count_include_pad: bool = True
    dtype: str = "float32"
    name: str = ""  # model node name(s), for messages

    @property
    def in_channels(self) -> int:
        return int(self.in_shape[1])

    @property
    def out_channels(self) -> int:
        return int(self.out_shape[1])
