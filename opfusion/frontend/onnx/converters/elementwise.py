"""Converters of ONNX's elementwise and broadcasting operators.

Most map one-to-one onto an opfusion operator and are registered from a table; the rest
(variadic Min/Max/Sum/Mean, activations with parameters, Cast) are small functions."""

from __future__ import annotations

import functools

import numpy as np

from .... import op
from ....ir.expr import Constant, Expr
from ....ir.types import TensorType
from ..registry import OnnxNode, converter
from ..tensors import onnx_dtype

_UNARY = {
    "Neg": op.negative, "Abs": op.abs, "Exp": op.exp, "Log": op.log, "Sqrt": op.sqrt,
    "Sigmoid": op.sigmoid, "Tanh": op.tanh, "Erf": op.erf, "Floor": op.floor, "Ceil": op.ceil,
    "Round": op.round, "Sign": op.sign, "Sin": op.sin, "Cos": op.cos, "Relu": op.nn.relu,
    "Not": op.logical_not, "IsNaN": op.isnan, "Identity": op.copy, "Tan": op.tan,
    "Asin": op.asin, "Acos": op.acos, "Atan": op.atan, "Sinh": op.sinh, "Cosh": op.cosh,
    "Asinh": op.asinh, "Acosh": op.acosh, "Atanh": op.atanh, "BitwiseNot": op.bitwise_not,
}
_BINARY = {
    "Add": op.add, "Sub": op.subtract, "Mul": op.multiply, "Div": op.divide,
    "Equal": op.equal, "Less": op.less, "LessOrEqual": op.less_equal, "Greater": op.greater,
    "GreaterOrEqual": op.greater_equal, "And": op.logical_and, "Or": op.logical_or,
    "Xor": op.logical_xor, "BitwiseAnd": op.bitwise_and, "BitwiseOr": op.bitwise_or,
    "BitwiseXor": op.bitwise_xor,
}


def _register_unary(op_type: str, builder) -> None:
    converter(op_type)(lambda node: builder(node.input(0)))


def _register_binary(op_type: str, builder) -> None:
    converter(op_type)(lambda node: builder(*_same_type_inputs(node)))


def _same_type_inputs(node: OnnxNode) -> tuple[Expr, Expr]:
    """The two inputs of a binary operator whose ONNX signature gives both one type T. A
    model that mixes types is invalid (ONNX's checker and ONNX Runtime refuse it); it is not
    converted silently, which would pick one of the two meanings."""
    a, b = node.input(0), node.input(1)
    a_dtype, b_dtype = _dtype(a), _dtype(b)
    if a_dtype != b_dtype:
        raise node.error(f"inputs A ({a_dtype}) and B ({b_dtype}) differ in element type; "
                         f"{node.op_type} takes two inputs of one type: insert a Cast")
    return a, b


def _dtype(value: Expr) -> str:
    ty = value.checked_type
    assert isinstance(ty, TensorType)
    return ty.dtype


for _op_type, _builder in _UNARY.items():
    _register_unary(_op_type, _builder)
for _op_type, _builder in _BINARY.items():
    _register_binary(_op_type, _builder)



def scalar(value: float, like: Expr) -> Constant:
    """A 0-d constant of ``like``'s dtype."""
    ty = like.checked_type
    assert isinstance(ty, TensorType)
    return Constant(np.asarray(value, dtype=ty.dtype))


@converter("BitShift", since=11)
def bit_shift(node: OnnxNode) -> Expr:
    shift = op.left_shift if node.attr("direction") == "LEFT" else op.right_shift
    return shift(*_same_type_inputs(node))


@converter("Pow")
def power(node: OnnxNode) -> Expr:
    # Opset 12 on, the exponent may have another numeric type than the base; the result has
    # the base's. An integer base with a float exponent is the real power truncated (ONNX
    # Runtime's static_cast of std::pow; opfusion's cast saturates where that is undefined);
    # integers of two widths multiply in int64 and wrap to the base's dtype.
    base, exponent = node.input(0), node.input(1)
    base_dtype, exp_dtype = _dtype(base), _dtype(exponent)
    if base_dtype == exp_dtype:
        return op.power(base, exponent)
    if node.opset < 12:
        raise node.error(f"inputs X ({base_dtype}) and Y ({exp_dtype}) differ in element "
                         "type; before opset 12 Pow takes two inputs of one type: insert a "
                         "Cast")
    if base_dtype.startswith("float"):
        return op.power(base, op.cast(exponent, dtype=base_dtype))
    wide = "float64" if exp_dtype.startswith("float") else "int64"
    result = op.power(op.cast(base, dtype=wide), op.cast(exponent, dtype=wide))
    return op.cast(result, dtype=base_dtype)


@converter("Reciprocal")
def reciprocal(node: OnnxNode) -> Expr:
    x = node.input(0)
    return op.divide(scalar(1.0, x), x)


@converter("IsInf", since=10)
def isinf(node: OnnxNode) -> Expr:
    x = node.input(0)
    detect_pos, detect_neg = node.attr("detect_positive", 1), node.attr("detect_negative", 1)
    if detect_pos and detect_neg:
        return op.isinf(x)
    if not detect_pos and not detect_neg:
        return op.logical_and(op.isinf(x), op.isnan(x))  # always false, keeps the shape
    sign = op.greater(x, scalar(0, x)) if detect_pos else op.less(x, scalar(0, x))
    return op.logical_and(op.isinf(x), sign)


def _variadic(builder, node: OnnxNode) -> Expr:
    return functools.reduce(builder, [node.input(i) for i in range(len(node.inputs))])


@converter("Max")
def maximum(node: OnnxNode) -> Expr:
    return _variadic(op.maximum, node)


@converter("Min")
def minimum(node: OnnxNode) -> Expr:
    return _variadic(op.minimum, node)


@converter("Sum")
def total(node: OnnxNode) -> Expr:
    return _variadic(op.add, node)


@converter("Mean")
def mean(node: OnnxNode) -> Expr:
    summed = _variadic(op.add, node)
    return op.divide(summed, scalar(len(node.inputs), summed))


@converter("Mod", since=10)
def mod(node: OnnxNode) -> Expr:
    a, b = node.input(0), node.input(1)
    if node.attr("fmod", 0):
        # fmod takes the dividend's sign: a - b * trunc(a / b).
        quotient = op.divide(a, b)
        if a.checked_type.dtype.startswith("float"):  # type: ignore[attr-defined]
            return op.subtract(a, op.multiply(b, op.trunc(quotient)))
        # Integers: a remainder by zero is 0, as op.mod's (ONNX Runtime raises; see
        # opfusion/opdefs/broadcast.py for why opfusion defines it instead).
        rest = op.subtract(a, op.multiply(b, quotient))
        return op.where(op.equal(b, scalar(0, b)), scalar(0, a), rest)
    return op.mod(a, b)


@converter("Where", since=9)
def where(node: OnnxNode) -> Expr:
    return op.where(node.input(0), node.input(1), node.input(2))


@converter("Cast")
def cast(node: OnnxNode) -> Expr:
    from onnx import TensorProto

    to = node.attr("to")
    if to is None:
        raise node.error("attribute 'to' is required")
    if isinstance(to, str):  # opset 1 spelled the type as ONNX's name of it ("FLOAT")
        names = TensorProto.DataType.keys()
        if to.upper() not in names:
            raise node.error(f"attribute 'to' is {to!r}, not an ONNX element type name "
                             f"({', '.join(names)})")
        to = TensorProto.DataType.Value(to.upper())
    dtype = onnx_dtype(to, f"{node.op_type} (node {node.name!r}, opset {node.opset}): the "
                           "target of attribute 'to'")
    return op.cast(node.input(0), dtype=dtype)


@converter("CastLike", since=15)
def cast_like(node: OnnxNode) -> Expr:
    return op.cast(node.input(0), dtype=node.input(1).checked_type.dtype)  # type: ignore[attr-defined]


@converter("LeakyRelu")
def leaky_relu(node: OnnxNode) -> Expr:
    return op.nn.leaky_relu(node.input(0), alpha=node.attr("alpha", 0.01))


@converter("Clip")
def clip_1(node: OnnxNode) -> Expr:
    return op.clip(node.input(0), a_min=node.attr("min", -3.4028234663852886e38),
                   a_max=node.attr("max", 3.4028234663852886e38))


@converter("Clip", since=11)
def clip_11(node: OnnxNode) -> Expr:
    x = node.input(0)
    low, high = node.optional_input(1), node.optional_input(2)
    for name, bound in (("min", low), ("max", high)):
        _check_clip_bound(node, name, bound, _dtype(x))
    if all(bound is None or isinstance(bound, Constant) for bound in (low, high)):
        # Constant bounds (the usual case, e.g. ReLU6) make one elementwise clip.
        info = np.finfo(np.float64)
        return op.clip(x, a_min=info.min if low is None else float(low.data),
                       a_max=info.max if high is None else float(high.data))
    if low is not None:
        x = op.maximum(x, low)
    if high is not None:
        x = op.minimum(x, high)
    return x


def _check_clip_bound(node: OnnxNode, name: str, bound: Expr | None, dtype: str) -> None:
    """Clip's ``min`` and ``max`` are scalars of the input's type T (ONNX's signature; its
    checker and ONNX Runtime refuse others): anything else is refused here, naming it."""
    if bound is None:
        return
    ty = bound.checked_type
    assert isinstance(ty, TensorType)
    if ty.dtype != dtype:
        raise node.error(f"input '{name}' is {ty.dtype}, not the input's {dtype}: Clip's "
                         f"bounds are of the input's type; insert a Cast")
    if any(int(d) != 1 for d in ty.shape):
        raise node.error(f"input '{name}' has shape {list(ty.shape)}; Clip's bounds are "
                         f"scalars")
