"""Why FuseOps did not fuse an edge, in words.

:func:`explain_fusion` partitions a module exactly as FuseOps would under the current pass
context and reports every producer -> consumer edge that crosses a group boundary, with the
rule that stopped it::

    >>> y = op.nn.relu(op.nn.max_pool2d(op.nn.conv2d(x, w), pool_size=2))
    >>> print(explain_fusion(Function([x, w], y)))
    1 edge not fused in @main:
      %0 nn.conv2d -> %1 nn.max_pool2d: nn.conv2d (%0) is kOutEWiseFusable and the way to its
          post-dominator nn.max_pool2d (%1) is kOutEWiseFusable, not kElemWise (only
          elementwise ops may follow a kOutEWiseFusable op)

Nodes are named by the temporaries ``print(mod)`` shows for the unfused module."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from ...ir.expr import Call, Constant, Expr, Function, Tuple, TupleGetItem, Var
from ...ir.module import IRModule
from ...ir.op import Op, OpPatternKind
from ...ir.visitor import post_order
from ..context import PassContext
from .dominator import NO_PARENT
from .graph import OPAQUE, GraphNode
from .partition import FuseOptions, FusionPlan, Refusal, plan_fusion


@dataclass(frozen=True)
class FusionRefusal:
    """One edge that FuseOps did not fuse, and why.

    ``rule`` is a short identifier ("opaque", "no-post-dominator", "path", "sink",
    "dominator-pattern", "dominator-is-tuple", "tuple-root", "tuple-unfused", "reduction",
    "max_depth", "max_function_args", "postponed-anchor", "output", "opt_level"); ``reason``
    is the sentence."""

    function: str
    producer: Expr
    consumer: Expr
    producer_name: str
    consumer_name: str
    rule: str
    reason: str

    def __str__(self) -> str:
        return f"{self.producer_name} -> {self.consumer_name}: {self.reason}"


class FusionReport(list[FusionRefusal]):
    """The refusals of :func:`explain_fusion`; ``print(report)`` lists them by function."""

    def render(self, width: int = 100) -> str:
        """One entry per edge, grouped by function, the reason wrapped to ``width``."""
        if not self:
            return "every edge was fused"
        lines: list[str] = []
        by_function: dict[str, list[FusionRefusal]] = {}
        for refusal in self:
            by_function.setdefault(refusal.function, []).append(refusal)
        for name, refusals in by_function.items():
            plural = "edge" if len(refusals) == 1 else "edges"
            lines.append(f"{len(refusals)} {plural} not fused in @{name}:")
            for refusal in refusals:
                head = f"  {refusal.producer_name} -> {refusal.consumer_name}: "
                lines.extend(textwrap.wrap(refusal.reason, width, initial_indent=head,
                                           subsequent_indent="      "))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()

    def by_rule(self) -> dict[str, int]:
        """How many edges each rule refused, most frequent first."""
        counts: dict[str, int] = {}
        for refusal in self:
            counts[refusal.rule] = counts.get(refusal.rule, 0) + 1
        return dict(sorted(counts.items(), key=lambda item: -item[1]))


def explain_fusion(mod: IRModule | Function, fuse_opt_level: int = -1,
                   include_inputs: bool = False,
                   ctx: PassContext | None = None) -> FusionReport:
    """Every edge FuseOps leaves between two groups, with the rule that refused it.

    The partition is the one ``FuseOps(fuse_opt_level)`` makes under ``ctx`` (default: the
    current pass context). Edges from function parameters and constants are left out unless
    ``include_inputs``: they are never fused, by design."""
    options = FuseOptions.from_context(ctx, fuse_opt_level)
    if isinstance(mod, Function):
        functions, module = {"main": mod}, None
    else:
        functions, module = mod.functions, mod
    report = FusionReport()
    for name, func in functions.items():
        if func.is_primitive or "Compiler" in func.attrs:
            continue
        plan = plan_fusion(func, options, explain=True, mod=module)
        report.extend(_explain_function(name, plan, include_inputs))
    return report


def _explain_function(name: str, plan: FusionPlan, include_inputs: bool) -> list[FusionRefusal]:
    names = temporary_names(plan.func)
    refusals = []
    for node in plan.graph.nodes:
        if not include_inputs and isinstance(node.ref, (Var, Constant)):
            continue
        group = plan.root_of[node.index]
        seen: set[int] = set()
        explained: tuple[str, str] | None = None
        for edge in node.outputs:
            consumer = edge.node
            if plan.root_of[consumer.index] == group or consumer.index in seen:
                continue
            seen.add(consumer.index)
            rule, reason = explained = explained or _reason(plan, node, names)
            refusals.append(FusionRefusal(
                name, node.ref, consumer.ref, node_label(node.ref, names),
                node_label(consumer.ref, names), rule, reason))
    return refusals


def _reason(plan: FusionPlan, node: GraphNode, names: dict[Expr, str]) -> tuple[str, str]:
    """The rule that kept ``node`` (the root of its group) out of its post-dominator's group."""
    me = _describe(node.ref, names)
    if plan.options.opt_level == 0:
        return "opt_level", "fusion is off at opt_level 0 (every op is a function of its own)"
    if node.pattern == OPAQUE:
        return "opaque", _opaque_reason(node.ref, me, plan.options.link_params)
    assert plan.tree is not None
    dominator = plan.tree.parent[node.index]
    if dominator == NO_PARENT:
        if node.extern_ref:
            return "output", (f"{me} is referenced outside the dataflow (the function's result "
                              f"or a field of a tuple that holds non-tensors)")
        consumers = ", ".join(dict.fromkeys(_describe(e.node.ref, names) for e in node.outputs))
        return "no-post-dominator", (
            f"the consumers of {me} ({consumers}) have no common post-dominator: their paths "
            f"reach the function's outputs separately, so no group can take them all")
    refusal = plan.refusals.get(node.index)
    if refusal is None:
        dom = _describe(plan.graph.nodes[dominator].ref, names)
        return "unknown", f"{me} was not fused into the group of its post-dominator {dom}"
    return refusal.rule, _refusal_sentence(plan, refusal, me, names)


def _refusal_sentence(plan: FusionPlan, refusal: Refusal, me: str,
                      names: dict[Expr, str]) -> str:
    nodes = plan.graph.nodes
    dom = _describe(nodes[refusal.dominator].ref, names)
    # "is kOutEWiseFusable (its group holds nn.conv2d (%0))": an elementwise op that took in
    # a conv2d has the conv2d's kind.
    kind = f"is {_kind(refusal.kind)}"
    anchor = plan.group_anchor.get(plan.root_of[refusal.node], -1)
    if anchor >= 0 and anchor != refusal.node:
        kind += f" (its group holds {_describe(nodes[anchor].ref, names)})"
    rule = refusal.rule
    if rule in ("path", "sink"):
        blocker = _describe(nodes[refusal.blocker].ref, names)
        holder = plan.group_anchor.get(plan.root_of[refusal.blocker], -1)
        if holder >= 0 and holder != refusal.blocker:
            blocker += f", whose group already holds {_describe(nodes[holder].ref, names)}"
        where = "its post-dominator path passes through" if rule == "path" else \
            "its post-dominator is"
        return (f"{me} {kind} and {where} {blocker} ({_kind(refusal.blocker_kind)} > "
                f"{_kind(refusal.allowed)})")
    if rule == "dominator-pattern":
        way = _kind(refusal.blocker_kind)
        if refusal.allowed == int(OpPatternKind.kElemWise):
            return (f"{me} {kind} and the way to its post-dominator {dom} is {way}, not "
                    f"kElemWise (only elementwise ops may follow a kOutEWiseFusable op)")
        return (f"{me} {kind} and the way to its post-dominator {dom} is {way} "
                f"({way} > kInjective): elementwise ops fuse only into injective or reduction "
                f"consumers")
    if rule == "dominator-is-tuple":
        return (f"the post-dominator of {me} is {dom}: tuple fields join a tuple only in "
                f"phase 2, once the tuple is fused into injective consumers")
    if rule == "tuple-root":
        return (f"the post-dominator of {me} is {dom}, which was not fused into a consumer "
                f"(it is the root of its own group)")
    if rule == "tuple-unfused":
        return (f"the post-dominator of {me} is {dom}, whose group is "
                f"{_kind(refusal.blocker_kind)}, not injective")
    if rule == "reduction":
        return (f"{me} is kCommReduce: a reduction ends its group, nothing after it is fused "
                f"into it")
    if rule == "max_depth":
        return (f"fusing {me} into the group of {dom} would exceed "
                f"max_depth={refusal.limit}")
    if rule == "max_function_args":
        return (f"fusing {me} into the group of {dom} would need {refusal.count} arguments, "
                f"over the {refusal.limit} that max_function_args="
                f"{plan.options.max_function_args} leaves once the outputs are passed")
    if rule == "postponed-anchor":
        waited = _describe(nodes[refusal.blocker].ref, names)
        return (f"fusing {me} into the group of {dom} waited (max_function_args) for the "
                f"argument count of {waited}, and by then that group held a kOutEWiseFusable "
                f"op")
    return f"{me} was not fused into {dom} ({rule})"  # pragma: no cover


def _opaque_reason(expr: Expr, me: str, link_params: bool) -> str:
    if isinstance(expr, Call) and isinstance(expr.op, Op):
        return f"{me} is kOpaque: opaque operators are never fused"
    if isinstance(expr, Call):
        return f"{me} calls a function (kOpaque): calls are never fused"
    if isinstance(expr, Var):
        return f"{me} is an input of the function"
    if isinstance(expr, Constant):
        where = "kept inside the function" if link_params else "passed as a parameter"
        return f"{me} is a tensor constant (kOpaque): it is {where}, not fused"
    return f"{me} is kOpaque"


def _kind(kind: int) -> str:
    return OpPatternKind(kind).name


def _describe(expr: Expr, names: dict[Expr, str]) -> str:
    """``nn.conv2d (%3)``, ``%x``, ``tuple (%5)``, ``add (the result)``."""
    if isinstance(expr, Var):
        return f"%{expr.name_hint}"
    what = expr.op.name if isinstance(expr, Call) and isinstance(expr.op, Op) else \
        _what(expr)
    return f"{what} ({names[expr]})" if expr in names else what


def node_label(expr: Expr, names: dict[Expr, str]) -> str:
    """``%3 nn.conv2d``, ``add (the result)``: the short form at the head of a report line."""
    if isinstance(expr, Var):
        return f"%{expr.name_hint}"
    what = expr.op.name if isinstance(expr, Call) and isinstance(expr.op, Op) else _what(expr)
    name = names.get(expr)
    if name is None:
        return what
    return f"{what} ({name})" if name == _RESULT else f"{name} {what}"


def _what(expr: Expr) -> str:
    if isinstance(expr, Call):
        return "call"
    if isinstance(expr, Tuple):
        return "tuple"
    if isinstance(expr, TupleGetItem):
        return f"field .{expr.index}"
    if isinstance(expr, Constant):
        return "scalar constant" if expr.data.ndim == 0 else f"constant {expr.data.shape}"
    if isinstance(expr, Function):
        return "function"
    return type(expr).__name__


_RESULT = "the result"


def temporary_names(func: Function) -> dict[Expr, str]:
    """The ``%n`` each node has in ``print(func)``; the body itself is "the result".

    Mirrors the printer: calls, tuples, tuple fields and functions are numbered in post-order,
    a called function just before its first call."""
    names: dict[Expr, str] = {}
    count = 0
    for node in post_order(func.body, into_functions=False):
        if isinstance(node, Call) and isinstance(node.op, Function) and node.op not in names:
            names[node.op] = f"%{count}"
            count += 1
        if not isinstance(node, (Call, Tuple, TupleGetItem, Function)) or node in names:
            continue
        if node is func.body:
            names[node] = _RESULT
        else:
            names[node] = f"%{count}"
            count += 1
    return names
