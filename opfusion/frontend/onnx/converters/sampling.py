"""Converters of ONNX's sampling operators onto :mod:`opfusion.opdefs.sampling`: GridSample
(opset 16: 4-D, modes bilinear/nearest/bicubic; opset 20: any rank, linear/nearest/cubic),
RoiAlign (opset 10; 16 adds coordinate_transformation_mode) and DeformConv (opset 19, 2-D
only; an absent bias is zeros and an absent mask ones)."""

from __future__ import annotations

import numpy as np

from .... import op
from ....ir.expr import Constant, Expr
from ..registry import OnnxNode, converter
from ._common import shape_of, tensor_type
from .tensor import as_ints

_GRID_MODES_16 = {"bilinear": "linear", "nearest": "nearest", "bicubic": "cubic"}
_GRID_MODES_20 = {"linear": "linear", "nearest": "nearest", "cubic": "cubic"}


def _grid_sample(node: OnnxNode, modes: dict[str, str], default: str) -> Expr:
    mode = node.attr("mode", default)
    if mode not in modes:
        raise node.error(f"mode {mode!r} is not one of {', '.join(modes)}")
    padding = node.attr("padding_mode", "zeros")
    if padding not in ("zeros", "border", "reflection"):
        raise node.error(f"padding_mode {padding!r} is not one of zeros, border, reflection")
    return op.image.grid_sample(node.input(0), node.input(1), mode=modes[mode],
                                padding_mode=padding,
                                align_corners=bool(node.attr("align_corners", 0)))


@converter("GridSample", since=16)
def grid_sample_16(node: OnnxNode) -> Expr:
    return _grid_sample(node, _GRID_MODES_16, "bilinear")


@converter("GridSample", since=20)  # N-D ("volumetric") inputs; modes renamed
def grid_sample_20(node: OnnxNode) -> Expr:
    return _grid_sample(node, _GRID_MODES_20, "linear")


def _roi_align(node: OnnxNode, coordinates: str) -> Expr:
    mode = node.attr("mode", "avg")
    if mode not in ("avg", "max"):
        raise node.error(f"mode {mode!r} is not avg or max")
    if coordinates not in ("half_pixel", "output_half_pixel"):
        raise node.error(f"coordinate_transformation_mode {coordinates!r} is not half_pixel "
                         "or output_half_pixel")
    return op.image.roi_align(
        node.input(0), node.input(1), node.input(2), mode=mode,
        output_height=node.attr("output_height", 1), output_width=node.attr("output_width", 1),
        sampling_ratio=node.attr("sampling_ratio", 0),
        spatial_scale=node.attr("spatial_scale", 1.0), coordinate_transformation_mode=coordinates)


@converter("RoiAlign", since=10)
def roi_align_10(node: OnnxNode) -> Expr:
    # Opset 10 has no coordinate mode: its boxes are not shifted by half a pixel.
    return _roi_align(node, "output_half_pixel")


@converter("RoiAlign", since=16)
def roi_align_16(node: OnnxNode) -> Expr:
    return _roi_align(node, node.attr("coordinate_transformation_mode", "half_pixel"))


def _pair(node: OnnxNode, name: str, default: int, count: int = 2) -> list[int]:
    values = as_ints(node.attr(name, [default] * count))
    if len(values) != count:
        raise node.error(f"attribute {name}={values} must have {count} values for a 2-D "
                         "DeformConv")
    return values


@converter("DeformConv", since=19)
def deform_conv_19(node: OnnxNode) -> Expr:
    data, weight, offset = node.input(0), node.input(1), node.input(2)
    shape, kernel = shape_of(data), shape_of(weight)
    if len(shape) != 4 or len(kernel) != 4:
        raise node.error(f"only 2-D DeformConv is supported (data (N, C, H, W)); got data "
                         f"{shape} and weight {kernel}")
    if node.attr("kernel_shape") is not None and as_ints(node.attr("kernel_shape")) != \
            list(kernel[2:]):
        raise node.error(f"kernel_shape {as_ints(node.attr('kernel_shape'))} does not match "
                         f"weight {kernel}")
    offset_shape = shape_of(offset)
    dtype = tensor_type(data).dtype
    bias = node.optional_input(3)
    if bias is None:
        bias = Constant(np.zeros((kernel[0],), dtype))
    mask = node.optional_input(4)
    if mask is None:
        # One mask value per (offset group, kernel tap) pair, i.e. half the offset channels.
        mask = Constant(np.ones((offset_shape[0], offset_shape[1] // 2) + tuple(offset_shape[2:]),
                                dtype))
    return op.nn.deform_conv2d(
        data, weight, offset, bias, mask, strides=_pair(node, "strides", 1),
        padding=_pair(node, "pads", 0, 4), dilation=_pair(node, "dilations", 1),
        groups=node.attr("group", 1), offset_groups=node.attr("offset_group", 1))
