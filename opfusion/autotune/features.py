"""Features of one candidate kernel for the tuner's cost model (:mod:`.cost_model`).

As in Ansor's and TVM's learned cost models, a candidate is described by its lowered loop IR
(:class:`~opfusion.tir.stmt.PrimFunc`) rather than by its knob values alone: the loop IR
says what the knobs *did* (how many tasks, vector lanes, unrolled copies, scratch bytes), in
terms that mean the same for every rule. The knob values follow, one number per knob, for
what the loop IR does not show (a loop order that only moves strides, say).

The **main statement** is the store that does the most work (executions times the loads and
float operations of its value); the features of its loop nest (depth, innermost extents,
stride) describe the kernel's hot loop. Counts that grow with the problem are
``log2(1 + x)``; shares and small counts are raw. Every feature is finite and the vector is
the same for the same kernel (iterative walks in program order)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ..backend.schedule_rule import ConfigSpace, KnobValue, ScheduleError
from ..tir import expr as E
from ..tir import stmt as S
from ..tir.simplify import linear_form, var_key
from ..tir.work import largest_extent  # kernel_work's extent rule: the same counts

#: The loop-IR features of :func:`loop_features`, in order. ``log`` marks ``log2(1 + x)``.
FEATURE_NAMES: tuple[str, ...] = (
    "loops",              # log: For statements
    "max_depth",          # the deepest loop nest
    "ifs",                # IfThenElse statements
    "variable_extents",   # loops whose extent is not a constant (edges of non-dividing splits)
    "stores",             # BufferStore statements
    "executions",         # log: statement executions, as opfusion.tir.work.kernel_work counts
    "float_ops",          # log: float operations executed (each vector lane counts)
    "loads",              # log: buffer loads executed
    "index_ops",          # log: integer and boolean operations executed (indices, guards)
    "global_bytes",       # log: bytes of the kernel's parameter buffers
    "scratch_bytes",      # log: bytes of its Allocate'd temporaries
    "intensity",          # log: float_ops per byte of global and scratch buffers
    "parallel_loops",     # PARALLEL loops
    "parallel_tasks",     # log: the PARALLEL loops' extents, summed
    "vector_lanes",       # the widest VECTORIZED loop (0 without one)
    "vectorized_share",   # share of the work (executions x (1 + loads + float ops)) vectorized
    "unroll_product",     # log: the largest product of UNROLLED extents around a statement
    "main_depth",         # loops around the main statement
    "main_outer_extent",  # log: the outermost loop around it
    "inner1_extent",      # log: the innermost loop around it
    "inner2_extent",      # log: the product of the two innermost loops' extents
    "inner3_extent",      # log: ... of the three innermost
    "inner_stride",       # log: its largest access stride (elements) along the innermost loop
    "accumulator_bytes",  # log: bytes of the temporary it writes (0 when it writes a param)
)


@dataclass(frozen=True, eq=False)
class _Loop:
    """A loop around a statement, as the walk saw it."""

    var: E.Var
    extent: int
    kind: S.ForKind


@dataclass
class _Totals:
    """What the walk adds up."""

    loops: int = 0
    max_depth: int = 0
    ifs: int = 0
    variable_extents: int = 0
    stores: int = 0
    executions: int = 0
    float_ops: int = 0
    loads: int = 0
    index_ops: int = 0
    scratch_bytes: int = 0
    parallel_loops: int = 0
    parallel_tasks: int = 0
    vector_lanes: int = 0
    work: int = 0
    vectorized_work: int = 0
    unroll_product: int = 1
    main: S.BufferStore | None = None
    main_path: tuple[_Loop, ...] = ()
    main_work: int = -1
    scratch: dict[int, int] = field(default_factory=dict)  # id(buffer) -> bytes


def loop_features(func: S.PrimFunc) -> np.ndarray:
    """The loop-IR features of kernel ``func``: float64, one per :data:`FEATURE_NAMES`."""
    totals = _walk(func.body)
    global_bytes = sum(_bytes(b) for b in func.params)
    memory = max(1, global_bytes + totals.scratch_bytes)
    path = totals.main_path
    values = {
        "loops": _log(totals.loops),
        "max_depth": totals.max_depth,
        "ifs": totals.ifs,
        "variable_extents": totals.variable_extents,
        "stores": totals.stores,
        "executions": _log(totals.executions),
        "float_ops": _log(totals.float_ops),
        "loads": _log(totals.loads),
        "index_ops": _log(totals.index_ops),
        "global_bytes": _log(global_bytes),
        "scratch_bytes": _log(totals.scratch_bytes),
        "intensity": _log(totals.float_ops / memory),
        "parallel_loops": totals.parallel_loops,
        "parallel_tasks": _log(totals.parallel_tasks),
        "vector_lanes": totals.vector_lanes,
        "vectorized_share": totals.vectorized_work / totals.work if totals.work else 0.0,
        "unroll_product": _log(totals.unroll_product),
        "main_depth": len(path),
        "main_outer_extent": _log(path[0].extent) if path else 0.0,
        "inner1_extent": _log(_inner_product(path, 1)),
        "inner2_extent": _log(_inner_product(path, 2)),
        "inner3_extent": _log(_inner_product(path, 3)),
        "inner_stride": _log(_inner_stride(totals.main, path)),
        "accumulator_bytes": _log(_accumulator_bytes(totals.main, totals.scratch)),
    }
    return np.array([float(values[name]) for name in FEATURE_NAMES], dtype=np.float64)


def knob_features(config: Mapping[str, KnobValue], space: ConfigSpace) -> np.ndarray:
    """One number per knob of ``space``, in knob order: a bool as 0 or 1, an int as
    ``sign(v) * log2(1 + |v|)``, a string as the index of the value among the knob's
    candidates (-1 when it is not one of them)."""
    out = np.zeros(len(space.knobs), dtype=np.float64)
    for position, knob in enumerate(space.knobs):
        if knob.name not in config:
            raise ScheduleError(f"config of rule {space.rule!r} lacks knob {knob.name!r}; the "
                                f"cost model's features need every knob of the space")
        value = config[knob.name]
        if isinstance(value, bool):
            out[position] = float(value)
        elif isinstance(value, int):
            out[position] = math.copysign(math.log2(1 + abs(value)), value)
        else:
            out[position] = float(knob.values.index(value)) if value in knob.values else -1.0
    return out


def candidate_features(func: S.PrimFunc, config: Mapping[str, KnobValue],
                       space: ConfigSpace) -> np.ndarray:
    """The cost model's features of one candidate: :func:`loop_features` of its lowered
    kernel ``func``, then :func:`knob_features` of its ``config``."""
    return np.concatenate([loop_features(func), knob_features(config, space)])


# ---------------------------------------------------------------------------------------------
# the walk


def _walk(body: S.Stmt) -> _Totals:
    """Add up the statements of ``body`` in program order, each weighted by the product of
    the extents of the loops around it (explicit stack; statement nesting is shallow but
    the walk never recurses)."""
    totals = _Totals()
    ranges: dict[E.Var, tuple[int, int]] = {}
    stack: list[tuple[S.Stmt, int, tuple[_Loop, ...]]] = [(body, 1, ())]
    while stack:
        node, weight, path = stack.pop()
        if isinstance(node, S.For):
            _visit_loop(node, weight, path, ranges, totals, stack)
        elif isinstance(node, S.SeqStmt):
            stack.extend((child, weight, path) for child in reversed(node.stmts))
        elif isinstance(node, S.Allocate):
            totals.scratch[id(node.buffer)] = _bytes(node.buffer)
            totals.scratch_bytes += _bytes(node.buffer)
            stack.append((node.body, weight, path))
        elif isinstance(node, S.LetStmt):
            totals.index_ops += weight * _expr_ops([node.value])[1]
            stack.append((node.body, weight, path))
        elif isinstance(node, S.IfThenElse):
            totals.ifs += 1
            totals.executions += weight
            totals.index_ops += weight * _expr_ops([node.condition])[1]
            if node.else_case is not None:
                stack.append((node.else_case, weight, path))
            stack.append((node.then_case, weight, path))
        elif isinstance(node, S.BufferStore):
            _visit_store(node, weight, path, totals)
        else:  # Evaluate
            totals.executions += weight
    return totals


def _visit_loop(loop: S.For, weight: int, path: tuple[_Loop, ...],
                ranges: dict[E.Var, tuple[int, int]], totals: _Totals,
                stack: list[tuple[S.Stmt, int, tuple[_Loop, ...]]]) -> None:
    extent = largest_extent(loop, ranges)
    totals.loops += 1
    totals.max_depth = max(totals.max_depth, len(path) + 1)
    totals.variable_extents += not isinstance(loop.extent, E.IntImm)
    if loop.kind is S.ForKind.PARALLEL:
        totals.parallel_loops += 1
        totals.parallel_tasks += max(extent, 0)
    elif loop.kind is S.ForKind.VECTORIZED:
        totals.vector_lanes = max(totals.vector_lanes, extent)
    if extent > 0:
        stack.append((loop.body, weight * extent, (*path, _Loop(loop.loop_var, extent,
                                                                 loop.kind))))


def _visit_store(store: S.BufferStore, weight: int, path: tuple[_Loop, ...],
                 totals: _Totals) -> None:
    float_ops, index_ops, loads = _expr_ops([store.value, *store.indices])
    work = weight * (1 + float_ops + loads)
    totals.stores += 1
    totals.executions += weight
    totals.float_ops += weight * float_ops
    totals.index_ops += weight * index_ops
    totals.loads += weight * loads
    totals.work += work
    if any(loop.kind is S.ForKind.VECTORIZED for loop in path):
        totals.vectorized_work += work
    unrolled = math.prod(loop.extent for loop in path if loop.kind is S.ForKind.UNROLLED)
    totals.unroll_product = max(totals.unroll_product, unrolled)
    if work > totals.main_work:  # the first of equals: program order decides
        totals.main, totals.main_path, totals.main_work = store, path, work


def _expr_ops(exprs: list[E.PrimExpr]) -> tuple[int, int, int]:
    """(float operations, integer/boolean operations, loads) of one execution of ``exprs``;
    a shared sub-expression counts once per expression (a C compiler computes it once)."""
    float_ops = index_ops = loads = 0
    for expr in exprs:
        for node in E.post_order(expr):
            if isinstance(node, E.BufferLoad):
                loads += 1
            elif isinstance(node, (E.Var, E.IntImm, E.FloatImm, E.Let)):
                continue
            elif E.is_float(node.dtype):
                float_ops += 1
            else:
                index_ops += 1
    return float_ops, index_ops, loads


# ---------------------------------------------------------------------------------------------
# the main statement


def _inner_product(path: tuple[_Loop, ...], levels: int) -> int:
    """The product of the extents of the ``levels`` innermost loops of ``path`` (1 when there
    are none)."""
    return math.prod(loop.extent for loop in path[len(path) - min(levels, len(path)):])


def _inner_stride(store: S.BufferStore | None, path: tuple[_Loop, ...]) -> int:
    """The largest distance in elements that one step of the innermost loop moves an access
    (the store or a load) of ``store``: 0 for a broadcast, 1 for contiguous; a non-linear
    use of the loop variable counts the stride of its dimension."""
    if store is None or not path:
        return 0
    var = path[-1].var
    accesses = [(store.buffer, store.indices)]
    accesses += [(n.buffer, n.indices) for n in E.post_order(store.value)
                 if isinstance(n, E.BufferLoad)]
    return max(_access_stride(buffer, indices, var) for buffer, indices in accesses)


def _access_stride(buffer: E.Buffer, indices: tuple[E.PrimExpr, ...], var: E.Var) -> int:
    stride = 0
    key = var_key(var)
    for index, dim_stride in zip(indices, buffer.strides):
        linear = linear_form(index)
        coef = linear.coef_of(var)
        nonlinear = any(
            k != key and any(n is var for n in E.post_order(atom))
            for k, (_, atom) in linear.terms.items()
        )
        stride += abs(coef) * dim_stride + (dim_stride if nonlinear else 0)
    return stride


def _accumulator_bytes(store: S.BufferStore | None, scratch: dict[int, int]) -> int:
    """Bytes of the temporary the main statement writes (its register tile, for a
    ``cache_write`` accumulator); 0 when it writes a parameter."""
    if store is None:
        return 0
    return scratch.get(id(store.buffer), 0)


# ---------------------------------------------------------------------------------------------
# helpers


def _bytes(buffer: E.Buffer) -> int:
    return buffer.size * (E.dtype_bits(buffer.dtype) // 8)


def _log(x: float) -> float:
    return math.log2(1 + max(x, 0))


__all__ = ["FEATURE_NAMES", "candidate_features", "knob_features", "loop_features"]
