"""Double buffering: a loop whose body starts with copies into shared tiles, pipelined over
two buffers per tile.

A GPU contraction loop of the plain form (:mod:`opfusion.te.lower`)::

    for k in range(n):
        barrier; copy(k) into tile; barrier
        compute(k) from tile

waits for every step's global loads before it computes with them. The pipelined form keeps
two tiles and loads each step's copy a step early::

    copy(0) into tile[0]; barrier
    for k in range(n):
        if k + 1 < n: next = (this thread's share of copy(k + 1), loaded into registers)
        compute(k) from tile[k % 2]
        if k + 1 < n: tile[(k + 1) % 2] = next
        barrier

The loads of step k + 1 are issued before step k's computation and only waited for at the
stores after it, so their latency is hidden behind the computation, and a step needs one
barrier instead of two: a step's stores go to the tile the step before read, whose readers
the previous barrier waited for, and the barrier after them publishes the tile the next
step reads. A thread's share of a copy is the iterations of the copy's serial loops around
its store (the rounds of a block-wide copy), unrolled so that ``next`` is registers.

:func:`double_buffer_loop` builds the pipelined loop, or says (None) that the copies are
not of a form it pipelines: each a nest of loops and conditions around one store into its
tile, with constant serial loops of at most :data:`MAX_REGISTERS` iterations in all."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from . import expr as E
from . import stmt as S
from .simplify import fresh_vars, map_nested, map_stmt, substitute_stmt

#: Registers a thread may hold for one copy's next step (a copy of more rounds stays plain).
MAX_REGISTERS = 32


def double_buffer_loop(var: E.Var, start: int, extent: int, kind: S.ForKind,
                       copies: Sequence[tuple[E.Buffer, S.Stmt]], body: S.Stmt
                       ) -> S.Stmt | None:
    """The loop ``for var in range(start, start + extent)`` (of ``kind``) around ``copies``
    (each a shared tile and the statement that fills it for step ``var``) and then ``body``
    (which reads the tiles), pipelined as the module docstring shows, with the Allocates of
    the two-step tiles and of the registers around it; None when it cannot be."""
    if extent < 2 or kind is not S.ForKind.SERIAL:
        return None
    phase = E.floormod(E.sub(var, start), 2)
    tiles = {id(tile): _steps(tile, 2) for tile, _ in copies}
    found = [_split_copy(tile, copy, tiles[id(tile)], phase) for tile, copy in copies]
    parts = [part for part in found if part is not None]
    if len(parts) < len(found):
        return None
    step_after = {var: E.add(var, 1)}
    first = {var: E.IntImm(start, var.dtype)}
    prologue = [fresh_vars(substitute_stmt(_rebuild(copy, _into(tiles[id(tile)], phase)), first))
                for tile, copy in copies]
    loads = [fresh_vars(substitute_stmt(load, step_after)) for load, _, _ in parts]
    stores = [fresh_vars(substitute_stmt(put, step_after)) for _, put, _ in parts]
    has_next = E.LT(E.add(var, 1), E.IntImm(start + extent, var.dtype))
    loop = S.For(var, E.IntImm(start, var.dtype), E.IntImm(extent, var.dtype), kind,
                 S.SeqStmt([S.IfThenElse(has_next, S.SeqStmt(loads)),
                            _retarget_loads(body, tiles, phase),
                            S.IfThenElse(has_next, S.SeqStmt(stores)),
                            S.Barrier()]))
    stmt: S.Stmt = S.SeqStmt([*prologue, S.Barrier(), loop])
    for _, _, registers in parts:
        stmt = S.Allocate(registers, stmt)
    for tile, _ in reversed(copies):
        stmt = S.Allocate(tiles[id(tile)], stmt)
    return stmt


def async_pipeline_loop(var: E.Var, start: int, extent: int, kind: S.ForKind,
                        copies: Sequence[tuple[E.Buffer, S.Stmt]], body: S.Stmt,
                        stages: int) -> S.Stmt | None:
    """The loop ``for var in range(start, start + extent)`` around ``copies`` and ``body``
    (as :func:`double_buffer_loop` takes them), pipelined over ``stages`` copies of each tile
    with async copies (:class:`~opfusion.tir.stmt.AsyncCopy`, ``cp.async``), as CUTLASS's
    multistage main loops are::

        copy(0), ..., copy(stages - 2) started, each its own group
        for k in range(n):
            wait until copy(k) has landed (all but the newest stages - 2 groups); barrier
            if k + stages - 1 < n: start copy(k + stages - 1) into tile[(k - 1) % stages]
            close the group (empty or not, so that the wait counts steps)
            compute(k) from tile[k % stages]
        barrier

    A step's copy goes into the tile the step before read, after the barrier that every
    thread passes only when done with it; copies go from global to shared memory without
    the thread's registers and ``stages - 1`` steps ahead. The barrier after the loop keeps
    a re-entry's first copies off the tiles the last steps read. None when a copy is not one
    store of a load (or of a load where a condition holds, zero elsewhere) into its tile
    under loops and conditions, or the loop is not a serial one of two steps or more."""
    if extent < 2 or stages < 2 or kind is not S.ForKind.SERIAL:
        return None
    tiles = {id(tile): _steps(tile, stages) for tile, _ in copies}

    def started(step: E.PrimExpr) -> list[S.Stmt] | None:
        # the copies of step `var` into its phase's tiles, then at `step` (both substituted)
        phase = E.floormod(E.sub(var, start), stages)
        found = [_as_async(tile, copy, tiles[id(tile)], phase) for tile, copy in copies]
        kept = [f for f in found if f is not None]
        if len(kept) < len(found):
            return None
        return [fresh_vars(substitute_stmt(f, {var: step})) for f in kept]

    prologue: list[S.Stmt] = [S.Barrier()]  # (the tiles' readers before the loop are done)
    for step in range(start, start + stages - 1):
        if step < start + extent:
            copied = started(E.IntImm(step, var.dtype))
            if copied is None:
                return None
            prologue += copied
        prologue.append(S.AsyncCommit())
    ahead = E.add(var, stages - 1)
    copied = started(ahead)
    assert copied is not None  # the prologue's made the same
    phase = E.floormod(E.sub(var, start), stages)
    loop = S.For(var, E.IntImm(start, var.dtype), E.IntImm(extent, var.dtype), kind,
                 S.SeqStmt([S.AsyncWait(stages - 2), S.Barrier(),
                            S.IfThenElse(E.LT(ahead, E.IntImm(start + extent, var.dtype)),
                                         S.SeqStmt(copied)),
                            S.AsyncCommit(),
                            _retarget_loads(body, tiles, phase)]))
    stmt: S.Stmt = S.SeqStmt([*prologue, loop, S.Barrier()])
    for tile, _ in reversed(copies):
        stmt = S.Allocate(tiles[id(tile)], stmt)
    return stmt


def _as_async(tile: E.Buffer, copy: S.Stmt, tiles: E.Buffer, phase: E.PrimExpr
              ) -> S.Stmt | None:
    """``copy`` (loops and conditions around one store into ``tile``) with that store an
    async copy into the many-step ``tiles`` at ``phase``; None when the stored value is not
    a load from the function's buffers, or one selected where a condition holds (zero
    elsewhere: the predicate of the copy)."""
    stores = [s for s in S.walk_stmts(copy) if isinstance(s, S.BufferStore)]
    if (len(stores) != 1 or stores[0].buffer is not tile
            or any(isinstance(s, (S.Barrier, S.Allocate)) for s in S.walk_stmts(copy))):
        return None
    store = stores[0]
    found = async_source(store.value)
    if found is None:
        return None
    source, predicate = found
    return map_nested(copy, lambda s: S.AsyncCopy(tiles, [phase, *s.indices], source, predicate)
                      if s is store else None)


def async_source(value: E.PrimExpr) -> tuple[E.BufferLoad, E.PrimExpr | None] | None:
    """(the load, the condition under which it is taken or None) of a value an async copy
    can move: a load of a global buffer, or ``select(c, load, 0)`` / ``select(c, 0, load)``;
    None for anything else (a computed value, a load of a temporary)."""
    if isinstance(value, E.BufferLoad):
        return (value, None) if value.buffer.scope == "global" else None
    if isinstance(value, E.Select):
        for load, other, cond in ((value.true_value, value.false_value, value.condition),
                                  (value.false_value, value.true_value,
                                   E.Not(value.condition))):
            if (isinstance(load, E.BufferLoad) and load.buffer.scope == "global"
                    and isinstance(other, (E.FloatImm, E.IntImm)) and other.value == 0
                    and math.copysign(1.0, other.value) > 0):  # (the fill is +0, not -0)
                return load, cond
    return None


def _steps(tile: E.Buffer, count: int) -> E.Buffer:
    """``tile`` with an outer dimension of ``count`` steps, each laid out as ``tile`` is."""
    span = tile.strides[0] * tile.shape[0] if tile.shape else 1
    return E.Buffer(tile.name, (count, *tile.shape), tile.dtype, tile.scope,
                    (span, *tile.strides))


def _split_copy(tile: E.Buffer, copy: S.Stmt, tiles: E.Buffer, phase: E.PrimExpr
                ) -> tuple[S.Stmt, S.Stmt, E.Buffer] | None:
    """``copy`` as (its loads into registers, their stores into the two-step ``tiles`` at
    ``phase``, the registers), or None when it is not one store in loops and conditions."""
    stores = [s for s in S.walk_stmts(copy) if isinstance(s, S.BufferStore)]
    if (len(stores) != 1 or stores[0].buffer is not tile
            or any(isinstance(s, (S.Barrier, S.Allocate)) for s in S.walk_stmts(copy))):
        return None
    serial = _serial_loops_around(copy, stores[0])
    if serial is None:
        return None
    count, index = 1, E.IntImm(0)
    for loop in reversed(serial):  # the register's index: the serial loops', row-major
        assert isinstance(loop.min, E.IntImm) and isinstance(loop.extent, E.IntImm)
        index = E.add(index, E.mul(E.sub(loop.loop_var, loop.min.value), count))
        count *= loop.extent.value
    if count > MAX_REGISTERS:
        return None
    registers = E.Buffer(f"{tile.name}_next", (count,), tile.dtype, "local")
    load = _rebuild(copy, lambda s: S.BufferStore(registers, s.value, [index]))
    put = _rebuild(copy, lambda s: S.BufferStore(tiles, E.BufferLoad(registers, [index]),
                                                 [phase, *s.indices]))
    return load, put, registers


def _into(tiles: E.Buffer, phase: E.PrimExpr) -> Callable[[S.BufferStore], S.Stmt]:
    """A store into a tile made a store into the two-step ``tiles`` at ``phase``."""
    return lambda s: S.BufferStore(tiles, s.value, [phase, *s.indices])


def _serial_loops_around(copy: S.Stmt, store: S.BufferStore) -> list[S.For] | None:
    """The loops not bound to a GPU index on the path to ``store``, outermost first; None
    if one of them is not a constant range."""
    path: list[S.For] = []
    node = copy
    while node is not store:
        if isinstance(node, S.For):
            if not node.kind.is_thread_binding:
                if not (isinstance(node.min, E.IntImm) and isinstance(node.extent, E.IntImm)):
                    return None
                path.append(node)
            node = node.body
        elif isinstance(node, S.LetStmt):
            node = node.body
        elif isinstance(node, S.IfThenElse) and node.else_case is None:
            node = node.then_case
        elif isinstance(node, S.SeqStmt) and len(node.stmts) == 1:
            node = node.stmts[0]
        else:  # a sequence or an else: not one path to the store
            return None
    return path


def _rebuild(stmt: S.Stmt, store: Callable[[S.BufferStore], S.Stmt]) -> S.Stmt:
    """``stmt`` (one path of loops and conditions to a store) with the store replaced by
    ``store(it)`` and its serial loops unrolled (their indices then constant: registers);
    a vectorized loop stays one (a 16-byte access into or out of the registers)."""
    if isinstance(stmt, S.BufferStore):
        return store(stmt)
    if isinstance(stmt, S.For):
        keep = stmt.kind.is_thread_binding or stmt.kind is S.ForKind.VECTORIZED
        kind = stmt.kind if keep else S.ForKind.UNROLLED
        return S.For(stmt.loop_var, stmt.min, stmt.extent, kind, _rebuild(stmt.body, store))
    if isinstance(stmt, S.IfThenElse):
        return S.IfThenElse(stmt.condition, _rebuild(stmt.then_case, store))
    if isinstance(stmt, S.LetStmt):
        return S.LetStmt(stmt.var, stmt.value, _rebuild(stmt.body, store))
    assert isinstance(stmt, S.SeqStmt) and len(stmt.stmts) == 1, stmt
    return _rebuild(stmt.stmts[0], store)


def _retarget_loads(body: S.Stmt, tiles: dict[int, E.Buffer], phase: E.PrimExpr) -> S.Stmt:
    """``body`` reading each tile's two-step form at ``phase``."""

    def visit(node: E.PrimExpr) -> E.PrimExpr | None:
        if isinstance(node, E.BufferLoad) and id(node.buffer) in tiles:  # (indices done)
            return E.BufferLoad(tiles[id(node.buffer)], [phase, *node.indices])
        return None

    return map_stmt(body, lambda e: E.rewrite(e, visit))


__all__ = ["MAX_REGISTERS", "async_pipeline_loop", "async_source", "double_buffer_loop"]
