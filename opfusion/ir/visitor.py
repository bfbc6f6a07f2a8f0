"""Traversals of the graph IR: post-order, visitors and memoized mutators — all iterative.

Real models have 10^4-10^5 nodes, far past Python's recursion limit, so nothing here recurses
over the graph. :func:`post_order` walks with an explicit stack; :class:`ExprVisitor` and
:class:`ExprMutator` handle nodes in post-order, children first. A subclass may still write
``self.visit(arg)`` inside ``visit_call`` the way TVM users do: the argument has already been
handled, so the call returns from the memo instead of recursing."""

from __future__ import annotations

from collections.abc import Callable, Container, Iterator
from typing import Any

from .expr import Call, Constant, Expr, Function, GlobalVar, Tuple, TupleGetItem, Var


def children(node: Expr, into_functions: bool = True) -> tuple[Expr, ...]:
    """The operands of a node, in evaluation order (a called function before its arguments).

    With ``into_functions=False`` nested functions are not entered at all: a called
    function is not listed as an operand of its call, and a function has no operands."""
    if isinstance(node, Call):
        if isinstance(node.op, Expr):
            if into_functions or not isinstance(node.op, Function):
                return (node.op, *node.args)
        return node.args
    if isinstance(node, Tuple):
        return node.fields
    if isinstance(node, TupleGetItem):
        return (node.tuple_value,)
    if isinstance(node, Function):
        return (node.body,) if into_functions else ()
    return ()


def post_order(root: Expr, into_functions: bool = True,
               skip: Container[Expr] = ()) -> list[Expr]:
    """Every node reachable from ``root`` once, each after all of its operands.

    ``into_functions=False`` treats nested functions as leaves. Nodes in ``skip`` are neither
    listed nor entered (used to resume a walk where an earlier one stopped)."""
    order: list[Expr] = []
    if root in skip:
        return order
    seen: set[Expr] = {root}
    stack: list[tuple[Expr, Iterator[Expr]]] = [(root, iter(children(root, into_functions)))]
    while stack:
        node, pending = stack[-1]
        for child in pending:
            if child not in seen and child not in skip:
                seen.add(child)
                stack.append((child, iter(children(child, into_functions))))
                break
        else:
            stack.pop()
            order.append(node)
    return order


def rebuild(node: Expr, operand: Callable[[Expr], Expr]) -> Expr:
    """``node`` with each operand ``x`` replaced by ``operand(x)`` (a called function, the
    arguments, tuple fields, a projected tuple, a function body); ``node`` itself when
    nothing changed. The building block of passes that rewrite in post-order."""
    if isinstance(node, Call):
        op = operand(node.op) if isinstance(node.op, Expr) else node.op
        args = [operand(arg) for arg in node.args]
        if op is node.op and all(new is old for new, old in zip(args, node.args)):
            return node
        return Call(op, args, node.attrs, node.span)
    if isinstance(node, Tuple):
        fields = [operand(field) for field in node.fields]
        if all(new is old for new, old in zip(fields, node.fields)):
            return node
        return Tuple(fields)
    if isinstance(node, TupleGetItem):
        value = operand(node.tuple_value)
        return node if value is node.tuple_value else TupleGetItem(value, node.index)
    if isinstance(node, Function):
        body = operand(node.body)
        if body is node.body:
            return node
        return Function(node.params, body, node.ret_type, node.attrs)
    return node


def free_vars(expr: Expr) -> list[Var]:
    """Variables used in ``expr`` that no function inside it binds, in order of first use."""
    nodes = post_order(expr)
    bound = {param for node in nodes if isinstance(node, Function) for param in node.params}
    return [node for node in nodes if isinstance(node, Var) and node not in bound]


class ExprVisitor:
    """Visits every node once, operands first. Override ``visit_call``, ``visit_var``, ...;
    the defaults do nothing (operands have already been visited)."""

    def __init__(self) -> None:
        self._visited: set[Expr] = set()

    def visit(self, expr: Expr) -> None:
        visited = self._visited
        for node in post_order(expr, skip=visited):
            visited.add(node)
            _dispatch(self, node)

    def visit_var(self, var: Var) -> None:
        pass

    def visit_global_var(self, gvar: GlobalVar) -> None:
        pass

    def visit_constant(self, const: Constant) -> None:
        pass

    def visit_call(self, call: Call) -> None:
        pass

    def visit_tuple(self, tup: Tuple) -> None:
        pass

    def visit_tuple_getitem(self, item: TupleGetItem) -> None:
        pass

    def visit_function(self, func: Function) -> None:
        pass


class ExprMutator:
    """Rebuilds an expression bottom-up; a node whose operands are unchanged is kept as is,
    and a shared subexpression is rewritten once and stays shared.

    Override ``visit_call`` etc. and return the replacement; call ``self.visit(x)`` to get the
    rewritten form of an operand (already computed, so it returns at once)."""

    def __init__(self) -> None:
        self.memo: dict[Expr, Any] = {}

    def visit(self, expr: Expr) -> Any:
        memo = self.memo
        if expr in memo:
            return memo[expr]
        for node in post_order(expr, skip=memo):
            memo[node] = _dispatch(self, node)
        return memo[expr]

    def visit_var(self, var: Var) -> Expr:
        return var

    def visit_global_var(self, gvar: GlobalVar) -> Expr:
        return gvar

    def visit_constant(self, const: Constant) -> Expr:
        return const

    def visit_call(self, call: Call) -> Expr:
        op = self.visit(call.op) if isinstance(call.op, Expr) else call.op
        args = [self.visit(arg) for arg in call.args]
        if op is call.op and all(new is old for new, old in zip(args, call.args)):
            return call
        return Call(op, args, call.attrs, call.span)

    def visit_tuple(self, tup: Tuple) -> Expr:
        fields = [self.visit(field) for field in tup.fields]
        if all(new is old for new, old in zip(fields, tup.fields)):
            return tup
        return Tuple(fields)

    def visit_tuple_getitem(self, item: TupleGetItem) -> Expr:
        value = self.visit(item.tuple_value)
        if value is item.tuple_value:
            return item
        return TupleGetItem(value, item.index)

    def visit_function(self, func: Function) -> Expr:
        params = [self.visit(param) for param in func.params]
        body = self.visit(func.body)
        if body is func.body and all(new is old for new, old in zip(params, func.params)):
            return func
        return Function(params, body, func.ret_type, func.attrs)


_METHODS = {
    Var: "visit_var",
    GlobalVar: "visit_global_var",
    Constant: "visit_constant",
    Call: "visit_call",
    Tuple: "visit_tuple",
    TupleGetItem: "visit_tuple_getitem",
    Function: "visit_function",
}


def _dispatch(visitor: Any, node: Expr) -> Any:
    return getattr(visitor, _METHODS[type(node)])(node)
