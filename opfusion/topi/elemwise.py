"""TE computes of the elementwise operators (opfusion/opdefs/elemwise.py): one output element from
the input element at the same index.

Most are one scalar function from a table. The te intrinsics cover the C99 math functions;
the inverse hyperbolic functions, ``sign``, ``isnan``/``isinf`` and ``bitwise_not`` are
written with exact expressions instead (see each one's comment), so results match the NumPy
references, NaN and signed zeros included."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import te
from ..tir.expr import PrimExpr, is_float
from ._util import int_info, is_unsigned, shape_of, stage_name
from .registry import register_compute

ScalarFn = Callable[[PrimExpr], PrimExpr]


def elementwise(op_name: str, data: te.Tensor, out_type: Any, fn: ScalarFn) -> te.Tensor:
    """``out[i] = fn(data[i])`` over the output's shape, tagged "elemwise"."""
    dtype = out_type.dtype
    return te.compute(shape_of(out_type), lambda *i: te.cast(fn(data[i]), dtype),
                      name=stage_name(op_name), tag="elemwise")


def _sign(x: PrimExpr) -> PrimExpr:
    one, zero = te.const(1, x.dtype), te.const(0, x.dtype)
    if is_unsigned(x.dtype):
        return te.select(x > zero, one, zero)
    # Floats: zero and NaN are their own sign, as np.sign returns them.
    rest = x if is_float(x.dtype) else zero
    return te.select(x > zero, one, te.select(x < zero, te.const(-1, x.dtype), rest))


def _negative(x: PrimExpr) -> PrimExpr:
    # Floats: multiply by -1 so that -(0.0) is -0.0 (0 - x would give +0.0).
    return x * te.const(-1.0, x.dtype) if is_float(x.dtype) else 0 - x


def _big(dtype: str) -> float:
    """Above this magnitude x*x loses x's low half (or overflows float16) and
    asinh(x) = acosh(x) = log(2x) to within rounding: 2**(mantissa bits / 2 + 1)."""
    return float(2 ** (np.finfo(np.dtype(dtype)).nmant // 2 + 1))


def _asinh(x: PrimExpr) -> PrimExpr:
    # asinh|x| = log1p(|x| + x^2 / (1 + sqrt(x^2 + 1))) keeps small |x| exact; log(2|x|)
    # past _big; the sign comes back by oddness (glibc's method).
    a = te.abs(x)
    small = te.log1p(a + a * a / (1.0 + te.sqrt(a * a + 1.0)))
    large = te.log(a) + math.log(2.0)
    r = te.select(a > _big(x.dtype), large, small)
    return te.select(x < 0, r * -1.0, r)


def _acosh(x: PrimExpr) -> PrimExpr:
    # acosh(x) = log1p(t + sqrt(2t + t^2)) with t = x - 1, exact near 1; log(2x) past _big.
    # Below 1 the square root (or the log1p) is of a negative number: NaN, as NumPy gives.
    t = x - 1.0
    small = te.log1p(t + te.sqrt(t * 2.0 + t * t))
    return te.select(x > _big(x.dtype), te.log(x) + math.log(2.0), small)


def _atanh(x: PrimExpr) -> PrimExpr:
    # atanh|x| = log1p(2|x| / (1 - |x|)) / 2: inf at 1, NaN beyond; odd in x.
    a = te.abs(x)
    r = te.log1p(a * 2.0 / (1.0 - a)) * 0.5
    return te.select(x < 0, r * -1.0, r)


def _isinf(x: PrimExpr) -> PrimExpr:
    return te.abs(x) == te.const(math.inf, x.dtype)


def _bitwise_not(x: PrimExpr) -> PrimExpr:
    # ~x is -1 - x in two's complement (never overflows) and max - x for unsigned.
    if is_unsigned(x.dtype):
        return te.const(int(int_info(x.dtype).max), x.dtype) - x
    return te.const(-1, x.dtype) - x


_UNARY: dict[str, ScalarFn] = {
    "negative": _negative,
    "abs": te.abs,
    "exp": te.exp,
    "log": te.log,
    "sqrt": te.sqrt,
    "rsqrt": te.rsqrt,
    "sigmoid": te.sigmoid,
    "tanh": te.tanh,
    "erf": te.erf,
    "floor": te.floor,
    "ceil": te.ceil,
    "round": te.round,  # half to even, as np.round
    "trunc": te.trunc,
    "sign": _sign,
    "sin": te.sin,
    "cos": te.cos,
    "tan": te.tan,
    "asin": te.asin,
    "acos": te.acos,
    "atan": te.atan,
    "sinh": te.sinh,
    "cosh": te.cosh,
    "asinh": _asinh,
    "acosh": _acosh,
    "atanh": _atanh,
    "copy": lambda x: x,
    # max(x, 0) keeps NaN (the C max helper propagates it, as np.maximum does)
    "nn.relu": lambda x: te.max(x, te.const(0, x.dtype)),
    "logical_not": lambda x: ~x,
    "bitwise_not": _bitwise_not,
    "isnan": lambda x: x != x,  # only NaN differs from itself (no -ffast-math in opfusion)
    "isinf": _isinf,
}


def _unary_compute(op_name: str, fn: ScalarFn) -> None:
    @register_compute(op_name)
    def compute(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
        return elementwise(op_name, inputs[0], out_type, fn)

    compute.__name__ = f"compute_{stage_name(op_name)}"
    compute.__doc__ = f"TE compute of {op_name}."


for _name, _fn in _UNARY.items():
    _unary_compute(_name, _fn)


def clip_bounds(dtype: str, a_min: float, a_max: float) -> tuple[PrimExpr | None, ...]:
    """The constants ``clip`` compares with in ``dtype``; None for a bound that clips nothing.

    For integers a fractional bound is truncated toward zero: np.clip returns the float bound,
    which the cast back to the integer dtype truncates, and trunc is monotone, so
    ``trunc(clip(x, lo, hi)) == clip(x, trunc(lo), trunc(hi))`` for integer x."""
    if is_float(dtype):
        low = None if a_min == -math.inf else te.const(a_min, dtype)
        high = None if a_max == math.inf else te.const(a_max, dtype)
        return low, high
    info = int_info(dtype)
    low_i = None if a_min == -math.inf else math.trunc(a_min)
    high_i = None if a_max == math.inf else math.trunc(a_max)
    low = None if low_i is None or low_i <= info.min else te.const(min(low_i, info.max), dtype)
    high = None if high_i is None or high_i >= info.max else te.const(max(high_i, info.min),
                                                                       dtype)
    return low, high


@register_compute("clip")
def compute_clip(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """min(max(x, a_min), a_max) as np.clip (NaN stays NaN)."""
    low, high = clip_bounds(inputs[0].dtype, attrs.a_min, attrs.a_max)

    def fn(x: PrimExpr) -> PrimExpr:
        if low is not None:
            x = te.max(x, low)
        if high is not None:
            x = te.min(x, high)
        return x

    return elementwise("clip", inputs[0], out_type, fn)


@register_compute("nn.leaky_relu")
def compute_leaky_relu(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """x where x > 0, alpha * x elsewhere (alpha rounded to the data's dtype)."""
    alpha = attrs.alpha
    return elementwise("nn.leaky_relu", inputs[0], out_type,
                       lambda x: te.select(x > 0, x, x * te.const(alpha, x.dtype)))


@register_compute("cast")
def compute_cast(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """A conversion: floats to integers give 0 for NaN and are truncated toward zero and
    saturated (the C code generator's helper; see opfusion.opdefs.elemwise.Cast), anything
    non-zero (NaN too) becomes True."""
    dtype = out_type.dtype
    return elementwise("cast", inputs[0], out_type, lambda x: te.cast(x, dtype))
