"""Workload builders in the style of TVM's ``relay.testing``: real architectures, built
directly in the graph IR, with seeded random weights that are calibrated to matter.

Each builder is ``(batch_size=1, dtype="float32", seed=0, ...) -> (mod, params)``. The weights
are parameters of ``@main`` (after the data input) and ``params`` holds their values by name.
They are random, then calibrated on standard-normal inputs (:mod:`opfusion.testing.calibrate`)
so that every convolution and dense layer has zero-mean, unit-variance output and the network's
output depends on its input, as a trained network's does. Feed ``workload_input(mod, params)``.

Convolutions are followed by batch norm and ReLU as in the real networks (squeezenet, which has
no batch norm, uses biases), so passes that fold batch norms and fuse epilogues have real work.
Defaults match TVM's; smaller ``image_shape`` (or ``seq``, ``hidden``) keep tests fast."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from .. import op
from ..errors import OpfusionError
from ..ir.expr import Expr, Function, Var, var
from ..ir.module import IRModule
from ..ir.types import TensorType
from .calibrate import Layer, calibrate

# Standard-normal inputs each workload is calibrated on (a dense layer at batch 1 holds one
# value per unit and input, so its units are centred over these).
CALIBRATION_SAMPLES = 4
# A batch of this many images or more is calibrated on one sample alone: it holds more
# images than four batch-1 samples, and four batches of 32 took resnet50 95 s.
CALIBRATION_BATCH = 16

Workload = tuple[IRModule, dict[str, np.ndarray]]


class _Net:
    """Collects a network's parameters (random values, by name) and its calibrated layers."""

    def __init__(self, seed: int, dtype: str) -> None:
        self.rng = np.random.default_rng(seed)
        self.seed = seed
        self.dtype = dtype
        self.values: dict[str, np.ndarray] = {}
        self.params: list[Var] = []
        self.layers: list[Layer] = []

    def param(self, name: str, value: np.ndarray) -> Var:
        if name in self.values:
            raise AssertionError(f"parameter {name!r} is defined twice")
        value = np.asarray(value, dtype=self.dtype)
        param = var(name, value.shape, self.dtype)
        self.values[name] = value
        self.params.append(param)
        return param

    def normal(self, shape: Sequence[int], std: float) -> np.ndarray:
        # float32 draws (then cast to the dtype): resnet50 holds 25 million weights.
        return self.rng.standard_normal(tuple(shape), dtype=np.float32) * np.float32(std)

    # -- layers ------------------------------------------------------------------------------
    def conv(self, x: Expr, channels: int, kernel: int, name: str, *, stride: int = 1,
             padding: int = 0, groups: int = 1, bias: bool = False) -> Expr:
        """conv2d (+ bias_add); a layer without a bias must be followed by :meth:`bn`."""
        in_channels = _shape(x)[1]
        fan_in = in_channels // groups * kernel * kernel
        weight = self.param(f"{name}_weight", self.normal(
            (channels, in_channels // groups, kernel, kernel), 1 / math.sqrt(fan_in)))
        y = op.nn.conv2d(x, weight, strides=stride, padding=padding, groups=groups,
                         channels=channels, kernel_size=kernel)
        if bias:
            b = self.param(f"{name}_bias", self.normal((channels,), 0.05))
            y = op.nn.bias_add(y, b)
            self.layers.append(Layer(y, weight.name_hint, bias=b.name_hint))
        else:
            self.layers.append(Layer(y, weight.name_hint))  # bn() adds its moving mean
        return y

    def bn(self, x: Expr, name: str) -> Expr:
        """Inference batch norm whose moving mean absorbs the preceding conv's mean."""
        channels = _shape(x)[1]
        gamma = self.param(f"{name}_gamma", self.rng.uniform(0.8, 1.2, channels))
        beta = self.param(f"{name}_beta", self.normal((channels,), 0.1))
        mean = self.param(f"{name}_moving_mean", np.zeros(channels))
        variance = self.param(f"{name}_moving_var", np.ones(channels))
        last = self.layers[-1]
        if last.output is x and last.bias is None and last.bn_mean is None:
            self.layers[-1] = Layer(x, last.weight, bn_mean=mean.name_hint)
        return op.nn.batch_norm(x, gamma, beta, mean, variance)

    def conv_bn(self, x: Expr, channels: int, kernel: int, name: str, *, stride: int = 1,
                padding: int = 0, groups: int = 1, act: str | None = "relu") -> Expr:
        """conv2d -> batch_norm -> activation (relu, relu6 or None)."""
        y = self.conv(x, channels, kernel, f"{name}_conv", stride=stride, padding=padding,
                      groups=groups)
        return _activation(self.bn(y, f"{name}_bn"), act)

    def dense(self, x: Expr, units: int, name: str) -> Expr:
        """dense + bias_add over the last axis."""
        in_units = _shape(x)[-1]
        weight = self.param(f"{name}_weight", self.normal((units, in_units),
                                                          1 / math.sqrt(in_units)))
        b = self.param(f"{name}_bias", self.normal((units,), 0.05))
        y = op.nn.bias_add(op.nn.dense(x, weight, units=units), b, axis=-1)
        self.layers.append(Layer(y, weight.name_hint, channel_axis=-1, bias=b.name_hint))
        return y

    def layer_norm(self, x: Expr, name: str) -> Expr:
        units = _shape(x)[-1]
        gamma = self.param(f"{name}_gamma", self.rng.uniform(0.8, 1.2, units))
        beta = self.param(f"{name}_beta", self.normal((units,), 0.1))
        return op.nn.layer_norm(x, gamma, beta, axis=-1)

    # -- the module ---------------------------------------------------------------------------
    def finish(self, data: Var, out: Expr) -> Workload:
        """The module ``@main(data, *weights)`` and its calibrated parameters."""
        func = Function([data, *self.params], out)
        unabsorbed = [layer.weight for layer in self.layers
                      if layer.bias is None and layer.bn_mean is None]
        assert not unabsorbed, f"layers without a bias or batch norm: {unabsorbed}"
        rng = np.random.default_rng([self.seed, 1])
        shape, dtype = data.type_annotation.shape, data.type_annotation.dtype
        batch = shape[0] if shape and isinstance(shape[0], int) else 1
        count = 1 if batch >= CALIBRATION_BATCH else CALIBRATION_SAMPLES
        samples = [{data.name_hint: rng.standard_normal(shape).astype(dtype)}
                   for _ in range(count)]
        params = calibrate(func, self.layers, self.values, samples)
        return IRModule.from_expr(func), params


def _shape(x: Expr) -> tuple[int, ...]:
    ty = x.checked_type
    assert isinstance(ty, TensorType)
    return ty.shape


def _activation(x: Expr, act: str | None) -> Expr:
    if act is None:
        return x
    if act == "relu":
        return op.nn.relu(x)
    if act == "relu6":
        return op.clip(x, a_min=0.0, a_max=6.0)
    raise OpfusionError(f"unknown activation {act!r}; use 'relu', 'relu6' or None")


def _data(batch_size: int, shape: Sequence[int], dtype: str) -> Var:
    if int(batch_size) < 1:
        raise OpfusionError(f"batch_size must be at least 1, got {batch_size}")
    return var("data", (int(batch_size), *(int(d) for d in shape)), dtype)


def _classifier(net: _Net, x: Expr, num_classes: int) -> Expr:
    """Global average pool -> flatten -> dense -> softmax, the head of the CNNs."""
    x = op.nn.batch_flatten(op.nn.global_avg_pool2d(x))
    return op.nn.softmax(net.dense(x, num_classes, "fc"), axis=-1)


# ---------------------------------------------------------------------------------------------
# builders


def mlp(batch_size: int = 1, dtype: str = "float32", seed: int = 0, num_classes: int = 10,
        image_shape: Sequence[int] = (1, 28, 28)) -> Workload:
    """A multi-layer perceptron: flatten -> dense 128 -> relu -> dense 64 -> relu -> dense
    ``num_classes`` -> softmax (TVM's ``relay.testing.mlp``)."""
    net = _Net(seed, dtype)
    data = _data(batch_size, image_shape, dtype)
    x = op.nn.batch_flatten(data)
    x = op.nn.relu(net.dense(x, 128, "fc1"))
    x = op.nn.relu(net.dense(x, 64, "fc2"))
    out = op.nn.softmax(net.dense(x, num_classes, "fc3"), axis=-1)
    return net.finish(data, out)


_RESNET_UNITS = {18: (2, 2, 2, 2), 34: (3, 4, 6, 3), 50: (3, 4, 6, 3), 101: (3, 4, 23, 3),
                 152: (3, 8, 36, 3)}


def resnet(batch_size: int = 1, dtype: str = "float32", seed: int = 0, num_layers: int = 18,
           image_shape: Sequence[int] = (3, 224, 224), num_classes: int = 1000) -> Workload:
    """ResNet v1 (He et al. 2015): a 7x7 stem, four stages of basic blocks (18, 34 layers) or
    bottleneck blocks (50, 101, 152), each conv followed by batch norm, then the classifier."""
    if num_layers not in _RESNET_UNITS:
        raise OpfusionError(f"resnet: no {num_layers}-layer variant; choose one of "
                            f"{', '.join(map(str, _RESNET_UNITS))}")
    bottleneck = num_layers >= 50
    expansion = 4 if bottleneck else 1
    net = _Net(seed, dtype)
    data = _data(batch_size, image_shape, dtype)
    x = net.conv_bn(data, 64, 7, "stem", stride=2, padding=3)
    x = op.nn.max_pool2d(x, pool_size=3, strides=2, padding=1)
    for stage, units in enumerate(_RESNET_UNITS[num_layers], start=1):
        width = 64 * 2 ** (stage - 1)
        for unit in range(1, units + 1):
            name = f"stage{stage}_unit{unit}"
            stride = 2 if unit == 1 and stage > 1 else 1
            if bottleneck:
                y = net.conv_bn(x, width, 1, f"{name}_1")
                y = net.conv_bn(y, width, 3, f"{name}_2", stride=stride, padding=1)
                y = net.conv_bn(y, width * expansion, 1, f"{name}_3", act=None)
            else:
                y = net.conv_bn(x, width, 3, f"{name}_1", stride=stride, padding=1)
                y = net.conv_bn(y, width, 3, f"{name}_2", padding=1, act=None)
            if stride != 1 or _shape(x)[1] != width * expansion:
                x = net.conv_bn(x, width * expansion, 1, f"{name}_shortcut", stride=stride,
                                act=None)
            x = op.nn.relu(op.add(y, x))
    return net.finish(data, _classifier(net, x, num_classes))


def _round_channels(channels: float, divisor: int = 8) -> int:
    """MobileNet's channel rounding: to a multiple of ``divisor``, never 10% below."""
    rounded = max(divisor, int(channels + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * channels else rounded


# expansion t, output channels c, repeats n, first stride s (Sandler et al. 2018, table 2)
_MOBILENET_V2_BLOCKS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                        (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


def mobilenet_v2(batch_size: int = 1, dtype: str = "float32", seed: int = 0,
                 num_classes: int = 1000, image_shape: Sequence[int] = (3, 224, 224),
                 width_multiplier: float = 1.0) -> Workload:
    """MobileNet v2: inverted residual blocks (1x1 expand -> 3x3 depthwise -> 1x1 linear
    projection, each with batch norm, relu6 between), residual where shapes allow."""
    net = _Net(seed, dtype)
    data = _data(batch_size, image_shape, dtype)
    channels = _round_channels(32 * width_multiplier)
    x = net.conv_bn(data, channels, 3, "stem", stride=2, padding=1, act="relu6")
    index = 0
    for expansion, out, repeats, first_stride in _MOBILENET_V2_BLOCKS:
        out = _round_channels(out * width_multiplier)
        for repeat in range(repeats):
            index += 1
            name, stride = f"block{index}", first_stride if repeat == 0 else 1
            hidden = _shape(x)[1] * expansion
            y = x
            if expansion != 1:
                y = net.conv_bn(y, hidden, 1, f"{name}_expand", act="relu6")
            y = net.conv_bn(y, hidden, 3, f"{name}_depthwise", stride=stride, padding=1,
                            groups=hidden, act="relu6")
            y = net.conv_bn(y, out, 1, f"{name}_project", act=None)
            x = op.add(x, y) if stride == 1 and _shape(x)[1] == out else y
    last = _round_channels(1280 * max(1.0, width_multiplier))
    x = net.conv_bn(x, last, 1, "head", act="relu6")
    return net.finish(data, _classifier(net, x, num_classes))


def squeezenet(batch_size: int = 1, dtype: str = "float32", seed: int = 0,
               version: str = "1.0", num_classes: int = 1000,
               image_shape: Sequence[int] = (3, 224, 224)) -> Workload:
    """SqueezeNet 1.0 or 1.1 (Iandola et al. 2016): fire modules (1x1 squeeze, then 1x1 and
    3x3 expands concatenated), convolutions with biases and ReLU, a convolutional classifier."""
    if version not in ("1.0", "1.1"):
        raise OpfusionError(f"squeezenet: version must be '1.0' or '1.1', got {version!r}")
    net = _Net(seed, dtype)
    data = _data(batch_size, image_shape, dtype)

    def conv_relu(x: Expr, channels: int, kernel: int, name: str, **kwargs: Any) -> Expr:
        return op.nn.relu(net.conv(x, channels, kernel, name, bias=True, **kwargs))

    def fire(x: Expr, squeeze: int, expand: int, name: str) -> Expr:
        x = conv_relu(x, squeeze, 1, f"{name}_squeeze1x1")
        left = conv_relu(x, expand, 1, f"{name}_expand1x1")
        right = conv_relu(x, expand, 3, f"{name}_expand3x3", padding=1)
        return op.concatenate([left, right], axis=1)

    def pool(x: Expr) -> Expr:
        return op.nn.max_pool2d(x, pool_size=3, strides=2, ceil_mode=True)

    if version == "1.0":
        x = pool(conv_relu(data, 96, 7, "conv1", stride=2))
        plan = [(16, 64), (16, 64), (32, 128), "pool", (32, 128), (48, 192), (48, 192),
                (64, 256), "pool", (64, 256)]
    else:
        x = pool(conv_relu(data, 64, 3, "conv1", stride=2))
        plan = [(16, 64), (16, 64), "pool", (32, 128), (32, 128), "pool", (48, 192),
                (48, 192), (64, 256), (64, 256)]
    index = 1
    for step in plan:
        if step == "pool":
            x = pool(x)
        else:
            index += 1
            x = fire(x, *step, name=f"fire{index}")
    x = op.nn.dropout(x, rate=0.5)
    x = conv_relu(x, num_classes, 1, "conv10")
    x = op.nn.batch_flatten(op.nn.global_avg_pool2d(x))
    return net.finish(data, op.nn.softmax(x, axis=-1))


# output channels of stages 2-4 and the last 1x1 conv, by width (Ma et al. 2018, table 5)
_SHUFFLENET_V2_CHANNELS = {0.5: (48, 96, 192, 1024), 1.0: (116, 232, 464, 1024),
                           1.5: (176, 352, 704, 1024), 2.0: (244, 488, 976, 2048)}


def shufflenet_v2(batch_size: int = 1, dtype: str = "float32", seed: int = 0,
                  num_classes: int = 1000, image_shape: Sequence[int] = (3, 224, 224),
                  width_multiplier: float = 1.0, stage_repeats: Sequence[int] = (4, 8, 4)
                  ) -> Workload:
    """ShuffleNet v2 as torchvision builds it: units that split the channels in two (a strided
    slice each, as the ONNX export's Slice nodes), transform one half (1x1 -> 3x3 depthwise ->
    1x1), concatenate and shuffle the channels (reshape -> transpose -> reshape); downsampling
    units transform both halves of the whole input instead."""
    if width_multiplier not in _SHUFFLENET_V2_CHANNELS:
        raise OpfusionError(f"shufflenet_v2: width_multiplier must be one of "
                            f"{', '.join(map(str, _SHUFFLENET_V2_CHANNELS))}, got "
                            f"{width_multiplier}")
    net = _Net(seed, dtype)
    data = _data(batch_size, image_shape, dtype)
    x = net.conv_bn(data, 24, 3, "conv1", stride=2, padding=1)
    x = op.nn.max_pool2d(x, pool_size=3, strides=2, padding=1)
    *stage_channels, last = _SHUFFLENET_V2_CHANNELS[width_multiplier]

    def branch(x: Expr, channels: int, stride: int, name: str) -> Expr:
        y = net.conv_bn(x, channels, 1, f"{name}_pw1")
        y = net.conv_bn(y, channels, 3, f"{name}_dw", stride=stride, padding=1,
                        groups=channels, act=None)
        return net.conv_bn(y, channels, 1, f"{name}_pw2")

    for stage, (channels, repeats) in enumerate(zip(stage_channels, stage_repeats), start=2):
        half = channels // 2
        for unit in range(1, repeats + 1):
            name = f"stage{stage}_unit{unit}"
            if unit == 1:
                inp = _shape(x)[1]
                left = net.conv_bn(x, inp, 3, f"{name}_branch1_dw", stride=2, padding=1,
                                   groups=inp, act=None)
                left = net.conv_bn(left, half, 1, f"{name}_branch1_pw")
                right = branch(x, half, 2, f"{name}_branch2")
            else:
                left = op.strided_slice(x, begin=[0], end=[half], axes=[1])
                right = branch(op.strided_slice(x, begin=[half], end=[channels], axes=[1]),
                               half, 1, f"{name}_branch2")
            x = _channel_shuffle(op.concatenate([left, right], axis=1), groups=2)
    x = net.conv_bn(x, last, 1, "conv5")
    return net.finish(data, _classifier(net, x, num_classes))


def _channel_shuffle(x: Expr, groups: int) -> Expr:
    batch, channels, height, width = _shape(x)
    x = op.reshape(x, newshape=(batch, groups, channels // groups, height, width))
    x = op.transpose(x, axes=(0, 2, 1, 3, 4))
    return op.reshape(x, newshape=(batch, channels, height, width))


def transformer_encoder(batch_size: int = 1, dtype: str = "float32", seed: int = 0,
                        hidden: int = 768, heads: int = 12, seq: int = 128,
                        ffn_hidden: int | None = None, activation: str = "gelu") -> Workload:
    """One post-norm transformer encoder layer (BERT-base sizes by default) on an input of
    shape (batch, seq, hidden): multi-head self-attention with softmax, residual, layer norm,
    feed-forward (dense -> gelu or relu -> dense), residual, layer norm."""
    if hidden % heads:
        raise OpfusionError(f"transformer_encoder: hidden={hidden} is not divisible by "
                            f"heads={heads}")
    if activation not in ("gelu", "relu"):
        raise OpfusionError(f"transformer_encoder: activation must be 'gelu' or 'relu', got "
                            f"{activation!r}")
    head_dim = hidden // heads
    ffn_hidden = ffn_hidden or 4 * hidden
    net = _Net(seed, dtype)
    data = _data(batch_size, (seq, hidden), dtype)

    def split_heads(x: Expr) -> Expr:  # (b, s, h*d) -> (b*h, s, d)
        x = op.reshape(x, newshape=(batch_size, seq, heads, head_dim))
        x = op.transpose(x, axes=(0, 2, 1, 3))
        return op.reshape(x, newshape=(batch_size * heads, seq, head_dim))

    query = split_heads(net.dense(data, hidden, "attn_query"))
    key = split_heads(net.dense(data, hidden, "attn_key"))
    value = split_heads(net.dense(data, hidden, "attn_value"))
    scores = op.nn.batch_matmul(query, key) * (1.0 / math.sqrt(head_dim))  # (b*h, s, s)
    context = op.nn.batch_matmul(op.nn.softmax(scores, axis=-1), value, transpose_b=False)
    context = op.reshape(context, newshape=(batch_size, heads, seq, head_dim))
    context = op.reshape(op.transpose(context, axes=(0, 2, 1, 3)),
                         newshape=(batch_size, seq, hidden))
    x = net.layer_norm(data + net.dense(context, hidden, "attn_output"), "attn_norm")
    y = net.dense(x, ffn_hidden, "ffn_inner")
    if activation == "gelu":  # the exact form: x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2))
        y = (y * 0.5) * (op.erf(y * (1.0 / math.sqrt(2.0))) + 1.0)
    else:
        y = op.nn.relu(y)
    out = net.layer_norm(x + net.dense(y, hidden, "ffn_output"), "ffn_norm")
    return net.finish(data, out)


# ---------------------------------------------------------------------------------------------
# registry and inputs

WORKLOADS: dict[str, Callable[..., Workload]] = {
    "mlp": mlp,
    "resnet18": partial(resnet, num_layers=18),
    "resnet50": partial(resnet, num_layers=50),
    "mobilenet_v2": mobilenet_v2,
    "squeezenet": squeezenet,
    "shufflenet_v2": shufflenet_v2,
    "transformer_encoder": transformer_encoder,
}

# Arguments that make each workload of WORKLOADS small enough for unit tests (well under a
# second to build and run) while keeping every layer of the architecture.
SMALL_WORKLOAD_ARGS: dict[str, dict[str, Any]] = {
    "mlp": {},
    "resnet18": {"image_shape": (3, 32, 32), "num_classes": 10},
    "resnet50": {"image_shape": (3, 32, 32), "num_classes": 10},
    "mobilenet_v2": {"image_shape": (3, 32, 32), "num_classes": 10},
    "squeezenet": {"image_shape": (3, 48, 48), "num_classes": 10},
    "shufflenet_v2": {"image_shape": (3, 32, 32), "num_classes": 10,
                      "width_multiplier": 0.5, "stage_repeats": (2, 2, 2)},
    "transformer_encoder": {"hidden": 64, "heads": 4, "seq": 16},
}


def workload_input(mod: IRModule, params: dict[str, np.ndarray] | None = None,
                   seed: int = 0) -> dict[str, np.ndarray]:
    """Standard-normal arrays, by name, for the parameters of ``@main`` not in ``params``
    (the data inputs), in their declared shapes and dtypes."""
    rng = np.random.default_rng(seed)
    inputs = {}
    for param in mod["main"].params:
        if params is not None and param.name_hint in params:
            continue
        ty = param.type_annotation
        if not isinstance(ty, TensorType) or np.dtype(ty.dtype).kind != "f":
            raise OpfusionError(f"workload_input: input %{param.name_hint} is not a floating "
                                "point tensor; give its value yourself")
        inputs[param.name_hint] = rng.standard_normal(ty.shape).astype(ty.dtype)
    return inputs
