"""Ops that run along a whole axis: sort, argsort, topk, and the cumsum scan. All kOpaque.

Orders are stable: equal elements keep their index order in both directions, so topk breaks
ties by the lower index as ONNX TopK does. NaNs sort last ascending, first descending."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..ir.op import Attr, Attrs, Op, OpPatternKind, register_op
from ..ir.types import TensorType, TupleType, Type, is_int
from ._common import normalize_axis


def stable_argsort(data: np.ndarray, axis: int, ascending: bool) -> np.ndarray:
    """Stable sorting indices along ``axis``; descending keeps equal elements in index order.

    Descending is ascending on the reversed axis, read backwards: reversing twice keeps the
    order of ties, and unlike sorting ``-data`` it works for unsigned ints and int minima."""
    if ascending:
        return np.argsort(data, axis=axis, kind="stable")
    length = data.shape[axis]
    order = np.argsort(np.flip(data, axis), axis=axis, kind="stable")
    return length - 1 - np.flip(order, axis)


class AxisOp(Op):
    """One tensor along one axis."""

    inputs = ("data",)
    pattern = OpPatternKind.kOpaque

    def check(self, arg_types: Sequence[Type], axis: int) -> tuple[TensorType, int]:
        (data,) = self.expect_tensors(arg_types)
        return data, normalize_axis(self, axis, data.ndim)


def _index_dtype(op: Op, dtype: str) -> None:
    if not is_int(dtype):
        raise op.type_error(f"attribute 'dtype'={dtype} must be an integer type for indices; "
                            "use int64 or int32")


@register_op
class Sort(AxisOp):
    name = "sort"
    doc = "The values sorted along ``axis``."
    attrs = {
        "axis": Attr("int", -1, doc="the axis to sort"),
        "is_ascend": Attr("bool", True, doc="ascending (True) or descending order"),
    }

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        data, _ = self.check(arg_types, attrs.axis)
        return data

    def reference(self, data: np.ndarray, axis: int, is_ascend: bool) -> np.ndarray:
        order = stable_argsort(data, axis % data.ndim, is_ascend)
        return np.take_along_axis(data, order, axis=axis)


@register_op
class ArgSort(AxisOp):
    name = "argsort"
    doc = "The indices that sort ``data`` along ``axis`` (stable)."
    attrs = {
        "axis": Attr("int", -1, doc="the axis to sort"),
        "is_ascend": Attr("bool", True, doc="ascending (True) or descending order"),
        "dtype": Attr("dtype", "int64", doc="the index dtype"),
    }

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        data, _ = self.check(arg_types, attrs.axis)
        _index_dtype(self, attrs.dtype)
        return TensorType(data.shape, attrs.dtype)

    def reference(self, data: np.ndarray, axis: int, is_ascend: bool, dtype: str) -> np.ndarray:
        return stable_argsort(data, axis % data.ndim, is_ascend)


@register_op
class TopK(AxisOp):
    name = "topk"
    doc = ("The k largest (or smallest) values along ``axis`` and their indices, ties to the "
           "lower index (ONNX TopK).")
    attrs = {
        "k": Attr("int", 1, doc="how many elements to keep, 1..size of the axis"),
        "axis": Attr("int", -1, doc="the axis to search"),
        "ret_type": Attr("str", "both", choices=("both", "values", "indices"),
                         doc="return (values, indices), or only one of them"),
        "is_ascend": Attr("bool", False, doc="False: the k largest; True: the k smallest"),
        "dtype": Attr("dtype", "int64", doc="the index dtype"),
    }

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        data, axis = self.check(arg_types, attrs.axis)
        _index_dtype(self, attrs.dtype)
        size = data.shape[axis]
        if not 1 <= attrs.k <= size:
            raise self.type_error(f"attribute 'k'={attrs.k} must be in 1..{size}, the size of "
                                  f"axis {axis} of data {data.shape}")
        shape = data.shape[:axis] + (attrs.k,) + data.shape[axis + 1:]
        values, indices = TensorType(shape, data.dtype), TensorType(shape, attrs.dtype)
        if attrs.ret_type == "values":
            return values
        if attrs.ret_type == "indices":
            return indices
        return TupleType([values, indices])

    def reference(self, data: np.ndarray, k: int, axis: int, ret_type: str, is_ascend: bool,
                  dtype: str) -> Any:
        axis %= data.ndim
        order = stable_argsort(data, axis, is_ascend)
        indices = np.take(order, np.arange(k), axis=axis)
        values = np.take_along_axis(data, indices, axis=axis)
        if ret_type == "values":
            return values
        if ret_type == "indices":
            return indices
        return values, indices


@register_op
class CumSum(Op):
    name = "cumsum"
    doc = ("Running sums along ``axis`` (the flattened tensor for None); ``exclusive`` leaves "
           "each element out of its own sum, ``reverse`` runs from the end (ONNX CumSum).")
    inputs = ("data",)
    pattern = OpPatternKind.kOpaque
    attrs = {
        "axis": Attr("int", optional=True, doc="the axis to scan; None scans the flat tensor"),
        "dtype": Attr("dtype", optional=True, doc="the result dtype (default: the input's)"),
        "exclusive": Attr("bool", False, doc="sum only the elements before each one"),
        "reverse": Attr("bool", False, doc="scan from the last element to the first"),
    }

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        (data,) = self.expect_tensors(arg_types)
        dtype = attrs.dtype or data.dtype
        if data.dtype == "bool" or dtype == "bool":
            raise self.type_error("cannot sum bool values; cast 'data' to a number first (or "
                                  "give attribute 'dtype' a number type)")
        if attrs.axis is None:
            return TensorType((data.size,), dtype)
        normalize_axis(self, attrs.axis, data.ndim)
        return TensorType(data.shape, dtype)

    def reference(self, data: np.ndarray, axis: int | None, dtype: str | None, exclusive: bool,
                  reverse: bool) -> np.ndarray:
        # dtype is also the accumulator's (TVM): cast first, then sum in a wide type.
        source = data.astype(dtype) if dtype else data
        wide = source.astype(np.float64 if source.dtype.kind == "f" else np.int64)
        if axis is None:
            wide, axis = wide.reshape(-1), 0
        if reverse:
            wide = np.flip(wide, axis)
        sums = np.cumsum(wide, axis=axis)
        if exclusive and sums.shape[axis]:
            # Shift by one along the axis: element i gets the sum of elements 0..i-1.
            before = [slice(None)] * sums.ndim
            before[axis] = slice(0, -1)
            padding = [(0, 0)] * sums.ndim
            padding[axis] = (1, 0)
            sums = np.pad(sums[tuple(before)], padding)
        return np.flip(sums, axis) if reverse else sums
