"""ewise_fma: ``a * b + c`` as one operator, the target of the multiply-add rewrite.

The three inputs broadcast together as NumPy does (as ``add(multiply(a, b), c)`` would), so
the operator is kBroadcast like the two it replaces. The reference multiplies and then adds,
rounding twice exactly as the unfused pair does; a code generator may contract it into a
hardware fused multiply-add (one rounding), which is why comparisons allow a tolerance."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..ir.op import Attrs, Op, OpPatternKind, register_op
from ..ir.types import TensorType, Type
from ._common import broadcast_shape, same_dtype


@register_op
class EwiseFMA(Op):
    name = "ewise_fma"
    doc = "a * b + c elementwise; the three inputs broadcast together (NumPy rules)."
    inputs = ("a", "b", "c")
    pattern = OpPatternKind.kBroadcast

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        types = self.expect_tensors(arg_types)
        dtype = same_dtype(self, types, self.inputs)
        if dtype == "bool":
            raise self.type_error("inputs are bool; cast them to a number first")
        return TensorType(broadcast_shape(self, types, self.inputs), dtype)

    def reference(self, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
        return np.add(np.multiply(a, b), c)
