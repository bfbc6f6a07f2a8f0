"""Pattern rewriting: replace every match of a pattern, to a fixed point, as a function or a pass.

A rule is a pattern and a function that builds the replacement::

    # x * 1  ->  x
    x = wildcard()
    one = is_constant().where(all_ones)
    mod = rewrite((is_op("multiply")(x, one), lambda pre, post, node_map: node_map[x]), mod)

``rewrite`` takes one rule or a list: a :class:`PatternCallback` (TVM's DFPatternCallback
style: ``self.pattern`` and ``callback(pre, post, node_map)``), a ``(pattern, fn)`` pair, or
:func:`rule` ``(pattern, fn)``. :func:`PatternRewrite` makes the same into a module pass.

The graph is walked iteratively, operands first; each node is rebuilt from its rewritten
operands (``post``; ``pre`` is the original) and offered to the rules in order until none
changes it, and a node shared by several users is rewritten once and stays shared. Walks
repeat until one changes nothing (a bounded number, the ``PatternRewrite.max_iterations``
pass config). Bodies of primitive (fused) functions are left alone: they are kernels already,
and a rule that builds primitive functions would otherwise nest them forever. A replacement
must have the type of the node it replaces; anything else is an error naming the rule."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import OpfusionError
from ..ir.expr import Call, Expr, Function, GlobalVar, Tuple, TupleGetItem
from ..ir.infer import infer_type
from ..ir.module import IRModule
from ..ir.op import Op
from ..ir.visitor import post_order
from .context import PassContext, register_pass_config
from .pass_infra import Pass, module_pass, pass_factory
from .pattern import Bindings, Pattern, _as_pattern

__all__ = ["PatternCallback", "PatternRewrite", "rewrite", "rule"]

register_pass_config(
    "PatternRewrite.max_iterations", int, 64,
    "How many times pattern rewriting may walk a function before it stops looking for a fixed "
    "point (and warns). Rules that undo each other would otherwise run forever.")


class PatternCallback:
    """A rewrite rule: a :attr:`pattern` and a :meth:`callback` that returns the replacement.

    Subclass it (TVM's DFPatternCallback style)::

        class FoldDoubleNegation(PatternCallback):
            def __init__(self):
                super().__init__()
                self.x = wildcard()
                self.pattern = is_op("negative")(is_op("negative")(self.x))

            def callback(self, pre, post, node_map):
                return node_map[self.x]

    or build one from a function with :func:`rule` (``rule(pattern, fn)``).

    ``callback(pre, post, node_map)`` gets the original node ``pre``, the node ``post``
    rebuilt from already-rewritten operands (the one that matched), and the match's
    :class:`Bindings` (nodes of ``post``'s subgraph). It returns the replacement, or ``post``
    or None to leave the node as it is. The replacement must have ``post``'s type."""

    pattern: Pattern
    fn: Callable[[Expr, Expr, Bindings], Expr | None] | None = None
    _name: str | None = None

    def __init__(self, pattern: Pattern | None = None,
                 fn: Callable[[Expr, Expr, Bindings], Expr | None] | None = None,
                 name: str | None = None) -> None:
        if pattern is not None:
            self.pattern = _as_pattern(pattern, "a rule's pattern")
        self.fn = fn
        if name is None and fn is not None and getattr(fn, "__name__", "<lambda>") != "<lambda>":
            name = fn.__name__
        self._name = name

    @property
    def name(self) -> str:
        """The rule's name in messages: the one given, else its function's or class's name."""
        if self._name:
            return self._name
        if self.fn is not None and isinstance(getattr(self, "pattern", None), Pattern):
            return f"rule {self.pattern!r}"
        return type(self).__name__

    def callback(self, pre: Expr, post: Expr, node_map: Bindings) -> Expr | None:
        """The replacement for ``post`` (see the class docstring)."""
        if self.fn is None:
            raise NotImplementedError(f"{type(self).__name__} must override callback() or be "
                                      "built with a function")
        return self.fn(pre, post, node_map)

    def __repr__(self) -> str:
        return f"<PatternCallback {self.name}: {getattr(self, 'pattern', None)!r}>"


def rule(pattern: Pattern, fn: Callable[[Expr, Expr, Bindings], Expr | None],
         name: str | None = None) -> PatternCallback:
    """A :class:`PatternCallback` from a pattern and ``fn(pre, post, node_map)``."""
    return PatternCallback(pattern, fn, name)


Rule = PatternCallback | tuple[Pattern, Callable[..., Any]]
RewriteSpec = Rule | Sequence[Rule]


def rewrite(callbacks: RewriteSpec, target: Expr | IRModule, *,
            max_iterations: int | None = None, mod: IRModule | None = None) -> Any:
    """Rewrite every match of the callbacks' patterns in ``target`` until none applies.

    ``callbacks`` is one :class:`PatternCallback`, one ``(pattern, fn)`` pair with
    ``fn(pre, post, node_map)``, or a list of them (tried in order at each node). ``target``
    is an expression (the rewritten expression is returned) or an :class:`IRModule` (a new
    module is returned, every non-primitive function rewritten; the input is unchanged).
    ``mod`` resolves calls of global functions when ``target`` is an expression.

    The graph is walked operands first; each node is rebuilt from its rewritten operands and
    offered to the callbacks until none changes it. Walks repeat until one changes nothing,
    at most ``max_iterations`` times (default: the ``PatternRewrite.max_iterations`` pass
    config), after which a warning is given and the last result returned."""
    rules = _as_callbacks(callbacks)
    if max_iterations is None:
        max_iterations = PassContext.current().get_config("PatternRewrite.max_iterations")
    if not isinstance(max_iterations, int) or max_iterations < 1:
        raise OpfusionError(f"rewrite: max_iterations must be a positive int, got "
                            f"{max_iterations!r}")
    if isinstance(target, IRModule):
        return _rewrite_module(rules, target, max_iterations)
    if not isinstance(target, Expr):
        raise OpfusionError(f"rewrite takes an expression or an IRModule, got "
                            f"{type(target).__name__}")
    return _Rewriter(rules, mod, max_iterations).run(target)


@pass_factory
def PatternRewrite(callbacks: RewriteSpec, name: str = "PatternRewrite",  # noqa: N802
                   opt_level: int = 0) -> Pass:
    """A module pass that applies :func:`rewrite` with ``callbacks`` to every function."""
    rules = _as_callbacks(callbacks)

    def run(mod: IRModule, ctx: PassContext) -> IRModule:
        return rewrite(rules, mod, max_iterations=ctx.get_config("PatternRewrite.max_iterations"))

    run.__name__ = name
    return module_pass(run, opt_level=opt_level, name=name)


def _as_callbacks(spec: Any) -> list[PatternCallback]:
    if isinstance(spec, PatternCallback):
        found = [spec]
    elif isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[0], Pattern):
        if not callable(spec[1]):
            raise OpfusionError(f"rewrite: the pair ({spec[0]!r}, {spec[1]!r}) needs a function "
                                "fn(pre, post, node_map) as its second item")
        found = [rule(spec[0], spec[1])]
    elif isinstance(spec, (list, tuple)):
        found = [callback for item in spec for callback in _as_callbacks(item)]
    else:
        raise OpfusionError(f"rewrite takes a PatternCallback, a (pattern, function) pair or a "
                            f"list of them, got {type(spec).__name__} {spec!r}")
    for callback in found:
        if not isinstance(getattr(callback, "pattern", None), Pattern):
            raise OpfusionError(f"pattern callback {callback.name} has no pattern; set "
                                "self.pattern in its __init__")
    return found


def _rewrite_module(rules: list[PatternCallback], mod: IRModule,
                    max_iterations: int) -> IRModule:
    new = mod.copy()
    for name, func in mod.functions.items():
        if func.is_primitive:
            continue
        try:  # types let type patterns match; a module that does not type-check still rewrites
            infer_type(func, mod)
        except OpfusionError:
            pass
        rewritten = _Rewriter(rules, mod, max_iterations).run(func)
        if rewritten is not func:
            if not isinstance(rewritten, Function):
                raise OpfusionError(f"rewriting @{name} replaced the function by "
                                    f"{type(rewritten).__name__}; a rule may only replace nodes "
                                    "inside it")
            new[mod.get_global_var(name)] = rewritten
    return new


class _Rewriter:
    def __init__(self, rules: list[PatternCallback], mod: IRModule | None,
                 max_iterations: int) -> None:
        self.rules = rules
        self.mod = mod
        self.max_iterations = max_iterations
        # Rules by the operator a call must have for them to match; rules that may match any
        # node are in every list (and alone in ``any_node``). Order within a list is the
        # rules' order.
        roots = [callback.pattern.root_ops() for callback in rules]
        self.any_node = [callback for callback, ops in zip(rules, roots) if ops is None]
        self.by_op: dict[Op, list[PatternCallback]] = {}
        for ops in roots:
            for op in sorted(ops or (), key=lambda op: op.name):
                self.by_op[op] = [callback for callback, root in zip(rules, roots)
                                  if root is None or op in root]

    def run(self, root: Expr) -> Expr:
        for _ in range(self.max_iterations):
            new = self.walk(root)
            if new is root:
                return new
            root = new
        names = ", ".join(callback.name for callback in self.rules)
        warnings.warn(f"pattern rewriting ({names}) still changed the graph after "
                      f"{self.max_iterations} walks; stopping (raise the pass config "
                      "'PatternRewrite.max_iterations', or check for rules that undo each "
                      "other)", RuntimeWarning, stacklevel=3)
        return root

    def walk(self, root: Expr) -> Expr:
        """One walk, operands first: rebuild each node from its rewritten operands, then let
        the callbacks rewrite it."""
        memo: dict[Expr, Expr] = {}
        for pre in post_order(root, skip=_PRIMITIVE_FUNCTIONS):
            memo[pre] = self.apply(pre, _rebuild(pre, memo))
        return memo.get(root, root)

    def candidates(self, node: Expr) -> list[PatternCallback]:
        if isinstance(node, Call) and isinstance(node.op, Op):
            return self.by_op.get(node.op, self.any_node)
        return self.any_node

    def apply(self, pre: Expr, post: Expr) -> Expr:
        node = post
        for _ in range(self.max_iterations):
            for callback in self.candidates(node):
                bindings = callback.pattern.match_bindings(node)
                if bindings is None:
                    continue
                new = callback.callback(pre, node, bindings)
                if new is None or new is node:
                    continue
                self.check(callback, node, new)
                node = new
                break
            else:
                return node
        return node

    def check(self, callback: PatternCallback, old: Expr, new: Any) -> None:
        if not isinstance(new, Expr):
            raise OpfusionError(f"pattern callback {callback.name} returned "
                                f"{type(new).__name__}, not an expression")
        try:
            old_type = infer_type(old, self.mod)
        except OpfusionError:
            return  # nothing to compare against
        try:
            new_type = infer_type(new, self.mod)
        except OpfusionError as err:
            raise OpfusionError(f"pattern callback {callback.name} replaced {old!r} by an "
                                f"expression that does not type-check: {err}") from None
        if new_type != old_type:
            raise OpfusionError(f"pattern callback {callback.name} replaced {old!r} of type "
                                f"{old_type!r} by a value of type {new_type!r}; a rewrite must "
                                "keep the type")


class _PrimitiveFunctions:
    """``node in _PRIMITIVE_FUNCTIONS`` for fused functions: walks neither list nor enter
    them (their bodies are kernels already; rewriting them again could nest them forever)."""

    def __contains__(self, node: object) -> bool:
        return isinstance(node, Function) and node.is_primitive


_PRIMITIVE_FUNCTIONS = _PrimitiveFunctions()


def _rebuild(node: Expr, memo: dict[Expr, Expr]) -> Expr:
    """``node`` with its operands replaced by their rewritten forms (itself if none changed)."""
    if isinstance(node, Call):
        op = memo.get(node.op, node.op) if isinstance(node.op, Expr) else node.op
        args = [memo.get(arg, arg) for arg in node.args]
        if op is node.op and all(new is old for new, old in zip(args, node.args)):
            return node
        if not isinstance(op, (Op, Function, GlobalVar)):
            raise OpfusionError(f"a pattern callback replaced the function called by {node!r} "
                                f"with {type(op).__name__}, which cannot be called")
        return Call(op, args, node.attrs, node.span)
    if isinstance(node, Tuple):
        fields = [memo.get(field, field) for field in node.fields]
        if all(new is old for new, old in zip(fields, node.fields)):
            return node
        return Tuple(fields)
    if isinstance(node, TupleGetItem):
        value = memo.get(node.tuple_value, node.tuple_value)
        return node if value is node.tuple_value else TupleGetItem(value, node.index)
    if isinstance(node, Function):
        body = memo.get(node.body, node.body)
        return node if body is node.body else Function(node.params, body, node.ret_type,
                                                       node.attrs)
    return node
