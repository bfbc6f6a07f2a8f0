"""TE computes of the shape and indexing transforms (opfusion/opdefs/transform.py).

Each output element reads one input element through an index map (tag "injective";
broadcast_to is "broadcast"). The maps are affine wherever the shapes allow: transpose,
slices, split, reverse, tile of a size-1 axis and the copied dimensions of a reshape use no
division; reshape divides only inside the groups of dimensions it really merges or splits
(:func:`._util.reshape_indices`). Gathers resolve their indices as the references do:
negative indices count from the end, out-of-range ones are clamped (or wrapped for
``take(mode="wrap")``), so a bad index never reads outside the tensor. Mode "checked" (the
references raise) clamps here too: a kernel cannot stop with an error, so opf.compile never
lowers a checked gather: LegalizeCheckedIndices checks constant indices at compile time, puts
those computed at run time through ``check_indices`` (run with NumPy, it has no compute) and
switches the gather to "clip"."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .. import te
from ..ir.op import get_op
from ..tir.expr import PrimExpr, is_int
from ._util import (
    axis_of,
    broadcast_indices,
    reshape_indices,
    shape_of,
    stage_name,
    unravel,
)
from .registry import register_compute

IndexMap = Callable[[Sequence[PrimExpr]], Sequence[Any]]


def injective(op_name: str, data: te.Tensor, out_shape: Sequence[int], index_map: IndexMap,
              name: str | None = None, tag: str = "injective") -> te.Tensor:
    """``out[i] = data[index_map(i)]`` over ``out_shape``."""
    return te.compute(tuple(out_shape), lambda *i: data[tuple(index_map(i))],
                      name=name or stage_name(op_name), tag=tag)


def _reshape_like(op_name: str) -> None:
    @register_compute(op_name)
    def compute(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
        data = inputs[0]
        out_shape = shape_of(out_type)
        return injective(op_name, data, out_shape,
                         lambda i: reshape_indices(i, out_shape, data.shape))

    compute.__name__ = f"compute_{op_name}"
    compute.__doc__ = f"TE compute of {op_name}: a row-major reshape."


for _name in ("reshape", "squeeze", "expand_dims", "flatten"):
    _reshape_like(_name)


@register_compute("transpose")
def compute_transpose(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """Output axis k is input axis axes[k]."""
    data = inputs[0]
    perm = get_op("transpose").permutation(data.ndim, attrs.axes)

    def index_map(i: Sequence[PrimExpr]) -> list[Any]:
        index: list[Any] = [0] * data.ndim
        for k, axis in enumerate(perm):
            index[axis] = i[k]
        return index

    return injective("transpose", data, shape_of(out_type), index_map)


@register_compute("reverse")
def compute_reverse(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """Index ``size - 1 - i`` along the reversed axis."""
    data = inputs[0]
    axis = axis_of("reverse", attrs.axis, data.ndim)
    last = data.shape[axis] - 1

    def index_map(i: Sequence[PrimExpr]) -> list[Any]:
        index = list(i)
        index[axis] = last - i[axis]
        return index

    return injective("reverse", data, shape_of(out_type), index_map)


@register_compute("strided_slice")
def compute_strided_slice(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """``start + i * step`` on each sliced axis (steps may be negative); the bounds are
    resolved and clamped at compile time exactly as the reference's Python slices."""
    data = inputs[0]
    slices = get_op("strided_slice").slices(data.shape, attrs)
    starts_steps = [s.indices(dim)[::2] for s, dim in zip(slices, data.shape)]
    return injective("strided_slice", data, shape_of(out_type),
                     lambda i: [start + step * x for x, (start, step) in zip(i, starts_steps)])


@register_compute("split")
def compute_split(inputs: list[Any], attrs: Any, out_type: Any) -> tuple[te.Tensor, ...]:
    """One slice per section, each shifted by the section's offset along the axis."""
    data = inputs[0]
    axis, sizes = get_op("split").sizes(data.shape, attrs)
    outs = []
    offset = 0
    for k, size in enumerate(sizes):
        shape = data.shape[:axis] + (size,) + data.shape[axis + 1:]

        def index_map(i: Sequence[PrimExpr], start: int = offset) -> list[Any]:
            index = list(i)
            index[axis] = i[axis] + start
            return index

        outs.append(injective("split", data, shape, index_map, name=f"split{k}"))
        offset += size
    return tuple(outs)


@register_compute("concatenate")
def compute_concatenate(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """A balanced tree of selects on the index along ``axis``: each branch reads one input,
    shifted by its offset; only the taken branch is loaded."""
    fields: list[te.Tensor] = list(inputs[0])
    axis = axis_of("concatenate", attrs.axis, fields[0].ndim)
    pieces = []
    offset = 0
    for field in fields:
        if field.shape[axis]:
            pieces.append((offset, field))
        offset += field.shape[axis]

    def element(*i: PrimExpr) -> PrimExpr:
        def read(start: int, field: te.Tensor) -> PrimExpr:
            index = list(i)
            index[axis] = i[axis] - start
            return field[tuple(index)]

        def pick(lo: int, hi: int) -> PrimExpr:
            if hi - lo == 1:
                return read(*pieces[lo])
            mid = (lo + hi) // 2
            return te.select(i[axis] < pieces[mid][0], pick(lo, mid), pick(mid, hi))

        if not pieces:  # every input is empty along the axis: so is the output
            return te.const(0, fields[0].dtype)
        return pick(0, len(pieces))

    return te.compute(shape_of(out_type), element, name="concatenate", tag="injective")


def resolve_index(value: PrimExpr, size: int, wrap: bool = False) -> PrimExpr:
    """An index read from a tensor made safe as the references make it: negative counts from
    the end, then clamped into 0..size-1 (or wrapped modulo size); the result is int32."""
    zero = te.const(0, value.dtype)
    if size <= 0:
        return te.const(0, "int32")
    if wrap:
        resolved = value % te.const(size, value.dtype)
    else:
        shifted = te.select(value < zero, value + te.const(size, value.dtype), value)
        resolved = te.max(te.min(shifted, te.const(size - 1, value.dtype)), zero)
    return te.cast(resolved, "int32")


@register_compute("take")
def compute_take(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """Slices of data along ``axis`` (the flat tensor for None) at ``indices``. Modes "fast"
    and "checked" clamp like "clip": the reference does for "fast", and it costs two selects;
    "checked" indices were checked before the kernel (see the module docstring)."""
    data, indices = inputs
    wrap = attrs.mode == "wrap"
    k = indices.ndim

    if attrs.axis is None:
        size = 1
        for dim in data.shape:
            size *= dim

        def element(*i: PrimExpr) -> PrimExpr:
            flat = resolve_index(indices[i], size, wrap)
            return data[tuple(unravel(flat, data.shape))]
    else:
        axis = axis_of("take", attrs.axis, data.ndim)

        def element(*i: PrimExpr) -> PrimExpr:
            at = resolve_index(indices[tuple(i[axis:axis + k])], data.shape[axis], wrap)
            return data[(*i[:axis], at, *i[axis + k:])]

    return te.compute(shape_of(out_type), element, name="take", tag="injective")


@register_compute("gather_elements")
def compute_gather_elements(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """out[i] = data[i with the axis coordinate replaced by indices[i]] (clamped; checked
    indices were checked before the kernel)."""
    data, indices = inputs
    axis = axis_of("gather_elements", attrs.axis, data.ndim)

    def element(*i: PrimExpr) -> PrimExpr:
        index = list(i)
        index[axis] = resolve_index(indices[i], data.shape[axis])
        return data[tuple(index)]

    return te.compute(shape_of(out_type), element, name="gather_elements", tag="injective")


@register_compute("broadcast_to")
def compute_broadcast_to(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """NumPy broadcasting of data to the target shape."""
    data = inputs[0]
    return injective("broadcast_to", data, shape_of(out_type),
                     lambda i: broadcast_indices(i, data.shape), tag="broadcast")


@register_compute("tile")
def compute_tile(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """``i % size`` on each repeated axis (the data's axes align to the right)."""
    data = inputs[0]
    out_shape = shape_of(out_type)
    lead = len(out_shape) - data.ndim
    reps = (1,) * (len(out_shape) - len(attrs.reps)) + tuple(attrs.reps)

    def index_map(i: Sequence[PrimExpr]) -> list[Any]:
        index: list[Any] = []
        for d, dim in enumerate(data.shape):
            x = i[lead + d]
            index.append(0 if dim == 1 else x if reps[lead + d] == 1 else x % dim)
        return index

    return injective("tile", data, out_shape, index_map)


@register_compute("arange")
def compute_arange(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """start + step * i: in int64 for integer dtypes, else in float64 as the reference, then
    cast."""
    dtype = out_type.dtype
    start, step = attrs.start, attrs.step

    def element(i: PrimExpr) -> PrimExpr:
        if is_int(dtype):
            value = te.const(int(start), "int64") + te.cast(i, "int64") * int(step)
        else:
            value = te.const(start, "float64") + te.const(step, "float64") * te.cast(i, "float64")
        return te.cast(value, dtype)

    return te.compute(shape_of(out_type), element, name="arange", tag="injective")


@register_compute("depth_to_space")
def compute_depth_to_space(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """out[n, c, y, x] reads channel block (y % b, x % b) of pixel (y // b, x // b)."""
    data = inputs[0]
    b = attrs.block_size
    depth = data.shape[1] // (b * b)
    crd = attrs.mode == "CRD"

    def index_map(i: Sequence[PrimExpr]) -> list[Any]:
        n, c, y, x = i
        by, bx = y % b, x % b
        channel = c * (b * b) + by * b + bx if crd else (by * b + bx) * depth + c
        return [n, channel, y // b, x // b]

    return injective("depth_to_space", data, shape_of(out_type), index_map)


@register_compute("space_to_depth")
def compute_space_to_depth(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """out[n, k, y, x] reads pixel (y * b + by, x * b + bx) of the channel that k encodes."""
    data = inputs[0]
    b = attrs.block_size
    depth = data.shape[1]
    crd = attrs.mode == "CRD"

    def index_map(i: Sequence[PrimExpr]) -> list[Any]:
        n, k, y, x = i
        if crd:  # k = c * b * b + by * b + bx
            c, by, bx = k // (b * b), (k // b) % b, k % b
        else:  # k = (by * b + bx) * depth + c
            c, by, bx = k % depth, k // (b * depth), (k // depth) % b
        return [n, c, y * b + by, x * b + bx]

    return injective("space_to_depth", data, shape_of(out_type), index_map)


@register_compute("layout_transform")
def compute_layout_transform(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """Each output element's primal index (through the destination layout), then its place
    in the source layout: ``NCHW16c[n, cb, h, w, ci] = NCHW[n, cb*16 + ci, h, w]``."""
    data = inputs[0]
    src, dst = get_op("layout_transform").layouts(data.ndim, attrs)
    return injective("layout_transform", data, shape_of(out_type),
                     lambda i: src.index(dst.primal_index(i)))


@register_compute("channel_shuffle")
def compute_channel_shuffle(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """Each output channel reads its source channel (see the op), in either layout: the
    channel index is read through the layout, permuted, and put back."""
    data = inputs[0]
    op = get_op("channel_shuffle")
    layout = op.layout_of(data.ndim, attrs.layout)
    channels = layout.primal_shape(data.shape)["C"]

    def index_map(i: Sequence[PrimExpr]) -> list[Any]:
        primal = layout.primal_index(i)
        primal["C"] = op.source_channel(primal["C"], channels, attrs.groups)
        return layout.index(primal)

    return injective("channel_shuffle", data, shape_of(out_type), index_map)
