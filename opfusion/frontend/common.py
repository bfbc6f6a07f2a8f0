"""Helpers every frontend's converters share: the types of converted values, and constants
the size of a tensor of the model (:func:`filled`, :func:`index_range`), which must not be
materialised when that tensor is huge."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import op
from ..compiler.limits import import_constant_fits
from ..ir.expr import Constant, Expr
from ..ir.types import TensorType


def tensor_type(expr: Expr) -> TensorType:
    """The tensor type of a converted value (converters only ever see tensors here)."""
    ty = expr.checked_type
    assert isinstance(ty, TensorType), ty
    return ty


def shape_of(expr: Expr) -> tuple[int, ...]:
    return tensor_type(expr).shape


def filled(shape: Sequence[int], value: Any, dtype: str, what: str = "a constant") -> Expr:
    """A ``dtype`` tensor of ``shape`` holding ``value`` everywhere: a constant when it is
    small enough to fold (``FoldConstant.max_elements``), else a broadcast of the scalar,
    which compiles to a kernel under the compile limits; never a NumPy array larger than
    that. ResourceLimitError naming ``what`` (the importer adds the node) if the tensor would
    take more than ``compile.max_allocation_bytes``."""
    shape = [int(dim) for dim in shape]
    if import_constant_fits(f"{what} of shape {shape} and dtype {dtype}", shape, dtype):
        return Constant(np.full(shape, value, dtype=dtype))
    return op.broadcast_to(Constant(np.asarray(value, dtype=dtype)), shape=shape)


def index_range(count: int, what: str = "an index range") -> Expr:
    """The int64 vector 0, 1, ..., ``count`` - 1: a constant when it is small enough to fold,
    else the ``arange`` operator (exact: a count that large is far below 2**53), as
    :func:`filled`."""
    if import_constant_fits(f"{what} of {count} elements", [count], "int64"):
        return Constant(np.arange(count, dtype=np.int64))
    return op.arange(stop=float(count), dtype="int64")


def gelu(x: Expr, approximate: str = "none") -> Expr:
    """GELU of ``x``: exact (``"none"``, with erf) or the tanh approximation (``"tanh"``), as
    ONNX's Gelu and torch's ``gelu(approximate=...)`` define them. Any other ``approximate``
    is a ValueError for the caller to name its node in."""
    if approximate == "none":
        return x * 0.5 * (op.erf(x * (1 / math.sqrt(2))) + 1.0)
    if approximate == "tanh":
        inner = (x + x * x * x * 0.044715) * math.sqrt(2 / math.pi)
        return x * 0.5 * (op.tanh(inner) + 1.0)
    raise ValueError(f"approximate={approximate!r} must be 'none' or 'tanh'")
