"""A small, deterministic helper over ``onnx.helper`` for writing CNN graphs with seeded random weights.

Every node gets a caller-chosen, unique name and its (single) output tensor carries the same name, so the partition
report and intermediate-tensor probes can refer to layers by their published names ("layer1.0.conv1", ...).

Weight initialisation keeps activations O(1) so later int8 power-of-two quantisation sees a usable dynamic range:
convolutions and fully connected layers draw He-normal weights, std = gain * sqrt(1 / fan_in), where ``gain**2`` is 2
when a ReLU-like activation follows (it halves the second moment again) and 1 for a linear output, corrected for the
average gain of a following BatchNormalization; callers may scale further (e.g. down-weight residual branches so
sums do not grow block after block).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
RELU_GAIN = math.sqrt(2.0)
LINEAR_GAIN = 1.0
# An inference BatchNormalization with the random statistics drawn below multiplies the second moment of its input by
# E[gamma^2] * E[1 / var] = (1 + 1/12) * ln(3) ~= 1.19 on average; a conv feeding a BN divides its weights by the
# square root so a chain of conv+BN layers neither grows nor shrinks.
BN_GAIN_CORRECTION = 1.0 / math.sqrt((13.0 / 12.0) * math.log(3.0))


@dataclass
class Tensor:
    """A float32 NCHW (or NC) activation tensor in the graph under construction, with its static shape."""

    name: str
    shape: tuple[int, ...]

    @property
    def channels(self) -> int:
        return self.shape[1]


def _conv_out(size: int, kernel: int, stride: int, pad_begin: int, pad_end: int, dilation: int = 1) -> int:
    return (size + pad_begin + pad_end - dilation * (kernel - 1) - 1) // stride + 1


def _pair(v: int | tuple[int, int]) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


def _pads(pad: int | tuple[int, int] | tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    """ONNX pads order: (top, left, bottom, right); an int or (h, w) pair means symmetric padding."""
    if isinstance(pad, int):
        return (pad, pad, pad, pad)
    if len(pad) == 2:
        return (pad[0], pad[1], pad[0], pad[1])
    if len(pad) == 4:
        return tuple(int(p) for p in pad)  # type: ignore[return-value]
    raise ValueError(f"pads must be an int, an (h, w) pair or 4 values, got {pad!r}")


@dataclass
class GraphBuilder:
    """Accumulates nodes and initializers of one ONNX graph; shapes are tracked so layers need no shape inference."""

    graph_name: str
    seed: int = 0
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    initializers: list[onnx.TensorProto] = field(default_factory=list)
    _names: set[str] = field(default_factory=set)
    _input: onnx.ValueInfoProto | None = None

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)

    # -- bookkeeping -------------------------------------------------------------------------------------------
    def _claim(self, name: str) -> str:
        if not name or name in self._names:
            raise ValueError(f"graph {self.graph_name!r}: node/tensor name {name!r} is empty or already used")
        self._names.add(name)
        return name

    def input(self, name: str, shape: tuple[int, ...]) -> Tensor:
        """Declare the graph input (float32)."""
        self._claim(name)
        self._input = helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))
        return Tensor(name, tuple(shape))

    def constant(self, name: str, value: np.ndarray) -> str:
        """Add an initializer and return its name."""
        self._claim(name)
        self.initializers.append(numpy_helper.from_array(np.array(value, order="C"), name))
        return name

    def node(self, op_type: str, name: str, inputs: list[str], shape: tuple[int, ...], **attrs) -> Tensor:
        """Add a single-output node whose output tensor is named like the node."""
        self._claim(name)
        self.nodes.append(helper.make_node(op_type, inputs, [name], name=name, **attrs))
        return Tensor(name, tuple(shape))

    # -- random parameters ---------------------------------------------------------------------------------------
    def he_normal(self, shape: tuple[int, ...], fan_in: int, gain: float) -> np.ndarray:
        w = self.rng.standard_normal(shape, dtype=np.float32)
        w *= np.float32(gain / math.sqrt(fan_in))
        return w

    def small_bias(self, n: int) -> np.ndarray:
        return self.rng.standard_normal(n, dtype=np.float32) * np.float32(0.01)

    # -- layers ----------------------------------------------------------------------------------------------------
    def conv(
        self,
        x: Tensor,
        name: str,
        out_channels: int,
        kernel: int | tuple[int, int],
        stride: int | tuple[int, int] = 1,
        pad: int | tuple[int, ...] = 0,
        group: int = 1,
        bias: bool = True,
        gain: float = RELU_GAIN,
    ) -> Tensor:
        """Conv2d with He-normal weights (shape O x I/group x kh x kw) and an optional small random bias.

        Convs without bias are the ones followed by a BatchNormalization; their gain includes BN_GAIN_CORRECTION.
        """
        n, c, h, w = x.shape
        kh, kw = _pair(kernel)
        sh, sw = _pair(stride)
        pt, pl, pb, pr = _pads(pad)
        if c % group or out_channels % group:
            raise ValueError(f"{name}: channels {c}->{out_channels} not divisible by group {group}")
        oh, ow = _conv_out(h, kh, sh, pt, pb), _conv_out(w, kw, sw, pl, pr)
        if oh < 1 or ow < 1:
            raise ValueError(f"{name}: input {h}x{w} too small for kernel {kh}x{kw} stride {sh}x{sw}")
        fan_in = (c // group) * kh * kw
        if not bias:
            gain *= BN_GAIN_CORRECTION
        weight = self.he_normal((out_channels, c // group, kh, kw), fan_in, gain)
        inputs = [x.name, self.constant(f"{name}.weight", weight)]
        if bias:
            inputs.append(self.constant(f"{name}.bias", self.small_bias(out_channels)))
        attrs = dict(kernel_shape=[kh, kw], strides=[sh, sw], pads=[pt, pl, pb, pr], dilations=[1, 1])
        if group != 1:
            attrs["group"] = group
        return self.node("Conv", name, inputs, (n, out_channels, oh, ow), **attrs)

    def batchnorm(self, x: Tensor, name: str, eps: float = 1e-5) -> Tensor:
        """Inference BatchNormalization with random statistics: gamma, var ~ U(0.5, 1.5); beta, mean ~ N(0, 0.1)."""
        c = x.channels
        gamma = self.rng.uniform(0.5, 1.5, c).astype(np.float32)
        beta = (self.rng.standard_normal(c) * 0.1).astype(np.float32)
        mean = (self.rng.standard_normal(c) * 0.1).astype(np.float32)
        var = self.rng.uniform(0.5, 1.5, c).astype(np.float32)
        inputs = [x.name] + [self.constant(f"{name}.{p}", v) for p, v in
                             (("weight", gamma), ("bias", beta), ("running_mean", mean), ("running_var", var))]
        return self.node("BatchNormalization", name, inputs, x.shape, epsilon=eps)

    def relu(self, x: Tensor, name: str) -> Tensor:
        return self.node("Relu", name, [x.name], x.shape)

    def relu6(self, x: Tensor, name: str) -> Tensor:
        """ReLU6 as ONNX Clip with min/max inputs (opset >= 11 form)."""
        lo = self.constant(f"{name}.min", np.array(0.0, dtype=np.float32))
        hi = self.constant(f"{name}.max", np.array(6.0, dtype=np.float32))
        return self.node("Clip", name, [x.name, lo, hi], x.shape)

    def leaky_relu(self, x: Tensor, name: str, alpha: float) -> Tensor:
        return self.node("LeakyRelu", name, [x.name], x.shape, alpha=alpha)

    def sigmoid(self, x: Tensor, name: str) -> Tensor:
        return self.node("Sigmoid", name, [x.name], x.shape)

    def conv_transpose(self, x: Tensor, name: str, out_channels: int, kernel: int, stride: int,
                       gain: float = RELU_GAIN) -> Tensor:
        """ConvTranspose2d without padding (k x k, stride s; U-Net's 2x2 / 2 up-convolution), weights I x O x k x k,
        He-normal over the taps that reach one output pixel, small random bias."""
        n, c, h, w = x.shape
        fan_in = c * max(1, (kernel // stride) ** 2)
        weight = self.he_normal((c, out_channels, kernel, kernel), fan_in, gain)
        inputs = [x.name, self.constant(f"{name}.weight", weight), self.constant(f"{name}.bias",
                                                                                self.small_bias(out_channels))]
        oh, ow = (h - 1) * stride + kernel, (w - 1) * stride + kernel
        return self.node("ConvTranspose", name, inputs, (n, out_channels, oh, ow), kernel_shape=[kernel, kernel],
                         strides=[stride, stride])

    def upsample(self, x: Tensor, name: str, scale: int) -> Tensor:
        """Nearest-neighbour Resize by an integer factor (asymmetric coordinates, floor rounding: pure replication,
        like Darknet's upsample layer)."""
        n, c, h, w = x.shape
        scales = self.constant(f"{name}.scales", np.array([1, 1, scale, scale], dtype=np.float32))
        return self.node("Resize", name, [x.name, "", scales], (n, c, h * scale, w * scale), mode="nearest",
                         coordinate_transformation_mode="asymmetric", nearest_mode="floor")

    def silu(self, x: Tensor, name: str) -> Tensor:
        """x * sigmoid(x) as PyTorch exports nn.SiLU at opset 17: Sigmoid "<name>.sigmoid", then Mul "<name>"."""
        return self.mul(x, self.sigmoid(x, f"{name}.sigmoid"), name)

    def hard_sigmoid(self, x: Tensor, name: str) -> Tensor:
        """relu6(x + 3) / 6, as PyTorch exports F.hardsigmoid (HardSigmoid alpha 1/6, beta 0.5)."""
        return self.node("HardSigmoid", name, [x.name], x.shape, alpha=1.0 / 6.0, beta=0.5)

    def hard_swish(self, x: Tensor, name: str) -> Tensor:
        return self.node("HardSwish", name, [x.name], x.shape)

    def mul(self, a: Tensor, b: Tensor, name: str) -> Tensor:
        """Element-wise product; `b` may be an N x C x 1 x 1 channel gate (squeeze-and-excitation)."""
        if b.shape != a.shape and b.shape != (*a.shape[:2], 1, 1):
            raise ValueError(f"{name}: Mul operand {b.shape} is neither {a.shape} nor a channel gate of it")
        return self.node("Mul", name, [a.name, b.name], a.shape)

    def split(self, x: Tensor, name: str, parts: int) -> list[Tensor]:
        """Equal split along the channels; outputs named "<name>.0", "<name>.1", ..."""
        n, c, h, w = x.shape
        if c % parts:
            raise ValueError(f"{name}: {c} channels do not split into {parts} equal parts")
        self._claim(name)
        outs = [self._claim(f"{name}.{i}") for i in range(parts)]
        sizes = self.constant(f"{name}.split", np.full(parts, c // parts, dtype=np.int64))
        self.nodes.append(helper.make_node("Split", [x.name, sizes], outs, name=name, axis=1))
        return [Tensor(o, (n, c // parts, h, w)) for o in outs]

    def reshape(self, x: Tensor, name: str, shape: tuple[int, ...]) -> Tensor:
        if int(np.prod(shape)) != int(np.prod(x.shape)):
            raise ValueError(f"{name}: cannot reshape {x.shape} to {shape}")
        target = self.constant(f"{name}.shape", np.array(shape, dtype=np.int64))
        return self.node("Reshape", name, [x.name, target], tuple(shape))

    def transpose(self, x: Tensor, name: str, perm: tuple[int, ...]) -> Tensor:
        return self.node("Transpose", name, [x.name], tuple(x.shape[p] for p in perm), perm=list(perm))

    def _pool(self, op: str, x: Tensor, name: str, kernel: int, stride: int, pad: int | tuple[int, ...]) -> Tensor:
        n, c, h, w = x.shape
        pt, pl, pb, pr = _pads(pad)
        shape = (n, c, _conv_out(h, kernel, stride, pt, pb), _conv_out(w, kernel, stride, pl, pr))
        return self.node(op, name, [x.name], shape, kernel_shape=[kernel, kernel], strides=[stride, stride],
                         pads=[pt, pl, pb, pr])

    def maxpool(self, x: Tensor, name: str, kernel: int, stride: int, pad: int | tuple[int, ...] = 0) -> Tensor:
        return self._pool("MaxPool", x, name, kernel, stride, pad)

    def avgpool(self, x: Tensor, name: str, kernel: int, stride: int, pad: int | tuple[int, ...] = 0) -> Tensor:
        return self._pool("AveragePool", x, name, kernel, stride, pad)

    def global_avgpool(self, x: Tensor, name: str) -> Tensor:
        return self.node("GlobalAveragePool", name, [x.name], (*x.shape[:2], 1, 1))

    def lrn(self, x: Tensor, name: str, size: int = 5, alpha: float = 1e-4, beta: float = 0.75,
            bias: float = 1.0) -> Tensor:
        """Cross-channel LRN; the defaults are Caffe GoogLeNet's (local_size 5, alpha 1e-4, beta 0.75, k 1)."""
        return self.node("LRN", name, [x.name], x.shape, size=size, alpha=alpha, beta=beta, bias=bias)

    def add(self, a: Tensor, b: Tensor, name: str) -> Tensor:
        if a.shape != b.shape:
            raise ValueError(f"{name}: Add operand shapes differ: {a.shape} vs {b.shape}")
        return self.node("Add", name, [a.name, b.name], a.shape)

    def concat(self, xs: list[Tensor], name: str) -> Tensor:
        n, _, h, w = xs[0].shape
        if any(t.shape[0] != n or t.shape[2:] != (h, w) for t in xs):
            raise ValueError(f"{name}: Concat inputs differ outside the channel axis: {[t.shape for t in xs]}")
        return self.node("Concat", name, [t.name for t in xs], (n, sum(t.channels for t in xs), h, w), axis=1)

    def flatten(self, x: Tensor, name: str) -> Tensor:
        return self.node("Flatten", name, [x.name], (x.shape[0], int(np.prod(x.shape[1:]))), axis=1)

    def dropout(self, x: Tensor, name: str, ratio: float) -> Tensor:
        """Dropout (an identity at inference); the ratio is kept as an input for fidelity to the source network."""
        r = self.constant(f"{name}.ratio", np.array(ratio, dtype=np.float32))
        return self.node("Dropout", name, [x.name, r], x.shape)

    def gemm(self, x: Tensor, name: str, out_features: int, gain: float = RELU_GAIN) -> Tensor:
        """Fully connected layer y = x W^T + b, W of shape (out, in) as in PyTorch."""
        n, fin = x.shape
        w = self.constant(f"{name}.weight", self.he_normal((out_features, fin), fin, gain))
        b = self.constant(f"{name}.bias", self.small_bias(out_features))
        return self.node("Gemm", name, [x.name, w, b], (n, out_features), transB=1)

    def softmax(self, x: Tensor, name: str) -> Tensor:
        return self.node("Softmax", name, [x.name], x.shape, axis=1)

    # -- finish ----------------------------------------------------------------------------------------------------
    def build(self, output: Tensor, metadata: dict[str, str] | None = None) -> onnx.ModelProto:
        """Close the graph with ``output`` as its single output, renaming that tensor (not its node) to "output"."""
        if self._input is None or not self.nodes:
            raise ValueError(f"graph {self.graph_name!r}: declare an input and add nodes before build()")
        producer = self.nodes[-1]
        if list(producer.output) != [output.name]:
            raise ValueError(f"graph {self.graph_name!r}: the output {output.name!r} must come from the last node")
        if any(output.name in n.input for n in self.nodes):
            raise ValueError(f"graph {self.graph_name!r}: the output {output.name!r} is also consumed inside the graph")
        producer.output[0] = "output"
        out_vi = helper.make_tensor_value_info("output", TensorProto.FLOAT, list(output.shape))
        graph = helper.make_graph(self.nodes, self.graph_name, [self._input], [out_vi], initializer=self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="tvm_dpu.zoo", producer_version="1")
        model.ir_version = IR_VERSION
        for key, value in (metadata or {}).items():
            entry = model.metadata_props.add()
            entry.key, entry.value = key, value
        return model
