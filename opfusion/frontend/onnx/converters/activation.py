"""Converters of ONNX's activation functions: the softmax family (Softmax, LogSoftmax,
Hardmax, whose axis semantics changed in opset 13) and the activations with no opfusion
operator of their own, decomposed into elementwise ones.

The decompositions overflow only where the function itself does: Elu, Selu and Celu take exp
of min(x, 0), Softplus and Mish the exp of -|x|."""

from __future__ import annotations

from collections.abc import Callable

from .... import op
from ....ir.expr import Constant, Expr
from ....ir.types import is_float
from ...common import gelu as gelu_of
from ..registry import OnnxNode, converter
from ._common import checked_axis as _axis
from ._common import index_range
from ._common import shape_of as _shape
from ._common import tensor_type as _type
from .elementwise import scalar

# ---------------------------------------------------------------------------------------------
# softmax family: before opset 13 the input is coerced to 2-D at ``axis`` (default 1);
# from 13 on the function runs along the single ``axis`` (default -1).


def coerced_to_2d(node: OnnxNode, fn: Callable[[Expr, int], Expr]) -> Expr:
    """``fn`` (a softmax-like function of (data, axis)) of the node's input coerced to 2-D at
    its ``axis`` (default 1), as the family is defined before opset 13."""
    data = node.input(0)
    shape = _shape(data)
    axis = _axis(node, node.attr("axis", 1), max(len(shape), 1))
    if axis == len(shape) - 1:
        return fn(data, -1)
    return op.reshape(fn(op.flatten(data, axis=axis), 1), newshape=list(shape))


def along_one_axis(node: OnnxNode, fn: Callable[[Expr, int], Expr]) -> Expr:
    """``fn`` of the node's input along its ``axis`` (default -1), as from opset 13."""
    data = node.input(0)
    return fn(data, _axis(node, node.attr("axis", -1), len(_shape(data))))


def _hardmax(data: Expr, axis: int) -> Expr:
    """1 at the first maximum along ``axis``, 0 elsewhere."""
    shape = _shape(data)
    axis %= len(shape)
    first = op.argmax(data, axis=[axis], keepdims=True)
    positions = op.reshape(index_range(shape[axis], "the positions along the axis"),
                           newshape=[-1] + [1] * (len(shape) - 1 - axis))
    return op.cast(op.equal(first, positions), dtype=_type(data).dtype)


_SOFTMAX_FAMILY: dict[str, Callable[[Expr, int], Expr]] = {
    "Softmax": lambda x, axis: op.nn.softmax(x, axis=axis),
    "LogSoftmax": lambda x, axis: op.nn.log_softmax(x, axis=axis),
    "Hardmax": _hardmax,
}


def _register_softmax(op_type: str, fn: Callable[[Expr, int], Expr]) -> None:
    converter(op_type)(lambda node: coerced_to_2d(node, fn))
    converter(op_type, since=13)(lambda node: along_one_axis(node, fn))


for _op_type, _fn in _SOFTMAX_FAMILY.items():
    _register_softmax(_op_type, _fn)


# ---------------------------------------------------------------------------------------------
# activations


def _negative_part(x: Expr, alpha: float, inner: float = 1.0) -> Expr:
    """alpha * (exp(x * inner) - 1) for x <= 0, without overflowing exp for large x."""
    return (op.exp(op.minimum(x, scalar(0, x)) * inner) - 1.0) * alpha


@converter("PRelu")
def prelu_1(node: OnnxNode) -> Expr:
    # Before opset 7 the slope was per channel: a 1-D slope of C values lies along axis 1.
    data, slope = node.input(0), node.input(1)
    xshape, sshape = _shape(data), _shape(slope)
    if len(sshape) == 1 and len(xshape) > 1 and sshape[0] == xshape[1] != 1:
        return op.nn.prelu(data, slope, axis=1)
    return prelu(node)


@converter("PRelu", since=7)
def prelu(node: OnnxNode) -> Expr:
    data, slope = node.input(0), node.input(1)
    xshape, sshape = _shape(data), _shape(slope)
    if len(sshape) > len(xshape):
        raise node.error(f"slope {sshape} must broadcast to data {xshape} (unidirectionally)")
    padded = (1,) * (len(xshape) - len(sshape)) + sshape
    if any(size not in (1, x) for size, x in zip(padded, xshape)):
        # Broadcasting both ways would change the output's shape; ONNX allows only the slope's.
        raise node.error(f"slope {sshape} must broadcast to data {xshape} (unidirectionally)")
    varying = [axis for axis, size in enumerate(padded) if size != 1]
    if is_float(_type(data).dtype):
        if not varying and isinstance(slope, Constant):
            return op.nn.leaky_relu(data, alpha=float(slope.data.reshape(-1)[0]))
        if len(varying) == 1 and padded[varying[0]] == xshape[varying[0]]:
            return op.nn.prelu(data, op.reshape(slope, newshape=[-1]), axis=varying[0])
    return op.where(op.greater(data, scalar(0, data)), data, data * slope)


@converter("Gelu", since=20)
def gelu(node: OnnxNode) -> Expr:
    approximate = node.attr("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise node.error(f"attribute approximate={approximate!r} must be 'none' or 'tanh'")
    return gelu_of(node.input(0), approximate)


@converter("HardSigmoid")
def hard_sigmoid(node: OnnxNode) -> Expr:
    x = node.input(0)
    return op.clip(x * node.attr("alpha", 0.2) + node.attr("beta", 0.5), a_min=0.0, a_max=1.0)


@converter("HardSwish", since=14)
def hard_swish(node: OnnxNode) -> Expr:
    x = node.input(0)
    return x * op.clip(x * (1 / 6) + 0.5, a_min=0.0, a_max=1.0)


@converter("Elu")
def elu(node: OnnxNode) -> Expr:
    x = node.input(0)
    return op.where(op.greater(x, scalar(0, x)), x, _negative_part(x, node.attr("alpha", 1.0)))


@converter("Selu")
def selu(node: OnnxNode) -> Expr:
    x = node.input(0)
    alpha = node.attr("alpha", 1.67326319217681884765625)
    gamma = node.attr("gamma", 1.05070102214813232421875)
    return op.where(op.greater(x, scalar(0, x)), x, _negative_part(x, alpha)) * gamma


@converter("Celu", since=12)
def celu(node: OnnxNode) -> Expr:
    x = node.input(0)
    alpha = node.attr("alpha", 1.0)
    if alpha == 0:
        raise node.error("attribute alpha must not be 0 (Celu divides by it)")
    # max(0, x) + min(0, alpha * (exp(x / alpha) - 1)); the second term is 0 for x > 0.
    return op.where(op.greater(x, scalar(0, x)), x, _negative_part(x, alpha, 1.0 / alpha))


def _softplus(x: Expr) -> Expr:
    # log(1 + exp(x)) = max(x, 0) + log(1 + exp(-|x|)): exp never overflows.
    return op.nn.relu(x) + op.log(op.exp(-op.abs(x)) + 1.0)


@converter("Softplus")
def softplus(node: OnnxNode) -> Expr:
    return _softplus(node.input(0))


@converter("Softsign")
def softsign(node: OnnxNode) -> Expr:
    x = node.input(0)
    return x / (op.abs(x) + 1.0)


@converter("ThresholdedRelu", since=10)
def thresholded_relu(node: OnnxNode) -> Expr:
    x = node.input(0)
    above = op.greater(x, scalar(node.attr("alpha", 1.0), x))
    return op.where(above, x, scalar(0, x))


@converter("Mish", since=18)
def mish(node: OnnxNode) -> Expr:
    x = node.input(0)
    return x * op.tanh(_softplus(x))


@converter("Shrink", since=9)
def shrink(node: OnnxNode) -> Expr:
    x = node.input(0)
    lambd, bias = node.attr("lambd", 0.5), node.attr("bias", 0.0)
    inner = op.where(op.greater(x, scalar(lambd, x)), x - bias, scalar(0, x))
    return op.where(op.less(x, scalar(-lambd, x)), x + bias, inner)


def _swish(x: Expr, alpha: float) -> Expr:
    return x * op.sigmoid(x * alpha if alpha != 1.0 else x)


@converter("Swish", since=24)
def swish(node: OnnxNode) -> Expr:
    return _swish(node.input(0), node.attr("alpha", 1.0))


@converter("SwiGLU", since=28)
def swiglu(node: OnnxNode) -> Expr:
    return _swish(node.input(0), node.attr("alpha", 1.0)) * node.input(1)
