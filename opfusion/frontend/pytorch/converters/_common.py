"""Helpers the ATen converters share: dtypes of operands, dims, and Python numbers as
tensors of the right dtype."""

from __future__ import annotations

from typing import Any

import numpy as np

from .... import op
from ....ir.expr import Constant, Expr
from ...common import filled, index_range, shape_of, tensor_type
from ..registry import AtenNode

__all__ = ["as_dtype", "dim", "dims", "filled", "index_range", "number", "operand",
           "shape_of", "tensor_type"]


def as_dtype(value: Expr, dtype: str) -> Expr:
    """``value`` cast to ``dtype`` (unchanged when it has it)."""
    return value if tensor_type(value).dtype == dtype else op.cast(value, dtype=dtype)


def number(value: Any, dtype: str) -> Constant:
    """A Python number as a scalar constant of ``dtype``."""
    return Constant(np.asarray(value, dtype=dtype))


def operand(node: AtenNode, name: str, dtype: str) -> Expr:
    """Argument ``name`` (a tensor or a Python number) as a tensor of ``dtype``: ATen's type
    promotion has already decided the node's dtype, which the trace recorded."""
    value = node.values.get(name)
    if isinstance(value, Expr):
        return as_dtype(value, dtype)
    if isinstance(value, (bool, int, float)):
        return number(value, dtype)
    raise node.error(f"argument {name!r} must be a tensor or a number, got {value!r}")


def dim(node: AtenNode, value: int, ndim: int, what: str = "dim") -> int:
    """A possibly negative dim of a rank-``ndim`` tensor as 0..ndim-1 (a scalar's dim 0 or
    -1 as 0, as torch allows)."""
    rank = max(ndim, 1)
    if not -rank <= value < rank:
        raise node.error(f"{what}={value} is out of range for a tensor of rank {ndim}")
    return value % rank


def dims(node: AtenNode, values: Any, ndim: int) -> list[int]:
    """A dim list (None or empty: every dim) as sorted 0..ndim-1 dims."""
    if values is None or (isinstance(values, (list, tuple)) and not values):
        return list(range(ndim))
    values = values if isinstance(values, (list, tuple)) else [values]
    return sorted({dim(node, int(v), ndim) for v in values})
