"""Small PyTorch networks with the layer kinds of the zoo's families, for the tests that compare TVM's
`from_exported_program` import with tvm-dpu's ONNX import of the same network (torch.onnx.export)."""
from __future__ import annotations

import torch
from torch import nn


def _cbr(cin: int, cout: int, k: int = 3, s: int = 1, groups: int = 1, act: type = nn.ReLU) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, k, s, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout), act())


class InvertedResidual(nn.Module):
    """MobileNetV2's block (ReLU6), or MobileNetV3's with hard swish and a hard-sigmoid squeeze-excite."""

    def __init__(self, c: int, expand: int, act: type = nn.ReLU6, se: bool = False):
        super().__init__()
        h = c * expand
        self.expand, self.dw = _cbr(c, h, 1, act=act), _cbr(h, h, 3, groups=h, act=act)
        self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(h, 8, 1), nn.ReLU(), nn.Conv2d(8, h, 1),
                                nn.Hardsigmoid()) if se else None
        self.project = nn.Sequential(nn.Conv2d(h, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        y = self.dw(self.expand(x))
        if self.se is not None:
            y = y * self.se(y)
        return x + self.project(y)


class MobileNetLike(nn.Module):
    def __init__(self, act: type = nn.ReLU6, se: bool = False):
        super().__init__()
        self.stem = _cbr(3, 8, 3, 2, act=act)
        self.blocks = nn.Sequential(InvertedResidual(8, 2, act, se), InvertedResidual(8, 3, act, se),
                                    _cbr(8, 16, 3, 2, act=act), InvertedResidual(16, 2, act, se))
        self.pool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(16, 10)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.blocks(self.stem(x))), 1))


class ResNetLike(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(_cbr(3, 8, 7, 2), nn.MaxPool2d(3, 2, 1))
        self.a = nn.Sequential(_cbr(8, 8), nn.Conv2d(8, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8))
        self.down = nn.Sequential(nn.Conv2d(8, 16, 1, 2, bias=False), nn.BatchNorm2d(16))
        self.b = nn.Sequential(_cbr(8, 16, 3, 2), nn.Conv2d(16, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16))
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = self.stem(x)
        x = torch.relu(x + self.a(x))
        x = torch.relu(self.down(x) + self.b(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class InceptionLike(nn.Module):
    """Concatenated branches, a ceil-mode max pool and a 1x1 "fire" squeeze (GoogLeNet / SqueezeNet)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(_cbr(3, 8, 3, 2), nn.MaxPool2d(3, 2, ceil_mode=True))
        self.b1, self.b3 = _cbr(8, 8, 1), nn.Sequential(_cbr(8, 4, 1), _cbr(4, 8, 3))
        self.bp = nn.Sequential(nn.MaxPool2d(3, 1, 1), _cbr(8, 4, 1))
        self.head = nn.Sequential(nn.Conv2d(20, 10, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())

    def forward(self, x):
        x = self.stem(x)
        return self.head(torch.cat([self.b1(x), self.b3(x), self.bp(x)], 1))


class UNetLike(nn.Module):
    """Down and up paths: a transposed conv, a nearest upsample, skip concats, leaky ReLU as the DPU has it."""

    def __init__(self):
        super().__init__()
        leaky = lambda: nn.LeakyReLU(26 / 256)  # noqa: E731 - the DPU's leaky ReLU slope
        self.e1, self.e2 = _cbr(3, 8, act=leaky), nn.Sequential(nn.MaxPool2d(2), _cbr(8, 16, act=leaky))
        self.e3 = nn.Sequential(nn.MaxPool2d(2), _cbr(16, 16, act=leaky))
        self.up1 = nn.ConvTranspose2d(16, 16, 2, 2)
        self.d1 = _cbr(32, 8, act=leaky)
        self.up2 = nn.Upsample(scale_factor=2, mode="nearest")
        self.d2 = nn.Conv2d(16, 2, 1)

    def forward(self, x):
        a = self.e1(x)
        b = self.e2(a)
        y = self.d1(torch.cat([self.up1(self.e3(b)), b], 1))
        return self.d2(torch.cat([self.up2(y), a], 1))


NETS = {
    "mobilenetv2_like": lambda: MobileNetLike(nn.ReLU6),
    "mobilenetv3_like": lambda: MobileNetLike(nn.Hardswish, se=True),
    "resnet_like": ResNetLike,
    "inception_like": InceptionLike,
    "unet_like": UNetLike,
}


def build(name: str) -> nn.Module:
    torch.manual_seed(0)
    net = NETS[name]().eval()
    with torch.no_grad():  # non-trivial BN statistics, so folding them is exercised
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    return net
