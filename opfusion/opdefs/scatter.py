"""Ops that write at computed positions or that no loop nest expresses: the scatter family
(ScatterElements, ScatterND, TensorScatter), the running product, reinterpreting bytes,
determinants, max unpooling and max pooling's indices, Col2Im and ReverseSequence. All
kOpaque: a compiled model runs their NumPy references between its kernels.

Indices are checked before anything is written: an index outside [-n, n) of its axis raises
:class:`~opfusion.errors.IndexOutOfRangeError` naming the op (as ONNX Runtime refuses it),
never a write out of bounds. Where several updates land on one element with no reduction,
the last one wins (ONNX's reference order)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import IndexOutOfRangeError
from ..ir.op import Attr, Attrs, Op, OpPatternKind, register_op
from ..ir.types import TensorType, Type, is_float, is_int
from ._common import normalize_axis
from .transform import check_in_range

_REDUCTIONS = ("none", "add", "mul", "max", "min")
_UFUNC = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _index_type(op: Op, indices: TensorType, what: str = "indices") -> None:
    if not is_int(indices.dtype):
        raise op.type_error(f"input '{what}' must be int32 or int64, got {indices.dtype}")


def _scatter(out: np.ndarray, where: tuple, updates: np.ndarray, reduction: str) -> None:
    """Write (or reduce) ``updates`` into ``out`` at ``where``: index arrays, broadcast to
    updates' leading shape, over out's first ``len(where)`` axes (updates' other axes are
    the slices written)."""
    if reduction != "none":
        _UFUNC[reduction].at(out, where, updates)  # ufunc.at applies duplicates in order
        return
    # NumPy does not promise which duplicate an advanced assignment keeps; ONNX's reference
    # loops in order, so the last update to an element wins: keep only those.
    lead = out.shape[:len(where)]
    batch = updates.shape[:updates.ndim - (out.ndim - len(where))]
    columns = [np.broadcast_to(w, batch).reshape(-1) for w in where]
    linear = np.ravel_multi_index(columns, lead) if columns[0].size else columns[0]
    _, from_end = np.unique(linear[::-1], return_index=True)
    last = np.sort(linear.size - 1 - from_end)
    slices = updates.reshape((-1,) + updates.shape[len(batch):])
    out[tuple(c[last] for c in columns)] = slices[last]


@register_op
class ScatterElements(Op):
    name = "scatter_elements"
    doc = ("ONNX ScatterElements: a copy of data with out[..., indices[i, j], ...] (along "
           "``axis``) set to, or reduced with, updates[i, j]. Indices outside [-n, n) raise.")
    inputs = ("data", "indices", "updates")
    pattern = OpPatternKind.kOpaque
    attrs = {"axis": Attr("int", 0, doc="the axis the indices select along"),
             "reduction": Attr("str", "none", choices=_REDUCTIONS,
                               doc="how an update combines with the element it lands on")}

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        data, indices, updates = self.expect_tensors(arg_types)
        _index_type(self, indices)
        normalize_axis(self, attrs.axis, data.ndim)
        if indices.shape != updates.shape or indices.ndim != data.ndim:
            raise self.type_error(f"indices {indices.shape} and updates {updates.shape} must "
                                  f"have one shape, of data's rank {data.ndim}")
        if updates.dtype != data.dtype:
            raise self.type_error(f"updates ({updates.dtype}) must have data's dtype "
                                  f"({data.dtype})")
        return data

    def reference(self, data: np.ndarray, indices: np.ndarray, updates: np.ndarray,
                  axis: int, reduction: str) -> np.ndarray:
        axis %= data.ndim
        check_in_range(indices, [data.shape[axis]], f"scatter_elements along axis {axis}")
        grid = list(np.indices(indices.shape, sparse=True))
        grid[axis] = np.where(indices < 0, indices + data.shape[axis], indices)
        out = data.copy()
        _scatter(out, tuple(grid), updates, reduction)
        return out


@register_op
class ScatterND(Op):
    name = "scatter_nd"
    doc = ("ONNX ScatterND: a copy of data with the slices data[indices[i]] (each index a "
           "tuple of the first k axes) set to, or reduced with, updates[i]. Indices outside "
           "[-n, n) raise.")
    inputs = ("data", "indices", "updates")
    pattern = OpPatternKind.kOpaque
    attrs = {"reduction": Attr("str", "none", choices=_REDUCTIONS,
                               doc="how an update combines with the slice it lands on")}

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        data, indices, updates = self.expect_tensors(arg_types)
        _index_type(self, indices)
        if indices.ndim < 1 or not 1 <= indices.shape[-1] <= data.ndim:
            raise self.type_error(f"indices {indices.shape} must end in a tuple length of 1 "
                                  f"to data's rank {data.ndim}")
        k = indices.shape[-1]
        want = indices.shape[:-1] + data.shape[k:]
        if updates.shape != want:
            raise self.type_error(f"updates must have shape {want} (indices' batch shape, then "
                                  f"data's trailing axes), got {updates.shape}")
        if updates.dtype != data.dtype:
            raise self.type_error(f"updates ({updates.dtype}) must have data's dtype "
                                  f"({data.dtype})")
        return data

    def reference(self, data: np.ndarray, indices: np.ndarray, updates: np.ndarray,
                  reduction: str) -> np.ndarray:
        k = indices.shape[-1]
        check_in_range(indices, list(data.shape[:k]), "scatter_nd")
        flat = indices.reshape(-1, k).astype(np.int64)
        flat = np.where(flat < 0, flat + np.asarray(data.shape[:k], np.int64), flat)
        out = data.copy()
        _scatter(out, tuple(flat.T), updates.reshape((-1,) + data.shape[k:]), reduction)
        return out


@register_op
class TensorScatter(Op):
    name = "tensor_scatter"
    doc = ("ONNX TensorScatter (a KV-cache update): a copy of the cache with, per batch entry "
           "b, the update's sequence written at positions write_indices[b] + 0.. along "
           "``axis`` (modulo the cache's length in circular mode). Positions past the cache "
           "raise in linear mode.")
    inputs = ("cache", "update", "write_indices")
    pattern = OpPatternKind.kOpaque
    attrs = {"axis": Attr("int", -2, doc="the sequence axis (not the batch axis 0)"),
             "mode": Attr("str", "linear", choices=("linear", "circular"),
                          doc="linear: positions must fit; circular: they wrap")}

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        cache, update, write = self.expect_tensors(arg_types)
        _index_type(self, write, "write_indices")
        axis = normalize_axis(self, attrs.axis, cache.ndim)
        if axis == 0:
            raise self.type_error("'axis' must not be the batch axis 0")
        same = all(a == b for i, (a, b) in enumerate(zip(cache.shape, update.shape))
                   if i != axis)
        if update.ndim != cache.ndim or not same or update.shape[axis] > cache.shape[axis]:
            raise self.type_error(f"update {update.shape} must match cache {cache.shape} but "
                                  f"along axis {axis}, where it may be shorter")
        if write.shape != (cache.shape[0],):
            raise self.type_error(f"write_indices must have one entry per batch entry "
                                  f"({cache.shape[0]}), got shape {write.shape}")
        return cache

    def reference(self, cache: np.ndarray, update: np.ndarray, write_indices: np.ndarray,
                  axis: int, mode: str) -> np.ndarray:
        axis %= cache.ndim
        length, steps = cache.shape[axis], update.shape[axis]
        out = cache.copy()
        target, source = np.moveaxis(out, axis, -1), np.moveaxis(update, axis, -1)
        for batch, start in enumerate(write_indices.astype(np.int64).tolist()):
            positions = start + np.arange(steps)
            if mode == "circular":
                positions %= length
            elif start < 0 or start + steps > length:
                # linear mode: no wrapping, negative starts included
                raise IndexOutOfRangeError(
                    f"tensor_scatter (mode 'linear'): write index {start} of batch entry "
                    f"{batch} plus the update's {steps} steps does not fit in the cache's "
                    f"{length} along axis {axis}; write indices must lie in "
                    f"[0, {length - steps}] (or use mode 'circular')")
            target[batch][..., positions] = source[batch]  # (one advanced index, last)
        return out


@register_op
class CumProd(Op):
    name = "cumprod"
    doc = ("Running products along ``axis``; ``exclusive`` leaves each element out of its own "
           "product, ``reverse`` runs from the end (ONNX CumProd).")
    inputs = ("data",)
    pattern = OpPatternKind.kOpaque
    attrs = {"axis": Attr("int", 0, doc="the axis to scan"),
             "exclusive": Attr("bool", False, doc="multiply only the elements before each one"),
             "reverse": Attr("bool", False, doc="scan from the last element to the first")}

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        (data,) = self.expect_tensors(arg_types)
        if data.dtype == "bool":
            raise self.type_error("cannot multiply bool values; cast 'data' to a number first")
        normalize_axis(self, attrs.axis, data.ndim)
        return data

    def reference(self, data: np.ndarray, axis: int, exclusive: bool,
                  reverse: bool) -> np.ndarray:
        axis %= data.ndim
        values = np.flip(data, axis) if reverse else data
        products = np.cumprod(values, axis=axis, dtype=data.dtype)
        if exclusive:
            ones = np.ones_like(np.take(products, [0], axis=axis))
            products = np.concatenate([ones, np.take(products, np.arange(
                products.shape[axis] - 1), axis=axis)], axis=axis)
        return np.flip(products, axis) if reverse else products


@register_op
class BitCast(Op):
    name = "bitcast"
    doc = "The same bytes read as another dtype of the same width (ONNX BitCast, little endian)."
    inputs = ("data",)
    pattern = OpPatternKind.kOpaque
    attrs = {"dtype": Attr("dtype", required=True, doc="the dtype to read the bytes as")}

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        (data,) = self.expect_tensors(arg_types)
        if np.dtype(data.dtype).itemsize != np.dtype(attrs.dtype).itemsize:
            raise self.type_error(f"{data.dtype} and {attrs.dtype} differ in width; BitCast "
                                  "needs types of one width")
        return TensorType(data.shape, attrs.dtype)

    def reference(self, data: np.ndarray, dtype: str) -> np.ndarray:
        little = data.astype(np.dtype(data.dtype).newbyteorder("<"), order="C", copy=True)
        return little.view(np.dtype(dtype).newbyteorder("<")).astype(dtype)


@register_op
class Det(Op):
    name = "det"
    doc = "Determinants of the square matrices in the last two axes (ONNX Det)."
    inputs = ("data",)
    pattern = OpPatternKind.kOpaque
    attrs: dict[str, Attr] = {}

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        (data,) = self.expect_tensors(arg_types)
        if not is_float(data.dtype) or data.ndim < 2 or data.shape[-1] != data.shape[-2]:
            raise self.type_error(f"data must be float square matrices [..., M, M], got "
                                  f"{data.dtype} {data.shape}")
        return TensorType(data.shape[:-2], data.dtype)

    def reference(self, data: np.ndarray) -> np.ndarray:
        return np.linalg.det(data.astype(np.float64)).astype(data.dtype)


@register_op
class MaxUnpool(Op):
    name = "max_unpool"
    doc = ("ONNX MaxUnpool: zeros of ``pooled_from`` (the shape MaxPool's input had) with "
           "each value of data written at its flat index (MaxPool's Indices), placed at the "
           "start of zeros of ``out_shape``. Indices outside ``pooled_from`` raise.")
    inputs = ("data", "indices")
    pattern = OpPatternKind.kOpaque
    attrs = {"out_shape": Attr("ints", required=True, doc="the output's shape"),
             "pooled_from": Attr("ints", (), doc="the shape the indices index (default: "
                                                 "out_shape)")}

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        data, indices = self.expect_tensors(arg_types)
        _index_type(self, indices)
        if indices.shape != data.shape:
            raise self.type_error(f"indices {indices.shape} must have data's shape "
                                  f"{data.shape}")
        inner = tuple(attrs.pooled_from) or tuple(attrs.out_shape)
        if len(inner) != len(attrs.out_shape) or any(
                a > b for a, b in zip(inner, attrs.out_shape)):
            raise self.type_error(f"'pooled_from'={inner} must fit in 'out_shape'="
                                  f"{tuple(attrs.out_shape)}")
        return TensorType(tuple(attrs.out_shape), data.dtype)

    def reference(self, data: np.ndarray, indices: np.ndarray, out_shape: tuple[int, ...],
                  pooled_from: tuple[int, ...]) -> np.ndarray:
        inner_shape = tuple(pooled_from) or tuple(out_shape)
        inner = np.zeros(inner_shape, dtype=data.dtype).reshape(-1)
        flat = indices.reshape(-1).astype(np.int64)
        if flat.size and (flat.min() < 0 or flat.max() >= inner.size):
            bad = int(flat[(flat < 0) | (flat >= inner.size)][0])
            raise IndexOutOfRangeError(f"max_unpool: index {bad} is outside the "
                                       f"{inner.size} elements of {inner_shape}")
        inner[flat] = data.reshape(-1)
        out = np.zeros(out_shape, dtype=data.dtype)
        out[tuple(slice(0, d) for d in inner_shape)] = inner.reshape(inner_shape)
        return out


@register_op
class MaxPoolIndices(Op):
    name = "nn.max_pool_indices"
    doc = ("The flat index (over the whole input, row-major, or column-major in the spatial "
           "axes for storage_order 1) of each 2-D max pooling window's first maximum (ONNX "
           "MaxPool's Indices output); padding is never chosen.")
    inputs = ("data",)
    pattern = OpPatternKind.kOpaque
    attrs = {"pool_size": Attr("ints", required=True, length=2, doc="the window"),
             "strides": Attr("ints", (1, 1), length=2, doc="the window's steps"),
             "dilation": Attr("ints", (1, 1), length=2, doc="the window's dilation"),
             "padding": Attr("ints", (0, 0, 0, 0), length=4,
                             doc="(top, left, bottom, right) padding"),
             "out_size": Attr("ints", required=True, length=2, doc="the pooled height, width"),
             "storage_order": Attr("int", 0, doc="0: row-major indices, 1: column-major")}

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        (data,) = self.expect_tensors(arg_types)
        if data.ndim != 4:
            raise self.type_error(f"data must be NCHW, got {data.shape}")
        return TensorType(data.shape[:2] + tuple(attrs.out_size), "int64")

    def reference(self, data: np.ndarray, pool_size: tuple[int, int], strides: tuple[int, int],
                  dilation: tuple[int, int], padding: tuple[int, ...], out_size: tuple[int, int],
                  storage_order: int) -> np.ndarray:
        n, c, height, width = data.shape
        best = np.full((n, c) + tuple(out_size), -np.inf)
        index = np.zeros((n, c) + tuple(out_size), np.int64)
        rows = np.arange(out_size[0]) * strides[0] - padding[0]
        cols = np.arange(out_size[1]) * strides[1] - padding[1]
        base = (np.arange(n)[:, None] * c + np.arange(c)[None, :]) * height * width
        for dy in range(pool_size[0]):
            for dx in range(pool_size[1]):
                y, x = rows + dy * dilation[0], cols + dx * dilation[1]
                valid = (((y >= 0) & (y < height))[:, None] & ((x >= 0) & (x < width))[None, :])
                yc, xc = np.clip(y, 0, height - 1), np.clip(x, 0, width - 1)
                values = np.where(valid, data[:, :, yc][:, :, :, xc], -np.inf)
                position = (yc[:, None] * width + xc[None, :] if storage_order == 0
                            else xc[None, :] * height + yc[:, None])
                better = values > best
                best = np.where(better, values, best)
                index = np.where(better, base[:, :, None, None] + position, index)
        return index


@register_op
class Col2Im(Op):
    name = "col2im"
    doc = ("ONNX Col2Im (torch's fold): column blocks [N, C * prod(block), L] summed back into "
           "images [N, C, *image_shape].")
    inputs = ("data",)
    pattern = OpPatternKind.kOpaque
    attrs = {"image_shape": Attr("ints", required=True, doc="the image's spatial shape"),
             "block_shape": Attr("ints", required=True, doc="each block's spatial shape"),
             "strides": Attr("ints", (), doc="per spatial axis (default 1)"),
             "pads": Attr("ints", (), doc="begins then ends (default 0)"),
             "dilations": Attr("ints", (), doc="per spatial axis (default 1)")}

    def geometry(self, attrs: Attrs | dict) -> tuple:
        image, block = list(attrs["image_shape"]), list(attrs["block_shape"])
        rank = len(image)
        strides = list(attrs["strides"]) or [1] * rank
        pads = list(attrs["pads"]) or [0] * 2 * rank
        dilations = list(attrs["dilations"]) or [1] * rank
        counts = [(image[d] + pads[d] + pads[rank + d] - dilations[d] * (block[d] - 1) - 1)
                  // strides[d] + 1 for d in range(rank)]
        return image, block, strides, pads, dilations, counts

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        (data,) = self.expect_tensors(arg_types)
        image, block, strides, pads, dilations, counts = self.geometry(attrs)
        if len(block) != len(image) or len(strides) != len(image) or len(pads) != 2 * len(image):
            raise self.type_error("image_shape, block_shape, strides and pads disagree on the "
                                  "number of spatial axes")
        size = int(np.prod(block))
        if data.ndim != 3 or data.shape[1] % size or data.shape[2] != int(np.prod(counts)):
            raise self.type_error(f"data must be [N, C * {size}, {int(np.prod(counts))}], got "
                                  f"{data.shape}")
        return TensorType((data.shape[0], data.shape[1] // size) + tuple(image), data.dtype)

    def reference(self, data: np.ndarray, **attrs: Any) -> np.ndarray:
        image, block, strides, pads, dilations, counts = self.geometry(attrs)
        rank = len(image)
        n, channels = data.shape[0], data.shape[1] // int(np.prod(block))
        padded = np.zeros((n, channels) + tuple(image[d] + pads[d] + pads[rank + d]
                                                for d in range(rank)), data.dtype)
        columns = data.reshape((n, channels) + tuple(block) + tuple(counts))
        for offset in np.ndindex(*block):
            where = tuple(slice(offset[d] * dilations[d],
                                offset[d] * dilations[d] + strides[d] * (counts[d] - 1) + 1,
                                strides[d]) for d in range(rank))
            padded[(slice(None), slice(None)) + where] += columns[(slice(None), slice(None))
                                                                  + offset]
        crop = tuple(slice(pads[d], pads[d] + image[d]) for d in range(rank))
        return padded[(slice(None), slice(None)) + crop]


@register_op
class ReverseSequence(Op):
    name = "reverse_sequence"
    doc = ("ONNX ReverseSequence: along ``time_axis``, the first lengths[b] elements of each "
           "batch entry b (along ``batch_axis``) reversed, the rest kept.")
    inputs = ("data", "lengths")
    pattern = OpPatternKind.kOpaque
    attrs = {"batch_axis": Attr("int", 1, doc="the batch axis (0 or 1)"),
             "time_axis": Attr("int", 0, doc="the time axis (1 or 0)")}

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        data, lengths = self.expect_tensors(arg_types)
        _index_type(self, lengths, "sequence_lens")
        batch = normalize_axis(self, attrs.batch_axis, data.ndim, "batch_axis")
        time = normalize_axis(self, attrs.time_axis, data.ndim, "time_axis")
        if batch == time or lengths.shape != (data.shape[batch],):
            raise self.type_error(f"batch_axis and time_axis must differ and sequence_lens "
                                  f"have one entry per batch entry ({data.shape[batch]})")
        return data

    def reference(self, data: np.ndarray, lengths: np.ndarray, batch_axis: int,
                  time_axis: int) -> np.ndarray:
        out = data.copy()
        steps = data.shape[time_axis]
        bad = (lengths < 0) | (lengths > steps)
        if bad.any():  # as ONNX Runtime refuses them; a longer one would read past the end
            b = int(np.argmax(bad))
            raise IndexOutOfRangeError(
                f"reverse_sequence: sequence_lens[{b}] = {int(lengths[b])} is outside [0, "
                f"{steps}], the length of the time axis {time_axis}")
        moved_out = np.moveaxis(out, (batch_axis, time_axis), (0, 1))
        moved_in = np.moveaxis(data, (batch_axis, time_axis), (0, 1))
        for b, length in enumerate(lengths.astype(np.int64).tolist()):
            moved_out[b, :length] = moved_in[b, :length][::-1]
        return out
