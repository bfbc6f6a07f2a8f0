"""FusionMerge: fuse groups with pluggable policies until nothing changes.

Each round (a) runs every policy, highest benefit first, over every group (or, for input
policies, over the consumers of every graph input) to collect marks, without changing
anything; then (b) applies the marks in the order they were made, each checked against the
grouping as it stands (no cycle, FuseOps limits). Rounds repeat until one merges nothing.
Groups only grow, so the loop ends. Iteration order is topological and marks are applied in
order, so the same graph always fuses the same way."""

from __future__ import annotations

from collections.abc import Sequence

from ...errors import OpfusionError
from ...ir.expr import Function, Var
from ...ir.module import IRModule
from ...ir.printer import gc_paused
from ..context import PassContext
from ..fuse import partition as _fuse_ops_config  # noqa: F401 - declares FuseOps.* keys
from ..pass_infra import Pass, module_pass, pass_factory
from .engine import FusionState, Group
from .graph import FusionGraph
from .policy import (
    FusePolicy,
    FusionMark,
    InputFusePassCtx,
    LightwareFusePassCtx,
    RecomputeFusePass,
    order_policies,
    registered_policies,
)
from .rewrite import rewrite_groups
from .views import OpGroup, TensorNode

MAX_ROUNDS = 1000


@pass_factory
def FusionMerge(policies: Sequence[FusePolicy] | None = None,  # noqa: N802 - a pass name
                link_params: bool | None = None) -> Pass:
    """A pass that fuses the groups of every function with ``policies`` (None: the
    registered ones). The starting groups are the primitive functions already in the module
    (run FuseOps first to start from its groups), every other op alone."""
    for policy in policies or ():
        if not isinstance(policy, FusePolicy):
            raise OpfusionError(f"FusionMerge takes FusePolicy instances, got "
                                f"{type(policy).__name__}")
    chosen = registered_policies() if policies is None else order_policies(list(policies))

    @module_pass(opt_level=0, name="FusionMerge", required=("InferType",))
    def fusion_merge(mod: IRModule, ctx: PassContext) -> IRModule:
        link = ctx.get_config("FuseOps.link_params") if link_params is None else link_params
        new = IRModule()
        for name, func in mod.functions.items():
            if func.is_primitive:
                new[mod.get_global_var(name)] = func
                continue
            new[mod.get_global_var(name)] = fuse_function(func, chosen, ctx, bool(link))
        return new

    return fusion_merge


def fuse_function(func: Function, policies: Sequence[FusePolicy], ctx: PassContext,
                  link_params: bool = False) -> Function:
    """Run the fixed-point loop on one function and rewrite its groups."""
    with gc_paused():  # ~10^5 long-lived small objects: collections would rescan them all
        state = merge_groups(FusionGraph(func), policies,
                             max_depth=ctx.get_config("FuseOps.max_depth"),
                             max_function_args=ctx.get_config("FuseOps.max_function_args"))
        groups = [g.sorted_nodes() for g in state.alive_groups()]
        return rewrite_groups(state.graph, groups, link_params)


def merge_groups(graph: FusionGraph, policies: Sequence[FusePolicy], max_depth: int = 256,
                 max_function_args: int = 0) -> FusionState:
    """The grouping the policies reach from ``graph``'s initial groups."""
    with gc_paused():
        state = FusionState(graph, graph.initial_groups, max_depth, max_function_args)
        for _ in range(MAX_ROUNDS):
            marks = collect_marks(state, policies)
            if not apply_marks(state, marks):
                break
    return state


def collect_marks(state: FusionState, policies: Sequence[FusePolicy]) -> list[FusionMark]:
    """Run every policy once over the current groups; nothing changes yet."""
    marks: list[FusionMark] = []
    views = [OpGroup(state, group) for group in state.alive_groups()]
    inputs: list[tuple[TensorNode, tuple[OpGroup, ...]]] | None = None
    for policy in policies:
        if policy.context == "input":
            if inputs is None:
                inputs = _graph_inputs(state)
            for tensor, consumers in inputs:
                if len(consumers) > 1:
                    policy(InputFusePassCtx(state, tensor, consumers, policy.name, marks))
            continue
        recompute = isinstance(policy, RecomputeFusePass)
        ctx = None
        for view in views:
            if ctx is None:
                ctx = LightwareFusePassCtx(state, view, policy.name, marks, recompute)
            else:  # one context per policy and round; only the picked group changes
                ctx._group = view
            policy(ctx)
    return marks


def _graph_inputs(state: FusionState) -> list[tuple[TensorNode, tuple[OpGroup, ...]]]:
    """Each function parameter with the live groups that read it, in topological order."""
    copies: dict[int, list[Group]] | None = None
    out = []
    for tensor in state.graph.tensors:
        if tensor.producer is not None or not isinstance(tensor.expr, Var):
            continue
        readers: dict[Group, None] = {}
        for node in tensor.consumers:
            owner = state.owner[node]
            if owner.alive:
                readers[owner] = None
                continue
            if copies is None:  # a recomputed node: it lives in copies, found once per round
                copies = {}
                for group in state.alive_groups():
                    if group.has_copies:
                        for member in group.nodes:
                            copies.setdefault(member, []).append(group)
            for group in copies.get(node, ()):
                readers[group] = None
        ordered = sorted(readers, key=lambda g: g.pos)
        out.append((TensorNode(state, tensor.index),
                    tuple(OpGroup(state, g) for g in ordered)))
    return out


def apply_marks(state: FusionState, marks: list[FusionMark]) -> bool:
    """Apply the marks in order; True if anything changed."""
    forward: dict[Group, Group] = {}

    def current(group: Group) -> Group:
        while group in forward:
            group = forward[group]
        return group

    changed = False
    recompute: dict[Group, list[Group]] = {}
    for mark in marks:
        first, second = current(mark.first._group), current(mark.second._group)
        if mark.recompute:
            recompute.setdefault(first, []).append(second)
            continue
        if first is second or not (first.alive and second.alive):
            continue
        merged = state.merge(first, second)
        if merged is not None:
            dead = second if merged is first else first
            forward[dead] = merged
            changed = True
    for producer, marked in recompute.items():
        producer = current(producer)
        if not producer.alive:
            continue
        targets = {current(g) for g in marked}
        if targets == set(producer.consumers) and state.recompute(producer) is not None:
            changed = True
    return changed
