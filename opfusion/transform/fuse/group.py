"""Group: a set of graph nodes that becomes the body of one primitive function (one kernel).

One class for both fusion passes. Each records the group's ``pattern`` (its least fusable
pattern kind) and its members; each grows groups its own way:

* FuseOps' partitioner (:mod:`.partition`, TVM's GraphPartitioner) keeps union-find sets:
  ``parent`` and :meth:`Group.find_root`, the ``root`` node whose value the group returns, the
  ``anchor`` (its kOutEWiseFusable node, or -1), ``num_nodes`` and ``args_num``. Only a set's
  root holds current values; a merged child keeps what it had when it was merged (TVM reads
  some of those stale values, and so does the port).
* FusionMerge's engine (:mod:`opfusion.transform.fusion.engine`) keeps explicit members and
  edges: ``uid``, the member ``nodes``, a topological position ``pos``, ``producers`` and
  ``consumers``, whether it is ``alive`` (not merged away), and caches."""

from __future__ import annotations

from ...ir.op import OpPatternKind

OUT_EWISE_FUSABLE = int(OpPatternKind.kOutEWiseFusable)


class Group:
    """A fusion group (see the module docstring for which pass uses which fields)."""

    __slots__ = (
        # both passes
        "pattern",
        # FuseOps' union-find sets
        "parent", "root", "anchor", "num_nodes", "args_num",
        # FusionMerge's engine
        "uid", "nodes", "pos", "producers", "consumers", "alive", "has_copies", "ordered",
        "outputs", "sorted_cache",
    )

    def __init__(self, pattern: int, root: int = -1, args_num: int = 0, uid: int = -1,
                 nodes: list[int] | None = None) -> None:
        #: The least fusable kind in the group (the anchor's kind once one joined).
        self.pattern = pattern
        self.parent: Group | None = None
        #: Index of the node whose value the group returns (FuseOps).
        self.root = root
        #: Index of the kOutEWiseFusable node the group is built around, or -1.
        self.anchor = root if pattern == OUT_EWISE_FUSABLE else -1
        self.num_nodes = 1
        self.args_num = args_num
        self.uid = uid
        #: Member node indices (FusionMerge; FuseOps finds them through ``find_root``).
        self.nodes: list[int] = nodes if nodes is not None else [root]
        self.pos = 0
        self.producers: dict[Group, None] = {}
        self.consumers: dict[Group, None] = {}
        self.alive = True
        self.has_copies = False  # holds nodes recomputed from another group
        self.ordered = True  # nodes sorted (merges append; sorted_nodes() sorts on demand)
        # Output tensors, computed on demand; only a change to the group itself changes them.
        self.outputs: list[int] | None = None
        # Producers/consumers sorted by position, cached for one version of the state.
        self.sorted_cache: tuple[int, list[Group], list[Group]] | None = None

    # -- FuseOps: union-find -----------------------------------------------------------------
    def find_root(self) -> Group:
        """The set's representative, compressing the path to it."""
        root = self
        while root.parent is not None:
            root = root.parent
        node = self
        while node.parent is not None and node.parent is not root:
            node.parent, node = root, node.parent
        return root

    # -- FusionMerge: explicit members -------------------------------------------------------
    def sorted_nodes(self) -> list[int]:
        """Member nodes in topological (index) order."""
        if not self.ordered:
            self.nodes.sort()
            self.ordered = True
        return self.nodes

    def __repr__(self) -> str:
        if self.uid >= 0:
            return f"Group({self.uid}, nodes={self.nodes})"
        return f"Group(root={self.root}, pattern={self.pattern}, num_nodes={self.num_nodes})"
