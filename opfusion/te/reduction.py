"""Reductions: commutative reducers (``sum``, ``max``, ``min``, user-made ones) and the Reduce
expression they build.

A reducer called with an ``axis`` reduces over it: ``te.sum(A[i, k], axis=k)``. Called with
two expressions and no axis it combines them elementwise: ``te.max(x, 0.0)`` is a ReLU."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import TensorExprError
from ..tir.expr import (
    ExprOp,
    FloatImm,
    IntImm,
    PrimExpr,
    Var,
    _literal_like,
    add,
    as_expr,
    const,
    dtype_of_name,
    is_float,
    maximum,
    minimum,
    substitute,
)
from .tensor import IterVar

_set = object.__setattr__


class CommReducer:
    """A commutative, associative combiner specialised to one dtype: ``result`` combines
    ``lhs`` (the accumulator) and ``rhs`` (a new value); ``identity`` is its neutral element."""

    __slots__ = ("name", "lhs", "rhs", "result", "identity")

    def __init__(self, name: str, lhs: Var, rhs: Var, result: PrimExpr,
                 identity: PrimExpr) -> None:
        _set(self, "name", name)
        _set(self, "lhs", lhs)
        _set(self, "rhs", rhs)
        _set(self, "result", result)
        _set(self, "identity", identity)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("CommReducer is immutable")

    def combine(self, acc: PrimExpr, value: PrimExpr) -> PrimExpr:
        """``result`` with the accumulator and the new value put in."""
        return substitute(self.result, {self.lhs: acc, self.rhs: value})

    def __repr__(self) -> str:
        return f"CommReducer({self.name}: {self.lhs.name}, {self.rhs.name} -> {self.result})"


class Reduce(PrimExpr):
    """``combiner`` folded over ``source`` for every point of the reduction ``axis``."""

    __slots__ = ("combiner", "source", "axis")
    _child_fields = ("source",)

    def __init__(self, combiner: CommReducer, source: PrimExpr, axis: Sequence[IterVar]) -> None:
        _set(self, "combiner", combiner)
        _set(self, "source", source)
        _set(self, "axis", tuple(axis))
        _set(self, "dtype", source.dtype)

    def _rebuild(self, children: list[PrimExpr]) -> PrimExpr:
        return Reduce(self.combiner, children[0], self.axis)

    def _text(self, fmt: Callable[[PrimExpr], str]) -> str:
        axes = ", ".join(a.name for a in self.axis)
        return f"{self.combiner.name}({fmt(self.source)}, axis=[{axes}])"


def _axis_list(axis: Any, reducer: str) -> list[IterVar]:
    axes = list(axis) if isinstance(axis, (list, tuple)) else [axis]
    if not axes:
        raise TensorExprError(f"te.{reducer}: the axis list is empty")
    for a in axes:
        if not isinstance(a, IterVar) or not a.is_reduce:
            raise TensorExprError(
                f"te.{reducer}: axis {a!r} is not a reduction axis; make one with "
                "te.reduce_axis((lo, hi), name)"
            )
    for i, a in enumerate(axes):
        if any(a is b for b in axes[:i]):
            raise TensorExprError(f"te.{reducer}: axis {a.name} is listed twice")
    return axes


def comm_reducer(fcombine: Callable[[PrimExpr, PrimExpr], Any],
                 fidentity: Callable[[str], Any], name: str = "reduce") -> Callable[..., PrimExpr]:
    """Make a reducer from ``fcombine(acc, value)`` and ``fidentity(dtype) -> constant``.

    The result is called as ``reducer(expr, axis=k)`` (a reduction over ``k`` or a list of
    reduction axes) or as ``reducer(a, b)`` (``fcombine`` applied elementwise)."""

    def reducer(expr: Any, axis: Any = None, *more: Any) -> PrimExpr:
        if more:
            raise TensorExprError(f"te.{name} takes an expression and an axis (or two values)")
        is_axis = isinstance(axis, IterVar) or (
            isinstance(axis, (list, tuple)) and axis and all(isinstance(a, IterVar) for a in axis)
        )
        if axis is None:
            raise TensorExprError(
                f"te.{name}(expr) needs axis=... (a reduction axis), or a second value to "
                f"combine elementwise: te.{name}(a, b)"
            )
        if not is_axis:
            first = as_expr(expr)
            second = axis if isinstance(axis, ExprOp) else _literal_like(axis, first.dtype)
            return as_expr(fcombine(first, as_expr(second)))
        axes = _axis_list(axis, name)
        source = as_expr(expr)
        if isinstance(source, Reduce):
            raise TensorExprError(
                f"te.{name}: nested reduction {source}; list all axes in one reduction: "
                f"te.{name}(expr, axis=[k1, k2])"
            )
        lhs, rhs = Var("acc", source.dtype), Var("value", source.dtype)
        result = as_expr(fcombine(lhs, rhs))
        identity = as_expr(fidentity(source.dtype), source.dtype)
        if result.dtype != source.dtype or identity.dtype != source.dtype:
            raise TensorExprError(
                f"te.{name}: the combiner or identity changes the dtype {source.dtype} (to "
                f"{result.dtype} / {identity.dtype}); keep them in the source's dtype"
            )
        return Reduce(CommReducer(name, lhs, rhs, result, identity), source, axes)

    reducer.__name__ = name
    reducer.__doc__ = (f"Reduce over ``axis`` with {name}, or combine two values elementwise.")
    return reducer


def max_value(dtype: object) -> PrimExpr:
    """The largest finite value of ``dtype``."""
    d = np.dtype(dtype_of_name(dtype))
    if d.kind == "f":
        return FloatImm(float(np.finfo(d).max), d.name)
    if d.kind == "b":
        return IntImm(1, "bool")
    return IntImm(int(np.iinfo(d).max), d.name)


def min_value(dtype: object) -> PrimExpr:
    """The smallest finite value of ``dtype``."""
    d = np.dtype(dtype_of_name(dtype))
    if d.kind == "f":
        return FloatImm(float(np.finfo(d).min), d.name)
    if d.kind == "b":
        return IntImm(0, "bool")
    return IntImm(int(np.iinfo(d).min), d.name)


def _lowest(dtype: str) -> PrimExpr:
    # -inf rather than the lowest finite value, so that max over [-inf] is -inf as in NumPy.
    return FloatImm(float("-inf"), dtype) if is_float(dtype) else min_value(dtype)


def _highest(dtype: str) -> PrimExpr:
    return FloatImm(float("inf"), dtype) if is_float(dtype) else max_value(dtype)


sum = comm_reducer(add, lambda dtype: const(0, dtype), name="sum")  # noqa: A001
max = comm_reducer(maximum, _lowest, name="max")  # noqa: A001
min = comm_reducer(minimum, _highest, name="min")  # noqa: A001
