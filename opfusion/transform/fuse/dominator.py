"""The post-dominator tree of an indexed forward graph.

A node's immediate post-dominator is the closest node that every path from it to the
function's result passes through. Because the graph is a DAG numbered producers-first, one
sweep in reverse order builds the tree (TVM's single-pass construction): when a node is
reached, all of its consumers already have their place in the tree, and its parent is the
least common ancestor of those consumers.

Along with the parent each node keeps the *pattern* of the way to it: the largest (least
fusable) kind among the node's own output edges and the tree nodes passed while climbing to
the common ancestor. The partitioner reads it as "everything between this node and its
post-dominator is at most this kind".

External references (parameters, the result) get no parent, and neither does a node whose
consumers only meet at the function's outputs."""

from __future__ import annotations

from ...ir.op import OpPatternKind
from .graph import ELEMWISE, OPAQUE, Edge, IndexedForwardGraph

NO_PARENT = -1


class PostDominatorTree:
    """For node ``i`` of the graph: ``parent[i]`` (its immediate post-dominator's index, or
    :data:`NO_PARENT`), ``depth[i]`` (1 for a root) and ``pattern[i]`` (the combined kind of
    the way from ``i`` to its parent)."""

    def __init__(self, graph: IndexedForwardGraph) -> None:
        size = len(graph)
        self.parent = [NO_PARENT] * size
        self.depth = [1] * size
        self.pattern = [OPAQUE] * size
        for node in reversed(graph.nodes):
            index = node.index
            if node.extern_ref:
                continue  # depth 1, no parent, kOpaque
            parent, pattern = self._common_ancestor(node.outputs)
            self.parent[index] = parent
            self.pattern[index] = pattern
            self.depth[index] = self.depth[parent] + 1 if parent != NO_PARENT else 1

    def _common_ancestor(self, outputs: list[Edge]) -> tuple[int, int]:
        """The least common ancestor of the consumers on ``outputs`` and the combined
        pattern of the edges and of the tree nodes climbed to reach it."""
        if not outputs:
            return NO_PARENT, ELEMWISE
        # The ancestor and the combined pattern do not depend on the order the consumers are
        # taken in (the pattern covers every consumer's way up to the ancestor). Producers-
        # first order climbs the least: a consumer's tree descendants come before it.
        if len(outputs) > 2:
            outputs = sorted(outputs, key=lambda edge: edge.node.index)
        parent = outputs[0].node.index
        pattern = max(ELEMWISE, outputs[0].pattern)
        for edge in outputs[1:]:
            parent, pattern = self._climb(parent, edge.node.index, pattern)
            pattern = max(pattern, edge.pattern)
        return parent, pattern

    def _climb(self, lhs: int, rhs: int, pattern: int) -> tuple[int, int]:
        """Walk ``lhs`` and ``rhs`` up the tree, deeper one first, until they meet; combine the
        patterns of the nodes left behind."""
        depth, parents, patterns = self.depth, self.parent, self.pattern
        while lhs != rhs:
            if lhs == NO_PARENT or rhs == NO_PARENT:
                return NO_PARENT, pattern
            if depth[lhs] < depth[rhs]:
                pattern = max(pattern, patterns[rhs])
                rhs = parents[rhs]
            elif depth[rhs] < depth[lhs]:
                pattern = max(pattern, patterns[lhs])
                lhs = parents[lhs]
            else:
                pattern = max(pattern, patterns[lhs], patterns[rhs])
                lhs = parents[lhs]
                rhs = parents[rhs]
        return lhs, pattern

    def dump(self) -> str:
        """One line per node: its parent and the pattern of the way there."""
        return "\n".join(f"node[{i}] -> {p if p != NO_PARENT else '-'} "
                         f"({OpPatternKind(k).name}, depth {d})"
                         for i, (p, k, d) in enumerate(zip(self.parent, self.pattern,
                                                           self.depth)))

