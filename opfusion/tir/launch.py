"""GPU launches: how a PrimFunc with thread-bound loops runs on a GPU.

A kernel for a GPU is written once for every thread (SPMD): a loop bound to ``blockIdx.x`` or
``threadIdx.x`` is not a loop but each block's or thread's own index (see
:class:`~opfusion.tir.stmt.ForKind`). A PrimFunc may hold several launches, one after the
other, each a ``__global__`` kernel of its own:

- the Allocates that wrap the whole body (a group's intermediate results computed at root,
  read by a later launch) are **global temporaries**: memory the host allocates and passes to
  every launch;
- below them, each statement of the top-level sequence is one launch, whose grid and block
  sizes are the largest extents bound to each index inside it (1 for an index it does not
  bind: a launch with no bound loop runs on one thread). A loop bound to an index inside
  another loop bound to the same index is the same index again (cooperative loads: the
  threads that compute a tile first fetch its operands, each its share).

:func:`split_launches` is the one place that decides this, for the loop-IR interpreter
(:mod:`opfusion.tir.interp`) and for the CUDA emitter alike, so both run the same launches."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import LoweringError
from . import expr as E
from . import stmt as S


@dataclass(frozen=True)
class Launch:
    """One ``__global__`` kernel: ``body`` run by every thread of ``grid`` x ``block``
    (x, y, z sizes)."""

    body: S.Stmt
    grid: tuple[int, int, int]
    block: tuple[int, int, int]

    @property
    def threads_per_block(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    @property
    def blocks(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]


def binds_threads(body: S.Stmt) -> bool:
    """Whether any loop of ``body`` is bound to a GPU index."""
    return any(isinstance(stmt, S.For) and stmt.kind.is_thread_binding
               for stmt in S.walk_stmts(body))


def split_launches(func: S.PrimFunc) -> tuple[list[E.Buffer], list[Launch]]:
    """``(global temporaries, launches)`` of ``func`` (see the module docstring)."""
    temps: list[E.Buffer] = []
    body = func.body
    while isinstance(body, S.Allocate) and body.buffer.scope == "local":
        temps.append(body.buffer)
        body = body.body
    parts = list(body.stmts) if isinstance(body, S.SeqStmt) else [body]
    return temps, [_launch(func.name, part) for part in parts]


def _launch(name: str, body: S.Stmt) -> Launch:
    sizes = dict.fromkeys(S.THREAD_TAGS, 1)
    for stmt in S.walk_stmts(body):
        if isinstance(stmt, S.For) and stmt.kind.is_thread_binding:
            tag = stmt.kind.value
            if not isinstance(stmt.extent, E.IntImm):
                raise LoweringError(
                    f"kernel {name}: the loop {stmt.loop_var.name} bound to {tag} has extent "
                    f"{stmt.extent}, which is not a constant; a launch's size is fixed, so "
                    "bind loops of constant extent (guard the tail inside)")
            sizes[tag] = max(sizes[tag], stmt.extent.value)
    grid = (sizes["blockIdx.x"], sizes["blockIdx.y"], sizes["blockIdx.z"])
    block = (sizes["threadIdx.x"], sizes["threadIdx.y"], sizes["threadIdx.z"])
    return Launch(body, grid, block)


__all__ = ["Launch", "binds_threads", "split_launches"]
