"""Small helpers shared by the converter files: types of converted values, axes, casts."""

from __future__ import annotations

from ... import op
from ...ir.expr import Expr
from ...ir.types import TensorType
from ..onnx_registry import OnnxNode


def tensor_type(expr: Expr) -> TensorType:
    """The tensor type of a converted value (converters only ever see tensors here)."""
    ty = expr.checked_type
    assert isinstance(ty, TensorType), ty
    return ty


def shape_of(expr: Expr) -> tuple[int, ...]:
    return tensor_type(expr).shape


def checked_axis(node: OnnxNode, axis: int, ndim: int) -> int:
    """A possibly negative ``axis`` attribute as 0..ndim-1, or an error naming the node."""
    if not -ndim <= axis < ndim:
        raise node.error(f"attribute axis={axis} is out of range for an input of rank {ndim}")
    return axis % ndim


def cast_like(value: Expr, like: Expr) -> Expr:
    """``value`` in ``like``'s dtype: ONNX lets some operands (Pow's exponent, opset-15
    BatchNormalization's parameters) have another type than the data."""
    want = tensor_type(like).dtype
    return value if tensor_type(value).dtype == want else op.cast(value, dtype=want)
