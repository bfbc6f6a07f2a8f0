"""Types of graph-IR expressions: tensors with a static shape and dtype, tuples and functions."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from ..errors import OpfusionError

#: dtypes the IR accepts, by canonical name.
DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64")


def normalize_dtype(dtype: object) -> str:
    """Return the canonical dtype name for a string, NumPy dtype or Python type."""
    if isinstance(dtype, str) and dtype in DTYPES:
        return dtype
    if isinstance(dtype, np.dtype):
        # A dict lookup: np.dtype.name runs Python code and this is on every Constant's path.
        known = _NUMPY_DTYPE_NAMES.get(dtype)
        if known is not None:
            return known
    try:
        name = np.dtype(dtype).name  # type: ignore[call-overload]
    except TypeError as err:
        raise OpfusionError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}") from err
    if name not in DTYPES:
        raise OpfusionError(f"dtype {name!r} is not supported; use one of {', '.join(DTYPES)}")
    return name


_DTYPE_SET = frozenset(DTYPES)
_NUMPY_DTYPE_NAMES = {np.dtype(name): name for name in DTYPES}


def _check_dim(dim: object, dims: tuple) -> int:
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 0:
        raise OpfusionError(
            f"tensor shape {dims} has a bad dimension {dim!r}: dimensions are "
            "non-negative integers (give symbolic dimensions a value when importing)"
        )
    return int(dim)


def is_float(dtype: str) -> bool:
    return dtype.startswith("float")


def is_int(dtype: str) -> bool:
    return dtype.startswith(("int", "uint"))


class Type:
    """Base class of IR types. Types are immutable values compared by content."""

    __slots__ = ()


class TensorType(Type):
    """A tensor with a static shape (a tuple of non-negative ints) and a dtype name."""

    __slots__ = ("shape", "dtype", "_hash")

    def __init__(self, shape: Iterable[int], dtype: object = "float32") -> None:
        dims = shape if type(shape) is tuple else tuple(shape)
        # Fast path for the common case (plain non-negative ints); anything else is checked
        # and converted one dimension at a time.
        if not all(type(d) is int and d >= 0 for d in dims):
            dims = tuple(_check_dim(d, dims) for d in dims)
        if not (type(dtype) is str and dtype in _DTYPE_SET):
            dtype = normalize_dtype(dtype)
        object.__setattr__(self, "shape", dims)
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "_hash", hash((dims, dtype)))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("TensorType is immutable")

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of elements (an exact Python int: no int64 product to wrap)."""
        return math.prod(int(dim) for dim in self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of a tensor of this type (an exact Python int)."""
        return self.size * np.dtype(self.dtype).itemsize

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TensorType):
            return False
        return self.shape == other.shape and self.dtype == other.dtype

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"Tensor[{format_shape(self.shape)}, {self.dtype}]"


class TupleType(Type):
    """The type of a tuple of values."""

    __slots__ = ("fields",)

    def __init__(self, fields: Sequence[Type]) -> None:
        object.__setattr__(self, "fields", tuple(fields))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("TupleType is immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TupleType) and self.fields == other.fields

    def __hash__(self) -> int:
        return hash(("TupleType", self.fields))

    def __repr__(self) -> str:
        inner = ", ".join(repr(f) for f in self.fields)
        return f"({inner},)" if len(self.fields) == 1 else f"({inner})"


class FuncType(Type):
    """The type of a function: parameter types and the return type."""

    __slots__ = ("arg_types", "ret_type")

    def __init__(self, arg_types: Sequence[Type], ret_type: Type) -> None:
        object.__setattr__(self, "arg_types", tuple(arg_types))
        object.__setattr__(self, "ret_type", ret_type)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("FuncType is immutable")

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, FuncType)
            and self.arg_types == other.arg_types
            and self.ret_type == other.ret_type
        )

    def __hash__(self) -> int:
        return hash(("FuncType", self.arg_types, self.ret_type))

    def __repr__(self) -> str:
        args = ", ".join(repr(t) for t in self.arg_types)
        return f"fn ({args}) -> {self.ret_type!r}"


def format_shape(shape: Sequence[int]) -> str:
    """Print a shape the way the text IR does: ``(1, 3, 16, 16)``, ``(4,)``, ``()``."""
    if len(shape) == 1:
        return f"({shape[0]},)"
    return "(" + ", ".join(str(d) for d in shape) + ")"


# ---------------------------------------------------------------------------------------------
# float -> integer conversion
#
# C leaves the conversion of NaN, an infinity or an out-of-range float to an integer type
# undefined, and NumPy (like ONNX Runtime) gives whatever the CPU's conversion instruction
# does: on x86, -3.7 -> uint8 is 253 but 1e10 -> int32 is INT32_MIN and NaN -> uint32 is
# 2**31. opfusion defines one rule, used by the reference interpreter, constant folding and
# the generated C alike: NaN becomes 0; any other value is truncated toward zero and then
# saturated to the target's range (-inf and everything below the minimum give the minimum,
# +inf and everything above the maximum give the maximum). It is the rule of XLA,
# WebAssembly's trunc_sat, Rust's ``as`` and Java, and of ONNX's own saturating casts.


def float_to_int_bounds(dtype: str) -> tuple[int, int]:
    """``(lo, hi)`` for a float -> ``dtype`` conversion: a float x with ``lo <= x < hi``
    truncates to a value of ``dtype``; below ``lo`` saturates to the minimum (``lo`` itself),
    from ``hi`` up to the maximum (``hi - 1``). Both are powers of two (or 0), exact in every
    float dtype that reaches them."""
    info = np.iinfo(np.dtype(dtype))
    return int(info.min), int(info.max) + 1


def float_to_int(value: float, dtype: str) -> int:
    """One float converted to the integer ``dtype`` by opfusion's rule (see above)."""
    if value != value:
        return 0
    lo, hi = float_to_int_bounds(dtype)
    if value < lo:
        return lo
    if value >= hi:
        return hi - 1
    return int(value)  # truncates toward zero


def cast_array(array: np.ndarray, dtype: object) -> np.ndarray:
    """``array.astype(dtype)``, except that float -> integer conversion follows opfusion's
    rule (NaN to 0, truncate, saturate) instead of the platform's."""
    target = np.dtype(normalize_dtype(dtype))
    array = np.asarray(array)
    if array.dtype.kind != "f" or target.kind not in "iu":
        return array.astype(target)
    lo, hi = float_to_int_bounds(target.name)
    wide = array.astype(np.float64)  # exact for every float dtype; lo and hi are exact in it
    below, above = wide < float(lo), wide >= float(hi)
    inside = np.where(below | above | np.isnan(wide), 0.0, wide)
    out = inside.astype(target)  # in range: a plain truncating conversion
    out[below] = lo
    out[above] = hi - 1
    return out
