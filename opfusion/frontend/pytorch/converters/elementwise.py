"""Converters of ATen's elementwise operators: arithmetic and comparisons (with ATen's type
promotion, which the trace has already decided), unary math, activations and ``where``."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from .... import op
from ....ir.expr import Expr
from ...common import gelu as gelu_of
from ..registry import AtenNode, converter
from ._common import as_dtype, number, operand, tensor_type

# ---------------------------------------------------------------------------------------------
# unary

_UNARY: dict[str, Callable[[Expr], Expr]] = {
    "relu": op.nn.relu, "sigmoid": op.sigmoid, "tanh": op.tanh, "exp": op.exp, "log": op.log,
    "sqrt": op.sqrt, "rsqrt": op.rsqrt, "abs": op.abs, "neg": op.negative, "erf": op.erf,
    "sin": op.sin, "cos": op.cos, "tan": op.tan, "asin": op.asin, "acos": op.acos,
    "atan": op.atan, "sinh": op.sinh, "cosh": op.cosh, "asinh": op.asinh, "acosh": op.acosh,
    "atanh": op.atanh, "floor": op.floor, "ceil": op.ceil, "round": op.round,
    "trunc": op.trunc, "sign": op.sign, "logical_not": op.logical_not,
    "bitwise_not": op.bitwise_not, "isnan": op.isnan, "isinf": op.isinf,
}


def _unary(fn: Callable[[Expr], Expr]) -> Callable[[AtenNode], Expr]:
    def convert(node: AtenNode) -> Expr:
        x = node.tensor("self")
        if fn is op.bitwise_not and tensor_type(x).dtype == "bool":
            return op.logical_not(x)
        if node.out_dtype is not None and node.out_dtype != "bool" \
                and fn not in (op.isnan, op.isinf):
            x = as_dtype(x, node.out_dtype)  # exp of an int tensor is a float in ATen
        return fn(x)
    return convert


for _name, _fn in _UNARY.items():
    converter(f"aten.{_name}.default")(_unary(_fn))


@converter("aten.reciprocal.default")
def reciprocal(node: AtenNode) -> Expr:
    x = as_dtype(node.tensor("self"), node.dtype)
    return number(1, node.dtype) / x


@converter("aten.log1p.default")
def log1p(node: AtenNode) -> Expr:
    return op.log(as_dtype(node.tensor("self"), node.dtype) + 1.0)


@converter("aten.expm1.default")
def expm1(node: AtenNode) -> Expr:
    return op.exp(as_dtype(node.tensor("self"), node.dtype)) - 1.0


@converter("aten.silu.default")
def silu(node: AtenNode) -> Expr:
    x = node.tensor("self")
    return x * op.sigmoid(x)


@converter("aten.mish.default")
def mish(node: AtenNode) -> Expr:
    x = node.tensor("self")
    softplus = op.log(op.exp(-op.abs(x)) + 1.0) + op.nn.relu(x)  # stable for large |x|
    return x * op.tanh(softplus)


@converter("aten.hardsigmoid.default")
def hardsigmoid(node: AtenNode) -> Expr:
    return op.clip(node.tensor("self") / 6.0 + 0.5, a_min=0.0, a_max=1.0)


@converter("aten.hardswish.default")
def hardswish(node: AtenNode) -> Expr:
    x = node.tensor("self")
    return x * op.clip(x / 6.0 + 0.5, a_min=0.0, a_max=1.0)


@converter("aten.gelu.default")
def gelu(node: AtenNode) -> Expr:
    approximate = node.get("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise node.error(f"approximate={approximate!r} must be 'none' or 'tanh'")
    return gelu_of(node.tensor("self"), approximate)


@converter("aten.leaky_relu.default")
def leaky_relu(node: AtenNode) -> Expr:
    return op.nn.leaky_relu(node.tensor("self"), alpha=float(node.get("negative_slope", 0.01)))


@converter("aten.elu.default")
def elu(node: AtenNode) -> Expr:
    x = node.tensor("self")
    alpha, scale = float(node.get("alpha", 1.0)), float(node.get("scale", 1.0))
    input_scale = float(node.get("input_scale", 1.0))
    negative = (op.exp(op.minimum(x, number(0, tensor_type(x).dtype)) * input_scale) - 1.0)
    return op.where(op.greater(x, number(0, tensor_type(x).dtype)), x * scale,
                    negative * (alpha * scale))


@converter("aten.hardtanh.default")
def hardtanh(node: AtenNode) -> Expr:
    return op.clip(node.tensor("self"), a_min=float(node.get("min_val", -1.0)),
                   a_max=float(node.get("max_val", 1.0)))


@converter("aten.clamp.default")
def clamp(node: AtenNode) -> Expr:
    x = as_dtype(node.tensor("self"), node.dtype)
    low, high = node.values.get("min"), node.values.get("max")
    if tensor_type(x).dtype.startswith("float") and low is not None and high is not None:
        return op.clip(x, a_min=float(low), a_max=float(high))
    if low is not None:
        x = op.maximum(x, number(low, node.dtype))
    if high is not None:
        x = op.minimum(x, number(high, node.dtype))
    return x


@converter("aten.clamp.Tensor")
def clamp_tensor(node: AtenNode) -> Expr:
    x = as_dtype(node.tensor("self"), node.dtype)
    if node.values.get("min") is not None:
        x = op.maximum(x, operand(node, "min", node.dtype))
    if node.values.get("max") is not None:
        x = op.minimum(x, operand(node, "max", node.dtype))
    return x


@converter("aten._prelu_kernel.default")
def prelu(node: AtenNode) -> Expr:
    x, weight = node.tensor("self"), node.tensor("weight")
    return op.where(op.greater(x, number(0, tensor_type(x).dtype)), x, x * weight)


# ---------------------------------------------------------------------------------------------
# binary arithmetic


def _scaled(node: AtenNode, name: str) -> Expr:
    """``other * alpha`` of add and sub."""
    other = operand(node, name, node.dtype)
    alpha = node.get("alpha", 1)
    return other if alpha == 1 else other * number(alpha, node.dtype)


@converter("aten.add.Tensor", "aten.add.Scalar")
def add(node: AtenNode) -> Expr:
    return operand(node, "self", node.dtype) + _scaled(node, "other")


@converter("aten.sub.Tensor", "aten.sub.Scalar")
def sub(node: AtenNode) -> Expr:
    return operand(node, "self", node.dtype) - _scaled(node, "other")


@converter("aten.rsub.Scalar", "aten.rsub.Tensor")
def rsub(node: AtenNode) -> Expr:
    return _scaled(node, "other") - operand(node, "self", node.dtype)


@converter("aten.mul.Tensor", "aten.mul.Scalar")
def mul(node: AtenNode) -> Expr:
    return operand(node, "self", node.dtype) * operand(node, "other", node.dtype)


@converter("aten.div.Tensor", "aten.div.Scalar")
def div(node: AtenNode) -> Expr:
    return operand(node, "self", node.dtype) / operand(node, "other", node.dtype)


@converter("aten.div.Tensor_mode", "aten.div.Scalar_mode")
def div_mode(node: AtenNode) -> Expr:
    x, y = operand(node, "self", node.dtype), operand(node, "other", node.dtype)
    mode = node.get("rounding_mode")
    if mode is None:
        return x / y
    if mode == "floor":
        return op.floor_divide(x, y) if not node.dtype.startswith("float") \
            else op.floor(x / y)
    if mode == "trunc":
        return op.trunc(x / y) if node.dtype.startswith("float") \
            else _trunc_divide(x, y, node.dtype)
    raise node.error(f"rounding_mode={mode!r} must be None, 'trunc' or 'floor'")


def _trunc_divide(x: Expr, y: Expr, dtype: str) -> Expr:
    """Integer division rounded toward zero: floor division, plus one where the signs differ
    and the division is not exact."""
    zero = number(0, dtype)
    quotient = op.floor_divide(x, y)
    inexact = op.logical_and(op.not_equal(op.mod(x, y), zero),
                             op.not_equal(op.less(x, zero), op.less(y, zero)))
    return op.where(inexact, quotient + number(1, dtype), quotient)


@converter("aten.floor_divide.default", "aten.floor_divide.Scalar")
def floor_divide(node: AtenNode) -> Expr:
    x, y = operand(node, "self", node.dtype), operand(node, "other", node.dtype)
    return op.floor(x / y) if node.dtype.startswith("float") else op.floor_divide(x, y)


@converter("aten.remainder.Tensor", "aten.remainder.Scalar")
def remainder(node: AtenNode) -> Expr:
    return op.mod(operand(node, "self", node.dtype), operand(node, "other", node.dtype))


@converter("aten.fmod.Tensor", "aten.fmod.Scalar")
def fmod(node: AtenNode) -> Expr:
    """C's fmod (the dividend's sign) from the divisor-signed mod."""
    x, y = operand(node, "self", node.dtype), operand(node, "other", node.dtype)
    r = op.mod(x, y)
    zero = number(0, node.dtype)
    wrong_sign = op.logical_and(op.not_equal(r, zero),
                                op.not_equal(op.less(r, zero), op.less(x, zero)))
    return op.where(wrong_sign, r - y, r)


@converter("aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor", "aten.pow.Scalar")
def power(node: AtenNode) -> Expr:
    base = operand(node, "self", node.dtype)
    exponent = node.values.get("exponent")
    if exponent == 2:
        return base * base
    if exponent == 0.5 and node.dtype.startswith("float"):
        return op.sqrt(base)
    return op.power(base, operand(node, "exponent", node.dtype))


@converter("aten.maximum.default")
def maximum(node: AtenNode) -> Expr:
    return op.maximum(operand(node, "self", node.dtype), operand(node, "other", node.dtype))


@converter("aten.minimum.default")
def minimum(node: AtenNode) -> Expr:
    return op.minimum(operand(node, "self", node.dtype), operand(node, "other", node.dtype))


@converter("aten.atan2.default")
def atan2(node: AtenNode) -> Expr:
    y, x = operand(node, "self", node.dtype), operand(node, "other", node.dtype)
    zero = number(0, node.dtype)
    quadrant = op.where(op.greater_equal(y, zero), number(math.pi, node.dtype),
                        number(-math.pi, node.dtype))
    base = op.atan(y / x)
    return op.where(op.greater(x, zero), base,
                    op.where(op.less(x, zero), base + quadrant, op.sign(y) * (math.pi / 2)))


# ---------------------------------------------------------------------------------------------
# comparisons and logic: the operands meet in their promoted dtype, the result is bool

_COMPARISONS = {"eq": op.equal, "ne": op.not_equal, "lt": op.less, "le": op.less_equal,
                "gt": op.greater, "ge": op.greater_equal}
_LOGICAL = {"logical_and": op.logical_and, "logical_or": op.logical_or,
            "logical_xor": op.logical_xor}
_BITWISE = {"bitwise_and": op.bitwise_and, "bitwise_or": op.bitwise_or,
            "bitwise_xor": op.bitwise_xor}


def _promoted(node: AtenNode) -> tuple[Expr, Expr]:
    """The two operands of a comparison in one dtype: the tensor's for a Python number (a
    float number against an integer tensor: float32), the wider of two tensors'."""
    x = node.tensor("self")
    other = node.values.get("other")
    x_dtype = tensor_type(x).dtype
    if isinstance(other, Expr):
        o_dtype = tensor_type(other).dtype
        want = _wider(x_dtype, o_dtype)
        return as_dtype(x, want), as_dtype(other, want)
    if isinstance(other, float) and not x_dtype.startswith("float"):
        return as_dtype(x, "float32"), number(other, "float32")
    return x, number(other, x_dtype)


def _wider(a: str, b: str) -> str:
    if a == b:
        return a
    if a.startswith("float") != b.startswith("float"):
        return a if a.startswith("float") else b
    return str(np.promote_types(a, b))


def _comparison(fn: Callable[[Expr, Expr], Expr]) -> Callable[[AtenNode], Expr]:
    def convert(node: AtenNode) -> Expr:
        return fn(*_promoted(node))
    return convert


for _name, _fn in _COMPARISONS.items():
    converter(f"aten.{_name}.Tensor", f"aten.{_name}.Scalar")(_comparison(_fn))


def _logical(fn: Callable[[Expr, Expr], Expr]) -> Callable[[AtenNode], Expr]:
    def convert(node: AtenNode) -> Expr:
        return fn(as_dtype(node.tensor("self"), "bool"), as_dtype(node.tensor("other"), "bool"))
    return convert


for _name, _fn in _LOGICAL.items():
    converter(f"aten.{_name}.default")(_logical(_fn))


def _bitwise(fn: Callable[[Expr, Expr], Expr], logical: Callable[[Expr, Expr], Expr]
             ) -> Callable[[AtenNode], Expr]:
    def convert(node: AtenNode) -> Expr:
        both = operand(node, "self", node.dtype), operand(node, "other", node.dtype)
        return logical(*both) if node.dtype == "bool" else fn(*both)  # & | ^ of masks
    return convert


for (_name, _fn), _logical_fn in zip(_BITWISE.items(), _LOGICAL.values()):
    converter(f"aten.{_name}.Tensor", f"aten.{_name}.Scalar")(_bitwise(_fn, _logical_fn))


@converter("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther",
           "aten.where.Scalar")
def where(node: AtenNode) -> Expr:
    condition = as_dtype(node.tensor("condition"), "bool")
    return op.where(condition, operand(node, "self", node.dtype),
                    operand(node, "other", node.dtype))


@converter("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def masked_fill(node: AtenNode) -> Expr:
    x = node.tensor("self")
    return op.where(as_dtype(node.tensor("mask"), "bool"), operand(node, "value", node.dtype),
                    as_dtype(x, node.dtype))
