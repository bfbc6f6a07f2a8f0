"""Signal and text operators: ``dft`` (ONNX DFT), ``stft`` (STFT), ``tfidf_vectorizer``
(TfIdfVectorizer on integer tokens), and :func:`mel_weight_matrix`, the NumPy work of ONNX
MelWeightMatrix (whose output shape is a value of its inputs, so the converter computes it
at import as a constant).

Complex tensors are ONNX's: a last axis of 2 holds (real, imaginary), a last axis of 1 a real
signal. All kOpaque with numpy.fft references in the input's precision, as onnx.reference
computes; the interpreter casts the result to the input's dtype."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import EvaluationError
from ..ir.op import Attr, Attrs, Op, OpPatternKind, register_op
from ..ir.types import TensorType, Type, is_float, is_int
from ._common import normalize_axis


def _complex(x: np.ndarray) -> np.ndarray:
    """The complex values of an ONNX signal (last axis 1: real, 2: real and imaginary), with
    that last axis dropped, in the signal's precision (complex64 up to float32): numpy.fft
    transforms in that precision, as onnx.reference (and the node tests' expected values)
    do, so even the rounding noise of zero parts agrees."""
    dtype = np.complex64 if x.dtype.itemsize <= 4 else np.complex128
    values = x[..., 0].astype(dtype)
    if x.shape[-1] == 2:
        values.imag = x[..., 1]
    return values


def _interleaved(values: np.ndarray) -> np.ndarray:
    """Complex values back to ONNX's (real, imaginary) last axis."""
    return np.stack([values.real, values.imag], axis=-1)


def _check_signal(op: Op, x: TensorType, name: str) -> None:
    if not is_float(x.dtype):
        raise op.type_error(f"input {name!r} must be float, got {x.dtype}")
    if x.ndim < 2 or x.shape[-1] not in (1, 2):
        raise op.type_error(f"input {name!r} {x.shape} must end in an axis of 1 (a real "
                            "signal) or 2 (real and imaginary parts)")


# ---------------------------------------------------------------------------------------------
# DFT


def dft_length_default(size: int, inverse: bool, onesided: bool) -> int:
    """ONNX DFT's length when ``dft_length`` is absent: the axis size, or for an inverse
    one-sided transform the even length whose half spectrum that size is."""
    return 2 * (size - 1) if inverse and onesided else size


@register_op
class DFT(Op):
    name = "dft"
    doc = ("The discrete Fourier transform of ``data`` along ``axis`` (ONNX DFT): the signal "
           "is cut or zero-padded to ``length``; ``onesided`` keeps the first length // 2 + 1 "
           "frequencies (forward) or reads them as a Hermitian half spectrum and returns the "
           "real signal (inverse); ``inverse`` divides by the length.")
    inputs = ("data",)
    pattern = OpPatternKind.kOpaque
    attrs = {
        "axis": Attr("int", 1, doc="the transformed axis (not the last, complex one)"),
        "length": Attr("int", required=True, doc="the transform's length"),
        "inverse": Attr("bool", False, doc="the inverse transform"),
        "onesided": Attr("bool", False, doc="half spectrum, for real signals"),
    }

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        (data,) = self.expect_tensors(arg_types)
        _check_signal(self, data, "data")
        axis = normalize_axis(self, attrs.axis, data.ndim)
        if axis == data.ndim - 1:
            raise self.type_error(f"attribute 'axis'={attrs.axis} is the last axis, which "
                                  "holds the real and imaginary parts; pick a signal axis")
        if attrs.length < 1:
            raise self.type_error(f"attribute 'length'={attrs.length} must be positive")
        shape = list(data.shape)
        if attrs.inverse:
            shape[axis] = attrs.length
            shape[-1] = 1 if attrs.onesided else 2
        else:
            shape[axis] = attrs.length // 2 + 1 if attrs.onesided else attrs.length
            shape[-1] = 2
        return TensorType(shape, data.dtype)

    def reference(self, data: np.ndarray, axis: int, length: int, inverse: bool,
                  onesided: bool) -> np.ndarray:
        axis %= data.ndim
        signal = _complex(data)
        if inverse and onesided:
            return np.fft.irfft(signal, n=length, axis=axis)[..., None]
        if inverse:
            return _interleaved(np.fft.ifft(signal, n=length, axis=axis))
        spectrum = np.fft.fft(signal, n=length, axis=axis)
        if onesided:
            spectrum = np.take(spectrum, np.arange(length // 2 + 1), axis=axis)
        return _interleaved(spectrum)


# ---------------------------------------------------------------------------------------------
# STFT


@register_op
class STFT(Op):
    name = "stft"
    doc = ("Short-time Fourier transform (ONNX STFT): ``data`` (N, L, 1 or 2) is cut into "
           "frames of ``frame_length`` every ``frame_step`` samples, each weighted by "
           "``window`` and transformed; (N, frames, bins, 2) with frames = 1 + (L - "
           "frame_length) // frame_step and bins frame_length // 2 + 1 when ``onesided``.")
    inputs = ("data", "window")
    pattern = OpPatternKind.kOpaque
    attrs = {
        "frame_step": Attr("int", required=True, doc="samples between frame starts"),
        "frame_length": Attr("int", required=True, doc="samples per frame"),
        "onesided": Attr("bool", True, doc="keep frame_length // 2 + 1 frequencies"),
    }

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        data, window = self.expect_tensors(arg_types)
        _check_signal(self, data, "data")
        if data.ndim != 3:
            raise self.type_error(f"input 'data' must be (batch, length, 1 or 2), got "
                                  f"{data.shape}")
        step, length = attrs.frame_step, attrs.frame_length
        if step < 1 or not 1 <= length <= data.shape[1]:
            raise self.type_error(
                f"frame_step={step} must be positive and frame_length={length} in 1.."
                f"{data.shape[1]}, the signal's length")
        if window.shape != (length,) or not is_float(window.dtype):
            raise self.type_error(f"input 'window' must be float ({length},) as frame_length "
                                  f"is {length}; got {window.dtype} {window.shape}")
        frames = 1 + (data.shape[1] - length) // step
        bins = length // 2 + 1 if attrs.onesided else length
        return TensorType((data.shape[0], frames, bins, 2), data.dtype)

    def reference(self, data: np.ndarray, window: np.ndarray, frame_step: int,
                  frame_length: int, onesided: bool) -> np.ndarray:
        frames = 1 + (data.shape[1] - frame_length) // frame_step
        starts = np.arange(frames) * frame_step
        samples = _complex(data)[:, starts[:, None] + np.arange(frame_length)]
        spectrum = np.fft.fft(samples * window.astype(samples.real.dtype), axis=-1)
        if onesided:
            spectrum = spectrum[..., :frame_length // 2 + 1]
        return _interleaved(spectrum)


# ---------------------------------------------------------------------------------------------
# MelWeightMatrix


def mel_weight_matrix(num_mel_bins: int, dft_length: int, sample_rate: int,
                      lower_edge_hertz: float, upper_edge_hertz: float) -> np.ndarray:
    """ONNX MelWeightMatrix as onnx.reference computes it, in float64: (dft_length // 2 + 1,
    num_mel_bins) triangular filters, spaced evenly on the mel scale between the two edges."""
    bins = np.arange(0, num_mel_bins + 2)
    low_mel = 2595 * np.log1p(lower_edge_hertz / 700) / np.log(10)
    high_mel = 2595 * np.log1p(upper_edge_hertz / 700) / np.log(10)
    # onnx.reference divides by num_mel_bins + 2 (the spec text says + 1); its node test
    # holds the reference's numbers.
    step = (high_mel - low_mel) / bins.shape[0]
    hertz = 700 * np.expm1((bins * step + low_mel) / 2595 * np.log(10))
    points = (((dft_length + 1) * hertz) // sample_rate).astype(np.int64)
    if points.min() < 0 or max(points[-2], points[-1] - 1) > dft_length // 2:
        raise EvaluationError(
            f"MelWeightMatrix: the filters span frequency bins {int(points.min())}.."
            f"{int(points.max())}, outside the {dft_length // 2 + 1} bins of a "
            f"{dft_length}-point DFT; keep 0 <= lower_edge_hertz < upper_edge_hertz <= "
            "sample_rate / 2")
    output = np.zeros((dft_length // 2 + 1, num_mel_bins))
    rows = np.arange(output.shape[0])[:, None]
    left, centre, right = points[:-2], points[1:-1], points[2:]
    rising = (rows >= left) & (rows <= centre)
    output = np.where(rising, (rows - left) / np.maximum(centre - left, 1), output)
    # A filter with no rising edge is 1 at its centre.
    output = np.where((centre == left) & (rows == centre), 1.0, output)
    falling = (rows >= centre) & (rows < right)
    return np.where(falling, (right - rows) / np.maximum(right - centre, 1), output)


# ---------------------------------------------------------------------------------------------
# TfIdfVectorizer


def _ngram_table(pool: Sequence[int], ngram_counts: Sequence[int], min_gram: int,
                 max_gram: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """The pool's n-grams of each size in [min_gram, max_gram]: size -> (grams (m, n), the
    index of each in the pool's n-gram order). A repeated n-gram keeps its last index, as
    onnx.reference's trie does."""
    table = {}
    index = 0
    for size, start in enumerate(ngram_counts, start=1):
        end = ngram_counts[size] if size < len(ngram_counts) else len(pool)
        count = max(end - start, 0) // size
        if min_gram <= size <= max_gram and count:
            grams = np.asarray(pool[start:start + count * size], np.int64).reshape(count, size)
            table[size] = (grams, np.arange(index, index + count))
        index += count
    return table


def tfidf_counts(data: np.ndarray, pool: Sequence[int], ngram_counts: Sequence[int],
                 ngram_indexes: Sequence[int], min_gram: int, max_gram: int,
                 max_skip: int) -> np.ndarray:
    """How often each pool n-gram occurs in each row of ``data`` (rows, len(ngram_indexes)
    columns placed by ``ngram_indexes``): n-grams of every size in [min_gram, max_gram] with
    0..max_skip tokens skipped between items; unigrams count once."""
    rows = data.reshape(-1, data.shape[-1] if data.ndim else 1).astype(np.int64)
    width = max(ngram_indexes) + 1
    counts = np.zeros((rows.shape[0], width), np.int64)
    for size, (grams, ids) in _ngram_table(pool, ngram_counts, min_gram, max_gram).items():
        columns = np.asarray(ngram_indexes, np.int64)[ids]
        for skip in range(max_skip + 1 if size > 1 else 1):
            span = (size - 1) * (skip + 1)
            if span >= rows.shape[1]:
                break
            starts = np.arange(rows.shape[1] - span)
            windows = rows[:, starts[:, None] + np.arange(size) * (skip + 1)]  # (B, S, n)
            # Match windows against the pool by sorting both into one list of unique rows.
            found = np.concatenate([grams, windows.reshape(-1, size)])
            _, labels = np.unique(found, axis=0, return_inverse=True)
            labels = labels.reshape(-1)
            column_of = np.full(labels.max() + 1, -1, np.int64)
            # A repeated pool n-gram keeps its last column: the first of the reversed list.
            _, last = np.unique(labels[:len(grams)][::-1], return_index=True)
            kept = len(grams) - 1 - last
            column_of[labels[kept]] = columns[kept]
            hits = column_of[labels[len(grams):]].reshape(rows.shape[0], -1)
            batch, position = np.nonzero(hits >= 0)
            np.add.at(counts, (batch, hits[batch, position]), 1)
    return counts


@register_op
class TfIdfVectorizer(Op):
    name = "tfidf_vectorizer"
    doc = ("ONNX TfIdfVectorizer on integer tokens: ``data`` (C,) or (B, C) -> float32 "
           "(max(ngram_indexes) + 1,) or (B, ...) of n-gram counts (TF), indicator weights "
           "(IDF) or weighted counts (TFIDF) of the n-grams in ``pool_int64s``.")
    inputs = ("data",)
    pattern = OpPatternKind.kOpaque
    attrs = {
        "mode": Attr("str", "TF", choices=("TF", "IDF", "TFIDF"), doc="the weighting"),
        "min_gram_length": Attr("int", 1, doc="the shortest n-gram counted"),
        "max_gram_length": Attr("int", 1, doc="the longest n-gram counted"),
        "max_skip_count": Attr("int", 0, doc="most tokens skipped between n-gram items"),
        "ngram_counts": Attr("ints", required=True,
                             doc="where the n-grams of size 1, 2, ... start in the pool"),
        "ngram_indexes": Attr("ints", required=True,
                              doc="the output column of each pool n-gram"),
        "pool_int64s": Attr("ints", required=True, doc="the n-grams, flattened"),
        "weights": Attr("floats", optional=True, doc="IDF/TFIDF: a weight per column"),
    }

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        (data,) = self.expect_tensors(arg_types)
        if not is_int(data.dtype):
            raise self.type_error(f"input 'data' must hold integer tokens, got {data.dtype}")
        if data.ndim > 2 or (data.ndim == 2 and data.shape[0] < 1):
            raise self.type_error(f"input 'data' must be (C,) or (B, C) with B > 0, got "
                                  f"{data.shape}")
        if not 1 <= attrs.min_gram_length <= attrs.max_gram_length or attrs.max_skip_count < 0:
            raise self.type_error(
                f"need 1 <= min_gram_length ({attrs.min_gram_length}) <= max_gram_length "
                f"({attrs.max_gram_length}) and max_skip_count ({attrs.max_skip_count}) >= 0")
        counts, pool = attrs.ngram_counts, attrs.pool_int64s
        if any(not 0 <= c <= len(pool) for c in counts) or list(counts) != sorted(counts):
            raise self.type_error(f"ngram_counts {counts} must be increasing offsets into the "
                                  f"pool of {len(pool)} tokens")
        total = sum(max((counts[i + 1] if i + 1 < len(counts) else len(pool)) - c, 0) // (i + 1)
                    for i, c in enumerate(counts))
        indexes = attrs.ngram_indexes
        if len(indexes) < total or not indexes or min(indexes) < 0:
            raise self.type_error(f"ngram_indexes {indexes} must give a column (>= 0) to each "
                                  f"of the pool's {total} n-grams")
        width = max(indexes) + 1
        if attrs.weights is not None and attrs.mode != "TF" and len(attrs.weights) < width:
            raise self.type_error(f"weights has {len(attrs.weights)} values for {width} "
                                  "output columns")
        return TensorType((data.shape[0], width) if data.ndim == 2 else (width,), "float32")

    def reference(self, data: np.ndarray, mode: str, min_gram_length: int,
                  max_gram_length: int, max_skip_count: int, ngram_counts: tuple,
                  ngram_indexes: tuple, pool_int64s: tuple, weights: tuple | None
                  ) -> np.ndarray:
        counts = tfidf_counts(data, pool_int64s, ngram_counts, ngram_indexes,
                              min_gram_length, max_gram_length, max_skip_count)
        counts = counts if data.ndim == 2 else counts[0]
        if mode == "TF":
            return counts.astype(np.float32)
        scale = (np.asarray(weights[:counts.shape[-1]], np.float32) if weights
                 else np.ones(counts.shape[-1], np.float32))
        if mode == "IDF":
            return np.where(counts > 0, scale, np.float32(0))
        return (scale * counts).astype(np.float32)
