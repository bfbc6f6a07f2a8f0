"""How much work a kernel does: a count of innermost statement executions, for the compile
limits (:mod:`opfusion.compiler.limits`) and for the code generator's choice between one
thread and many (:mod:`opfusion.backend.cpu.emitter`)."""

from __future__ import annotations

from . import stmt as S
from .expr import IntImm


def kernel_work(body: S.Stmt) -> int:
    """Innermost statement executions of ``body``: each store, evaluate or branch test
    weighted by the product of the extents of the loops around it (an exact Python int,
    however large; a loop with a non-constant extent counts once)."""
    total = 0
    stack: list[tuple[S.Stmt, int]] = [(body, 1)]
    while stack:
        node, weight = stack.pop()
        if isinstance(node, S.For):
            extent = node.extent.value if isinstance(node.extent, IntImm) else 1
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
