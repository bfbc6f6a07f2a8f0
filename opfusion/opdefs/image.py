"""Image operators: ``image.resize2d``, the spatial resize of an NCHW tensor.

The semantics are ONNX Resize's (opset 11 and later, no ROI, no antialias): each output
coordinate is mapped back to a source coordinate by the coordinate transformation mode, then
sampled by nearest neighbour (with a rounding method), linear or cubic interpolation.
Neighbours outside the image take the edge value. The scale in those formulas is the output
size over the input size, or the ``scale`` attribute where ONNX's ``scales`` input gave one
that the rounded output size does not reproduce. kInjective, as in TVM."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..ir.op import Attr, Attrs, Op, OpPatternKind, register_op
from ..ir.types import TensorType, Type, is_float

_COORDINATE_MODES = ("half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel",
                     "tf_half_pixel_for_nn", "half_pixel_symmetric")
_ROUNDING_METHODS = ("round", "floor", "ceil", "round_prefer_floor", "round_prefer_ceil")


def source_coordinates(mode: str, out_len: int, in_len: int,
                       scale: float | None = None) -> np.ndarray:
    """The source coordinate (float64) of every output index along one axis.

    Written as the ONNX reference writes it (a scale, then a division), so ties of
    nearest-neighbour rounding fall the same way. With a given ``scale`` the resized length in
    the formulas is ``scale * in_len`` unrounded, as onnx.reference has it; without one the
    scale is ``out_len / in_len`` and the length is ``out_len``."""
    y = np.arange(out_len, dtype=np.float64)
    if scale is None:
        scale, length = out_len / in_len, float(out_len)
    else:
        length = scale * in_len
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":  # the ONNX spec's 0 for a length-1 output
        return (y + 0.5) / scale - 0.5 if length != 1 else np.zeros(out_len)
    if mode == "align_corners":
        return y * (in_len - 1) / (length - 1) if length != 1 else np.zeros(out_len)
    if mode == "asymmetric":
        return y / scale
    if mode == "half_pixel_symmetric":
        # Centre the rounded output on the input: shift by half of what rounding cut off.
        offset = in_len / 2 * (1 - out_len / length)
        return offset + (y + 0.5) / scale - 0.5
    assert mode == "tf_half_pixel_for_nn", mode
    return (y + 0.5) / scale


def _nearest_index(x: np.ndarray, rounding: str) -> np.ndarray:
    base = np.floor(x)
    frac = x - base
    if rounding == "floor":
        up = np.zeros(x.shape, bool)
    elif rounding == "ceil":
        up = frac > 0
    elif rounding == "round_prefer_floor":
        up = frac > 0.5
    elif rounding == "round_prefer_ceil":
        up = frac >= 0.5
    else:  # "round": half away from zero, as C's round()
        up = np.where(x >= 0, frac >= 0.5, frac > 0.5)
    return (base + up).astype(np.int64)


def _cubic_weights(frac: np.ndarray, alpha: float) -> np.ndarray:
    """Keys' cubic convolution weights of the neighbours floor(x)-1 .. floor(x)+2 (ONNX's
    polynomials, with coefficient ``alpha``); shape (len(frac), 4)."""
    a, r, s = alpha, frac, 1 - frac
    return np.stack([
        ((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
        ((a + 2) * r - (a + 3)) * r * r + 1,
        ((a + 2) * s - (a + 3)) * s * s + 1,
        ((a * (s + 1) - 5 * a) * (s + 1) + 8 * a) * (s + 1) - 4 * a,
    ], axis=1)


def _resample_axis(data: np.ndarray, axis: int, out_len: int, scale: float | None,
                   attrs: dict) -> np.ndarray:
    in_len = data.shape[axis]
    x = source_coordinates(attrs["coordinate_transformation_mode"], out_len, in_len, scale)
    if attrs["method"] == "nearest_neighbor":
        index = np.clip(_nearest_index(x, attrs["rounding_method"]), 0, in_len - 1)
        return np.take(data, index, axis=axis)
    base = np.floor(x)
    frac = x - base
    if attrs["method"] == "linear":
        taps = base[:, None].astype(np.int64) + np.arange(2)
        weights = np.stack([1 - frac, frac], axis=1)
    else:
        taps = base[:, None].astype(np.int64) + np.arange(-1, 3)
        weights = _cubic_weights(frac, attrs["cubic_alpha"])
        if attrs["cubic_exclude"]:
            weights = np.where((taps < 0) | (taps >= in_len), 0.0, weights)
            weights /= weights.sum(axis=1, keepdims=True)
    # Edge padding: neighbours beyond the border read the border pixel.
    gathered = np.take(data, np.clip(taps, 0, in_len - 1), axis=axis)
    shape = (1,) * axis + weights.shape + (1,) * (data.ndim - axis - 1)
    return (gathered * weights.reshape(shape)).sum(axis=axis + 1)


@register_op
class Resize2D(Op):
    name = "image.resize2d"
    doc = "Resize the H and W axes of NCHW data to ``size`` with ONNX Resize semantics."
    inputs = ("data",)
    pattern = OpPatternKind.kInjective
    attrs = {
        "size": Attr("ints", required=True, length=2, doc="the output (height, width)"),
        "method": Attr("str", "linear", choices=("nearest_neighbor", "linear", "cubic"),
                       doc="the interpolation"),
        "coordinate_transformation_mode": Attr(
            "str", "half_pixel", choices=_COORDINATE_MODES,
            doc="how an output index maps to a source coordinate (ONNX's modes)"),
        "rounding_method": Attr("str", "round_prefer_floor", choices=_ROUNDING_METHODS,
                                doc="nearest_neighbor only: how a coordinate rounds to a pixel"),
        "cubic_alpha": Attr("float", -0.75, doc="cubic only: the kernel coefficient A"),
        "cubic_exclude": Attr("bool", False,
                              doc="cubic only: drop (and renormalize) taps outside the image"),
        "scale": Attr("floats", optional=True, length=2,
                      doc="the (height, width) scales of the coordinate formulas, as ONNX "
                          "Resize's `scales` input; None: size / input size"),
    }

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        (data,) = self.expect_tensors(arg_types)
        if data.ndim != 4:
            raise self.type_error(f"input 'data' must be 4-D NCHW, got shape {data.shape}")
        if data.dtype == "bool":
            raise self.type_error("input 'data' is bool; cast it to a number first")
        if attrs.method != "nearest_neighbor" and not is_float(data.dtype):
            raise self.type_error(f"method {attrs.method!r} needs floating-point data, got "
                                  f"{data.dtype}; cast it or use 'nearest_neighbor'")
        height, width = attrs.size
        if height < 1 or width < 1:
            raise self.type_error(f"attribute 'size'={attrs.size} must be positive")
        if attrs.scale is not None and not all(math.isfinite(v) and v > 0 for v in attrs.scale):
            raise self.type_error(f"attribute 'scale'={attrs.scale} must be positive and finite")
        if data.shape[2] == 0 or data.shape[3] == 0:
            raise self.type_error(f"input 'data' {data.shape} has an empty image; there is "
                                  "nothing to resize")
        return TensorType(data.shape[:2] + (height, width), data.dtype)

    def reference(self, data: np.ndarray, size: tuple[int, int],
                  scale: tuple[float, float] | None, **attrs: object) -> np.ndarray:
        result = data if attrs["method"] == "nearest_neighbor" else data.astype(np.float64)
        scale_h, scale_w = scale or (None, None)
        result = _resample_axis(result, 2, size[0], scale_h, attrs)
        return _resample_axis(result, 3, size[1], scale_w, attrs)
