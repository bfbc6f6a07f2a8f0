"""The graph partitioner: TVM's three-phase fusion over the post-dominator tree (seed 000).

Every node starts in a group of its own (a union-find set that knows its root node, pattern,
anchor, size and argument count). Each phase visits the nodes producers-first and tries to
merge a node's group into the group of its immediate post-dominator. A merge is allowed when
every node on every path between the two satisfies the rule of the node's kind (CheckPath),
and it then takes all of those nodes along (CommitFuse), so no value escapes a group halfway:

* phase 0 — a kOutEWiseFusable op (conv2d, dense, pooling) fuses into its post-dominator when
  the way there is elementwise and every node on it is at most kBroadcast;
* every phase — a kElemWise or kBroadcast op fuses into a post-dominator reached through
  injective or reduction edges, when every intermediate is at most kInjective (the
  post-dominator itself may be anything up to kOutEWiseFusable);
* phase 1 — kInjective ops and tuples fuse into an injective post-dominator along an
  injective path (deferred so that phase 0 has finished growing the conv2d groups);
* phase 2 — injective ops fuse into a tuple that phase 1 already fused into injective
  consumers (concatenate's inputs join the concatenate).

kCommReduce ops end their group and kOpaque nodes stay alone. Two limits from the pass
context bound a group: ``FuseOps.max_depth`` ops and ``FuseOps.max_function_args`` arguments
(TVM's argument counting, including its postponed fusions, is reproduced).

With ``explain=True`` the partitioner records, per node, the rule that last refused to fuse
it; :mod:`.explain` turns those records into sentences."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...errors import OpfusionError
from ...ir.expr import Call, Expr, Function, Tuple, TupleGetItem, Var
from ...ir.infer import infer_type
from ...ir.module import IRModule
from ...ir.op import Op, OpPatternKind
from ...ir.types import TupleType, Type
from ..context import PassContext, register_pass_config
from .dominator import NO_PARENT, PostDominatorTree
from .graph import (
    BROADCAST,
    COMM_REDUCE,
    ELEMWISE,
    INJECTIVE,
    OPAQUE,
    OUT_EWISE_FUSABLE,
    TUPLE,
    IndexedForwardGraph,
    build_forward_graph,
)
from .group import Group

#: TVM's default bound on the number of ops in one fused function.
DEFAULT_MAX_DEPTH = 256

register_pass_config(
    "FuseOps.max_depth", int, DEFAULT_MAX_DEPTH,
    "FuseOps: the most operators one fused group may hold (TVM's kMaxFusedOps).")
register_pass_config(
    "FuseOps.max_function_args", int, 0,
    "FuseOps: the most tensor arguments a fused function may take, its outputs included "
    "(a tuple argument counts its fields); 0 means no limit.")
register_pass_config(
    "FuseOps.link_params", bool, False,
    "FuseOps: keep constants inside the fused functions instead of passing them as "
    "parameters.")


@dataclass(frozen=True)
class FuseOptions:
    """What one FuseOps run is allowed to do."""

    opt_level: int = 2
    max_depth: int = DEFAULT_MAX_DEPTH
    max_function_args: int = 0
    link_params: bool = False

    @staticmethod
    def from_context(ctx: PassContext | None = None, fuse_opt_level: int = -1) -> FuseOptions:
        """The options in ``ctx`` (default: the current context); ``fuse_opt_level`` -1 takes
        the context's opt_level."""
        ctx = ctx or PassContext.current()
        if not isinstance(fuse_opt_level, int) or fuse_opt_level < -1:
            raise OpfusionError(f"FuseOps fuse_opt_level must be an int >= -1 (-1: the pass "
                                f"context's opt_level), got {fuse_opt_level!r}")
        options = FuseOptions(
            opt_level=ctx.opt_level if fuse_opt_level == -1 else fuse_opt_level,
            max_depth=ctx.get_config("FuseOps.max_depth"),
            max_function_args=ctx.get_config("FuseOps.max_function_args"),
            link_params=ctx.get_config("FuseOps.link_params"))
        if options.max_depth < 0 or options.max_function_args < 0:
            raise OpfusionError(f"FuseOps.max_depth and FuseOps.max_function_args must be >= 0,"
                                f" got {options.max_depth} and {options.max_function_args}")
        return options


@dataclass
class Refusal:
    """Why the partitioner last refused to fuse a node into its post-dominator."""

    #: The refused node's index and the phase that last refused it.
    node: int
    phase: int
    #: "max_depth", "max_function_args", "postponed-anchor", "path", "sink",
    #: "dominator-pattern", "dominator-is-tuple", "tuple-root", "tuple-unfused" or
    #: "reduction".
    rule: str
    #: The post-dominator's node index.
    dominator: int
    #: The kind of the node's group when refused.
    kind: int
    #: The offending node on the path ("path"/"sink"), its group's kind and the most the rule
    #: allows there; or the count and the limit ("max_depth", "max_function_args").
    blocker: int = -1
    blocker_kind: int = OPAQUE
    allowed: int = OPAQUE
    count: int = 0
    limit: int = 0


@dataclass(frozen=True)
class _Rule:
    """A fusion rule's condition: the most any node on the way may be, and the most the
    post-dominator (the sink) may be."""

    path_max: int
    sink_max: int


_OUT_EWISE_RULE = _Rule(path_max=BROADCAST, sink_max=BROADCAST)
_ELEMWISE_RULE = _Rule(path_max=INJECTIVE, sink_max=OUT_EWISE_FUSABLE)
_INJECTIVE_RULE = _Rule(path_max=INJECTIVE, sink_max=INJECTIVE)


class GraphPartitioner:
    """Partition an indexed forward graph into fusion groups (see the module docstring)."""

    def __init__(self, graph: IndexedForwardGraph, options: FuseOptions,
                 explain: bool = False) -> None:
        self.graph = graph
        self.options = options
        self.groups: list[Group] = []
        self.tree: PostDominatorTree | None = None
        self.refusals: dict[int, Refusal] | None = {} if explain else None
        size = len(graph)
        # Fusions waiting, under max_function_args, until a consumer's arguments are known.
        self._postponed: dict[int, list[int]] = {}
        self._postpone_node = -1
        # Group sizes only grow, so a node once over max_depth stays over it.
        self._over_depth = bytearray(size)
        self._region_bound: list[int] = []
        self._phase = 0

    # -- driver ----------------------------------------------------------------------------
    def partition(self) -> list[Group]:
        """Run the three phases; ``groups[i]`` is node i's group (call ``find_root``)."""
        self._init_groups()
        if self.options.opt_level == 0:
            return self.groups
        self.tree = PostDominatorTree(self.graph)
        self._region_bound = self._bound_regions()
        for phase in range(3):
            self._phase = phase
            self._run_phase(phase)
        return self.groups

    def _init_groups(self) -> None:
        for node in self.graph.nodes:
            self.groups.append(Group(node.pattern, root=node.index,
                                     args_num=_initial_args(node.ref)))

    def _run_phase(self, phase: int) -> None:
        assert self.tree is not None
        groups, dom_parent, dom_pattern = self.groups, self.tree.parent, self.tree.pattern
        postponed = self._postponed
        for nid in range(len(groups)):
            group = groups[nid]
            self._postpone_node = -1
            if postponed and nid in postponed:
                self._fuse_postponed(nid, postponed.pop(nid))
            if group.pattern == OPAQUE:
                continue
            dom = dom_parent[nid]
            if dom == NO_PARENT:
                continue
            if phase == 2:
                self._fuse_into_tuple(nid, dom)
                continue
            dom_group = groups[dom]
            if group.find_root() is dom_group.find_root():
                continue
            kind = group.pattern
            if dom_group.pattern == TUPLE:
                # Tuple fields wait for phase 2 (tuples themselves fuse in phase 1).
                self._refuse(nid, "dominator-is-tuple", dom, kind)
                continue
            if kind == OUT_EWISE_FUSABLE:
                if phase != 0:
                    continue
                if dom_pattern[nid] != ELEMWISE:
                    self._refuse(nid, "dominator-pattern", dom, kind,
                                 blocker_kind=dom_pattern[nid], allowed=ELEMWISE)
                    continue
                self._try_fuse(nid, dom, _OUT_EWISE_RULE)
            elif kind <= BROADCAST:
                way = dom_pattern[nid]
                if not (way <= INJECTIVE or way == COMM_REDUCE):
                    self._refuse(nid, "dominator-pattern", dom, kind, blocker_kind=way,
                                 allowed=INJECTIVE)
                    continue
                self._try_fuse(nid, dom, _ELEMWISE_RULE)
            elif kind in (INJECTIVE, TUPLE):
                if phase == 1:
                    self._try_fuse(nid, dom, _INJECTIVE_RULE)
            else:
                assert kind == COMM_REDUCE, kind
                self._refuse(nid, "reduction", dom, kind)

    def _fuse_into_tuple(self, nid: int, dom: int) -> None:
        """Phase 2: an injective node joins the tuple it feeds, when that tuple was already
        fused into injective consumers."""
        group = self.groups[nid]
        if group.pattern > INJECTIVE:
            return
        dom_group = self.groups[dom]
        dom_root = dom_group.find_root()
        if dom_group.pattern != TUPLE or group.find_root() is dom_root:
            return
        if dom_root.pattern == TUPLE:
            self._refuse(nid, "tuple-root", dom, group.pattern)
        elif dom_root.pattern > INJECTIVE:
            self._refuse(nid, "tuple-unfused", dom, group.pattern, blocker=dom_root.root,
                         blocker_kind=dom_root.pattern, allowed=INJECTIVE)
        else:
            self._try_fuse(nid, dom, _INJECTIVE_RULE)

    def _try_fuse(self, src: int, sink: int, rule: _Rule) -> None:
        """Fuse ``src`` into its post-dominator ``sink`` if the limits and the rule allow."""
        kind = self.groups[src].pattern
        total = self._fused_size(src, sink)
        if total > self.options.max_depth:
            self._refuse(src, "max_depth", sink, kind, count=total, limit=self.options.max_depth)
            return
        if self.options.max_function_args > 0:
            limit = self._args_limit(src)
            if limit > 0:
                count = self._fused_args(src)
                if count > limit:
                    self._refuse(src, "max_function_args", sink, kind, count=count, limit=limit)
                    return
        blocker = self._check_path(src, sink, rule)
        if blocker >= 0:
            blocker_kind = self.groups[blocker].find_root().pattern
            self._refuse(src, "sink" if blocker == sink else "path", sink, kind,
                         blocker=blocker, blocker_kind=blocker_kind,
                         allowed=rule.sink_max if blocker == sink else rule.path_max)
            return
        self._commit_fuse(src, sink)

    def _refuse(self, nid: int, rule: str, dom: int, kind: int, **details: int) -> None:
        if self.refusals is not None:
            self.refusals[nid] = Refusal(nid, self._phase, rule, dom, kind, **details)

    # -- CheckPath / CommitFuse ------------------------------------------------------------
    def _region(self, src: int, sink: int) -> list[int]:
        """``src`` and every node reachable from it before ``sink`` (all of them lie between
        the two, because ``sink`` post-dominates ``src``), depth-first in edge order."""
        nodes = self.graph.nodes
        order: list[int] = []
        seen = {src}
        stack = [src]
        while stack:
            index = stack.pop()
            order.append(index)
            for edge in reversed(nodes[index].outputs):
                target = edge.node.index
                if target != sink and target not in seen:
                    seen.add(target)
                    stack.append(target)
        return order

    def _check_path(self, src: int, sink: int, rule: _Rule) -> int:
        """-1 if every node between ``src`` and ``sink`` (and ``sink`` itself) satisfies
        ``rule`` by its group's kind; else the first node that does not."""
        groups = self.groups
        if groups[sink].find_root().pattern > rule.sink_max:
            return sink
        for index in self._region(src, sink)[1:]:  # src itself is not checked
            if groups[index].find_root().pattern > rule.path_max:
                return index
        return -1

    def _commit_fuse(self, src: int, sink: int) -> None:
        """Merge ``src`` and everything between it and ``sink`` into ``sink``'s group (or, when
        an argument count is still open, remember the fusion for later)."""
        if self._postpone_node >= 0:
            self._postponed.setdefault(self._postpone_node, []).append(src)
            return
        target = self.groups[sink]
        refusals = self.refusals
        for index in self._region(src, sink):
            _merge(self.groups[index], target)
            if refusals:
                refusals.pop(index, None)  # an earlier phase's refusal no longer holds

    def _fuse_postponed(self, nid: int, sources: list[int]) -> None:
        """Commit the fusions that waited for ``nid``'s argument count, while it fits."""
        assert self.tree is not None
        for src in sources:
            sink, kind = self.tree.parent[src], self.groups[src].pattern
            count, limit = self._count_args(nid, update_postpone=False), self._args_limit(nid)
            if count > limit:
                self._refuse(src, "max_function_args", sink, kind, count=count, limit=limit)
            elif self.groups[sink].anchor >= 0:
                self._refuse(src, "postponed-anchor", sink, kind, blocker=nid)
            else:
                self._commit_fuse(src, sink)

    # -- max_depth -------------------------------------------------------------------------
    def _fused_size(self, src: int, sink: int) -> int:
        """The number of ops the group would hold after the fusion (TVM's count: the sink's
        group, plus the recorded size of every node's group between ``src`` and ``sink``).
        Once the count is over ``max_depth`` it stops early and returns ``max_depth + 1``."""
        max_depth = self.options.max_depth
        if self._over_depth[src] or self._region_bound[src] >= max_depth:
            self._over_depth[src] = 1
            return max_depth + 1
        groups = self.groups
        total = groups[sink].find_root().num_nodes
        for index in self._region(src, sink):
            total += groups[index].num_nodes
        if total > max_depth:
            self._over_depth[src] = 1
        return total

    def _bound_regions(self) -> list[int]:
        """For each node, the number of nodes between it and its post-dominator (itself
        included), capped at ``max_depth``.

        A node whose region already holds ``max_depth`` nodes can never be fused (its count is
        at least one more than that), and most such nodes are found in O(1): a node's region
        contains the region of every node inside it, so one consumer whose region is full is
        enough. This keeps wide graphs, whose post-dominators lie far away, linear."""
        assert self.tree is not None
        cap = self.options.max_depth
        nodes, parents = self.graph.nodes, self.tree.parent
        bound = [0] * len(nodes)
        for src in range(len(nodes) - 1, -1, -1):
            sink = parents[src]
            if sink == NO_PARENT:
                continue
            full = False
            for edge in nodes[src].outputs:  # the O(1) case, without a walk
                target = edge.node.index
                if target != sink and bound[target] + 1 >= cap:
                    full = True
                    break
            if full:
                bound[src] = cap
                continue
            count, seen, stack = 0, {src}, [src]
            while stack and count < cap:
                index = stack.pop()
                count += 1
                for edge in nodes[index].outputs:
                    target = edge.node.index
                    if target == sink or target in seen:
                        continue
                    if bound[target] + 1 >= cap:
                        count = cap
                        break
                    seen.add(target)
                    stack.append(target)
            bound[src] = min(count, cap)
        return bound

    # -- max_function_args -----------------------------------------------------------------
    def _args_limit(self, nid: int) -> int:
        """The argument budget left once the node's outputs are passed (TVM counts one
        argument per output edge)."""
        outputs = len(self.graph.nodes[nid].outputs)
        return max(self.options.max_function_args - outputs, 0)

    def _fused_args(self, nid: int) -> int:
        """The most arguments any consumer's group would take with this node fused in."""
        return max((self._count_args(edge.node.index, update_postpone=True)
                    for edge in self.graph.nodes[nid].outputs), default=0)

    def _arg_terms(self, nid: int) -> list[tuple[int, int]]:
        """The node's own group count, then per distinct producing group of its operands:
        ``(count, -1)`` when that group knows its count, ``(0, producer)`` when it does not."""
        groups, node_map = self.groups, self.graph.node_map
        group = groups[nid]
        terms = [(group.args_num, -1)]
        seen = {group.find_root()}  # membership only: never iterated
        for arg in _operands(self.graph.nodes[nid].ref):
            if isinstance(arg, Var):
                continue
            producer = node_map[arg].index
            root = groups[producer].find_root()
            if root in seen:
                continue
            seen.add(root)
            terms.append((root.args_num, -1) if root.args_num > 0 else (0, producer))
        return terms

    def _count_args(self, nid: int, update_postpone: bool) -> int:
        """TVM's CountArgs_: the arguments of the group ``nid`` would be in. A producer whose
        group has no count yet either postpones the fusion (``update_postpone``) or is
        counted through, recursively in TVM and with an explicit stack here."""
        if update_postpone:
            total = 0
            for count, producer in self._arg_terms(nid):
                total += count
                if producer >= 0:
                    self._postpone_node = nid
            return total
        counted: dict[int, int] = {}
        stack = [nid]
        while stack:
            index = stack[-1]
            if index in counted:
                stack.pop()
                continue
            terms = self._arg_terms(index)
            missing = [p for _, p in terms if p >= 0 and p not in counted]
            if missing:
                stack.extend(missing)
                continue
            counted[index] = sum(count if p < 0 else counted[p] for count, p in terms)
            stack.pop()
        return counted[nid]


def _merge(child: Group, parent: Group) -> None:
    """Merge ``child``'s set into ``parent``'s (TVM's MergeFromTo)."""
    child, parent = child.find_root(), parent.find_root()
    if child is parent:
        return
    parent.num_nodes += child.num_nodes
    parent.args_num += child.args_num
    child.parent = parent
    if child.anchor >= 0:
        assert parent.anchor < 0, "two kOutEWiseFusable anchors in one group"
        assert child.pattern <= BROADCAST or parent.pattern <= BROADCAST, (
            "cannot merge two complex groups")
        parent.anchor = child.anchor
        parent.pattern = max(child.pattern, parent.pattern)


def _operands(expr: Expr) -> tuple[Expr, ...]:
    if isinstance(expr, Call):
        return expr.args
    if isinstance(expr, Tuple):
        return expr.fields
    return ()


def _tensor_count(ty: Type) -> int:
    """Tensors a value of type ``ty`` is passed as: one, or one per field of a tuple."""
    if isinstance(ty, TupleType):
        return sum(_tensor_count(field) for field in ty.fields)
    return 1


def _initial_args(expr: Expr) -> int:
    """TVM's initial argument count of a node: its variable and tuple-field operands (a
    variable counts itself)."""
    if isinstance(expr, Var):
        return _tensor_count(expr.checked_type)
    count = 0
    for arg in _operands(expr):
        if isinstance(arg, Var):
            count += _tensor_count(arg.checked_type)
        elif isinstance(arg, TupleGetItem):
            count += 1
    return count


# ---------------------------------------------------------------------------------------------
# the result


@dataclass(frozen=True)
class FusionGroup:
    """One fused group: the nodes it holds (producers first), the node whose value it returns,
    its pattern kind and its anchor (the kOutEWiseFusable op it is built around, if any)."""

    root: Expr
    nodes: tuple[Expr, ...]
    pattern: OpPatternKind
    anchor: Expr | None

    @property
    def num_ops(self) -> int:
        """Operator calls in the group."""
        return sum(1 for node in self.nodes if isinstance(node, Call) and isinstance(node.op, Op))

    @property
    def is_fused_function(self) -> bool:
        """Whether FuseOps turns the group into a primitive function (it computes something:
        an operator call, or a tuple access fused with its tuple)."""
        root = self.root
        if isinstance(root, Call):
            return isinstance(root.op, Op)
        return isinstance(root, TupleGetItem) and len(self.nodes) > 1


@dataclass
class FusionPlan:
    """The partition of one function: its graph, post-dominator tree (None at opt_level 0),
    the root node of every node's group, and (when explained) the refusals."""

    func: Function
    options: FuseOptions
    graph: IndexedForwardGraph
    tree: PostDominatorTree | None
    #: ``root_of[i]``: index of the root node of node i's group.
    root_of: list[int]
    #: Root index -> pattern kind and anchor index (-1 for none) of that group.
    group_pattern: dict[int, int]
    group_anchor: dict[int, int]
    refusals: dict[int, Refusal] = field(default_factory=dict)

    def group_root(self, expr: Expr) -> Expr:
        """The root node of the group holding ``expr``."""
        return self.graph.nodes[self.root_of[self.graph.node(expr).index]].ref

    def groups(self) -> list[FusionGroup]:
        """Every group (single nodes too), ordered by root."""
        members: dict[int, list[Expr]] = {}
        for node in self.graph.nodes:
            members.setdefault(self.root_of[node.index], []).append(node.ref)
        nodes = self.graph.nodes
        out = []
        for root in sorted(members):
            anchor = self.group_anchor[root]
            out.append(FusionGroup(nodes[root].ref, tuple(members[root]),
                                   OpPatternKind(self.group_pattern[root]),
                                   nodes[anchor].ref if anchor >= 0 else None))
        return out

    def fused_groups(self) -> list[FusionGroup]:
        """The groups FuseOps turns into primitive functions."""
        return [group for group in self.groups() if group.is_fused_function]


def plan_fusion(func: Function, options: FuseOptions | None = None, explain: bool = False,
                mod: IRModule | None = None) -> FusionPlan:
    """Partition ``func``'s body as FuseOps would (``options`` default: the current pass
    context's). With ``explain`` the plan records why nodes were not fused; ``mod`` resolves
    calls of global functions for type inference."""
    options = options or FuseOptions.from_context()
    infer_type(func, mod)
    graph = build_forward_graph(func)
    partitioner = GraphPartitioner(graph, options, explain=explain)
    groups = partitioner.partition()
    roots = [group.find_root() for group in groups]
    return FusionPlan(
        func=func, options=options, graph=graph, tree=partitioner.tree,
        root_of=[root.root for root in roots],
        group_pattern={root.root: root.pattern for root in roots},
        group_anchor={root.root: root.anchor for root in roots},
        refusals=partitioner.refusals or {})
