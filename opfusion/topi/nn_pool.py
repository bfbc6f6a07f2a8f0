"""TE computes of the 2-D pooling operators over NCHW data: max_pool2d, avg_pool2d and their
global forms.

Window taps outside the input (padding, and the overhang of a ceil_mode window) read -inf for
max pooling and 0 for average pooling, from a padded copy of the input built only when a
window can actually cross an edge (or the columns are strided). Average pooling is a sum
(``pool_sum``) followed by a division by the tap count, a constant when every window counts
the same taps and otherwise a closed form in the output position; the schedules of
:mod:`opfusion.backend.cpu.schedules` find the stages by tag."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import te
from ._util import sum_dtype
from .nn import width_blocks, window_reader
from .reduce import blocked_sum
from .registry import register_compute

POOL = "pool"
POOL_SUM = "pool_sum"
POOL_AVG = "pool_avg"
POOL_PAD = "pool_pad"
POOL_ACC = "pool_acc"


def _window(data: te.Tensor, attrs: Any, out_hw: Sequence[int], empty: Any, name: str,
            reducer: Any, tag: str) -> tuple[te.Tensor, Any]:
    """``reducer`` over each window of ``data``; taps outside the input read ``empty``.

    Returns the reduction and a function ``at(n, c, y, x)`` reading its result. The taps read
    through :func:`.nn.window_reader`: a padded, column-phased copy of the input when a
    window can cross the edge or the columns are strided, so the window loops carry no guard.
    A row that is not a whole number of vectors is reduced in blocks of vectors,
    ``acc[n, c, y, x // lanes, x % lanes]``, its extra columns reading padding: the columns
    vectorize whatever the width (as in :func:`.nn.width_blocks`)."""
    batch, channels, _, _ = data.shape
    (kh, kw), (sh, sw), (dh, dw) = attrs.pool_size, attrs.strides, attrs.dilation
    top, left = attrs.padding[0], attrs.padding[1]
    out_h, out_w = out_hw
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")
    blocks, lanes = width_blocks(out_w, data.dtype)
    rows = (out_h - 1) * sh + (kh - 1) * dh + 1
    read = window_reader(data, top, left, rows, blocks * lanes, sw, (kw - 1) * dw, empty,
                         f"{name}_pad", POOL_PAD)

    def tap(n: Any, c: Any, y: Any, x: Any) -> te.PrimExpr:
        return read(n, c, y * sh + ry * dh, x, rx * dw)

    if blocks * lanes == out_w:
        result = te.compute((batch, channels, out_h, out_w),
                            lambda n, c, y, x: reducer(tap(n, c, y, x), axis=[ry, rx]),
                            name=name, tag=tag)
        return result, lambda n, c, y, x: result[n, c, y, x]
    acc = te.compute((batch, channels, out_h, blocks, lanes),
                     lambda n, c, y, b, x: reducer(tap(n, c, y, b * lanes + x), axis=[ry, rx]),
                     name=f"{name}_acc", tag=POOL_ACC if tag == POOL else tag)
    return acc, lambda n, c, y, x: acc[n, c, y, x // lanes, x % lanes]


def lowest(dtype: str) -> te.PrimExpr:
    """-inf for floats, the smallest value for integers: the identity of max."""
    if dtype.startswith("float"):
        return te.const(float("-inf"), dtype)
    return te.min_value(dtype)


@register_compute("nn.max_pool2d")
def max_pool2d(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """Maximum over each (dilated) window; padding counts as -inf."""
    (data,) = inputs
    result, at = _window(data, attrs, out_type.shape[2:], lowest(data.dtype), "max_pool2d",
                         te.max, POOL)
    if tuple(result.shape) == tuple(out_type.shape):
        return result
    return te.compute(out_type.shape, at, name="max_pool2d", tag=POOL)


def _tap_counts(size: int, out: int, kernel: int, stride: int, dilation: int, before: int,
                after: int, include_pad: bool) -> list[int]:
    """Taps of each window that count towards the divisor, along one axis."""
    lo, hi = (-before, size + after) if include_pad else (0, size)
    return [sum(1 for i in range(kernel) if lo <= y * stride + i * dilation - before < hi)
            for y in range(out)]


def _count_expr(y: Any, size: int, out: int, kernel: int, stride: int, dilation: int,
                before: int, after: int, include_pad: bool) -> Any:
    """The tap count of window ``y`` along one axis: a constant when every window has the
    same, else the number of taps i with ``lo <= y*stride + i*dilation - before < hi``."""
    counts = _tap_counts(size, out, kernel, stride, dilation, before, after, include_pad)
    if min(counts) == max(counts):
        return counts[0]
    lo, hi = (-before, size + after) if include_pad else (0, size)
    base = y * stride - before
    first = te.max((lo - base + dilation - 1) // dilation, 0)
    last = te.min((hi - 1 - base) // dilation, kernel - 1)
    return te.max(last - first + 1, 0)


@register_compute("nn.avg_pool2d")
def avg_pool2d(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """Mean over each (dilated) window: counting the input taps, or with count_include_pad
    the taps inside the padded input (never the ceil_mode overhang)."""
    (data,) = inputs
    dtype = data.dtype
    out_h, out_w = out_type.shape[2:]
    _, sums = _window(data, attrs, (out_h, out_w), te.const(0, dtype), "avg_pool2d_sum", te.sum,
                      POOL_SUM)
    _, _, height, width = data.shape
    (kh, kw), (sh, sw), (dh, dw) = attrs.pool_size, attrs.strides, attrs.dilation
    top, left, bottom, right = attrs.padding
    include = attrs.count_include_pad

    def mean(n: Any, c: Any, y: Any, x: Any) -> te.PrimExpr:
        count_h = _count_expr(y, height, out_h, kh, sh, dh, top, bottom, include)
        count_w = _count_expr(x, width, out_w, kw, sw, dw, left, right, include)
        count = count_h * count_w
        if isinstance(count, int):
            return sums(n, c, y, x) * (1.0 / count)
        return sums(n, c, y, x) / te.cast(count, dtype)

    return te.compute(out_type.shape, mean, name="avg_pool2d", tag=POOL_AVG)


@register_compute("nn.global_max_pool2d")
def global_max_pool2d(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """Maximum over H and W: (N, C, H, W) -> (N, C, 1, 1)."""
    (data,) = inputs
    ry = te.reduce_axis((0, data.shape[2]), name="ry")
    rx = te.reduce_axis((0, data.shape[3]), name="rx")
    return te.compute(out_type.shape,
                      lambda n, c, y, x: te.max(data[n, c, ry, rx], axis=[ry, rx]),
                      name="global_max_pool2d", tag=POOL)


@register_compute("nn.global_avg_pool2d")
def global_avg_pool2d(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """Mean over H and W: (N, C, H, W) -> (N, C, 1, 1); a blocked sum in
    :func:`._util.sum_dtype` (a whole image is many terms)."""
    (data,) = inputs
    wide = sum_dtype(data.dtype)
    _, _, height, width = (int(d) for d in data.shape)
    sums = blocked_sum(out_type.shape, [height, width],
                       lambda i, p: te.cast(data[i[0], i[1], p[0], p[1]], wide),
                       "global_avg_pool2d_sum", tag=POOL_SUM)
    count = te.const(float(height * width), wide)
    return te.compute(out_type.shape,
                      lambda n, c, y, x: te.cast(sums[n, c, y, x] / count, data.dtype),
                      name="global_avg_pool2d", tag=POOL_AVG)


__all__ = ["POOL", "POOL_ACC", "POOL_AVG", "POOL_PAD", "POOL_SUM", "lowest"]
