"""Tensor expressions: say what to compute (placeholder, compute, reductions), then how
(create_schedule and the stage primitives); ``opfusion.lower`` (:mod:`.lower`) turns a
schedule into loop IR.

    A = te.placeholder((n,), name="A")
    B = te.placeholder((n,), name="B")
    C = te.compute(A.shape, lambda i: A[i] + B[i], name="C")
    s = te.create_schedule(C.op)
    xo, xi = s[C].split(C.op.axis[0], factor=64)
    s[C].parallel(xo)

Reducers: ``te.sum(expr, axis=k)``, ``te.max(expr, axis=k)``, ``te.min(expr, axis=k)`` reduce
over one or more reduction axes; with two values and no axis, ``te.max(a, b)`` /
``te.min(a, b)`` / ``te.sum(a, b)`` combine elementwise. ``te.comm_reducer(combine,
identity)`` makes a new reducer."""

from ..tir.expr import PrimExpr, Var
from .intrin import (
    abs,
    acos,
    all,
    any,
    asin,
    atan,
    atan2,
    cast,
    ceil,
    const,
    cos,
    cosh,
    dot2_s16,
    dot4_u8s8,
    erf,
    exp,
    exp2,
    exp_normal,
    expm1,
    floor,
    floordiv,
    floormod,
    fmod,
    if_then_else,
    log,
    log1p,
    log2,
    log10,
    pow,
    power,
    round,
    rsqrt,
    select,
    sigmoid,
    sin,
    sinh,
    sqrt,
    tan,
    tanh,
    trunc,
)
from .reduction import CommReducer, Reduce, comm_reducer, max, max_value, min, min_value, sum
from .schedule import Fuse, Schedule, Split, Stage, ThreadAxis, create_schedule, thread_axis
from .tensor import (
    ComputeOp,
    IterVar,
    Operation,
    PlaceholderOp,
    Range,
    Tensor,
    TensorLoad,
    compute,
    placeholder,
    post_dfs_order,
    read_graph,
    reads_of,
    reduce_axis,
    var,
)

__all__ = [
    "CommReducer", "ComputeOp", "Fuse", "IterVar", "Operation", "PlaceholderOp", "PrimExpr",
    "Range", "Reduce", "Schedule", "Split", "Stage", "Tensor", "TensorLoad", "ThreadAxis", "Var",
    "abs", "acos",
    "all", "any", "asin", "atan", "atan2", "cast", "ceil", "comm_reducer", "compute", "const",
    "cos", "cosh", "create_schedule", "dot2_s16", "dot4_u8s8", "erf", "exp", "exp2",
    "exp_normal", "expm1", "floor", "floordiv", "floormod", "fmod", "if_then_else", "log",
    "log10", "log1p", "log2", "max",
    "max_value", "min", "min_value", "placeholder", "post_dfs_order", "pow", "power", "read_graph",
    "reads_of", "reduce_axis", "round", "rsqrt", "select", "sigmoid", "sin", "sinh", "sqrt",
    "sum", "tan", "tanh", "thread_axis", "trunc", "var",
]
