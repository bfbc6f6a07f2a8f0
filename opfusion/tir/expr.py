"""Scalar expressions of the loop IR, and the buffers they load from.

Every node is immutable, has a ``dtype`` (a string: "bool", "int8".."int64", "uint8".."uint64",
"float16", "float32", "float64") and is compared by identity (``is``); structural comparison
is :func:`opfusion.tir.simplify.structural_key`. Python operators build nodes and fold
constants on the way (``IntImm(2) + 3`` is ``IntImm(5)``, ``x * 1`` is ``x``, ``x + 0`` is ``x``).

Nodes and their fields (all fields are read-only attributes):

==================  ===========================================================================
``Var``             ``name: str``, ``dtype`` — a scalar variable (loop variable, size, ...).
``IntImm``          ``value: int``, ``dtype`` — integer or bool constant (bool: 0 or 1).
``FloatImm``        ``value: float``, ``dtype`` — float constant, already rounded to ``dtype``;
                    may be ``inf``/``-inf``/``nan``.
``Add Sub Mul``     ``a``, ``b``, ``dtype`` — arithmetic; ``a.dtype == b.dtype == dtype``.
``Div``             ``a``, ``b`` — true division, float dtypes only.
``FloorDiv``        ``a``, ``b`` — integer division rounding towards minus infinity (Python
                    ``//``); integer dtypes only. C's ``/`` truncates: emit floor semantics
                    unless both operands are known non-negative.
``FloorMod``        ``a``, ``b`` — remainder of FloorDiv, same sign as ``b`` (Python ``%``).
``Min Max``         ``a``, ``b`` — any numeric dtype.
``EQ NE LT LE GT GE``  ``a``, ``b`` — comparisons; dtype "bool".
``And Or``          ``a``, ``b`` — logical, bool operands; short-circuit like C ``&&``/``||``.
``Not``             ``a`` — logical negation of a bool.
``Select``          ``condition``, ``true_value``, ``false_value`` — evaluates ONLY the taken
                    branch (C ``c ? t : f``), so a guarded out-of-range load is safe.
``Cast``            ``dtype``, ``value`` — C conversion (float to int truncates).
``Call``            ``name: str``, ``args: tuple[PrimExpr, ...]``, ``dtype`` — a pure math
                    intrinsic; ``name`` is one of :data:`INTRINSICS`; all args and the
                    result have the same float dtype, except ``dot4_u8s8`` and ``dot2_s16``
                    (int32).
``BufferLoad``      ``buffer: Buffer``, ``indices: tuple[PrimExpr, ...]`` — one element of an
                    n-d buffer; ``dtype == buffer.dtype``; one int index per dimension.
``Let``             ``var: Var``, ``value``, ``body`` — ``body`` with ``var`` bound to ``value``
                    (never produced by :func:`opfusion.lower`).
==================  ===========================================================================

``Buffer(name, shape, dtype, scope="global")`` is not an expression: it is a (dense) C-ordered
n-d array. ``shape`` is a tuple of Python ints; element ``[i0, .., in-1]`` lives at flat offset
``sum(i_d * strides[d])`` with row-major ``strides`` (last stride 1), see
:meth:`Buffer.offset_of`. ``scope`` is "global" for a function parameter and "local" for a
temporary introduced by :class:`opfusion.tir.stmt.Allocate`.

Index arithmetic is int32 (loop variables, axis values, per-dimension indices). Flat offsets
of a buffer with more than 2**31 - 1 elements are int64: :attr:`Buffer.index_dtype`.

Tensor-expression nodes (``opfusion.te``'s ``TensorLoad`` and ``Reduce``) subclass
:class:`PrimExpr` too, but never occur in the loop IR that :func:`opfusion.lower` returns."""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np

from ..errors import TensorExprError
from ..ir.types import float_to_int, normalize_dtype

_set = object.__setattr__

#: Math intrinsics a :class:`Call` may name. Each takes float arguments of one dtype and
#: returns that dtype. "round" rounds half to even (C ``nearbyint``); the rest are C99 <math.h>.
#: (``exp_neg`` is exp(-x): the CPU code generator's form of exp(0 - x), which it computes
#: without the negation; ``exp_normal`` is its form of ``opfusion.te.exp_normal``, exp or 0
#: where that is subnormal; see opfusion.backend.cpu.vector_math.)
#: ``dot4_u8s8(a, b)`` and ``dot2_s16(a, b)`` are the integer intrinsics: int32 words holding
#: four bytes each (those of ``a`` unsigned, of ``b`` signed, byte 0 the lowest) or two signed
#: 16-bit halves, and the int32 sum of their products, part by part: one lane of an x86 VNNI
#: ``vpdpbusd`` or of a ``vpmaddwd`` (see :func:`dot4_u8s8`, :func:`dot2_s16`).
#: Below this float32 argument, ``exp_normal`` (and ``opfusion.te.exp_normal``) is 0: exp(x)
#: is then below the smallest normal float32, 2^-126 (ln 2^-126 = -87.336545; exp of this,
#: float32(-87.3365) exactly, is just above it).
EXP_NORMAL_BELOW = -87.33650207519531

INTRINSICS: dict[str, int] = {
    "exp": 1, "exp_neg": 1, "exp_normal": 1, "exp2": 1, "expm1": 1, "log": 1, "log2": 1,
    "log10": 1, "log1p": 1,
    "sqrt": 1, "tanh": 1, "erf": 1, "floor": 1, "ceil": 1, "trunc": 1, "round": 1,
    "fabs": 1, "sin": 1, "cos": 1, "tan": 1, "asin": 1, "acos": 1, "atan": 1,
    "sinh": 1, "cosh": 1, "pow": 2, "atan2": 2, "fmod": 2, "dot4_u8s8": 2,
    "dot2_s16": 2,
}


# ---------------------------------------------------------------------------------------------
# dtypes


def dtype_of_name(dtype: object) -> str:
    """The canonical dtype name for a string, NumPy dtype or Python type."""
    return normalize_dtype(dtype)


def is_float(dtype: str) -> bool:
    """True for float16/float32/float64."""
    return dtype.startswith("float")


def is_int(dtype: str) -> bool:
    """True for signed and unsigned integer dtypes (not bool)."""
    return dtype.startswith("int") or dtype.startswith("uint")


def is_bool(dtype: str) -> bool:
    """True for "bool"."""
    return dtype == "bool"


def dtype_bits(dtype: str) -> int:
    """Width of a dtype in bits (bool counts as 8)."""
    return 8 if dtype == "bool" else np.dtype(dtype).itemsize * 8


def promote_dtypes(a: str, b: str) -> str:
    """The dtype both operands of a binary operator are converted to.

    Float beats integer; between two floats or two integers the wider wins; at equal width a
    signed integer beats an unsigned one; bool is the narrowest integer."""
    if a == b:
        return a
    if is_float(a) != is_float(b):
        return a if is_float(a) else b
    if is_bool(a) or is_bool(b):
        return b if is_bool(a) else a
    ba, bb = dtype_bits(a), dtype_bits(b)
    if ba != bb:
        return a if ba > bb else b
    return a if a.startswith("int") else b


# ---------------------------------------------------------------------------------------------
# operator overloading


class ExprOp:
    """Python operators that build expressions; mixed into PrimExpr and te.IterVar."""

    __slots__ = ()

    def _as_expr(self) -> PrimExpr:
        raise NotImplementedError

    def __add__(self, other: Any) -> PrimExpr:
        return add(self, other)

    def __radd__(self, other: Any) -> PrimExpr:
        return add(other, self)

    def __sub__(self, other: Any) -> PrimExpr:
        return sub(self, other)

    def __rsub__(self, other: Any) -> PrimExpr:
        return sub(other, self)

    def __mul__(self, other: Any) -> PrimExpr:
        return mul(self, other)

    def __rmul__(self, other: Any) -> PrimExpr:
        return mul(other, self)

    def __truediv__(self, other: Any) -> PrimExpr:
        return div(self, other)

    def __rtruediv__(self, other: Any) -> PrimExpr:
        return div(other, self)

    def __floordiv__(self, other: Any) -> PrimExpr:
        return floordiv(self, other)

    def __rfloordiv__(self, other: Any) -> PrimExpr:
        return floordiv(other, self)

    def __mod__(self, other: Any) -> PrimExpr:
        return floormod(self, other)

    def __rmod__(self, other: Any) -> PrimExpr:
        return floormod(other, self)

    def __pow__(self, other: Any) -> PrimExpr:
        return power(self, other)

    def __rpow__(self, other: Any) -> PrimExpr:
        return power(other, self)

    def __neg__(self) -> PrimExpr:
        e = self._as_expr()
        if isinstance(e, IntImm) and is_int(e.dtype):
            return IntImm(-e.value, e.dtype)
        if isinstance(e, FloatImm):
            return FloatImm(-e.value, e.dtype)
        return sub(_zero(e.dtype), e)

    def __pos__(self) -> PrimExpr:
        return self._as_expr()

    def __lt__(self, other: Any) -> PrimExpr:
        return _compare(LT, self, other)

    def __le__(self, other: Any) -> PrimExpr:
        return _compare(LE, self, other)

    def __gt__(self, other: Any) -> PrimExpr:
        return _compare(GT, self, other)

    def __ge__(self, other: Any) -> PrimExpr:
        return _compare(GE, self, other)

    def __eq__(self, other: Any) -> PrimExpr:  # type: ignore[override]
        return _compare(EQ, self, other)

    def __ne__(self, other: Any) -> PrimExpr:  # type: ignore[override]
        return _compare(NE, self, other)

    def __and__(self, other: Any) -> PrimExpr:
        return logical_and(self, other)

    def __rand__(self, other: Any) -> PrimExpr:
        return logical_and(other, self)

    def __or__(self, other: Any) -> PrimExpr:
        return logical_or(self, other)

    def __ror__(self, other: Any) -> PrimExpr:
        return logical_or(other, self)

    def __invert__(self) -> PrimExpr:
        return logical_not(self)

    def __bool__(self) -> bool:
        raise TensorExprError(
            f"the expression {self} has no Python truth value: it is computed later, per "
            "element. Use te.if_then_else(cond, a, b) instead of `if`, and `&`, `|`, `~` "
            "instead of `and`, `or`, `not`."
        )

    __hash__ = object.__hash__


class PrimExpr(ExprOp):
    """Base class of scalar expressions. ``dtype`` is the type of the value."""

    __slots__ = ("dtype",)

    #: names of the expression-valued fields, in order (used by generic traversals).
    _child_fields: ClassVar[tuple[str, ...]] = ()

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} nodes are immutable")

    def _as_expr(self) -> PrimExpr:
        return self

    def children(self) -> tuple[PrimExpr, ...]:
        """The direct sub-expressions, in field order."""
        return tuple(getattr(self, f) for f in self._child_fields)

    def with_children(self, children: Sequence[PrimExpr]) -> PrimExpr:
        """A node like this one with new sub-expressions (constants folded); self if unchanged."""
        if all(c is o for c, o in zip(children, self.children())):
            return self
        return self._rebuild(list(children))

    def _rebuild(self, children: list[PrimExpr]) -> PrimExpr:
        raise NotImplementedError(type(self).__name__)

    def __str__(self) -> str:
        from .printer import expr_to_str

        return expr_to_str(self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self}: {self.dtype}>"


class Var(PrimExpr):
    """A scalar variable; two Vars are the same variable only if they are the same object."""

    __slots__ = ("name",)

    def __init__(self, name: str, dtype: object = "int32") -> None:
        _set(self, "name", str(name))
        _set(self, "dtype", dtype_of_name(dtype))


@functools.cache
def integer_range(dtype: str) -> tuple[int, int]:
    """The least and greatest value of an integer dtype (``np.iinfo``, looked up once: an
    ``IntImm`` is made hundreds of thousands of times in a model's lowering)."""
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


class IntImm(PrimExpr):
    """An integer (or bool) constant."""

    __slots__ = ("value",)

    def __init__(self, value: int, dtype: object = "int32") -> None:
        dtype = dtype_of_name(dtype)
        if is_float(dtype):
            raise TensorExprError(f"IntImm cannot have float dtype {dtype}; use FloatImm")
        value = int(value)
        if dtype == "bool":
            value = 1 if value else 0
        else:
            low, high = integer_range(dtype)
            if not low <= value <= high:
                raise TensorExprError(f"constant {value} does not fit in {dtype}")
        _set(self, "value", value)
        _set(self, "dtype", dtype)

    def __bool__(self) -> bool:
        # A constant has a truth value: `if lo == hi` after folding is meaningful.
        return bool(self.value)

    def __int__(self) -> int:
        return self.value

    def __index__(self) -> int:
        return self.value


class FloatImm(PrimExpr):
    """A float constant, rounded to its dtype on construction."""

    __slots__ = ("value",)

    def __init__(self, value: float, dtype: object = "float32") -> None:
        dtype = dtype_of_name(dtype)
        if not is_float(dtype):
            raise TensorExprError(f"FloatImm cannot have dtype {dtype}; use IntImm")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            value = float(np.dtype(dtype).type(value))
        _set(self, "value", value)
        _set(self, "dtype", dtype)

    def __float__(self) -> float:
        return self.value


class BinaryOp(PrimExpr):
    """Base of two-operand nodes; ``a`` and ``b`` have one dtype."""

    __slots__ = ("a", "b")
    _child_fields = ("a", "b")
    #: the folding builder used by with_children (set below for each class)
    _builder: ClassVar[Any] = None

    def __init__(self, a: PrimExpr, b: PrimExpr, dtype: str | None = None) -> None:
        if a.dtype != b.dtype:
            raise TensorExprError(
                f"{type(self).__name__} operands have different dtypes {a.dtype} and {b.dtype}"
            )
        _set(self, "a", a)
        _set(self, "b", b)
        _set(self, "dtype", dtype or a.dtype)

    def _rebuild(self, children: list[PrimExpr]) -> PrimExpr:
        return type(self)._builder(children[0], children[1])


class Add(BinaryOp):
    """a + b."""

    __slots__ = ()


class Sub(BinaryOp):
    """a - b."""

    __slots__ = ()


class Mul(BinaryOp):
    """a * b."""

    __slots__ = ()


class Div(BinaryOp):
    """a / b on floats."""

    __slots__ = ()


class FloorDiv(BinaryOp):
    """floor(a / b) on integers (Python ``//``)."""

    __slots__ = ()


class FloorMod(BinaryOp):
    """a - floor(a / b) * b on integers (Python ``%``)."""

    __slots__ = ()


class Min(BinaryOp):
    """min(a, b)."""

    __slots__ = ()


class Max(BinaryOp):
    """max(a, b)."""

    __slots__ = ()


class CmpOp(BinaryOp):
    """Base of comparisons; the result dtype is bool."""

    __slots__ = ()

    def __init__(self, a: PrimExpr, b: PrimExpr) -> None:
        super().__init__(a, b, "bool")


class EQ(CmpOp):
    """a == b."""

    __slots__ = ()

    def __bool__(self) -> bool:
        # Like TVM: `x == y` on two nodes in plain Python code asks "same node?".
        return self.a is self.b


class NE(CmpOp):
    """a != b."""

    __slots__ = ()

    def __bool__(self) -> bool:
        return self.a is not self.b


class LT(CmpOp):
    """a < b."""

    __slots__ = ()


class LE(CmpOp):
    """a <= b."""

    __slots__ = ()


class GT(CmpOp):
    """a > b."""

    __slots__ = ()


class GE(CmpOp):
    """a >= b."""

    __slots__ = ()


class And(BinaryOp):
    """a && b on bools."""

    __slots__ = ()


class Or(BinaryOp):
    """a || b on bools."""

    __slots__ = ()


class Not(PrimExpr):
    """!a on a bool."""

    __slots__ = ("a",)
    _child_fields = ("a",)

    def __init__(self, a: PrimExpr) -> None:
        _set(self, "a", a)
        _set(self, "dtype", "bool")

    def _rebuild(self, children: list[PrimExpr]) -> PrimExpr:
        return logical_not(children[0])


class Select(PrimExpr):
    """condition ? true_value : false_value (only the taken branch is evaluated)."""

    __slots__ = ("condition", "true_value", "false_value")
    _child_fields = ("condition", "true_value", "false_value")

    def __init__(self, condition: PrimExpr, true_value: PrimExpr, false_value: PrimExpr) -> None:
        if condition.dtype != "bool":
            raise TensorExprError(f"select condition {condition} must be bool")
        if true_value.dtype != false_value.dtype:
            raise TensorExprError(
                f"select branches have dtypes {true_value.dtype} and {false_value.dtype}"
            )
        _set(self, "condition", condition)
        _set(self, "true_value", true_value)
        _set(self, "false_value", false_value)
        _set(self, "dtype", true_value.dtype)

    def _rebuild(self, children: list[PrimExpr]) -> PrimExpr:
        return select(*children)


class Cast(PrimExpr):
    """Conversion of ``value`` to ``dtype``."""

    __slots__ = ("value",)
    _child_fields = ("value",)

    def __init__(self, dtype: object, value: PrimExpr) -> None:
        _set(self, "value", value)
        _set(self, "dtype", dtype_of_name(dtype))

    def _rebuild(self, children: list[PrimExpr]) -> PrimExpr:
        return cast(children[0], self.dtype)


class Call(PrimExpr):
    """A pure math intrinsic, ``name(*args)``; see :data:`INTRINSICS`."""

    __slots__ = ("name", "args")

    def __init__(self, name: str, args: Sequence[PrimExpr], dtype: object) -> None:
        if name not in INTRINSICS:
            raise TensorExprError(
                f"unknown intrinsic {name!r}; known: {', '.join(sorted(INTRINSICS))}"
            )
        args = tuple(args)
        if len(args) != INTRINSICS[name]:
            raise TensorExprError(f"{name} takes {INTRINSICS[name]} argument(s), got {len(args)}")
        _set(self, "name", name)
        _set(self, "args", args)
        _set(self, "dtype", dtype_of_name(dtype))

    def children(self) -> tuple[PrimExpr, ...]:
        return self.args

    def _rebuild(self, children: list[PrimExpr]) -> PrimExpr:
        return Call(self.name, children, self.dtype)


class BufferLoad(PrimExpr):
    """``buffer[indices]``: one element of a buffer."""

    __slots__ = ("buffer", "indices")

    def __init__(self, buffer: Buffer, indices: Sequence[PrimExpr]) -> None:
        indices = tuple(as_expr(i) for i in indices)
        if len(indices) != len(buffer.shape):
            raise TensorExprError(
                f"buffer {buffer.name} has {len(buffer.shape)} dimension(s) but is indexed "
                f"with {len(indices)}"
            )
        for i in indices:
            if not (is_int(i.dtype) or is_bool(i.dtype)):
                raise TensorExprError(f"index {i} of buffer {buffer.name} is {i.dtype}, not int")
        _set(self, "buffer", buffer)
        _set(self, "indices", indices)
        _set(self, "dtype", buffer.dtype)

    def children(self) -> tuple[PrimExpr, ...]:
        return self.indices

    def _rebuild(self, children: list[PrimExpr]) -> PrimExpr:
        return BufferLoad(self.buffer, children)


class Let(PrimExpr):
    """``body`` with ``var`` bound to ``value``."""

    __slots__ = ("var", "value", "body")
    _child_fields = ("value", "body")

    def __init__(self, var: Var, value: PrimExpr, body: PrimExpr) -> None:
        _set(self, "var", var)
        _set(self, "value", value)
        _set(self, "body", body)
        _set(self, "dtype", body.dtype)

    def _rebuild(self, children: list[PrimExpr]) -> PrimExpr:
        return Let(self.var, children[0], children[1])


# ---------------------------------------------------------------------------------------------
# buffers


class Buffer:
    """A row-major n-d array: a function parameter ("global") or a temporary ("local";
    "shared" for one that the threads of a GPU block share). Dense, unless ``strides`` (in
    elements, the last 1) pad some dimensions: a shared tile whose rows are spaced so that a
    warp's loads fall in different memory banks (:meth:`opfusion.te.Stage.storage_align`)."""

    __slots__ = ("name", "shape", "dtype", "scope", "padded_strides")

    def __init__(self, name: str, shape: Sequence[int], dtype: object = "float32",
                 scope: str = "global", strides: Sequence[int] | None = None) -> None:
        dims = []
        for d in shape:
            if isinstance(d, IntImm):
                d = d.value
            if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0:
                raise TensorExprError(
                    f"buffer {name}: shape {tuple(shape)} has a bad dimension {d!r}; "
                    "dimensions are non-negative Python ints"
                )
            dims.append(int(d))
        if scope not in ("global", "local", "shared"):
            raise TensorExprError(
                f"buffer {name}: scope must be 'global', 'local' or 'shared', not {scope!r}"
            )
        _set(self, "name", str(name))
        _set(self, "shape", tuple(dims))
        _set(self, "dtype", dtype_of_name(dtype))
        _set(self, "scope", scope)
        _set(self, "padded_strides", None if strides is None else _checked_strides(
            name, tuple(dims), strides))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Buffer is immutable")

    @property
    def size(self) -> int:
        """Number of elements it spans (its elements, and the padding between them)."""
        if self.padded_strides is None or not all(self.shape):
            return math.prod(self.shape)
        return sum((d - 1) * s for d, s in zip(self.shape, self.padded_strides)) + 1

    @property
    def strides(self) -> tuple[int, ...]:
        """Row-major strides in elements (the last is 1): dense, or the padded ones given."""
        if self.padded_strides is not None:
            return self.padded_strides
        return aligned_strides(self.shape, {})

    @property
    def index_dtype(self) -> str:
        """"int64" when a flat offset may not fit in int32, else "int32"."""
        return "int64" if self.size > 2**31 - 1 else "int32"

    def offset_of(self, indices: Sequence[PrimExpr]) -> PrimExpr:
        """The flat element offset of ``indices``, in :attr:`index_dtype`."""
        dtype = self.index_dtype
        offset: PrimExpr = IntImm(0, dtype)
        for index, stride in zip(indices, self.strides):
            index = as_expr(index)
            if index.dtype != dtype:
                index = cast(index, dtype)
            offset = add(offset, mul(index, IntImm(stride, dtype)))
        return offset

    def load(self, indices: Sequence[Any]) -> BufferLoad:
        """``BufferLoad(self, indices)``."""
        return BufferLoad(self, indices)

    def __repr__(self) -> str:
        return f"Buffer({self.name}, {list(self.shape)}, {self.dtype}, scope={self.scope!r})"

    __hash__ = object.__hash__


def aligned_strides(shape: Sequence[int], aligns: dict[int, tuple[int, int]]
                    ) -> tuple[int, ...]:
    """Row-major strides of an array of ``shape`` whose dimensions in ``aligns`` (dimension
    -> (factor, offset)) are padded to the next stride that is ``offset`` modulo ``factor``
    (dense without ``aligns``)."""
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        stride = strides[d + 1] * int(shape[d + 1])
        if d in aligns:
            factor, offset = aligns[d]
            stride += (offset - stride) % factor
        strides[d] = stride
    return tuple(strides)


def _checked_strides(name: str, shape: tuple[int, ...], strides: Sequence[int]
                     ) -> tuple[int, ...]:
    """``strides`` as ints, each at least the span of the dimensions inside it."""
    out = tuple(int(s) for s in strides)
    ok = len(out) == len(shape) and (not out or out[-1] == 1)
    for d in range(len(shape) - 1):
        ok = ok and out[d] >= out[d + 1] * shape[d + 1]
    if not ok:
        raise TensorExprError(f"buffer {name}: strides {out} do not lay out shape {shape} "
                              "row-major (the last stride 1, each at least the span inside it)")
    return out


# ---------------------------------------------------------------------------------------------
# builders with constant folding


def const(value: Any, dtype: object | None = None) -> PrimExpr:
    """A constant; without ``dtype``: bool -> "bool", int -> "int32" (or "int64" if it does not
    fit), float -> "float32", NumPy scalar -> its own dtype."""
    if isinstance(value, PrimExpr):
        return value if dtype is None else cast(value, dtype)
    if dtype is None:
        if isinstance(value, (bool, np.bool_)):
            dtype = "bool"
        elif isinstance(value, (int, np.integer)) and not isinstance(value, np.integer):
            dtype = "int32" if -(2**31) <= value < 2**31 else "int64"
        elif isinstance(value, (np.integer, np.floating)):
            dtype = value.dtype.name
        elif isinstance(value, float):
            dtype = "float32"
        else:
            raise TensorExprError(f"cannot make a constant of {value!r} ({type(value).__name__})")
    dtype = dtype_of_name(dtype)
    if is_float(dtype):
        return FloatImm(float(value), dtype)
    if isinstance(value, float) and not value.is_integer():
        raise TensorExprError(f"constant {value} is not an integer but dtype is {dtype}")
    return IntImm(int(value), dtype)


def as_expr(value: Any, dtype: str | None = None) -> PrimExpr:
    """Turn a PrimExpr, IterVar or Python/NumPy scalar into a PrimExpr."""
    if isinstance(value, PrimExpr):
        return value
    if isinstance(value, ExprOp):
        return value._as_expr()
    if isinstance(value, (bool, int, float, np.integer, np.floating, np.bool_)):
        return const(value, dtype)
    raise TensorExprError(
        f"{value!r} ({type(value).__name__}) cannot be used in a tensor expression"
    )


def _zero(dtype: str) -> PrimExpr:
    return FloatImm(0.0, dtype) if is_float(dtype) else IntImm(0, dtype)


def _is_const(e: PrimExpr, value: float) -> bool:
    return isinstance(e, (IntImm, FloatImm)) and e.value == value


def _operand_pair(a: Any, b: Any) -> tuple[PrimExpr, PrimExpr]:
    """Convert both operands to PrimExprs of one dtype (Python literals adopt the other side's
    kind; a float literal against an int expression is float32)."""
    a_lit = not isinstance(a, ExprOp)
    b_lit = not isinstance(b, ExprOp)
    if a_lit and b_lit:
        ea, eb = as_expr(a), as_expr(b)
    elif a_lit:
        eb = as_expr(b)
        ea = _literal_like(a, eb.dtype)
    elif b_lit:
        ea = as_expr(a)
        eb = _literal_like(b, ea.dtype)
    else:
        ea, eb = as_expr(a), as_expr(b)
    if ea.dtype != eb.dtype:
        target = promote_dtypes(ea.dtype, eb.dtype)
        ea, eb = cast(ea, target), cast(eb, target)
    return ea, eb


def _literal_like(value: Any, dtype: str) -> PrimExpr:
    if isinstance(value, (np.integer, np.floating, np.bool_)) and not isinstance(value, bool):
        return const(value)
    if isinstance(value, bool):
        return IntImm(int(value), dtype) if not is_float(dtype) else FloatImm(float(value), dtype)
    if isinstance(value, int):
        if is_float(dtype):
            return FloatImm(float(value), dtype)
        if dtype == "bool":
            return const(value)
        low, high = integer_range(dtype)
        if low <= value <= high:
            return IntImm(value, dtype)
        return const(value)
    if isinstance(value, float):
        return FloatImm(value, dtype if is_float(dtype) else "float32")
    return as_expr(value)


def _arith_pair(a: Any, b: Any, op: str) -> tuple[PrimExpr, PrimExpr]:
    ea, eb = _operand_pair(a, b)
    if ea.dtype == "bool":  # bools do arithmetic as int32, as in C
        ea, eb = cast(ea, "int32"), cast(eb, "int32")
    return ea, eb


def _fold_float(op: Any, a: FloatImm, b: FloatImm) -> FloatImm:
    t = np.dtype(a.dtype).type
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        return FloatImm(float(op(t(a.value), t(b.value))), a.dtype)


def _fold_int(value: int, dtype: str) -> IntImm:
    # Wrap around like the C code would (two's complement / modular unsigned).
    bits = dtype_bits(dtype)
    value &= (1 << bits) - 1
    if dtype.startswith("int") and value >= 1 << (bits - 1):
        value -= 1 << bits
    return IntImm(value, dtype)


def add(a: Any, b: Any) -> PrimExpr:
    """a + b, folding constants; ``x + 0`` is ``x``."""
    a, b = _arith_pair(a, b, "+")
    if isinstance(a, IntImm) and isinstance(b, IntImm):
        return _fold_int(a.value + b.value, a.dtype)
    if isinstance(a, FloatImm) and isinstance(b, FloatImm):
        return _fold_float(lambda x, y: x + y, a, b)
    if _is_const(a, 0):
        return b
    if _is_const(b, 0):
        return a
    return Add(a, b)


def sub(a: Any, b: Any) -> PrimExpr:
    """a - b, folding constants; ``x - 0`` is ``x``; ``x - x`` is 0 for integers."""
    a, b = _arith_pair(a, b, "-")
    if isinstance(a, IntImm) and isinstance(b, IntImm):
        return _fold_int(a.value - b.value, a.dtype)
    if isinstance(a, FloatImm) and isinstance(b, FloatImm):
        return _fold_float(lambda x, y: x - y, a, b)
    if _is_const(b, 0):
        return a
    if a is b and not is_float(a.dtype):
        return IntImm(0, a.dtype)
    return Sub(a, b)


def mul(a: Any, b: Any) -> PrimExpr:
    """a * b, folding constants; ``x * 1`` is ``x``; ``x * 0`` is 0 for integers."""
    a, b = _arith_pair(a, b, "*")
    if isinstance(a, IntImm) and isinstance(b, IntImm):
        return _fold_int(a.value * b.value, a.dtype)
    if isinstance(a, FloatImm) and isinstance(b, FloatImm):
        return _fold_float(lambda x, y: x * y, a, b)
    if _is_const(a, 1):
        return b
    if _is_const(b, 1):
        return a
    if not is_float(a.dtype) and (_is_const(a, 0) or _is_const(b, 0)):
        return IntImm(0, a.dtype)
    return Mul(a, b)


def div(a: Any, b: Any) -> PrimExpr:
    """True division a / b; integer operands are an error (use ``//``)."""
    a, b = _operand_pair(a, b)
    if not is_float(a.dtype):
        raise TensorExprError(
            f"`/` on {a.dtype} operands ({a} / {b}): use `//` for integer (floor) division, or "
            "cast to a float dtype first"
        )
    if isinstance(a, FloatImm) and isinstance(b, FloatImm) and b.value != 0.0:
        return _fold_float(lambda x, y: x / y, a, b)
    if _is_const(b, 1):
        return a
    return Div(a, b)


def floordiv(a: Any, b: Any) -> PrimExpr:
    """Floor division (Python ``//``); on floats it is ``floor(a / b)``."""
    a, b = _arith_pair(a, b, "//")
    if is_float(a.dtype):
        return call("floor", div(a, b))
    if isinstance(a, IntImm) and isinstance(b, IntImm) and b.value != 0:
        return _fold_int(a.value // b.value, a.dtype)
    if _is_const(b, 1):
        return a
    if _is_const(a, 0):
        return a
    return FloorDiv(a, b)


def floormod(a: Any, b: Any) -> PrimExpr:
    """Floor remainder (Python ``%``); on floats it is ``a - floor(a / b) * b``."""
    a, b = _arith_pair(a, b, "%")
    if is_float(a.dtype):
        return sub(a, mul(call("floor", div(a, b)), b))
    if isinstance(a, IntImm) and isinstance(b, IntImm) and b.value != 0:
        return _fold_int(a.value % b.value, a.dtype)
    if _is_const(b, 1) or _is_const(a, 0):
        return IntImm(0, a.dtype)
    return FloorMod(a, b)


def minimum(a: Any, b: Any) -> PrimExpr:
    """Elementwise min(a, b)."""
    a, b = _operand_pair(a, b)
    if isinstance(a, (IntImm, FloatImm)) and isinstance(b, (IntImm, FloatImm)):
        if isinstance(a, FloatImm) and (math.isnan(a.value) or math.isnan(b.value)):
            return Min(a, b)
        return a if a.value <= b.value else b
    if a is b:
        return a
    return Min(a, b)


def maximum(a: Any, b: Any) -> PrimExpr:
    """Elementwise max(a, b)."""
    a, b = _operand_pair(a, b)
    if isinstance(a, (IntImm, FloatImm)) and isinstance(b, (IntImm, FloatImm)):
        if isinstance(a, FloatImm) and (math.isnan(a.value) or math.isnan(b.value)):
            return Max(a, b)
        return a if a.value >= b.value else b
    if a is b:
        return a
    return Max(a, b)


_CMP_FOLD = {
    "EQ": lambda x, y: x == y, "NE": lambda x, y: x != y, "LT": lambda x, y: x < y,
    "LE": lambda x, y: x <= y, "GT": lambda x, y: x > y, "GE": lambda x, y: x >= y,
}


def _compare(cls: type[CmpOp], a: Any, b: Any) -> PrimExpr:
    ea, eb = _operand_pair(a, b)
    if isinstance(ea, (IntImm, FloatImm)) and isinstance(eb, (IntImm, FloatImm)):
        return IntImm(int(_CMP_FOLD[cls.__name__](ea.value, eb.value)), "bool")
    return cls(ea, eb)


def compare(op: str, a: Any, b: Any) -> PrimExpr:
    """Build a comparison by name: one of "EQ", "NE", "LT", "LE", "GT", "GE"."""
    return _compare(_CMP_CLASSES[op], a, b)


def _bool_operand(x: Any, what: str) -> PrimExpr:
    e = as_expr(x)
    if e.dtype != "bool":
        raise TensorExprError(
            f"{what} needs bool operands, got {e} of dtype {e.dtype}; compare first (x != 0)"
        )
    return e


def logical_and(a: Any, b: Any) -> PrimExpr:
    """a && b on bools (``&``)."""
    a, b = _bool_operand(a, "`&` (logical and)"), _bool_operand(b, "`&` (logical and)")
    if isinstance(a, IntImm):
        return b if a.value else a
    if isinstance(b, IntImm):
        return a if b.value else b
    return And(a, b)


def logical_or(a: Any, b: Any) -> PrimExpr:
    """a || b on bools (``|``)."""
    a, b = _bool_operand(a, "`|` (logical or)"), _bool_operand(b, "`|` (logical or)")
    if isinstance(a, IntImm):
        return a if a.value else b
    if isinstance(b, IntImm):
        return b if b.value else a
    return Or(a, b)


def logical_not(a: Any) -> PrimExpr:
    """!a on a bool (``~``)."""
    a = _bool_operand(a, "`~` (logical not)")
    if isinstance(a, IntImm):
        return IntImm(1 - a.value, "bool")
    if isinstance(a, Not):
        return a.a
    return Not(a)


def select(condition: Any, true_value: Any, false_value: Any) -> PrimExpr:
    """``condition ? true_value : false_value``; only the taken branch is evaluated."""
    c = as_expr(condition)
    if c.dtype != "bool":
        raise TensorExprError(f"the condition {c} of a select is {c.dtype}, not bool")
    t, f = _operand_pair(true_value, false_value)
    if isinstance(c, IntImm):
        return t if c.value else f
    if t is f:
        return t
    return Select(c, t, f)


def cast(value: Any, dtype: object) -> PrimExpr:
    """Convert ``value`` to ``dtype`` (folded for constants)."""
    dtype = dtype_of_name(dtype)
    e = as_expr(value)
    if e.dtype == dtype:
        return e
    if isinstance(e, (IntImm, FloatImm)):
        if is_float(dtype):
            return FloatImm(float(e.value), dtype)
        if dtype == "bool":
            return IntImm(int(e.value != 0), "bool")
        if isinstance(e, FloatImm):  # NaN to 0, truncate, saturate: as the generated C
            return IntImm(float_to_int(e.value, dtype), dtype)
        return _fold_int(int(e.value), dtype)
    return Cast(dtype, e)


def call(name: str, *args: Any) -> PrimExpr:
    """A math intrinsic ``name(*args)`` on float operands of one dtype."""
    exprs = [as_expr(a) for a in args]
    if len(exprs) == 2:
        exprs = list(_operand_pair(args[0], args[1]))
    for e in exprs:
        if not is_float(e.dtype):
            raise TensorExprError(
                f"{name}({', '.join(str(x) for x in exprs)}): argument {e} is {e.dtype}; math "
                "intrinsics take floats, cast it first (te.cast(x, 'float32'))"
            )
    return Call(name, exprs, exprs[0].dtype)


def _word_dot(name: str, a: Any, b: Any) -> PrimExpr:
    """``name(a, b)`` of two int32 words (:data:`INTRINSICS`' integer intrinsics)."""
    exprs = [as_expr(a), as_expr(b)]
    for e in exprs:
        if e.dtype != "int32":
            raise TensorExprError(f"{name}({exprs[0]}, {exprs[1]}): argument {e} is {e.dtype}; "
                                  "it takes int32 words")
    return Call(name, exprs, "int32")


def dot4_u8s8(a: Any, b: Any) -> PrimExpr:
    """The sum of the products of the four bytes of int32 word ``a`` (unsigned) with those of
    word ``b`` (signed), byte 0 the lowest: an int32 in [-130560, 130050]. A product whose
    operands are 8-bit values packed four to a word contracts four of them per step."""
    return _word_dot("dot4_u8s8", a, b)


def dot2_s16(a: Any, b: Any) -> PrimExpr:
    """The sum of the products of the two signed 16-bit halves of int32 word ``a`` with those
    of word ``b``, the low half first: x86's ``pmaddwd`` on one lane. A product of 8-bit
    values widened to 16 bits contracts two of them per step, exactly, where the processor
    has no VNNI."""
    return _word_dot("dot2_s16", a, b)


def unpack_dot2_s16(a: int, b: int) -> int:
    """:func:`dot2_s16` on Python ints (the reference for its C and vector forms)."""
    total = 0
    for shift in (0, 16):
        x = (a >> shift) & 0xFFFF
        y = (b >> shift) & 0xFFFF
        total += (x - 65536 if x > 32767 else x) * (y - 65536 if y > 32767 else y)
    return total


def unpack_dot4_u8s8(a: int, b: int) -> int:
    """:func:`dot4_u8s8` on Python ints (the reference for its C and vector forms)."""
    total = 0
    for shift in (0, 8, 16, 24):
        x = (a >> shift) & 0xFF
        y = (b >> shift) & 0xFF
        total += x * (y - 256 if y > 127 else y)
    return total


def power(a: Any, b: Any) -> PrimExpr:
    """a ** b on floats (``pow``)."""
    ea, eb = _operand_pair(a, b)
    if not is_float(ea.dtype):
        ea, eb = cast(ea, "float32"), cast(eb, "float32")
    return call("pow", ea, eb)


Add._builder = add
Sub._builder = sub
Mul._builder = mul
Div._builder = div
FloorDiv._builder = floordiv
FloorMod._builder = floormod
Min._builder = minimum
Max._builder = maximum
And._builder = logical_and
Or._builder = logical_or
EQ._builder = lambda a, b: _compare(EQ, a, b)
NE._builder = lambda a, b: _compare(NE, a, b)
LT._builder = lambda a, b: _compare(LT, a, b)
LE._builder = lambda a, b: _compare(LE, a, b)
GT._builder = lambda a, b: _compare(GT, a, b)
GE._builder = lambda a, b: _compare(GE, a, b)

_CMP_CLASSES: dict[str, type[CmpOp]] = {
    "EQ": EQ, "NE": NE, "LT": LT, "LE": LE, "GT": GT, "GE": GE,
}


# ---------------------------------------------------------------------------------------------
# generic traversal


def post_order(expr: PrimExpr,
               enter: Callable[[PrimExpr], bool] | None = None) -> list[PrimExpr]:
    """Every distinct node of ``expr`` (by identity), children before parents; iterative.
    With ``enter``, the children of a node for which it is False are left out (e.g. the
    indices of loads, to see only the value computation)."""
    order: list[PrimExpr] = []
    seen: set[int] = set()
    stack: list[tuple[PrimExpr, bool]] = [(expr, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        if enter is not None and not enter(node):
            continue
        for child in reversed(node.children()):
            if id(child) not in seen:
                stack.append((child, False))
    return order


def rewrite(expr: PrimExpr, fn: Any) -> PrimExpr:
    """Rebuild ``expr`` bottom-up: each node gets new children, then ``fn(node)`` may replace it
    (return None to keep it). Shared sub-expressions are rewritten once; iterative."""
    done: dict[int, PrimExpr] = {}
    keep_alive: list[PrimExpr] = []  # ids stay valid while the originals live
    for node in post_order(expr):
        children = node.children()
        if children:
            new = node.with_children([done[id(c)] for c in children])
        else:
            new = node
        replaced = fn(new)
        done[id(node)] = new if replaced is None else replaced
        keep_alive.append(node)
    return done[id(expr)]


def substitute(expr: PrimExpr, mapping: dict[Var, Any]) -> PrimExpr:
    """Replace variables by expressions (simultaneously), folding constants on the way."""
    if not mapping:
        return expr
    values = {v: as_expr(e) for v, e in mapping.items()}

    def visit(node: PrimExpr) -> PrimExpr | None:
        return values.get(node) if isinstance(node, Var) else None

    return rewrite(expr, visit)


def free_vars(expr: PrimExpr) -> list[Var]:
    """The variables ``expr`` reads, in first-seen order (Let-bound ones excluded)."""
    out: list[Var] = []
    bound: list[Var] = []
    for node in post_order(expr):
        if isinstance(node, Let):
            bound.append(node.var)
        if isinstance(node, Var) and not any(node is v for v in out):
            out.append(node)
    return [v for v in out if not any(v is b for b in bound)]
