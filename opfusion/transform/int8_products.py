"""Integer products of 8-bit operands in words: the part of PackMatmulWeights that packs the
constant weights of quantized products.

ONNX's MatMulInteger (ONNX Runtime's ``quantize_dynamic`` makes one of every MatMul of a
transformer) and the products inside QLinearMatMul import as an exact int32 product::

    nn.matmul(cast(x: uint8 or int8, int32) - zero_point, weight: int32 constant)

Computed so, every multiply-add is an int32 one (``vpmulld``, ten cycles): the quantized BERT
layer took 25 ms against 7.7 ms in float with AVX-512, 32 against 14 with AVX2. With
AVX512-VNNI, ``vpdpbusd`` multiplies 64 unsigned bytes by 64 signed ones and adds each group of
four products to one int32 lane: four times the multiply-adds of a float instruction; with
AVX2 (or AVX512-BW), ``vpmaddwd`` multiplies 16-bit halves and adds each pair: exact for
8-bit values, and as many multiply-adds a vector as a float instruction (with its add).
Where the weight's values (after its own zero point, folded in) all fit int8, the product
becomes::

    nn.matmul_packed(nn.byte_words(x), panels, words=w) - zero_point' * column_sums

- ``nn.byte_words`` packs ``w`` activations (:func:`word_values`: 4 bytes with VNNI, 2 16-bit
  halves with AVX2) into one int32 word (int8 ones offset by 128, so each is unsigned, as
  ``vpdpbusd`` reads them); a kernel of its own, after the one that quantizes them;
- the panels hold the weight in the float products' column panels, ``w`` rows of the
  contraction interleaved in each int32 (zero rows and columns pad it to whole words and
  panels); the register tiles broadcast a word of the activations and multiply-add a panel
  vector with one ``vpdpbusd`` (``dot4_u8s8``) or a ``vpmaddwd`` and an add (``dot2_s16``)
  per accumulator;
- the zero point (plus 128 for int8 activations) times each column's sum of the weight, a
  constant, is subtracted in the product's epilogue: sum_k (x - z) w = sum_k x w - z sum_k w.

The result is the same int32 as before, exactly (the sums stay below 2^31 for contractions of
up to 65793 values, and larger ones are left as they were). A float product of dequantized
operands (ONNX Runtime's QDQ form) takes the same path when its weight is an int8 matrix
times a scale per column (:func:`dequantized_operands`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..ir.expr import Call, Constant, Expr
from ..ir.op import Op, get_op
from ..ir.types import TensorType
from ..target import Target
from .simplify_expr import codes_bounds

#: Longest contraction whose sum of products of bytes (at most 255 * 128 each in magnitude)
#: stays inside int32.
MAX_DEPTH = (2**31 - 1) // (255 * 128)


def has_vnni(target: Target) -> bool:
    """Whether ``target`` multiplies bytes in int32 lanes with ``vpdpbusd`` at its vector
    width: AVX512-VNNI on 64-byte vectors, or on 32-byte ones with AVX512-VL or AVX-VNNI."""
    width = target.vector_lanes("int32") * 4
    if width == 32 and target.has("avxvnni"):
        return True
    if not target.has("avx512vnni"):
        return False
    return width == 64 or (width == 32 and target.has("avx512vl"))


def word_values(target: Target) -> int:
    """Values in each int32 word of ``target``'s products of words: 4 bytes with VNNI
    (``vpdpbusd``: 4 multiply-adds a lane, in one instruction), 2 16-bit halves with AVX2
    (``vpmaddwd`` and an add: 2 a lane, as many a vector as a float multiply-add, exactly;
    the int32 multiplies it replaces, ``vpmulld``, take ten cycles), AVX-512 wide ones with
    AVX512-BW; 0 (the int32 product stays) elsewhere."""
    if has_vnni(target):
        return 4
    width = target.vector_lanes("int32") * 4
    if width == 64:
        return 2 if target.has("avx512bw") else 0
    return 2 if target.has("avx2") else 0


def words_beat_float(target: Target) -> bool:
    """Whether ``target``'s products of words outrun its float products, so that a float
    product of dequantized operands should take them: with VNNI (four times the
    multiply-adds an instruction), and with AVX2's pairs (as many, from operands a quarter
    and half the size: ONNX Runtime's QDQ BERT layer 17.6 -> 13.7 ms on a Xeon's AVX2). Not
    with 64-byte pairs, whose ``vpmaddwd`` runs on one port where float multiply-adds run on
    two (the same layer 8.0 -> 10.2 ms with AVX-512 and no VNNI)."""
    per_word = word_values(target)
    return per_word == 4 or (per_word == 2 and target.vector_lanes("int32") * 4 <= 32)


@dataclass(frozen=True)
class QuantizedProduct:
    """A product that runs as a product of words: ``activations`` (8-bit, or float32 codes
    to cast to ``codes`` first), their ``zero_point`` (an int32 scalar expression, an int, or
    None), the weight as int8 (K, N) and, for a float product of dequantized operands, the
    float32 scale of each column (the activations' scale times the weight column's)."""

    activations: Expr
    codes: str
    zero_point: Expr | int | None
    weight: np.ndarray
    scale: np.ndarray | None = None


def _product_weight(call: Call, dtype: str) -> np.ndarray | None:
    """The constant right operand of ``nn.matmul`` / ``nn.dense`` ``call`` as (K, N) when its
    result is ``dtype`` and its left operand is not transposed; else None."""
    if not (isinstance(call.op, Op) and call.op.name in ("nn.matmul", "nn.dense")):
        return None
    weight = call.args[1]
    out = call.checked_type
    if not (isinstance(weight, Constant) and isinstance(out, TensorType)
            and out.dtype == dtype and weight.data.dtype == np.dtype(dtype)
            and weight.data.ndim == 2):
        return None
    if call.op.name == "nn.matmul" and call.attrs.transpose_a:
        return None
    if call.args[0].checked_type.ndim < 2:
        return None
    values = weight.data
    if call.op.name == "nn.dense" or call.attrs.get("transpose_b"):
        values = values.T
    # (an empty contraction or result stays as it is: nothing to multiply)
    return values if 0 < values.shape[0] <= MAX_DEPTH and values.size else None


def quantized_operands(call: Call, dequantized: bool = True) -> QuantizedProduct | None:
    """The parts of ``call`` when it is an int32 ``nn.matmul`` or ``nn.dense`` of 8-bit
    activations (``cast(x, int32)``, less a scalar zero point) by a constant whose values
    fit int8 (MatMulInteger's import), or a float32 one of dequantized activations by a
    constant that is an int8 weight times a scale per column (ONNX Runtime's QDQ form); else
    None (the float ones only where ``dequantized``)."""
    values = _product_weight(call, "int32")
    if values is not None:
        activations, zero_point = widened_bytes(call.args[0])
        if activations is None or values.min() < -128 or values.max() > 127:
            return None
        return QuantizedProduct(activations, activations.checked_type.dtype, zero_point,
                                values.astype(np.int8))
    return dequantized_operands(call) if dequantized else None


def dequantized_operands(call: Call) -> QuantizedProduct | None:
    """The parts of a float32 product ``(where(isnan(c), 0, c) - z) * s`` times a constant
    weight: ``c`` the float codes of a QuantizeLinear (``clip`` to uint8's or int8's range),
    ``z`` and ``s`` scalar constants (DequantizeLinear of QuantizeLinear, as the ONNX import
    keeps the pair in float), and the weight exactly an int8 matrix times a float32 scale
    per column (:func:`int8_columns`: a DequantizeLinear of int8 weights, folded at import).

    The product of words computes sum_k (c - z) q exactly, then scales it by s times the
    column's scale once; the float product rounded each term and each partial sum, so the
    two differ by that rounding (about 1e-7 of the result's magnitude), as the integer
    products of ONNX Runtime and OpenVINO do on the same model."""
    values = _product_weight(call, "float32")
    if values is None:
        return None
    found = dequantized_codes(call.args[0])
    if found is None:
        return None
    codes, codes_dtype, zero_point, scale = found
    columns = int8_columns(values)
    if columns is None:
        return None
    weight, column_scales = columns
    return QuantizedProduct(codes, codes_dtype, zero_point, weight,
                            (np.float32(scale) * column_scales).astype(np.float32))


def _scalar(expr: Expr) -> float | None:
    """The value of a finite float32 scalar constant (one element); None for anything else,
    NaN and infinities too: no scale, zero point or shift is one."""
    if isinstance(expr, Constant) and expr.data.size == 1 and expr.data.dtype == np.float32:
        value = float(expr.data.reshape(()))
        return value if math.isfinite(value) else None
    return None


def _call(expr: Expr, name: str) -> Call | None:
    if isinstance(expr, Call) and isinstance(expr.op, Op) and expr.op.name == name:
        return expr
    return None


def dequantized_codes(data: Expr) -> tuple[Expr, str, int, float] | None:
    """(the float codes, their 8-bit dtype, the zero point, the scale) of ``data`` =
    ``(where(isnan(c), 0, c) - z) * s`` (or without ``- z``, or without ``* s``: scale 1,
    where FoldScaleAxis moved ``s`` into the weight), ``c`` = ``clip(v, lo, hi)`` of whole
    numbers ``v`` (:func:`_whole`) inside an 8-bit range, or such codes moved or
    concatenated (:func:`.simplify_expr.codes_bounds`; with no ``where`` where they are never
    NaN); else None."""
    values, factor = data, 1.0
    product = _call(data, "multiply")
    if product is not None:
        values, scale = product.args
        if _scalar(scale) is None:
            values, scale = scale, values
        found = _scalar(scale)
        if found is None or not np.isfinite(found) or found <= 0:
            return None
        factor = found
    zero_point = 0.0
    shifted = _call(values, "subtract")
    if shifted is not None:
        point = _scalar(shifted.args[1])
        if point is None or point != round(point):
            return None
        values, zero_point = shifted.args[0], point
    kept = _call(values, "where")
    if kept is not None:
        test, zero, codes = kept.args
        nan = _call(test, "isnan")
        if nan is None or nan.args[0] is not codes or _scalar(zero) != 0.0:
            return None
        found = codes_bounds(codes)
    else:  # codes that are never NaN need no where (SimplifyExpr drops it)
        codes = values
        found = codes_bounds(codes)
        if found is not None and not found[2]:
            return None
    if found is None or codes.checked_type.dtype != "float32":
        return None
    low, high = found[0], found[1]
    for dtype, (lo, hi) in (("uint8", (0, 255)), ("int8", (-128, 127))):
        if lo <= low and high <= hi:
            return codes, dtype, int(zero_point), factor
    return None


def codes_range(codes: Expr) -> tuple[int, int] | None:
    """(low, high) of ``codes`` = ``clip(v, low, high)`` with whole bounds, ``v`` whole numbers
    by its form (:func:`_whole`): every value ``codes`` takes is one of low, ..., high, or NaN
    (a QuantizeLinear before its cast); else None."""
    clip = _call(codes, "clip")
    if clip is None:
        return None
    low, high = clip.attrs.a_min, clip.attrs.a_max
    if not (math.isfinite(low) and math.isfinite(high)):  # a NaN or infinite bound
        return None
    if low != round(low) or high != round(high) or not _whole(clip.args[0]):
        return None
    return int(low), int(high)


def _whole(expr: Expr) -> bool:
    """Whether ``expr`` is whole numbers (or NaN, or infinite) by its form: a ``round``, plus
    or minus whole scalar constants (QuantizeLinear's ``round(x / s) + z``)."""
    while True:
        shifted = _call(expr, "add") or _call(expr, "subtract")
        if shifted is None:
            return _call(expr, "round") is not None
        point = _scalar(shifted.args[1])
        if point is None or point != round(point) or abs(point) > 2**24:
            return False
        expr = shifted.args[0]


#: How far (in units in the last place of each value) ``float32(q) * scale`` may be from a
#: weight that :func:`int8_columns` takes as int8 codes times a scale: the products were
#: rounded once by DequantizeLinear's fold and may be once more by a folded scale (the
#: activations' scale, which FoldScaleAxis moves into the weight).
MAX_WEIGHT_ULPS = 2


def int8_columns(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(q, scales) with ``weight`` equal to ``float32(q) * scales`` to within MAX_WEIGHT_ULPS
    of each value, q int8 in [-127, 127], one float32 scale per column, when ``weight``
    (K, N) float32 is such a product (a DequantizeLinear of symmetric int8 weights, folded:
    quantizers take the scale as the column's largest magnitude over 127, 127.5 or 63); else
    None. Candidate scales come from each column's largest magnitude; a candidate counts only
    if it reproduces every value of its column (a float weight that is no such product misses
    by far more: a grid of 255 steps within two ulps, for every value of a column). Each
    column takes the first candidate that reproduces it exactly, else the closest within
    MAX_WEIGHT_ULPS (the first of equals); the candidates are tried on every column at once
    (ResNet-50's 53 convolutions: 50 s column by column), each first on a few rows
    (:data:`PROBE_ROWS`) and on the whole column only where those rows fit: a scale whose
    rows miss cannot fit the column, so the choice is the same, in a tenth of the time for
    weights whose scales were folded (no candidate exact: every one is tried)."""
    weight = np.asarray(weight, np.float32)
    largest = np.abs(weight).max(axis=0)
    live = largest > 0
    values = weight[:, live]
    ulps = np.spacing(np.abs(values))
    count = values.shape[1]
    done = np.zeros(count, bool)
    best_worst = np.full(count, np.inf)
    best_scale = np.ones(count, np.float32)
    best_codes = np.zeros(values.shape, np.int8)
    probe, probe_ulps = values[:PROBE_ROWS], ulps[:PROBE_ROWS]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for candidate in _candidate_scales(largest[live]):
            open_ = np.flatnonzero(~done)  # (the columns not reproduced exactly yet)
            if not open_.size:
                break
            fits, _ = _reproduces(probe[:, open_], probe_ulps[:, open_], candidate[open_])
            open_ = open_[fits]
            if not open_.size:
                continue
            scale = candidate[open_]
            fits, worst, codes = _reproduces(values[:, open_], ulps[:, open_], scale,
                                             codes=True)
            exact = fits & (worst == 0.0)
            closer = fits & ~exact & (worst < best_worst[open_])
            take = exact | closer
            best_codes[:, open_[take]] = codes[:, take].astype(np.int8)
            best_scale[open_[take]] = scale[take]
            best_worst[open_[closer]] = worst[closer]
            done[open_[exact]] = True
    if not np.all(done | np.isfinite(best_worst)):
        return None
    scales = np.ones(weight.shape[1], np.float32)
    q = np.zeros(weight.shape, np.int8)
    scales[live] = best_scale
    q[:, live] = best_codes
    return q, scales


#: Rows of a weight on which :func:`int8_columns` tries a candidate scale before the whole
#: column.
PROBE_ROWS = 16


def _reproduces(values: np.ndarray, ulps: np.ndarray, scale: np.ndarray, codes: bool = False):
    """For each column of ``values``: whether ``scale`` reproduces it as int8 codes within
    MAX_WEIGHT_ULPS (``ulps``: each value's unit in the last place), and its worst miss in
    ulps; with ``codes``, the codes too."""
    found = np.rint(values / scale)
    worst = (np.abs(found.astype(np.float32) * scale - values) / ulps).max(axis=0, initial=0)
    fits = (np.abs(found).max(axis=0, initial=0) <= 127) & (worst <= MAX_WEIGHT_ULPS)
    return (fits, worst, found) if codes else (fits, worst)


def _candidate_scales(largest: np.ndarray) -> list[np.ndarray]:
    """The candidate scales of columns of these largest magnitudes, in the order they are
    tried: 127 steps either side (127.5 and 128 by other rounding rules), or 63 with ONNX
    Runtime's reduce_range (7 bits, for processors without VNNI); each a few ulps either side
    (the fold's rounding)."""
    found = []
    for levels in (127.0, 127.5, 128.0, 63.0, 63.5, 64.0):
        centre = (largest / np.float32(levels)).astype(np.float32)
        for step in (0, -1, 1, -2, 2, -3, 3):
            found.append((centre + np.float32(step) * np.spacing(centre)).astype(np.float32))
    return found


#: Integers of magnitude up to 2^24 are exact in float32, and so is every sum of them that
#: stays inside: float multiply-adds compute such a product exactly, in any order.
FLOAT_EXACT = 1 << 24


def widened_magnitude(data: Expr) -> int | None:
    """The largest magnitude of ``data`` = ``cast(x, int32)`` less a constant scalar zero
    point, ``x`` 8-bit (:func:`widened_bytes`); else None."""
    source, point = widened_bytes(data)
    zero = 0 if point is None else zero_point_value(point)
    if source is None or zero is None:
        return None
    info = np.iinfo(source.checked_type.dtype)
    return max(abs(int(info.min) - zero), abs(int(info.max) - zero))


def zero_point_value(point: Expr) -> int | None:
    """The value of an int32 scalar constant zero point (or of a reshape of one, as
    :func:`widened_bytes` gives it); else None."""
    if isinstance(point, Call) and isinstance(point.op, Op) and point.op.name == "reshape":
        point = point.args[0]
    if isinstance(point, Constant) and point.data.size == 1 and point.data.dtype == np.int32:
        return int(point.data.reshape(()))
    return None


def exact_in_float(call: Call) -> bool:
    """Whether ``call`` is an int32 ``nn.matmul`` of two computed 8-bit operands, each
    ``cast(x, int32)`` less a constant zero point (QLinearMatMul's and MatMulInteger's import
    of an attention's products), whose every sum stays within :data:`FLOAT_EXACT`: the
    contraction times both operands' largest magnitudes. Float32 computes such a product
    exactly (an attention's 64-deep and 128-deep ones: 64 x 255 x 255 is 2^22)."""
    if not (isinstance(call.op, Op) and call.op.name == "nn.matmul"
            and call.checked_type.dtype == "int32" and not call.attrs.transpose_a):
        return False
    a, b = call.args
    magnitudes = [widened_magnitude(a), widened_magnitude(b)]
    if None in magnitudes or b.checked_type.ndim < 2:
        return False
    depth = a.checked_type.shape[-1]
    return depth * magnitudes[0] * magnitudes[1] <= FLOAT_EXACT  # type: ignore[operator]


def widened_bytes(data: Expr) -> tuple[Expr | None, Expr | None]:
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


def pack_words(values: np.ndarray, axis: int, per_word: int = 4) -> np.ndarray:
    """The int8 ``values`` with ``axis`` packed into int32 words of ``per_word`` consecutive
    values, the first lowest, as bytes (4) or 16-bit halves (2); zeros fill the last word
    (the axis becomes ceil(n / w) words)."""
    moved = np.moveaxis(values, axis, -1)
    count = -(-moved.shape[-1] // per_word)
    whole = np.zeros((*moved.shape[:-1], count * per_word), np.int8 if per_word == 4 else "<i2")
    whole[..., :moved.shape[-1]] = moved
    words = np.ascontiguousarray(whole).view("<i4").astype(np.int32)
    return np.ascontiguousarray(np.moveaxis(words, -1, axis))


def word_panels(weight: np.ndarray, cols: int, padded: int, per_word: int = 4) -> np.ndarray:
    """The int8 (K, N) ``weight`` as int32 panels (padded / cols, ceil(K / w), cols), ``w`` =
    ``per_word``: panel p, word row r, column j holds rows w r .. w r + w - 1 of column
    p * cols + j, the first lowest, as bytes (4) or 16-bit halves (2) (:func:`pack_words`);
    zero rows and columns pad it to whole words and ``padded`` columns."""
    words = pack_words(np.pad(weight, [(0, 0), (0, padded - weight.shape[1])]), 0, per_word)
    return np.ascontiguousarray(words.reshape(words.shape[0], padded // cols, cols)
                                .transpose(1, 0, 2))


def corrected(product: Expr, codes: str, zero_point: Expr | None,
              weight: np.ndarray) -> Expr:
    """``product`` (the sum of the words' byte products) less the activations' zero point
    times each column's sum of the weight; int8 activations (``codes``) were offset by 128
    into bytes, which adds 128 to their zero point."""
    if codes == "int8":
        offset = Constant(np.array(128, np.int32))
        zero_point = offset if zero_point is None else Call(get_op("add"), [zero_point, offset])
    if zero_point is None:
        return product
    sums = Constant(weight.astype(np.int32).sum(axis=0, dtype=np.int32))
    return Call(get_op("subtract"), [product, Call(get_op("multiply"), [zero_point, sums])])


__all__ = ["MAX_DEPTH", "QuantizedProduct", "codes_range", "corrected", "dequantized_codes",
           "dequantized_operands", "has_vnni",
           "int8_columns", "pack_words", "quantized_operands", "word_panels", "word_values",
           "words_beat_float"]
