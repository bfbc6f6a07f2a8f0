"""Binary operators with NumPy broadcasting, and ``where``. All are kBroadcast.

Arithmetic keeps the inputs' (shared) dtype; comparisons and logical ops return bool."""

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


def _divide(lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    if lhs.dtype.kind in "iu":
        # Integer division truncates toward zero, as C and ONNX Div do.
        with np.errstate(divide="ignore", invalid="ignore"):
            quotient = np.trunc(lhs.astype(np.float64) / rhs.astype(np.float64))
        return quotient.astype(lhs.dtype)
    return np.divide(lhs, rhs)


def _floor_divide(lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    if lhs.dtype.kind == "f":
        return np.floor(np.divide(lhs, rhs))
    return np.floor_divide(lhs, rhs)


def _power(lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    if lhs.dtype.kind in "iu":
        return np.power(lhs.astype(np.int64), rhs.astype(np.int64))
    return np.power(lhs, rhs)


# name, NumPy implementation, result ("same" / "bool"), operands ("number"/"float"/"int"/"bool")
_TABLE: list[tuple[str, Callable[[np.ndarray, np.ndarray], Any], str, str]] = [
    ("add", np.add, "same", "number"),
    ("subtract", np.subtract, "same", "number"),
    ("multiply", np.multiply, "same", "number"),
    ("divide", _divide, "same", "number"),
    ("floor_divide", _floor_divide, "same", "number"),
    ("mod", np.mod, "same", "number"),  # result takes the divisor's sign (Python/NumPy mod)
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
