"""Helpers shared by the nn.* declarations: attribute checks, dtype and rank checks, and the
sliding-window geometry (output sizes, padding, strided window views) of convolution and
pooling."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ..errors import OpAttributeError
from ..ir.layout import Layout, LayoutError, transform_array
from ..ir.op import Attr, Op
from ..ir.types import TensorType, is_float
from ._common import same_dtype

# ---------------------------------------------------------------------------------------------
# attributes


def normalize_padding(op: Op, padding: tuple[int, ...], attr: str = "padding") -> tuple:
    """1, 2 or 4 values -> 4 (top, left, bottom, right), as TVM does: one value pads every
    side, two are (height, width) applied to both ends."""
    if len(padding) == 1:
        padding = padding * 4
    elif len(padding) == 2:
        padding = (padding[0], padding[1], padding[0], padding[1])
    elif len(padding) != 4:
        raise OpAttributeError(f"{op.name} attribute {attr!r} takes 1, 2 or 4 values (all, "
                               f"(height, width) or (top, left, bottom, right)), got "
                               f"{len(padding)}: {padding}")
    if any(p < 0 for p in padding):
        raise OpAttributeError(f"{op.name} attribute {attr!r} must not be negative, got "
                               f"{padding}; crop with strided_slice instead")
    return padding


def check_positive(op: Op, attrs: dict[str, Any], names: Iterable[str]) -> None:
    """Every value of the named attributes (ints or tuples of ints; None skipped) is >= 1."""
    for name in names:
        value = attrs[name]
        if value is None:
            continue
        values = value if isinstance(value, tuple) else (value,)
        if any(v < 1 for v in values):
            raise OpAttributeError(f"{op.name} attribute {name!r} must be positive, got {value}")


# ---------------------------------------------------------------------------------------------
# inputs


def expect_rank(op: Op, ty: TensorType, name: str, rank: int, layout: str = "") -> None:
    if ty.ndim != rank:
        what = f" ({', '.join(layout)})" if layout else ""
        raise op.type_error(f"input {name!r} must be {rank}-D{what}, got shape {ty.shape}")


def numeric_dtype(op: Op, types: Sequence[TensorType], names: Sequence[str]) -> str:
    """The shared dtype of the inputs, which must be a number type (not bool)."""
    dtype = same_dtype(op, types, names)
    if dtype == "bool":
        raise op.type_error(f"input {names[0]!r} is bool; cast it to a number first")
    return dtype


def float_dtype(op: Op, types: Sequence[TensorType], names: Sequence[str]) -> str:
    """The shared dtype of the inputs, which must be floating point."""
    dtype = same_dtype(op, types, names)
    if not is_float(dtype):
        raise op.type_error(f"input {names[0]!r} must be floating point, got {dtype}; "
                            "insert a cast")
    return dtype


def along(vector: np.ndarray, ndim: int, axis: int) -> np.ndarray:
    """A 1-D vector reshaped to broadcast along ``axis`` of an ``ndim``-D tensor."""
    shape = [1] * ndim
    shape[axis % ndim] = -1
    return vector.reshape(shape)


def wide(array: np.ndarray) -> np.ndarray:
    """float64 for floats, int64 for integers: the accumulation type of the references."""
    return array.astype(np.float64 if array.dtype.kind == "f" else np.int64, copy=False)


# ---------------------------------------------------------------------------------------------
# sliding windows

_AXES = ("height", "width")


def window_output_size(size: int, kernel: int, stride: int, dilation: int, before: int,
                       after: int, ceil_mode: bool = False) -> int:
    """Number of window positions along one axis; may be <= 0 when the window does not fit.

    With ``ceil_mode`` a last partial window is kept, unless it would start in the right
    padding (ONNX and PyTorch semantics)."""
    span = size + before + after - dilation * (kernel - 1) - 1
    if span < 0:
        return span // stride + 1  # <= 0: reported by the caller
    if not ceil_mode:
        return span // stride + 1
    out = -(-span // stride) + 1
    if (out - 1) * stride >= size + before:
        out -= 1
    return out


def spatial_output(op: Op, data: TensorType, kernel: Sequence[int], strides: Sequence[int],
                   dilation: Sequence[int], padding: Sequence[int], ceil_mode: bool = False,
                   kernel_name: str = "kernel") -> tuple[int, int]:
    """(out_height, out_width) of a 2-D window over NCHW ``data``; an empty output is an error
    that gives the numbers."""
    sizes = []
    for axis in range(2):
        size = data.shape[2 + axis]
        before, after = padding[axis], padding[axis + 2]
        out = window_output_size(size, kernel[axis], strides[axis], dilation[axis], before,
                                 after, ceil_mode)
        if out <= 0:
            extent = dilation[axis] * (kernel[axis] - 1) + 1
            raise op.type_error(
                f"output {_AXES[axis]} would be {out}: data {data.shape} has {_AXES[axis]} "
                f"{size}, padded to {size + before + after}, but the (dilated) {kernel_name} "
                f"spans {extent}; use a smaller {kernel_name} or dilation, or more padding")
        sizes.append(out)
    return sizes[0], sizes[1]


def windows(padded: np.ndarray, kernel: Sequence[int], strides: Sequence[int],
            dilation: Sequence[int], out: Sequence[int]) -> np.ndarray:
    """A read-only view (N, C, OH, OW, KH, KW) of the windows of padded NCHW data; no copy."""
    extent = [d * (k - 1) + 1 for k, d in zip(kernel, dilation)]
    view = np.lib.stride_tricks.sliding_window_view(padded, extent, axis=(2, 3))
    view = view[:, :, ::strides[0], ::strides[1], ::dilation[0], ::dilation[1]]
    return view[:, :, :out[0], :out[1]]


def pad_spatial(data: np.ndarray, padding: Sequence[int], value: Any = 0,
                extra: Sequence[int] = (0, 0)) -> np.ndarray:
    """Pad the H and W axes of NCHW data by (top, left, bottom, right) plus ``extra`` more at
    the bottom and right (the overhang of ceil_mode windows)."""
    top, left, bottom, right = padding
    pads = ((0, 0), (0, 0), (top, bottom + extra[0]), (left, right + extra[1]))
    if not any(before or after for before, after in pads):
        return data
    return np.pad(data, pads, mode="constant", constant_values=value)


# ---------------------------------------------------------------------------------------------
# channel-blocked data (NCHW<k>c): pooling and LRN


LAYOUT_ATTR = Attr("str", "NCHW", doc="'NCHW', or 'NCHW<k>c': channels in blocks of k, data "
                                       "(N, C/k, H, W, k)")


def layout_block(op: Op, layout: str) -> int:
    """The channel block of an op's ``layout`` attribute (pooling, LRN): 0 for NCHW, k for
    NCHW<k>c; OpAttributeError (naming the op) for anything else."""
    if layout == "NCHW":
        return 0
    try:
        parsed = Layout.parse(layout)
    except LayoutError:
        parsed = None
    if parsed is None or parsed.axes[:4] != (("N", 0), ("C", 0), ("H", 0), ("W", 0)) \
            or len(parsed.axes) != 5 or parsed.axes[4][0] != "C":
        raise OpAttributeError(
            f"{op.name} attribute 'layout'={layout!r} must be 'NCHW' or 'NCHW<k>c' (channels "
            "in blocks of k, e.g. 'NCHW16c'); transpose other layouts to NCHW first")
    return parsed.axes[4][1]


def check_layout_data(op: Op, data: TensorType, layout: str) -> None:
    """``data`` has the rank, and the channel block, of ``layout``."""
    block = layout_block(op, layout)
    if not block:
        if data.ndim == 5:
            raise op.type_error(f"input 'data' {data.shape} is 5-D but attribute 'layout' is "
                                "'NCHW'; set layout='NCHW<k>c' for data in channel blocks")
        expect_rank(op, data, "data", 4, ("N", "C", "H", "W"))
        return
    if data.ndim != 5:
        raise op.type_error(f"attribute 'layout'={layout!r} takes 5-D data (N, C/{block}, H, "
                            f"W, {block}), got shape {data.shape}; use layout='NCHW' for "
                            "NCHW data")
    if data.shape[4] != block:
        raise op.type_error(f"input 'data' {data.shape} has {data.shape[4]} channels per block "
                            f"but attribute 'layout'={layout!r} blocks them by {block}; "
                            "set the layout to the data's block")


def in_nchw(reference: Any, data: np.ndarray, layout: str, **attrs: Any) -> np.ndarray:
    """``reference`` (an NCHW reference) of ``data`` in ``layout``: NCHW in and out."""
    if layout == "NCHW":
        return reference(data, **attrs)
    blocked, plain = Layout.parse(layout), Layout.parse("NCHW")
    out = reference(transform_array(data, blocked, plain), **attrs)
    return transform_array(out, plain, blocked)
