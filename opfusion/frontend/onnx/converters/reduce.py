"""Converters of ONNX's reductions (Reduce*, ArgMax, ArgMin) and axis scans (TopK, CumSum).

ReduceSum took its axes as an input from opset 13, the other Reduce* from opset 18, together
with ``noop_with_empty_axes``; both forms are registered. Reductions with no IR operator of
their own (L1, L2, LogSum, LogSumExp, SumSquare) are composed from sum, max and elementwise
ops; integer inputs of the real-valued ones are computed in float64 and cast back."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from .... import op
from ....ir.expr import Expr
from ....ir.types import is_float
from ..registry import OnnxNode, converter
from ._common import filled
from .tensor import (
    as_ints,
    normalize_axes,
    required_const,
    scalar_const,
    shape_of,
    tensor_type,
    tuple_fields,
)

# ---------------------------------------------------------------------------------------------
# reductions

Reducer = Callable[[Expr, list[int] | None, bool], Expr]


def _in_float(x: Expr, compute: Callable[[Expr], Expr]) -> Expr:
    """Run ``compute`` in float64 for integer data and cast back, as ONNX's integer
    ReduceMean/L2/LogSum compute in real numbers and truncate."""
    dtype = tensor_type(x).dtype
    if is_float(dtype):
        return compute(x)
    return op.cast(compute(op.cast(x, dtype="float64")), dtype=dtype)


def _empty_result(x: Expr, axes: list[int] | None, keep: bool, fill: float) -> Expr:
    shape = shape_of(x)
    axes = list(range(len(shape))) if axes is None else axes
    out = [1 if a in axes else d for a, d in enumerate(shape) if keep or a not in axes]
    return filled(out, fill, tensor_type(x).dtype, what="the result of reducing no elements")


def _reduces_nothing(x: Expr, axes: list[int] | None) -> bool:
    shape = shape_of(x)
    return math.prod(shape[a] for a in (range(len(shape)) if axes is None else axes)) == 0


def _extreme(builder: Callable[..., Expr], largest: bool) -> Reducer:
    def reduce(x: Expr, axes: list[int] | None, keep: bool) -> Expr:
        dtype = tensor_type(x).dtype
        if _reduces_nothing(x, axes):
            # The max of nothing is the dtype's least value (opset 18 spelt it out).
            if dtype == "bool":
                fill: float = not largest
            elif is_float(dtype):
                fill = -np.inf if largest else np.inf
            else:
                info = np.iinfo(dtype)
                fill = info.min if largest else info.max
            return _empty_result(x, axes, keep, fill)
        if dtype == "bool":  # opset 20 allows bool: max is any, min is all
            reduced = builder(op.cast(x, dtype="uint8"), axis=axes, keepdims=keep)
            return op.cast(reduced, dtype="bool")
        return builder(x, axis=axes, keepdims=keep)

    return reduce


def _mean(x: Expr, axes: list[int] | None, keep: bool) -> Expr:
    """The mean; of no elements it is 0, as ONNX Runtime gives (the sum over the count, with
    the division by zero taken as 0), where op.mean follows NumPy's NaN."""
    if _reduces_nothing(x, axes):
        return _empty_result(x, axes, keep, 0)
    return _in_float(x, lambda v: op.mean(v, axis=axes, keepdims=keep))


def _log_sum_exp(x: Expr, axes: list[int] | None, keep: bool) -> Expr:
    """log(sum(exp(x - m))) + m with m the max, so exp never overflows. An infinite max is
    replaced by 0 (all -inf gives -inf, any +inf gives +inf, no NaN from inf - inf)."""
    if _reduces_nothing(x, axes):
        return _empty_result(x, axes, keep, -np.inf)

    def compute(v: Expr) -> Expr:
        dtype = tensor_type(v).dtype
        peak = op.max(v, axis=axes, keepdims=True)
        peak = op.where(op.isinf(peak), scalar_const(0, dtype), peak)
        summed = op.sum(op.exp(op.subtract(v, peak)), axis=axes, keepdims=keep)
        if not keep:
            reduced = range(len(shape_of(v))) if axes is None else axes
            peak = op.squeeze(peak, axis=list(reduced))
        return op.add(op.log(summed), peak)

    return _in_float(x, compute)


_REDUCERS: dict[str, Reducer] = {
    "ReduceSum": lambda x, axes, keep: op.sum(x, axis=axes, keepdims=keep),
    "ReduceProd": lambda x, axes, keep: op.prod(x, axis=axes, keepdims=keep),
    "ReduceMax": _extreme(op.max, largest=True),
    "ReduceMin": _extreme(op.min, largest=False),
    "ReduceMean": lambda x, axes, keep: _mean(x, axes, keep),
    "ReduceL1": lambda x, axes, keep: op.sum(op.abs(x), axis=axes, keepdims=keep),
    "ReduceSumSquare": lambda x, axes, keep: op.sum(op.multiply(x, x), axis=axes, keepdims=keep),
    "ReduceL2": lambda x, axes, keep: _in_float(
        x, lambda v: op.sqrt(op.sum(op.multiply(v, v), axis=axes, keepdims=keep))),
    "ReduceLogSum": lambda x, axes, keep: _in_float(
        x, lambda v: op.log(op.sum(v, axis=axes, keepdims=keep))),
    "ReduceLogSumExp": _log_sum_exp,
}


# What the reductions that are more than a fold make of one element alone, which is what
# reducing over no axes (noop_with_empty_axes=1) means; the plain folds leave it unchanged.
_OVER_NO_AXES: dict[str, Callable[[Expr], Expr]] = {
    "ReduceL1": op.abs,
    "ReduceL2": op.abs,
    "ReduceSumSquare": lambda x: op.multiply(x, x),
    "ReduceLogSum": lambda x: _in_float(x, op.log),
}


def _reduce(node: OnnxNode, axes: list[int] | None, noop_with_empty_axes: bool) -> Expr:
    x = node.input(0)
    if axes:
        axes = normalize_axes(node, axes, len(shape_of(x)))
    elif noop_with_empty_axes:
        return _OVER_NO_AXES.get(node.op_type, lambda v: v)(x)
    else:
        axes = None  # no axes: every axis
    return _REDUCERS[node.op_type](x, axes, bool(node.attr("keepdims", 1)))


def _reduce_with_attribute(node: OnnxNode) -> Expr:
    axes = node.attr("axes")
    return _reduce(node, None if axes is None else as_ints(axes), False)


def _reduce_with_input(node: OnnxNode) -> Expr:
    axes = node.const_input(1, "axes")
    return _reduce(node, None if axes is None else as_ints(axes),
                   bool(node.attr("noop_with_empty_axes", 0)))


# axes moved from an attribute to an input (with noop_with_empty_axes) in opset 13 for
# ReduceSum and in opset 18 for the others.
for _op_type in _REDUCERS:
    converter(_op_type)(_reduce_with_attribute)
    converter(_op_type, since=13 if _op_type == "ReduceSum" else 18)(_reduce_with_input)


def _arg_reduce(builder: Callable[..., Expr]) -> Callable[[OnnxNode], Expr]:
    def convert(node: OnnxNode) -> Expr:
        return builder(node.input(0), axis=[node.attr("axis", 0)],
                       keepdims=bool(node.attr("keepdims", 1)),
                       select_last_index=bool(node.attr("select_last_index", 0)))  # opset 12

    return convert


converter("ArgMax")(_arg_reduce(op.argmax))
converter("ArgMin")(_arg_reduce(op.argmin))


# ---------------------------------------------------------------------------------------------
# sorting and scans


def _topk(node: OnnxNode, k: int) -> list[Expr]:
    # sorted=0 leaves the order to the implementation; sorted order is one valid choice.
    call = op.topk(node.input(0), k=k, axis=node.attr("axis", -1), ret_type="both",
                   is_ascend=not node.attr("largest", 1), dtype="int64")
    return tuple_fields(call, 2)


@converter("TopK")
def topk_1(node: OnnxNode) -> list[Expr]:
    return _topk(node, node.attr("k"))


@converter("TopK", since=10)  # k became an input; largest and sorted arrived in 11
def topk_10(node: OnnxNode) -> list[Expr]:
    k = as_ints(required_const(node, 1, "k"))
    if len(k) != 1:
        raise node.error(f"k must hold one value, got {k}")
    return _topk(node, k[0])


@converter("CumSum", since=11)
def cumsum(node: OnnxNode) -> Expr:
    axis = as_ints(required_const(node, 1, "axis"))
    if len(axis) != 1:
        raise node.error(f"axis must hold one value, got {axis}")
    return op.cumsum(node.input(0), axis=axis[0], exclusive=bool(node.attr("exclusive", 0)),
                     reverse=bool(node.attr("reverse", 0)))


