"""The two graph rewrites of the MLC lecture on graph optimization, written as pattern rules.

* :func:`FuseMultiplyAdd` — ``add(multiply(a, b), c)`` becomes one ``ewise_fma(a, b, c)``.
* :func:`FuseDenseAdd` — ``add(nn.dense(x, w), b)`` becomes a call of a nested primitive
  function (``Primitive=1``) whose body is that dense and add, called with ``x, w, b``: a
  hand-made fusion group that later stages lower to one kernel.

Both are opt_level 3 passes and not part of :func:`opfusion.transform.optimize`; they are
examples of the pattern language and building blocks for custom pipelines. Matching is
structural (see :mod:`opfusion.transform.pattern`): when the multiply or dense has users
besides the add, it stays for them and is computed a second time inside the new node."""

from __future__ import annotations

from ..ir.expr import Call, Expr, Function, Var
from ..ir.module import IRModule
from ..ir.op import get_op
from .context import PassContext
from .pass_infra import module_pass, register_pass
from .pattern import Bindings, is_op, wildcard
from .pattern_rewrite import PatternCallback, rewrite

__all__ = ["DenseAddCallback", "FuseDenseAdd", "FuseMultiplyAdd", "MultiplyAddCallback"]


class MultiplyAddCallback(PatternCallback):
    """``add(multiply(a, b), c)  ->  ewise_fma(a, b, c)`` (either operand order of the add)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = wildcard(), wildcard(), wildcard()
        self.pattern = is_op("add")(is_op("multiply")(self.a, self.b), self.c)

    def callback(self, pre: Expr, post: Expr, node_map: Bindings) -> Expr:
        a, b, c = node_map[self.a], node_map[self.b], node_map[self.c]
        return Call(get_op("ewise_fma"), [a, b, c], span=getattr(post, "span", None))


class DenseAddCallback(PatternCallback):
    """``add(nn.dense(x, w), b)  ->  fn(%x, %w, %b, Primitive=1) { add(nn.dense(%x, %w), %b) }
    (x, w, b)`` — the dense keeps its attributes; the add's operands are put in dense-first
    order (addition commutes exactly, so the values are unchanged)."""

    def __init__(self) -> None:
        super().__init__()
        self.x, self.w, self.b = wildcard(), wildcard(), wildcard()
        self.dense = is_op("nn.dense")(self.x, self.w)
        self.pattern = is_op("add")(self.dense, self.b)

    def callback(self, pre: Expr, post: Expr, node_map: Bindings) -> Expr:
        x, w, b = node_map[self.x], node_map[self.w], node_map[self.b]
        dense = node_map[self.dense]
        px = Var("x", x.checked_type)
        pw = Var("w", w.checked_type)
        pb = Var("b", b.checked_type)
        body = Call(get_op("add"), [Call(dense.op, [px, pw], dense.attrs, dense.span), pb])
        fused = Function([px, pw, pb], body, attrs={"Primitive": 1})
        return Call(fused, [x, w, b], span=getattr(post, "span", None))


@module_pass(opt_level=3, name="FuseMultiplyAdd")
class FuseMultiplyAdd:
    """Turn every ``add(multiply(a, b), c)`` into ``ewise_fma(a, b, c)``."""

    def transform_module(self, mod: IRModule, ctx: PassContext) -> IRModule:
        return rewrite(MultiplyAddCallback(), mod,
                       max_iterations=ctx.get_config("PatternRewrite.max_iterations"))


@module_pass(opt_level=3, name="FuseDenseAdd")
class FuseDenseAdd:
    """Wrap every ``add(nn.dense(x, w), b)`` in a nested primitive function called with
    ``(x, w, b)``; existing primitive functions are left alone."""

    def transform_module(self, mod: IRModule, ctx: PassContext) -> IRModule:
        return rewrite(DenseAddCallback(), mod,
                       max_iterations=ctx.get_config("PatternRewrite.max_iterations"))


register_pass("FuseMultiplyAdd", FuseMultiplyAdd)
register_pass("FuseDenseAdd", FuseDenseAdd)
