"""Converters of ONNX's Resize and Upsample onto ``image.resize2d``.

Resize's scales or sizes (and Upsample's scales) must be constants. Only the last two axes
are resized (any rank: the leading axes are folded into the batch); every other axis must
keep its size with scale 1, else an error says so. ``tf_crop_and_resize`` (its ``roi`` may
be computed at run time) and antialiased shrinking go to the kOpaque ``image.resample``
instead, which resizes any axes with onnx.reference's NumPy code. Where a given
scale is not what the rounded output size implies (4 x 0.6 -> 2), the scale itself enters
the coordinate formulas, as in onnx.reference."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .... import op
from ....ir.expr import Constant, Expr
from ....ir.types import is_float
from ..registry import OnnxNode, converter
from ._common import tensor_type
from .tensor import as_ints, normalize_axes, present, required_const, reshape_exact, shape_of

_RESIZE_METHODS = {"nearest": "nearest_neighbor", "linear": "linear", "bilinear": "linear",
                   "cubic": "cubic"}


def _resize_method(node: OnnxNode, mode: str, allowed: Sequence[str]) -> str:
    if mode not in allowed:
        raise node.error(f"mode {mode!r} is not supported ({', '.join(allowed)})")
    return _RESIZE_METHODS[mode]


def _resize_spatial(node: OnnxNode, out_shape: list[int], scales: list[float] | None,
                    rounding: tuple[str, str], **attrs: object) -> Expr:
    """Resize input 0 to ``out_shape`` with ``image.resize2d`` on its last two axes; every
    other axis must keep its size with scale 1. ``scales`` (one per axis) are the factors of
    the coordinate formulas, None for out/in."""
    x = node.input(0)
    shape = shape_of(x)
    rank = len(shape)
    if rank == 0:
        raise node.error("cannot resize a scalar")
    scales = list(scales) if scales is not None else [o / i if i else 1.0
                                                        for o, i in zip(out_shape, shape)]
    for axis in range(rank):
        # onnx.reference leaves an axis alone whose size stays and whose scale is close to 1.
        if out_shape[axis] == shape[axis] and math.isclose(scales[axis], 1.0):
            scales[axis] = 1.0
    for axis in range(rank - 2):
        if scales[axis] != 1.0:
            raise node.error(f"resizing axis {axis} (scale {scales[axis]:g}, size "
                             f"{shape[axis]} -> {out_shape[axis]}) is not supported: opfusion "
                             "resizes only the last two axes (H, W)")
    in_hw = ((1, 1) + shape)[-2:]
    out_hw = tuple(((1, 1) + tuple(out_shape))[-2:])
    scale_hw = ([1.0, 1.0] + scales)[-2:]
    if out_hw == in_hw and scale_hw == [1.0, 1.0]:
        return x
    if 0 in in_hw:
        raise node.error(f"cannot resize the empty image of data {shape}")
    exact = all(s == o / i for s, o, i in zip(scale_hw, out_hw, in_hw))
    image = x if rank == 4 else reshape_exact(node, x, (math.prod(shape[:-2]), 1) + in_hw)
    if rounding[0] == rounding[1]:
        steps = [(out_hw, None if exact else scale_hw, rounding[0])]
    else:  # the two axes round differently: one resize per axis
        steps = [((out_hw[0], in_hw[1]), (scale_hw[0], 1.0), rounding[0]),
                 (out_hw, (1.0, scale_hw[1]), rounding[1])]
    for size_hw, scale, method in steps:
        image = op.image.resize2d(image, size=size_hw, scale=scale, rounding_method=method,
                                  **attrs)
    return image if rank == 4 else reshape_exact(node, image, out_shape)


def _resample(node: OnnxNode, out_shape: list[int], scales: list[float] | None,
              axes: list[int], **attrs: object) -> Expr:
    """Resize with ``image.resample`` (kOpaque, any axes): the crop box mode and antialiased
    shrinking, which ``image.resize2d`` does not do. The crop box ``roi`` stays an input."""
    x = node.input(0)
    shape = shape_of(x)
    if any(d == 0 for a, d in enumerate(shape) if a in axes):
        raise node.error(f"cannot resize the empty axes of data {shape}")
    if scales is None:  # from sizes: the scale of the formulas is out / in
        scales = [o / d if a in axes else 1.0 for a, (o, d) in enumerate(zip(out_shape, shape))]
    dtype = tensor_type(x).dtype if is_float(tensor_type(x).dtype) else "float32"
    crop = attrs["coordinate_transformation_mode"] == "tf_crop_and_resize"
    roi = node.optional_input(1) if crop else None
    if isinstance(roi, Constant) and roi.data.size == 0:  # ONNX's "absent"
        roi = None
    if roi is None:
        if crop:
            raise node.error("coordinate_transformation_mode 'tf_crop_and_resize' needs the "
                             "'roi' input (starts then ends of the resized axes)")
        # Only the crop mode reads the box; the other modes see the whole input.
        roi = Constant(np.array([0.0] * len(axes) + [1.0] * len(axes), dtype))
    elif shape_of(roi) != (2 * len(axes),):
        raise node.error(f"roi {shape_of(roi)} must have {2 * len(axes)} values: starts then "
                         f"ends of axes {axes}")
    return op.image.resample(x, roi, size=out_shape, scale=scales, axes=axes, **attrs)


def _checked_scales(node: OnnxNode, scales: Sequence[float]) -> list[float]:
    """Scales as floats, each finite and positive: the output size is floor(scale * size), so
    NaN, an infinity, 0 or a negative scale gives no valid shape."""
    factors = [float(s) for s in scales]
    bad = [s for s in factors if not (math.isfinite(s) and s > 0)]
    if bad:
        raise node.error(f"scales {factors} must be finite and positive, got {bad[0]}")
    return factors


def _checked_sizes(node: OnnxNode, sizes: np.ndarray) -> list[int]:
    """Sizes as ints, none negative."""
    values = as_ints(sizes)
    if min(values, default=0) < 0:
        raise node.error(f"sizes {values} must not be negative")
    return values


def _legacy_resize(node: OnnxNode, scales: np.ndarray) -> Expr:
    """Upsample and Resize-10: out = floor(in * scale), asymmetric coordinates, and nearest
    rounds down (up on shrinking axes, as onnxruntime's mode for these versions)."""
    shape = shape_of(node.input(0))
    factors = _checked_scales(node, np.asarray(scales, np.float32).reshape(-1))
    if len(factors) != len(shape):
        raise node.error(f"scales {factors} must have one entry per axis of {shape}")
    out = [int(s * d) for s, d in zip(factors, shape)]
    method = _resize_method(node, node.attr("mode", "nearest"), ("nearest", "linear", "bilinear"))
    rounding = ("floor", "floor")
    if method == "nearest_neighbor":
        scale_h, scale_w = ([1.0, 1.0] + factors)[-2:]
        rounding = ("ceil" if scale_h < 1 else "floor", "ceil" if scale_w < 1 else "floor")
    return _resize_spatial(node, out, factors, rounding, method=method,
                           coordinate_transformation_mode="asymmetric")


@converter("Upsample", since=7)
def upsample_7(node: OnnxNode) -> Expr:
    scales = node.attr("scales")
    if scales is None:
        raise node.error("attribute 'scales' is required")
    return _legacy_resize(node, np.asarray(scales))


@converter("Upsample", since=9)  # scales became an input
def upsample_9(node: OnnxNode) -> Expr:
    return _legacy_resize(node, required_const(node, 1, "scales"))


@converter("Resize", since=10)
def resize_10(node: OnnxNode) -> Expr:
    return _legacy_resize(node, required_const(node, 1, "scales"))


@converter("Resize", since=11)
def resize_11(node: OnnxNode) -> Expr:
    """Resize 11 (roi, scales, sizes; coordinate modes), 13 (roi and scales optional), 18
    (antialias, axes, keep_aspect_ratio_policy) and 19 (half_pixel_symmetric): the later
    attributes simply do not occur in older models, so one converter reads them all."""
    shape = shape_of(node.input(0))
    rank = len(shape)
    method = _resize_method(node, node.attr("mode", "nearest"), ("nearest", "linear", "cubic"))
    coordinates = node.attr("coordinate_transformation_mode", "half_pixel")
    axes = normalize_axes(node, as_ints(node.attr("axes", range(rank))), rank)
    scales = present(node.const_input(2, "scales"))
    sizes = present(node.const_input(3, "sizes"))
    if (scales is None) == (sizes is None):
        raise node.error("needs exactly one of the 'scales' and 'sizes' inputs")
    given = (_checked_sizes(node, sizes) if sizes is not None
             else _checked_scales(node, scales.reshape(-1)))
    if len(given) != len(axes):
        raise node.error(f"{'sizes' if sizes is not None else 'scales'} {given} must have one "
                         f"entry per resized axis {axes}")
    factors: list[float] | None
    if sizes is not None:
        out = list(shape)
        for axis, value in zip(axes, given):
            out[axis] = int(value)
        factors = None
        policy = node.attr("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            if policy not in ("not_larger", "not_smaller") or 0 in shape:
                raise node.error(f"keep_aspect_ratio_policy {policy!r} is not supported")
            # One scale for every resized axis; sizes round half up.
            ratios = [out[a] / shape[a] for a in axes]
            common = min(ratios) if policy == "not_larger" else max(ratios)
            factors = [common if a in axes else 1.0 for a in range(rank)]
            out = [int(common * d + 0.5) if a in axes else d for a, d in enumerate(shape)]
    else:
        factors = [1.0] * rank
        for axis, value in zip(axes, given):
            factors[axis] = value
        out = [int(s * d) for s, d in zip(factors, shape)]
    antialias = False
    if node.attr("antialias", 0):
        if method == "nearest_neighbor":
            raise node.error("antialias=1 is not defined for mode 'nearest'")
        # Antialiasing widens the kernel only when shrinking; growing is plain resampling.
        antialias = any(o < d for o, d in zip(out, shape)) or (
            factors is not None and any(s < 1 for s in factors))
    rounding = node.attr("nearest_mode", "round_prefer_floor")
    if rounding not in ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"):
        raise node.error(f"nearest_mode {rounding!r} is not supported")
    if coordinates == "tf_crop_and_resize" or antialias:
        return _resample(node, out, factors, axes, method=method,
                         coordinate_transformation_mode=coordinates, rounding_method=rounding,
                         cubic_alpha=node.attr("cubic_coeff_a", -0.75),
                         cubic_exclude=bool(node.attr("exclude_outside", 0)),
                         antialias=antialias,
                         extrapolation_value=node.attr("extrapolation_value", 0.0))
    # exclude_outside matters only to cubic: linear's outside taps read the edge pixel with
    # the weight the inside one would get, and nearest reads one pixel.
    exclude = method == "cubic" and bool(node.attr("exclude_outside", 0))
    return _resize_spatial(node, out, factors, (rounding, rounding), method=method,
                           coordinate_transformation_mode=coordinates,
                           cubic_alpha=node.attr("cubic_coeff_a", -0.75), cubic_exclude=exclude)
