"""FuseOps: group operators into primitive functions, each one future kernel (TVM's rules).

The partition is TVM's (seed 000, implemented in :mod:`opfusion.transform.fuse`): an indexed
forward graph, its post-dominator tree, and three phases that merge a node into its
post-dominator when every path between them satisfies the rule of the node's kind. This file
turns the partition into IR, as TVM's FuseMutator does:

* every group whose root is an operator call becomes ``fn (%p0, %p1, ..., Primitive=1)``,
  called in place of the group with the values it reads from outside; a group of one op is
  wrapped too;
* the function's parameters are made by the builder FusionMerge uses too
  (:mod:`opfusion.transform.fuse.primitive`): one per distinct value read from outside,
  numbered in order of first use; a scalar constant stays inline, any other constant becomes a
  parameter unless ``FuseOps.link_params`` keeps it inside the function;
* a group whose root returns a tuple returns that tuple; a tuple at the root of its group
  stays outside any function, as do variables, constants and calls of other functions.

Already-primitive functions are left alone, so fusing a fused module changes nothing::

    with PassContext(opt_level=2, config={"FuseOps.max_depth": 64}):
        mod = FuseOps()(mod)
"""

from __future__ import annotations

from ..errors import OpfusionError
from ..ir.expr import Call, Expr, Function, Tuple, TupleGetItem
from ..ir.infer import infer_type
from ..ir.module import IRModule
from ..ir.op import Op
from ..ir.printer import gc_paused
from ..ir.types import Type
from .context import PassContext
from .fuse.partition import FuseOptions, FusionPlan, plan_fusion
from .fuse.primitive import PrimitiveFunctionBuilder
from .pass_infra import function_pass, register_pass


@function_pass(opt_level=0, name="FuseOps", required=("InferType",))
class FuseOps:
    """Fuse operators into primitive functions by TVM's post-dominator rules.

    ``fuse_opt_level``: the optimization level that decides how much is fused (0 fuses
    nothing: every op becomes a function of its own); -1 takes the pass context's opt_level.
    The limits come from the context's configuration: ``FuseOps.max_depth`` (ops per group,
    default 256), ``FuseOps.max_function_args`` (0: no limit) and ``FuseOps.link_params``."""

    def __init__(self, fuse_opt_level: int = -1) -> None:
        if isinstance(fuse_opt_level, bool) or not isinstance(fuse_opt_level, int) \
                or fuse_opt_level < -1:
            raise OpfusionError(f"FuseOps(fuse_opt_level=...) takes an int >= -1 (-1: the pass "
                                f"context's opt_level), got {fuse_opt_level!r}")
        self.fuse_opt_level = fuse_opt_level

    def transform_function(self, func: Function, mod: IRModule, ctx: PassContext) -> Function:
        if func.is_primitive or "Compiler" in func.attrs:
            return func  # already a kernel, or handed to an external code generator
        infer_type(func, mod)
        return fuse_function(func, FuseOptions.from_context(ctx, self.fuse_opt_level), mod)


register_pass("FuseOps", FuseOps)


def fuse_function(func: Function, options: FuseOptions, mod: IRModule | None = None) -> Function:
    """``func`` with its operators fused into primitive functions under ``options``."""
    # The analysis allocates a few objects per node and keeps them all alive; with the
    # collector running, its collections rescan them over and over (most of the pass's time
    # on 10^5 nodes). None of them form reference cycles.
    with gc_paused():
        return _FusedFunctionBuilder(plan_fusion(func, options, mod=mod), mod).build()


class _FusedFunctionBuilder:
    """Rebuild a function body group by group, producers first (TVM's FuseMutator)."""

    def __init__(self, plan: FusionPlan, mod: IRModule | None) -> None:
        self.plan = plan
        self.mod = mod
        self.root_of = plan.root_of
        # Expression -> index of its group's root (the hot lookup of _operands).
        self.group_of = {node.ref: plan.root_of[node.index] for node in plan.graph.nodes}
        self.link_params = plan.options.link_params
        # Original node -> its rewritten form: the call of its group's function for a root,
        # the expression inside the function body for any other member.
        self.new: dict[Expr, Expr] = {}
        self.signatures: dict[int, PrimitiveFunctionBuilder] = {}

    def build(self) -> Function:
        func = self.plan.func
        new = self.new
        for node in self.plan.graph.nodes:
            new[node.ref] = self._rewrite(node.ref, node.index)
        body = new[func.body]
        ret_type = func.ret_type if func.ret_type is not None else func.body.checked_type
        if body is func.body and ret_type is func.ret_type:
            return func
        return Function(func.params, body, ret_type, func.attrs)

    def _rewrite(self, expr: Expr, index: int) -> Expr:
        root = self.root_of[index]
        new = self.new
        if isinstance(expr, Call):
            if isinstance(expr.op, Op):
                call = Call(expr.op, self._operands(expr.args, root), expr.attrs, expr.span)
                return self._wrap(root, call, expr.checked_type) if root == index else call
            callee = self._nested(expr.op) if isinstance(expr.op, Function) else expr.op
            args = [new[arg] for arg in expr.args]
            if callee is expr.op and _same(args, expr.args):
                return expr
            return Call(callee, args, expr.attrs, expr.span)
        if isinstance(expr, Tuple):
            if root != index:  # a tuple inside a group, e.g. concatenate's input
                return Tuple(self._operands(expr.fields, root))
            fields = [new[field] for field in expr.fields]
            return expr if _same(fields, expr.fields) else Tuple(fields)
        if isinstance(expr, TupleGetItem):
            tuple_root = self.group_of[expr.tuple_value]
            if root == index and tuple_root != root:
                # Alone in its group (the tuple comes from an opaque call): stays outside.
                value = new[expr.tuple_value]
                return expr if value is expr.tuple_value else TupleGetItem(value, expr.index)
            (value,) = self._operands((expr.tuple_value,), root)
            item = TupleGetItem(value, expr.index)
            return self._wrap(root, item, expr.checked_type) if root == index else item
        if isinstance(expr, Function):
            return self._nested(expr)
        return expr  # variables, constants, global names

    def _operands(self, args: tuple[Expr, ...], group_root: int) -> list[Expr]:
        """The operands of a node of the group rooted at ``group_root``: values of the same
        group as they are, values from outside through the group's parameters."""
        out = []
        new, group_of = self.new, self.group_of
        for arg in args:
            value = new[arg]
            if group_of[arg] != group_root:
                signature = self.signatures.get(group_root)
                if signature is None:
                    signature = self.signatures[group_root] = \
                        PrimitiveFunctionBuilder(self.link_params)
                value = signature.operand(value, arg.checked_type)
            out.append(value)
        return out

    def _wrap(self, root: int, body: Expr, ret_type: Type) -> Call:
        """The call of the group's primitive function, whose body is ``body``."""
        signature = self.signatures.pop(root, None) or PrimitiveFunctionBuilder()
        return signature.call(body, ret_type)

    def _nested(self, func: Function) -> Function:
        """A nested function: a primitive one is already fused; any other is fused on its own
        (nesting depth, not graph size, bounds this recursion)."""
        if func.is_primitive or "Compiler" in func.attrs:
            return func
        return fuse_function(func, self.plan.options, self.mod)


def _same(new: list[Expr], old: tuple[Expr, ...]) -> bool:
    return all(a is b for a, b in zip(new, old))
