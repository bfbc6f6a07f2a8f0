"""Converters of ONNX Runtime's quantized contrib operators (domain ``com.microsoft``), which its
quantization tool writes in the QOperator format (``quantize_static(...,
quant_format=QuantFormat.QOperator)``): QLinearAdd, QLinearMul, QLinearSigmoid,
QLinearLeakyRelu, QLinearSoftmax, QLinearGlobalAveragePool, QLinearAveragePool,
QLinearConcat, QLinearWhere and QGemm, and the domain's own QuantizeLinear and
DequantizeLinear.

ONNX Runtime's documentation defines each as its float operator between the dequantization of
its inputs and the quantization of its result, and each imports so. Between two of them the
pair is the QDQ form that the quantized passes already take (tables of codes for the
sigmoid, products of words for the convolutions around). QLinearConcat requantizes each part
(quantizing is elementwise) and concatenates the bytes; a part already in the output's scale
and zero point is taken as it is. ONNX Runtime computes some of them
with fixed-point arithmetic or tables, so its codes may differ from the definition's by one
where a value lies within a rounding of a boundary. QGemm is an exact int32 product,
requantized as QLinearMatMul is, or scaled to float when it has no output scale."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .... import op
from ....ir.expr import Constant, Expr
from ....transform.simplify_expr import EXACT_SCALES
from ..registry import OnnxNode, converter
from ._common import shape_of as _shape
from ._common import tensor_type
from .activation import along_one_axis, coerced_to_2d
from .elementwise import scalar
from .nn import avg_pool, global_avg_pool
from .quantize import (
    dequantize_linear,
    dequantized,
    integer_matmul,
    quantize_linear,
    quantized,
    requantize,
)

#: ONNX Runtime's domain of contrib operators.
MICROSOFT = "com.microsoft"

converter("QuantizeLinear", domain=MICROSOFT)(quantize_linear)
converter("DequantizeLinear", domain=MICROSOFT)(dequantize_linear)


def _view(node: OnnxNode, op_type: str, inputs: Sequence[Expr], **attrs: object) -> OnnxNode:
    """``node`` seen as the float ``op_type`` of ``inputs`` (errors still name ``node``)."""
    return OnnxNode(node.name, op_type, list(inputs), attrs, node.opset, 1)


def _unary(node: OnnxNode, fn: Callable[[Expr], Expr]) -> Expr:
    """quantize(fn(dequantize(X))) with inputs X, X_scale, X_zero_point, Y_scale,
    Y_zero_point (the zero points optional: 0 of X's type)."""
    data = node.input(0)
    values = dequantized(node, data, node.input(1), node.optional_input(2))
    return quantized(node, fn(values), node.input(3), node.optional_input(4),
                     tensor_type(data).dtype)


def _binary(node: OnnxNode, fn: Callable[[Expr, Expr], Expr]) -> Expr:
    """quantize(fn(dequantize(A), dequantize(B))) with inputs A, A_scale, A_zero_point, B,
    B_scale, B_zero_point, C_scale, C_zero_point."""
    a, b = node.input(0), node.input(3)
    if tensor_type(a).dtype != tensor_type(b).dtype:
        raise node.error(f"A ({tensor_type(a).dtype}) and B ({tensor_type(b).dtype}) must "
                         "have one type")
    values = fn(dequantized(node, a, node.input(1), node.optional_input(2)),
                dequantized(node, b, node.input(4), node.optional_input(5)))
    return quantized(node, values, node.input(6), node.optional_input(7),
                     tensor_type(a).dtype)


@converter("QLinearAdd", domain=MICROSOFT)
def qlinear_add(node: OnnxNode) -> Expr:
    return _binary(node, op.add)


@converter("QLinearMul", domain=MICROSOFT)
def qlinear_mul(node: OnnxNode) -> Expr:
    return _binary(node, op.multiply)


@converter("QLinearSigmoid", domain=MICROSOFT)
def qlinear_sigmoid(node: OnnxNode) -> Expr:
    return _unary(node, op.sigmoid)


@converter("QLinearLeakyRelu", domain=MICROSOFT)
def qlinear_leaky_relu(node: OnnxNode) -> Expr:
    alpha = float(node.attr("alpha", 0.01))
    return _unary(node, lambda x: op.nn.leaky_relu(x, alpha=alpha))


@converter("QLinearSoftmax", domain=MICROSOFT)
def qlinear_softmax(node: OnnxNode) -> Expr:
    # ``opset`` is the float Softmax's: before 13 the input is coerced to 2-D at ``axis``.
    # (``axis`` defaults to -1 whatever the opset, as ONNX Runtime's schema declares.)
    version = node.attr("opset")
    if version is None:
        raise node.error("attribute 'opset' (the version of the Softmax it quantizes) is "
                         "required")
    single = int(version) >= 13
    attrs = {"axis": node.attr("axis", -1)}

    def softmax(values: Expr) -> Expr:
        view = _view(node, "Softmax", [values], **attrs)
        return (along_one_axis if single else coerced_to_2d)(
            view, lambda x, axis: op.nn.softmax(x, axis=axis))

    return _unary(node, softmax)


def _channels_first(node: OnnxNode, data: Expr, fn: Callable[[Expr], Expr]) -> Expr:
    """``fn`` of (N, C, spatial...) data; with ``channels_last`` the data is (N, spatial...,
    C) and goes through ``fn`` transposed."""
    if not node.attr("channels_last", 0):
        return fn(data)
    rank = len(_shape(data))
    if rank < 3:
        raise node.error(f"needs data of shape (N, spatial..., C), got {_shape(data)}")
    inward = [0, rank - 1, *range(1, rank - 1)]
    outward = [0, *range(2, rank), 1]
    return op.transpose(fn(op.transpose(data, axes=inward)), axes=outward)


@converter("QLinearGlobalAveragePool", domain=MICROSOFT)
def qlinear_global_average_pool(node: OnnxNode) -> Expr:
    return _unary(node, lambda values: _channels_first(
        node, values, lambda x: global_avg_pool(_view(node, "GlobalAveragePool", [x]))))


_POOL_ATTRS = ("auto_pad", "ceil_mode", "count_include_pad", "kernel_shape", "pads",
               "strides")


@converter("QLinearAveragePool", domain=MICROSOFT)
def qlinear_average_pool(node: OnnxNode) -> Expr:
    attrs = {name: node.attrs[name] for name in _POOL_ATTRS if name in node.attrs}
    return _unary(node, lambda values: _channels_first(
        node, values, lambda x: avg_pool(_view(node, "AveragePool", [x], **attrs))))


@converter("QLinearConcat", domain=MICROSOFT)
def qlinear_concat(node: OnnxNode) -> Expr:
    # Inputs: Y_scale, Y_zero_point, then (X, X_scale, X_zero_point) for each part.
    parts = node.inputs[2:]
    if not parts or len(parts) % 3:
        raise node.error(f"needs Y_scale, Y_zero_point and triples (X, X_scale, "
                         f"X_zero_point) of inputs; got {len(node.inputs)} inputs")
    if "axis" not in node.attrs:
        raise node.error("attribute 'axis' is required")
    scale, point = node.input(0), node.input(1)
    dtype = tensor_type(point).dtype
    codes = []
    for index in range(2, len(node.inputs), 3):
        data, data_scale, data_point = (node.input(index), node.input(index + 1),
                                        node.optional_input(index + 2))
        if tensor_type(data).dtype != dtype:
            raise node.error(f"input {index} ({tensor_type(data).dtype}) must have "
                             f"Y_zero_point's type {dtype}")
        # Quantizing is elementwise: each part is requantized on its own (in its producer's
        # kernel), and the bytes are concatenated; a part already in the output's scale and
        # zero point is its own requantization.
        if _same_quantization(data_scale, data_point, scale, point):
            codes.append(data)
        else:
            codes.append(quantized(node, dequantized(node, data, data_scale, data_point), scale,
                                   point, dtype))
    return op.concatenate(codes, axis=int(node.attr("axis")))


def _same_quantization(scale: Expr, point: Expr | None, other_scale: Expr,
                       other_point: Expr) -> bool:
    """Whether two (scale, zero point) pairs are the same constants, a scale within
    ``EXACT_SCALES``, where quantize(dequantize(q)) is q (no zero point: 0)."""
    values = []
    for expr in (scale, other_scale, point, other_point):
        if expr is None:
            values.append(0.0)
        elif isinstance(expr, Constant) and expr.data.size == 1:
            values.append(float(expr.data.reshape(())))
        else:
            return False
    low, high = EXACT_SCALES
    return values[0] == values[1] and values[2] == values[3] and low <= values[0] <= high


@converter("QLinearWhere", domain=MICROSOFT)
def qlinear_where(node: OnnxNode) -> Expr:
    # Inputs: condition, X, x_scale, x_zero_point, Y, y_scale, y_zero_point, z_scale,
    # z_zero_point.
    x, y, point = node.input(1), node.input(4), node.input(8)
    chosen = op.where(node.input(0),
                      dequantized(node, x, node.input(2), node.input(3)),
                      dequantized(node, y, node.input(5), node.input(6)))
    return quantized(node, chosen, node.input(7), point, tensor_type(point).dtype)


@converter("QGemm", domain=MICROSOFT)
def qgemm(node: OnnxNode) -> Expr:
    """(A - a_zero_point) (B - b_zero_point) + C in int32 (C the int32 bias, in the product's
    scale), then scaled by alpha * a_scale * b_scale: requantized to y_zero_point's type with
    y_scale, or the float result without."""
    a, b = node.input(0), node.input(3)
    for name, value in (("A", a), ("B", b)):
        if len(_shape(value)) != 2:
            raise node.error(f"input {name} must be 2-D, got {_shape(value)}")
    if node.attr("transA", 0):
        a = op.transpose(a, axes=[1, 0])
    if node.attr("transB", 0):
        b = op.transpose(b, axes=[1, 0])
    acc = integer_matmul(node, a, node.input(2), b, node.input(5))
    bias = node.optional_input(6)
    if bias is not None:
        if tensor_type(bias).dtype != "int32":
            raise node.error(f"the bias C must be int32, got {tensor_type(bias).dtype}")
        acc = op.add(acc, bias)
    alpha = float(node.attr("alpha", 1.0))
    a_scale = node.input(1)
    if alpha != 1.0:
        a_scale = op.multiply(a_scale, scalar(alpha, a_scale))
    y_scale = node.optional_input(7)
    if y_scale is None:
        scale = op.multiply(a_scale, node.input(4))
        if tensor_type(scale).ndim:
            scale = op.reshape(scale, newshape=[-1] if tensor_type(scale).size > 1 else [])
        return op.multiply(op.cast(acc, dtype=tensor_type(scale).dtype), scale)
    if node.optional_input(8) is None:
        raise node.error("y_zero_point is required with y_scale (its type is the output's)")
    return requantize(node, acc, a_scale, node.input(4), y_scale, node.input(8),
                       channel_axis=None)
