"""Helpers shared by operator declarations: broadcasting, axes, dtype checks."""

from __future__ import annotations

from collections.abc import Sequence

from ..ir.op import Op
from ..ir.types import TensorType


def broadcast_shape(op: Op, types: Sequence[TensorType], names: Sequence[str]) -> tuple[int, ...]:
    """NumPy broadcasting of several input shapes; the error names the op and the inputs."""
    first = types[0].shape
    if all(t.shape == first for t in types):
        return first
    ndim = max(len(t.shape) for t in types)
    result: list[int] = []
    for axis in range(-ndim, 0):
        dims = [(t.shape[axis] if len(t.shape) >= -axis else 1) for t in types]
        sizes = sorted({d for d in dims if d != 1})
        if len(sizes) > 1:
            shapes = ", ".join(f"{name} {t.shape}" for name, t in zip(names, types))
            raise op.type_error(f"cannot broadcast {shapes}: dimension {ndim + axis} of the result "
                                f"would be {' vs '.join(map(str, sizes))}")
        result.append(sizes[0] if sizes else 1)
    return tuple(result)


def same_dtype(op: Op, types: Sequence[TensorType], names: Sequence[str]) -> str:
    """The common dtype of the inputs; mixed dtypes are an error (insert a cast)."""
    dtype = types[0].dtype
    for ty in types:
        if ty.dtype != dtype:
            listing = ", ".join(f"{n}: {t.dtype}" for n, t in zip(names, types))
            raise op.type_error(f"inputs must share one dtype, got {listing}; insert a cast")
    return dtype


def normalize_axis(op: Op, axis: int, ndim: int, attr: str = "axis") -> int:
    """Turn a possibly negative axis into 0..ndim-1, or raise naming the attribute."""
    if not -ndim <= axis < ndim:
        raise op.type_error(f"attribute {attr!r}={axis} is out of range for a tensor of rank "
                            f"{ndim}")
    return axis % ndim if ndim else 0


def normalize_axes(op: Op, axes: Sequence[int] | None, ndim: int, attr: str = "axis") -> tuple:
    """Normalize a list of axes (None = every axis); duplicates are an error."""
    if axes is None:
        return tuple(range(ndim))
    result = tuple(normalize_axis(op, a, ndim, attr) for a in axes)
    if len(set(result)) != len(result):
        raise op.type_error(f"attribute {attr!r}={tuple(axes)} repeats an axis")
    return result


def reduce_axes(op: Op, axis: Sequence[int] | None, ndim: int, exclude: bool = False,
                attr: str = "axis") -> tuple[int, ...]:
    """The sorted axes a reduction runs over: ``axis`` (None = every axis) or, with
    ``exclude``, every axis *not* in ``axis`` (TVM's convention; None ignores ``exclude``)."""
    if axis is None:
        return tuple(range(ndim))
    named = normalize_axes(op, axis, ndim, attr)
    if exclude:
        return tuple(a for a in range(ndim) if a not in named)
    return tuple(sorted(named))


def reduced_shape(shape: Sequence[int], axes: Sequence[int], keepdims: bool) -> tuple[int, ...]:
    """The shape left after reducing ``axes``: dropped, or kept as 1 with ``keepdims``."""
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def shape_size(shape: Sequence[int]) -> int:
    """Number of elements of a tensor of this shape (1 for a scalar)."""
    size = 1
    for dim in shape:
        size *= dim
    return size
