"""Random graphs for property tests of passes: hypothesis strategies that build small
dataflow graphs with the features passes care about — shared and duplicated subexpressions,
constant-only subgraphs, tuples with unused fields.

Requires ``hypothesis`` (a test dependency)."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from .. import op
from ..ir.expr import Expr, Function, Tuple, TupleGetItem, const, var
from ..ir.module import IRModule

SHAPE = (2, 3)
_BINARY = (op.add, op.subtract, op.multiply, op.maximum, op.minimum)
_UNARY = (op.negative, op.nn.relu, op.tanh, op.abs, op.sigmoid)


@st.composite
def dataflow_graphs(draw: Any, max_ops: int = 12) -> IRModule:
    """A module ``@main(%x0[, %x1, %x2])`` of elementwise ops on (2, 3) float32 tensors.

    Steps pick among: a binary or unary op on earlier values, an exact duplicate of an earlier
    call (the same op on the same operands: a common subexpression), a new constant (so
    constant-only subgraphs appear), and a tuple from which one field is projected (the other
    fields are dead). The result combines the last value with a random earlier one."""
    params = [var(f"x{k}", SHAPE) for k in range(draw(st.integers(1, 3)))]
    values: list[Expr] = list(params)
    calls: list[tuple[Any, tuple[Expr, ...]]] = []
    for _ in range(draw(st.integers(1, max_ops))):
        kind = draw(st.sampled_from(["binary", "unary", "duplicate", "constant", "tuple"]))
        pick = lambda: values[draw(st.integers(0, len(values) - 1))]  # noqa: E731
        if kind == "constant":
            seed = draw(st.integers(0, 2**16))
            data = np.random.default_rng(seed).standard_normal(SHAPE).astype(np.float32)
            values.append(const(data))
        elif kind == "duplicate" and calls:
            builder, args = calls[draw(st.integers(0, len(calls) - 1))]
            values.append(builder(*args))
        elif kind == "tuple":
            fields = [pick() for _ in range(draw(st.integers(2, 3)))]
            values.append(TupleGetItem(Tuple(fields), draw(st.integers(0, len(fields) - 1))))
        elif kind == "unary":
            builder, args = draw(st.sampled_from(_UNARY)), (pick(),)
            calls.append((builder, args))
            values.append(builder(*args))
        else:
            builder, args = draw(st.sampled_from(_BINARY)), (pick(), pick())
            calls.append((builder, args))
            values.append(builder(*args))
    out = op.add(values[-1], values[draw(st.integers(0, len(values) - 1))])
    return IRModule.from_expr(Function(params, out))


def random_inputs(mod: IRModule, seed: int = 0) -> dict[str, np.ndarray]:
    """Standard-normal arrays for every parameter of ``@main``, by name."""
    rng = np.random.default_rng(seed)
    out = {}
    for param in mod["main"].params:
        ty = param.type_annotation
        out[param.name_hint] = rng.standard_normal(ty.shape).astype(ty.dtype)
    return out
