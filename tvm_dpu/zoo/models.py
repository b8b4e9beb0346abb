"""Topologies of the zoo networks, written against :class:`GraphBuilder`.

Each builder reproduces the published network's layer sequence (torchvision for VGG-16, ResNet-18/50/152 v1.5 and
MobileNetV2; Caffe BVLC for GoogLeNet / Inception-v1). A :class:`Variant` sets resolution, width divisor and class
count, so the reduced variant has the same op sequence as the full-size one, only narrower and smaller.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from .graph_builder import LINEAR_GAIN, GraphBuilder, Tensor


@dataclass(frozen=True)
class Variant:
    """Size parameters of one model variant."""

    resolution: int
    width_divisor: int
    classes: int

    def ch(self, channels: int) -> int:
        """Scaled channel count (at least 1)."""
        return max(1, channels // self.width_divisor)


FULL = Variant(resolution=224, width_divisor=1, classes=1000)
REDUCED = Variant(resolution=64, width_divisor=8, classes=10)


# Residual nets (ResNet, MobileNetV2): a shortcut sum adds the branch's second moment to the block input's, so a
# stage of n blocks would grow it ~2**n. Each branch's last conv is scaled to add RESIDUAL_BRANCH_VAR / n of it,
# bounding a stage's growth by (1 + RESIDUAL_BRANCH_VAR / n) ** n < exp(RESIDUAL_BRANCH_VAR).
RESIDUAL_BRANCH_VAR = 0.5


class Stages:
    """Collects the names of tensors that end a network stage (probed by tests and calibration tools)."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def mark(self, t: Tensor) -> Tensor:
        self.names.append(t.name)
        return t


ModelFn = Callable[[GraphBuilder, Tensor, Variant, Stages], Tensor]


# ----------------------------------------------------------------------------------------------------------------
# VGG-16 (configuration D)
# ----------------------------------------------------------------------------------------------------------------
_VGG16_BLOCKS = ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512), (512, 512, 512))


def vgg16(b: GraphBuilder, x: Tensor, v: Variant, stages: Stages) -> Tensor:
    for i, block in enumerate(_VGG16_BLOCKS, start=1):
        for j, c in enumerate(block, start=1):
            x = b.conv(x, f"conv{i}_{j}", v.ch(c), 3, 1, 1)
            x = b.relu(x, f"relu{i}_{j}")
        x = stages.mark(b.maxpool(x, f"pool{i}", 2, 2))
    x = b.flatten(x, "flatten")
    for k in (6, 7):
        x = b.gemm(x, f"fc{k}", v.ch(4096))
        x = b.relu(x, f"relu{k}")
        x = b.dropout(x, f"drop{k}", 0.5)
    stages.mark(x)
    return b.gemm(x, "fc8", v.classes, gain=LINEAR_GAIN)


# ----------------------------------------------------------------------------------------------------------------
# ResNet v1.5 (torchvision): stride on the 3x3 conv of bottlenecks, conv without bias + BatchNormalization
# ----------------------------------------------------------------------------------------------------------------
def _downsample(b: GraphBuilder, x: Tensor, name: str, out_channels: int, stride: int) -> Tensor:
    x = b.conv(x, f"{name}.downsample.0", out_channels, 1, stride, 0, bias=False, gain=LINEAR_GAIN)
    return b.batchnorm(x, f"{name}.downsample.1")


def _basic_block(b: GraphBuilder, x: Tensor, name: str, planes: int, stride: int, branch_gain: float) -> Tensor:
    identity = x
    y = b.conv(x, f"{name}.conv1", planes, 3, stride, 1, bias=False)
    y = b.relu(b.batchnorm(y, f"{name}.bn1"), f"{name}.relu1")
    y = b.conv(y, f"{name}.conv2", planes, 3, 1, 1, bias=False, gain=LINEAR_GAIN * branch_gain)
    y = b.batchnorm(y, f"{name}.bn2")
    if stride != 1 or x.channels != planes:
        identity = _downsample(b, x, name, planes, stride)
    return b.relu(b.add(y, identity, f"{name}.add"), f"{name}.relu")


def _bottleneck(b: GraphBuilder, x: Tensor, name: str, planes: int, stride: int, branch_gain: float,
                width: int | None = None, groups: int = 1) -> Tensor:
    """ResNet v1.5 bottleneck; ResNeXt passes the grouped 3x3's `width` and `groups`."""
    identity = x
    out = planes * 4
    width = planes if width is None else width
    y = b.conv(x, f"{name}.conv1", width, 1, 1, 0, bias=False)
    y = b.relu(b.batchnorm(y, f"{name}.bn1"), f"{name}.relu1")
    y = b.conv(y, f"{name}.conv2", width, 3, stride, 1, group=groups, bias=False)  # v1.5: stride on the 3x3
    y = b.relu(b.batchnorm(y, f"{name}.bn2"), f"{name}.relu2")
    y = b.conv(y, f"{name}.conv3", out, 1, 1, 0, bias=False, gain=LINEAR_GAIN * branch_gain)
    y = b.batchnorm(y, f"{name}.bn3")
    if stride != 1 or x.channels != out:
        identity = _downsample(b, x, name, out, stride)
    return b.relu(b.add(y, identity, f"{name}.add"), f"{name}.relu")


def _resnet_stem(b: GraphBuilder, x: Tensor, v: Variant) -> Tensor:
    x = b.conv(x, "conv1", v.ch(64), 7, 2, 3, bias=False)
    x = b.relu(b.batchnorm(x, "bn1"), "relu")
    return b.maxpool(x, "maxpool", 3, 2, 1)


def _resnet(block: Callable, layers: tuple[int, int, int, int], groups: int = 1, width_per_group: int = 64) -> ModelFn:
    """ResNet (groups 1) or ResNeXt (`groups` x `width_per_group`d): torchvision's width = planes * wpg / 64 * groups.
    A reduced variant divides the groups by the width divisor too, so each group keeps its full-size width."""
    def build(b: GraphBuilder, x: Tensor, v: Variant, stages: Stages) -> Tensor:
        x = stages.mark(_resnet_stem(b, x, v))
        g = max(1, groups // v.width_divisor)
        for i, (planes, blocks) in enumerate(zip((64, 128, 256, 512), layers), start=1):
            branch_gain = math.sqrt(RESIDUAL_BRANCH_VAR / blocks)
            kw = {} if groups == 1 else {"width": v.ch(planes * width_per_group // 64 * groups), "groups": g}
            for j in range(blocks):
                stride = 2 if i > 1 and j == 0 else 1
                x = block(b, x, f"layer{i}.{j}", v.ch(planes), stride, branch_gain, **kw)
            stages.mark(x)
        x = b.flatten(b.global_avgpool(x, "avgpool"), "flatten")
        return b.gemm(x, "fc", v.classes, gain=LINEAR_GAIN)

    return build


resnet18 = _resnet(_basic_block, (2, 2, 2, 2))
resnet50 = _resnet(_bottleneck, (3, 4, 6, 3))
resnet152 = _resnet(_bottleneck, (3, 8, 36, 3))
resnext50_32x4d = _resnet(_bottleneck, (3, 4, 6, 3), groups=32, width_per_group=4)


# ----------------------------------------------------------------------------------------------------------------
# GoogLeNet / Inception-v1, Caffe BVLC deploy topology (no auxiliary classifiers)
# ----------------------------------------------------------------------------------------------------------------
# (1x1, 3x3_reduce, 3x3, 5x5_reduce, 5x5, pool_proj)
_INCEPTION = {
    "3a": (64, 96, 128, 16, 32, 32),
    "3b": (128, 128, 192, 32, 96, 64),
    "4a": (192, 96, 208, 16, 48, 64),
    "4b": (160, 112, 224, 24, 64, 64),
    "4c": (128, 128, 256, 24, 64, 64),
    "4d": (112, 144, 288, 32, 64, 64),
    "4e": (256, 160, 320, 32, 128, 128),
    "5a": (256, 160, 320, 32, 128, 128),
    "5b": (384, 192, 384, 48, 128, 128),
}
# Caffe pools with ceil mode; a 3x3/2 pool then equals a floor-mode pool with one extra row/column of end padding
# at every size this network sees (input sizes 112, 56, 28, 14 and the reduced 32, 16, 8, 4 are all even).
_CEIL_POOL_PADS = (0, 0, 1, 1)


def _conv_relu(b: GraphBuilder, x: Tensor, prefix: str, tag: str, c: int, k: int, stride: int = 1,
               pad: int = 0) -> Tensor:
    return b.relu(b.conv(x, f"{prefix}/{tag}", c, k, stride, pad), f"{prefix}/relu_{tag}")


def _inception(b: GraphBuilder, x: Tensor, name: str, v: Variant, cfg: tuple[int, ...]) -> Tensor:
    c1, c3r, c3, c5r, c5, cp = (v.ch(c) for c in cfg)
    p = f"inception_{name}"
    br1 = _conv_relu(b, x, p, "1x1", c1, 1)
    br3 = _conv_relu(b, _conv_relu(b, x, p, "3x3_reduce", c3r, 1), p, "3x3", c3, 3, pad=1)
    br5 = _conv_relu(b, _conv_relu(b, x, p, "5x5_reduce", c5r, 1), p, "5x5", c5, 5, pad=2)
    pooled = b.maxpool(x, f"{p}/pool", 3, 1, 1)
    brp = _conv_relu(b, pooled, p, "pool_proj", cp, 1)
    return b.concat([br1, br3, br5, brp], f"{p}/output")


def googlenet(b: GraphBuilder, x: Tensor, v: Variant, stages: Stages, *, lrn: bool = False) -> Tensor:
    """Inception-v1; ``lrn=True`` inserts the two LocalResponseNormalization layers of the Caffe original."""
    x = _conv_relu(b, x, "conv1", "7x7_s2", v.ch(64), 7, 2, 3)
    x = b.maxpool(x, "pool1/3x3_s2", 3, 2, _CEIL_POOL_PADS)
    if lrn:
        x = b.lrn(x, "pool1/norm1")
    x = _conv_relu(b, x, "conv2", "3x3_reduce", v.ch(64), 1)
    x = _conv_relu(b, x, "conv2", "3x3", v.ch(192), 3, 1, 1)
    if lrn:
        x = b.lrn(x, "conv2/norm2")
    x = stages.mark(b.maxpool(x, "pool2/3x3_s2", 3, 2, _CEIL_POOL_PADS))
    for name in ("3a", "3b"):
        x = _inception(b, x, name, v, _INCEPTION[name])
    x = stages.mark(b.maxpool(x, "pool3/3x3_s2", 3, 2, _CEIL_POOL_PADS))
    for name in ("4a", "4b", "4c", "4d", "4e"):
        x = _inception(b, x, name, v, _INCEPTION[name])
    x = stages.mark(b.maxpool(x, "pool4/3x3_s2", 3, 2, _CEIL_POOL_PADS))
    for name in ("5a", "5b"):
        x = _inception(b, x, name, v, _INCEPTION[name])
    stages.mark(x)
    x = b.global_avgpool(x, "pool5/7x7_s1")
    x = b.dropout(x, "pool5/drop_7x7_s1", 0.4)
    x = b.flatten(x, "pool5/flatten")
    return b.gemm(x, "loss3/classifier", v.classes, gain=LINEAR_GAIN)


# ----------------------------------------------------------------------------------------------------------------
# MobileNetV2 (width 1.0), torchvision layout
# ----------------------------------------------------------------------------------------------------------------
# (expansion t, output channels c, repeats n, first stride s)
_MBV2_SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                  (6, 320, 1, 1))


def _conv_bn_relu6(b: GraphBuilder, x: Tensor, name: str, tag: str, c: int, k: int, stride: int = 1,
                   group: int = 1) -> Tensor:
    x = b.conv(x, f"{name}.{tag}", c, k, stride, (k - 1) // 2, group=group, bias=False)
    return b.relu6(b.batchnorm(x, f"{name}.{tag}_bn"), f"{name}.{tag}_relu6")


def mobilenetv2(b: GraphBuilder, x: Tensor, v: Variant, stages: Stages) -> Tensor:
    x = _conv_bn_relu6(b, x, "features.0", "conv", v.ch(32), 3, 2)
    index = 1
    for t, c, n, s in _MBV2_SETTINGS:
        out = v.ch(c)
        branch_gain = math.sqrt(RESIDUAL_BRANCH_VAR / n)
        for j in range(n):
            name = f"features.{index}"
            stride = s if j == 0 else 1
            residual = stride == 1 and x.channels == out
            y = x
            if t != 1:
                y = _conv_bn_relu6(b, y, name, "expand", x.channels * t, 1)
            y = _conv_bn_relu6(b, y, name, "dw", y.channels, 3, stride, group=y.channels)
            y = b.conv(y, f"{name}.project", out, 1, 1, 0, bias=False,
                       gain=LINEAR_GAIN * (branch_gain if residual else 1.0))
            y = b.batchnorm(y, f"{name}.project_bn")
            x = b.add(x, y, f"{name}.add") if residual else y
            index += 1
        stages.mark(x)
    x = stages.mark(_conv_bn_relu6(b, x, f"features.{index}", "conv", v.ch(1280), 1))
    x = b.flatten(b.global_avgpool(x, "avgpool"), "flatten")
    x = b.dropout(x, "classifier.0", 0.2)
    return b.gemm(x, "classifier.1", v.classes, gain=LINEAR_GAIN)


# ----------------------------------------------------------------------------------------------------------------
# MobileNetV3-Small / -Large, torchvision layout: squeeze-and-excitation (HardSigmoid gate) and hard swish
# ----------------------------------------------------------------------------------------------------------------
# (kernel, expanded channels, output channels, SE, activation "RE" relu / "HS" hard swish, stride)
_MBV3_LARGE = ((3, 16, 16, False, "RE", 1), (3, 64, 24, False, "RE", 2), (3, 72, 24, False, "RE", 1),
               (5, 72, 40, True, "RE", 2), (5, 120, 40, True, "RE", 1), (5, 120, 40, True, "RE", 1),
               (3, 240, 80, False, "HS", 2), (3, 200, 80, False, "HS", 1), (3, 184, 80, False, "HS", 1),
               (3, 184, 80, False, "HS", 1), (3, 480, 112, True, "HS", 1), (3, 672, 112, True, "HS", 1),
               (5, 672, 160, True, "HS", 2), (5, 960, 160, True, "HS", 1), (5, 960, 160, True, "HS", 1))
_MBV3_SMALL = ((3, 16, 16, True, "RE", 2), (3, 72, 24, False, "RE", 2), (3, 88, 24, False, "RE", 1),
               (5, 96, 40, True, "HS", 2), (5, 240, 40, True, "HS", 1), (5, 240, 40, True, "HS", 1),
               (5, 120, 48, True, "HS", 1), (5, 144, 48, True, "HS", 1), (5, 288, 96, True, "HS", 2),
               (5, 576, 96, True, "HS", 1), (5, 576, 96, True, "HS", 1))


def _make_divisible(v: float, divisor: int = 8) -> int:
    """torchvision's channel rounding: nearest multiple of `divisor`, never more than 10 % below `v`."""
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


def _act(b: GraphBuilder, x: Tensor, name: str, kind: str) -> Tensor:
    return b.relu(x, name) if kind == "RE" else b.hard_swish(x, name)


def _conv_bn_act(b: GraphBuilder, x: Tensor, name: str, c: int, k: int, stride: int, act: str | None,
                 group: int = 1, gain: float | None = None) -> Tensor:
    x = b.conv(x, f"{name}.0", c, k, stride, (k - 1) // 2, group=group, bias=False,
               **({} if gain is None else {"gain": gain}))
    x = b.batchnorm(x, f"{name}.1")
    return x if act is None else _act(b, x, f"{name}.2", act)


def _squeeze_excitation(b: GraphBuilder, x: Tensor, name: str, squeeze: int) -> Tensor:
    """avgpool -> fc1 (1x1 conv) -> relu -> fc2 (1x1 conv) -> hard sigmoid -> x * gate (gate N x C x 1 x 1)."""
    s = b.global_avgpool(x, f"{name}.avgpool")
    s = b.relu(b.conv(s, f"{name}.fc1", squeeze, 1), f"{name}.relu")
    s = b.hard_sigmoid(b.conv(s, f"{name}.fc2", x.channels, 1, gain=LINEAR_GAIN), f"{name}.hardsigmoid")
    return b.mul(x, s, f"{name}.mul")


def _mobilenetv3(settings: tuple, last_channel: int) -> ModelFn:
    def build(b: GraphBuilder, x: Tensor, v: Variant, stages: Stages) -> Tensor:
        x = _conv_bn_act(b, x, "features.0", v.ch(16), 3, 2, "HS")
        for i, (k, exp, out, se, act, s) in enumerate(settings, start=1):
            name = f"features.{i}.block"
            c_exp, c_out = v.ch(exp), v.ch(out)
            residual = s == 1 and x.channels == c_out
            y, j = x, 0
            if c_exp != x.channels:
                y, j = _conv_bn_act(b, y, f"{name}.{j}", c_exp, 1, 1, act), j + 1
            y, j = _conv_bn_act(b, y, f"{name}.{j}", c_exp, k, s, act, group=c_exp), j + 1
            if se:
                y, j = _squeeze_excitation(b, y, f"{name}.{j}", v.ch(_make_divisible(exp // 4))), j + 1
            y = _conv_bn_act(b, y, f"{name}.{j}", c_out, 1, 1, None,
                             gain=LINEAR_GAIN * (math.sqrt(RESIDUAL_BRANCH_VAR) if residual else 1.0))
            x = b.add(x, y, f"features.{i}.add") if residual else y
            if s == 2 or i == len(settings):
                stages.mark(x)
        x = stages.mark(_conv_bn_act(b, x, f"features.{len(settings) + 1}", v.ch(6 * settings[-1][2]), 1, 1, "HS"))
        x = b.flatten(b.global_avgpool(x, "avgpool"), "flatten")
        x = b.hard_swish(b.gemm(x, "classifier.0", v.ch(last_channel)), "classifier.1")
        x = b.dropout(x, "classifier.2", 0.2)
        return b.gemm(x, "classifier.3", v.classes, gain=LINEAR_GAIN)

    return build


mobilenetv3_small = _mobilenetv3(_MBV3_SMALL, 1024)
mobilenetv3_large = _mobilenetv3(_MBV3_LARGE, 1280)


# ----------------------------------------------------------------------------------------------------------------
# SqueezeNet 1.1, torchvision layout (its ceil-mode 3x3/2 pools equal floor mode at 224 and at the reduced 64)
# ----------------------------------------------------------------------------------------------------------------
_FIRE = {3: (16, 64), 4: (16, 64), 6: (32, 128), 7: (32, 128), 9: (48, 192), 10: (48, 192), 11: (64, 256),
         12: (64, 256)}  # features index -> (squeeze, expand per branch)


def _fire(b: GraphBuilder, x: Tensor, name: str, squeeze: int, expand: int) -> Tensor:
    s = b.relu(b.conv(x, f"{name}.squeeze", squeeze, 1), f"{name}.squeeze_activation")
    e1 = b.relu(b.conv(s, f"{name}.expand1x1", expand, 1), f"{name}.expand1x1_activation")
    e3 = b.relu(b.conv(s, f"{name}.expand3x3", expand, 3, 1, 1), f"{name}.expand3x3_activation")
    return b.concat([e1, e3], f"{name}.cat")


def squeezenet1_1(b: GraphBuilder, x: Tensor, v: Variant, stages: Stages) -> Tensor:
    x = b.relu(b.conv(x, "features.0", v.ch(64), 3, 2, 0), "features.1")
    for i in range(2, 13):
        if i in (2, 5, 8):
            x = b.maxpool(x, f"features.{i}", 3, 2)
            if i > 2:
                stages.mark(x)
        else:
            squeeze, expand = _FIRE[i]
            x = _fire(b, x, f"features.{i}", v.ch(squeeze), v.ch(expand))
    x = stages.mark(b.dropout(x, "classifier.0", 0.5))
    x = b.relu(b.conv(x, "classifier.1", v.classes, 1, gain=LINEAR_GAIN), "classifier.2")
    return b.flatten(b.global_avgpool(x, "classifier.3"), "flatten")


# ----------------------------------------------------------------------------------------------------------------
# ShuffleNetV2 x1.0, torchvision layout: channel split, two branches, concat, channel shuffle
# ----------------------------------------------------------------------------------------------------------------
_SHUFFLE_REPEATS = (4, 8, 4)
_SHUFFLE_CHANNELS = (24, 116, 232, 464, 1024)


def _channel_shuffle(b: GraphBuilder, x: Tensor, name: str, groups: int = 2) -> Tensor:
    """Reshape (N, g, C/g, H, W) -> Transpose (0, 2, 1, 3, 4) -> Reshape back, as torch exports it."""
    n, c, h, w = x.shape
    y = b.reshape(x, f"{name}.reshape1", (n, groups, c // groups, h, w))
    y = b.transpose(y, f"{name}.transpose", (0, 2, 1, 3, 4))
    return b.reshape(y, f"{name}.reshape2", (n, c, h, w))


def _shuffle_branch(b: GraphBuilder, x: Tensor, name: str, c: int, stride: int) -> Tensor:
    y = b.relu(b.batchnorm(b.conv(x, f"{name}.0", c, 1, bias=False), f"{name}.1"), f"{name}.2")
    y = b.batchnorm(b.conv(y, f"{name}.3", c, 3, stride, 1, group=c, bias=False, gain=LINEAR_GAIN), f"{name}.4")
    return b.relu(b.batchnorm(b.conv(y, f"{name}.5", c, 1, bias=False), f"{name}.6"), f"{name}.7")


def shufflenetv2(b: GraphBuilder, x: Tensor, v: Variant, stages: Stages) -> Tensor:
    x = b.relu(b.batchnorm(b.conv(x, "conv1.0", v.ch(24), 3, 2, 1, bias=False), "conv1.1"), "conv1.2")
    x = stages.mark(b.maxpool(x, "maxpool", 3, 2, 1))
    for s, (repeats, out) in enumerate(zip(_SHUFFLE_REPEATS, _SHUFFLE_CHANNELS[1:4]), start=2):
        c = v.ch(out) // 2  # each branch's channels (torchvision: oup // 2)
        for j in range(repeats):
            name = f"stage{s}.{j}"
            if j == 0:
                left = b.batchnorm(b.conv(x, f"{name}.branch1.0", x.channels, 3, 2, 1, group=x.channels,
                                          bias=False, gain=LINEAR_GAIN), f"{name}.branch1.1")
                left = b.relu(b.batchnorm(b.conv(left, f"{name}.branch1.2", c, 1, bias=False),
                                          f"{name}.branch1.3"), f"{name}.branch1.4")
                right = _shuffle_branch(b, x, f"{name}.branch2", c, 2)
            else:
                left, right = b.split(x, f"{name}.chunk", 2)
                right = _shuffle_branch(b, right, f"{name}.branch2", c, 1)
            x = _channel_shuffle(b, b.concat([left, right], f"{name}.cat"), f"{name}.shuffle")
        stages.mark(x)
    x = b.relu(b.batchnorm(b.conv(x, "conv5.0", v.ch(_SHUFFLE_CHANNELS[4]), 1, bias=False), "conv5.1"), "conv5.2")
    x = b.flatten(b.global_avgpool(x, "globalpool"), "flatten")
    return b.gemm(x, "fc", v.classes, gain=LINEAR_GAIN)


# ----------------------------------------------------------------------------------------------------------------
# EfficientNet-B0, torchvision layout: MBConv blocks with SiLU (x * sigmoid(x)) and sigmoid-gated SE
# ----------------------------------------------------------------------------------------------------------------
# (expand ratio, kernel, first stride, input channels, output channels, layers)
_EFFNET_B0 = ((1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3),
              (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1))


def _conv_bn_silu(b: GraphBuilder, x: Tensor, name: str, c: int, k: int, stride: int = 1, group: int = 1,
                  act: bool = True, gain: float | None = None) -> Tensor:
    x = b.conv(x, f"{name}.0", c, k, stride, (k - 1) // 2, group=group, bias=False,
               **({} if gain is None else {"gain": gain}))
    x = b.batchnorm(x, f"{name}.1")
    return b.silu(x, f"{name}.2") if act else x


def efficientnet_b0(b: GraphBuilder, x: Tensor, v: Variant, stages: Stages) -> Tensor:
    x = _conv_bn_silu(b, x, "features.0", v.ch(32), 3, 2)
    for s, (t, k, stride, c_in, c_out, layers) in enumerate(_EFFNET_B0, start=1):
        branch_gain = math.sqrt(RESIDUAL_BRANCH_VAR / layers)
        for j in range(layers):
            name = f"features.{s}.{j}.block"
            block_in = v.ch(c_in) if j == 0 else v.ch(c_out)
            residual = j > 0  # stride 1 and in == out
            y, i = x, 0
            c_exp = block_in * t
            if t != 1:
                y, i = _conv_bn_silu(b, y, f"{name}.{i}", c_exp, 1), i + 1
            y, i = _conv_bn_silu(b, y, f"{name}.{i}", c_exp, k, stride if j == 0 else 1, group=c_exp), i + 1
            se = f"{name}.{i}"
            g = b.global_avgpool(y, f"{se}.avgpool")
            g = b.silu(b.conv(g, f"{se}.fc1", max(1, block_in // 4), 1), f"{se}.activation")
            g = b.sigmoid(b.conv(g, f"{se}.fc2", c_exp, 1, gain=LINEAR_GAIN), f"{se}.scale_activation")
            y = b.mul(y, g, f"{se}.mul")
            y = _conv_bn_silu(b, y, f"{name}.{i + 1}", v.ch(c_out), 1, act=False,
                              gain=LINEAR_GAIN * (branch_gain if residual else 1.0))
            x = b.add(x, y, f"features.{s}.{j}.add") if residual else y
        stages.mark(x)
    x = stages.mark(_conv_bn_silu(b, x, "features.8", v.ch(1280), 1))
    x = b.flatten(b.global_avgpool(x, "avgpool"), "flatten")
    x = b.dropout(x, "classifier.0", 0.2)
    return b.gemm(x, "classifier.1", v.classes, gain=LINEAR_GAIN)


# ----------------------------------------------------------------------------------------------------------------
# YOLOv3-tiny-style detector (Darknet yolov3-tiny.cfg): conv+BN+leaky(0.1), max pools (one 2x2/1 with end padding),
# two heads at strides 32 and 16, the second fed by a nearest 2x upsample concatenated with a stride-16 feature map
# ----------------------------------------------------------------------------------------------------------------
YOLO_ANCHORS_PER_SCALE = 3


def _dark(b: GraphBuilder, x: Tensor, name: str, c: int, k: int) -> Tensor:
    x = b.batchnorm(b.conv(x, f"{name}.conv", c, k, 1, (k - 1) // 2, bias=False), f"{name}.bn")
    return b.leaky_relu(x, f"{name}.leaky", alpha=0.1)


def yolov3_tiny(b: GraphBuilder, x: Tensor, v: Variant, stages: Stages) -> Tensor:
    """Output: both heads, each (N, 3 * (5 + classes), H*W), concatenated along the cell axis (the decode of boxes is
    the host's work, as in Darknet)."""
    for i, c in enumerate((16, 32, 64, 128), start=0):
        x = b.maxpool(_dark(b, x, f"layer{2 * i}", v.ch(c), 3), f"layer{2 * i + 1}.maxpool", 2, 2)
    route8 = stages.mark(_dark(b, x, "layer8", v.ch(256), 3))
    x = b.maxpool(route8, "layer9.maxpool", 2, 2)
    x = _dark(b, x, "layer10", v.ch(512), 3)
    x = b.maxpool(x, "layer11.maxpool", 2, 1, (0, 0, 1, 1))  # Darknet's size-2 stride-1 pool keeps 13x13
    x = _dark(b, x, "layer12", v.ch(1024), 3)
    route13 = stages.mark(_dark(b, x, "layer13", v.ch(256), 1))
    out_c = YOLO_ANCHORS_PER_SCALE * (5 + v.classes)
    h1 = b.conv(_dark(b, route13, "layer14", v.ch(512), 3), "layer15.conv", out_c, 1, gain=LINEAR_GAIN)
    y = b.upsample(_dark(b, route13, "layer18", v.ch(128), 1), "layer19.upsample", 2)
    y = stages.mark(b.concat([y, route8], "layer20.route"))
    h2 = b.conv(_dark(b, y, "layer21", v.ch(256), 3), "layer22.conv", out_c, 1, gain=LINEAR_GAIN)
    heads = [b.reshape(h, f"{h.name}.flat", (h.shape[0], out_c, h.shape[2] * h.shape[3])) for h in (h1, h2)]
    n = heads[0].shape[0]
    return b.node("Concat", "detections", [t.name for t in heads],
                  (n, out_c, sum(t.shape[2] for t in heads)), axis=2)


# ----------------------------------------------------------------------------------------------------------------
# U-Net-style segmenter (Ronneberger et al. with same-padding convs and BN): 4 down steps, 2x2/2 transposed-conv up
# steps, skip concats, per-pixel class scores
# ----------------------------------------------------------------------------------------------------------------
_UNET_WIDTHS = (64, 128, 256, 512, 1024)


def _double_conv(b: GraphBuilder, x: Tensor, name: str, c: int) -> Tensor:
    for i in (1, 2):
        x = b.relu(b.batchnorm(b.conv(x, f"{name}.conv{i}", c, 3, 1, 1, bias=False), f"{name}.bn{i}"),
                   f"{name}.relu{i}")
    return x


def unet(b: GraphBuilder, x: Tensor, v: Variant, stages: Stages) -> Tensor:
    skips = []
    for i, c in enumerate(_UNET_WIDTHS[:-1]):
        x = _double_conv(b, x, f"down{i}", v.ch(c))
        skips.append(stages.mark(x))
        x = b.maxpool(x, f"down{i}.pool", 2, 2)
    x = stages.mark(_double_conv(b, x, "bottleneck", v.ch(_UNET_WIDTHS[-1])))
    for i, c in reversed(list(enumerate(_UNET_WIDTHS[:-1]))):
        up = b.conv_transpose(x, f"up{i}.upconv", v.ch(c), 2, 2, gain=LINEAR_GAIN)
        x = _double_conv(b, b.concat([skips[i], up], f"up{i}.cat"), f"up{i}", v.ch(c))
    return b.conv(x, "head", v.classes, 1, gain=LINEAR_GAIN)


# ----------------------------------------------------------------------------------------------------------------
# mixed_cnn: a small ResNet-18-flavoured demo whose operators land on both sides of the DPU/CPU partition
# ----------------------------------------------------------------------------------------------------------------
MIXED_CNN_RESOLUTION = 64


def mixed_cnn(b: GraphBuilder, x: Tensor, v: Variant, stages: Stages) -> Tensor:
    """Stem + one basic block (DPU-friendly), then a branch the DPU cannot run (17x17 conv, Sigmoid, with a lone
    Relu between them), a branch it can (conv + LeakyReLU 0.1), a Concat, a MaxPool and a Softmax head."""
    x = b.conv(x, "conv1", 16, 3, 2, 1, bias=False)
    x = b.relu(b.batchnorm(x, "bn1"), "relu")
    x = b.maxpool(x, "maxpool", 3, 2, 1)
    x = stages.mark(_basic_block(b, x, "layer1.0", 16, 1, math.sqrt(RESIDUAL_BRANCH_VAR)))
    # DPU-side branch: LeakyReLU(0.1) is a DPU activation (applied as 26/256 on the hardware).
    a = b.leaky_relu(b.conv(x, "branch_a.conv", 16, 3, 1, 1), "branch_a.leaky", alpha=0.1)
    # CPU-side branch: the 17x17 kernel exceeds the DPU's [1, 16] limit and the DPU has no Sigmoid; the Relu
    # between them is a lone DPU-capable op stranded between two CPU ops.
    c = b.conv(x, "branch_b.conv17x17", 16, 17, 1, 8)
    c = b.relu(c, "branch_b.relu")
    c = b.sigmoid(c, "branch_b.sigmoid")
    x = stages.mark(b.concat([a, c], "concat"))
    x = b.relu(b.conv(x, "head.conv", 32, 1, 1, 0), "head.relu")
    x = stages.mark(b.maxpool(x, "head.maxpool", 2, 2))
    x = b.flatten(b.global_avgpool(x, "head.avgpool"), "head.flatten")
    x = b.gemm(x, "head.fc", v.classes, gain=LINEAR_GAIN)
    return b.softmax(x, "head.softmax")


@dataclass(frozen=True)
class ModelInfo:
    """A zoo entry: its builder, its variants and the keyword options it accepts."""

    fn: Callable[..., Tensor]
    full: Variant
    reduced: Variant
    options: tuple[str, ...] = ()


_MIXED = Variant(resolution=MIXED_CNN_RESOLUTION, width_divisor=1, classes=10)

REGISTRY: dict[str, ModelInfo] = {
    "vgg16": ModelInfo(vgg16, FULL, REDUCED),
    "resnet18": ModelInfo(resnet18, FULL, REDUCED),
    "resnet50": ModelInfo(resnet50, FULL, REDUCED),
    "resnet152": ModelInfo(resnet152, FULL, REDUCED),
    "googlenet": ModelInfo(googlenet, FULL, REDUCED, options=("lrn",)),
    "mobilenetv2": ModelInfo(mobilenetv2, FULL, REDUCED),
    "resnext50_32x4d": ModelInfo(resnext50_32x4d, FULL, REDUCED),
    "mobilenetv3_small": ModelInfo(mobilenetv3_small, FULL, REDUCED),
    "squeezenet1_1": ModelInfo(squeezenet1_1, FULL, REDUCED),
    "shufflenetv2": ModelInfo(shufflenetv2, FULL, REDUCED),
    "mobilenetv3_large": ModelInfo(mobilenetv3_large, FULL, REDUCED),
    # Reduced at 32 x 32: at 64 its first SE pool (32 x 32) exceeds B1152's ALU window (4 * PP = 16 rows).
    "efficientnet_b0": ModelInfo(efficientnet_b0, FULL, Variant(resolution=32, width_divisor=8, classes=10)),
    # Detection / segmentation: COCO's 80 classes at 416 (YOLOv3-tiny's input), 21 VOC classes at 256.
    "yolov3_tiny": ModelInfo(yolov3_tiny, Variant(416, 1, 80), Variant(64, 8, 10)),
    "unet": ModelInfo(unet, Variant(256, 1, 21), Variant(64, 8, 10)),
    # Already small: the reduced variant is the same model.
    "mixed_cnn": ModelInfo(mixed_cnn, _MIXED, _MIXED),
}
