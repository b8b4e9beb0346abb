"""A framework-neutral description of one coarse operator, as the limit checks see it.

The partitioner (passes/) builds an `OpDesc` from a matched Relax pattern; `arch.limits.check_op`
answers with the reasons (if any) the selected DPU cannot run it.
"""
from __future__ import annotations

from dataclasses import dataclass

# Coarse op kinds understood by the limit checks.
OP_KINDS = (
    "conv2d",  # groups == 1 (also dense / inner product rewritten as 1x1 conv)
    "depthwise_conv2d",  # groups == in_channels == out_channels (multiplier 1)
    "conv2d_transpose",
    "depthwise_conv2d_transpose",
    "max_pool2d",
    "avg_pool2d",
    "global_avg_pool",  # processed as avg pool with kernel = input H x W
    "eltwise_add",
    "eltwise_mul",
    "concat",
    "upsample_nearest",
    "dense",  # inner product; checked as a 1x1 conv over a 1x1 feature map
    "activation",  # a standalone activation (`activation` names it) on its own engine (the ALU on ISA1);
    # "hard_sigmoid" is the ALU's own mode (relu6(x + 3) / 6), "sigmoid" is checked so the report can say why not
)


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
    activation: str | None = None  # None, "relu", "relu6", "leaky_relu", "hard_sigmoid", "hard_swish", "prelu",
    # "sigmoid"
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
