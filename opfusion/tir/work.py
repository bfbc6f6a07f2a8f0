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
    counts once. A loop bound to a GPU index inside another bound to the same index (a
    block's threads copying a shared tile, inside the threads' own loops) is that index
    again, not loops over it: it counts once."""
    total = 0
    ranges: dict[Var, tuple[int, int]] = {}
    stack: list[tuple[S.Stmt, int, frozenset[str]]] = [(body, 1, frozenset())]
    while stack:
        node, weight, bound = stack.pop()
        if isinstance(node, S.For):
            extent = largest_extent(node, ranges)
            tag = node.kind.value if node.kind.is_thread_binding else None
            if tag in bound:
                extent = min(extent, 1)  # this thread's own index (if within the extent)
            if extent > 0:
                stack.append((node.body, weight * extent,
                              bound | {tag} if tag is not None else bound))
        elif isinstance(node, S.SeqStmt):
            stack.extend((child, weight, bound) for child in node.stmts)
        elif isinstance(node, (S.Allocate, S.LetStmt)):
            stack.append((node.body, weight, bound))
        elif isinstance(node, S.IfThenElse):
            total += weight
            stack.append((node.then_case, weight, bound))
            if node.else_case is not None:
                stack.append((node.else_case, weight, bound))
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
