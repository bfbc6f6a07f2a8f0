"""Binary operators with NumPy broadcasting, and ``where``. All are kBroadcast.

Arithmetic keeps the inputs' (shared) dtype; comparisons and logical ops return bool.

Integer arithmetic is total, with the same values in the reference and in compiled kernels:

* ``divide`` truncates toward zero; ``floor_divide`` and ``mod`` round down (NumPy's).
* Division by zero: ``divide``, ``floor_divide`` and ``mod`` give 0. ONNX Runtime raises
  instead; a compiled kernel cannot stop mid-way (its tensor expressions have no way to
  report an error), so opfusion defines the value rather than trap as C would or give the
  platform-dependent cast of inf that a float division would.
* ``INT_MIN / -1`` and ``INT_MIN // -1`` wrap to INT_MIN (NumPy's value; ONNX Runtime
  crashes with SIGFPE), and ``INT_MIN % -1`` is 0.
* ``power`` with a negative exponent is the real power truncated toward zero, as ONNX Runtime
  computes it: 1 for a base of 1, 1 or -1 for -1 (even or odd exponent), 0 for any other base
  (0 ** -n is a division by zero: 0, where ONNX Runtime gives the cast of inf). Other
  exponents give the power modulo 2**bits (NumPy's wrapping power), whatever their size."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..ir.op import Attrs, Op, OpPatternKind, register_op
from ..ir.types import TensorType, Type, is_float, is_int
from ._common import broadcast_shape, same_dtype


class BroadcastOp(Op):
    """Two tensors of one dtype in, their broadcast shape out."""

    inputs = ("lhs", "rhs")
    pattern = OpPatternKind.kBroadcast
    result: str = "same"  # "same" (the input dtype) or "bool"
    operands: str = "number"  # "number", "float" or "bool"

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        types = self.expect_tensors(arg_types)
        dtype = same_dtype(self, types, self.inputs)
        if self.operands == "bool" and dtype != "bool":
            raise self.type_error(f"inputs must be bool, got {dtype}")
        if self.operands != "bool" and dtype == "bool" and self.result != "bool":
            raise self.type_error("inputs are bool; cast them to a number first")
        if self.operands == "float" and not is_float(dtype):
            raise self.type_error(f"inputs must be floating point, got {dtype}")
        if self.operands == "int" and not is_int(dtype):
            raise self.type_error(f"inputs must be integers, got {dtype}")
        shape = broadcast_shape(self, types, self.inputs)
        return TensorType(shape, "bool" if self.result == "bool" else dtype)


def _int_quotient(lhs: np.ndarray, rhs: np.ndarray, remainder: bool) -> np.ndarray:
    """Integer a / b truncated toward zero (or its remainder, a - b * (a / b)), exact at any
    magnitude and total: a zero divisor gives 0, and b == -1 gives the wrapped -a (INT_MIN for
    INT_MIN) and remainder 0. The TE computes define the same values (topi/broadcast.py)."""
    lhs, rhs = np.broadcast_arrays(lhs, rhs)
    special = (rhs == 0) | ((rhs == -1) if rhs.dtype.kind == "i" else False)
    divisor = np.where(special, 1, rhs).astype(rhs.dtype)
    floor = np.floor_divide(lhs, divisor)
    inexact = np.remainder(lhs, divisor) != 0
    negative = (lhs < 0) != (divisor < 0)
    quotient = np.where(inexact & negative, floor + 1, floor).astype(lhs.dtype)
    if remainder:
        return np.where(special, 0, lhs - divisor * quotient).astype(lhs.dtype)
    with np.errstate(over="ignore"):
        wrapped = np.negative(lhs)
    return np.where(rhs == 0, 0, np.where(special, wrapped, quotient)).astype(lhs.dtype)


def _divide(lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    if lhs.dtype.kind in "iu":
        # Truncates toward zero, as C and ONNX Div; by zero it is 0 (see _int_quotient).
        return _int_quotient(lhs, rhs, remainder=False)
    return np.divide(lhs, rhs)


def _floor_divide(lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    if lhs.dtype.kind == "f":
        return np.floor(np.divide(lhs, rhs))
    lhs, rhs = np.broadcast_arrays(lhs, rhs)
    with np.errstate(divide="ignore", over="ignore"):  # by 0: 0; INT_MIN // -1: INT_MIN
        return np.floor_divide(lhs, rhs)


def _mod(lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """NumPy's mod (the divisor's sign); an integer mod by zero is 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.mod(lhs, rhs)


def _power(lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    if lhs.dtype.kind == "u":
        # Modulo 2**bits, for every exponent (uint64 ones past 2**63 too, which int64 would
        # read as negative).
        with np.errstate(over="ignore"):
            return np.power(lhs, rhs)
    if lhs.dtype.kind == "i":
        # A negative exponent gives the truncated real power, as ONNX Runtime: 1 for a base
        # of 1, +-1 for -1, 0 for larger bases and (a division by zero) for 0.
        base, exponent = np.broadcast_arrays(lhs.astype(np.int64), rhs.astype(np.int64))
        negative = exponent < 0
        with np.errstate(over="ignore"):
            power = np.power(base, np.where(negative, 0, exponent))
        odd = (exponent % 2) != 0
        inverse = np.where(base == 1, 1, np.where(base == -1, np.where(odd, -1, 1), 0))
        return np.where(negative, inverse, power)
    return np.power(lhs, rhs)


# name, NumPy implementation, result ("same" / "bool"), operands ("number"/"float"/"int"/"bool")
_TABLE: list[tuple[str, Callable[[np.ndarray, np.ndarray], Any], str, str]] = [
    ("add", np.add, "same", "number"),
    ("subtract", np.subtract, "same", "number"),
    ("multiply", np.multiply, "same", "number"),
    ("divide", _divide, "same", "number"),
    ("floor_divide", _floor_divide, "same", "number"),
    ("mod", _mod, "same", "number"),  # result takes the divisor's sign (Python/NumPy mod)
    ("power", _power, "same", "number"),
    ("maximum", np.maximum, "same", "number"),
    ("minimum", np.minimum, "same", "number"),
    ("equal", np.equal, "bool", "number"),
    ("not_equal", np.not_equal, "bool", "number"),
    ("less", np.less, "bool", "number"),
    ("less_equal", np.less_equal, "bool", "number"),
    ("greater", np.greater, "bool", "number"),
    ("greater_equal", np.greater_equal, "bool", "number"),
    ("logical_and", np.logical_and, "bool", "bool"),
    ("logical_or", np.logical_or, "bool", "bool"),
    ("logical_xor", np.logical_xor, "bool", "bool"),
    ("bitwise_and", np.bitwise_and, "same", "int"),
    ("bitwise_or", np.bitwise_or, "same", "int"),
    ("bitwise_xor", np.bitwise_xor, "same", "int"),
    ("left_shift", np.left_shift, "same", "int"),
    ("right_shift", np.right_shift, "same", "int"),
]


def _declare_binary(name: str, fn: Callable, result: str, operands: str) -> None:
    cls = type(
        f"Op_{name}",
        (BroadcastOp,),
        {
            "name": name,
            "result": result,
            "operands": operands,
            "doc": f"Elementwise {name} with NumPy broadcasting.",
            "reference": lambda self, lhs, rhs: fn(lhs, rhs),
        },
    )
    register_op(cls)


for _name, _fn, _result, _operands in _TABLE:
    _declare_binary(_name, _fn, _result, _operands)


@register_op
class Where(Op):
    name = "where"
    doc = "x where condition is true, else y; all three broadcast together."
    inputs = ("condition", "x", "y")
    pattern = OpPatternKind.kBroadcast

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        cond, x, y = self.expect_tensors(arg_types)
        if cond.dtype != "bool":
            raise self.type_error(f"input 'condition' must be bool, got {cond.dtype}")
        dtype = same_dtype(self, [x, y], ["x", "y"])
        return TensorType(broadcast_shape(self, [cond, x, y], self.inputs), dtype)

    def reference(self, condition: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.where(condition, x, y)
