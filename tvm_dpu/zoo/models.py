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


def _bottleneck(b: GraphBuilder, x: Tensor, name: str, planes: int, stride: int, branch_gain: float) -> Tensor:
    identity = x
    out = planes * 4
    y = b.conv(x, f"{name}.conv1", planes, 1, 1, 0, bias=False)
    y = b.relu(b.batchnorm(y, f"{name}.bn1"), f"{name}.relu1")
    y = b.conv(y, f"{name}.conv2", planes, 3, stride, 1, bias=False)  # v1.5: stride on the 3x3
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


def _resnet(block: Callable, layers: tuple[int, int, int, int]) -> ModelFn:
    def build(b: GraphBuilder, x: Tensor, v: Variant, stages: Stages) -> Tensor:
        x = stages.mark(_resnet_stem(b, x, v))
        for i, (planes, blocks) in enumerate(zip((64, 128, 256, 512), layers), start=1):
            branch_gain = math.sqrt(RESIDUAL_BRANCH_VAR / blocks)
            for j in range(blocks):
                stride = 2 if i > 1 and j == 0 else 1
                x = block(b, x, f"layer{i}.{j}", v.ch(planes), stride, branch_gain)
            stages.mark(x)
        x = b.flatten(b.global_avgpool(x, "avgpool"), "flatten")
        return b.gemm(x, "fc", v.classes, gain=LINEAR_GAIN)

    return build


resnet18 = _resnet(_basic_block, (2, 2, 2, 2))
resnet50 = _resnet(_bottleneck, (3, 4, 6, 3))
resnet152 = _resnet(_bottleneck, (3, 8, 36, 3))


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
    # Already small: the reduced variant is the same model.
    "mixed_cnn": ModelInfo(mixed_cnn, _MIXED, _MIXED),
}
