"""Converters of ATen's reductions, scans and selections: mean, sum, amax/amin, prod,
var/std, any/all, argmax/argmin, cumsum, topk and sort."""

from __future__ import annotations

from collections.abc import Callable

from .... import op
from ....ir.expr import Expr, TupleGetItem
from ..registry import AtenNode, converter
from ._common import as_dtype, dim, dims, number, shape_of


def _reduction(fn: Callable[..., Expr], cast: bool = True) -> Callable[[AtenNode], Expr]:
    """A reduction over ``dim`` (all dims when it is None or empty) with ``keepdim``; the input
    in the output's dtype first (sum of bools counts in int64, mean of ints is refused by
    torch)."""

    def convert(node: AtenNode) -> Expr:
        x = node.tensor("self")
        if cast:
            x = as_dtype(x, node.dtype)
        axes = dims(node, node.values.get("dim"), len(shape_of(x)))
        if not shape_of(x):
            return x
        return fn(x, axis=axes, keepdims=bool(node.get("keepdim", False)))

    return convert


converter("aten.mean.dim", "aten.mean.default")(_reduction(op.mean))
converter("aten.sum.dim_IntList", "aten.sum.default")(_reduction(op.sum))
converter("aten.amax.default", "aten.max.default")(_reduction(op.max))
converter("aten.amin.default", "aten.min.default")(_reduction(op.min))
converter("aten.prod.dim_int", "aten.prod.default")(_reduction(op.prod))


def _logical_reduction(fn: Callable[..., Expr]) -> Callable[[AtenNode], Expr]:
    def convert(node: AtenNode) -> Expr:
        x = as_dtype(as_dtype(node.tensor("self"), "bool"), "int8")
        axes = dims(node, node.values.get("dim"), len(shape_of(x)))
        if not shape_of(x):
            return as_dtype(x, "bool")
        return as_dtype(fn(x, axis=axes, keepdims=bool(node.get("keepdim", False))), "bool")

    return convert


converter("aten.any.dim", "aten.any.dims", "aten.any.default")(_logical_reduction(op.max))
converter("aten.all.dim", "aten.all.dims", "aten.all.default")(_logical_reduction(op.min))


def _variance(node: AtenNode) -> Expr:
    x = as_dtype(node.tensor("self"), node.dtype)
    shape = shape_of(x)
    axes = dims(node, node.values.get("dim"), len(shape))
    count = 1
    for axis in axes:
        count *= shape[axis]
    correction = node.values.get("correction")
    if correction is None:
        correction = 1 if node.get("unbiased", True) else 0
    keepdim = bool(node.get("keepdim", False))
    biased = op.variance(x, axis=axes, keepdims=keepdim)
    if correction == 0:
        return biased
    if count - correction <= 0:
        raise node.error(f"correction={correction} leaves no degrees of freedom over "
                         f"{count} values (torch gives NaN or inf here)")
    return biased * (count / (count - correction))


@converter("aten.var.correction", "aten.var.dim")
def var(node: AtenNode) -> Expr:
    return _variance(node)


@converter("aten.std.correction", "aten.std.dim")
def std(node: AtenNode) -> Expr:
    return op.sqrt(_variance(node))


@converter("aten.argmax.default")
def argmax(node: AtenNode) -> Expr:
    return _arg(node, op.argmax)


@converter("aten.argmin.default")
def argmin(node: AtenNode) -> Expr:
    return _arg(node, op.argmin)


def _arg(node: AtenNode, fn: Callable[..., Expr]) -> Expr:
    x = node.tensor("self")
    keepdim = bool(node.get("keepdim", False))
    chosen = node.values.get("dim")
    if chosen is None:  # over the flattened tensor
        flat = op.reshape(x, newshape=[-1])
        out = fn(flat, axis=[0], keepdims=False)
        return op.reshape(out, newshape=[1] * len(shape_of(x))) if keepdim else out
    axis = dim(node, chosen, len(shape_of(x)))
    return fn(x, axis=[axis], keepdims=keepdim)


@converter("aten.max.dim", "aten.min.dim")
def max_dim(node: AtenNode) -> tuple[Expr, Expr]:
    x = node.tensor("self")
    axis = dim(node, node.get("dim"), len(shape_of(x)))
    keepdim = bool(node.get("keepdim", False))
    largest = node.target.startswith("aten.max")
    values = (op.max if largest else op.min)(x, axis=[axis], keepdims=keepdim)
    indices = (op.argmax if largest else op.argmin)(x, axis=[axis], keepdims=keepdim)
    return values, indices


@converter("aten.cumsum.default")
def cumsum(node: AtenNode) -> Expr:
    x = as_dtype(node.tensor("self"), node.dtype)
    return op.cumsum(x, axis=dim(node, node.get("dim"), len(shape_of(x))))


@converter("aten.topk.default")
def topk(node: AtenNode) -> tuple[Expr, Expr]:
    x = node.tensor("self")
    axis = dim(node, node.get("dim", -1), len(shape_of(x)))
    k = int(node.get("k"))
    if not 0 <= k <= shape_of(x)[axis]:
        raise node.error(f"k={k} is out of range for dim {axis} of size {shape_of(x)[axis]}")
    out = op.topk(x, k=k, axis=axis, is_ascend=not node.get("largest", True), ret_type="both")
    return TupleGetItem(out, 0), TupleGetItem(out, 1)


@converter("aten.sort.default", "aten.sort.stable")
def sort(node: AtenNode) -> tuple[Expr, Expr]:
    x = node.tensor("self")
    axis = dim(node, node.get("dim", -1), len(shape_of(x)))
    count = shape_of(x)[axis]
    out = op.topk(x, k=count, axis=axis, is_ascend=not node.get("descending", False),
                  ret_type="both")
    return TupleGetItem(out, 0), TupleGetItem(out, 1)


@converter("aten.linalg_vector_norm.default")
def vector_norm(node: AtenNode) -> Expr:
    x = as_dtype(node.tensor("self"), node.dtype)
    axes = dims(node, node.values.get("dim"), len(shape_of(x)))
    keepdim = bool(node.get("keepdim", False))
    order = float(node.get("ord", 2))
    if order == 2:
        return op.sqrt(op.sum(x * x, axis=axes, keepdims=keepdim))
    if order == 1:
        return op.sum(op.abs(x), axis=axes, keepdims=keepdim)
    if order == float("inf"):
        return op.max(op.abs(x), axis=axes, keepdims=keepdim)
    total = op.sum(op.power(op.abs(x), number(order, node.dtype)), axis=axes, keepdims=keepdim)
    return op.power(total, number(1 / order, node.dtype))
