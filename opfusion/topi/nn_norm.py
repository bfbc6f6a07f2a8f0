"""TE computes of the normalization operators: softmax, log_softmax, layer_norm, batch_norm
(inference form), lrn.

The row operators are several stages, each a reduction along ``axis`` over the other axes:
softmax is ``norm_max`` (the row maximum), ``norm_exp`` (exp(x - max)), ``norm_sum`` (their
row sum) and the result; log_softmax the same without ``norm_exp``; layer_norm is
``norm_mean`` (the row sum), ``norm_sum`` (the sum of squared deviations) and the result.
:mod:`opfusion.backend.cpu.schedules` finds them by tag, and the axis in the result's
``attrs["axis"]``. As in the references, a row whose maximum is infinite is not shifted."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import te
from ._util import accumulator_dtype, sum_dtype
from .nn import normalize_axis_of
from .reduce import blocked_sum
from .registry import register_compute

NORM_MAX = "norm_max"
NORM_EXP = "norm_exp"
NORM_MEAN = "norm_mean"
NORM_SUM = "norm_sum"
NORM_OUT = "norm_out"


def _insert(index: Sequence[Any], axis: int, value: Any) -> tuple[Any, ...]:
    """A full index from the index of a row (``axis`` removed) and a position along it."""
    return (*index[:axis], value, *index[axis:])


def _drop(index: Sequence[Any], axis: int) -> tuple[Any, ...]:
    return (*index[:axis], *index[axis + 1:])


def _row_max(data: te.Tensor, axis: int, name: str) -> te.Tensor:
    """The maximum along ``axis``, one value per row: vector partial maxima
    (:func:`.reduce.blocked_sum` with ``te.max``; the same value in any order) when the axis is
    the innermost one (a standalone softmax's rows were one scalar chain each)."""
    shape = _drop(data.shape, axis)
    return blocked_sum(shape, [data.shape[axis]], lambda i, p: data[_insert(i, axis, p[0])],
                       name, tag=NORM_MAX, contiguous=axis == data.ndim - 1, reducer=te.max)


def _row_sum(data: te.Tensor, axis: int, value: Any, name: str, tag: str) -> te.Tensor:
    """``sum(value(row_index, x[...]))`` along ``axis``, one value per row: a
    :func:`.reduce.blocked_sum` (vector partial sums) when the axis is the innermost one.
    ``value`` should cast to :func:`._util.sum_dtype`."""
    shape = _drop(data.shape, axis)
    contiguous = axis == data.ndim - 1
    return blocked_sum(shape, [data.shape[axis]],
                       lambda i, p: value(i, data[_insert(i, axis, p[0])]), name, tag=tag,
                       contiguous=contiguous)


def _shift(peak: te.Tensor, row: Sequence[Any]) -> te.PrimExpr:
    """The row maximum, or 0 where it is infinite (m - m is then NaN, not 0)."""
    m = peak[tuple(row)]
    zero = te.const(0, peak.dtype)
    return te.select(m - m == zero, m, zero)


@register_compute("nn.softmax")
def softmax(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """exp(x - max) / sum(exp(x - max)) along ``axis``; the exponentials are a stage of their
    own (``norm_exp``), read by the sum and the result: exp costs more than a memory pass.
    The sum accumulates in :func:`._util.sum_dtype`. An exponential below the normal floats
    is 0 (:func:`opfusion.te.exp_normal`): a weight under 2^-126 against a largest of 1,
    whose products downstream would each take a microcode assist as a subnormal (Swin's
    attention masks of -100)."""
    (data,) = inputs
    axis = normalize_axis_of(attrs.axis, data.ndim)
    peak = _row_max(data, axis, "softmax_max")
    acc = accumulator_dtype(data.dtype)
    exps = te.compute(data.shape,
                      lambda *i: te.exp_normal(te.cast(data[i] - _shift(peak, _drop(i, axis)),
                                                       acc)),
                      name="softmax_exp", tag=NORM_EXP)
    wide = sum_dtype(data.dtype)
    total = _row_sum(exps, axis, lambda i, x: te.cast(x, wide), "softmax_sum", NORM_SUM)
    return te.compute(
        data.shape,
        lambda *i: te.cast(exps[i] / te.cast(total[_drop(i, axis)], acc), data.dtype),
        name="softmax", tag=NORM_OUT, attrs={"axis": axis})


@register_compute("nn.log_softmax")
def log_softmax(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """x - max - log(sum(exp(x - max))) along ``axis`` (the sum and its log in
    :func:`._util.sum_dtype`)."""
    (data,) = inputs
    axis = normalize_axis_of(attrs.axis, data.ndim)
    peak = _row_max(data, axis, "log_softmax_max")
    wide = sum_dtype(data.dtype)
    total = _row_sum(data, axis, lambda i, x: te.cast(te.exp(x - _shift(peak, i)), wide),
                     "log_softmax_sum", NORM_SUM)
    return te.compute(
        data.shape,
        lambda *i: data[i] - _shift(peak, _drop(i, axis))
        - te.cast(te.log(total[_drop(i, axis)]), data.dtype),
        name="log_softmax", tag=NORM_OUT, attrs={"axis": axis})


def _affine(value: te.PrimExpr, gamma: te.Tensor, beta: te.Tensor, channel: Any,
            attrs: Any) -> te.PrimExpr:
    if attrs.scale:
        value = value * gamma[channel]
    if attrs.center:
        value = value + beta[channel]
    return value


@register_compute("nn.layer_norm")
def layer_norm(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """(x - mean) / sqrt(variance + epsilon) * gamma + beta along ``axis`` (two passes: the
    mean, then the squared deviations from it, both summed in :func:`._util.sum_dtype`, so
    that a constant row has exactly its value as mean and normalizes to 0)."""
    data, gamma, beta = inputs
    axis = normalize_axis_of(attrs.axis, data.ndim)
    size = data.shape[axis]
    wide = sum_dtype(data.dtype)
    count = te.const(float(size), wide)  # a division, exact for a constant row
    total = _row_sum(data, axis, lambda i, x: te.cast(x, wide), "layer_norm_mean", NORM_MEAN)

    def mean(row: Sequence[Any]) -> te.PrimExpr:
        return total[tuple(row)] / count

    def square(row: Sequence[Any], x: te.PrimExpr) -> te.PrimExpr:
        deviation = te.cast(x, wide) - mean(row)
        return deviation * deviation

    squares = _row_sum(data, axis, square, "layer_norm_var", NORM_SUM)

    def body(*i: Any) -> te.PrimExpr:
        row = _drop(i, axis)
        std = te.sqrt(squares[row] / count + te.const(attrs.epsilon, wide))
        normed = (data[i] - te.cast(mean(row), data.dtype)) / te.cast(std, data.dtype)
        return _affine(normed, gamma, beta, i[axis], attrs)

    return te.compute(data.shape, body, name="layer_norm", tag=NORM_OUT, attrs={"axis": axis})


@register_compute("nn.batch_norm")
def batch_norm(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """(x - moving_mean) / sqrt(moving_var + epsilon) * gamma + beta along ``axis``."""
    data, gamma, beta, moving_mean, moving_var = inputs
    axis = normalize_axis_of(attrs.axis, data.ndim)

    def body(*i: Any) -> te.PrimExpr:
        c = i[axis]
        normed = (data[i] - moving_mean[c]) / te.sqrt(moving_var[c] + attrs.epsilon)
        return _affine(normed, gamma, beta, c, attrs)

    return te.compute(data.shape, body, name="batch_norm")


def window_size(size: int, extent: int) -> int:
    """The terms an LRN window of ``size`` channels sums along an axis of ``extent``: a
    window of 2 extent - 1 or more already reaches every channel from every channel (it
    runs (size - 1) // 2 before and the rest after), so it sums the same as one of
    2 extent - 1. The scale stays alpha / size of the real size. (A hostile size of 2^16
    wrote an expression of 2^17 terms: minutes of lowering.)"""
    return min(size, max(1, 2 * extent - 1))


#: The scale of LRN's second range (float32, beta 0.75): squares of x * 2^-66 stay finite for
#: every float32 x, and base ** 0.75 of that range is the first's times 2^-99 exactly.
LRN_SCALE_EXPONENT = 66
FLOAT32_MAX = float(np.finfo(np.float32).max)
FLOAT32_TINY = float(np.finfo(np.float32).tiny)


def _three_quarters(base: te.PrimExpr) -> te.PrimExpr:
    """``base ** 0.75`` as two square roots (AlexNet's and GoogLeNet's beta), which vectorize
    where pow is a libm call per element: the same value to an ulp, and with base >= bias > 0
    no -0 or -inf, where sqrt and pow differ."""
    root = te.sqrt(base)
    return root * te.sqrt(root)


def _denominator(base: te.PrimExpr, attrs: Any, dtype: str) -> te.PrimExpr:
    """``base ** beta`` of an LRN that sums in ``dtype``: two roots for beta 0.75 and a
    positive bias, else pow."""
    if attrs.beta == 0.75 and attrs.bias > 0:
        return _three_quarters(base)
    return te.power(base, te.const(attrs.beta, dtype))


def _float32_ranges(attrs: Any) -> tuple[float, float, float, float]:
    """The constants of float32 LRN's two ranges (:func:`_lrn_float32`): alpha / size, the
    second range's scale 2^-66, the threshold below which its squares are dropped, and its
    bias (bias * 2^-132, or 0 below the smallest normal float)."""
    alpha = attrs.alpha / attrs.size
    # values whose squares sum to at most 2^-30 of an overflowing base; at least 8, whose
    # scaled square is a normal float
    threshold = max(8.0, float(np.sqrt(FLOAT32_MAX * 2.0 ** -30 / (attrs.size * alpha))))
    small = attrs.bias * 2.0 ** (-2 * LRN_SCALE_EXPONENT)
    return alpha, 2.0 ** -LRN_SCALE_EXPONENT, threshold, small if small >= FLOAT32_TINY else 0.0


def _lrn_float32(data: te.Tensor, attrs: Any, axis: int) -> te.Tensor:
    """LRN of float32 data with beta 0.75 and a positive bias, in float32: 2-2.5x faster than
    float64 (16 lanes a vector, not 8, and float32 square roots), to within a few float32
    roundings of the float64 reference.

    Squares of float32 values overflow from 1.8e19. Where the first range's base overflows
    (huge values, or a huge alpha), the quotient is taken over a second range:
    x * 2^-99 / (bias * 2^-132 + alpha / size * sum) ** 0.75, the sum over the squares of
    x * 2^-66, which no float32 x overflows (2^-99 = (2^-132) ** 0.75). That range leaves
    out the values below a threshold (their squares are below 2^-30 of any base that
    overflows) and a bias * 2^-132 below the smallest normal float, so that windows of
    ordinary values compute it from zeros instead of denormal numbers, which cost the CPU
    microcode assists (4x the kernel's time). Where even the second range's base overflows
    (alpha / size above 1.26 and huge values), the result is +-0 for an exact one below
    2.4e-20 in magnitude. One padded stage holds both ranges' squares, channel after
    channel (the second from ``extent + size - 1`` on), so that the rule computes both at
    the row that reads them."""
    extent = data.shape[axis]
    size = window_size(attrs.size, int(extent))
    before = (size - 1) // 2
    padded = extent + size - 1
    alpha, scale, threshold, small = _float32_ranges(attrs)

    def square(*i: Any) -> te.PrimExpr:
        k = i[axis]
        second = k >= padded
        pos = te.if_then_else(second, k - padded, k) - before
        value = data[_insert(_drop(i, axis), axis, pos)]
        scaled = value * te.const(scale, "float32")
        # (a NaN is not below the threshold: it stays, as in the reference)
        dropped = te.all(second, te.abs(value) < te.const(threshold, "float32"))
        value = te.if_then_else(second, scaled, value)
        zero = te.const(0, "float32")
        return te.if_then_else(te.all(pos >= 0, pos < extent),
                               te.if_then_else(dropped, zero, value * value), zero)

    shape = _insert(_drop(data.shape, axis), axis, 2 * padded)
    squares = te.compute(shape, square, name="lrn_squares")

    def window(i: tuple[Any, ...], offset: int) -> te.PrimExpr:
        total = squares[_insert(_drop(i, axis), axis, i[axis] + offset)]
        for k in range(1, size):
            total = total + squares[_insert(_drop(i, axis), axis, i[axis] + offset + k)]
        return total

    def quotient(*i: Any) -> te.PrimExpr:
        base = te.const(attrs.bias, "float32") + te.const(alpha, "float32") * window(i, 0)
        second = te.const(small, "float32") + te.const(alpha, "float32") * window(i, padded)
        wide = data[i] * te.const(2.0 ** -(3 * LRN_SCALE_EXPONENT // 2), "float32") / \
            _three_quarters(second)
        # (a NaN base takes the second range too, which is NaN as well)
        return te.if_then_else(base <= te.const(FLOAT32_MAX, "float32"),
                               data[i] / _three_quarters(base), wide)

    return te.compute(data.shape, quotient, name="lrn", tag=NORM_OUT, attrs={"axis": axis})


#: Tag of the squares of a blocked LRN (``layout`` NCHW<k>c), which its schedule computes at
#: each output row.
LRN_BLOCKED_SQUARES = "lrn_blocked_squares"


def _lrn_blocked(data: te.Tensor, attrs: Any, block: int) -> te.Tensor:
    """LRN of NCHW<k>c data (N, C/k, H, W, k), the window along the channels c = b * k + lane:
    the blocked layout kept, where NCHW would cost a conversion each way (GoogLeNet's two
    LRNs: four layout kernels, 0.68 ms of its 12, AVX-512).

    The squares ``[n, y, range, x, block, lane]`` hold each pixel's channels in a row, whole
    zero blocks before and after (as many as the window reaches past an edge), so that the
    window of one block's lanes is ``size`` loads at consecutive offsets (its channels' block
    and lane flatten back to the offset, :func:`opfusion.tir.simplify`); whether a channel is
    inside is a property of its block alone, so a vector of lanes is all inside or all
    padding. Float32 data with beta 0.75 and a positive bias and alpha takes
    :func:`_lrn_float32`'s two ranges, each element's range chosen by arithmetic on the sums
    rather than a select between them (which the vector planner keeps scalar: its branches
    load): ``min(base, second + (0 or inf))`` and a numerator scaled by 1 or 2^-99, the same
    values. Anything else sums in float64 (:func:`sum_dtype`), as the NCHW compute does."""
    batch, blocks, height, width, _ = (int(d) for d in data.shape)
    size = window_size(attrs.size, blocks * block)
    before = (size - 1) // 2
    pad = -(-max(before, size - 1 - before) // block)  # zero blocks on each side
    front = pad * block
    fast = data.dtype == "float32" and attrs.beta == 0.75 and attrs.bias > 0 and attrs.alpha > 0
    wide = "float32" if fast else sum_dtype(data.dtype)
    alpha, scale, threshold, small = _float32_ranges(attrs)

    def square(n: Any, y: Any, r: Any, x: Any, b: Any, lane: Any) -> te.PrimExpr:
        inside = te.all(b >= pad, b < pad + blocks)
        value = te.cast(data[n, te.max(te.min(b - pad, blocks - 1), 0), y, x, lane], wide)
        if not fast:
            return te.if_then_else(inside, value * value, te.const(0, wide))
        # the second range: x * 2^-66, values below the threshold dropped: a factor of 0 or
        # 1 (not a select of a load, so the lanes stay a vector) on the scaled value, before
        # it is squared, so that an ordinary value's tiny square (a subnormal float, which
        # costs a microcode assist: 4x the kernel's time) is never computed
        scaled = te.if_then_else(r > 0, value * te.const(scale, wide), value)
        small_value = te.all(value < te.const(threshold, wide),
                             value > te.const(-threshold, wide))  # (NaN: kept)
        keep = te.if_then_else(r > 0, te.if_then_else(small_value, te.const(0, wide),
                                                      te.const(1, wide)), te.const(1, wide))
        kept = scaled * keep
        return te.if_then_else(inside, kept * kept, te.const(0, wide))

    ranges = 2 if fast else 1
    squares = te.compute((batch, height, ranges, width, blocks + 2 * pad, block), square,
                         name="lrn_squares", tag=LRN_BLOCKED_SQUARES)

    def window(n: Any, b: Any, y: Any, x: Any, lane: Any, r: int) -> te.PrimExpr:
        def at(channel: Any) -> te.PrimExpr:  # a padded channel: its block and lane
            return squares[n, y, r, x, channel // block, channel % block]

        start = front + b * block + lane - before
        total = at(start)
        for k in range(1, size):
            total = total + at(start + k)
        return total

    def quotient(n: Any, b: Any, y: Any, x: Any, lane: Any) -> te.PrimExpr:
        value = data[n, b, y, x, lane]
        if not fast:
            base = window(n, b, y, x, lane, 0) * te.const(attrs.alpha / attrs.size, wide) + \
                te.const(attrs.bias, wide)
            return te.cast(te.cast(value, wide) / _denominator(base, attrs, wide),
                           data.dtype)
        base = te.const(attrs.bias, wide) + te.const(alpha, wide) * window(n, b, y, x, lane, 0)
        first = base <= te.const(FLOAT32_MAX, wide)  # (NaN: the second range, NaN as well)
        second = te.const(small, wide) + te.const(alpha, wide) * window(n, b, y, x, lane, 1)
        chosen = te.min(base, second + te.if_then_else(first, te.const(np.inf, wide),
                                                        te.const(0, wide)))
        numerator = value * te.if_then_else(
            first, te.const(1, wide), te.const(2.0 ** -(3 * LRN_SCALE_EXPONENT // 2), wide))
        return numerator / _three_quarters(chosen)

    return te.compute(data.shape, quotient, name="lrn", tag=NORM_OUT, attrs={"axis": 1})


@register_compute("nn.lrn")
def lrn(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """x / (bias + alpha / size * sum of x^2 over ``size`` neighbours along ``axis``) ** beta;
    the window runs from (size-1)//2 before to the rest after, clipped at the edges.

    The squares, their sum and the quotient are computed in :func:`sum_dtype` (float64 for
    float32 data), as the reference does, and only the result is rounded to the data's
    dtype: in float32 a value of 1e20 squares to inf and the result would be -0 or NaN
    where the exact one is finite. Float32 data with beta 0.75 and a positive bias and alpha
    (AlexNet's, GoogLeNet's) is computed in float32 over two ranges instead:
    :func:`_lrn_float32`."""
    (data,) = inputs
    if attrs.layout != "NCHW":
        return _lrn_blocked(data, attrs, int(data.shape[4]))
    axis = normalize_axis_of(attrs.axis, data.ndim)
    if data.dtype == "float32" and attrs.beta == 0.75 and attrs.bias > 0 and attrs.alpha > 0:
        return _lrn_float32(data, attrs, axis)
    extent = data.shape[axis]
    size = window_size(attrs.size, int(extent))
    before = (size - 1) // 2
    wide = sum_dtype(data.dtype)

    # The squares along ``axis`` with zeros beyond both edges, then the quotient with the
    # window's sum written out over them: only the squares' stage selects (a select of a
    # load runs scalar); the quotient vectorizes, and no third pass writes the sums out.
    padded_shape = _insert(_drop(data.shape, axis), axis, extent + size - 1)

    def square(*i: Any) -> te.PrimExpr:
        pos = i[axis] - before
        value = te.cast(data[_insert(_drop(i, axis), axis, pos)], wide)
        return te.if_then_else(te.all(pos >= 0, pos < extent), value * value,
                               te.const(0, wide))

    squares = te.compute(padded_shape, square, name="lrn_squares")

    def window(i: tuple[Any, ...]) -> te.PrimExpr:
        # the window's few squares summed in order: no reduction loop
        total = squares[_insert(_drop(i, axis), axis, i[axis])]
        for k in range(1, size):
            total = total + squares[_insert(_drop(i, axis), axis, i[axis] + k)]
        return total

    scale = te.const(attrs.alpha / attrs.size, wide)
    bias = te.const(attrs.bias, wide)

    return te.compute(
        data.shape,
        lambda *i: te.cast(te.cast(data[i], wide) / _denominator(window(i) * scale + bias,
                                                                attrs, wide),
                           data.dtype),
        name="lrn", tag=NORM_OUT, attrs={"axis": axis})


__all__ = ["NORM_EXP", "NORM_MAX", "NORM_MEAN", "NORM_OUT", "NORM_SUM"]
