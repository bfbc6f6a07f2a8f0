"""InferType: compute and cache the type of every expression in every function.

Types in opfusion are inferred lazily and cached on the nodes, so this pass changes no
structure; it forces inference everywhere (so later passes can read ``checked_type`` cheaply)
and turns a type error into one that names the function and the expression."""

from __future__ import annotations

from ..errors import OpfusionTypeError
from ..ir.expr import Call, Expr, Function
from ..ir.infer import infer_type
from ..ir.module import IRModule
from ..ir.op import Op
from ..ir.visitor import post_order
from .context import PassContext
from .pass_infra import Pass, module_pass, pass_factory, register_pass


@pass_factory
def InferType() -> Pass:  # noqa: N802 - TVM's pass name
    """Infer the types of all expressions of all functions of ``mod``."""
    return _infer_type_pass


@module_pass(opt_level=0, name="InferType")
def _infer_type_pass(mod: IRModule, ctx: PassContext) -> IRModule:
    for name, func in mod.functions.items():
        try:
            infer_type(func, mod)
        except OpfusionTypeError as err:
            raise OpfusionTypeError(f"in @{name}: {err}{_locate(func)}") from None
    return mod


def _locate(func: Function) -> str:
    """Describe the first call whose type cannot be inferred (its operands are all typed)."""
    for node in post_order(func):
        if getattr(node, "_checked_type", None) is None and isinstance(node, Call):
            return f"; the failing expression is {describe_call(node)}"
    return ""


def describe_call(call: Call) -> str:
    """``nn.conv2d(Tensor[(1, 3, 8, 8), float32], ...)``: a call named by its op and operand
    types, short enough for an error message."""
    name = call.op.name if isinstance(call.op, Op) else type(call.op).__name__
    args = ", ".join(_type_text(arg) for arg in call.args)
    span = f" (node {call.span!r})" if call.span else ""
    return f"{name}({args}){span}"


def _type_text(arg: Expr) -> str:
    ty = getattr(arg, "_checked_type", None)
    return repr(ty) if ty is not None else "?"


register_pass("InferType", InferType)
