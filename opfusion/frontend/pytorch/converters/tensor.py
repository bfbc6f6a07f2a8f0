"""Converters of ATen's shape and data-movement operators: views and reshapes, permutes,
slicing and indexing, concatenation and splitting, padding, and the factories (``full``,
``arange``) an exported graph builds masks and positions with."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .... import op
from ....ir.expr import Constant, Expr
from ..registry import AtenNode, converter
from ._common import as_dtype, dim, filled, index_range, number, operand, shape_of, tensor_type

# ---------------------------------------------------------------------------------------------
# views


@converter("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default",
           "aten.view_copy.default")
def view(node: AtenNode) -> Expr:
    x = node.tensor("self")
    size = node.ints("size" if "size" in node.values else "shape")
    total = math.prod(shape_of(x))
    if size.count(-1) > 1:
        raise node.error(f"size {size} has more than one -1")
    if -1 in size:
        known = math.prod(d for d in size if d != -1)
        if known == 0 or total % known:
            raise node.error(f"cannot view a tensor of shape {shape_of(x)} as {size}")
        size[size.index(-1)] = total // known
    if math.prod(size) != total:
        raise node.error(f"cannot view a tensor of shape {shape_of(x)} as {size}")
    return op.reshape(x, newshape=size)


@converter("aten.permute.default", "aten.permute_copy.default")
def permute(node: AtenNode) -> Expr:
    x = node.tensor("self")
    ndim = len(shape_of(x))
    axes = [dim(node, d, ndim) for d in node.ints("dims")]
    return x if axes == list(range(ndim)) else op.transpose(x, axes=axes)


@converter("aten.t.default")
def t(node: AtenNode) -> Expr:
    x = node.tensor("self")
    return op.transpose(x, axes=[1, 0]) if len(shape_of(x)) == 2 else x


@converter("aten.transpose.int")
def transpose(node: AtenNode) -> Expr:
    x = node.tensor("self")
    ndim = len(shape_of(x))
    axes = list(range(ndim))
    a, b = dim(node, node.get("dim0"), ndim), dim(node, node.get("dim1"), ndim)
    axes[a], axes[b] = axes[b], axes[a]
    return x if a == b else op.transpose(x, axes=axes)


@converter("aten.expand.default", "aten.expand_copy.default")
def expand(node: AtenNode) -> Expr:
    x = node.tensor("self")
    shape = shape_of(x)
    size = node.ints("size")
    lead = len(size) - len(shape)
    if lead < 0:
        raise node.error(f"cannot expand a tensor of shape {shape} to fewer dims {size}")
    want = [shape[i - lead] if s == -1 else s for i, s in enumerate(size)]
    return x if tuple(want) == shape else op.broadcast_to(x, shape=want)


@converter("aten.unsqueeze.default", "aten.unsqueeze_copy.default")
def unsqueeze(node: AtenNode) -> Expr:
    x = node.tensor("self")
    return op.expand_dims(x, axis=dim(node, node.get("dim"), len(shape_of(x)) + 1))


@converter("aten.squeeze.dims", "aten.squeeze.dim", "aten.squeeze.default",
           "aten.squeeze_copy.dims")
def squeeze(node: AtenNode) -> Expr:
    x = node.tensor("self")
    shape = shape_of(x)
    chosen = node.values.get("dim")
    if chosen is None:
        chosen = list(range(len(shape)))
    chosen = chosen if isinstance(chosen, (list, tuple)) else [chosen]
    axes = sorted({dim(node, d, len(shape)) for d in chosen} if shape else set())
    ones = [a for a in axes if shape[a] == 1]  # torch leaves a dim that is not 1 as it is
    return op.squeeze(x, axis=ones) if ones else x


@converter("aten.clone.default", "aten.alias.default", "aten.detach.default",
           "aten.lift_fresh_copy.default", "aten.lift_fresh.default", "aten.contiguous.default",
           "aten.alias_copy.default")
def identity(node: AtenNode) -> Expr:
    return node.tensor("self")


@converter("aten._to_copy.default", "aten.to.dtype", "aten._to_dim_order_copy.default")
def to_copy(node: AtenNode) -> Expr:
    return as_dtype(node.tensor("self"), node.dtype)


@converter("aten.as_strided.default", "aten.as_strided_copy.default")
def as_strided(node: AtenNode) -> Expr:
    """A strided view of the (contiguous) input's storage, as a gather of the flat input."""
    x = node.tensor("self")
    size, stride = node.ints("size"), node.ints("stride")
    offset = int(node.get("storage_offset", 0))
    index = np.full(size, offset, dtype=np.int64)
    for axis, (extent, step) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[axis] = extent
        index = index + (np.arange(extent, dtype=np.int64) * step).reshape(shape)
    total = math.prod(shape_of(x))
    if index.size and (index.min() < 0 or index.max() >= total):
        raise node.error(f"size {size}, stride {stride} and offset {offset} read outside "
                         f"the input's {total} elements")
    if offset == 0 and index.size == total and np.array_equal(index.reshape(-1),
                                                               np.arange(total)):
        return op.reshape(x, newshape=size)  # the input itself, in another shape
    return op.take(op.reshape(x, newshape=[total]), Constant(index), axis=0)


# ---------------------------------------------------------------------------------------------
# slicing, indexing, concatenation


def _clamped(start: Any, end: Any, extent: int) -> tuple[int, int]:
    """A slice's start and end as torch reads them: None as the ends, negative from the
    end, clamped to the axis."""
    start = 0 if start is None else int(start)
    end = extent if end is None else int(end)
    start = max(0, min(extent, start + extent if start < 0 else start))
    end = max(0, min(extent, end + extent if end < 0 else end))
    return start, max(start, end)


@converter("aten.slice.Tensor", "aten.slice_copy.Tensor")
def slice_(node: AtenNode) -> Expr:
    x = node.tensor("self")
    shape = shape_of(x)
    axis = dim(node, node.get("dim", 0), len(shape))
    step = int(node.get("step", 1))
    if step < 1:
        raise node.error(f"step={step} must be positive")
    start, end = _clamped(node.values.get("start"), node.values.get("end"), shape[axis])
    if (start, end, step) == (0, shape[axis], 1):
        return x
    return op.strided_slice(x, begin=[start], end=[end], strides=[step], axes=[axis])


@converter("aten.select.int", "aten.select_copy.int")
def select(node: AtenNode) -> Expr:
    x = node.tensor("self")
    shape = shape_of(x)
    axis = dim(node, node.get("dim"), len(shape))
    index = int(node.get("index"))
    if not -shape[axis] <= index < shape[axis]:
        raise node.error(f"index {index} is out of range for dim {axis} of size {shape[axis]}")
    index %= shape[axis]
    part = op.strided_slice(x, begin=[index], end=[index + 1], axes=[axis])
    return op.squeeze(part, axis=[axis])


@converter("aten.cat.default", "aten.concat.default")
def cat(node: AtenNode) -> Expr:
    tensors = [as_dtype(t, node.dtype) for t in node.tensors("tensors")]
    # torch skips legacy empty 1-D tensors in a concatenation of higher-rank ones
    ndim = max(len(shape_of(t)) for t in tensors)
    tensors = [t for t in tensors if not (shape_of(t) == (0,) and ndim > 1)]
    axis = dim(node, node.get("dim", 0), ndim)
    return tensors[0] if len(tensors) == 1 else op.concatenate(tensors, axis=axis)


def _split_at(node: AtenNode, x: Expr, sizes: list[int], axis: int) -> tuple[Expr, ...]:
    extent = shape_of(x)[axis]
    if sum(sizes) != extent or min(sizes, default=0) < 0:
        raise node.error(f"split sizes {sizes} do not add up to dim {axis}'s size {extent}")
    if len(sizes) == 1:
        return (x,)
    parts, start = [], 0
    for size in sizes:  # slices rather than split: empty parts and their shapes stay exact
        parts.append(op.strided_slice(x, begin=[start], end=[start + size], axes=[axis]))
        start += size
    return tuple(parts)


@converter("aten.split_with_sizes.default", "aten.split_with_sizes_copy.default")
def split_with_sizes(node: AtenNode) -> tuple[Expr, ...]:
    x = node.tensor("self")
    axis = dim(node, node.get("dim", 0), len(shape_of(x)))
    return _split_at(node, x, node.ints("split_sizes"), axis)


@converter("aten.split.Tensor", "aten.split_copy.Tensor")
def split(node: AtenNode) -> tuple[Expr, ...]:
    x = node.tensor("self")
    axis = dim(node, node.get("dim", 0), len(shape_of(x)))
    size, extent = int(node.get("split_size")), shape_of(x)[axis]
    if size <= 0:
        raise node.error(f"split_size={size} must be positive")
    sizes = [min(size, extent - start) for start in range(0, extent, size)] or [0]
    return _split_at(node, x, sizes, axis)


@converter("aten.unbind.int", "aten.unbind_copy.int")
def unbind(node: AtenNode) -> tuple[Expr, ...]:
    x = node.tensor("self")
    axis = dim(node, node.get("dim", 0), len(shape_of(x)))
    parts = _split_at(node, x, [1] * shape_of(x)[axis], axis)
    return tuple(op.squeeze(part, axis=[axis]) for part in parts)


@converter("aten.index_select.default")
def index_select(node: AtenNode) -> Expr:
    x = node.tensor("self")
    axis = dim(node, node.get("dim"), len(shape_of(x)))
    return op.take(x, as_dtype(node.tensor("index"), "int64"), axis=axis)


@converter("aten.embedding.default")
def embedding(node: AtenNode) -> Expr:
    return op.take(node.tensor("weight"), as_dtype(node.tensor("indices"), "int64"), axis=0)


@converter("aten.index.Tensor")
def index(node: AtenNode) -> Expr:
    """``x[..., idx, ...]`` with index tensors on one dim or on adjacent dims (their flat
    index gathered from the dims flattened together). Boolean masks are refused: their
    result's size depends on the values."""
    x = node.tensor("self")
    shape = shape_of(x)
    indices = list(node.values.get("indices") or [])
    used = [axis for axis, idx in enumerate(indices) if idx is not None]
    if not used:
        return x
    if any(tensor_type(indices[a]).dtype == "bool" for a in used):
        raise node.error("boolean mask indexing gives a result whose size depends on the "
                         "values; opfusion compiles static shapes")
    if used != list(range(used[0], used[-1] + 1)):
        raise node.error("index tensors on dims that are not adjacent are not supported")
    first, last = used[0], used[-1]
    flat_index: Expr | None = None
    for axis in used:
        idx = as_dtype(indices[axis], "int64")
        extent = number(shape[axis], "int64")
        idx = op.where(op.less(idx, number(0, "int64")), idx + extent, idx)
        flat_index = idx if flat_index is None else flat_index * extent + idx
    assert flat_index is not None
    merged = math.prod(shape[first:last + 1])
    data = op.reshape(x, newshape=[*shape[:first], merged, *shape[last + 1:]])
    return op.take(data, flat_index, axis=first)


@converter("aten.constant_pad_nd.default")
def constant_pad(node: AtenNode) -> Expr:
    x = node.tensor("self")
    shape = shape_of(x)
    pad = node.ints("pad")
    if len(pad) % 2 or len(pad) // 2 > len(shape):
        raise node.error(f"pad {pad} needs pairs for at most {len(shape)} dims")
    widths = [0] * (2 * len(shape))
    for pair in range(len(pad) // 2):  # pairs run from the last dim backwards
        axis = len(shape) - 1 - pair
        widths[2 * axis], widths[2 * axis + 1] = pad[2 * pair], pad[2 * pair + 1]
    crop = [(max(-b, 0), max(-a, 0)) for b, a in zip(widths[::2], widths[1::2])]
    for axis, (before, after) in enumerate(crop):  # negative pads crop
        if before or after:
            x = op.strided_slice(x, begin=[before], end=[shape[axis] - after], axes=[axis])
    grown = [max(w, 0) for w in widths]
    if not any(grown):
        return x
    value = number(node.get("value", 0), tensor_type(x).dtype)
    return op.nn.pad(x, value, pad_width=grown)


@converter("aten.flip.default")
def flip(node: AtenNode) -> Expr:
    x = node.tensor("self")
    for axis in sorted({dim(node, d, len(shape_of(x))) for d in node.ints("dims")}):
        x = op.reverse(x, axis=axis)
    return x


@converter("aten.repeat.default")
def repeat(node: AtenNode) -> Expr:
    x = node.tensor("self")
    reps = node.ints("repeats")
    lead = len(reps) - len(shape_of(x))
    if lead < 0:
        raise node.error(f"repeats {reps} has fewer dims than the tensor {shape_of(x)}")
    if lead:
        x = op.reshape(x, newshape=[1] * lead + list(shape_of(x)))
    return op.tile(x, reps=reps)


@converter("aten.copy.default")
def copy(node: AtenNode) -> Expr:
    """``self.copy_(src)`` made functional: ``src`` in ``self``'s shape and dtype."""
    target, src = node.tensor("self"), node.tensor("src")
    src = as_dtype(src, tensor_type(target).dtype)
    shape = shape_of(target)
    return src if shape_of(src) == shape else op.broadcast_to(src, shape=list(shape))


@converter("aten.slice_scatter.default")
def slice_scatter(node: AtenNode) -> Expr:
    """``self`` with ``src`` written into a slice of it: the pieces before and after the
    slice concatenated around ``src`` (step 1), or a gather (any step)."""
    x = node.tensor("self")
    shape = shape_of(x)
    axis = dim(node, node.get("dim", 0), len(shape))
    src = as_dtype(node.tensor("src"), tensor_type(x).dtype)
    start, end = _clamped(node.values.get("start"), node.values.get("end"), shape[axis])
    step = int(node.get("step", 1))
    if step == 1:
        return _replace_span(x, axis, start, end, src)
    # any step: gather every position from either x or src along the axis
    positions = np.arange(shape[axis])
    written = (positions >= start) & (positions < end) & ((positions - start) % step == 0)
    source = np.where(written, (positions - start) // step + shape[axis], positions)
    both = op.concatenate([x, src], axis=axis)
    return op.take(both, Constant(source.astype(np.int64)), axis=axis)


@converter("aten.select_scatter.default")
def select_scatter(node: AtenNode) -> Expr:
    x = node.tensor("self")
    shape = shape_of(x)
    axis = dim(node, node.get("dim"), len(shape))
    index = int(node.get("index")) % shape[axis]
    src = op.expand_dims(as_dtype(node.tensor("src"), tensor_type(x).dtype), axis=axis)
    return _replace_span(x, axis, index, index + 1, src)


def _replace_span(x: Expr, axis: int, start: int, end: int, middle: Expr) -> Expr:
    """``x`` with positions ``start:end`` of ``axis`` replaced by ``middle``: the pieces
    before and after concatenated around it."""
    extent = shape_of(x)[axis]
    pieces = [op.strided_slice(x, begin=[0], end=[start], axes=[axis])] if start > 0 else []
    pieces.append(middle)
    if end < extent:
        pieces.append(op.strided_slice(x, begin=[end], end=[extent], axes=[axis]))
    return pieces[0] if len(pieces) == 1 else op.concatenate(pieces, axis=axis)


# ---------------------------------------------------------------------------------------------
# factories


@converter("aten.full.default", "aten.new_full.default")
def full(node: AtenNode) -> Expr:
    return filled(node.ints("size"), node.get("fill_value"), node.dtype, what="a full tensor")


@converter("aten.zeros.default", "aten.new_zeros.default", "aten.empty.memory_format",
           "aten.new_empty.default")
def zeros(node: AtenNode) -> Expr:
    return filled(node.ints("size"), 0, node.dtype, what="a zeros tensor")


@converter("aten.ones.default", "aten.new_ones.default")
def ones(node: AtenNode) -> Expr:
    return filled(node.ints("size"), 1, node.dtype, what="a ones tensor")


@converter("aten.full_like.default")
def full_like(node: AtenNode) -> Expr:
    return filled(shape_of(node.tensor("self")), node.get("fill_value"), node.dtype,
                  what="a full_like tensor")


@converter("aten.zeros_like.default", "aten.empty_like.default")
def zeros_like(node: AtenNode) -> Expr:
    return filled(shape_of(node.tensor("self")), 0, node.dtype, what="a zeros_like tensor")


@converter("aten.ones_like.default")
def ones_like(node: AtenNode) -> Expr:
    return filled(shape_of(node.tensor("self")), 1, node.dtype, what="a ones_like tensor")


@converter("aten.scalar_tensor.default")
def scalar_tensor(node: AtenNode) -> Expr:
    return number(node.get("s"), node.dtype)


@converter("aten.arange.start_step", "aten.arange.default", "aten.arange.start")
def arange(node: AtenNode) -> Expr:
    start = node.get("start", 0) if "start" in node.values else 0
    end, step = node.get("end"), node.get("step", 1)
    count = max(0, math.ceil((end - start) / step))
    dtype = node.dtype
    if start == 0 and step == 1 and dtype == "int64":
        return index_range(count, what="an arange")
    values = np.arange(count, dtype=np.float64) * step + start
    return Constant(values.astype(dtype))


@converter("aten.fill.Scalar", "aten.fill.Tensor")
def fill(node: AtenNode) -> Expr:
    x = node.tensor("self")
    value = operand(node, "value", node.dtype)
    return op.broadcast_to(value, shape=list(shape_of(x)))


@converter("aten.index_put.default")
def index_put(node: AtenNode) -> Expr:
    """``x[indices] = values`` made functional, for the two forms exporters emit: a boolean
    mask of ``x``'s shape (``x[mask] = v`` with one value), and constant indices on one dim
    (``index_fill``, ``x[:, [0, 2]] = v``), the last write to a position winning."""
    x = node.tensor("self")
    shape, dtype = shape_of(x), tensor_type(x).dtype
    if node.get("accumulate", False):
        raise node.error("accumulate=True (index_put_ with +=) is not supported")
    indices = list(node.values.get("indices") or [])
    used = [axis for axis, idx in enumerate(indices) if idx is not None]
    values = as_dtype(node.tensor("values"), dtype)
    if len(used) == 1 and tensor_type(indices[used[0]]).dtype == "bool":
        mask = indices[used[0]]
        if shape_of(mask) != shape or math.prod(shape_of(values)) != 1:
            raise node.error("a boolean mask must cover the whole tensor and the value be "
                             "one number (x[mask] = v)")
        return op.where(mask, op.reshape(values, newshape=[]), x)
    if len(used) != 1 or not isinstance(indices[used[0]], Constant):
        raise node.error("index_put is supported with a boolean mask or with constant indices "
                         "on one dim")
    axis = used[0]
    positions = indices[axis].data.astype(np.int64).reshape(-1) % shape[axis]
    written = [*shape[:axis], len(positions), *shape[axis + 1:]]
    spread = op.broadcast_to(values, shape=written)
    source = np.arange(shape[axis])
    for order, position in enumerate(positions):
        source[position] = shape[axis] + order
    both = op.concatenate([x, spread], axis=axis)
    return op.take(both, Constant(source.astype(np.int64)), axis=axis)
