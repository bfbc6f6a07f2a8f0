"""Sampling operators with data-dependent reads: ``image.grid_sample`` (ONNX GridSample),
``image.roi_align`` (RoiAlign), ``nn.deform_conv2d`` (DeformConv) and ``image.resample``
(ONNX Resize where ``image.resize2d`` does not reach: ``tf_crop_and_resize`` and antialiased
shrinking, on any axes).

All kOpaque with vectorised NumPy references that follow onnx.reference (the compiled
executor runs them); none of them is hot enough in the models opfusion targets to pay for a
TE compute. The references compute in float64 and the interpreter casts to the result's dtype;
coordinates are rounded where onnx.reference rounds them (GridSample's are float32), so that
nearest-neighbour picks and integer-coordinate decisions fall the same way."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from ..errors import IndexOutOfRangeError
from ..ir.op import Attr, Attrs, Op, OpPatternKind, register_op
from ..ir.types import TensorType, Type, is_float, is_int
from ._nn_common import expect_rank
from .image import _COORDINATE_MODES, _ROUNDING_METHODS, _cubic_weights, source_coordinates

# ---------------------------------------------------------------------------------------------
# shared: reflection and tap resolution


def reflect(x: np.ndarray, low: float, high: float) -> np.ndarray:
    """Fold coordinates into [low, high] by mirroring at the borders as often as needed
    (PyTorch's and onnx.reference's ``reflect``); coordinates inside stay as they are."""
    x = np.asarray(x, np.float64)
    span = high - low
    if span <= 0:  # a one-pixel axis with align_corners: every coordinate is that pixel
        return np.full(x.shape, low)
    below = x < low
    distance = np.where(below, low - x, x - high)
    folds = np.trunc(distance / span)
    rest = distance - folds * span
    # An even number of folds below (odd above) ends measured from the low border.
    from_low = below == (folds % 2 == 0)
    folded = np.where(from_low, low + rest, high - rest)
    return np.where(below | (x > high), folded, x)


def _resolve_taps(index: np.ndarray, size: int, padding: str,
                  bounds: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
    """The pixel each integer tap reads and whether it reads one at all (False: zero
    padding's 0). Border padding clamps, reflection mirrors at ``bounds``."""
    if padding == "zeros":
        inside = (index >= 0) & (index < size)
        return np.clip(index, 0, size - 1), inside
    if padding == "reflection":
        index = np.trunc(reflect(index, *bounds)).astype(np.int64)
    return np.clip(index, 0, size - 1), np.ones(index.shape, bool)


def _keys_weights(frac: np.ndarray, alpha: float = -0.75) -> np.ndarray:
    """Keys' cubic weights of taps floor-1 .. floor+2, stacked on a new last axis."""
    flat = _cubic_weights(np.asarray(frac, np.float64).reshape(-1), alpha)
    return flat.reshape(np.shape(frac) + (4,))


# ---------------------------------------------------------------------------------------------
# GridSample

_GRID_MODES = ("linear", "nearest", "cubic")
_PADDING_MODES = ("zeros", "border", "reflection")


def _grid_coordinates(grid: np.ndarray, sizes: Sequence[int], align_corners: bool
                      ) -> list[np.ndarray]:
    """Pixel coordinates (float32, as onnx.reference keeps them) of every grid point, one
    array per spatial axis of the data; the grid's last axis lists them innermost first."""
    coords = []
    for axis, length in enumerate(sizes):
        g = grid[..., len(sizes) - 1 - axis]
        if align_corners:
            x = (g + 1) / 2.0 * (length - 1)
        else:
            x = ((g + 1) * length - 1) / 2.0
        coords.append(np.asarray(x).astype(np.float32))
    return coords


def _axis_taps(x: np.ndarray, length: int, mode: str, padding: str, align_corners: bool
               ) -> list[tuple[np.ndarray, np.ndarray]]:
    """(pixel index, weight) of every tap of one axis, each of the grid's shape."""
    bounds = (0.0, length - 1.0) if align_corners else (-0.5, length - 0.5)
    if mode == "nearest":
        x = np.rint(x)  # half to even, as PyTorch
    outside = (x < bounds[0]) | (x > bounds[1])
    if padding == "border":
        x = np.where(outside, np.clip(x, 0, length - 1), x).astype(np.float32)
    elif padding == "reflection":
        x = np.where(outside, reflect(x, *bounds), x).astype(np.float32)
    if mode == "nearest":
        starts, weights = x.astype(np.int64)[..., None], np.ones(x.shape + (1,))
    else:
        base = np.floor(x)
        frac = (x - base).astype(np.float64)
        if mode == "linear":
            starts = base.astype(np.int64)[..., None] + np.arange(2)
            weights = np.stack([1 - frac, frac], axis=-1)
        else:
            starts = base.astype(np.int64)[..., None] + np.arange(-1, 3)
            weights = _keys_weights(frac)
    taps = []
    for t in range(starts.shape[-1]):
        index, inside = _resolve_taps(starts[..., t], length, padding, bounds)
        taps.append((index, np.where(inside, weights[..., t], 0.0)))
    return taps


def grid_sample(data: np.ndarray, grid: np.ndarray, mode: str, padding_mode: str,
                align_corners: bool) -> np.ndarray:
    """ONNX GridSample of ``data`` (N, C, *spatial) at ``grid`` (N, *out, k) in float64.

    Interpolation is separable, so the result is the sum over every combination of one tap
    per axis of the product of the taps' weights times the pixel they read."""
    n, c = data.shape[:2]
    sizes = data.shape[2:]
    out_shape = grid.shape[1:-1]
    points = math.prod(out_shape)
    flat = data.reshape(n, c, -1)
    coords = _grid_coordinates(grid.reshape(n, points, len(sizes)), sizes, align_corners)
    per_axis = [_axis_taps(x, length, mode, padding_mode, align_corners)
                for x, length in zip(coords, sizes)]
    strides = [math.prod(sizes[axis + 1:]) for axis in range(len(sizes))]
    result = np.zeros((n, c, points), np.float64)
    for combination in itertools.product(*per_axis):
        offset = sum(index * stride for (index, _), stride in zip(combination, strides))
        weight = np.prod([w for _, w in combination], axis=0)
        values = np.take_along_axis(flat, np.broadcast_to(offset[:, None, :], (n, c, points)),
                                    axis=2)
        result += values * weight[:, None, :]
    return result.reshape((n, c) + tuple(out_shape))


@register_op
class GridSample(Op):
    name = "image.grid_sample"
    doc = ("Sample ``data`` (N, C, D1..Dk) at the normalized coordinates of ``grid`` (N, "
           "O1..Om, k), whose last axis lists (x, y[, z]) for the innermost axis first; "
           "ONNX GridSample (opset 16 and 20) with PyTorch's conventions.")
    inputs = ("data", "grid")
    pattern = OpPatternKind.kOpaque
    attrs = {
        "mode": Attr("str", "linear", choices=_GRID_MODES, doc="the interpolation"),
        "padding_mode": Attr("str", "zeros", choices=_PADDING_MODES,
                             doc="what a coordinate outside the image reads"),
        "align_corners": Attr("bool", False,
                              doc="-1 and 1 are the centres (True) or the outer edges of the "
                                  "corner pixels"),
    }

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        data, grid = self.expect_tensors(arg_types)
        k = data.ndim - 2
        if k < 1:
            raise self.type_error(f"input 'data' must be (N, C, D1, ...), got shape "
                                  f"{data.shape}")
        if grid.ndim != k + 2 or grid.shape[0] != data.shape[0] or grid.shape[-1] != k:
            raise self.type_error(
                f"input 'grid' {grid.shape} must be (N={data.shape[0]}, {k} output sizes, "
                f"{k}) for data {data.shape}")
        if not is_float(grid.dtype):
            raise self.type_error(f"input 'grid' must be a float tensor, got {grid.dtype}")
        if data.dtype == "bool":
            raise self.type_error("input 'data' is bool; cast it to a number first")
        if attrs.mode != "nearest" and not is_float(data.dtype):
            raise self.type_error(f"mode {attrs.mode!r} needs float data, got {data.dtype}; "
                                  "cast it first or use mode 'nearest'")
        shape = data.shape[:2] + grid.shape[1:-1]
        if 0 in data.shape[2:] and math.prod(shape):
            raise self.type_error(f"input 'data' {data.shape} has an empty image to sample")
        return TensorType(shape, data.dtype)

    def reference(self, data: np.ndarray, grid: np.ndarray, mode: str, padding_mode: str,
                  align_corners: bool) -> np.ndarray:
        if data.size == 0 or grid.size == 0:
            return np.zeros(data.shape[:2] + grid.shape[1:-1], data.dtype)
        return grid_sample(data, grid, mode, padding_mode, align_corners)


# ---------------------------------------------------------------------------------------------
# RoiAlign


def _roi_axis(start: np.floating, bin_size: np.floating, pooled: int, samples: int,
              length: int) -> tuple[np.ndarray, ...]:
    """The bilinear taps of one axis of one RoI: (inside, low, high, weight low, weight high),
    each (pooled, samples), as onnx.reference's ``pre_calc_for_bilinear_interpolate``."""
    dtype = np.asarray(start).dtype
    bins = np.arange(pooled, dtype=dtype)[:, None]
    steps = np.arange(samples, dtype=dtype)[None, :] + dtype.type(0.5)
    x = start + bins * bin_size + steps * bin_size / dtype.type(samples)
    inside = (x >= -1.0) & (x <= length)
    x = np.maximum(x, 0).astype(np.float64)
    low = np.trunc(x).astype(np.int64)
    at_edge = low >= length - 1
    low = np.where(at_edge, length - 1, low)
    high = np.where(at_edge, length - 1, low + 1)
    frac = np.where(at_edge, 0.0, x - low)
    return inside, low, high, 1.0 - frac, frac


def _roi_align_one(image: np.ndarray, box: np.ndarray, pooled: tuple[int, int],
                   sampling_ratio: int, half_pixel: bool, mode: str) -> np.ndarray:
    """RoiAlign of one box (x1, y1, x2, y2, already scaled) on one image (C, H, W)."""
    offset = box.dtype.type(0.5 if half_pixel else 0.0)
    start_w, start_h, end_w, end_h = (box - offset)
    roi_w, roi_h = end_w - start_w, end_h - start_h
    if not half_pixel:  # malformed boxes become 1 x 1
        roi_w, roi_h = max(roi_w, box.dtype.type(1.0)), max(roi_h, box.dtype.type(1.0))
    bin_h, bin_w = roi_h / pooled[0], roi_w / pooled[1]
    grid_h = sampling_ratio if sampling_ratio > 0 else int(np.ceil(roi_h / pooled[0]))
    grid_w = sampling_ratio if sampling_ratio > 0 else int(np.ceil(roi_w / pooled[1]))
    grid_h, grid_w = max(grid_h, 0), max(grid_w, 0)
    channels, height, width = image.shape
    if grid_h * grid_w == 0:
        return np.zeros((channels,) + pooled)
    in_y, y_lo, y_hi, wy_lo, wy_hi = _roi_axis(start_h, bin_h, pooled[0], grid_h, height)
    in_x, x_lo, x_hi, wx_lo, wx_hi = _roi_axis(start_w, bin_w, pooled[1], grid_w, width)
    inside = in_y[:, :, None, None] & in_x[None, None, :, :]  # (PH, GH, PW, GW)
    terms = []
    for ys, wy in ((y_lo, wy_lo), (y_hi, wy_hi)):
        for xs, wx in ((x_lo, wx_lo), (x_hi, wx_hi)):
            weight = np.where(inside, wy[:, :, None, None] * wx[None, None, :, :], 0.0)
            values = image[:, ys[:, :, None, None], xs[None, None, :, :]]
            terms.append(np.where(inside, values, 0.0) * weight)
    if mode == "avg":
        total = sum(terms).sum(axis=(2, 4))
        return total / (grid_h * grid_w)
    # ONNX's max mode takes the largest weighted corner of each sample, not the largest
    # interpolated value (onnx.reference and ONNX Runtime agree on it).
    return np.max(np.maximum.reduce(terms), axis=(2, 4))


def roi_align(data: np.ndarray, rois: np.ndarray, batch_indices: np.ndarray, mode: str,
              output_height: int, output_width: int, sampling_ratio: int,
              spatial_scale: float, coordinate_transformation_mode: str) -> np.ndarray:
    """ONNX RoiAlign in float64: (num_rois, C, output_height, output_width)."""
    batches = data.shape[0]
    indices = np.asarray(batch_indices).astype(np.int64).reshape(-1)
    bad = np.flatnonzero((indices < 0) | (indices >= batches))
    if bad.size:
        first = int(bad[0])
        raise IndexOutOfRangeError(
            f"image.roi_align: batch index {int(indices[first])} of RoI {first} is out of "
            f"range for data with {batches} image(s); it must lie in [0, {batches - 1}]")
    boxes = rois if is_float(rois.dtype.name) else rois.astype(np.float64)
    scale = boxes.dtype.type(spatial_scale)
    half_pixel = coordinate_transformation_mode == "half_pixel"
    result = np.zeros((len(indices), data.shape[1], output_height, output_width))
    for r, batch in enumerate(indices):
        result[r] = _roi_align_one(data[batch].astype(np.float64), boxes[r] * scale,
                                   (output_height, output_width), sampling_ratio, half_pixel,
                                   mode)
    return result


@register_op
class RoiAlign(Op):
    name = "image.roi_align"
    doc = ("Average (or max) of bilinear samples in each bin of each region of interest: "
           "``rois`` (R, 4) holds (x1, y1, x2, y2) boxes of image ``batch_indices[r]`` of "
           "``data`` (N, C, H, W); the result is (R, C, output_height, output_width). ONNX "
           "RoiAlign (opset 10 and 16).")
    inputs = ("data", "rois", "batch_indices")
    pattern = OpPatternKind.kOpaque
    attrs = {
        "mode": Attr("str", "avg", choices=("avg", "max"), doc="how samples of a bin combine"),
        "output_height": Attr("int", 1, doc="bins per RoI along H"),
        "output_width": Attr("int", 1, doc="bins per RoI along W"),
        "sampling_ratio": Attr("int", 0,
                               doc="samples per bin along each axis; 0: ceil(bin size)"),
        "spatial_scale": Attr("float", 1.0, doc="factor from RoI to data coordinates"),
        "coordinate_transformation_mode": Attr(
            "str", "half_pixel", choices=("half_pixel", "output_half_pixel"),
            doc="half_pixel shifts box coordinates by -0.5 (opset 16's default)"),
    }

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        data, rois, indices = self.expect_tensors(arg_types)
        expect_rank(self, data, "data", 4, ("N", "C", "H", "W"))
        if rois.ndim != 2 or rois.shape[1] != 4:
            raise self.type_error(f"input 'rois' must be (num_rois, 4), got {rois.shape}")
        if indices.shape != (rois.shape[0],):
            raise self.type_error(f"input 'batch_indices' {indices.shape} must be "
                                  f"({rois.shape[0]},): one image index per RoI")
        if not is_float(data.dtype) or rois.dtype != data.dtype:
            raise self.type_error(f"inputs 'data' ({data.dtype}) and 'rois' ({rois.dtype}) "
                                  "must share one float dtype")
        if not is_int(indices.dtype):
            raise self.type_error(f"input 'batch_indices' must be integers, got "
                                  f"{indices.dtype}")
        if attrs.output_height < 1 or attrs.output_width < 1 or attrs.sampling_ratio < 0:
            raise self.type_error(
                f"output_height={attrs.output_height} and output_width={attrs.output_width} "
                f"must be positive and sampling_ratio={attrs.sampling_ratio} not negative")
        if rois.shape[0] and 0 in data.shape[2:]:
            raise self.type_error(f"input 'data' {data.shape} has an empty image to sample")
        return TensorType((rois.shape[0], data.shape[1], attrs.output_height,
                           attrs.output_width), data.dtype)

    def reference(self, data: np.ndarray, rois: np.ndarray, batch_indices: np.ndarray,
                  **attrs: object) -> np.ndarray:
        return roi_align(data, rois, batch_indices, **attrs)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# DeformConv


def _bilinear_zero_padded(image: np.ndarray, y: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Bilinear samples of ``image`` (N, C, H, W) at float coordinates ``y``/``x`` (N, *P):
    (N, C, *P); pixels outside the image read 0 (GridSample, align_corners, zero padding)."""
    n, c, height, width = image.shape
    flat = image.reshape(n, c, -1)
    y0, x0 = np.floor(y), np.floor(x)
    fy, fx = y - y0, x - x0
    result = np.zeros((n, c) + y.shape[1:])
    for dy, wy in ((0, 1 - fy), (1, fy)):
        for dx, wx in ((0, 1 - fx), (1, fx)):
            ys, xs = y0.astype(np.int64) + dy, x0.astype(np.int64) + dx
            inside = (ys >= 0) & (ys < height) & (xs >= 0) & (xs < width)
            offset = (np.clip(ys, 0, height - 1) * width + np.clip(xs, 0, width - 1))
            offset = offset.reshape(n, 1, -1)
            values = np.take_along_axis(flat, np.broadcast_to(offset, (n, c, offset.shape[2])),
                                        axis=2).reshape(result.shape)
            result += values * np.where(inside, wy * wx, 0.0)[:, None]
    return result


def deform_conv2d(data: np.ndarray, weight: np.ndarray, offset: np.ndarray,
                  bias: np.ndarray, mask: np.ndarray, strides: Sequence[int],
                  padding: Sequence[int], dilation: Sequence[int], groups: int,
                  offset_groups: int) -> np.ndarray:
    """ONNX DeformConv (2-D) in float64: bilinear samples at the offset kernel positions,
    scaled by the mask, then one GEMM per group."""
    n, channels, _, _ = data.shape
    out_channels, group_channels, kh, kw = weight.shape
    oh, ow = offset.shape[2:]
    # The kernel's undeformed sampling positions: (kh, kw, oh, ow) per axis.
    base_y = (np.arange(oh) * strides[0] - padding[0])[None, None, :, None] \
        + (np.arange(kh) * dilation[0])[:, None, None, None]
    base_x = (np.arange(ow) * strides[1] - padding[1])[None, None, None, :] \
        + (np.arange(kw) * dilation[1])[None, :, None, None]
    moves = offset.astype(np.float64).reshape(n, offset_groups, kh, kw, 2, oh, ow)
    scales = mask.astype(np.float64).reshape(n, offset_groups, kh, kw, oh, ow)
    per_group = channels // offset_groups
    columns = np.empty((n, channels, kh, kw, oh, ow))
    for g in range(offset_groups):
        chans = slice(g * per_group, (g + 1) * per_group)
        samples = _bilinear_zero_padded(data[:, chans].astype(np.float64),
                                        base_y + moves[:, g, :, :, 0],
                                        base_x + moves[:, g, :, :, 1])
        columns[:, chans] = samples * scales[:, g, None]
    out_per_group = out_channels // groups
    columns = columns.reshape(n, groups, group_channels * kh * kw, oh * ow)
    kernels = weight.astype(np.float64).reshape(groups, out_per_group, -1)
    result = np.einsum("gok,ngkp->ngop", kernels, columns).reshape(n, out_channels, oh, ow)
    return result + bias.astype(np.float64).reshape(1, -1, 1, 1)


@register_op
class DeformConv2D(Op):
    name = "nn.deform_conv2d"
    doc = ("Deformable 2-D convolution (ONNX DeformConv): each kernel tap of each output "
           "pixel reads ``data`` bilinearly at its position moved by ``offset`` (N, "
           "offset_groups * 2 * KH * KW, OH, OW; (dy, dx) pairs), scaled by ``mask`` (N, "
           "offset_groups * KH * KW, OH, OW); ``bias`` (O,) is added.")
    inputs = ("data", "weight", "offset", "bias", "mask")
    pattern = OpPatternKind.kOpaque
    attrs = {
        "strides": Attr("ints", 1, length=2, doc="(stride H, stride W)"),
        "padding": Attr("ints", 0, length=4, doc="(top, left, bottom, right)"),
        "dilation": Attr("ints", 1, length=2, doc="(dilation H, dilation W)"),
        "groups": Attr("int", 1, doc="channel groups of the convolution"),
        "offset_groups": Attr("int", 1, doc="channel groups sharing one offset and mask"),
    }

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        data, weight, offset, bias, mask = self.expect_tensors(arg_types)
        expect_rank(self, data, "data", 4, ("N", "C", "H", "W"))
        expect_rank(self, weight, "weight", 4, ("O", "C/groups", "KH", "KW"))
        dtypes = {t.dtype for t in (data, weight, offset, bias, mask)}
        if len(dtypes) != 1 or not is_float(data.dtype):
            raise self.type_error(f"inputs must share one float dtype, got {sorted(dtypes)}")
        n, channels, height, width = data.shape
        out_channels, group_channels, kh, kw = weight.shape
        groups, offset_groups = attrs.groups, attrs.offset_groups
        if groups < 1 or offset_groups < 1 or min(attrs.strides + attrs.dilation) < 1 \
                or min(attrs.padding) < 0:
            raise self.type_error("groups, offset_groups, strides and dilation must be "
                                  "positive and padding not negative")
        if channels != group_channels * groups or out_channels % groups:
            raise self.type_error(f"weight {weight.shape} does not fit data {data.shape} in "
                                  f"{groups} group(s)")
        if channels % offset_groups:
            raise self.type_error(f"{channels} channels do not split into {offset_groups} "
                                  "offset groups")
        out_hw = [(size + attrs.padding[axis] + attrs.padding[axis + 2]
                   - (k - 1) * attrs.dilation[axis] - 1) // attrs.strides[axis] + 1
                  for axis, (size, k) in enumerate(((height, kh), (width, kw)))]
        if min(out_hw) < 1:
            raise self.type_error(f"the kernel ({kh}, {kw}) does not fit data {data.shape} "
                                  "with this padding and dilation")
        taps = offset_groups * kh * kw
        want = {"offset": (n, 2 * taps, *out_hw), "mask": (n, taps, *out_hw),
                "bias": (out_channels,)}
        for name, ty in (("offset", offset), ("mask", mask), ("bias", bias)):
            if ty.shape != want[name]:
                raise self.type_error(f"input {name!r} must be {want[name]}, got {ty.shape}")
        return TensorType((n, out_channels, *out_hw), data.dtype)

    def reference(self, data: np.ndarray, weight: np.ndarray, offset: np.ndarray,
                  bias: np.ndarray, mask: np.ndarray, **attrs: object) -> np.ndarray:
        return deform_conv2d(data, weight, offset, bias, mask, **attrs)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Resize with a crop box or antialiasing


def _nearest_pick(ratio: np.ndarray, rounding: str) -> np.ndarray:
    """onnx.reference's two nearest 'coefficients' (left, right) as weights; an integer
    coordinate (ratio 1) reads the right one, which is that pixel."""
    if rounding == "round_prefer_ceil":
        right = ratio >= 0.5
    elif rounding == "floor":
        right = np.zeros(ratio.shape, bool)
    elif rounding == "ceil":
        right = np.ones(ratio.shape, bool)
    else:  # round_prefer_floor
        right = ratio > 0.5
    right = right | (ratio == 1)
    return np.stack([~right, right], axis=1).astype(np.float64)


def _antialias_weights(ratio: np.ndarray, scale: float, method: str,
                       alpha: float) -> np.ndarray:
    """Weights of the widened (by 1 / scale when shrinking) linear or cubic kernel, each row
    normalized to sum 1 (onnx.reference's ``_*_coeffs_antialias``)."""
    scale = min(scale, 1.0)
    if method == "linear":
        start = int(np.floor(-1 / scale) + 1)
        taps = np.arange(start, 2 - start)
        weights = np.clip(1 - np.abs((taps - ratio[:, None]) * scale), 0, 1)
    else:
        start = int(np.floor(-2 / scale) + 1)
        distance = np.abs(scale * (np.arange(start, 2 - start) - ratio[:, None]))
        near = ((alpha + 2) * distance - (alpha + 3)) * distance * distance + 1
        far = ((alpha * distance - 5 * alpha) * distance + 8 * alpha) * distance - 4 * alpha
        weights = np.where(distance <= 1, near, np.where(distance < 2, far, 0.0))
    return weights / weights.sum(axis=1, keepdims=True)


def _neighbours(x: np.ndarray, taps: int) -> np.ndarray:
    """The ``taps`` pixels nearest to each coordinate, ties to the lower ones (onnx.reference's
    ``_get_neighbor_idxes``): (len(x), taps), possibly outside the axis."""
    base = np.floor(x).astype(np.int64)
    frac = x - base
    if taps % 2 == 0:
        first = base - taps // 2 + (frac != 0)
    else:
        first = base - (taps - 1) // 2 + (frac > 0.5)
    return first[:, None] + np.arange(taps)


def _resample_axis(data: np.ndarray, axis: int, out_len: int, scale: float,
                   roi: tuple[float, float] | None, attrs: dict) -> np.ndarray:
    in_len = data.shape[axis]
    mode = attrs["coordinate_transformation_mode"]
    if mode == "tf_crop_and_resize":
        assert roi is not None
        out_width = scale * in_len
        y = np.arange(out_len, dtype=np.float64)
        if out_width == 1:
            x = np.full(out_len, (roi[1] - roi[0]) * (in_len - 1) / 2)
        else:
            x = y * (roi[1] - roi[0]) * (in_len - 1) / (out_width - 1)
        x = x + roi[0] * (in_len - 1)
        outside = (x < 0) | (x > in_len - 1)
    else:
        x, outside = source_coordinates(mode, out_len, in_len, scale), None
    base = np.floor(x)
    ratio = np.where(x == base, 1.0, x - base)
    method = attrs["method"]
    if method == "nearest_neighbor":
        weights = _nearest_pick(ratio, attrs["rounding_method"])
    elif attrs["antialias"]:
        weights = _antialias_weights(ratio, scale, method, attrs["cubic_alpha"])
    elif method == "linear":
        weights = np.stack([1 - ratio, ratio], axis=1)
    else:
        weights = _cubic_weights(ratio, attrs["cubic_alpha"])
    taps = _neighbours(x, weights.shape[1])
    if method == "nearest_neighbor":
        # A plain read keeps integers exact; an excluded outside pick reads 0 (its only
        # weight is dropped), as in onnx.reference.
        chosen = np.where(weights[:, 1] > 0, taps[:, 1], taps[:, 0])
        result = np.take(data, np.clip(chosen, 0, in_len - 1), axis=axis)
        if attrs["cubic_exclude"]:
            dropped = ((chosen < 0) | (chosen >= in_len)).reshape(
                (1,) * axis + (out_len,) + (1,) * (data.ndim - axis - 1))
            result = np.where(dropped, 0, result)
        return _extrapolate(result, axis, outside, attrs["extrapolation_value"])
    if attrs["cubic_exclude"]:
        weights = np.where((taps < 0) | (taps >= in_len), 0.0, weights)
        total = weights.sum(axis=1, keepdims=True)
        weights = weights / np.where(total == 0, 1.0, total)
    gathered = np.take(data, np.clip(taps, 0, in_len - 1), axis=axis)
    shape = (1,) * axis + weights.shape + (1,) * (data.ndim - axis - 1)
    result = (gathered * weights.reshape(shape)).sum(axis=axis + 1)
    return _extrapolate(result, axis, outside, attrs["extrapolation_value"])


def _extrapolate(result: np.ndarray, axis: int, outside: np.ndarray | None,
                 value: float) -> np.ndarray:
    """``value`` at the output positions of ``axis`` whose source lies outside the input."""
    if outside is None or not outside.any():
        return result
    shape = (1,) * axis + outside.shape + (1,) * (result.ndim - axis - 1)
    return np.where(outside.reshape(shape), value, result)


@register_op
class Resample(Op):
    name = "image.resample"
    doc = ("ONNX Resize (opset 11 and later) of any axes, for what ``image.resize2d`` does "
           "not do: the ``tf_crop_and_resize`` coordinate mode, whose crop box ``roi`` "
           "(starts then ends of ``axes``, normalized) is an input, and antialiased linear "
           "or cubic shrinking. ``size`` and ``scale`` give every axis; axes outside ``axes`` "
           "keep their size with scale 1.")
    inputs = ("data", "roi")
    pattern = OpPatternKind.kOpaque
    attrs = {
        "size": Attr("ints", required=True, doc="the output shape"),
        "scale": Attr("floats", required=True, doc="the scale of each axis (the formulas')"),
        "axes": Attr("ints", required=True, doc="the resized axes, in the order of ``roi``"),
        "method": Attr("str", "linear", choices=("nearest_neighbor", "linear", "cubic"),
                       doc="the interpolation"),
        "coordinate_transformation_mode": Attr(
            "str", "half_pixel", choices=_COORDINATE_MODES + ("tf_crop_and_resize",),
            doc="how an output index maps to a source coordinate (ONNX's modes)"),
        "rounding_method": Attr("str", "round_prefer_floor", choices=_ROUNDING_METHODS,
                                doc="nearest_neighbor only: how a coordinate rounds"),
        "cubic_alpha": Attr("float", -0.75, doc="cubic only: the kernel coefficient A"),
        "cubic_exclude": Attr("bool", False,
                              doc="drop (and renormalize) taps outside the input"),
        "antialias": Attr("bool", False,
                          doc="linear/cubic: widen the kernel by 1 / scale when shrinking"),
        "extrapolation_value": Attr("float", 0.0,
                                    doc="tf_crop_and_resize: the value outside the input"),
    }

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        data, roi = self.expect_tensors(arg_types)
        rank = data.ndim
        if len(attrs.size) != rank or len(attrs.scale) != rank:
            raise self.type_error(f"attributes 'size' {attrs.size} and 'scale' {attrs.scale} "
                                  f"need one entry per axis of data {data.shape}")
        axes = list(attrs.axes)
        if sorted(set(axes)) != sorted(axes) or any(not 0 <= a < rank for a in axes):
            raise self.type_error(f"attribute 'axes' {attrs.axes} must be distinct axes of "
                                  f"rank {rank}")
        for axis in range(rank):
            if axis not in axes and (attrs.size[axis] != data.shape[axis]
                                     or attrs.scale[axis] != 1.0):
                raise self.type_error(f"axis {axis} is not in 'axes' {attrs.axes} but "
                                      "changes size or scale")
            if axis in axes and (data.shape[axis] == 0 or attrs.size[axis] < 0
                                 or not attrs.scale[axis] > 0):
                raise self.type_error(f"axis {axis}: cannot resize {data.shape[axis]} -> "
                                      f"{attrs.size[axis]} with scale {attrs.scale[axis]}")
        if attrs.method != "nearest_neighbor" and not is_float(data.dtype):
            raise self.type_error(f"method {attrs.method!r} needs float data, got "
                                  f"{data.dtype}; cast it first")
        if roi.shape != (2 * len(axes),) or not is_float(roi.dtype):
            raise self.type_error(f"input 'roi' must be float ({2 * len(axes)},): starts then "
                                  f"ends of axes {attrs.axes}; got {roi.dtype} {roi.shape}")
        return TensorType(attrs.size, data.dtype)

    def reference(self, data: np.ndarray, roi: np.ndarray, size: tuple[int, ...],
                  scale: tuple[float, ...], axes: tuple[int, ...],
                  **attrs: object) -> np.ndarray:
        crop = attrs["coordinate_transformation_mode"] == "tf_crop_and_resize"
        result = data if attrs["method"] == "nearest_neighbor" else data.astype(np.float64)
        bounds = np.asarray(roi, np.float64).reshape(2, -1)
        # Axis by axis (it is separable), in increasing order; onnx.reference skips an axis
        # that keeps its size and scale and is not cropped.
        for i, axis in sorted(enumerate(axes), key=lambda item: item[1]):
            box = (float(bounds[0, i]), float(bounds[1, i])) if crop else None
            if (math.isclose(scale[axis], 1.0) and size[axis] == result.shape[axis]
                    and (box is None or (math.isclose(box[0], 0.0)
                                         and math.isclose(box[1], 1.0)))):
                continue
            result = _resample_axis(result, axis, size[axis], scale[axis], box, attrs)
        return result
