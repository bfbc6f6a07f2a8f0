"""Fusion with pluggable policies, in the style of Paddle CINN's group-fusion API.

Policies (small classes) look at read-only groups and mark pairs as fusible; the engine
(bookkeeping, cycle checks, FuseOps limits, merging, the fixed-point loop) does the rest.
:func:`FusionMerge` is the pass; :func:`register_fusion_policy` adds a policy to its
defaults. See docs/fusion.md for a worked custom policy."""

from .engine import FusionState
from .graph import FusionGraph
from .merge import FusionMerge, apply_marks, collect_marks, fuse_function, merge_groups
from .policy import (
    DefaultHorizontalFusePass,
    DefaultInputFusePass,
    DefaultRecomputeFusePass,
    DefaultVerticalFusePass,
    FuseHelper,
    FusePolicy,
    FusionMark,
    HorizontalFusePass,
    InputFusePass,
    InputFusePassCtx,
    LightwareFusePassCtx,
    RecomputeFusePass,
    VerticalFusePass,
    register_fusion_policy,
    registered_policies,
    unregister_fusion_policy,
)
from .rewrite import rewrite_groups
from .views import OpGroup, OpNode, Shape, TensorNode

__all__ = [
    "DefaultHorizontalFusePass", "DefaultInputFusePass", "DefaultRecomputeFusePass",
    "DefaultVerticalFusePass", "FuseHelper", "FusePolicy", "FusionGraph", "FusionMark",
    "FusionMerge", "FusionState", "HorizontalFusePass", "InputFusePass", "InputFusePassCtx",
    "LightwareFusePassCtx", "OpGroup", "OpNode", "RecomputeFusePass", "Shape", "TensorNode",
    "VerticalFusePass", "apply_marks", "collect_marks", "fuse_function", "merge_groups",
    "register_fusion_policy", "registered_policies", "rewrite_groups",
    "unregister_fusion_policy",
]
