"""Converters of ONNX's scatter family and of the small tensor ops that write at computed
positions or have shapes decided by values: ScatterElements (and the older Scatter),
ScatterND, TensorScatter, CumProd, EyeLike, BitCast, ReverseSequence, MaxUnpool, Det, Col2Im,
and the data-dependent Compress and Unique (their shape-deciding inputs taken as constants:
frozen by the ONNX backend or computed by an earlier stage of a staged run)."""

from __future__ import annotations

import numpy as np

from .... import op
from ....ir.expr import Constant, Expr
from ..registry import OnnxNode, converter
from ..tensors import onnx_dtype
from ._common import checked_axis, shape_of, tensor_type
from .tensor import as_ints, required_const


# ---------------------------------------------------------------------------------------------
# scatter
# ---------------------------------------------------------------------------------------------
@converter("Scatter", since=9)
@converter("ScatterElements", since=11)
def scatter_elements(node: OnnxNode) -> Expr:
    return op.scatter_elements(node.input(0), node.input(1), node.input(2),
                               axis=int(node.attr("axis", 0)),
                               reduction=node.attr("reduction", "none"))


@converter("ScatterND", since=11)
def scatter_nd(node: OnnxNode) -> Expr:
    return op.scatter_nd(node.input(0), node.input(1), node.input(2),
                         reduction=node.attr("reduction", "none"))


@converter("TensorScatter", since=24)
def tensor_scatter(node: OnnxNode) -> Expr:
    cache = node.input(0)
    write = node.optional_input(2)
    if write is None:
        write = Constant(np.zeros(tensor_type(cache).shape[0], np.int64))
    return op.tensor_scatter(cache, node.input(1), write, axis=int(node.attr("axis", -2)),
                             mode=node.attr("mode", "linear"))


# ---------------------------------------------------------------------------------------------
# scans, constants, bytes
# ---------------------------------------------------------------------------------------------
@converter("CumProd", since=26)
def cumprod(node: OnnxNode) -> Expr:
    axis = as_ints(required_const(node, 1, "axis"))
    if len(axis) != 1:
        raise node.error(f"axis must hold one value, got {axis}")
    data = node.input(0)
    return op.cumprod(data, axis=checked_axis(node, axis[0], tensor_type(data).ndim),
                      exclusive=bool(node.attr("exclusive", 0)),
                      reverse=bool(node.attr("reverse", 0)))


@converter("EyeLike", since=9)
def eye_like(node: OnnxNode) -> Expr:
    like = tensor_type(node.input(0))
    if like.ndim != 2:
        raise node.error(f"the input must be 2-D, got shape {like.shape}")
    code = int(node.attr("dtype", 0))
    dtype = onnx_dtype(code, f"attribute dtype of node {node.name!r}") if code else like.dtype
    return Constant(np.eye(like.shape[0], like.shape[1], k=int(node.attr("k", 0)), dtype=dtype))


@converter("BitCast", since=26)
def bitcast(node: OnnxNode) -> Expr:
    dtype = onnx_dtype(int(node.attr("to", 0)), f"attribute to of node {node.name!r}")
    return op.bitcast(node.input(0), dtype=dtype)


@converter("ReverseSequence", since=10)
def reverse_sequence(node: OnnxNode) -> Expr:
    return op.reverse_sequence(node.input(0), node.input(1),
                               batch_axis=int(node.attr("batch_axis", 1)),
                               time_axis=int(node.attr("time_axis", 0)))


@converter("Det", since=11)
def det(node: OnnxNode) -> Expr:
    return op.det(node.input(0))


# ---------------------------------------------------------------------------------------------
# pooling and images
# ---------------------------------------------------------------------------------------------
@converter("MaxUnpool", since=9)
def max_unpool(node: OnnxNode) -> Expr:
    data, indices = node.input(0), node.input(1)
    shape = shape_of(data)
    kernel = as_ints(node.attr("kernel_shape", []))
    rank = len(kernel)
    strides = as_ints(node.attr("strides", [1] * rank))
    pads = as_ints(node.attr("pads", [0] * 2 * rank))
    pooled_from = list(shape[:2]) + [(shape[2 + d] - 1) * strides[d] + kernel[d]
                                     - pads[d] - pads[rank + d] for d in range(rank)]
    given = node.optional_input(2)
    out_shape = (as_ints(required_const(node, 2, "output_shape")) if given is not None
                 else pooled_from)
    if len(out_shape) != len(shape) or list(out_shape[:2]) != list(shape[:2]):
        raise node.error(f"output_shape {out_shape} must keep the input's batch and channels "
                         f"{list(shape[:2])}")
    return op.max_unpool(data, indices, out_shape=[int(d) for d in out_shape],
                         pooled_from=[int(d) for d in pooled_from])


@converter("Col2Im", since=18)
def col2im(node: OnnxNode) -> Expr:
    image = as_ints(required_const(node, 1, "image_shape"))
    block = as_ints(required_const(node, 2, "block_shape"))
    return op.col2im(node.input(0), image_shape=image, block_shape=block,
                     strides=as_ints(node.attr("strides", [])),
                     pads=as_ints(node.attr("pads", [])),
                     dilations=as_ints(node.attr("dilations", [])))


# ---------------------------------------------------------------------------------------------
# shapes decided by values
# ---------------------------------------------------------------------------------------------
@converter("Compress", since=9)
def compress(node: OnnxNode) -> Expr:
    condition = required_const(node, 1, "condition; the result's size depends on it")
    data = node.input(0)
    axis = node.attr("axis")
    chosen = np.flatnonzero(condition.reshape(-1).astype(bool))
    if axis is None:
        size = tensor_type(data).size
        if chosen.size and chosen[-1] >= size:
            raise node.error(f"condition selects element {int(chosen[-1])} of a tensor of "
                             f"{size}")
        return op.take(op.reshape(data, newshape=[-1]), Constant(chosen.astype(np.int64)),
                       axis=0)
    axis = checked_axis(node, int(axis), tensor_type(data).ndim)
    length = tensor_type(data).shape[axis]
    if chosen.size and chosen[-1] >= length:
        raise node.error(f"condition selects index {int(chosen[-1])} of axis {axis} of size "
                         f"{length}")
    return op.take(data, Constant(chosen.astype(np.int64)), axis=axis)


@converter("Unique", since=11)
def unique(node: OnnxNode) -> list[Expr]:
    data = required_const(node, 0, "X; how many unique values there are depends on them")
    axis = node.attr("axis")
    if axis is not None:
        axis = checked_axis(node, int(axis), data.ndim)
    values, first, inverse, counts = unique_values(data, axis, bool(node.attr("sorted", 1)))
    return [Constant(values), Constant(first), Constant(inverse), Constant(counts)]


def unique_values(data: np.ndarray, axis: int | None, sort: bool
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """ONNX Unique: the unique values (or slices along ``axis``), sorted or in order of first
    occurrence, with each one's first index, each input's index among them, and counts."""
    values, first, inverse, counts = np.unique(data, return_index=True, return_inverse=True,
                                               return_counts=True, axis=axis)
    inverse = inverse.reshape(-1)
    if not sort:  # order of first occurrence
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        values = np.take(values, order, axis=0 if axis is None else axis)
        first, counts, inverse = first[order], counts[order], rank[inverse]
    return (values, first.astype(np.int64), inverse.astype(np.int64),
            counts.astype(np.int64))
