"""TE computes of the 2-D pooling operators over NCHW and NCHW<k>c data: max_pool2d,
avg_pool2d and their global forms.

Window taps outside the input (padding, and the overhang of a ceil_mode window) read -inf for
max pooling and 0 for average pooling. Over NCHW they read a padded copy of the input, built
only when a window can actually cross an edge (or the columns are strided: the copy is in
column phases, so that a row's outputs vectorize). Over NCHW<k>c, where the vectors run along
the channel block, the taps read the input in place: clamped indices, and for average
pooling or dilated windows a guard (:func:`_blocked_reader`). Average pooling is a sum
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
#: A blocked global average pool's per-row sums (see :func:`global_avg_pool2d`).
POOL_ROWS = "pool_rows"
#: Rows from which a blocked global average pool sums row by row first.
ROW_SUMS_MIN_ROWS = 14


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


def blocked_columns(out_width: int) -> int:
    """Output columns a blocked window reduction computes: the row itself when a register
    tile of 3 to 8 columns divides it (or it has 8 columns or fewer), else the row rounded
    up to a multiple of 4, the extra columns cropped: a row of 13 is 16 columns in tiles of
    8, not 13 tiles of 1 (measured: tiles of one column take 1.3-2x as long as tiles of 4
    to 8, which all run alike)."""
    if out_width <= 8 or any(out_width % tile == 0 for tile in range(3, 9)):
        return out_width
    return -(-out_width // 4) * 4


def _crossing(size: int, out: int, kernel: int, stride: int, dilation: int,
              before: int) -> tuple[bool, bool]:
    """Whether some window tap along one axis falls before the input, and after it."""
    last = (out - 1) * stride + (kernel - 1) * dilation - before
    return before > 0, last > size - 1


def _blocked_reader(data: te.Tensor, attrs: Any, out_hw: Sequence[int], empty: Any,
                    idempotent: bool) -> Any:
    """``read(n, b, row, col, c)``: NCHW<k>c ``data`` at an input row and column that may
    lie outside it (padding, ceil_mode's overhang, cropped columns), where a window reads
    ``empty``; ``idempotent`` for a reduction where a repeated tap changes nothing (max).

    No padded copy: every read is clamped into the input. For an idempotent reduction over
    consecutive taps (no dilation) that is the whole edge handling: a tap past the edge
    reads the edge tap, which is in the same window, and max(a, a) = a. Otherwise the taps
    past the edge are also guarded (``empty`` there), the clamp keeping the address inside
    the input whether or not the C code loads before it selects."""
    _, _, height, width, _ = (int(d) for d in data.shape)
    (kh, kw), (sh, sw), (dh, dw) = attrs.pool_size, attrs.strides, attrs.dilation
    rows = _crossing(height, out_hw[0], kh, sh, dh, attrs.padding[0])
    cols = _crossing(width, out_hw[1], kw, sw, dw, attrs.padding[1])

    def edge(index: Any, size: int, crossing: tuple[bool, bool],
             dilation: int) -> tuple[Any, list[Any]]:
        """The clamped index, and the guards it needs."""
        guards = []
        if crossing[0]:
            guards.append(index >= 0)
            index = te.max(index, 0)
        if crossing[1]:
            guards.append(index < size)
            index = te.min(index, size - 1)
        return index, [] if idempotent and dilation == 1 else guards

    def read(n: Any, b: Any, y: Any, x: Any, c: Any) -> te.PrimExpr:
        row, row_guards = edge(y, height, rows, dh)
        col, col_guards = edge(x, width, cols, dw)
        value = data[n, b, row, col, c]
        guards = row_guards + col_guards
        return te.if_then_else(te.all(*guards), value, empty) if guards else value

    return read


def _blocked_window(data: te.Tensor, attrs: Any, out_hw: Sequence[int], empty: Any, name: str,
                    reducer: Any, tag: str, idempotent: bool) -> te.Tensor:
    """``reducer`` over each window of NCHW<k>c ``data``: ``out[n, b, y, x, c]`` over the
    taps ``data[n, b, y*sh + i*dh - top, x*sw + j*dw - left, c]``, the channel block
    innermost (one vector of a pixel's channels), for :func:`blocked_columns` columns."""
    batch, blocks, _, _, block = (int(d) for d in data.shape)
    (kh, kw), (sh, sw), (dh, dw) = attrs.pool_size, attrs.strides, attrs.dilation
    top, left = attrs.padding[0], attrs.padding[1]
    columns = blocked_columns(out_hw[1])
    read = _blocked_reader(data, attrs, (out_hw[0], columns), empty, idempotent)
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")
    return te.compute(
        (batch, blocks, out_hw[0], columns, block),
        lambda n, b, y, x, c: reducer(read(n, b, y * sh + ry * dh - top,
                                           x * sw + rx * dw - left, c), axis=[ry, rx]),
        name=name, tag=tag)


def _pool_compute(shape: Sequence[int], body: Any, name: str, tag: str) -> te.Tensor:
    """``te.compute`` of ``body(n, c, y, x, *block)`` over an NCHW or NCHW<k>c shape (the
    loops named n, c, y, x and k, as they appear in the generated C)."""
    if len(shape) == 5:
        return te.compute(shape, lambda n, c, y, x, k: body(n, c, y, x, k), name=name, tag=tag)
    return te.compute(shape, lambda n, c, y, x: body(n, c, y, x), name=name, tag=tag)


def lowest(dtype: str) -> te.PrimExpr:
    """-inf for floats, the smallest value for integers: the identity of max."""
    if dtype.startswith("float"):
        return te.const(float("-inf"), dtype)
    return te.min_value(dtype)


@register_compute("nn.max_pool2d")
def max_pool2d(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """Maximum over each (dilated) window; padding counts as -inf."""
    (data,) = inputs
    if len(data.shape) == 5:
        out_h, out_w = out_type.shape[2:4]
        if blocked_columns(out_w) == out_w:
            return _blocked_window(data, attrs, (out_h, out_w), lowest(data.dtype),
                                   "max_pool2d", te.max, POOL, idempotent=True)
        acc = _blocked_window(data, attrs, (out_h, out_w), lowest(data.dtype),
                              "max_pool2d_acc", te.max, POOL_ACC, idempotent=True)
        return _pool_compute(out_type.shape, lambda *i: acc[i], "max_pool2d", POOL)
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
    out_h, out_w = out_type.shape[2:4]
    if len(data.shape) == 5:
        blocked = _blocked_window(data, attrs, (out_h, out_w), te.const(0, dtype),
                                  "avg_pool2d_sum", te.sum, POOL_SUM, idempotent=False)

        def sums(*index: Any) -> te.PrimExpr:
            return blocked[index]
    else:
        _, sums = _window(data, attrs, (out_h, out_w), te.const(0, dtype), "avg_pool2d_sum",
                          te.sum, POOL_SUM)
    height, width = data.shape[2:4]
    (kh, kw), (sh, sw), (dh, dw) = attrs.pool_size, attrs.strides, attrs.dilation
    top, left, bottom, right = attrs.padding
    include = attrs.count_include_pad

    def mean(n: Any, c: Any, y: Any, x: Any, *k: Any) -> te.PrimExpr:
        count_h = _count_expr(y, height, out_h, kh, sh, dh, top, bottom, include)
        count_w = _count_expr(x, width, out_w, kw, sw, dw, left, right, include)
        count = count_h * count_w
        if isinstance(count, int):
            return sums(n, c, y, x, *k) * (1.0 / count)
        return sums(n, c, y, x, *k) / te.cast(count, dtype)

    return _pool_compute(out_type.shape, mean, "avg_pool2d", POOL_AVG)


@register_compute("nn.global_max_pool2d")
def global_max_pool2d(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """Maximum over H and W: (N, C, H, W) -> (N, C, 1, 1), or (N, C/k, H, W, k) -> (N, C/k,
    1, 1, k)."""
    (data,) = inputs
    ry = te.reduce_axis((0, data.shape[2]), name="ry")
    rx = te.reduce_axis((0, data.shape[3]), name="rx")
    return _pool_compute(out_type.shape,
                         lambda n, c, y, x, *k: te.max(data[(n, c, ry, rx, *k)], axis=[ry, rx]),
                         "global_max_pool2d", POOL)


@register_compute("nn.global_avg_pool2d")
def global_avg_pool2d(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """Mean over H and W: (N, C, H, W) -> (N, C, 1, 1), or (N, C/k, H, W, k) -> (N, C/k, 1,
    1, k); a sum in :func:`._util.sum_dtype` (a whole image is many terms), blocked along
    the row for NCHW (where W runs along memory), along the channel block for NCHW<k>c."""
    (data,) = inputs
    wide = sum_dtype(data.dtype)
    height, width = (int(d) for d in data.shape[2:4])
    if len(data.shape) == 5 and height >= ROW_SUMS_MIN_ROWS:
        sums = _blocked_row_sums(data, out_type.shape, wide)
    else:
        sums = blocked_sum(out_type.shape, [height, width],
                           lambda i, p: te.cast(data[(i[0], i[1], p[0], p[1], *i[4:])], wide),
                           "global_avg_pool2d_sum", tag=POOL_SUM,
                           contiguous=len(data.shape) == 4)
    count = te.const(float(height * width), wide)
    return _pool_compute(out_type.shape,
                         lambda n, c, y, x, *k: te.cast(sums[(n, c, y, x, *k)] / count,
                                                        data.dtype),
                         "global_avg_pool2d", POOL_AVG)


def _blocked_row_sums(data: te.Tensor, shape: Sequence[Any], wide: str) -> te.Tensor:
    """The sums of a blocked global pool over NCHW<k>c ``data`` (``shape`` (N, C/k, 1, 1, k),
    in ``wide``) in two stages: each row's sum (``{name}_rows[n, b, y, k]``, tag POOL_ROWS),
    then the rows' (tag POOL_SUM). The rows can then be split between the cores as the
    layer before split them (each core sums the rows it wrote, from its own cache), and a
    few rows side by side are independent sums; one sum per block over every row was one
    chain of dependent additions, read half from the other core (EfficientNet's 144-channel
    pool at 56 x 56: 0.057 ms, ONNX Runtime's 0.031)."""
    batch, blocks, height, width, lanes = (int(d) for d in data.shape)
    rx = te.reduce_axis((0, width), name="rx")
    rows = te.compute((batch, blocks, height, lanes),
                      lambda n, b, y, k: te.sum(te.cast(data[n, b, y, rx, k], wide), axis=rx),
                      name="global_avg_pool2d_rows", tag=POOL_ROWS)
    ry = te.reduce_axis((0, height), name="ry")
    return te.compute(tuple(shape), lambda n, b, y, x, k: te.sum(rows[n, b, ry, k], axis=ry),
                      name="global_avg_pool2d_sum", tag=POOL_SUM)


__all__ = ["POOL", "POOL_ACC", "POOL_AVG", "POOL_PAD", "POOL_ROWS", "POOL_SUM",
           "ROW_SUMS_MIN_ROWS", "blocked_columns", "lowest"]
