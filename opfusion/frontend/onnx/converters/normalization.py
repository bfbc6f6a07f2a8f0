"""Converters of ONNX's normalization operators: BatchNormalization (inference),
InstanceNormalization, LayerNormalization, GroupNormalization, RMSNormalization, LRN,
LpNormalization and MeanVarianceNormalization.

batch_norm, layer_norm and lrn map onto opfusion operators; the rest decompose into
reductions (mean, variance) and elementwise arithmetic."""

from __future__ import annotations

import math

from .... import op
from ....ir.expr import Expr
from ..registry import OnnxNode, converter
from ._common import cast_like as _cast_like
from ._common import checked_axis as _axis
from ._common import filled
from ._common import shape_of as _shape
from ._common import tensor_type as _type
from .elementwise import scalar


def abs_power(x: Expr, p: float) -> Expr:
    """|x| ** p, with the cheap forms for p = 1 and 2 (Lp norms and Lp pooling)."""
    if p == 1:
        return op.abs(x)
    if p == 2:
        return x * x
    return op.power(op.abs(x), scalar(p, x))


def root(x: Expr, p: float) -> Expr:
    """x ** (1 / p), the last step of an Lp norm."""
    if p == 1:
        return x
    if p == 2:
        return op.sqrt(x)
    return op.power(x, scalar(1.0 / p, x))


# ---------------------------------------------------------------------------------------------
# normalization


@converter("BatchNormalization")
def batch_norm(node: OnnxNode) -> Expr:
    if node.attr("training_mode", 0):
        raise node.error("training_mode=1 normalizes with batch statistics; opfusion imports "
                         "inference graphs: export the model in eval mode")
    if node.num_outputs > 1:
        raise node.error(f"asks for {node.num_outputs} outputs; the running and saved "
                         "mean/variance outputs exist only in training: export the model in "
                         "eval mode (one output)")
    data = node.input(0)
    params = [_cast_like(node.input(i), data) for i in range(1, 5)]
    epsilon = node.attr("epsilon", 1e-5)
    if node.opset < 9 and not node.attr("spatial", 1):
        # Per-activation statistics: the parameters are (C, D1, ...), one per element.
        scale, bias, mean, var = (op.expand_dims(p, axis=0) for p in params)
        return (data - mean) * (scale * op.rsqrt(var + epsilon)) + bias
    return op.nn.batch_norm(data, *params, axis=1, epsilon=epsilon)


def _vector_input(node: OnnxNode, index: int, name: str, size: int, of: str) -> Expr:
    """Input ``index`` checked to be 1-D of ``size`` values (``of`` says what it counts), as
    ONNX declares it and ONNX Runtime checks; a scalar or another length is an error, not a
    value broadcast over every channel."""
    value = node.input(index)
    shape = _shape(value)
    if shape != (size,):
        raise node.error(f"input {index} ({name}) must be 1-D with one value per {of} "
                         f"({size}), got shape {shape}")
    return value


@converter("InstanceNormalization")
def instance_norm(node: OnnxNode) -> Expr:
    data = node.input(0)
    ndim = len(_shape(data))
    if ndim < 3:
        raise node.error(f"needs data of shape (N, C, spatial...), got {_shape(data)}")
    channels = _shape(data)[1]
    scale = _vector_input(node, 1, "scale", channels, "channel")
    bias = _vector_input(node, 2, "B", channels, "channel")
    axes = list(range(2, ndim))
    centered = data - op.mean(data, axis=axes, keepdims=True)
    var = op.variance(data, axis=axes, keepdims=True)
    normed = centered * op.rsqrt(var + node.attr("epsilon", 1e-5))
    per_channel = [-1] + [1] * (ndim - 2)
    return (normed * op.reshape(scale, newshape=per_channel)
            + op.reshape(bias, newshape=per_channel))


def _trailing_vector(param: Expr, inner: tuple[int, ...]) -> Expr | None:
    """``param`` as a 1-D vector over the flattened ``inner`` axes, or None if it does not
    broadcast into them (a parameter that broadcasts over the leading axes too)."""
    shape = _shape(param)
    while len(shape) > len(inner) and shape[0] == 1:
        shape = shape[1:]
    if len(shape) > len(inner) or any(p not in (1, i) for p, i in
                                       zip(reversed(shape), reversed(inner))):
        return None
    if shape != inner:
        param = op.broadcast_to(op.reshape(param, newshape=shape or [1]), shape=inner)
    return op.reshape(param, newshape=[-1])


@converter("LayerNormalization", since=17)
def layer_norm(node: OnnxNode) -> Expr | list[Expr]:
    data, scale, bias = node.input(0), node.input(1), node.optional_input(2)
    shape = _shape(data)
    axis = _axis(node, node.attr("axis", -1), len(shape))
    epsilon = node.attr("epsilon", 1e-5)
    inner = shape[axis:]
    size = math.prod(inner)
    # One normalized axis: flatten the trailing axes into it (a no-op when there is one).
    flat = data if len(inner) == 1 else op.reshape(data, newshape=[*shape[:axis], size])
    gamma = _trailing_vector(scale, inner)
    beta = None if bias is None else _trailing_vector(bias, inner)
    if gamma is not None and (bias is None or beta is not None):
        zeros = filled([size], 0, _type(data).dtype, what="the zero bias")
        normed = op.nn.layer_norm(flat, gamma, zeros if beta is None else beta, axis=-1,
                                  epsilon=epsilon, center=beta is not None)
        out = normed if len(inner) == 1 else op.reshape(normed, newshape=list(shape))
    else:  # parameters broadcasting over the leading axes too: apply them elementwise
        ones = filled([size], 1, _type(data).dtype, what="the unit scale")
        normed = op.nn.layer_norm(flat, ones, ones, axis=-1, epsilon=epsilon, center=False,
                                  scale=False)
        out = (normed if len(inner) == 1 else op.reshape(normed, newshape=list(shape))) * scale
        out = out if bias is None else out + bias
    if node.num_outputs == 1:
        return out
    # Mean and InvStdDev, shaped as data with the normalized axes kept as size 1.
    kept = [*shape[:axis], *([1] * len(inner))]
    mean = op.reshape(op.mean(flat, axis=[-1], keepdims=True), newshape=kept)
    var = op.variance(flat, axis=[-1], keepdims=True)
    inv_std = op.reshape(op.rsqrt(var + epsilon), newshape=kept)
    return [out, mean, inv_std][:node.num_outputs]


@converter("GroupNormalization", since=18)
def group_norm(node: OnnxNode) -> Expr:
    # Normalize each group of C / num_groups channels of each instance; then scale and shift,
    # per group before opset 21 and per channel from 21 on.
    data = node.input(0)
    shape = _shape(data)
    groups = node.attr("num_groups")
    if groups is None or len(shape) < 2 or groups <= 0 or shape[1] % groups:
        raise node.error(f"attribute num_groups={groups} must divide the {shape[1:2]} "
                         f"channels of data {shape}")
    size, of = (groups, "group") if node.opset < 21 else (shape[1], "channel")
    scale = _vector_input(node, 1, "scale", size, of)
    bias = _vector_input(node, 2, "bias", size, of)
    grouped = op.reshape(data, newshape=[shape[0], groups, -1])
    centered = grouped - op.mean(grouped, axis=[2], keepdims=True)
    var = op.variance(grouped, axis=[2], keepdims=True)
    normed = centered * op.rsqrt(var + node.attr("epsilon", 1e-5))
    if node.opset < 21:
        normed = (normed * op.reshape(scale, newshape=[groups, 1])
                  + op.reshape(bias, newshape=[groups, 1]))
        return op.reshape(normed, newshape=list(shape))
    per_channel = [-1] + [1] * (len(shape) - 2)
    return (op.reshape(normed, newshape=list(shape)) * op.reshape(scale, newshape=per_channel)
            + op.reshape(bias, newshape=per_channel))


@converter("RMSNormalization", since=23)
def rms_norm(node: OnnxNode) -> Expr:
    # x / sqrt(mean(x^2 over axis..) + epsilon) * scale.
    data, scale = node.input(0), node.input(1)
    ndim = len(_shape(data))
    axes = list(range(_axis(node, node.attr("axis", -1), ndim), ndim))
    mean_square = op.mean(data * data, axis=axes, keepdims=True)
    return data * op.rsqrt(mean_square + node.attr("epsilon", 1e-5)) * scale


@converter("LRN")
def lrn(node: OnnxNode) -> Expr:
    size = node.attr("size")
    if size is None:
        raise node.error("attribute size is required")
    return op.nn.lrn(node.input(0), size=size, axis=1, bias=node.attr("bias", 1.0),
                     alpha=node.attr("alpha", 1e-4), beta=node.attr("beta", 0.75))


@converter("LpNormalization")
def lp_normalization(node: OnnxNode) -> Expr:
    data = node.input(0)
    p = node.attr("p", 2)
    if p not in (1, 2):
        raise node.error(f"attribute p={p} must be 1 or 2")
    axis = _axis(node, node.attr("axis", -1), len(_shape(data)))
    norm = root(op.sum(abs_power(data, p), axis=[axis], keepdims=True), p)
    # A zero norm means a zero slice, which stays zero (ONNX: 0 / 0 = 0): divide it by 1.
    zero = scalar(0, norm)
    return data / op.where(op.equal(norm, zero), scalar(1, norm), norm)


@converter("MeanVarianceNormalization", since=9)
def mean_variance_normalization(node: OnnxNode) -> Expr:
    # ONNX's function body: (x - mean) / (sqrt(variance) + 1e-9) over ``axes``.
    data = node.input(0)
    axes = node.attr("axes", [0, 2, 3])
    centered = data - op.mean(data, axis=axes, keepdims=True)
    std = op.sqrt(op.variance(data, axis=axes, keepdims=True))
    return centered / (std + 1e-9)
