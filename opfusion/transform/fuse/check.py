"""Checks that a fusion partition, and the module built from it, can be lowered group by group.

A partition is valid when each group is one kernel that runs after all of its inputs exist:

* only the root of a group is read outside it (a fused function has one result);
* the groups, contracted to single nodes, form a DAG: no path leaves a group and comes back
  (that would make two kernels each wait for the other);
* an opaque operator is alone, and a group holds at most one kOutEWiseFusable anchor.

:func:`check_fused_function` checks the rewritten IR: every primitive function is closed
(uses only its own parameters) and no operator is left outside a primitive function."""

from __future__ import annotations

from ...ir.expr import Call, Function
from ...ir.module import IRModule
from ...ir.op import Op
from ...ir.visitor import free_vars, post_order
from .graph import OPAQUE, OUT_EWISE_FUSABLE, describe_expr
from .partition import FusionPlan


class InvalidFusionError(AssertionError):
    """A partition or a fused module breaks an invariant of fusion (a bug in the pass)."""


def check_fusion_plan(plan: FusionPlan) -> None:
    """Raise :class:`InvalidFusionError` if ``plan``'s groups cannot be lowered one kernel each."""
    nodes, root_of = plan.graph.nodes, plan.root_of
    # Group-to-group edges, in a deterministic (first-seen) order.
    successors: dict[int, dict[int, None]] = {root: {} for root in dict.fromkeys(root_of)}
    for node in nodes:
        group = root_of[node.index]
        for edge in node.outputs:
            consumer_group = root_of[edge.node.index]
            if consumer_group == group:
                continue
            if node.index != group:
                raise InvalidFusionError(
                    f"node {node.index} ({describe_expr(node.ref)}) is used by node "
                    f"{edge.node.index} ({describe_expr(edge.node.ref)}) of another group but "
                    f"is not the root of its own group (root: node {group}); a fused function "
                    f"has one result")
            successors[group][consumer_group] = None
    _check_acyclic(successors, plan)
    sizes: dict[int, int] = {}
    for group in root_of:
        sizes[group] = sizes.get(group, 0) + 1
    anchors: dict[int, int] = {}
    for node in nodes:
        group = root_of[node.index]
        ref = node.ref
        if isinstance(ref, Call) and isinstance(ref.op, Op):
            if node.pattern == OPAQUE and sizes[group] > 1:
                raise InvalidFusionError(f"opaque node {node.index} ({describe_expr(ref)}) "
                                         f"shares group {group} with other nodes")
            if node.pattern == OUT_EWISE_FUSABLE:
                if group in anchors:
                    raise InvalidFusionError(
                        f"group {group} holds two kOutEWiseFusable ops: nodes "
                        f"{anchors[group]} and {node.index}")
                anchors[group] = node.index


def _check_acyclic(successors: dict[int, dict[int, None]], plan: FusionPlan) -> None:
    """Kahn's algorithm over the contracted graph; what is left over lies on a cycle."""
    indegree = dict.fromkeys(successors, 0)
    for targets in successors.values():
        for target in targets:
            indegree[target] += 1
    ready = [group for group, degree in indegree.items() if degree == 0]
    done = 0
    while ready:
        group = ready.pop()
        done += 1
        for target in successors[group]:
            indegree[target] -= 1
            if indegree[target] == 0:
                ready.append(target)
    if done != len(successors):
        cyclic = [group for group, degree in indegree.items() if degree > 0]
        names = ", ".join(f"{g} ({describe_expr(plan.graph.nodes[g].ref)})" for g in cyclic[:8])
        raise InvalidFusionError(f"the groups rooted at nodes {names} form a cycle: a path "
                                 f"leaves one of them and comes back")


def check_fused_function(func: Function) -> None:
    """Raise :class:`InvalidFusionError` if a primitive function of ``func`` is not closed, or
    an operator is called outside every primitive function."""
    for node in post_order(func.body, into_functions=False):
        if isinstance(node, Call) and isinstance(node.op, Op):
            raise InvalidFusionError(f"{describe_expr(node)} is called outside any primitive "
                                     f"function")
        if isinstance(node, Call) and isinstance(node.op, Function) and node.op.is_primitive:
            leaked = free_vars(node.op)
            if leaked:
                raise InvalidFusionError(
                    f"a primitive function uses variables it does not bind: "
                    f"{', '.join('%' + v.name_hint for v in leaked)}")


def check_fused_module(mod: IRModule) -> None:
    """:func:`check_fused_function` on every non-primitive global function of ``mod``."""
    for func in mod.functions.values():
        if not func.is_primitive:
            check_fused_function(func)

