"""Elementwise operators: one output element from the input element at the same index.

All are kElemWise. Most are declared from a table (name, NumPy function, accepted dtypes);
those with attributes (clip, leaky_relu, cast) or a result dtype of their own (isnan, isinf,
logical_not -> bool) are small classes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..ir.op import Attr, Attrs, Op, OpPatternKind, register_op
from ..ir.types import TensorType, Type, cast_array, is_float, is_int


class ElementwiseOp(Op):
    """One tensor in, one tensor of the same shape out. ``float_only`` ops reject ints;
    ``out_dtype`` fixes the result dtype (else it is the input's)."""

    inputs = ("data",)
    pattern = OpPatternKind.kElemWise
    float_only: bool = False
    out_dtype: str | None = None

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        (data,) = self.expect_tensors(arg_types)
        if self.float_only and not is_float(data.dtype):
            raise self.type_error(f"input 'data' must be floating point, got {data.dtype}")
        if data.dtype == "bool" and self.out_dtype is None and self.name not in _BOOL_OK:
            raise self.type_error("input 'data' is bool; cast it to a number first")
        return TensorType(data.shape, self.out_dtype or data.dtype)


_BOOL_OK = ("logical_not", "cast", "copy")


def _erf(x: np.ndarray) -> np.ndarray:
    """erf with NumPy only (Abramowitz-Stegun 7.1.26 is too coarse for an oracle), so use
    the vectorized math.erf in float64."""
    import math

    return np.vectorize(math.erf, otypes=[np.float64])(x.astype(np.float64))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # Split by sign so exp never overflows: 1/(1+e^-x) for x >= 0, e^x/(1+e^x) below.
    x64 = x.astype(np.float64)
    out = np.empty_like(x64)
    pos = x64 >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-x64[pos]))
    ex = np.exp(x64[~pos])
    out[~pos] = ex / (1.0 + ex)
    return out


def _round_half_even(x: np.ndarray) -> np.ndarray:
    return np.round(x)  # NumPy rounds half to even, as ONNX Round does


# name, NumPy implementation, float_only
_TABLE: list[tuple[str, Callable[[np.ndarray], Any], bool, str]] = [
    ("negative", np.negative, False, "-x"),
    ("abs", np.abs, False, "|x|"),
    ("exp", np.exp, True, "e to the power x"),
    ("log", np.log, True, "natural logarithm"),
    ("sqrt", np.sqrt, True, "square root"),
    ("rsqrt", lambda x: 1.0 / np.sqrt(x), True, "1 / sqrt(x)"),
    ("sigmoid", _sigmoid, True, "1 / (1 + exp(-x))"),
    ("tanh", np.tanh, True, "hyperbolic tangent"),
    ("erf", _erf, True, "the Gauss error function"),
    ("floor", np.floor, True, "round toward minus infinity"),
    ("ceil", np.ceil, True, "round toward plus infinity"),
    ("round", _round_half_even, True, "round half to even"),
    ("trunc", np.trunc, True, "round toward zero"),
    ("sign", np.sign, False, "-1, 0 or 1 by the sign of x"),
    ("sin", np.sin, True, "sine"),
    ("cos", np.cos, True, "cosine"),
    ("tan", np.tan, True, "tangent"),
    ("asin", np.arcsin, True, "inverse sine"),
    ("acos", np.arccos, True, "inverse cosine"),
    ("atan", np.arctan, True, "inverse tangent"),
    ("sinh", np.sinh, True, "hyperbolic sine"),
    ("cosh", np.cosh, True, "hyperbolic cosine"),
    ("asinh", np.arcsinh, True, "inverse hyperbolic sine"),
    ("acosh", np.arccosh, True, "inverse hyperbolic cosine"),
    ("atanh", np.arctanh, True, "inverse hyperbolic tangent"),
    ("copy", np.copy, False, "the same values"),
    ("nn.relu", lambda x: np.maximum(x, np.zeros((), x.dtype)), False, "max(x, 0)"),
]


def _declare_unary(name: str, fn: Callable[[np.ndarray], Any], float_only: bool, doc: str) -> None:
    cls = type(
        f"Op_{name.replace('.', '_')}",
        (ElementwiseOp,),
        {
            "name": name,
            "float_only": float_only,
            "doc": f"Elementwise {doc}.",
            "reference": lambda self, data: fn(data),
        },
    )
    register_op(cls)


for _name, _fn, _float_only, _doc in _TABLE:
    _declare_unary(_name, _fn, _float_only, _doc)


@register_op
class LogicalNot(ElementwiseOp):
    name = "logical_not"
    doc = "Elementwise boolean negation; the input must be bool."
    out_dtype = "bool"

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        (data,) = self.expect_tensors(arg_types)
        if data.dtype != "bool":
            raise self.type_error(f"input 'data' must be bool, got {data.dtype}")
        return TensorType(data.shape, "bool")

    def reference(self, data: np.ndarray) -> np.ndarray:
        return np.logical_not(data)


@register_op
class BitwiseNot(ElementwiseOp):
    name = "bitwise_not"
    doc = "Elementwise bitwise complement of an integer tensor."

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        (data,) = self.expect_tensors(arg_types)
        if not is_int(data.dtype):
            raise self.type_error(f"input 'data' must be an integer tensor, got {data.dtype}")
        return TensorType(data.shape, data.dtype)

    def reference(self, data: np.ndarray) -> np.ndarray:
        return np.invert(data)


@register_op
class IsNaN(ElementwiseOp):
    name = "isnan"
    doc = "True where the input is NaN."
    float_only = True
    out_dtype = "bool"

    def reference(self, data: np.ndarray) -> np.ndarray:
        return np.isnan(data)


@register_op
class IsInf(ElementwiseOp):
    name = "isinf"
    doc = "True where the input is plus or minus infinity."
    float_only = True
    out_dtype = "bool"

    def reference(self, data: np.ndarray) -> np.ndarray:
        return np.isinf(data)


@register_op
class Clip(ElementwiseOp):
    name = "clip"
    doc = "Clamp every element to [a_min, a_max]."
    attrs = {"a_min": Attr("float", required=True), "a_max": Attr("float", required=True)}

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        if attrs.a_min > attrs.a_max:
            raise self.type_error(f"attribute 'a_min'={attrs.a_min} exceeds 'a_max'={attrs.a_max}")
        return super().infer(arg_types, attrs)

    def reference(self, data: np.ndarray, a_min: float, a_max: float) -> np.ndarray:
        return np.clip(data, a_min, a_max)


@register_op
class LeakyRelu(ElementwiseOp):
    name = "nn.leaky_relu"
    doc = "x where x > 0, alpha * x elsewhere."
    float_only = True
    attrs = {"alpha": Attr("float", 0.01)}

    def reference(self, data: np.ndarray, alpha: float) -> np.ndarray:
        return np.where(data > 0, data, data * data.dtype.type(alpha))


@register_op
class Cast(ElementwiseOp):
    name = "cast"
    doc = ("Convert every element to ``dtype``. Float to integer: NaN gives 0, anything else is "
           "truncated toward zero and saturated to the target's range (-3.7 -> uint8 is 0, 300 "
           "is 255, inf is 255). C leaves these conversions undefined and NumPy and ONNX "
           "Runtime give the CPU's answer (on x86 -3.7 -> uint8 is 253, 1e10 -> int32 is "
           "INT32_MIN); the reference, constant folding and compiled kernels all follow this "
           "rule instead (:func:`opfusion.ir.types.cast_array`). Integer to narrower integer "
           "wraps (two's complement); anything non-zero, NaN included, is True.")
    attrs = {"dtype": Attr("dtype", required=True)}

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        (data,) = self.expect_tensors(arg_types)
        return TensorType(data.shape, attrs.dtype)

    def reference(self, data: np.ndarray, dtype: str) -> np.ndarray:
        return cast_array(data, dtype)
