"""Shape and indexing transforms: reshape, transpose, slicing, gathers, tiling, arange, ...

Every output element is one input element found by an index map, so all are kInjective except
broadcast_to (kBroadcast). Attribute conventions are TVM's; where ONNX fixes a finer point
(reshape's 0, Slice clamping, Gather's negative indices, DepthToSpace modes) ONNX's is used."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import IndexOutOfRangeError
from ..ir.layout import Layout, LayoutError, check_compatible, transform_array
from ..ir.op import Attr, Attrs, Op, OpPatternKind, register_op
from ..ir.types import TensorType, TupleType, Type, is_int
from ._common import normalize_axes, normalize_axis, same_dtype, shape_size

_INDEX_DTYPES = ("int32", "int64")


class TransformOp(Op):
    """One tensor in; the result keeps its dtype. Subclasses give ``out_shape``."""

    inputs = ("data",)
    pattern = OpPatternKind.kInjective

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        (data,) = self.expect_tensors(arg_types)
        return TensorType(self.out_shape(data.shape, attrs), data.dtype)

    def out_shape(self, shape: tuple[int, ...], attrs: Attrs) -> tuple[int, ...]:
        raise NotImplementedError  # pragma: no cover


@register_op
class Reshape(TransformOp):
    name = "reshape"
    doc = "The same elements in row-major order under a new shape (-1 infers, 0 copies a dim)."
    attrs = {"newshape": Attr("ints", required=True,
                              doc="target shape; -1 infers one dim, 0 copies the input's dim")}

    def out_shape(self, shape: tuple[int, ...], attrs: Attrs) -> tuple[int, ...]:
        newshape = attrs.newshape
        out: list[int] = []
        infer_at = None
        for index, dim in enumerate(newshape):
            if dim == 0:  # ONNX Reshape (allowzero=0) and TVM: copy the input's dim
                if index >= len(shape):
                    raise self.type_error(f"attribute 'newshape'={newshape} has 0 at position "
                                          f"{index}, which copies a dimension that data {shape} "
                                          "does not have; give the size explicitly")
                out.append(shape[index])
            elif dim == -1:
                if infer_at is not None:
                    raise self.type_error(f"attribute 'newshape'={newshape} has more than one "
                                          "-1; at most one dimension can be inferred")
                infer_at = index
                out.append(1)
            elif dim < -1:
                raise self.type_error(f"attribute 'newshape'={newshape} has {dim}; dimensions "
                                      "are sizes, -1 (infer) or 0 (copy)")
            else:
                out.append(dim)
        size = shape_size(shape)
        if infer_at is not None:
            known = shape_size(out)
            if known == 0:
                raise self.type_error(f"attribute 'newshape'={newshape}: -1 cannot be inferred "
                                      f"for data {shape} when the other dimensions multiply to 0;"
                                      " give every size")
            if size % known:
                raise self.type_error(f"cannot reshape data {shape} ({size} elements) to "
                                      f"'newshape'={newshape}: {size} is not a multiple of the "
                                      f"other dimensions' product {known}")
            out[infer_at] = size // known
        if shape_size(out) != size:
            raise self.type_error(f"cannot reshape data {shape} ({size} elements) to "
                                  f"'newshape'={newshape} (= {tuple(out)}, {shape_size(out)} "
                                  "elements); the element counts must match")
        return tuple(out)

    def reference(self, data: np.ndarray, newshape: tuple[int, ...]) -> np.ndarray:
        return data.reshape(self.out_shape(data.shape, Attrs({"newshape": newshape})))


@register_op
class Transpose(TransformOp):
    name = "transpose"
    doc = "Permute the axes: output axis i is input axis axes[i] (None reverses them)."
    attrs = {"axes": Attr("ints", optional=True, doc="a permutation; None reverses the axes")}

    def permutation(self, ndim: int, axes: tuple[int, ...] | None) -> tuple[int, ...]:
        if axes is None:
            return tuple(reversed(range(ndim)))
        if len(axes) != ndim:
            raise self.type_error(f"attribute 'axes'={axes} has {len(axes)} entries but data "
                                  f"has rank {ndim}; give a permutation of 0..{ndim - 1}")
        return normalize_axes(self, axes, ndim, "axes")

    def out_shape(self, shape: tuple[int, ...], attrs: Attrs) -> tuple[int, ...]:
        return tuple(shape[a] for a in self.permutation(len(shape), attrs.axes))

    def reference(self, data: np.ndarray, axes: tuple[int, ...] | None) -> np.ndarray:
        return np.transpose(data, self.permutation(data.ndim, axes))


@register_op
class Squeeze(TransformOp):
    name = "squeeze"
    doc = "Remove size-1 axes: those named by ``axis``, or every one for None."
    attrs = {"axis": Attr("ints", optional=True, doc="size-1 axes to remove; None: all of them")}

    def squeezed(self, shape: tuple[int, ...], axis: tuple[int, ...] | None) -> tuple[int, ...]:
        if axis is None:
            return tuple(a for a, dim in enumerate(shape) if dim == 1)
        axes = normalize_axes(self, axis, len(shape))
        for a in axes:
            if shape[a] != 1:
                raise self.type_error(f"attribute 'axis'={axis} names axis {a} of data {shape}, "
                                      f"which has size {shape[a]}; only size-1 axes can be "
                                      "squeezed (reshape to drop others)")
        return axes

    def out_shape(self, shape: tuple[int, ...], attrs: Attrs) -> tuple[int, ...]:
        axes = self.squeezed(shape, attrs.axis)
        return tuple(dim for a, dim in enumerate(shape) if a not in axes)

    def reference(self, data: np.ndarray, axis: tuple[int, ...] | None) -> np.ndarray:
        return np.squeeze(data, axis=self.squeezed(data.shape, axis))


@register_op
class ExpandDims(TransformOp):
    name = "expand_dims"
    doc = "Insert ``num_newaxis`` size-1 axes at position ``axis``."
    attrs = {
        "axis": Attr("int", required=True, doc="where the new axes go, in -ndim-1..ndim"),
        "num_newaxis": Attr("int", 1, doc="how many size-1 axes to insert"),
    }

    def out_shape(self, shape: tuple[int, ...], attrs: Attrs) -> tuple[int, ...]:
        ndim, axis = len(shape), attrs.axis
        if not -ndim - 1 <= axis <= ndim:
            raise self.type_error(f"attribute 'axis'={axis} is out of range for data {shape}; "
                                  f"use {-ndim - 1}..{ndim}")
        if attrs.num_newaxis < 0:
            raise self.type_error(f"attribute 'num_newaxis'={attrs.num_newaxis} must be >= 0")
        at = axis + ndim + 1 if axis < 0 else axis
        return shape[:at] + (1,) * attrs.num_newaxis + shape[at:]

    def reference(self, data: np.ndarray, axis: int, num_newaxis: int) -> np.ndarray:
        attrs = Attrs({"axis": axis, "num_newaxis": num_newaxis})
        return data.reshape(self.out_shape(data.shape, attrs))


@register_op
class Flatten(TransformOp):
    name = "flatten"
    doc = "ONNX Flatten: a 2-D result (prod(shape[:axis]), prod(shape[axis:]))."
    attrs = {"axis": Attr("int", 1, doc="the first axis of the second output dim, -ndim..ndim")}

    def out_shape(self, shape: tuple[int, ...], attrs: Attrs) -> tuple[int, ...]:
        ndim, axis = len(shape), attrs.axis
        if not -ndim <= axis <= ndim:
            raise self.type_error(f"attribute 'axis'={axis} is out of range for data {shape}; "
                                  f"use {-ndim}..{ndim}")
        at = axis + ndim if axis < 0 else axis
        return (shape_size(shape[:at]), shape_size(shape[at:]))

    def reference(self, data: np.ndarray, axis: int) -> np.ndarray:
        return data.reshape(self.out_shape(data.shape, Attrs({"axis": axis})))


@register_op
class Concatenate(Op):
    name = "concatenate"
    doc = "Join a tuple of tensors along ``axis``; every other dimension must match."
    inputs = ("data",)
    tuple_input = True
    pattern = OpPatternKind.kInjective
    attrs = {"axis": Attr("int", 0, doc="the axis to join along")}

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        fields = self.expect_tensors(arg_types)
        names = [f"data[{i}]" for i in range(len(fields))]
        dtype = same_dtype(self, fields, names)
        first = fields[0]
        if first.ndim == 0:
            raise self.type_error("data[0] is a scalar; scalars cannot be concatenated "
                                  "(expand_dims them first)")
        axis = normalize_axis(self, attrs.axis, first.ndim)
        total = 0
        for name, field in zip(names, fields):
            if field.ndim != first.ndim:
                raise self.type_error(f"{name} has shape {field.shape} but data[0] has "
                                      f"{first.shape}; all inputs need the same rank")
            others = [d for i, d in enumerate(field.shape) if i != axis]
            if others != [d for i, d in enumerate(first.shape) if i != axis]:
                raise self.type_error(f"{name} has shape {field.shape} but data[0] has "
                                      f"{first.shape}; every dimension except 'axis'={axis} "
                                      "must match")
            total += field.shape[axis]
        shape = first.shape[:axis] + (total,) + first.shape[axis + 1:]
        return TensorType(shape, dtype)

    def reference(self, data: tuple[np.ndarray, ...], axis: int) -> np.ndarray:
        return np.concatenate(data, axis=axis)


class _IntOrInts(Attr):
    """An attribute that is either one int or a list of ints, kept apart (split's
    ``indices_or_sections``): ``3`` stays ``3`` while ``[3]`` becomes ``(3,)``. The ``ints``
    kind alone would turn both into ``(3,)``."""

    def normalize(self, value: Any, where: str) -> Any:
        if isinstance(value, (int, float, np.integer, np.floating)):
            return Attr("int").normalize(value, where)
        return super().normalize(value, where)


@register_op
class Split(Op):
    name = "split"
    doc = "Split along ``axis`` into equal sections (an int) or at the given indices (a list)."
    inputs = ("data",)
    pattern = OpPatternKind.kInjective
    attrs = {
        "indices_or_sections": _IntOrInts("ints", required=True,
                                          doc="a count of equal parts, or split indices"),
        "axis": Attr("int", 0, doc="the axis to split"),
    }

    def sizes(self, shape: tuple[int, ...], attrs: Attrs) -> tuple[int, list[int]]:
        axis = normalize_axis(self, attrs.axis, len(shape))
        dim, spec = shape[axis], attrs.indices_or_sections
        if isinstance(spec, int):
            if spec < 1:
                raise self.type_error(f"attribute 'indices_or_sections'={spec} must be a "
                                      "positive count of sections")
            if dim % spec:
                raise self.type_error(f"axis {axis} of data {shape} has size {dim}, which does "
                                      f"not divide into 'indices_or_sections'={spec} equal parts;"
                                      " give split indices instead")
            return axis, [dim // spec] * spec
        bounds = [0, *spec, dim]
        for lo, hi in zip(bounds, bounds[1:]):
            if not 0 <= lo <= hi <= dim:
                raise self.type_error(f"attribute 'indices_or_sections'={spec} must be "
                                      f"non-decreasing indices in 0..{dim} (axis {axis} of data "
                                      f"{shape})")
        return axis, [hi - lo for lo, hi in zip(bounds, bounds[1:])]

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        (data,) = self.expect_tensors(arg_types)
        axis, sizes = self.sizes(data.shape, attrs)
        return TupleType([TensorType(data.shape[:axis] + (size,) + data.shape[axis + 1:],
                                     data.dtype) for size in sizes])

    def reference(self, data: np.ndarray, indices_or_sections: Any, axis: int) -> tuple:
        return tuple(np.split(data, indices_or_sections, axis=axis))


@register_op
class StridedSlice(TransformOp):
    name = "strided_slice"
    doc = "data[begin:end:strides] on ``axes`` (default the leading ones), clamped as ONNX Slice."
    attrs = {
        "begin": Attr("ints", required=True,
                      doc="first index per sliced axis (negative: from the end)"),
        "end": Attr("ints", required=True, doc="stop index per sliced axis, exclusive, clamped"),
        "strides": Attr("ints", optional=True, doc="step per sliced axis (default 1)"),
        "axes": Attr("ints", optional=True, doc="the sliced axes (default 0..len(begin)-1)"),
    }

    def slices(self, shape: tuple[int, ...], attrs: Mapping[str, Any]) -> tuple[slice, ...]:
        begin, end, strides, axes = attrs["begin"], attrs["end"], attrs["strides"], attrs["axes"]
        count = len(begin)
        for key, value in (("end", end), ("strides", strides), ("axes", axes)):
            if value is not None and len(value) != count:
                raise self.type_error(f"attribute {key!r}={value} has {len(value)} entries but "
                                      f"'begin'={begin} has {count}; give one per sliced axis")
        if axes is None:
            if count > len(shape):
                raise self.type_error(f"attribute 'begin'={begin} slices {count} axes but data "
                                      f"{shape} has rank {len(shape)}")
            axes = tuple(range(count))
        axes = normalize_axes(self, axes, len(shape), "axes")
        strides = strides or (1,) * count
        result = [slice(None)] * len(shape)
        for axis, lo, hi, step in zip(axes, begin, end, strides):
            if step == 0:
                raise self.type_error(f"attribute 'strides'={strides} has a 0 step; steps are "
                                      "non-zero")
            # Python slices clamp exactly as ONNX Slice does: negative indices count from the
            # end, then begin/end are clamped to [0, dim] (step > 0) or [-1, dim-1] (step < 0).
            result[axis] = slice(lo, hi, step)
        return tuple(result)

    def out_shape(self, shape: tuple[int, ...], attrs: Attrs) -> tuple[int, ...]:
        slices = self.slices(shape, attrs)
        return tuple(len(range(*s.indices(dim))) for s, dim in zip(slices, shape))

    def reference(self, data: np.ndarray, **attrs: Any) -> np.ndarray:
        return data[self.slices(data.shape, attrs)]



def _check_indices(op: Op, indices: TensorType) -> None:
    if indices.dtype not in _INDEX_DTYPES:
        raise op.type_error(f"input 'indices' must be int32 or int64, got {indices.dtype}; "
                            "cast it")


def check_in_range(indices: np.ndarray, bounds: Sequence[int], where: str) -> None:
    """Raise :class:`IndexOutOfRangeError` naming ``where`` unless every index lies in
    [-n, n) for its bound n (ONNX Gather's range: negative indices count from the end).
    One bound covers every index; several are one per position of the last axis (GatherND's
    index tuples)."""
    idx = np.asarray(indices)
    if idx.size == 0:
        return
    if len(bounds) == 1:
        # The common case, run before every checked gather of a compiled model: two
        # reductions over the indices and no temporary arrays while all is well.
        bound = int(bounds[0])
        if -bound <= int(idx.min()) and int(idx.max()) < bound:
            return
    idx = idx.astype(np.int64, copy=False)
    limits = np.asarray(bounds, np.int64)
    limits = limits.reshape(()) if limits.size == 1 else np.broadcast_to(limits, idx.shape)
    bad = (idx < -limits) | (idx >= limits)
    if bad.any():
        position = tuple(int(p) for p in np.argwhere(bad)[0])
        bound = int(limits[position] if limits.ndim else limits)
        raise IndexOutOfRangeError(
            f"{where}: index {int(idx[position])} at position {position} is out of range for "
            f"an axis of size {bound}; indices must lie in [{-bound}, {bound - 1}]")


def checked_index_context(op_name: str, axis: int | None) -> str:
    """How an out-of-range error of a checked ``op_name`` along ``axis`` starts: the same
    words whether the reference raises or a compiled model's ``check_indices`` does."""
    return f"{op_name} along axis {axis} (mode 'checked'; 'clip' would clamp)"


def _resolve_indices(indices: np.ndarray, size: int, wrap: bool = False) -> np.ndarray:
    """Negative indices count from the end (ONNX Gather); the rest wrap or clamp into range."""
    idx = indices.astype(np.int64)
    if size == 0:
        return idx
    if wrap:
        return np.mod(idx, size)
    return np.clip(np.where(idx < 0, idx + size, idx), 0, size - 1)


_INDEX_MODE_DOC = ("out-of-range indices (beyond [-n, n)): 'checked' raises "
                   "IndexOutOfRangeError in the reference, 'clip' clamps them")


@register_op
class Take(Op):
    name = "take"
    doc = ("Gather slices of data along ``axis`` (flattened for None) at ``indices``; negative "
           "indices count from the end as ONNX Gather. An index beyond [-n, n) is an error "
           "(mode 'checked', the default, as ONNX Runtime) unless mode clamps or wraps it. "
           "Compiled kernels cannot stop with an error, so before fusion the "
           "LegalizeCheckedIndices pass checks constant indices at compile time, puts those "
           "computed at run time through ``check_indices`` and lets the kernel clamp.")
    inputs = ("data", "indices")
    pattern = OpPatternKind.kInjective
    attrs = {
        "axis": Attr("int", optional=True, doc="the axis indexed; None indexes the flat tensor"),
        "mode": Attr("str", "checked", choices=("checked", "clip", "wrap", "fast"),
                     doc="out-of-range indices: an error (checked), clamp, wrap around, or "
                         "assume none (undefined)"),
    }

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        data, indices = self.expect_tensors(arg_types)
        _check_indices(self, indices)
        if attrs.axis is None:
            shape, size = indices.shape, data.size
        else:
            axis = normalize_axis(self, attrs.axis, data.ndim)
            shape = data.shape[:axis] + indices.shape + data.shape[axis + 1:]
            size = data.shape[axis]
        if size == 0 and indices.size:
            raise self.type_error(f"cannot take from data {data.shape} along 'axis'={attrs.axis}"
                                  ": it has no elements there")
        return TensorType(shape, data.dtype)

    def reference(self, data: np.ndarray, indices: np.ndarray, axis: int | None,
                  mode: str) -> np.ndarray:
        # "fast" promises in-range indices; the reference clamps so it stays defined.
        source = data.reshape(-1) if axis is None else data
        along = 0 if axis is None else axis % data.ndim
        if mode == "checked":
            check_in_range(indices, [source.shape[along]], checked_index_context("take", axis))
        idx = _resolve_indices(indices, source.shape[along], wrap=mode == "wrap")
        return np.take(source, idx, axis=along)


@register_op
class GatherElements(Op):
    name = "gather_elements"
    doc = ("ONNX GatherElements: out[i][j] = data[indices[i][j]][j] for axis 0; the result has "
           "the indices' shape. Out-of-range indices are an error (mode 'checked'; compiled "
           "models check them before the kernel: see take) or clamped (mode 'clip').")
    inputs = ("data", "indices")
    pattern = OpPatternKind.kInjective
    attrs = {"axis": Attr("int", 0, doc="the axis the indices select along"),
             "mode": Attr("str", "checked", choices=("checked", "clip"), doc=_INDEX_MODE_DOC)}

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        data, indices = self.expect_tensors(arg_types)
        _check_indices(self, indices)
        if indices.ndim != data.ndim:
            raise self.type_error(f"input 'indices' {indices.shape} must have the rank of data "
                                  f"{data.shape}")
        axis = normalize_axis(self, attrs.axis, data.ndim)
        for a, (have, want) in enumerate(zip(data.shape, indices.shape)):
            if a != axis and want > have:
                raise self.type_error(f"input 'indices' {indices.shape} is larger than data "
                                      f"{data.shape} in dimension {a}, which is not 'axis'="
                                      f"{attrs.axis}; it may only be smaller there")
        if data.shape[axis] == 0 and indices.size:
            raise self.type_error(f"cannot gather from data {data.shape} along 'axis'="
                                  f"{attrs.axis}: it has no elements there")
        return TensorType(indices.shape, data.dtype)

    def reference(self, data: np.ndarray, indices: np.ndarray, axis: int,
                  mode: str) -> np.ndarray:
        axis %= data.ndim
        if mode == "checked":
            check_in_range(indices, [data.shape[axis]],
                           checked_index_context("gather_elements", axis))
        grid = list(np.indices(indices.shape, sparse=True))
        grid[axis] = _resolve_indices(indices, data.shape[axis])  # clip mode: clamped
        return data[tuple(grid)]


@register_op
class CheckIndices(Op):
    name = "check_indices"
    doc = ("The indices, unchanged, once every one is known to lie in [-n, n) for its bound "
           "n; IndexOutOfRangeError naming ``consumer`` otherwise. It has no TE compute, so a "
           "compiled model runs it with NumPy between kernels: this is how an out-of-range "
           "index computed at run time stops a compiled take or gather as it stops the "
           "reference (a kernel cannot report an error).")
    inputs = ("indices",)
    pattern = OpPatternKind.kOpaque
    attrs = {
        "bounds": Attr("ints", required=True,
                       doc="the size of the indexed axis; or one size per position of the "
                           "indices' last axis (GatherND's index tuples)"),
        "consumer": Attr("str", "", doc="what the indices index, for the error message"),
    }

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        (indices,) = self.expect_tensors(arg_types)
        _check_indices(self, indices)
        bounds = attrs.bounds
        if min(bounds, default=0) < 0 or not bounds:
            raise self.type_error(f"attribute 'bounds'={bounds} must be one or more "
                                  "non-negative axis sizes")
        if len(bounds) > 1 and (indices.ndim == 0 or indices.shape[-1] != len(bounds)):
            raise self.type_error(f"attribute 'bounds'={bounds} gives one size per position of "
                                  f"the last axis, but indices {indices.shape} have "
                                  f"{indices.shape[-1] if indices.ndim else 'no'} there")
        return indices

    def reference(self, indices: np.ndarray, bounds: tuple[int, ...],
                  consumer: str) -> np.ndarray:
        check_in_range(indices, bounds, consumer or "check_indices")
        return indices


@register_op
class BroadcastTo(TransformOp):
    name = "broadcast_to"
    doc = "Repeat data along size-1 (or missing leading) axes to ``shape``, as NumPy does."
    pattern = OpPatternKind.kBroadcast
    attrs = {"shape": Attr("ints", required=True, doc="the target shape")}

    def out_shape(self, shape: tuple[int, ...], attrs: Attrs) -> tuple[int, ...]:
        target = attrs.shape
        if any(dim < 0 for dim in target) or len(target) < len(shape):
            raise self.type_error(f"data {shape} cannot be broadcast to 'shape'={target}; the "
                                  "target needs at least data's rank and non-negative sizes")
        for index in range(1, len(shape) + 1):
            have, want = shape[-index], target[-index]
            if have not in (1, want):
                raise self.type_error(f"data {shape} cannot be broadcast to 'shape'={target}: "
                                      f"dimension {len(shape) - index} has size {have}, not 1 "
                                      f"or {want}")
        return target

    def reference(self, data: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return np.broadcast_to(data, shape)


@register_op
class Tile(TransformOp):
    name = "tile"
    doc = "Repeat the whole tensor reps[i] times along axis i, as numpy.tile."
    attrs = {"reps": Attr("ints", required=True, doc="repetitions per axis (aligned right)")}

    def out_shape(self, shape: tuple[int, ...], attrs: Attrs) -> tuple[int, ...]:
        reps = attrs.reps
        if any(r < 0 for r in reps):
            raise self.type_error(f"attribute 'reps'={reps} must be non-negative")
        rank = max(len(shape), len(reps))
        shape = (1,) * (rank - len(shape)) + shape
        reps = (1,) * (rank - len(reps)) + reps
        return tuple(d * r for d, r in zip(shape, reps))

    def reference(self, data: np.ndarray, reps: tuple[int, ...]) -> np.ndarray:
        return np.tile(data, reps)


@register_op
class Arange(Op):
    name = "arange"
    doc = "The 1-D sequence start, start + step, ... stopping before ``stop`` (ONNX Range)."
    inputs = ()
    pattern = OpPatternKind.kInjective
    attrs = {
        "start": Attr("float", 0.0, doc="the first value"),
        "stop": Attr("float", required=True, doc="the bound, excluded"),
        "step": Attr("float", 1.0, doc="the increment, non-zero"),
        "dtype": Attr("dtype", "float32", doc="the result dtype"),
    }

    def count(self, start: float, stop: float, step: float) -> int:
        """max(ceil((stop - start) / step), 0); exact in integers when all three are whole
        numbers (a float quotient rounds large spans)."""
        if all(float(v).is_integer() for v in (start, stop, step)):
            return max(-((int(start) - int(stop)) // int(step)), 0)  # ceil division
        return max(math.ceil((stop - start) / step), 0)

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        self.expect_tensors(arg_types)
        start, stop, step = attrs.start, attrs.stop, attrs.step
        values = {"start": start, "stop": stop, "step": step}
        for key, value in values.items():
            if not math.isfinite(value):
                raise self.type_error(f"attribute {key!r}={value} must be finite")
        if step == 0:
            raise self.type_error("attribute 'step'=0 never reaches 'stop'; give a non-zero step")
        if attrs.dtype == "bool":
            raise self.type_error("attribute 'dtype'=bool is not a number type")
        if is_int(attrs.dtype):
            for key, value in values.items():
                if not float(value).is_integer():
                    raise self.type_error(f"attribute {key!r}={value} is not an integer but "
                                          f"'dtype' is {attrs.dtype}; use a float dtype")
        return TensorType((self.count(start, stop, step),), attrs.dtype)

    def reference(self, start: float, stop: float, step: float, dtype: str) -> np.ndarray:
        return start + step * np.arange(self.count(start, stop, step), dtype=np.float64)


def _nchw(op: Op, data: TensorType) -> tuple[int, int, int, int]:
    if data.ndim != 4:
        raise op.type_error(f"input 'data' must be 4-D NCHW, got shape {data.shape}")
    return data.shape  # type: ignore[return-value]


@register_op
class DepthToSpace(TransformOp):
    name = "depth_to_space"
    doc = "ONNX DepthToSpace on NCHW: move channel blocks into block_size x block_size pixels."
    attrs = {
        "block_size": Attr("int", required=True, doc="the side of each spatial block"),
        "mode": Attr("str", "DCR", choices=("DCR", "CRD"),
                     doc="channel order: depth-column-row (DCR) or column-row-depth (CRD)"),
    }

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        (data,) = self.expect_tensors(arg_types)
        n, c, h, w = _nchw(self, data)
        b = attrs.block_size
        if b < 1 or c % (b * b):
            raise self.type_error(f"data {data.shape} has {c} channels, which 'block_size'={b} "
                                  f"cannot split into {b}x{b} blocks; it must divide by {b * b}")
        return TensorType((n, c // (b * b), h * b, w * b), data.dtype)

    def reference(self, data: np.ndarray, block_size: int, mode: str) -> np.ndarray:
        n, c, h, w = data.shape
        b = block_size
        if mode == "DCR":
            blocks = data.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
        else:
            blocks = data.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
        return blocks.reshape(n, c // (b * b), h * b, w * b)


@register_op
class SpaceToDepth(TransformOp):
    name = "space_to_depth"
    doc = "ONNX SpaceToDepth on NCHW: fold block_size x block_size pixels into channels."
    attrs = {
        "block_size": Attr("int", required=True, doc="the side of each spatial block"),
        "mode": Attr("str", "DCR", choices=("DCR", "CRD"),
                     doc="channel order: block offset then depth (DCR) or depth then block "
                         "offset (CRD, ONNX opset 28)"),
    }

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        (data,) = self.expect_tensors(arg_types)
        n, c, h, w = _nchw(self, data)
        b = attrs.block_size
        if b < 1 or h % b or w % b:
            raise self.type_error(f"data {data.shape} has spatial size {h}x{w}, which "
                                  f"'block_size'={b} does not divide; pad or resize it first")
        return TensorType((n, c * b * b, h // b, w // b), data.dtype)

    def reference(self, data: np.ndarray, block_size: int, mode: str) -> np.ndarray:
        n, c, h, w = data.shape
        b = block_size
        blocks = data.reshape(n, c, h // b, b, w // b, b)
        order = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
        return blocks.transpose(order).reshape(n, c * b * b, h // b, w // b)


@register_op
class Reverse(TransformOp):
    name = "reverse"
    doc = "Reverse the order of elements along ``axis``."
    attrs = {"axis": Attr("int", required=True, doc="the axis to reverse")}

    def out_shape(self, shape: tuple[int, ...], attrs: Attrs) -> tuple[int, ...]:
        normalize_axis(self, attrs.axis, len(shape))
        return shape

    def reference(self, data: np.ndarray, axis: int) -> np.ndarray:
        return np.flip(data, axis=axis)


@register_op
class LayoutTransform(TransformOp):
    name = "layout_transform"
    doc = ("The same tensor in another layout of the same primal axes: NCHW <-> NCHW16c, "
           "NCHW8c -> NCHW16c, OIHW -> OIHW16i16o (see opfusion.ir.layout); every blocked "
           "axis must be a multiple of its block.")
    attrs = {
        "src_layout": Attr("str", required=True, doc="the input's layout, e.g. 'NCHW'"),
        "dst_layout": Attr("str", required=True, doc="the result's layout, e.g. 'NCHW16c'"),
    }

    def layouts(self, ndim: int, attrs: Attrs | Mapping[str, Any]) -> tuple[Layout, Layout]:
        """The parsed (source, destination) layouts, checked against each other and a rank."""
        try:
            src, dst = Layout.parse(attrs["src_layout"]), Layout.parse(attrs["dst_layout"])
            check_compatible(src, dst)
        except LayoutError as err:
            raise self.type_error(str(err)) from None
        if src.ndim != ndim:
            raise self.type_error(f"data has rank {ndim} but attribute 'src_layout'="
                                  f"{src.name!r} has {src.ndim} axes")
        return src, dst

    def out_shape(self, shape: tuple[int, ...], attrs: Attrs) -> tuple[int, ...]:
        src, dst = self.layouts(len(shape), attrs)
        for (letter, size), extent in zip(src.axes, shape):
            if size and extent != size:
                raise self.type_error(f"data {shape} does not fit attribute 'src_layout'="
                                      f"{src.name!r}: its block {size}{letter.lower()} has "
                                      f"{extent} elements")
        extents = src.primal_shape(shape)
        try:
            return dst.shape([extents[a] for a in src.primal], src.primal)
        except LayoutError as err:
            raise self.type_error(f"data {shape}: {err}") from None

    def reference(self, data: np.ndarray, src_layout: str, dst_layout: str) -> np.ndarray:
        src, dst = self.layouts(data.ndim, {"src_layout": src_layout, "dst_layout": dst_layout})
        return transform_array(data, src, dst)


@register_op
class ChannelShuffle(TransformOp):
    name = "channel_shuffle"
    doc = ("ShuffleNet's channel shuffle of NCHW or blocked NCHW<k>c data: output channel "
           "j * groups + i is input channel i * (C / groups) + j, the reshape (N, groups, "
           "C/groups, H, W) -> transpose -> reshape that models spell it with, as one "
           "layout-aware permutation.")
    attrs = {
        "groups": Attr("int", required=True, doc="the number of channel groups"),
        "layout": Attr("str", "NCHW", doc="NCHW or NCHW<k>c"),
    }

    def layout_of(self, ndim: int, text: str) -> Layout:
        try:
            layout = Layout.parse(text)
        except LayoutError as err:
            raise self.type_error(f"attribute 'layout': {err}") from None
        if layout.primal != "NCHW" or layout.ndim != ndim or any(
                size and letter != "C" for letter, size in layout.axes):
            raise self.type_error(f"attribute 'layout'={text!r} must be NCHW or NCHW<k>c for "
                                  f"data of rank {ndim}")
        return layout

    def out_shape(self, shape: tuple[int, ...], attrs: Attrs) -> tuple[int, ...]:
        layout = self.layout_of(len(shape), attrs.layout)
        channels = layout.primal_shape(shape)["C"]
        if attrs.groups < 1 or channels % attrs.groups:
            raise self.type_error(f"data {shape} has {channels} channels, which "
                                  f"'groups'={attrs.groups} does not divide")
        return shape

    @staticmethod
    def source_channel(channel: Any, channels: int, groups: int) -> Any:
        """The input channel that output ``channel`` reads (ints or TE expressions)."""
        return channel % groups * (channels // groups) + channel // groups

    def reference(self, data: np.ndarray, groups: int, layout: str) -> np.ndarray:
        blocked = self.layout_of(data.ndim, layout)
        plain = Layout.parse("NCHW")
        x = transform_array(data, blocked, plain)
        n, c, h, w = x.shape
        shuffled = x.reshape(n, groups, c // groups, h, w).transpose(0, 2, 1, 3, 4)
        return transform_array(shuffled.reshape(n, c, h, w), plain, blocked)
