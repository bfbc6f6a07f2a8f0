"""Converters of ONNX's signal and text operators onto :mod:`opfusion.opdefs.signal`: DFT
(opset 17: axis attribute; 20: axis input), STFT (17), MelWeightMatrix (17) and
TfIdfVectorizer (9, integer pools only).

What decides a shape must be a constant: DFT's dft_length and axis, STFT's frame_step and
frame_length, and every input of MelWeightMatrix, which is computed at import (its shape
is num_mel_bins and dft_length)."""

from __future__ import annotations

import numpy as np

from .... import op
from ....ir.expr import Constant, Expr
from ....opdefs.signal import dft_length_default, mel_weight_matrix
from ..registry import OnnxNode, converter
from ..tensors import onnx_dtype
from ._common import shape_of, tensor_type
from .tensor import present, required_const


def _const_int(node: OnnxNode, index: int, what: str) -> int | None:
    """The one integer of constant input ``index``, None when it is absent."""
    if node.optional_input(index) is None:
        return None
    value = present(node.const_input(index, what))
    if value is None:
        return None
    if value.size != 1 or value.dtype.kind not in "iu":
        raise node.error(f"input {index} ({what}) must be one integer, got {value.dtype} "
                         f"{value.shape}")
    return int(value.reshape(-1)[0])


def _dft(node: OnnxNode, axis: int) -> Expr:
    data = node.input(0)
    shape = shape_of(data)
    if not -len(shape) <= axis < len(shape) - 1 or axis == -1:
        raise node.error(f"axis {axis} must name a signal axis of the input {shape} (not its "
                         "last, complex axis)")
    inverse, onesided = bool(node.attr("inverse", 0)), bool(node.attr("onesided", 0))
    length = _const_int(node, 1, "dft_length")
    if length is None:
        length = dft_length_default(shape[axis], inverse, onesided)
    if length < 1:
        raise node.error(f"dft_length {length} must be positive")
    return op.dft(data, axis=axis % len(shape), length=length, inverse=inverse,
                  onesided=onesided)


@converter("DFT", since=17)
def dft_17(node: OnnxNode) -> Expr:
    return _dft(node, int(node.attr("axis", 1)))


@converter("DFT", since=20)  # axis became an input, counted like any axis of the input
def dft_20(node: OnnxNode) -> Expr:
    axis = _const_int(node, 2, "axis")
    return _dft(node, -2 if axis is None else axis)


@converter("STFT", since=17)
def stft_17(node: OnnxNode) -> Expr:
    signal = node.input(0)
    shape = shape_of(signal)
    step = _const_int(node, 1, "frame_step")
    if step is None:
        raise node.error("input 1 (frame_step) is required but missing")
    window = node.optional_input(2)
    length = _const_int(node, 3, "frame_length")
    if length is None:
        length = shape_of(window)[0] if window is not None and shape_of(window) else shape[1]
    if window is None:
        window = Constant(np.ones((length,), tensor_type(signal).dtype))
    return op.stft(signal, window, frame_step=step, frame_length=length,
                   onesided=bool(node.attr("onesided", 1)))


@converter("MelWeightMatrix", since=17)
def mel_weight_matrix_17(node: OnnxNode) -> Expr:
    why = "; the matrix's shape and values are computed at import"
    values = [required_const(node, i, name + why) for i, name in enumerate(
        ("num_mel_bins", "dft_length", "sample_rate", "lower_edge_hertz", "upper_edge_hertz"))]
    if any(v.size != 1 for v in values):
        raise node.error(f"inputs must be scalars, got shapes {[v.shape for v in values]}")
    bins, length, rate = (int(v.reshape(-1)[0]) for v in values[:3])
    low, high = (float(v.reshape(-1)[0]) for v in values[3:])
    if bins < 1 or length < 1 or rate < 1:
        raise node.error(f"num_mel_bins ({bins}), dft_length ({length}) and sample_rate "
                         f"({rate}) must be positive")
    dtype = onnx_dtype(node.attr("output_datatype", 1),
                       f"MelWeightMatrix (node {node.name!r}): output_datatype")
    return Constant(mel_weight_matrix(bins, length, rate, low, high).astype(dtype))


@converter("TfIdfVectorizer", since=9)
def tfidf_vectorizer_9(node: OnnxNode) -> Expr:
    if node.attr("pool_strings"):
        raise node.error("string pools (pool_strings) are not supported: opfusion has no "
                         "string tensors; map the tokens to integers and use pool_int64s")
    weights = node.attr("weights")
    return op.tfidf_vectorizer(
        node.input(0), mode=node.attr("mode", "TF"),
        min_gram_length=node.attr("min_gram_length", 1),
        max_gram_length=node.attr("max_gram_length", 1),
        max_skip_count=node.attr("max_skip_count", 0),
        ngram_counts=list(node.attr("ngram_counts", [])),
        ngram_indexes=list(node.attr("ngram_indexes", [])),
        pool_int64s=list(node.attr("pool_int64s", [])),
        weights=list(weights) if weights is not None and len(weights) else None)
