"""TE compute of ``image.resize2d`` (opfusion/opdefs/image.py): ONNX Resize on the H and W axes
of NCHW data, every coordinate transformation mode, rounding method and interpolation the
declaration accepts.

Each output pixel maps back to a source coordinate with the reference's formula, evaluated in
float64 with the same operations in the same order, so nearest-neighbour ties round exactly as
the reference rounds them. The neighbours (1, 2 or 4 per axis, clamped to the image: edge
padding) are then weighted along H, and those sums along W, in the data's dtype (float32
for float16 data), as the reference resamples H first and W second."""

from __future__ import annotations

from typing import Any

from .. import te
from ..tir.expr import PrimExpr
from ._util import shape_of
from .registry import register_compute

Tap = tuple[PrimExpr, PrimExpr | None]  # (source index, weight or None for nearest)


def source_coordinate(i: PrimExpr, mode: str, out_len: int, in_len: int,
                      scale: float | None) -> PrimExpr:
    """The float64 source coordinate of output index ``i`` (the reference's
    ``source_coordinates`` as an expression)."""
    y = te.cast(i, "float64")

    def f64(value: float) -> PrimExpr:
        return te.const(float(value), "float64")

    if scale is None:
        scale, length = out_len / in_len, float(out_len)
    else:
        length = scale * in_len
    if mode == "half_pixel" or (mode == "pytorch_half_pixel" and length != 1):
        return (y + 0.5) / f64(scale) - 0.5
    if mode == "pytorch_half_pixel":
        return f64(0.0)
    if mode == "align_corners":
        return y * f64(in_len - 1) / f64(length - 1) if length != 1 else f64(0.0)
    if mode == "asymmetric":
        return y / f64(scale)
    if mode == "half_pixel_symmetric":
        offset = in_len / 2 * (1 - out_len / length)
        return f64(offset) + (y + 0.5) / f64(scale) - 0.5
    assert mode == "tf_half_pixel_for_nn", mode
    return (y + 0.5) / f64(scale)


def _clamp(index: PrimExpr, size: int) -> PrimExpr:
    return te.max(te.min(index, size - 1), 0)


def _rounds_up(x: PrimExpr, frac: PrimExpr, rounding: str) -> PrimExpr:
    """Whether nearest-neighbour rounding of ``x`` (fraction ``frac``) goes up."""
    if rounding == "floor":
        return te.const(False)
    if rounding == "ceil":
        return frac > 0.0
    if rounding == "round_prefer_floor":
        return frac > 0.5
    if rounding == "round_prefer_ceil":
        return frac >= 0.5
    assert rounding == "round", rounding  # half away from zero, as C's round()
    return te.select(x >= 0.0, frac >= 0.5, frac > 0.5)


def _cubic_weights(frac: PrimExpr, alpha: float) -> list[PrimExpr]:
    """Keys' cubic weights of the neighbours floor(x)-1 .. floor(x)+2 (the reference's
    polynomials, in float64)."""
    a = te.const(alpha, "float64")
    r, s = frac, 1.0 - frac
    return [
        ((a * (r + 1.0) - a * 5.0) * (r + 1.0) + a * 8.0) * (r + 1.0) - a * 4.0,
        ((a + 2.0) * r - (a + 3.0)) * r * r + 1.0,
        ((a + 2.0) * s - (a + 3.0)) * s * s + 1.0,
        ((a * (s + 1.0) - a * 5.0) * (s + 1.0) + a * 8.0) * (s + 1.0) - a * 4.0,
    ]


def axis_taps(i: PrimExpr, out_len: int, in_len: int, scale: float | None, attrs: Any,
              dtype: str) -> list[Tap]:
    """The source indices (clamped, int32) that output index ``i`` reads along one axis, with
    their weights in ``dtype`` (None for nearest neighbour)."""
    x = source_coordinate(i, attrs.coordinate_transformation_mode, out_len, in_len, scale)
    base = te.floor(x)
    frac = x - base
    first = te.cast(base, "int32")
    if attrs.method == "nearest_neighbor":
        up = _rounds_up(x, frac, attrs.rounding_method)
        return [(_clamp(te.select(up, first + 1, first), in_len), None)]
    if attrs.method == "linear":
        offsets, weights = [0, 1], [1.0 - frac, frac]
    else:
        offsets, weights = [-1, 0, 1, 2], _cubic_weights(frac, attrs.cubic_alpha)
    taps = [first + k for k in offsets]
    if attrs.method == "cubic" and attrs.cubic_exclude:
        zero = te.const(0.0, "float64")
        weights = [te.select((t >= 0) & (t < in_len), w, zero) for t, w in zip(taps, weights)]
        total = weights[0] + weights[1] + weights[2] + weights[3]
        weights = [w / total for w in weights]
    return [(_clamp(t, in_len), te.cast(w, dtype)) for t, w in zip(taps, weights)]


@register_compute("image.resize2d")
def compute_resize2d(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """Nearest: one read. Linear/cubic: the H-weighted sums of 2 (4) rows, weighted along W."""
    data = inputs[0]
    _, _, in_h, in_w = data.shape
    out_h, out_w = attrs.size
    scale_h, scale_w = attrs.scale or (None, None)
    dtype = out_type.dtype
    work = "float32" if dtype == "float16" else dtype

    def element(n: PrimExpr, c: PrimExpr, i: PrimExpr, j: PrimExpr) -> PrimExpr:
        rows = axis_taps(i, out_h, in_h, scale_h, attrs, work)
        cols = axis_taps(j, out_w, in_w, scale_w, attrs, work)
        if attrs.method == "nearest_neighbor":
            return data[n, c, rows[0][0], cols[0][0]]
        total: PrimExpr | None = None
        for col, col_weight in cols:
            column: PrimExpr | None = None
            for row, row_weight in rows:
                term = te.cast(data[n, c, row, col], work) * row_weight
                column = term if column is None else column + term
            assert column is not None
            term = column * col_weight
            total = term if total is None else total + term
        assert total is not None
        return te.cast(total, dtype)

    return te.compute(shape_of(out_type), element, name="resize2d", tag="injective")
