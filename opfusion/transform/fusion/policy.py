"""The policy API: pass contexts, the fuse helper, policy base classes and their registry.

A policy is a small class with ``__call__(ctx)`` and ``benefit()``. It looks at the groups the
context offers and calls ``ctx.mark_fusible(a, b)`` for pairs it wants fused; the engine does
the rest. Policies of higher benefit run (and have their marks merged) first. Example — a
policy that fuses any two groups of one elementwise op each when one feeds the other::

    class FuseTinyPairs(VerticalFusePass):
        def benefit(self) -> int:
            return 50

        def __call__(self, ctx: LightwareFusePassCtx) -> None:
            producer = ctx.pick_op_group()
            for consumer in producer.consumers:
                if producer.num_ops == consumer.num_ops == 1 and \\
                        not ctx.fuse_helper.detect_cycle_if_fuse(producer, consumer):
                    ctx.mark_fusible(producer, consumer)

    register_fusion_policy(FuseTinyPairs())
"""

from __future__ import annotations

from typing import NamedTuple

from ...errors import OpfusionError
from ...ir.op import OpPatternKind
from .engine import FusionState
from .views import OpGroup, TensorNode

K = OpPatternKind


class FusionMark(NamedTuple):
    """One request from a policy: fuse ``first`` and ``second`` (``recompute``: copy
    ``first`` into ``second``), made by ``policy``."""

    first: OpGroup
    second: OpGroup
    policy: str
    recompute: bool = False


class FuseHelper:
    """Questions policies ask about a pair of groups; answers reflect the current grouping."""

    def __init__(self, state: FusionState) -> None:
        self._state = state

    def detect_cycle_if_fuse(self, first: OpGroup, second: OpGroup) -> bool:
        """True if fusing the two groups would make a cycle between groups."""
        return self._state.would_create_cycle(first._group, second._group)

    def exceeds_limits(self, first: OpGroup, second: OpGroup) -> bool:
        """True if the fused group would break ``FuseOps.max_depth`` or
        ``FuseOps.max_function_args``."""
        return self._state.limit_violation(first._group, second._group) is not None

    def output_numel(self, group: OpGroup) -> int:
        """Elements the group writes for its largest output."""
        return self._state.output_numel(group._group)

    def same_size(self, first: OpGroup, second: OpGroup) -> bool:
        """True when both groups write outputs of the same number of elements."""
        return self.output_numel(first) == self.output_numel(second)

    @staticmethod
    def is_elementwise_like(group: OpGroup) -> bool:
        """Elementwise, broadcast or injective: cheap to inline, recompute or run side by
        side."""
        return group.kind <= K.kInjective

    def can_fuse_vertically(self, producer: OpGroup, consumer: OpGroup) -> bool:
        """The by-kind rule for putting a producer in its consumer's kernel:

        * elementwise/broadcast/injective producers go into anything up to a reduction (not
          into conv2d/dense, which read each input element many times);
        * a reduction or a conv2d/dense takes an elementwise or broadcast epilogue of its own
          size;
        * opaque groups fuse with nothing."""
        if K.kOpaque in (producer.kind, consumer.kind):
            return False
        if producer.kind <= K.kInjective:
            return consumer.kind <= K.kCommReduce
        if producer.kind in (K.kCommReduce, K.kOutEWiseFusable):
            return consumer.kind <= K.kBroadcast and self.same_size(producer, consumer)
        return False

    def can_fuse_horizontally(self, first: OpGroup, second: OpGroup) -> bool:
        """Two independent groups can share a kernel when both are elementwise-like and
        write the same number of elements (one loop nest covers both)."""
        return (self.is_elementwise_like(first) and self.is_elementwise_like(second)
                and self.same_size(first, second))


class _MarkingCtx:
    def __init__(self, state: FusionState, policy: str, marks: list[FusionMark]) -> None:
        self._state = state
        self._policy = policy
        self._marks = marks
        self.fuse_helper = state.helper

    _recompute = False

    def mark_fusible(self, first: OpGroup, second: OpGroup) -> None:
        """Ask the engine to fuse ``first`` and ``second`` (applied after all policies ran)."""
        if not isinstance(first, OpGroup) or not isinstance(second, OpGroup):
            raise OpfusionError(f"policy {self._policy}: mark_fusible takes two OpGroups, got "
                                f"{type(first).__name__} and {type(second).__name__}")
        self._marks.append(FusionMark(first, second, self._policy, self._recompute))


class LightwareFusePassCtx(_MarkingCtx):
    """The context of vertical, horizontal and recompute policies: one group at a time."""

    def __init__(self, state: FusionState, group: OpGroup, policy: str,
                 marks: list[FusionMark], recompute: bool = False) -> None:
        super().__init__(state, policy, marks)
        self._group = group
        self._recompute = recompute

    def pick_op_group(self) -> OpGroup:
        """The group this policy run is about."""
        return self._group


class InputFusePassCtx(_MarkingCtx):
    """The context of input-fusion policies: the consumers of one graph input at a time."""

    def __init__(self, state: FusionState, tensor: TensorNode, consumers: tuple[OpGroup, ...],
                 policy: str, marks: list[FusionMark]) -> None:
        super().__init__(state, policy, marks)
        self._tensor = tensor
        self._consumers = consumers

    def input_tensor(self) -> TensorNode:
        """The graph input whose consumers are offered."""
        return self._tensor

    def pick_consumers_with_same_inputs(self) -> tuple[OpGroup, ...]:
        """The groups that read this graph input, in topological order."""
        return self._consumers


# ---------------------------------------------------------------------------------------------
# policy base classes


class FusePolicy:
    """Base of all policies. Override ``__call__(ctx)``; ``benefit()`` orders policies
    (higher first)."""

    context: str = "lightware"

    def benefit(self) -> int:
        return 0

    def __call__(self, ctx: LightwareFusePassCtx | InputFusePassCtx) -> None:
        raise NotImplementedError

    @property
    def name(self) -> str:
        return type(self).__name__


class VerticalFusePass(FusePolicy):
    """Fuse a producer group with its consumer group."""


class HorizontalFusePass(FusePolicy):
    """Fuse sibling groups (consumers of one producer) into one kernel with several
    outputs."""


class RecomputeFusePass(FusePolicy):
    """Copy a cheap producer into every consumer; marks (producer, consumer) pairs and the
    engine copies only when every consumer was marked."""


class InputFusePass(FusePolicy):
    """Fuse groups that read the same graph input."""

    context = "input"


# ---------------------------------------------------------------------------------------------
# default policies


class DefaultVerticalFusePass(VerticalFusePass):
    """A producer whose only consumer can take it by kind (see
    :meth:`FuseHelper.can_fuse_vertically`) is fused into that consumer."""

    def benefit(self) -> int:
        return 40

    def __call__(self, ctx: LightwareFusePassCtx) -> None:
        producer = ctx.pick_op_group()
        consumers = producer.consumers
        if len(consumers) != 1 or not ctx.fuse_helper.can_fuse_vertically(producer,
                                                                            consumers[0]):
            return
        if any(t.is_result for t in producer.outputs):
            return  # the producer also writes a function result; keep it a kernel of its own
        ctx.mark_fusible(producer, consumers[0])


class DefaultRecomputeFusePass(RecomputeFusePass):
    """An elementwise producer of at most four ops feeding several consumers, each of which
    could take it vertically and at least one of which is more than elementwise (a
    reduction, say), is copied into all of them: recomputing a few cheap ops beats writing
    and re-reading the tensor. (Consumers that are all elementwise-like are better joined by
    horizontal fusion, which computes the producer once.)"""

    max_ops = 4

    def benefit(self) -> int:
        return 30

    def __call__(self, ctx: LightwareFusePassCtx) -> None:
        producer = ctx.pick_op_group()
        consumers = producer.consumers
        if len(consumers) < 2 or producer.kind > K.kBroadcast or \
                producer.num_ops > self.max_ops:
            return
        helper = ctx.fuse_helper
        if all(helper.is_elementwise_like(c) for c in consumers):
            return
        if all(helper.can_fuse_vertically(producer, c) for c in consumers):
            for consumer in consumers:
                ctx.mark_fusible(producer, consumer)


class DefaultHorizontalFusePass(HorizontalFusePass):
    """Consumers of one producer that are elementwise-like and of the same size are fused
    pairwise, unless that would make a cycle."""

    def benefit(self) -> int:
        return 20

    def __call__(self, ctx: LightwareFusePassCtx) -> None:
        consumers = ctx.pick_op_group().consumers
        _mark_compatible_pairs(ctx, consumers)


class DefaultInputFusePass(InputFusePass):
    """Groups that read the same graph input, are elementwise-like and of the same size are
    fused, unless that would make a cycle."""

    def benefit(self) -> int:
        return 10

    def __call__(self, ctx: InputFusePassCtx) -> None:
        _mark_compatible_pairs(ctx, ctx.pick_consumers_with_same_inputs())


def _mark_compatible_pairs(ctx: LightwareFusePassCtx | InputFusePassCtx,
                           groups: tuple[OpGroup, ...]) -> None:
    """Mark each group with the first later group it can run beside (pairs chain up)."""
    helper = ctx.fuse_helper
    for i, first in enumerate(groups):
        for second in groups[i + 1:]:
            if helper.can_fuse_horizontally(first, second) and \
                    not helper.detect_cycle_if_fuse(first, second):
                ctx.mark_fusible(first, second)
                break


# ---------------------------------------------------------------------------------------------
# registry


_REGISTRY: list[tuple[int, int, FusePolicy]] = []


def register_fusion_policy(policy: FusePolicy, priority: int | None = None) -> FusePolicy:
    """Add ``policy`` to the defaults of :func:`FusionMerge` (``priority`` overrides its
    ``benefit()``; higher runs first, ties in registration order). Returns the policy."""
    if not isinstance(policy, FusePolicy):
        raise OpfusionError(f"register_fusion_policy takes a FusePolicy instance, got "
                            f"{type(policy).__name__}; subclass VerticalFusePass, "
                            f"HorizontalFusePass, RecomputeFusePass or InputFusePass")
    rank = policy.benefit() if priority is None else priority
    _REGISTRY.append((rank, len(_REGISTRY), policy))
    return policy


def unregister_fusion_policy(policy: FusePolicy | type[FusePolicy]) -> None:
    """Remove a registered policy, or every registered instance of a policy class (to
    replace a default: ``unregister_fusion_policy(DefaultVerticalFusePass)``)."""
    if isinstance(policy, type):
        _REGISTRY[:] = [entry for entry in _REGISTRY if type(entry[2]) is not policy]
    else:
        _REGISTRY[:] = [entry for entry in _REGISTRY if entry[2] is not policy]


def registered_policies() -> list[FusePolicy]:
    """The registered policies, highest priority first."""
    return [entry[2] for entry in sorted(_REGISTRY, key=lambda e: (-e[0], e[1]))]


def order_policies(policies: list[FusePolicy]) -> list[FusePolicy]:
    """``policies`` sorted by benefit, highest first (stable)."""
    return sorted(policies, key=lambda p: -p.benefit())


for _default in (DefaultVerticalFusePass(), DefaultRecomputeFusePass(),
                 DefaultHorizontalFusePass(), DefaultInputFusePass()):
    register_fusion_policy(_default)
