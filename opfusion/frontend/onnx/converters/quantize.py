"""Converters of ONNX's quantized operators, composed from integer and float IR operators so
they fuse and compile like any others: QuantizeLinear and DequantizeLinear (per tensor, per
axis and blocked), DynamicQuantizeLinear, MatMulInteger and ConvInteger (exact int32
arithmetic), QLinearMatMul and QLinearConv (int32 accumulation, then requantized); and the
steps (:func:`dequantized`, :func:`quantized`) of the operators defined by them (ONNX
Runtime's contrib operators: :mod:`.microsoft`).

Rounding is half to even (``round``, as ONNX and ONNX Runtime's ``nearbyint``); values are
saturated to the output type's range before the cast. Requantization multiplies the int32
accumulator, as float32, by ``a_scale * b_scale / y_scale`` computed once, as ONNX Runtime's
reference kernels do. Types without a NumPy dtype (int4, float8) are refused by the dtype
check of the importer."""

from __future__ import annotations

import numpy as np

from .... import op
from ....ir.expr import Call, Constant, Expr
from ..registry import OnnxNode, converter
from ..tensors import onnx_dtype
from ._common import checked_axis, tensor_type
from .nn import conv

_INTEGER_RANGE = {dtype: (np.iinfo(dtype).min, np.iinfo(dtype).max)
                  for dtype in ("int8", "uint8", "int16", "uint16", "int32", "uint32")}


# ---------------------------------------------------------------------------------------------
# QuantizeLinear / DequantizeLinear
# ---------------------------------------------------------------------------------------------
@converter("DequantizeLinear", since=10)
def dequantize_linear(node: OnnxNode) -> Expr:
    data, scale = node.input(0), node.input(1)
    zero_point = node.optional_input(2)
    out_dtype = _output_dtype(node, tensor_type(scale).dtype)
    scale = _along_axis(node, scale, data)
    codes = _fake_quantized(data)
    if codes is not None:
        # DequantizeLinear(QuantizeLinear(x)): the integer codes are exact in float, so the
        # pair stays in float (vectorized in the producer's kernel); a NaN code is 0, as the
        # cast to the integer type would make it.
        codes_dtype = tensor_type(codes).dtype
        values = op.where(op.isnan(codes), Constant(np.array(0, codes_dtype)), codes)
        if zero_point is not None:
            values = op.subtract(values, op.cast(_along_axis(node, zero_point, data),
                                                 dtype=codes_dtype))
        if codes_dtype != out_dtype:
            values = op.cast(values, dtype=out_dtype)
        return op.multiply(values, op.cast(scale, dtype=out_dtype))
    if tensor_type(data).dtype == "int32" and zero_point is None:
        return op.multiply(op.cast(data, dtype=out_dtype), op.cast(scale, dtype=out_dtype))
    shifted = op.cast(data, dtype="int32")
    if zero_point is not None:
        shifted = op.subtract(shifted, op.cast(_along_axis(node, zero_point, data),
                                               dtype="int32"))
    return op.multiply(op.cast(shifted, dtype=out_dtype), op.cast(scale, dtype=out_dtype))


@converter("QuantizeLinear", since=10)
def quantize_linear(node: OnnxNode) -> Expr:
    data, scale = node.input(0), node.input(1)
    zero_point = node.optional_input(2)
    out_dtype = (tensor_type(zero_point).dtype if zero_point is not None
                 else _output_dtype(node, "uint8"))
    if out_dtype not in _INTEGER_RANGE:
        raise node.error(f"quantizing to {out_dtype} is not supported (int8, uint8, int16, "
                         "uint16, int32)")
    float_dtype = tensor_type(scale).dtype
    values = data if tensor_type(data).dtype == float_dtype else op.cast(data,
                                                                         dtype=float_dtype)
    # ONNX divides by the scale (not multiply by its inverse): the same rounding as theirs.
    quantized = op.round(op.divide(values, _along_axis(node, scale, data)))
    if zero_point is not None:
        quantized = op.add(quantized, op.cast(_along_axis(node, zero_point, data),
                                              dtype=float_dtype))
    return _saturate(quantized, out_dtype)


def dequantized(node: OnnxNode, data: Expr, scale: Expr, zero_point: Expr | None,
                axis: int = 1) -> Expr:
    """DequantizeLinear of ``data`` as ``node``'s part (an operator defined as dequantize,
    compute in float, quantize): what :func:`dequantize_linear` makes of it."""
    return dequantize_linear(_part(node, [data, scale, zero_point], axis))


def quantized(node: OnnxNode, values: Expr, scale: Expr, zero_point: Expr | None,
              dtype: str, axis: int = 1) -> Expr:
    """QuantizeLinear of float ``values`` to ``dtype`` (the type of ``zero_point`` when there
    is one) as ``node``'s part: what :func:`quantize_linear` makes of it."""
    if zero_point is None:
        zero_point = Constant(np.array(0, dtype=dtype))
    return quantize_linear(_part(node, [values, scale, zero_point], axis))


def _part(node: OnnxNode, inputs: list[Expr | None], axis: int) -> OnnxNode:
    """``node`` seen as a quantize or dequantize step of ``inputs`` (errors name ``node``)."""
    return OnnxNode(node.name, node.op_type, inputs, {"axis": axis}, node.opset, 1)


def _output_dtype(node: OnnxNode, default: str) -> str:
    """The ``output_dtype`` attribute (opset 21+) as a dtype name, else ``default``."""
    wanted = int(node.attr("output_dtype", 0))
    return onnx_dtype(wanted, f"attribute output_dtype of node {node.name!r}") if wanted \
        else default


def _along_axis(node: OnnxNode, param: Expr, data: Expr) -> Expr:
    """A scale or zero point shaped to broadcast against ``data``: a scalar as it is, a 1-D
    one along ``axis``, a blocked one (``block_size``) repeated along ``axis``."""
    param_type, data_type = tensor_type(param), tensor_type(data)
    block = int(node.attr("block_size", 0))
    if param_type.ndim == 0 or (param_type.size == 1 and not block):
        return op.reshape(param, newshape=[]) if param_type.ndim else param
    axis = checked_axis(node, int(node.attr("axis", 1)), data_type.ndim)
    if block:
        if param_type.ndim != data_type.ndim:
            raise node.error(f"a blocked scale must have the input's rank {data_type.ndim}, "
                             f"got shape {param_type.shape}")
        index = Constant(np.arange(data_type.shape[axis], dtype=np.int64) // block)
        if param_type.shape[axis] * block < data_type.shape[axis]:
            raise node.error(f"block_size={block} x {param_type.shape[axis]} blocks do not "
                             f"cover axis {axis} of size {data_type.shape[axis]}")
        return op.take(param, index, axis=axis)
    if param_type.ndim != 1 or param_type.shape[0] != data_type.shape[axis]:
        raise node.error(f"a per-axis scale or zero point must be 1-D of size "
                         f"{data_type.shape[axis]} (axis {axis} of the input "
                         f"{data_type.shape}); got shape {param_type.shape}")
    shape = [1] * data_type.ndim
    shape[axis] = data_type.shape[axis]
    return op.reshape(param, newshape=shape)


def _fake_quantized(value: Expr) -> Expr | None:
    """The float codes (``clip(round(x / scale) [+ zero_point], lo, hi)``) that ``value``
    casts to an 8- or 16-bit integer type, when ``value`` is QuantizeLinear's result as
    :func:`quantize_linear` builds it; else None."""
    if not (isinstance(value, Call) and value.op.name == "cast"
            and tensor_type(value).dtype in ("int8", "uint8", "int16", "uint16")):
        return None
    clipped = value.args[0]
    if not (isinstance(clipped, Call) and clipped.op.name == "clip"):
        return None
    rounded = clipped.args[0]
    if isinstance(rounded, Call) and rounded.op.name == "add":
        point = rounded.args[1]
        if not (isinstance(point, Constant) and np.all(np.round(point.data) == point.data)):
            return None
        rounded = rounded.args[0]
    if not (isinstance(rounded, Call) and rounded.op.name == "round"):
        return None
    low, high = _INTEGER_RANGE[tensor_type(value).dtype]
    if clipped.attrs.a_min < low or clipped.attrs.a_max > high:
        return None
    return clipped


def _saturate(values: Expr, dtype: str) -> Expr:
    low, high = _INTEGER_RANGE[dtype]
    return op.cast(op.clip(values, a_min=float(low), a_max=float(high)), dtype=dtype)


# ---------------------------------------------------------------------------------------------
# DynamicQuantizeLinear
# ---------------------------------------------------------------------------------------------
@converter("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear(node: OnnxNode) -> list[Expr]:
    data = node.input(0)
    dtype = tensor_type(data).dtype
    zero = Constant(np.array(0, dtype=dtype))
    low = op.minimum(op.min(data), zero)
    high = op.maximum(op.max(data), zero)
    scale = op.divide(op.subtract(high, low), Constant(np.array(255, dtype=dtype)))
    zero_point = op.round(op.divide(op.negative(low), scale))
    zero_point = op.clip(zero_point, a_min=0.0, a_max=255.0)
    quantized = op.add(op.round(op.divide(data, scale)), zero_point)
    return [_saturate(quantized, "uint8"), scale, op.cast(zero_point, dtype="uint8")]


# ---------------------------------------------------------------------------------------------
# integer products
# ---------------------------------------------------------------------------------------------
@converter("MatMulInteger", since=10)
def matmul_integer(node: OnnxNode) -> Expr:
    return integer_matmul(node, node.input(0), node.optional_input(2), node.input(1),
                           node.optional_input(3))


@converter("ConvInteger", since=10)
def conv_integer(node: OnnxNode) -> Expr:
    return _integer_conv(node, node.input(0), node.optional_input(2), node.input(1),
                         node.optional_input(3))


@converter("QLinearMatMul", since=10)
def qlinear_matmul(node: OnnxNode) -> Expr:
    acc = integer_matmul(node, node.input(0), node.input(2), node.input(3), node.input(5))
    return requantize(node, acc, node.input(1), node.input(4), node.input(6), node.input(7),
                       channel_axis=None)


@converter("QLinearConv", since=10)
def qlinear_conv(node: OnnxNode) -> Expr:
    acc = _integer_conv(node, node.input(0), node.input(2), node.input(3), node.input(5))
    bias = node.optional_input(8)
    if bias is not None:
        acc = op.add(acc, op.reshape(op.cast(bias, dtype="int32"),
                                     newshape=[-1] + [1] * (tensor_type(acc).ndim - 2)))
    return requantize(node, acc, node.input(1), node.input(4), node.input(6), node.input(7),
                       channel_axis=1)


def _widened(value: Expr, zero_point: Expr | None, shape: list[int] | None = None) -> Expr:
    """``value - zero_point`` in int32 (exact for 8- and 16-bit inputs)."""
    wide = op.cast(value, dtype="int32")
    if zero_point is None:
        return wide
    point = op.cast(zero_point, dtype="int32")
    if tensor_type(zero_point).ndim and shape is not None:
        point = op.reshape(point, newshape=shape)
    elif tensor_type(zero_point).ndim:
        point = op.reshape(point, newshape=[])
    return op.subtract(wide, point)


def integer_matmul(node: OnnxNode, a: Expr, a_zero: Expr | None, b: Expr,
                   b_zero: Expr | None) -> Expr:
    """The exact int32 product (a - a_zero) (b - b_zero) of 8-bit operands."""
    # A's zero point may be per row ([M]), B's per column ([N]).
    a_shape = [-1, 1] if a_zero is not None and tensor_type(a_zero).size > 1 else None
    b_shape = [-1] if b_zero is not None and tensor_type(b_zero).size > 1 else None
    return op.nn.matmul(_widened(a, a_zero, a_shape), _widened(b, b_zero, b_shape))


def _integer_conv(node: OnnxNode, data: Expr, data_zero: Expr | None, weight: Expr,
                  weight_zero: Expr | None) -> Expr:
    rank = tensor_type(weight).ndim
    w_shape = ([-1] + [1] * (rank - 1) if weight_zero is not None
               and tensor_type(weight_zero).size > 1 else None)
    inner = OnnxNode(node.name, "Conv", [_widened(data, data_zero), _widened(weight, weight_zero,
                                                                              w_shape)],
                     node.attrs, node.opset, 1)
    return conv(inner)


def requantize(node: OnnxNode, acc: Expr, a_scale: Expr, b_scale: Expr, y_scale: Expr,
                y_zero: Expr, channel_axis: int | None) -> Expr:
    """round(acc * a_scale * b_scale / y_scale) + y_zero, saturated to y_zero's type."""
    ndim = tensor_type(acc).ndim
    multiplier = op.divide(op.multiply(a_scale, b_scale), op.reshape(y_scale, newshape=[]))
    size = tensor_type(multiplier).size
    if size > 1:  # per output channel: along axis 1 of a convolution, the last of a product
        shape = [1] * ndim
        shape[channel_axis if channel_axis is not None else ndim - 1] = size
        multiplier = op.reshape(multiplier, newshape=shape)
    elif tensor_type(multiplier).ndim:
        multiplier = op.reshape(multiplier, newshape=[])
    dtype = tensor_type(multiplier).dtype
    scaled = op.round(op.multiply(op.cast(acc, dtype=dtype), multiplier))
    out_dtype = tensor_type(y_zero).dtype
    shifted = op.add(scaled, op.cast(op.reshape(y_zero, newshape=[]), dtype=dtype))
    return _saturate(shifted, out_dtype)
