"""Type inference for graph-IR expressions: one walk, operands first, results cached on nodes.

Each operator's declaration infers its own output type; this module handles the structure
around operators (functions, tuples, calls of functions) and names the node on error."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import OpfusionError, OpfusionTypeError
from .expr import Call, Constant, Expr, Function, GlobalVar, Tuple, TupleGetItem, Var
from .op import Op
from .types import FuncType, TupleType, Type
from .visitor import post_order

if TYPE_CHECKING:
    from .module import IRModule

_set = object.__setattr__


class _Typed:
    """``node in _TYPED`` is true once the node's type is known: post_order skips those."""

    def __contains__(self, node: object) -> bool:
        return getattr(node, "_checked_type", None) is not None


_TYPED = _Typed()


def infer_type(expr: Expr, mod: IRModule | None = None) -> Type:
    """Infer (and cache) the type of ``expr`` and every node inside it.

    ``mod`` resolves calls of global functions (``@f(...)``)."""
    for node in post_order(expr, skip=_TYPED):
        _set(node, "_checked_type", _infer_node(node, mod))
    return expr._checked_type  # type: ignore[return-value]


def _infer_node(node: Expr, mod: IRModule | None) -> Type:
    if isinstance(node, Call):
        return _infer_call(node, mod)
    if isinstance(node, Tuple):
        return TupleType([field._checked_type for field in node.fields])
    if isinstance(node, TupleGetItem):
        tuple_type = node.tuple_value._checked_type
        if not isinstance(tuple_type, TupleType):
            raise OpfusionTypeError(f"TupleGetItem .{node.index}: the value is not a tuple but "
                                    f"{tuple_type!r}")
        if not 0 <= node.index < len(tuple_type.fields):
            raise OpfusionTypeError(f"TupleGetItem .{node.index}: index out of range for a tuple "
                                    f"of {len(tuple_type.fields)} fields")
        return tuple_type.fields[node.index]
    if isinstance(node, Function):
        body_type = node.body._checked_type
        if node.ret_type is not None and node.ret_type != body_type:
            raise OpfusionTypeError(f"function returns {body_type!r} but is annotated "
                                    f"-> {node.ret_type!r}")
        return FuncType([p.type_annotation for p in node.params], body_type)
    if isinstance(node, GlobalVar):
        return _global_type(node, mod)
    assert isinstance(node, (Var, Constant)), node  # both carry their type from construction
    return node._checked_type  # pragma: no cover


def _infer_call(call: Call, mod: IRModule | None) -> Type:
    arg_types = [arg._checked_type for arg in call.args]
    op = call.op
    if isinstance(op, Op):
        try:
            return op.infer(arg_types, call.attrs)
        except OpfusionTypeError as err:
            if call.span:
                raise OpfusionTypeError(f"{err} (node {call.span!r})") from None
            raise
    func_type = op._checked_type if isinstance(op, Function) else _global_type(op, mod)
    assert isinstance(func_type, FuncType)
    callee = f"@{op.name_hint}" if isinstance(op, GlobalVar) else "function"
    if len(arg_types) != len(func_type.arg_types):
        raise OpfusionTypeError(f"call of {callee}: takes {len(func_type.arg_types)} "
                                f"argument(s), got {len(arg_types)}")
    for index, (got, want) in enumerate(zip(arg_types, func_type.arg_types)):
        if got != want:
            raise OpfusionTypeError(f"call of {callee}: argument {index} has type {got!r} "
                                    f"but the parameter expects {want!r}")
    return func_type.ret_type


def _global_type(gvar: GlobalVar, mod: IRModule | None) -> FuncType:
    if gvar._checked_type is not None:
        return gvar._checked_type  # type: ignore[return-value]
    if mod is None or gvar.name_hint not in mod:
        raise OpfusionError(f"@{gvar.name_hint} is not defined here: infer types through its "
                            "IRModule (opf.ir.infer_type(expr, mod))")
    ty = infer_type(mod[gvar.name_hint], mod)
    assert isinstance(ty, FuncType)
    return ty
