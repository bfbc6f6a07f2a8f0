"""Normalization operators: batch_norm (inference form), layer_norm, softmax, log_softmax and
lrn. All are kOpaque, as in TVM, until SimplifyInference decomposes the norms.

References compute in float64; the interpreter casts back to the input's dtype."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import OpAttributeError
from ..ir.op import Attr, Attrs, Op, OpPatternKind, register_op
from ..ir.types import TensorType, Type
from ._common import normalize_axis
from ._nn_common import (
    LAYOUT_ATTR,
    along,
    check_layout_data,
    check_positive,
    float_dtype,
    in_nchw,
    layout_block,
)


def _along(vector: np.ndarray, ndim: int, axis: int) -> np.ndarray:
    return along(vector.astype(np.float64), ndim, axis)


class _AxisNorm(Op):
    """data followed by 1-D parameters, each as long as data's ``axis``."""

    pattern = OpPatternKind.kOpaque
    attrs = {
        "axis": Attr("int", 1),
        "epsilon": Attr("float", 1e-5, doc="added to the variance before the square root"),
        "center": Attr("bool", True, doc="add beta"),
        "scale": Attr("bool", True, doc="multiply by gamma"),
    }

    def normalize_attrs(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["epsilon"] < 0:
            raise OpAttributeError(f"{self.name} attribute 'epsilon'={attrs['epsilon']} must "
                                   "not be negative")
        return attrs

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        types = self.expect_tensors(arg_types)
        float_dtype(self, types, self.inputs)
        data = types[0]
        axis = normalize_axis(self, attrs.axis, data.ndim)
        size = data.shape[axis]
        for name, ty in zip(self.inputs[1:], types[1:]):
            if ty.shape != (size,):
                raise self.type_error(
                    f"input {name!r} must be 1-D of data's axis {attrs.axis} size {size}, got "
                    f"{name} {ty.shape} for data {data.shape}; check the shapes or the 'axis' "
                    "attribute")
        return TensorType(data.shape, data.dtype)

    @staticmethod
    def affine(normed: np.ndarray, gamma: np.ndarray, beta: np.ndarray, axis: int,
               center: bool, scale: bool) -> np.ndarray:
        if scale:
            normed = normed * _along(gamma, normed.ndim, axis)
        if center:
            normed = normed + _along(beta, normed.ndim, axis)
        return normed


@register_op
class BatchNorm(_AxisNorm):
    name = "nn.batch_norm"
    doc = ("Inference batch norm: (x - moving_mean) / sqrt(moving_var + epsilon) * gamma + beta "
           "along ``axis``; one tensor out.")
    inputs = ("data", "gamma", "beta", "moving_mean", "moving_var")

    def reference(self, data: np.ndarray, gamma: np.ndarray, beta: np.ndarray,
                  moving_mean: np.ndarray, moving_var: np.ndarray, *, axis: int,
                  epsilon: float, center: bool, scale: bool) -> np.ndarray:
        ndim = data.ndim
        std = np.sqrt(_along(moving_var, ndim, axis) + epsilon)
        normed = (data.astype(np.float64) - _along(moving_mean, ndim, axis)) / std
        return self.affine(normed, gamma, beta, axis, center, scale)


@register_op
class LayerNorm(_AxisNorm):
    name = "nn.layer_norm"
    doc = "Normalize to zero mean and unit variance along ``axis``, then * gamma + beta."
    inputs = ("data", "gamma", "beta")
    attrs = {**_AxisNorm.attrs, "axis": Attr("int", -1)}

    def reference(self, data: np.ndarray, gamma: np.ndarray, beta: np.ndarray, *, axis: int,
                  epsilon: float, center: bool, scale: bool) -> np.ndarray:
        x = data.astype(np.float64)
        mean = x.mean(axis=axis, keepdims=True)
        var = np.square(x - mean).mean(axis=axis, keepdims=True)
        normed = (x - mean) / np.sqrt(var + epsilon)
        return self.affine(normed, gamma, beta, axis, center, scale)


class _SoftmaxBase(Op):
    inputs = ("data",)
    pattern = OpPatternKind.kOpaque
    attrs = {"axis": Attr("int", -1)}

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        (data,) = self.expect_tensors(arg_types)
        float_dtype(self, [data], self.inputs)
        normalize_axis(self, attrs.axis, data.ndim)
        return data

    @staticmethod
    def shifted(data: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
        """x - max(x) (so exp never overflows) and the log of the sum of its exponentials."""
        x = data.astype(np.float64)
        peak = x.max(axis=axis, keepdims=True, initial=-np.inf)  # -inf: a row of no elements
        shifted = x - np.where(np.isfinite(peak), peak, 0.0)
        return shifted, np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


@register_op
class Softmax(_SoftmaxBase):
    name = "nn.softmax"
    doc = "exp(x) / sum(exp(x)) along ``axis``, computed stably."

    def reference(self, data: np.ndarray, axis: int) -> np.ndarray:
        shifted, log_total = self.shifted(data, axis)
        return np.exp(shifted - log_total)


@register_op
class LogSoftmax(_SoftmaxBase):
    name = "nn.log_softmax"
    doc = "x - log(sum(exp(x))) along ``axis``, computed stably."

    def reference(self, data: np.ndarray, axis: int) -> np.ndarray:
        shifted, log_total = self.shifted(data, axis)
        return shifted - log_total


@register_op
class LRN(Op):
    name = "nn.lrn"
    doc = ("Local response normalization across ``axis`` (ONNX): x / (bias + alpha / size * "
           "sum of x^2 over ``size`` neighbours) ** beta. With ``layout='NCHW<k>c'`` the data "
           "is (N, C/k, H, W, k) and the window runs along the channels C (``axis`` 1).")
    inputs = ("data",)
    pattern = OpPatternKind.kOpaque
    attrs = {
        "size": Attr("int", 5, doc="neighbours summed, centred (the extra one after if even)"),
        "axis": Attr("int", 1),
        "bias": Attr("float", 2.0),
        "alpha": Attr("float", 1e-4),
        "beta": Attr("float", 0.75),
        "layout": LAYOUT_ATTR,
    }

    def normalize_attrs(self, attrs: dict[str, Any]) -> dict[str, Any]:
        check_positive(self, attrs, ("size",))
        if layout_block(self, attrs["layout"]) and attrs["axis"] != 1:
            raise OpAttributeError(f"{self.name} attribute 'axis'={attrs['axis']} must be 1 "
                                   f"with layout={attrs['layout']!r}: the window runs along "
                                   "the blocked channels")
        return attrs

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        (data,) = self.expect_tensors(arg_types)
        float_dtype(self, [data], self.inputs)
        if layout_block(self, attrs.layout):
            check_layout_data(self, data, attrs.layout)
        normalize_axis(self, attrs.axis, data.ndim)
        return data

    def reference(self, data: np.ndarray, *, size: int, axis: int, bias: float, alpha: float,
                  beta: float, layout: str) -> np.ndarray:
        return in_nchw(self._plain, data, layout, size=size, axis=axis, bias=bias, alpha=alpha,
                       beta=beta)

    @staticmethod
    def _plain(data: np.ndarray, *, size: int, axis: int, bias: float, alpha: float,
               beta: float) -> np.ndarray:
        x = data.astype(np.float64)
        axis = axis % x.ndim
        # ONNX: channel c sums c - floor((size-1)/2) .. c + ceil((size-1)/2), clipped; a
        # side longer than the channels past c reaches no further (a hostile size of 2^62
        # pads nothing more), while the scale keeps alpha / size
        reach = max(x.shape[axis] - 1, 0)
        before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
        before, after = min(before, reach), min(after, reach)
        pads = [(0, 0)] * x.ndim
        pads[axis] = (before, after)
        squares = np.pad(np.square(x), pads)
        sums = np.lib.stride_tricks.sliding_window_view(squares, before + after + 1,
                                                        axis=axis).sum(axis=-1)
        return x / np.power(bias + alpha / size * sums, beta)
