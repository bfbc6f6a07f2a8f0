"""Small helpers shared by the converter files: axes and casts, and (from
:mod:`opfusion.frontend.common`) the types of converted values and constants the size of a
tensor of the model."""

from __future__ import annotations

from .... import op
from ....ir.expr import Expr
from ...common import filled, index_range, shape_of, tensor_type
from ..registry import OnnxNode

__all__ = ["cast_like", "checked_axis", "filled", "index_range", "shape_of", "tensor_type"]


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
