"""Reductions along axes: sum, mean, max, min, prod, argmax, argmin, variance. All kCommReduce.

The axis conventions are TVM's: ``axis=None`` reduces every axis, ``axis=()`` reduces none,
``exclude=True`` reduces the axes *not* named, ``keepdims`` keeps reduced axes as size 1.
References accumulate in float64 (floats) or int64 (ints); the interpreter casts the result
back, so integer sums wrap as the input dtype would."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..ir.op import Attr, Attrs, Op, OpPatternKind, register_op
from ..ir.types import TensorType, Type, is_float
from ._common import reduce_axes, reduced_shape, shape_size

_AXIS_ATTRS = {
    "axis": Attr("ints", optional=True, doc="axes to reduce; None reduces every axis"),
    "keepdims": Attr("bool", False, doc="keep reduced axes as size 1"),
    "exclude": Attr("bool", False, doc="reduce the axes not named in 'axis'"),
}


def _widen(data: np.ndarray) -> np.ndarray:
    """The accumulation type of the references: float64 for floats, int64 for ints."""
    if data.dtype.kind == "f":
        return data.astype(np.float64)
    if data.dtype.kind in "iu":
        return data.astype(np.int64)
    return data


class ReduceOp(Op):
    """One tensor in; ``axis``/``keepdims``/``exclude`` choose the reduced axes. ``float_only``
    ops (mean, variance) reject integers; ``needs_elements`` ops (max, min) have no identity,
    so reducing zero elements is an error."""

    inputs = ("data",)
    pattern = OpPatternKind.kCommReduce
    attrs = _AXIS_ATTRS
    float_only: bool = False
    needs_elements: bool = False

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        (data,) = self.expect_tensors(arg_types)
        if data.dtype == "bool":
            raise self.type_error("input 'data' is bool; cast it to a number first")
        if self.float_only and not is_float(data.dtype):
            raise self.type_error(f"input 'data' must be floating point, got {data.dtype}; "
                                  "cast it first")
        axes = reduce_axes(self, attrs.axis, data.ndim, attrs.exclude)
        if self.needs_elements:
            _check_not_empty(self, data, axes, attrs.axis)
        return TensorType(reduced_shape(data.shape, axes, attrs.keepdims), data.dtype)

    def axes_of(self, data: np.ndarray, axis: Sequence[int] | None, exclude: bool) -> tuple:
        return reduce_axes(self, axis, data.ndim, exclude)


def _check_not_empty(op: Op, data: TensorType, axes: Sequence[int], axis: Any) -> None:
    if shape_size([data.shape[a] for a in axes]) == 0:
        raise op.type_error(f"attribute 'axis'={axis} reduces zero elements of data "
                            f"{data.shape}, and the {op.name} of nothing is undefined; "
                            "reduce only non-empty axes")


# name, NumPy reduction (over a widened array), float_only, needs_elements, doc
_TABLE: list[tuple[str, Callable[..., Any], bool, bool, str]] = [
    ("sum", np.sum, False, False, "Sum over the reduced axes (0 for none)."),
    ("prod", np.prod, False, False, "Product over the reduced axes (1 for none)."),
    ("max", np.max, False, True, "Largest element over the reduced axes."),
    ("min", np.min, False, True, "Smallest element over the reduced axes."),
]


def _declare_reduce(name: str, fn: Callable[..., Any], float_only: bool, needs_elements: bool,
                    doc: str) -> None:
    def reference(self: ReduceOp, data: np.ndarray, axis: Any, keepdims: bool,
                  exclude: bool) -> np.ndarray:
        return fn(_widen(data), axis=self.axes_of(data, axis, exclude), keepdims=keepdims)

    cls = type(f"Op_{name}", (ReduceOp,), {
        "name": name, "float_only": float_only, "needs_elements": needs_elements, "doc": doc,
        "reference": reference,
    })
    register_op(cls)


for _name, _fn, _float_only, _needs_elements, _doc in _TABLE:
    _declare_reduce(_name, _fn, _float_only, _needs_elements, _doc)


@register_op
class Mean(ReduceOp):
    name = "mean"
    doc = "Arithmetic mean over the reduced axes (NaN for none); floating point only."
    float_only = True

    def reference(self, data: np.ndarray, axis: Any, keepdims: bool,
                  exclude: bool) -> np.ndarray:
        axes = self.axes_of(data, axis, exclude)
        count = shape_size([data.shape[a] for a in axes])
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.sum(_widen(data), axis=axes, keepdims=keepdims) / count


@register_op
class Variance(ReduceOp):
    name = "variance"
    doc = "Variance over the reduced axes; ``unbiased`` divides by n - 1 instead of n."
    float_only = True
    attrs = {**_AXIS_ATTRS, "unbiased": Attr("bool", False, doc="divide by n - 1")}

    def reference(self, data: np.ndarray, axis: Any, keepdims: bool, exclude: bool,
                  unbiased: bool) -> np.ndarray:
        axes = self.axes_of(data, axis, exclude)
        count = shape_size([data.shape[a] for a in axes])
        wide = _widen(data)
        # Two passes (mean, then squared deviations) rather than E[x^2] - E[x]^2, which
        # cancels catastrophically when the mean is large against the spread.
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.sum(wide, axis=axes, keepdims=True) / count
            squares = np.sum((wide - mean) ** 2, axis=axes, keepdims=keepdims)
            return squares / (count - 1 if unbiased else count)


class ArgReduceOp(Op):
    """argmax / argmin: the int64 index of the extreme element along one axis, or into the
    flattened tensor for ``axis=None``. Ties go to the first index, or the last with
    ``select_last_index`` (ONNX ArgMax)."""

    inputs = ("data",)
    pattern = OpPatternKind.kCommReduce
    attrs = {
        "axis": Attr("ints", optional=True,
                     doc="the one axis to reduce; None indexes the flattened tensor"),
        "keepdims": Attr("bool", False, doc="keep the reduced axis as size 1"),
        "select_last_index": Attr("bool", False, doc="on ties, take the last index"),
    }
    find: Callable[..., np.ndarray] = staticmethod(np.argmax)

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        (data,) = self.expect_tensors(arg_types)
        if data.dtype == "bool":
            raise self.type_error("input 'data' is bool; cast it to a number first")
        if attrs.axis is not None and len(attrs.axis) != 1:
            raise self.type_error(f"attribute 'axis'={attrs.axis} must name exactly one axis "
                                  "(or be None to index the flattened tensor)")
        axes = reduce_axes(self, attrs.axis, data.ndim)
        _check_not_empty(self, data, axes, attrs.axis)
        return TensorType(reduced_shape(data.shape, axes, attrs.keepdims), "int64")

    def reference(self, data: np.ndarray, axis: Any, keepdims: bool,
                  select_last_index: bool) -> np.ndarray:
        find = type(self).find
        if axis is None:
            flat = data.reshape(-1)
            index = (flat.size - 1 - find(flat[::-1])) if select_last_index else find(flat)
            shape = (1,) * data.ndim if keepdims else ()
            return np.asarray(index, dtype=np.int64).reshape(shape)
        (axis,) = reduce_axes(self, axis, data.ndim)
        if select_last_index:
            index = data.shape[axis] - 1 - find(np.flip(data, axis), axis=axis, keepdims=keepdims)
        else:
            index = find(data, axis=axis, keepdims=keepdims)
        return index.astype(np.int64)


@register_op
class ArgMax(ArgReduceOp):
    name = "argmax"
    doc = "Index (int64) of the largest element along one axis; first index on ties."
    find = staticmethod(np.argmax)


@register_op
class ArgMin(ArgReduceOp):
    name = "argmin"
    doc = "Index (int64) of the smallest element along one axis; first index on ties."
    find = staticmethod(np.argmin)
