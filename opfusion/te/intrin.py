"""Scalar functions for tensor expressions: math intrinsics, select, casts and constants.

Every function takes PrimExprs (or Python numbers) and returns a PrimExpr. Math functions want
float operands of one dtype; cast integers first with :func:`cast`."""

from __future__ import annotations

from typing import Any

from ..errors import TensorExprError
from ..tir.expr import (
    EXP_NORMAL_BELOW,
    PrimExpr,
    as_expr,
    call,
    cast,
    const,
    dot2_s16,
    dot4_u8s8,
    floordiv,
    floormod,
    is_float,
    logical_and,
    logical_or,
    power,
    select,
    sub,
)

__all__ = [
    "abs", "acos", "all", "any", "asin", "atan", "atan2", "cast", "ceil", "const", "cos",
    "cosh", "dot2_s16", "dot4_u8s8", "erf", "exp", "exp2", "exp_normal", "expm1", "floor",
    "floordiv",
    "floormod", "fmod",
    "if_then_else", "log", "log10", "log1p", "log2", "pow", "power", "round", "rsqrt", "select",
    "sigmoid", "sin", "sinh", "sqrt", "tan", "tanh", "trunc",
]


def _unary(name: str) -> Any:
    def fn(x: Any) -> PrimExpr:
        return call(name, x)

    fn.__name__ = name
    fn.__doc__ = f"Elementwise {name}(x) on a float expression."
    return fn


exp = _unary("exp")
exp2 = _unary("exp2")
expm1 = _unary("expm1")
log = _unary("log")
log2 = _unary("log2")
log10 = _unary("log10")
log1p = _unary("log1p")
sqrt = _unary("sqrt")
tanh = _unary("tanh")
erf = _unary("erf")
floor = _unary("floor")
ceil = _unary("ceil")
trunc = _unary("trunc")
round = _unary("round")  # noqa: A001  (half to even, like NumPy)
sin = _unary("sin")
cos = _unary("cos")
tan = _unary("tan")
asin = _unary("asin")
acos = _unary("acos")
atan = _unary("atan")
sinh = _unary("sinh")
cosh = _unary("cosh")


def atan2(y: Any, x: Any) -> PrimExpr:
    """Elementwise atan2(y, x)."""
    return call("atan2", y, x)


def fmod(x: Any, y: Any) -> PrimExpr:
    """C fmod: the remainder of x / y truncated towards zero, on floats."""
    return call("fmod", x, y)


pow = power  # noqa: A001


def rsqrt(x: Any) -> PrimExpr:
    """1 / sqrt(x)."""
    e = sqrt(x)
    return 1.0 / e


def exp_normal(x: Any) -> PrimExpr:
    """exp(x), or 0 where it would be a subnormal float32 (x below :data:`EXP_NORMAL_BELOW`),
    for float32 ``x`` (other dtypes: plain exp). For weights that are summed and normalized
    (softmax's, attention's): a weight below 2^-126 of a row whose largest is 1 changes no
    sum, and flushed it costs nothing downstream, where as a subnormal each product that
    reads it takes a microcode assist on Intel cores (Swin-T's attention masks of -100: its
    first product of such weights by the values 4.2 -> 0.22 ms on a Xeon, the model's
    kernels 73 -> 46 ms). oneDNN's exp zeroes its results below log(FLT_MIN) too.
    As a select, every backend and interpreter computes it as written; the CPU code
    generator makes it one helper whose subnormal lanes are never scaled
    (:mod:`opfusion.backend.cpu.vector_math`)."""
    e = as_expr(x)
    if e.dtype != "float32":
        return exp(e)
    return select(e < const(EXP_NORMAL_BELOW, "float32"), const(0.0, "float32"), exp(e))


def sigmoid(x: Any) -> PrimExpr:
    """1 / (1 + exp(-x))."""
    e = as_expr(x)
    return 1.0 / (1.0 + exp(-e))


def abs(x: Any) -> PrimExpr:  # noqa: A001
    """|x|: fabs for floats, a select for integers."""
    e = as_expr(x)
    if is_float(e.dtype):
        return call("fabs", e)
    return select(e < 0, sub(0, e), e)


def if_then_else(cond: Any, t: Any, f: Any) -> PrimExpr:
    """``t`` where ``cond`` holds, else ``f``; only the chosen branch is evaluated, so a guarded
    out-of-bounds read (padding) is safe."""
    c = as_expr(cond)
    if c.dtype != "bool":
        raise TensorExprError(
            f"te.if_then_else: the condition {c} is {c.dtype}; compare first (x != 0)"
        )
    return select(c, t, f)


def all(*conds: Any) -> PrimExpr:  # noqa: A001
    """The logical and of all conditions (True for none)."""
    out = const(True)
    for c in conds:
        out = logical_and(out, c)
    return out


def any(*conds: Any) -> PrimExpr:  # noqa: A001
    """The logical or of all conditions (False for none)."""
    out = const(False)
    for c in conds:
        out = logical_or(out, c)
    return out

