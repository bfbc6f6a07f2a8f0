"""EliminateCommonSubexpr: compute each distinct value once.

Two calls of the same operator with the same attributes on the same (already merged)
operands are the same value; so are equal tuples, equal projections and constants holding the
same bytes. The later duplicate is replaced by the first. Each function body is its own scope:
nothing inside a nested (primitive) function is merged with anything outside it, because a
primitive function must stay closed over its parameters."""

from __future__ import annotations

import hashlib
from collections.abc import Hashable

import numpy as np

from ..ir.expr import Call, Constant, Expr, Function, Tuple, TupleGetItem
from ..ir.module import IRModule
from ..ir.visitor import post_order, rebuild
from .context import PassContext
from .pass_infra import Pass, module_pass, pass_factory, register_pass


@pass_factory
def EliminateCommonSubexpr() -> Pass:  # noqa: N802 - TVM's pass name
    """Merge duplicate calls, tuples, projections and constants in every function."""
    return _eliminate_common_subexpr_pass


@module_pass(opt_level=3, name="EliminateCommonSubexpr")
def _eliminate_common_subexpr_pass(mod: IRModule, ctx: PassContext) -> IRModule:
    new = IRModule()
    for name, func in mod.functions.items():
        new[mod.get_global_var(name)] = eliminate_common_subexpr(func)
    return new


def eliminate_common_subexpr(func: Function) -> Function:
    """``func`` with every duplicated value computed once (a new function; shared nodes
    stay shared)."""
    # Nested functions are rewritten in their own scope first, innermost first; the walk
    # below treats them as leaves. Function nesting is shallow (fused groups), unlike graphs.
    inner_done: dict[Function, Function] = {}
    for node in post_order(func.body):
        if isinstance(node, Function) and node not in inner_done:
            inner_done[node] = eliminate_common_subexpr(node)
    body = _merge_scope(func.body, inner_done)
    if body is func.body:
        return func
    return Function(func.params, body, func.ret_type, func.attrs)


def _merge_scope(root: Expr, inner_done: dict[Function, Function]) -> Expr:
    replaced: dict[Expr, Expr] = {}
    canonical: dict[Hashable, Expr] = {}
    for node in post_order(root, into_functions=False):
        new = _rebuild(node, replaced, inner_done)
        key = _key(new)
        if key is not None:
            new = canonical.setdefault(key, new)
        replaced[node] = new
    return replaced[root]


def _rebuild(node: Expr, replaced: dict[Expr, Expr],
             inner_done: dict[Function, Function]) -> Expr:
    if isinstance(node, Function):  # a leaf of this scope, rewritten in its own
        return inner_done.get(node, node)

    def operand(expr: Expr) -> Expr:
        if isinstance(expr, Function):
            return inner_done.get(expr, expr)
        return replaced.get(expr, expr)

    return rebuild(node, operand)


def _key(node: Expr) -> Hashable | None:
    """A key equal for nodes that compute the same value; None for nodes never merged
    (variables, functions)."""
    if isinstance(node, Call):
        # Operands are already canonical, so identity of operands is equality of values.
        return ("call", node.op, node.attrs, tuple(id(arg) for arg in node.args))
    if isinstance(node, Tuple):
        return ("tuple", tuple(id(field) for field in node.fields))
    if isinstance(node, TupleGetItem):
        return ("get", id(node.tuple_value), node.index)
    if isinstance(node, Constant):
        return _ConstantKey(node.data)
    return None


class _ConstantKey:
    """A constant's key: equal for constants of the same dtype and shape holding the same
    bytes. Its hash reads a sample of the bytes (:data:`SAMPLED_BYTES`), so a model's weights
    are not all hashed (VGG-19's 548 MB took 1.4 s); equal hashes are confirmed by comparing
    every byte."""

    __slots__ = ("dtype", "shape", "bytes", "_hash")

    def __init__(self, data: np.ndarray) -> None:
        self.dtype, self.shape = data.dtype.str, data.shape  # (a scalar is not a [1] vector)
        self.bytes = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        step = max(1, self.bytes.size // SAMPLED_BYTES)
        sample = np.concatenate([self.bytes[:SAMPLED_BYTES], self.bytes[::step],
                                 self.bytes[-SAMPLED_BYTES:]])
        self._hash = hash((self.dtype, self.shape, self.bytes.size,
                           hashlib.blake2b(sample.tobytes()).digest()))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, _ConstantKey) and self._hash == other._hash
                and (self.dtype, self.shape) == (other.dtype, other.shape)
                and np.array_equal(self.bytes, other.bytes))


#: Bytes of a constant its key's hash reads from each of its start, its end, and strided
#: through it.
SAMPLED_BYTES = 4096


register_pass("EliminateCommonSubexpr", EliminateCommonSubexpr)
