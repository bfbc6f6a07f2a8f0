"""How much work a kernel does: a count of innermost statement executions, for the compile
limits (:mod:`opfusion.compiler.limits`) and for the code generator's choice between one
thread and many (:mod:`opfusion.backend.cpu.emitter`)."""

from __future__ import annotations

from . import stmt as S
from .expr import IntImm, Var
from .simplify import const_bound


def kernel_work(body: S.Stmt) -> int:
    """Innermost statement executions of ``body``: each store, evaluate or branch test
    weighted by the product of the extents of the loops around it (an exact Python int,
    however large). A loop whose extent depends on an outer loop (the last, shorter part of
    a split, ``min(32, 54 - 32 * i)``) counts its largest extent; one with no finite bound
    counts once."""
    total = 0
    ranges: dict[Var, tuple[int, int]] = {}
    stack: list[tuple[S.Stmt, int]] = [(body, 1)]
    while stack:
        node, weight = stack.pop()
        if isinstance(node, S.For):
            extent = largest_extent(node, ranges)
            if extent > 0:
                stack.append((node.body, weight * extent))
        elif isinstance(node, S.SeqStmt):
            stack.extend((child, weight) for child in node.stmts)
        elif isinstance(node, (S.Allocate, S.LetStmt)):
            stack.append((node.body, weight))
        elif isinstance(node, S.IfThenElse):
            total += weight
            stack.append((node.then_case, weight))
            if node.else_case is not None:
                stack.append((node.else_case, weight))
        else:
            total += weight
    return total


def largest_extent(loop: S.For, ranges: dict[Var, tuple[int, int]]) -> int:
    """``loop``'s extent, or its upper bound over the outer loops' ranges (1 when unbounded);
    records the loop variable's range for the loops inside."""
    if isinstance(loop.extent, IntImm):
        extent = loop.extent.value
    else:
        high = const_bound(loop.extent, ranges)[1]
        extent = int(high) if high != float("inf") else 1
    start = const_bound(loop.min, ranges)
    if extent > 0 and all(abs(b) != float("inf") for b in start):
        ranges[loop.loop_var] = (int(start[0]), int(start[1]) + extent - 1)
    return extent
