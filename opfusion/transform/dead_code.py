"""DeadCodeElimination: drop what cannot reach a result.

A dataflow graph has no statements, so dead code takes three forms here:

* a field picked out of a tuple built in place, ``(a, b).0``, makes ``b`` unreachable — the
  projection is replaced by ``a``;
* a primitive (fused) function that ignores one of its parameters still forces its caller to
  compute that argument — the parameter and the argument are removed;
* a global function that nothing reachable from ``@main`` calls is removed from the module."""

from __future__ import annotations

from ..ir.expr import Call, Expr, Function, GlobalVar, Tuple, TupleGetItem, Var
from ..ir.module import IRModule
from ..ir.visitor import ExprMutator, post_order
from .context import PassContext
from .pass_infra import Pass, module_pass, pass_factory, register_pass


@pass_factory
def DeadCodeElimination() -> Pass:  # noqa: N802 - TVM's pass name
    """Remove unreachable tuple fields, unused parameters of primitive functions and global
    functions not called from ``@main``."""
    return _dead_code_elimination_pass


@module_pass(opt_level=1, name="DeadCodeElimination")
def _dead_code_elimination_pass(mod: IRModule, ctx: PassContext) -> IRModule:
    new = IRModule()
    for name, func in mod.functions.items():
        new[mod.get_global_var(name)] = _Pruner().visit(func)
    return _drop_unreachable_functions(new)


class _Pruner(ExprMutator):
    def visit_tuple_getitem(self, item: TupleGetItem) -> Expr:
        value = self.visit(item.tuple_value)
        if isinstance(value, Tuple):
            return value.fields[item.index]
        return item if value is item.tuple_value else TupleGetItem(value, item.index)

    def visit_call(self, call: Call) -> Expr:
        new = super().visit_call(call)
        if isinstance(new, Call) and isinstance(new.op, Function) and new.op.is_primitive:
            return _drop_unused_params(new)
        return new


def _drop_unused_params(call: Call) -> Call:
    func = call.op
    assert isinstance(func, Function)
    used = {node for node in post_order(func.body) if isinstance(node, Var)}
    keep = [index for index, param in enumerate(func.params) if param in used]
    if len(keep) == len(func.params):
        return call
    params = [func.params[index] for index in keep]
    pruned = Function(params, func.body, func.ret_type, func.attrs)
    return Call(pruned, [call.args[index] for index in keep], call.attrs, call.span)


def _drop_unreachable_functions(mod: IRModule) -> IRModule:
    if "main" not in mod:
        return mod
    reachable = ["main"]
    seen = {"main"}
    cursor = 0
    while cursor < len(reachable):
        func = mod[reachable[cursor]]
        cursor += 1
        for node in post_order(func):
            if isinstance(node, GlobalVar) and node.name_hint in mod and \
                    node.name_hint not in seen:
                seen.add(node.name_hint)
                reachable.append(node.name_hint)
    if len(reachable) == len(mod):
        return mod
    kept = IRModule()
    for name in mod:  # keep the module's order
        if name in seen:
            kept[mod.get_global_var(name)] = mod[name]
    return kept


register_pass("DeadCodeElimination", DeadCodeElimination)
