"""Random-weight ONNX copies of four torchvision classifiers, built without torch.

``mobilenet_v3_large``, ``efficientnet_b0``, ``shufflenet_v2_x1_0`` and ``resnet18`` are
written node by node with ``onnx.helper``, layer for layer as torchvision defines them, in the
operator forms of ``torch.onnx.export`` in eval mode at opset 18: Conv, Relu, HardSwish and
HardSigmoid (MobileNet v3), Sigmoid and Mul for SiLU (EfficientNet), squeeze-excitation as
GlobalAveragePool, two 1x1 Convs with biases and a Mul, ShuffleNet v2's channel shuffle as
Reshape, Transpose, Reshape, global pooling as GlobalAveragePool (ReduceMean for ShuffleNet's
``x.mean([2, 3])``), Flatten and Gemm; Dropout and stochastic depth are the identity in eval
mode and left out. torch's TorchScript-based exporter gives these nodes op for op, but folds
each batch norm into a bias of its convolution and spells ShuffleNet's ``chunk`` as Shape,
Gather and Slice; here every convolution but squeeze-excitation's is bias-free and followed
by a BatchNormalization (so that the passes that fold them have work), and the chunk is one
Split.

Initializers carry the names of torchvision's ``state_dict`` keys (``layer1.0.conv1.weight``,
``features.3.block.2.fc1.bias``, ...), so the weights load into the torch modules one to one.
They are drawn with :func:`.light.random_weight` and calibrated like the light models'
(:func:`.light.calibrate_onnx_model`): every convolution and dense layer has standardized
output on standard-normal inputs, so activations keep their scale through the depth and the
logits depend on the input.

Except the two small layers of each squeeze-excitation block, which keep their drawn weights
(as a freshly initialized torch model has them: gates near 0.5 that differ by channel). Their
inputs are global averages, which differ between inputs by a small fraction of their size;
calibration would scale each block's gates to react to that fraction in full (centring a
layer on a 1x1 map unit by unit over the samples, or even over the whole tensor), and the
gates of the next blocks to the first ones' reaction: through EfficientNet's 16 blocks,
activations on inputs other than the calibration samples then ended up to 10 times too large.

Input ``input`` is (1, 3, 224, 224) float32, output ``output`` (1, 1000). Copies are cached
next to the light models' (:func:`.light.models_dir`) under a name that holds the model, the
seed and :data:`FORMAT_VERSION`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import OpfusionError
from .light import calibrate_onnx_model, models_dir, random_weight, write_atomically

# Bump when the generated graphs or weights change, so stale copies in a cache are not reused.
FORMAT_VERSION = "v1"
OPSET = 18
INPUT_SHAPE = (1, 3, 224, 224)
NUM_CLASSES = 1000


def vision_model(name: str, seed: int = 0) -> Path:
    """The path of a random-weight, calibrated ONNX copy of torchvision model ``name`` (one of
    :data:`VISION_MODEL_NAMES`).

    Generated on first use (1-4 s per model, most of it calibration) and cached; feed it
    standard-normal inputs of shape (1, 3, 224, 224)."""
    _check_name(name)
    path = models_dir() / f"vision_{name}_seed{int(seed)}_{FORMAT_VERSION}.onnx"
    if path.is_file():
        return path
    model = build_vision_model(name, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(model, path)
    return path


def build_vision_model(name: str, seed: int = 0) -> Any:
    """The random-weight, calibrated copy of torchvision model ``name`` as an
    ``onnx.ModelProto`` (not cached; :func:`vision_model` caches it)."""
    import onnx

    _check_name(name)
    net = _Net(np.random.default_rng(seed))
    model = net.model(name, _BUILDERS[name](net, "input"))
    calibrate_onnx_model(model, np.random.default_rng([seed, 1]),
                         skip=net.squeeze_excitation_weights)
    onnx.checker.check_model(model)
    return model


def _check_name(name: str) -> None:
    if name not in _BUILDERS:
        raise OpfusionError(f"no vision model named {name!r}; the names are "
                            f"{', '.join(VISION_MODEL_NAMES)}")


# ---------------------------------------------------------------------------------------------
# graph construction


class _Net:
    """An ONNX graph under construction: nodes in order, random initializers by name.

    Layer methods take the name of their input tensor and the torch module path of the layer
    (the prefix of its weights' names) and return the name of their output tensor."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self.names: set[str] = {"input"}
        # Left as drawn by the calibration (see the module's docstring).
        self.squeeze_excitation_weights: set[str] = set()

    def node(self, op: str, inputs: Sequence[str], scope: str, outputs: int = 1,
             **attrs: Any) -> Any:
        """Append an ``op`` node reading ``inputs``; its outputs are named after ``scope``."""
        from onnx import helper

        base = f"{scope}/{op}" if scope else op
        names = [self._unique(base if outputs == 1 else f"{base}_{i}") for i in range(outputs)]
        node = helper.make_node(op, list(inputs), names, name=names[0], **attrs)
        self.nodes.append(node)
        return node

    def _unique(self, name: str) -> str:
        candidate, index = name, 1
        while candidate in self.names:
            candidate, index = f"{name}_{index}", index + 1
        self.names.add(candidate)
        return candidate

    def weights(self, node: Any, shapes: dict[int, tuple[int, ...]]) -> None:
        """Random initializers for the inputs of ``node`` named by slot in ``shapes``."""
        from onnx import numpy_helper

        for slot, shape in shapes.items():
            value = random_weight(self.rng, node, slot, list(shape)).astype(np.float32)
            self.initializers.append(numpy_helper.from_array(value, node.input[slot]))

    def ints(self, name: str, values: Sequence[int]) -> str:
        """An int64 initializer (a shape, axes or split sizes)."""
        from onnx import numpy_helper

        name = self._unique(name)
        self.initializers.append(numpy_helper.from_array(np.asarray(values, np.int64), name))
        return name

    def model(self, name: str, output: str) -> Any:
        """The ``onnx.ModelProto`` of the graph so far, whose logits are tensor ``output``."""
        from onnx import TensorProto, helper

        # The logits come from the last node and nothing else reads them: name them "output".
        last = self.nodes[-1]
        assert list(last.output) == [output], (last.name, output)
        last.output[0] = output = "output"
        graph = helper.make_graph(
            self.nodes, name,
            [helper.make_tensor_value_info("input", TensorProto.FLOAT, INPUT_SHAPE)],
            [helper.make_tensor_value_info(output, TensorProto.FLOAT, (1, NUM_CLASSES))],
            self.initializers)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                 ir_version=8, producer_name="opfusion.testing.vision")

    # -- layers ---------------------------------------------------------------------------------

    def conv(self, x: str, scope: str, cin: int, cout: int, kernel: int, stride: int = 1,
             groups: int = 1, bias: bool = False) -> str:
        """``nn.Conv2d`` with torchvision's padding ``(kernel - 1) // 2``."""
        pad = (kernel - 1) // 2
        inputs = [x, f"{scope}.weight"] + ([f"{scope}.bias"] if bias else [])
        node = self.node("Conv", inputs, scope, kernel_shape=[kernel, kernel],
                         strides=[stride, stride], pads=[pad] * 4, group=groups,
                         dilations=[1, 1])
        shapes = {1: (cout, cin // groups, kernel, kernel)}
        if bias:
            shapes[2] = (cout,)
        self.weights(node, shapes)
        return node.output[0]

    def batch_norm(self, x: str, scope: str, channels: int, eps: float = 1e-5) -> str:
        node = self.node("BatchNormalization",
                         [x] + [f"{scope}.{p}" for p in ("weight", "bias", "running_mean",
                                                         "running_var")],
                         scope, epsilon=eps)
        self.weights(node, {slot: (channels,) for slot in (1, 2, 3, 4)})
        return node.output[0]

    def activation(self, x: str, kind: str | None, scope: str) -> str:
        """``kind``: None (identity), "relu", "hardswish", "hardsigmoid", "sigmoid" or "silu"
        (Sigmoid then Mul, as torch exports ``nn.SiLU``)."""
        if kind is None:
            return x
        if kind == "silu":
            gate = self.node("Sigmoid", [x], scope).output[0]
            return self.node("Mul", [x, gate], scope).output[0]
        if kind == "hardsigmoid":  # F.hardsigmoid: relu6(x + 3) / 6
            return self.node("HardSigmoid", [x], scope, alpha=1 / 6, beta=0.5).output[0]
        ops = {"relu": "Relu", "hardswish": "HardSwish", "sigmoid": "Sigmoid"}
        return self.node(ops[kind], [x], scope).output[0]

    def conv_bn_act(self, x: str, scope: str, cin: int, cout: int, kernel: int,
                    stride: int = 1, groups: int = 1, act: str | None = None,
                    eps: float = 1e-5) -> str:
        """torchvision's ``Conv2dNormActivation``: modules ``scope.0`` (conv, no bias) and
        ``scope.1`` (batch norm), then the activation."""
        y = self.conv(x, f"{scope}.0", cin, cout, kernel, stride, groups)
        y = self.batch_norm(y, f"{scope}.1", cout, eps)
        return self.activation(y, act, f"{scope}.2")

    def squeeze_excitation(self, x: str, scope: str, channels: int, squeeze: int,
                           act: str, gate: str) -> str:
        """torchvision's ``SqueezeExcitation``: ``x * gate(fc2(act(fc1(avgpool(x)))))``."""
        scale = self.node("GlobalAveragePool", [x], f"{scope}.avgpool").output[0]
        scale = self.conv(scale, f"{scope}.fc1", channels, squeeze, 1, bias=True)
        scale = self.activation(scale, act, f"{scope}.activation")
        scale = self.conv(scale, f"{scope}.fc2", squeeze, channels, 1, bias=True)
        scale = self.activation(scale, gate, f"{scope}.scale_activation")
        self.squeeze_excitation_weights |= {f"{scope}.fc1.weight", f"{scope}.fc2.weight"}
        return self.node("Mul", [scale, x], scope).output[0]

    def linear(self, x: str, scope: str, cin: int, cout: int) -> str:
        node = self.node("Gemm", [x, f"{scope}.weight", f"{scope}.bias"], scope, alpha=1.0,
                         beta=1.0, transB=1)
        self.weights(node, {1: (cout, cin), 2: (cout,)})
        return node.output[0]

    def add(self, a: str, b: str, scope: str) -> str:
        return self.node("Add", [a, b], scope).output[0]

    def pool_flatten(self, x: str, scope: str) -> str:
        """``nn.AdaptiveAvgPool2d(1)`` then ``torch.flatten(x, 1)``."""
        x = self.node("GlobalAveragePool", [x], scope).output[0]
        return self.node("Flatten", [x], scope, axis=1).output[0]


def make_divisible(value: float, divisor: int = 8) -> int:
    """torchvision's ``_make_divisible``: the nearest multiple of ``divisor`` (at least
    ``divisor``), one step up if rounding lost more than 10%."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


# ---------------------------------------------------------------------------------------------
# ResNet-18 (torchvision/models/resnet.py: BasicBlock, layers [2, 2, 2, 2])


def _resnet18(net: _Net, x: str) -> str:
    x = net.conv(x, "conv1", 3, 64, 7, stride=2)
    x = net.activation(net.batch_norm(x, "bn1", 64), "relu", "relu")
    x = net.node("MaxPool", [x], "maxpool", kernel_shape=[3, 3], strides=[2, 2],
                 pads=[1, 1, 1, 1]).output[0]
    cin = 64
    for stage, cout in enumerate((64, 128, 256, 512), start=1):
        for index in range(2):
            stride = 2 if stage > 1 and index == 0 else 1
            x = _basic_block(net, x, f"layer{stage}.{index}", cin, cout, stride)
            cin = cout
    return net.linear(net.pool_flatten(x, "avgpool"), "fc", 512, NUM_CLASSES)


def _basic_block(net: _Net, x: str, scope: str, cin: int, cout: int, stride: int) -> str:
    y = net.conv(x, f"{scope}.conv1", cin, cout, 3, stride)
    y = net.activation(net.batch_norm(y, f"{scope}.bn1", cout), "relu", f"{scope}.relu")
    y = net.batch_norm(net.conv(y, f"{scope}.conv2", cout, cout, 3), f"{scope}.bn2", cout)
    if stride != 1 or cin != cout:
        x = net.conv(x, f"{scope}.downsample.0", cin, cout, 1, stride)
        x = net.batch_norm(x, f"{scope}.downsample.1", cout)
    return net.activation(net.add(y, x, scope), "relu", f"{scope}.relu")


# ---------------------------------------------------------------------------------------------
# MobileNet v3 large (torchvision/models/mobilenetv3.py)


@dataclass(frozen=True)
class _Bneck:
    """One inverted-residual block: in, kernel, expanded, out channels, squeeze-excitation,
    activation ("relu" or "hardswish"), stride."""

    cin: int
    kernel: int
    expanded: int
    cout: int
    se: bool
    act: str
    stride: int


_RE, _HS = "relu", "hardswish"
_MOBILENET_V3_LARGE = (
    _Bneck(16, 3, 16, 16, False, _RE, 1), _Bneck(16, 3, 64, 24, False, _RE, 2),
    _Bneck(24, 3, 72, 24, False, _RE, 1), _Bneck(24, 5, 72, 40, True, _RE, 2),
    _Bneck(40, 5, 120, 40, True, _RE, 1), _Bneck(40, 5, 120, 40, True, _RE, 1),
    _Bneck(40, 3, 240, 80, False, _HS, 2), _Bneck(80, 3, 200, 80, False, _HS, 1),
    _Bneck(80, 3, 184, 80, False, _HS, 1), _Bneck(80, 3, 184, 80, False, _HS, 1),
    _Bneck(80, 3, 480, 112, True, _HS, 1), _Bneck(112, 3, 672, 112, True, _HS, 1),
    _Bneck(112, 5, 672, 160, True, _HS, 2), _Bneck(160, 5, 960, 160, True, _HS, 1),
    _Bneck(160, 5, 960, 160, True, _HS, 1),
)
_MOBILENET_V3_EPS = 0.001  # BatchNorm2d(eps=0.001, momentum=0.01)


def _mobilenet_v3_large(net: _Net, x: str) -> str:
    eps = _MOBILENET_V3_EPS
    x = net.conv_bn_act(x, "features.0", 3, 16, 3, stride=2, act=_HS, eps=eps)
    for index, cnf in enumerate(_MOBILENET_V3_LARGE, start=1):
        x = _mobilenet_v3_block(net, x, f"features.{index}.block", cnf)
    last = len(_MOBILENET_V3_LARGE) + 1
    x = net.conv_bn_act(x, f"features.{last}", 160, 960, 1, act=_HS, eps=eps)
    x = net.pool_flatten(x, "avgpool")
    x = net.activation(net.linear(x, "classifier.0", 960, 1280), _HS, "classifier.1")
    return net.linear(x, "classifier.3", 1280, NUM_CLASSES)


def _mobilenet_v3_block(net: _Net, x: str, scope: str, cnf: _Bneck) -> str:
    eps, layers = _MOBILENET_V3_EPS, 0
    y = x
    if cnf.expanded != cnf.cin:
        y = net.conv_bn_act(y, f"{scope}.0", cnf.cin, cnf.expanded, 1, act=cnf.act, eps=eps)
        layers += 1
    y = net.conv_bn_act(y, f"{scope}.{layers}", cnf.expanded, cnf.expanded, cnf.kernel,
                        cnf.stride, groups=cnf.expanded, act=cnf.act, eps=eps)
    layers += 1
    if cnf.se:
        y = net.squeeze_excitation(y, f"{scope}.{layers}", cnf.expanded,
                                   make_divisible(cnf.expanded // 4), "relu", "hardsigmoid")
        layers += 1
    y = net.conv_bn_act(y, f"{scope}.{layers}", cnf.expanded, cnf.cout, 1, eps=eps)
    if cnf.stride == 1 and cnf.cin == cnf.cout:
        y = net.add(y, x, scope.removesuffix(".block"))
    return y


# ---------------------------------------------------------------------------------------------
# EfficientNet-B0 (torchvision/models/efficientnet.py: MBConv, width and depth 1.0)

# Stages: expand ratio, kernel, stride, in, out channels, blocks.
_EFFICIENTNET_B0 = ((1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2),
                    (6, 3, 2, 40, 80, 3), (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4),
                    (6, 3, 1, 192, 320, 1))


def _efficientnet_b0(net: _Net, x: str) -> str:
    x = net.conv_bn_act(x, "features.0", 3, 32, 3, stride=2, act="silu")
    for stage, (expand, kernel, stride, cin, cout, blocks) in enumerate(_EFFICIENTNET_B0, 1):
        for index in range(blocks):
            first = index == 0
            x = _mbconv(net, x, f"features.{stage}.{index}", cin if first else cout, cout,
                        expand, kernel, stride if first else 1)
    head = len(_EFFICIENTNET_B0) + 1
    x = net.conv_bn_act(x, f"features.{head}", 320, 1280, 1, act="silu")
    return net.linear(net.pool_flatten(x, "avgpool"), "classifier.1", 1280, NUM_CLASSES)


def _mbconv(net: _Net, x: str, scope: str, cin: int, cout: int, expand: int, kernel: int,
            stride: int) -> str:
    expanded, layers, y = make_divisible(cin * expand), 0, x
    if expanded != cin:
        y = net.conv_bn_act(y, f"{scope}.block.0", cin, expanded, 1, act="silu")
        layers += 1
    y = net.conv_bn_act(y, f"{scope}.block.{layers}", expanded, expanded, kernel, stride,
                        groups=expanded, act="silu")
    y = net.squeeze_excitation(y, f"{scope}.block.{layers + 1}", expanded, max(1, cin // 4),
                               "silu", "sigmoid")
    y = net.conv_bn_act(y, f"{scope}.block.{layers + 2}", expanded, cout, 1)
    return net.add(y, x, scope) if stride == 1 and cin == cout else y


# ---------------------------------------------------------------------------------------------
# ShuffleNet v2 x1.0 (torchvision/models/shufflenetv2.py)

_SHUFFLENET_V2_REPEATS = (4, 8, 4)
_SHUFFLENET_V2_X1_0 = (24, 116, 232, 464, 1024)


def _shufflenet_v2_x1_0(net: _Net, x: str) -> str:
    channels = _SHUFFLENET_V2_X1_0
    x = net.conv(x, "conv1.0", 3, channels[0], 3, stride=2)
    x = net.activation(net.batch_norm(x, "conv1.1", channels[0]), "relu", "conv1.2")
    x = net.node("MaxPool", [x], "maxpool", kernel_shape=[3, 3], strides=[2, 2],
                 pads=[1, 1, 1, 1]).output[0]
    size = INPUT_SHAPE[2] // 4
    cin = channels[0]
    for stage, (repeats, cout) in enumerate(zip(_SHUFFLENET_V2_REPEATS, channels[1:]), 2):
        size //= 2
        for index in range(repeats):
            scope = f"stage{stage}.{index}"
            x = _shuffle_block(net, x, scope, cin if index == 0 else cout, cout,
                               2 if index == 0 else 1, size)
        cin = cout
    x = net.conv(x, "conv5.0", cin, channels[-1], 1)
    x = net.activation(net.batch_norm(x, "conv5.1", channels[-1]), "relu", "conv5.2")
    x = net.node("ReduceMean", [x, net.ints("mean_axes", [2, 3])], "mean",
                 keepdims=0).output[0]
    return net.linear(x, "fc", channels[-1], NUM_CLASSES)


def _shuffle_block(net: _Net, x: str, scope: str, cin: int, cout: int, stride: int,
                   size: int) -> str:
    """ShuffleNet v2's ``InvertedResidual``; ``size`` is its output's height and width."""
    half = cout // 2
    if stride == 1:
        split = net.node("Split", [x, net.ints(f"{scope}/split", [half, half])], scope,
                         outputs=2, axis=1)
        kept, x = split.output
        branch_in = half
    else:
        kept = _branch1(net, x, f"{scope}.branch1", cin, half, stride)
        branch_in = cin
    y = net.conv(x, f"{scope}.branch2.0", branch_in, half, 1)
    y = net.activation(net.batch_norm(y, f"{scope}.branch2.1", half), "relu",
                       f"{scope}.branch2.2")
    y = net.conv(y, f"{scope}.branch2.3", half, half, 3, stride, groups=half)
    y = net.batch_norm(y, f"{scope}.branch2.4", half)
    y = net.conv(y, f"{scope}.branch2.5", half, half, 1)
    y = net.activation(net.batch_norm(y, f"{scope}.branch2.6", half), "relu",
                       f"{scope}.branch2.7")
    out = net.node("Concat", [kept, y], scope, axis=1).output[0]
    return _channel_shuffle(net, out, scope, cout, size)


def _branch1(net: _Net, x: str, scope: str, cin: int, cout: int, stride: int) -> str:
    y = net.conv(x, f"{scope}.0", cin, cin, 3, stride, groups=cin)
    y = net.batch_norm(y, f"{scope}.1", cin)
    y = net.conv(y, f"{scope}.2", cin, cout, 1)
    return net.activation(net.batch_norm(y, f"{scope}.3", cout), "relu", f"{scope}.4")


def _channel_shuffle(net: _Net, x: str, scope: str, channels: int, size: int) -> str:
    """``channel_shuffle(x, 2)``: view as (n, 2, c/2, h, w), swap axes 1 and 2, flatten."""
    groups = net.ints(f"{scope}/shuffle_shape", [0, 2, channels // 2, size, size])
    x = net.node("Reshape", [x, groups], scope).output[0]
    x = net.node("Transpose", [x], scope, perm=[0, 2, 1, 3, 4]).output[0]
    flat = net.ints(f"{scope}/flat_shape", [0, -1, size, size])
    return net.node("Reshape", [x, flat], scope).output[0]


_BUILDERS: dict[str, Callable[[_Net, str], str]] = {
    "efficientnet_b0": _efficientnet_b0,
    "mobilenet_v3_large": _mobilenet_v3_large,
    "resnet18": _resnet18,
    "shufflenet_v2_x1_0": _shufflenet_v2_x1_0,
}
VISION_MODEL_NAMES: tuple[str, ...] = tuple(_BUILDERS)
