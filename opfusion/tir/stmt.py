"""Statements of the loop IR and PrimFunc, the unit a code generator turns into one C function.

Nodes and their fields (read-only attributes; expressions are :mod:`opfusion.tir.expr` nodes):

================  =============================================================================
``BufferStore``   ``buffer: Buffer``, ``value: PrimExpr``, ``indices: tuple[PrimExpr, ...]`` —
                  ``buffer[indices] = value``; ``value.dtype == buffer.dtype``.
``For``           ``loop_var: Var``, ``min: PrimExpr``, ``extent: PrimExpr``, ``kind: ForKind``,
                  ``body: Stmt`` — ``for (v = min; v < min + extent; ++v) body``. ``extent``
                  may be a non-constant expression of enclosing loop variables (a loop
                  shortened at the edge of a non-dividing split, e.g. ``min(64, 1000 - xo*64)``)
                  and may then be <= 0 (no iteration). ``min`` and ``extent`` have the dtype
                  of ``loop_var``.
``ForKind``       SERIAL; PARALLEL (iterations may run on different threads: OpenMP
                  ``parallel for``; never nested inside another PARALLEL loop in code from
                  :func:`opfusion.lower`); VECTORIZED (iterations are independent and may run
                  in SIMD lanes; the body has no per-iteration guard and affine indices);
                  UNROLLED (a hint to unroll fully; the extent is usually constant);
                  MMA_TF32 (a serial loop of 8 contraction steps around a 2 x 2 register
                  tile that a GPU may run as one tensor-core instruction:
                  :mod:`opfusion.tir.mma`).
``IfThenElse``    ``condition: PrimExpr`` (bool), ``then_case: Stmt``, ``else_case: Stmt | None``.
``LetStmt``       ``var: Var``, ``value: PrimExpr``, ``body: Stmt`` — ``var`` is bound to
                  ``value`` in ``body`` (immutable: a C ``const`` local).
``Allocate``      ``buffer: Buffer`` (scope "local"), ``body: Stmt`` — a temporary of
                  ``buffer.size`` elements of ``buffer.dtype``, live during ``body`` only,
                  uninitialised. Inside a PARALLEL loop each iteration has its own copy.
``SeqStmt``       ``stmts: tuple[Stmt, ...]`` — in order; never empty, never nested directly
                  in another SeqStmt (the constructor flattens).
``Evaluate``      ``value: PrimExpr`` — evaluate for side effects (not produced by lower()).
``Prefetch``      ``buffer: Buffer``, ``indices: tuple[PrimExpr, ...]`` — a hint that
                  ``buffer[indices]`` will be read soon: its cache line is fetched toward the
                  core's caches. No effect on any value; the indices are in bounds (from
                  :meth:`opfusion.te.Stage.prefetch`, whose schedule clamps them).
``AsyncCopy``     ``buffer``, ``indices``, ``source: BufferLoad``, ``predicate`` — a copy into a
                  shared buffer that lands at a later ``AsyncWait`` (``cp.async``; from
                  :meth:`opfusion.te.Stage.async_pipeline`); ``AsyncCommit`` closes the
                  thread's group of them, ``AsyncWait(pending)`` waits for all but the newest
                  ``pending`` groups.
``PrimFunc``      ``name: str``, ``params: tuple[Buffer, ...]``, ``body: Stmt``,
                  ``attrs: dict[str, Any]`` — one kernel; params are "global" buffers in
                  argument order, the kernel reads and writes through them.
================  =============================================================================

Guarantees of a PrimFunc from :func:`opfusion.lower`:

- every Var and Buffer name is a valid C identifier (``[A-Za-z_][A-Za-z0-9_]*``) and unique
  within the function (a code generator may still prefix them to stay clear of C keywords);
- every Var is defined by exactly one For (or LetStmt) and used only inside it;
- ``For.min`` is 0 except where a lower-bound guard became the loop's start
  (``max(0, 1 - i_outer*6)``); ``For.extent`` is constant except at the edge of a
  non-dividing split, where it is ``min(f, n - ...)``;
- loop variables and indices are int32 (int64 only for a loop of 2**31 or more iterations);
  use :meth:`Buffer.offset_of` for flat offsets (int64 for buffers of 2**31 or more elements);
- FloorDiv/FloorMod made by ``fuse`` have a positive constant divisor and a non-negative
  numerator; others come from the user's index arithmetic. ``opfusion.tir.simplify.
  const_bound`` with the enclosing loop ranges tells when C ``/`` and ``%`` are exact;
- Allocate holds the "local" temporaries (cache_write stages, producers computed at a loop,
  intermediate stages at root); a temporary's size is a Python int (stack or heap is the code
  generator's choice);
- an empty kernel (a zero-size output) has the body ``Evaluate(IntImm(0))``;
- :func:`opfusion.tir.verify.verify` checks the structural ones;
- value expressions may be hundreds of levels deep after inlining, and an inlined tensor read
  several times is one shared sub-expression (a DAG): walk them with
  :func:`opfusion.tir.expr.post_order`, not by recursion.

``str(stmt)`` and ``str(func)`` print the readable, Python-like text of
:mod:`opfusion.tir.printer`."""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from typing import Any

from ..errors import TensorExprError
from .expr import Buffer, BufferLoad, PrimExpr, Var, as_expr, cast, post_order

__all__ = [
    "Allocate", "Buffer", "BufferStore", "Evaluate", "For", "ForKind", "IfThenElse", "LetStmt",
    "Prefetch", "PrimFunc", "SeqStmt", "Stmt", "seq",
]

_set = object.__setattr__


class ForKind(enum.Enum):
    """How a loop's iterations may be executed."""

    SERIAL = "serial"
    PARALLEL = "parallel"
    VECTORIZED = "vectorized"
    UNROLLED = "unrolled"
    # Serial, as written; on a GPU the nest it heads is one warp's tensor-core multiply-add
    # (mma.sync m16n8k8 in TF32), its operands exchanged between the lanes: see tir/mma.py.
    MMA_TF32 = "mma_tf32"
    # GPU thread binding: the loop is not a loop; each block (blockIdx) or thread of a block
    # (threadIdx) of the launch runs the body with the variable at its own index, and a
    # thread whose index is past the extent skips it. The launch's size along each axis is
    # the largest extent bound to it.
    BLOCK_X = "blockIdx.x"
    BLOCK_Y = "blockIdx.y"
    BLOCK_Z = "blockIdx.z"
    THREAD_X = "threadIdx.x"
    THREAD_Y = "threadIdx.y"
    THREAD_Z = "threadIdx.z"

    @property
    def is_thread_binding(self) -> bool:
        """Whether the loop is bound to a GPU block or thread index."""
        return "." in self.value

    @property
    def is_block(self) -> bool:
        """Whether the loop is bound to a block index (``blockIdx.*``)."""
        return self.value.startswith("blockIdx")


#: The GPU indices a loop can be bound to, in launch order (grid x, y, z, then block x, y, z).
THREAD_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y",
               "threadIdx.z")

#: The storage scopes of a temporary: "local" (one copy per thread; registers or the stack)
#: and "shared" (one copy per GPU block, seen by all its threads).
ALLOCATE_SCOPES = ("local", "shared")


class Stmt:
    """Base class of statements."""

    __slots__ = ()

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} nodes are immutable")

    def __str__(self) -> str:
        from .printer import stmt_to_str

        return stmt_to_str(self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__}>\n{self}"


class BufferStore(Stmt):
    """``buffer[indices] = value``."""

    __slots__ = ("buffer", "value", "indices")

    def __init__(self, buffer: Buffer, value: Any, indices: Sequence[Any]) -> None:
        indices = tuple(as_expr(i) for i in indices)
        if len(indices) != len(buffer.shape):
            raise TensorExprError(
                f"store to buffer {buffer.name} with {len(indices)} indices; it has "
                f"{len(buffer.shape)} dimension(s)"
            )
        value = as_expr(value, buffer.dtype)
        if value.dtype != buffer.dtype:
            value = cast(value, buffer.dtype)
        _set(self, "buffer", buffer)
        _set(self, "value", value)
        _set(self, "indices", indices)


class For(Stmt):
    """``for loop_var in [min, min + extent)``, executed as ``kind`` says."""

    __slots__ = ("loop_var", "min", "extent", "kind", "body")

    def __init__(self, loop_var: Var, min: Any, extent: Any, kind: ForKind, body: Stmt) -> None:
        _set(self, "loop_var", loop_var)
        _set(self, "min", cast(as_expr(min, loop_var.dtype), loop_var.dtype))
        _set(self, "extent", cast(as_expr(extent, loop_var.dtype), loop_var.dtype))
        _set(self, "kind", ForKind(kind))
        _set(self, "body", body)


class IfThenElse(Stmt):
    """``if condition: then_case else: else_case``."""

    __slots__ = ("condition", "then_case", "else_case")

    def __init__(self, condition: PrimExpr, then_case: Stmt, else_case: Stmt | None = None) -> None:
        condition = as_expr(condition)
        if condition.dtype != "bool":
            raise TensorExprError(f"if condition {condition} is {condition.dtype}, not bool")
        _set(self, "condition", condition)
        _set(self, "then_case", then_case)
        _set(self, "else_case", else_case)


class LetStmt(Stmt):
    """``var = value`` (immutable) for the duration of ``body``."""

    __slots__ = ("var", "value", "body")

    def __init__(self, var: Var, value: Any, body: Stmt) -> None:
        _set(self, "var", var)
        _set(self, "value", cast(as_expr(value, var.dtype), var.dtype))
        _set(self, "body", body)


class Allocate(Stmt):
    """A temporary buffer that lives while ``body`` runs: "local" (per thread) or, on a GPU,
    "shared" (one per block)."""

    __slots__ = ("buffer", "body")

    def __init__(self, buffer: Buffer, body: Stmt) -> None:
        if buffer.scope not in ALLOCATE_SCOPES:
            raise TensorExprError(f"Allocate of buffer {buffer.name} needs scope 'local' or "
                                  f"'shared', not {buffer.scope!r}")
        _set(self, "buffer", buffer)
        _set(self, "body", body)


class Barrier(Stmt):
    """``__syncthreads()``: each thread of a GPU block waits here until every thread of the
    block has arrived, and what they wrote to shared buffers before it is then visible to
    all. Every thread of a block must reach the same barriers (none inside a condition that
    depends on the thread's index)."""

    __slots__ = ()


class AsyncCopy(Stmt):
    """``buffer[indices] = source if predicate else 0``, started now and finished by a later
    :class:`AsyncWait` (``cp.async`` on a GPU since Ampere: global to shared memory without
    passing through the thread's registers). ``buffer`` is a "shared" buffer and ``source``
    a load of one element of the function's buffers; the copy is in the thread's open group
    until an :class:`AsyncCommit` closes it. Nothing may read the element, in this thread or
    another, before the copying thread's wait for its group and a barrier after it.
    ``predicate`` (None: always) false stores zero without reading ``source`` (a padded
    window's edge); its indices must still lie inside the source."""

    __slots__ = ("buffer", "indices", "source", "predicate")

    def __init__(self, buffer: Buffer, indices: Sequence[Any], source: BufferLoad,
                 predicate: Any = None) -> None:
        target = BufferStore(buffer, source, indices)  # the indices and types checked
        if buffer.scope != "shared" or not isinstance(source, BufferLoad):
            raise TensorExprError(f"an async copy goes from a load into a shared buffer, not "
                                  f"{type(source).__name__} into {buffer.scope} {buffer.name}")
        if source.dtype != buffer.dtype:
            raise TensorExprError(f"an async copy of {source.dtype} into {buffer.dtype} "
                                  f"{buffer.name} converts nothing")
        if predicate is not None:
            predicate = as_expr(predicate)
            if predicate.dtype != "bool":
                raise TensorExprError(f"async copy predicate {predicate} is not bool")
        _set(self, "buffer", buffer)
        _set(self, "indices", target.indices)
        _set(self, "source", source)
        _set(self, "predicate", predicate)


class AsyncCommit(Stmt):
    """Close the thread's open group of :class:`AsyncCopy` (``cp.async.commit_group``): the
    group an :class:`AsyncWait` counts. A group may be empty."""

    __slots__ = ()


class AsyncWait(Stmt):
    """Wait until at most ``pending`` of the thread's committed groups of async copies are
    unfinished (``cp.async.wait_group``): the older ones have landed. Other threads see them
    after a barrier that follows."""

    __slots__ = ("pending",)

    def __init__(self, pending: int) -> None:
        if not (isinstance(pending, int) and pending >= 0):
            raise TensorExprError(f"async wait for {pending!r} pending groups: needs an int >= 0")
        _set(self, "pending", pending)


class SeqStmt(Stmt):
    """Statements run in order."""

    __slots__ = ("stmts",)

    def __init__(self, stmts: Sequence[Stmt]) -> None:
        flat: list[Stmt] = []
        for s in stmts:
            if isinstance(s, SeqStmt):
                flat.extend(s.stmts)
            else:
                flat.append(s)
        if not flat:
            raise TensorExprError("SeqStmt needs at least one statement")
        _set(self, "stmts", tuple(flat))


class Prefetch(Stmt):
    """A hint that ``buffer[indices]`` will be read soon (see the module docstring)."""

    __slots__ = ("buffer", "indices")

    def __init__(self, buffer: Buffer, indices: Sequence[Any]) -> None:
        read = BufferLoad(buffer, indices)  # the indices checked as a read's
        _set(self, "buffer", buffer)
        _set(self, "indices", read.indices)


class Evaluate(Stmt):
    """Evaluate an expression for its side effects."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        _set(self, "value", as_expr(value))


def seq(stmts: Sequence[Stmt | None]) -> Stmt | None:
    """The statements in order: None if there are none, the statement itself if one."""
    kept = [s for s in stmts if s is not None]
    if not kept:
        return None
    if len(kept) == 1:
        return kept[0]
    return SeqStmt(kept)


class PrimFunc:
    """One kernel: ``name(*params)`` running ``body``."""

    __slots__ = ("name", "params", "body", "attrs")

    def __init__(self, name: str, params: Sequence[Buffer], body: Stmt,
                 attrs: dict[str, Any] | None = None) -> None:
        _set(self, "name", str(name))
        _set(self, "params", tuple(params))
        _set(self, "body", body)
        _set(self, "attrs", dict(attrs or {}))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("PrimFunc is immutable")

    def __str__(self) -> str:
        from .printer import func_to_str

        return func_to_str(self)

    def __repr__(self) -> str:
        return str(self)


def stmt_children(stmt: Stmt) -> list[Stmt]:
    """The statements directly inside ``stmt``, in program order."""
    if isinstance(stmt, SeqStmt):
        return list(stmt.stmts)
    if isinstance(stmt, IfThenElse):
        return [stmt.then_case] + ([] if stmt.else_case is None else [stmt.else_case])
    if isinstance(stmt, (For, LetStmt, Allocate)):
        return [stmt.body]
    return []


def walk_stmts(body: Stmt) -> Iterator[Stmt]:
    """Every statement of ``body``, parents before children, in program order; iterative."""
    stack = [body]
    while stack:
        stmt = stack.pop()
        yield stmt
        stack.extend(reversed(stmt_children(stmt)))


def stmt_exprs(stmt: Stmt) -> list[PrimExpr]:
    """The expressions ``stmt`` itself holds (not those of the statements inside it)."""
    if isinstance(stmt, BufferStore):
        return [stmt.value, *stmt.indices]
    if isinstance(stmt, For):
        return [stmt.min, stmt.extent]
    if isinstance(stmt, IfThenElse):
        return [stmt.condition]
    if isinstance(stmt, (LetStmt, Evaluate)):
        return [stmt.value]
    if isinstance(stmt, Prefetch):
        return list(stmt.indices)
    if isinstance(stmt, AsyncCopy):
        return [stmt.source, *stmt.indices, *([stmt.predicate] if stmt.predicate is not None
                                             else [])]
    return []


def written_buffers(body: Stmt) -> set[int]:
    """Ids of the buffers ``body`` stores to."""
    return {id(s.buffer) for s in walk_stmts(body) if isinstance(s, (BufferStore, AsyncCopy))}


def read_buffers(body: Stmt) -> set[int]:
    """Ids of the buffers ``body`` loads from."""
    found: set[int] = set()
    for stmt in walk_stmts(body):
        for root in stmt_exprs(stmt):
            for node in post_order(root):
                if isinstance(node, BufferLoad):
                    found.add(id(node.buffer))
    return found
