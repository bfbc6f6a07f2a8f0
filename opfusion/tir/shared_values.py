"""Shared values of a store bound once: a large sub-expression that a stored value reads more
than once becomes a ``LetStmt`` before the store, so that the C text (a tree) holds it once.

Inlining a fused group's elementwise stages shares the expansion of each read between the
reads with the same indices (:mod:`opfusion.te.lower`): the value is a DAG. Printed as C, a
DAG is a tree, so a node read k times is printed k times, and a chain of such nodes grows
as k to the power of its length. ONNX Runtime's static quantization (QDQ) puts a
QuantizeLinear and DequantizeLinear pair around every operator; each pair reads its input
three times (``x != x ? 0 : x`` turns NaN into the cast's 0), and BERT's GELU between two
products, six pairs deep, printed as 300 KB of C and ran 85 ms a call instead of 0.2.

A node is bound when it is read at least twice (in the DAG), is at least
:data:`MIN_SHARED_NODES` nodes as a tree (the small ones that epilogues share, ``x * sigmoid(x)``
over a load and a bias, are left as they were), is not a mask (a bool: vector code keeps those
in comparisons), and is evaluated on every path through the value: one of its reads lies
outside the branches of every ``select`` and the right operands of ``&&`` and ``||``, so
binding it evaluates nothing that a guard would have skipped (a load that a select keeps in
bounds stays in its branch)."""

from __future__ import annotations

from . import expr as E
from . import stmt as S
from .simplify import map_nested

#: Nodes, counted as a tree, below which a shared value is left duplicated.
MIN_SHARED_NODES = 32


def bind_shared_values(func: S.PrimFunc) -> S.PrimFunc:
    """``func`` with the large shared values of its stores bound by lets (module docstring)."""
    body = map_nested(func.body, lambda s: _bind_store(s) if isinstance(s, S.BufferStore)
                      else None)
    return S.PrimFunc(func.name, func.params, body, func.attrs)


def _bind_store(store: S.BufferStore) -> S.Stmt:
    nodes = E.post_order(store.value)
    if any(isinstance(n, E.Let) for n in nodes):
        return store  # (a let's variable would leave its scope)
    reads: dict[int, int] = {}
    size: dict[int, int] = {}
    for node in nodes:
        children = node.children()
        size[id(node)] = 1 + sum(size[id(c)] for c in children)
        for child in children:
            reads[id(child)] = reads.get(id(child), 0) + 1
    always = evaluated_on_every_path(store.value)
    chosen = {id(n) for n in nodes
              if reads.get(id(n), 0) >= 2 and size[id(n)] >= MIN_SHARED_NODES
              and id(n) in always and n.dtype != "bool"
              and not isinstance(n, (E.BufferLoad, E.Var, E.IntImm, E.FloatImm))}
    if not chosen:
        return store
    lets: list[tuple[E.Var, E.PrimExpr]] = []

    def bind(node: E.PrimExpr, original: E.PrimExpr) -> E.PrimExpr:
        if id(original) not in chosen:
            return node
        var = E.Var("shared", node.dtype)
        lets.append((var, node))
        return var

    value = _rebuild(store.value, nodes, bind)
    out: S.Stmt = S.BufferStore(store.buffer, value, list(store.indices))
    for var, bound in reversed(lets):
        out = S.LetStmt(var, bound, out)
    return out


def _rebuild(root: E.PrimExpr, nodes: list[E.PrimExpr], bind) -> E.PrimExpr:
    """``root`` rebuilt children first (``nodes`` is its post-order), each node passed through
    ``bind(new_node, original)``."""
    done: dict[int, E.PrimExpr] = {}
    for node in nodes:
        children = node.children()
        new = node.with_children([done[id(c)] for c in children]) if children else node
        done[id(node)] = bind(new, node)
    return done[id(root)]


def evaluated_on_every_path(root: E.PrimExpr) -> set[int]:
    """Ids of the nodes that evaluating ``root`` always evaluates: reached without entering a
    select's branches or the right operand of a logical and/or."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, E.Select):
            stack.append(node.condition)
        elif isinstance(node, (E.And, E.Or)):
            stack.append(node.a)
        else:
            stack.extend(node.children())
    return seen


__all__ = ["MIN_SHARED_NODES", "bind_shared_values", "evaluated_on_every_path"]
