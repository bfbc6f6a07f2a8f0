"""The fusion engine: group bookkeeping, cycle checks, merging and the fixed-point loop.
Groups are the :class:`~opfusion.transform.fuse.group.Group` records FuseOps uses too.

Policies never touch this state; they see read-only views and mark pairs. The engine then
merges what was marked, checking every merge against the current grouping: no cycle between
groups, and the FuseOps limits (``FuseOps.max_depth`` ops per group,
``FuseOps.max_function_args`` inputs).

Groups keep a topological position. Merging two groups reorders only the groups whose
positions lie between them (the forward set of the earlier one and the backward set of the
later one — the Pearce-Kelly update of a dynamic topological order), and the same walk that
finds the forward set detects a cycle. So each check and each merge costs the size of the
region between the two groups, not of the graph."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from ...ir.op import OpPatternKind
from ..fuse.group import Group
from .graph import FusionGraph

if TYPE_CHECKING:
    from .policy import FuseHelper

K = OpPatternKind


def group_kind(kinds: Iterable[OpPatternKind]) -> OpPatternKind:
    """A group is as restrictive as its most restrictive op; a tuple counts as injective."""
    return max((K.kInjective if kind == K.kTuple else kind for kind in kinds),
               default=K.kElemWise)


class FusionState:
    """Groups over a :class:`FusionGraph` and the operations that change them."""

    def __init__(self, graph: FusionGraph, initial_groups: list[list[int]],
                 max_depth: int = 256, max_function_args: int = 0) -> None:
        self.graph = graph
        self.max_depth = max_depth
        self.max_function_args = max_function_args
        self.groups: list[Group] = []
        self.version = 0  # bumped by every change, so caches of sorted neighbours expire
        # owner[node]: the group that computes node (recompute may copy it into several
        # groups; every consumer of a copied node then holds a copy, so no lookup from outside
        # ever needs the copies).
        self.owner: list[Group] = [None] * len(graph.nodes)  # type: ignore[list-item]
        for members in initial_groups:
            group = Group(K.kElemWise, uid=len(self.groups), nodes=sorted(members))
            group.pattern = group_kind(graph.nodes[n].kind for n in group.nodes)
            self.groups.append(group)
            for node in group.nodes:
                self.owner[node] = group
        for group in self.groups:
            self._connect(group)
        self._assign_topological_positions()

    # -- structure -----------------------------------------------------------------------------
    def _connect(self, group: Group) -> None:
        member = set(group.nodes)
        for node in group.nodes:
            for tensor in self.graph.nodes[node].inputs:
                producer = self.graph.tensors[tensor].producer
                if producer is None or producer in member:
                    continue
                other = self.owner[producer]
                group.producers[other] = None
                other.consumers[group] = None

    def _assign_topological_positions(self) -> None:
        """Kahn's algorithm, level by level (a group's level is one more than its deepest
        producer's), ties broken by the smallest node index: deterministic, and siblings end
        up close together, which keeps the regions between groups that fusion walks small."""
        import heapq

        waiting = {g: len(g.producers) for g in self.groups}
        level = {g: 0 for g in self.groups}
        ready = [(0, g.nodes[0], g.uid, g) for g in self.groups if waiting[g] == 0]
        heapq.heapify(ready)
        position = 0
        while ready:
            depth, _, _, group = heapq.heappop(ready)
            group.pos = position
            position += 1
            for consumer in group.consumers:
                waiting[consumer] -= 1
                level[consumer] = max(level[consumer], depth + 1)
                if waiting[consumer] == 0:
                    heapq.heappush(ready, (level[consumer], consumer.nodes[0], consumer.uid,
                                           consumer))
        assert position == len(self.groups), "the initial groups form a cycle"

    @property
    def helper(self) -> FuseHelper:
        """The one :class:`FuseHelper` policies share for this state."""
        helper = self.__dict__.get("_helper")
        if helper is None:
            from .policy import FuseHelper  # the policy module builds on this one

            helper = self.__dict__["_helper"] = FuseHelper(self)
        return helper

    def neighbours(self, group: Group) -> tuple[list[Group], list[Group]]:
        """``group``'s producers and consumers, each in topological order."""
        cache = group.sorted_cache
        if cache is None or cache[0] != self.version:
            cache = group.sorted_cache = (
                self.version, sorted(group.producers, key=_position),
                sorted(group.consumers, key=_position))
        return cache[1], cache[2]

    def output_numel(self, group: Group) -> int:
        """Elements of the group's largest output."""
        tensors = self.graph.tensors
        return max((tensors[t].numel for t in self.output_tensors(group)), default=0)

    def alive_groups(self) -> list[Group]:
        """Live groups in topological order."""
        return sorted((g for g in self.groups if g.alive), key=lambda g: g.pos)

    def output_tensors(self, group: Group) -> list[int]:
        """Tensors computed in ``group`` that something outside it reads (or the result)."""
        if group.outputs is None:
            group.outputs = self._find_outputs(group)
        return group.outputs

    def _find_outputs(self, group: Group) -> list[int]:
        member = set(group.nodes)
        outputs = []
        for node in group.sorted_nodes():
            tensor = self.graph.nodes[node].output
            if tensor == self.graph.output_tensor or any(
                    c not in member for c in self.graph.tensors[tensor].consumers):
                outputs.append(tensor)
        return outputs

    def input_tensors(self, group: Group) -> list[int]:
        """Tensors ``group`` reads but does not compute, in first-use order."""
        member = set(group.nodes)
        seen: dict[int, None] = {}
        for node in group.sorted_nodes():
            for tensor in self.graph.nodes[node].inputs:
                producer = self.graph.tensors[tensor].producer
                if producer is None or producer not in member:
                    seen[tensor] = None
        return list(seen)

    # -- checks --------------------------------------------------------------------------------
    def _forward_region(self, early: Group, late: Group) -> list[Group] | None:
        """Groups reachable from ``early`` without passing ``late`` and placed before
        ``late``; None when one of them reaches ``late`` (fusing would make a cycle)."""
        limit = late.pos
        region: list[Group] = []
        seen = {early}
        stack = [c for c in early.consumers if c.pos < limit]
        while stack:
            group = stack.pop()
            if group in seen:
                continue
            seen.add(group)
            region.append(group)
            for consumer in group.consumers:
                if consumer.pos < limit:
                    if consumer not in seen:
                        stack.append(consumer)
                elif consumer is late:
                    return None
        return region

    def _backward_region(self, early: Group, late: Group) -> list[Group]:
        """Groups that reach ``late`` (not through ``early``), placed after ``early``."""
        limit = early.pos
        region: list[Group] = []
        seen = {late}
        stack = [p for p in late.producers if p.pos > limit]
        while stack:
            group = stack.pop()
            if group in seen:
                continue
            seen.add(group)
            region.append(group)
            stack.extend(p for p in group.producers if p.pos > limit and p not in seen)
        return region

    def would_create_cycle(self, a: Group, b: Group) -> bool:
        """Whether merging ``a`` and ``b`` would make a cycle between groups."""
        if a is b:
            return False
        early, late = (a, b) if a.pos < b.pos else (b, a)
        return self._forward_region(early, late) is None

    def merged_size(self, a: Group, b: Group) -> int:
        if a.has_copies or b.has_copies:  # recompute may have put a node in both
            return len(set(a.nodes) | set(b.nodes))
        return len(a.nodes) + len(b.nodes)

    def merged_num_args(self, a: Group, b: Group) -> int:
        """Tensor arguments the merged group would take (tuple arguments count their
        fields, as TVM counts them)."""
        member = set(a.nodes) | set(b.nodes)
        inputs: dict[int, None] = {}
        for node in sorted(member):
            for tensor in self.graph.nodes[node].inputs:
                producer = self.graph.tensors[tensor].producer
                if producer is None or producer not in member:
                    inputs[tensor] = None
        return sum(_flat_count(self.graph.tensors[t].type) for t in inputs)

    def limit_violation(self, a: Group, b: Group) -> str | None:
        """Why merging ``a`` and ``b`` breaks a FuseOps limit, or None."""
        size = self.merged_size(a, b)
        if size > self.max_depth:
            return f"would exceed FuseOps.max_depth={self.max_depth} ({size} ops)"
        if self.max_function_args > 0:
            count = self.merged_num_args(a, b)
            if count > self.max_function_args:
                return (f"would exceed FuseOps.max_function_args={self.max_function_args} "
                        f"({count} arguments)")
        return None

    # -- changes -------------------------------------------------------------------------------
    def merge(self, a: Group, b: Group) -> Group | None:
        """Merge two live groups; None (nothing changed) if that would make a cycle or break
        a limit. The larger group absorbs the smaller (so a long chain of merges costs the
        sizes of the small sides only) and is returned."""
        if a is b or not (a.alive and b.alive) or self.limit_violation(a, b) is not None:
            return None
        early, late = (a, b) if a.pos < b.pos else (b, a)
        forward = self._forward_region(early, late)
        if forward is None:
            return None
        backward = self._backward_region(early, late)
        big, small = (a, b) if len(a.nodes) >= len(b.nodes) else (b, a)
        # New positions: the backward set, then the merged group, then the forward set, in
        # the slots they held (backward moves earlier, forward later; nothing else moves).
        slots = sorted([g.pos for g in backward] + [g.pos for g in forward] +
                       [early.pos, late.pos])
        for group, slot in zip(sorted(backward, key=lambda g: g.pos), slots):
            group.pos = slot
        big.pos = slots[len(backward)]
        for group, slot in zip(sorted(forward, key=lambda g: g.pos), slots[len(backward) + 2:]):
            group.pos = slot
        big.producers.pop(small, None)
        big.consumers.pop(small, None)
        for producer in small.producers:
            if producer is not big:
                producer.consumers.pop(small, None)
                producer.consumers[big] = None
                big.producers[producer] = None
        for consumer in small.consumers:
            if consumer is not big:
                consumer.producers.pop(small, None)
                consumer.producers[big] = None
                big.consumers[consumer] = None
        if big.has_copies or small.has_copies:
            big.nodes = list(dict.fromkeys(big.nodes + small.nodes))
            big.has_copies = True
        else:
            big.nodes.extend(small.nodes)
        big.ordered = False
        big.outputs = None
        self.version += 1
        big.pattern = max(big.pattern, small.pattern)
        for node in small.nodes:
            if self.owner[node] is small:
                self.owner[node] = big
        small.alive = False
        return big

    def can_recompute(self, producer: Group) -> bool:
        """Whether ``producer`` can be copied into each of its consumers: it has consumers,
        and nothing but them reads it (it is not a result of the function)."""
        if not producer.consumers:
            return False
        result_node = self.graph.tensors[self.graph.output_tensor].producer
        return result_node is None or self.owner[result_node] is not producer

    def recompute(self, producer: Group) -> list[Group] | None:
        """Copy ``producer``'s ops into every consumer group and drop it. Returns the new
        consumer groups, or None if a limit forbids it."""
        if not producer.alive or not self.can_recompute(producer):
            return None
        consumers = list(producer.consumers)
        if any(self.limit_violation(producer, c) for c in consumers):
            return None
        producer.alive = False
        self.version += 1
        for upstream in producer.producers:
            upstream.consumers.pop(producer, None)
        for consumer in consumers:
            consumer.producers.pop(producer, None)
            consumer.nodes = sorted(set(consumer.nodes) | set(producer.nodes))
            consumer.has_copies = True
            consumer.outputs = None
            consumer.pattern = max(consumer.pattern, producer.pattern)
            for upstream in producer.producers:
                consumer.producers[upstream] = None
                upstream.consumers[consumer] = None
        return consumers


def _position(group: Group) -> int:
    return group.pos


def _flat_count(ty: object) -> int:
    from ...ir.types import TupleType

    if isinstance(ty, TupleType):
        return sum(_flat_count(f) for f in ty.fields)
    return 1
