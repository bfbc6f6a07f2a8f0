"""Integer products of 8-bit operands on VNNI: the part of PackMatmulWeights that packs the
constant weights of quantized products.

ONNX's MatMulInteger (ONNX Runtime's ``quantize_dynamic`` makes one of every MatMul of a
transformer) and the products inside QLinearMatMul import as an exact int32 product::

    nn.matmul(cast(x: uint8 or int8, int32) - zero_point, weight: int32 constant)

Computed so, every multiply-add is an int32 one (16 a vector on AVX-512): the quantized BERT
layer took 25 ms against 7.7 ms in float. On a target with AVX512-VNNI, ``vpdpbusd``
multiplies 64 unsigned bytes by 64 signed ones and adds each group of four products to one
int32 lane: four times the multiply-adds of a float instruction. Where the weight's values
(after its own zero point, folded in) all fit int8, the product becomes::

    nn.matmul_packed(nn.byte_words(x), panels, words=True) - zero_point' * column_sums

- ``nn.byte_words`` packs four activations into one int32 word (int8 ones offset by 128, so
  each byte is unsigned, as ``vpdpbusd`` reads them); it fuses into the kernel that quantizes
  them;
- the panels hold the weight in the float products' column panels, four rows of the
  contraction interleaved in each int32 (zero rows and columns pad it to whole words and
  panels); the register tiles broadcast a word of the activations and multiply-add a panel
  vector with one ``vpdpbusd`` per accumulator (``dot4_u8s8``);
- the zero point (plus 128 for int8 activations) times each column's sum of the weight, a
  constant, is subtracted in the product's epilogue: sum_k (x - z) w = sum_k x w - z sum_k w.

The result is the same int32 as before, exactly (the sums stay below 2^31 for contractions of
up to 65793 values, and larger ones are left as they were)."""

from __future__ import annotations

import numpy as np

from ..ir.expr import Call, Constant, Expr
from ..ir.op import Op, get_op
from ..ir.types import TensorType
from ..target import Target

#: Longest contraction whose sum of products of bytes (at most 255 * 128 each in magnitude)
#: stays inside int32.
MAX_DEPTH = (2**31 - 1) // (255 * 128)


def has_vnni(target: Target) -> bool:
    """Whether ``target`` multiplies bytes in int32 lanes with ``vpdpbusd`` at its vector
    width: AVX512-VNNI on 64-byte vectors, or on 32-byte ones with AVX512-VL."""
    if not target.has("avx512vnni"):
        return False
    width = target.vector_lanes("int32") * 4
    return width == 64 or (width == 32 and target.has("avx512vl"))


def quantized_operands(call: Call) -> tuple[Expr, Expr | None, np.ndarray] | None:
    """(the 8-bit activations, their int32 zero point or None, the weight as an int8 (K, N)
    array) when ``call`` is an int32 ``nn.matmul`` or ``nn.dense`` of 8-bit activations
    (``cast(x, int32)``, less a scalar zero point) by a constant whose values fit int8;
    else None."""
    if not (isinstance(call.op, Op) and call.op.name in ("nn.matmul", "nn.dense")):
        return None
    data, weight = call.args
    out = call.checked_type
    if not (isinstance(weight, Constant) and isinstance(out, TensorType)
            and out.dtype == "int32" and weight.data.dtype == np.int32
            and weight.data.ndim == 2):
        return None
    if call.op.name == "nn.matmul" and call.attrs.transpose_a:
        return None
    activations, zero_point = _widened_bytes(data)
    if activations is None or activations.checked_type.ndim < 2:
        return None
    values = weight.data
    if call.op.name == "nn.dense" or call.attrs.get("transpose_b"):
        values = values.T
    if values.shape[0] > MAX_DEPTH or values.min() < -128 or values.max() > 127:
        return None
    return activations, zero_point, values.astype(np.int8)


def _widened_bytes(data: Expr) -> tuple[Expr | None, Expr | None]:
    """(x, z) for ``cast(x, int32) - z`` or (x, None) for ``cast(x, int32)``, x 8-bit and z a
    scalar; (None, None) otherwise."""
    zero_point = None
    if (isinstance(data, Call) and isinstance(data.op, Op) and data.op.name == "subtract"):
        data, zero_point = data.args
        point = zero_point.checked_type
        if not (isinstance(point, TensorType) and point.size == 1 and point.dtype == "int32"):
            return None, None
        if point.ndim:
            zero_point = Call(get_op("reshape"), [zero_point], {"newshape": []})
    if not (isinstance(data, Call) and isinstance(data.op, Op) and data.op.name == "cast"
            and data.checked_type.dtype == "int32"):
        return None, None
    source = data.args[0]
    if source.checked_type.dtype not in ("uint8", "int8"):
        return None, None
    return source, zero_point


def word_panels(weight: np.ndarray, cols: int, padded: int) -> np.ndarray:
    """The int8 (K, N) ``weight`` as int32 panels (padded / cols, ceil(K / 4), cols): panel p,
    word row r, column j holds rows 4r .. 4r+3 of column p * cols + j, byte 0 the first; zero
    rows and columns pad it to whole words and ``padded`` columns."""
    depth, width = weight.shape
    rows = -(-depth // 4) * 4
    whole = np.zeros((rows, padded), np.int8)
    whole[:depth, :width] = weight
    grouped = whole.reshape(rows // 4, 4, padded // cols, cols).transpose(2, 0, 3, 1)
    return np.ascontiguousarray(grouped).view("<i4")[..., 0].astype(np.int32)


def corrected(product: Expr, activations: Expr, zero_point: Expr | None,
              weight: np.ndarray) -> Expr:
    """``product`` (the sum of the words' byte products) less the activations' zero point
    times each column's sum of the weight; int8 activations were offset by 128 into bytes,
    which adds 128 to their zero point."""
    if activations.checked_type.dtype == "int8":
        offset = Constant(np.array(128, np.int32))
        zero_point = offset if zero_point is None else Call(get_op("add"), [zero_point, offset])
    if zero_point is None:
        return product
    sums = Constant(weight.astype(np.int32).sum(axis=0, dtype=np.int32))
    return Call(get_op("subtract"), [product, Call(get_op("multiply"), [zero_point, sums])])


__all__ = ["MAX_DEPTH", "corrected", "has_vnni", "quantized_operands", "word_panels"]
