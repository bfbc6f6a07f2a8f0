"""The analysis behind FuseOps (TVM's operator fusion, seed 000), one step per module:

* :mod:`.graph` — the indexed forward graph of a function body;
* :mod:`.dominator` — its post-dominator tree;
* :mod:`.partition` — the three-phase partition into fusion groups (and the FuseOps
  configuration keys);
* :mod:`.group` — the ``Group`` record FuseOps and FusionMerge share;
* :mod:`.primitive` — the builder of primitive functions FuseOps and FusionMerge share;
* :mod:`.check` — checks that a partition can be lowered (no cycle between groups);
* :mod:`.explain` — why an edge was not fused, in words;
* :mod:`.dot` — the groups drawn with Graphviz.

The pass itself, which turns groups into primitive functions, is
:mod:`opfusion.transform.fuse_ops`."""

from .check import InvalidFusionError, check_fused_function, check_fused_module, check_fusion_plan
from .dominator import PostDominatorTree
from .dot import fusion_to_dot, render_fusion_svg
from .explain import FusionRefusal, FusionReport, explain_fusion
from .graph import IndexedForwardGraph, build_forward_graph
from .partition import FuseOptions, FusionGroup, FusionPlan, GraphPartitioner, plan_fusion

__all__ = [
    "FuseOptions", "FusionGroup", "FusionPlan", "FusionRefusal", "FusionReport",
    "GraphPartitioner", "IndexedForwardGraph", "InvalidFusionError", "PostDominatorTree",
    "build_forward_graph", "check_fused_function", "check_fused_module", "check_fusion_plan",
    "explain_fusion", "fusion_to_dot", "plan_fusion", "render_fusion_svg",
]
