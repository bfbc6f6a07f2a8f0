"""TE computes of the 2-D pooling operators over NCHW data: max_pool2d, avg_pool2d and their
global forms.

Window taps outside the input (padding, and the overhang of a ceil_mode window) read -inf for
max pooling and 0 for average pooling, through ``if_then_else`` guards that are emitted only
for the sides a window can actually cross. Average pooling is a sum (``pool_sum``) followed by
a division by the tap count, a constant when every window counts the same taps and otherwise
a closed form in the output position; the schedules of :mod:`.schedules` find the stages by
tag."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import te
from .registry import register_compute

POOL = "pool"
POOL_SUM = "pool_sum"
POOL_AVG = "pool_avg"


def _tap_guard(pos: Any, positions: Sequence[int], size: int) -> list[Any]:
    """Conditions keeping ``pos`` inside ``[0, size)``, given the values it takes."""
    inside = []
    if min(positions) < 0:
        inside.append(pos >= 0)
    if max(positions) >= size:
        inside.append(pos < size)
    return inside


def _positions(out: int, kernel: int, stride: int, dilation: int, before: int) -> list[int]:
    """Every input position a window tap reads along one axis."""
    return [y * stride + i * dilation - before for y in (0, out - 1) for i in (0, kernel - 1)]


def _window(data: te.Tensor, attrs: Any, out_hw: Sequence[int], empty: Any, name: str,
            reducer: Any, tag: str) -> te.Tensor:
    """``reducer`` over each window of ``data``; taps outside the input read ``empty``."""
    _, _, height, width = data.shape
    (kh, kw), (sh, sw), (dh, dw) = attrs.pool_size, attrs.strides, attrs.dilation
    top, left = attrs.padding[0], attrs.padding[1]
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")
    rows = _positions(out_hw[0], kh, sh, dh, top)
    cols = _positions(out_hw[1], kw, sw, dw, left)

    def tap(n: Any, c: Any, y: Any, x: Any) -> te.PrimExpr:
        h, w = y * sh + ry * dh - top, x * sw + rx * dw - left
        inside = _tap_guard(h, rows, height) + _tap_guard(w, cols, width)
        value = data[n, c, h, w]
        return te.if_then_else(te.all(*inside), value, empty) if inside else value

    shape = (*data.shape[:2], *out_hw)
    return te.compute(shape, lambda n, c, y, x: reducer(tap(n, c, y, x), axis=[ry, rx]),
                      name=name, tag=tag)


def lowest(dtype: str) -> te.PrimExpr:
    """-inf for floats, the smallest value for integers: the identity of max."""
    if dtype.startswith("float"):
        return te.const(float("-inf"), dtype)
    return te.min_value(dtype)


@register_compute("nn.max_pool2d")
def max_pool2d(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """Maximum over each (dilated) window; padding counts as -inf."""
    (data,) = inputs
    return _window(data, attrs, out_type.shape[2:], lowest(data.dtype), "max_pool2d", te.max,
                   POOL)


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
    sums = _window(data, attrs, (out_h, out_w), te.const(0, dtype), "avg_pool2d_sum", te.sum,
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
            return sums[n, c, y, x] * (1.0 / count)
        return sums[n, c, y, x] / te.cast(count, dtype)

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
    """Mean over H and W: (N, C, H, W) -> (N, C, 1, 1)."""
    (data,) = inputs
    ry = te.reduce_axis((0, data.shape[2]), name="ry")
    rx = te.reduce_axis((0, data.shape[3]), name="rx")
    sums = te.compute(out_type.shape,
                      lambda n, c, y, x: te.sum(data[n, c, ry, rx], axis=[ry, rx]),
                      name="global_avg_pool2d_sum", tag=POOL_SUM)
    scale = 1.0 / (data.shape[2] * data.shape[3])
    return te.compute(out_type.shape, lambda n, c, y, x: sums[n, c, y, x] * scale,
                      name="global_avg_pool2d", tag=POOL_AVG)


__all__ = ["POOL", "POOL_AVG", "POOL_SUM", "lowest"]
