"""Lowering: a te schedule becomes one PrimFunc of loops, loads, stores and temporaries.

The steps, in order:

1. *Inline*: the body of every ``compute_inline`` stage is substituted into its readers.
2. *Bound inference*: consumers first, each stage gets the region it must compute. A root
   stage computes its whole tensor; a stage attached with ``compute_at(P, v)`` computes the
   part that P reads while P's loops inside ``v`` sweep their ranges (``eval_interval`` of
   P's read indices), into a small "local" buffer indexed relative to the region's start.
3. *Loop nests*: the region's extents flow down the stage's Split/Fuse relations to the leaf
   loops; loop values flow back up to the axes. A split that does not divide its loop adds
   the guard ``parent < extent``; a stage computed at a consumer adds ``0 <= index < size``
   where that is not provable.
4. *Guards*: a guard linear in its innermost variable ``v`` narrows ``v``'s loop instead:
   ``c*v + rest < n`` shortens it (``extent = min(extent, ceil((n - rest) / c))``), a lower
   bound raises its start (``max(0, ...)``). So vectorized loops at the edge of a non-dividing
   split or of a padded region carry no per-element ``if``. Other guards become an ``if`` as
   far out as their variables allow.
5. *Reductions*: the accumulator is initialised to the identity by a loop nest over the data
   loops that sit inside the first reduction loop, placed just before that reduction loop.
6. *Simplify* (:mod:`.simplify`) and give every variable and buffer a unique C-safe name.

Attached stages are emitted inside their parent's loop, after its guards, wrapped in the
Allocate of their local buffer; intermediate root stages get an Allocate around the whole
body.

GPU schedules: a loop bound to a block or thread index keeps its full extent (a guard on it
stays an ``if``: a launch's size is a constant), and a stage with scope "shared" is computed
for the whole block: its region is relaxed over every loop bound to a thread index, and a
barrier comes before its computation (the previous iteration's readers are done) and after
it (its values are visible to every thread); shared stages computed one after another share
those barriers unless a later one reads an earlier one. Shared stages that ask for double
buffering (``Stage.double_buffer``), all those computed at a constant loop with no guard,
are pipelined over two buffers instead, and those that ask for async copies
(``Stage.async_pipeline``) over as many as they ask (:mod:`opfusion.tir.pipeline`). In a nest that
computes shared stages, guards go around the stores they protect rather than around loops,
which hold barriers every thread must reach.

Loop variables are int32 (int64 for a loop of 2**31 or more iterations)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import LoweringError, ScheduleError
from ..tir import expr as E
from ..tir import stmt as S
from ..tir.bound import Interval, eval_interval, union
from ..tir.pipeline import async_pipeline_loop, double_buffer_loop
from ..tir.simplify import (
    Ranges,
    const_bound,
    fresh_vars,
    linear_form,
    prove,
    simplify,
    simplify_stmt,
    structural_key,
    unroll_selecting_loops,
)
from .reduction import Reduce
from .schedule import Schedule, Split, Stage, split_extents
from .tensor import ComputeOp, IterVar, PlaceholderOp, Tensor, TensorLoad

_INT32_MAX = 2**31 - 1


@dataclass(eq=False)
class _StageInfo:
    """Everything lowering knows about one stored (not inlined) compute stage."""

    stage: Stage
    op: ComputeOp
    body: E.PrimExpr
    buffer: E.Buffer | None = None
    absolute: bool = True  # indexed by tensor coordinates (else relative to `offsets`)
    offsets: list[E.PrimExpr] = field(default_factory=list)
    extents: list[int] = field(default_factory=list)
    ext: dict[IterVar, int] = field(default_factory=dict)
    loop_vars: dict[IterVar, E.Var] = field(default_factory=dict)
    values: dict[IterVar, E.PrimExpr] = field(default_factory=dict)
    axis_values: dict[E.Var, E.PrimExpr] = field(default_factory=dict)
    conditions: list[tuple[E.PrimExpr, bool]] = field(default_factory=list)


def lower(sch: Schedule, args: Sequence[Tensor], name: str = "main") -> S.PrimFunc:
    """Lower a schedule to loop IR: a PrimFunc whose parameters are the buffers of ``args``
    (inputs and outputs, in order)."""
    if not isinstance(sch, Schedule):
        raise LoweringError(f"lower needs a te.Schedule, got {type(sch).__name__}")
    return _Lowering(sch, list(args), str(name)).run()


class _Lowering:
    def __init__(self, sch: Schedule, args: list[Tensor], name: str) -> None:
        self.sch = sch
        self.args = args
        self.name = name
        self.info: dict[Stage, _StageInfo] = {}
        self.arg_buffers: dict[Stage, E.Buffer] = {}
        self.ranges: Ranges = {}
        self.attached: dict[Stage, dict[int, list[Stage]]] = {}
        self.thread_vars: dict[E.Var, int] = {}  # loops bound to threadIdx: their extents

    # -- helpers ---------------------------------------------------------------------------------

    def stage_of(self, tensor: Tensor) -> Stage:
        stage = self.sch.stage_map.get(tensor.op)
        if stage is None:
            raise LoweringError(
                f"tensor {tensor.name} is not part of the schedule; create the schedule from "
                "outputs that read it"
            )
        return stage

    # -- main --------------------------------------------------------------------------------------

    def run(self) -> S.PrimFunc:
        self._bind_args()
        self._inline_bodies()
        self._check_inputs_and_outputs()
        self._check_attachments()
        for stage in reversed(self.sch.stages):
            if stage in self.info:
                self._infer_region(self.info[stage])
                self._derive_loops(self.info[stage])
        body = S.seq([self._emit(self.info[st], False) for st in self.sch.stages
                      if st in self.info and st.attach_type == "root"])
        if body is None:
            body = S.Evaluate(E.IntImm(0))
        for st in reversed(self.sch.stages):
            info = self.info.get(st)
            if info is not None and st.attach_type == "root" and st not in self.arg_buffers:
                assert info.buffer is not None
                body = S.Allocate(info.buffer, body)
        params = [self.arg_buffers[self._arg_key(t)] for t in self.args]
        simple = unroll_selecting_loops(simplify_stmt(body) or S.Evaluate(E.IntImm(0)))
        return _rename(S.PrimFunc(self.name, params, simple))

    def _bind_args(self) -> None:
        if not self.args:
            raise LoweringError("lower needs the list of argument tensors (inputs and outputs)")
        for i, t in enumerate(self.args):
            if not isinstance(t, Tensor):
                raise LoweringError(f"argument {i} of lower is {t!r}, not a te tensor")
            key = self._arg_key(t)
            if key in self.arg_buffers:
                raise LoweringError(f"tensor {t.name} appears twice in the arguments")
            self.arg_buffers[key] = E.Buffer(t.name, t.shape, t.dtype)

    def _arg_key(self, tensor: Tensor) -> Any:
        """The stage of an argument; an input that nothing reads (a placeholder outside the
        schedule, e.g. the unused bias of layer_norm(center=False)) is keyed by itself and
        becomes a parameter the kernel ignores."""
        if isinstance(tensor.op, PlaceholderOp) and tensor.op not in self.sch.stage_map:
            return tensor.op
        return self.stage_of(tensor)

    def _inline_bodies(self) -> None:
        for stage in self.sch.stages:
            op = stage.op
            if not isinstance(op, ComputeOp):
                continue
            if stage.attach_type == "inline":
                if stage in self.arg_buffers:
                    raise LoweringError(
                        f"stage {stage.name} is inlined (compute_inline) but also passed as an "
                        "argument; an inlined tensor is never stored, so compute_root it"
                    )
                continue
            self.info[stage] = _StageInfo(stage, op, self._expand_inline(op.body))

    def _expand_inline(self, root: E.PrimExpr) -> E.PrimExpr:
        """``root`` with every read of an inlined tensor replaced by that tensor's body.

        Iterative, and linear in the size of the result: a read ``X[idx]`` becomes X's own
        body with its axes bound to ``idx``, which is expanded in turn on the same stack (a
        chain of hundreds of inlined stages is never re-walked once per stage). Reads with
        the same indices share one expansion."""
        done: dict[int, E.PrimExpr] = {}
        alive: list[E.PrimExpr] = []  # keeps the ids in `done` valid
        shared: dict[tuple[Stage, object], E.PrimExpr] = {}
        # (node, state, expansion, key): state 0 = visit children, 1 = rebuild, 2 = the
        # expansion of an inlined read is ready
        stack: list[tuple[E.PrimExpr, int, E.PrimExpr | None, Any]] = [(root, 0, None, None)]
        while stack:
            node, state, expansion, key = stack.pop()
            if state == 2:
                assert expansion is not None
                done[id(node)] = shared[key] = done[id(expansion)]
                continue
            if id(node) in done:
                continue
            if state == 0:
                stack.append((node, 1, None, None))
                stack.extend((c, 0, None, None) for c in reversed(node.children())
                             if id(c) not in done)
                continue
            children = node.children()
            new = node.with_children([done[id(c)] for c in children]) if children else node
            alive.append(node)
            stage = self.stage_of(new.tensor) if isinstance(new, TensorLoad) else None
            if stage is None or stage.attach_type != "inline":
                done[id(node)] = new
                continue
            key = (stage, tuple(structural_key(i) for i in new.indices))
            hit = shared.get(key)
            if hit is not None:
                done[id(node)] = hit
                continue
            axes = stage.op.axis  # type: ignore[attr-defined]
            body = E.substitute(stage.op.body,  # type: ignore[attr-defined]
                                {a.var: i for a, i in zip(axes, new.indices)})
            alive.append(body)
            stack.append((node, 2, body, key))
            stack.append((body, 0, None, None))
        return done[id(root)]

    def _reads(self, info: _StageInfo) -> list[tuple[Stage, tuple[E.PrimExpr, ...]]]:
        return [(self.stage_of(n.tensor), n.indices) for n in E.post_order(info.body)
                if isinstance(n, TensorLoad)]

    def _check_inputs_and_outputs(self) -> None:
        self.consumers: dict[Stage, list[Stage]] = {}
        for info in self.info.values():
            for stage, _ in self._reads(info):
                readers = self.consumers.setdefault(stage, [])
                if info.stage not in readers:
                    readers.append(info.stage)
                if isinstance(stage.op, PlaceholderOp) and stage not in self.arg_buffers:
                    raise LoweringError(
                        f"placeholder {stage.name} is read by {info.stage.name} but is not in "
                        "the arguments of lower/build; add it to the argument list"
                    )
        for op in self.sch.outputs:
            stage = self.sch.stage_map[op]
            if stage not in self.arg_buffers:
                raise LoweringError(
                    f"output {stage.name} of the schedule is not in the arguments; add it so "
                    "that its values have somewhere to go"
                )

    def _check_attachments(self) -> None:
        for stage in self.sch.stages:
            info = self.info.get(stage)
            if info is None:
                continue
            leaves = stage.leaf_iter_vars
            for pos, leaf in enumerate(leaves):
                if stage.iter_var_attrs.get(leaf) == S.ForKind.PARALLEL:
                    inside = [v for v in leaves[:pos] if v.is_reduce]
                    if inside:
                        raise ScheduleError(
                            f"stage {stage.name}: the parallel loop {leaf.name} is inside the "
                            f"reduction loop {inside[0].name}; reorder it outward"
                        )
            if stage.attach_type != "scope":
                continue
            parent, ivar = stage.attach_stage, stage.attach_ivar
            assert parent is not None and ivar is not None
            if parent.attach_type == "inline":
                raise LoweringError(
                    f"stage {stage.name} is computed at a loop of {parent.name}, which is "
                    f"inlined; compute_at {stage.name} inside {parent.name}'s consumer instead"
                )
            pos = next((i for i, v in enumerate(parent.leaf_iter_vars) if v is ivar), -1)
            if pos < 0:
                raise LoweringError(
                    f"stage {stage.name} is computed at {parent.name}'s loop {ivar.name}, "
                    f"which is no longer a loop of {parent.name} (it was split or fused "
                    f"afterwards); its loops are "
                    f"{', '.join(v.name for v in parent.leaf_iter_vars)}; call compute_at again"
                )
            readers = self.consumers.get(stage, [])
            order = self.sch.stages.index(stage)
            others = [r.name for r in readers
                      if r is not parent and not self._sibling_after(r, parent, pos, order)]
            if others or not readers:
                raise LoweringError(
                    f"stage {stage.name} is computed at a loop of {parent.name}, but it is read "
                    f"by {', '.join(others) or 'nothing'} there too; only a stage read by its "
                    "attachment parent, or by stages computed after it at the same loop or "
                    "at a loop of that parent inside it, can be computed at it (compute_root "
                    "it)"
                )
            self.attached.setdefault(parent, {}).setdefault(pos, []).append(stage)

    def _sibling_after(self, reader: Stage, parent: Stage, pos: int, order: int) -> bool:
        """Whether ``reader`` is computed at ``parent``'s loop number ``pos`` or at one
        inside it, after the stage at position ``order`` of the schedule: it then reads what
        that stage wrote in the same iteration (softmax's exponentials, read by the row sum
        and the product; a depthwise task's padded rows, read by each register tile's sums,
        computed at the tile's loop so that the tile's epilogue follows them)."""
        if reader.attach_type != "scope" or reader.attach_stage is not parent \
                or self.sch.stages.index(reader) <= order:
            return False
        leaves = parent.leaf_iter_vars
        return any(v is reader.attach_ivar for v in leaves[pos:])

    # -- bound inference -------------------------------------------------------------------------

    def _infer_region(self, info: _StageInfo) -> None:
        stage, op = info.stage, info.op
        shape = op.output(0).shape
        if stage.attach_type == "root":
            info.offsets = [E.IntImm(0) for _ in shape]
            info.extents = list(shape)
        else:
            info.offsets, info.extents = self._attached_region(info, shape)
        if stage in self.arg_buffers:
            info.buffer, info.absolute = self.arg_buffers[stage], True
        elif stage.attach_type == "root":
            info.buffer = E.Buffer(op.name, shape, op.output(0).dtype, "local")
            info.absolute = True
        else:
            scope = "shared" if stage.scope == "shared" else "local"
            strides = E.aligned_strides(info.extents, stage.storage_aligns) \
                if stage.storage_aligns else None
            info.buffer = E.Buffer(op.name, info.extents, op.output(0).dtype, scope, strides)
            info.absolute = False

    def _attached_region(self, info: _StageInfo,
                         shape: tuple[int, ...]) -> tuple[list[E.PrimExpr], list[int]]:
        parent = self.info[info.stage.attach_stage]  # type: ignore[index]
        leaves = parent.stage.leaf_iter_vars
        pos = next(i for i, v in enumerate(leaves) if v is info.stage.attach_ivar)
        relax: dict[E.Var, Interval] = {}
        if info.stage.scope == "shared":  # the whole block's share: every thread's
            for var, extent in self.thread_vars.items():
                relax[var] = (E.IntImm(0, var.dtype), E.IntImm(extent - 1, var.dtype))
        for leaf in leaves[pos + 1:]:
            var = parent.loop_vars.get(leaf)
            if var is not None:
                relax[var] = (E.IntImm(0, var.dtype), E.IntImm(parent.ext[leaf] - 1, var.dtype))
        region: list[Interval | None] | None = None
        widths: list[int | None] = []  # a single read's bound on each extent (see below)
        reads = 0
        readers = [(parent, relax)]
        # Siblings read after it: at the same loop, or at loops of the parent inside it,
        # whose variables ``relax`` spans already.
        siblings = [kid for at, kids in self.attached.get(parent.stage, {}).items()
                    if at >= pos for kid in kids]
        for kid in siblings:
            kid_info = self.info[kid]
            if kid_info.axis_values and kid is not info.stage:  # a sibling read after it
                kid_relax = dict(relax)
                for var in kid_info.loop_vars.values():
                    kid_relax[var] = (E.IntImm(0, var.dtype),
                                      E.IntImm(self.ranges[var][1], var.dtype))
                readers.append((kid_info, kid_relax))
        for reader, reader_relax in readers:
            for stage, indices in self._reads(reader):
                if stage is not info.stage:
                    continue
                indices = [E.substitute(i, reader.axis_values) for i in indices]
                here = [eval_interval(i, reader_relax, self.ranges) for i in indices]
                region = here if region is None else [union(a, b, self.ranges)
                                                      for a, b in zip(region, here)]
                widths = [_clamped_width(i, reader_relax, self.ranges) for i in indices]
                reads += 1
        assert region is not None
        offsets: list[E.PrimExpr] = []
        extents: list[int] = []
        for d, dim in enumerate(region):
            if dim is None:
                offsets.append(E.IntImm(0))
                extents.append(shape[d])
                continue
            lo, hi = dim
            span = simplify(E.add(E.sub(hi, lo), 1), self.ranges)
            if isinstance(span, E.IntImm):
                extent = span.value
            else:
                extent = const_bound(span, self.ranges)[1]
                if extent == float("inf"):
                    offsets.append(E.IntImm(0))
                    extents.append(shape[d])
                    continue
            if reads == 1 and widths[d] is not None:
                extent = min(extent, widths[d])
            extent = max(int(extent), 0)
            if extent > shape[d] and const_bound(lo, self.ranges)[0] >= 0:
                extent = shape[d]
            offsets.append(lo)
            extents.append(extent)
        return offsets, extents

    def _derive_loops(self, info: _StageInfo) -> None:
        stage, op = info.stage, info.op
        ext = info.ext
        for axis, extent in zip(op.axis, info.extents):
            ext[axis] = extent
        for r in op.reduce_axis:
            ext[r] = r.dom.extent
        for rel in stage.relations:
            if isinstance(rel, Split):
                ext[rel.outer], ext[rel.inner] = split_extents(ext[rel.parent], rel.factor,
                                                               rel.nparts)
            else:
                ext[rel.fused] = ext[rel.outer] * ext[rel.inner]
        values = info.values
        for leaf in stage.leaf_iter_vars:
            kind = stage.iter_var_attrs.get(leaf)
            if ext[leaf] == 1 and not (kind is not None and kind.is_thread_binding):
                # (a bound loop of one stays: only the first thread or block of a larger
                # launch runs its body)
                values[leaf] = E.IntImm(0)
                continue
            var = E.Var(leaf.name, "int64" if ext[leaf] > _INT32_MAX else "int32")
            info.loop_vars[leaf] = var
            values[leaf] = var
            self.ranges[var] = (0, max(ext[leaf] - 1, 0))
            if _thread_bound(stage, leaf):
                self.thread_vars[var] = ext[leaf]
        for rel in reversed(stage.relations):
            if isinstance(rel, Split):
                values[rel.parent] = E.add(E.mul(values[rel.outer], ext[rel.inner]),
                                           values[rel.inner])
            else:
                values[rel.outer] = E.floordiv(values[rel.fused], ext[rel.inner])
                values[rel.inner] = E.floormod(values[rel.fused], ext[rel.inner])
        for rel in stage.relations:
            if isinstance(rel, Split) and ext[rel.outer] * ext[rel.inner] > ext[rel.parent]:
                info.conditions.append((E.LT(*_same(values[rel.parent],
                                                    E.IntImm(ext[rel.parent]))),
                                        rel.parent.is_reduce))
        for axis, offset, size in zip(op.axis, info.offsets, op.output(0).shape):
            absolute = E.add(offset, values[axis])
            info.axis_values[axis.var] = absolute
            if stage.attach_type == "root":
                continue
            upper = E.compare("LT", absolute, size)
            if prove(upper, self.ranges) is not True:
                info.conditions.append((upper, False))
            lower = E.compare("GE", absolute, 0)
            if prove(lower, self.ranges) is not True:
                info.conditions.append((lower, False))
        for r in op.reduce_axis:
            info.axis_values[r.var] = E.add(values[r], r.dom.min)

    # -- emission --------------------------------------------------------------------------------

    def _to_buffers(self, expr: E.PrimExpr) -> E.PrimExpr:
        def visit(node: E.PrimExpr) -> E.PrimExpr | None:
            if not isinstance(node, TensorLoad):
                return None
            stage = self.stage_of(node.tensor)
            info = self.info.get(stage)
            if info is None:  # a placeholder
                return E.BufferLoad(self.arg_buffers[stage], node.indices)
            assert info.buffer is not None
            indices = list(node.indices)
            if not info.absolute:
                indices = [E.sub(i, o) for i, o in zip(indices, info.offsets)]
            return E.BufferLoad(info.buffer, indices)

        return E.rewrite(expr, visit)

    def _emit(self, info: _StageInfo, in_parallel: bool) -> S.Stmt:
        stage, op = info.stage, info.op
        assert info.buffer is not None
        leaves = stage.leaf_iter_vars
        kinds = [stage.iter_var_attrs.get(v, S.ForKind.SERIAL) for v in leaves]
        parallel_seen = in_parallel
        for leaf, kind in zip(leaves, kinds):
            if kind == S.ForKind.PARALLEL:
                if parallel_seen:
                    raise ScheduleError(
                        f"stage {stage.name}: the parallel loop {leaf.name} would run inside "
                        "another parallel loop (of this stage or of the stage it is computed "
                        "at); keep one parallel loop per nest"
                    )
                parallel_seen = True

        if info.absolute:
            store_idx = [info.axis_values[a.var] for a in op.axis]
        else:
            store_idx = [info.values[a] for a in op.axis]
        body = E.substitute(info.body, info.axis_values)
        r = next((i for i, v in enumerate(leaves) if v.is_reduce), len(leaves))
        children = self.attached.get(stage, {})
        emitted: dict[int, list[tuple[E.Buffer | None, S.Stmt]]] = {}
        double: set[int] = set()  # shared buffers of stages to double-buffer
        asyncs: dict[int, int] = {}  # shared buffers of async stages -> their stages
        for pos, kids in children.items():
            inside_parallel = in_parallel or S.ForKind.PARALLEL in kinds[:pos + 1]
            for kid in kids:
                kinfo = self.info[kid]
                kid_stmt = self._emit(kinfo, inside_parallel)
                local = None if kid in self.arg_buffers else kinfo.buffer
                emitted.setdefault(pos, []).append((local, kid_stmt))
                if local is not None and local.scope == "shared":
                    if kid.async_stages:
                        asyncs[id(local)] = kid.async_stages
                    elif kid.double_buffered:
                        double.add(id(local))
        nest = _NestBuilder(info, kinds, emitted, self._prefetches(info), double, asyncs)
        # Shared stages computed in this nest put barriers in its loops, which every thread
        # must reach: its guards then go around the stores they protect, never around a loop.
        at_stores = any((local is not None and local.scope == "shared") or _has_barrier(kid)
                        for kids in emitted.values() for local, kid in kids)
        if isinstance(body, Reduce):
            source = self._to_buffers(body.source)
            acc = E.BufferLoad(info.buffer, store_idx)
            init: S.Stmt = S.BufferStore(info.buffer, body.combiner.identity, store_idx)
            update: S.Stmt = S.BufferStore(info.buffer, body.combiner.combine(acc, source),
                                           store_idx)
            inner = list(range(r, len(leaves)))
            spatial_inner = [p for p in inner if not leaves[p].is_reduce]
            if at_stores:
                outer_conds: list[E.PrimExpr] = []
                inner_conds: list[tuple[E.PrimExpr, bool]] = []
                init = _guard([c for c, red in info.conditions if not red], init)
                update = _guard([c for c, _ in info.conditions], update)
            else:
                outer_conds, inner_conds = nest.split_conditions(r)
            init_nest = fresh_vars(nest.build(spatial_inner,
                                              [c for c, red in inner_conds if not red],
                                              init, attach=False), "_init")
            update_nest = nest.build(inner, [c for c, _ in inner_conds], update)
            return nest.build(list(range(r)), outer_conds, S.SeqStmt([init_nest, update_nest]))
        store: S.Stmt = S.BufferStore(info.buffer, self._to_buffers(body), store_idx)
        conds = [c for c, _ in info.conditions]
        if at_stores:
            store, conds = _guard(conds, store), []
        return nest.build(list(range(len(leaves))), conds, store)


    def _prefetches(self, info: _StageInfo) -> dict[int, list[S.Stmt]]:
        """The stage's prefetch hints (:meth:`Stage.prefetch`) as statements, by the position
        of the leaf loop whose body starts with them: their indices over the loop variables,
        the loops inside that one at their first iteration."""
        stage = info.stage
        if not stage.prefetches:
            return {}
        values = {iv.var: value for iv, value in info.values.items()}
        values.update(info.axis_values)
        found: dict[int, list[S.Stmt]] = {}
        for tensor, var, indices in stage.prefetches:
            pos = stage.leaf_iter_vars.index(var)
            first = {info.loop_vars[leaf]: E.IntImm(0, info.loop_vars[leaf].dtype)
                     for leaf in stage.leaf_iter_vars[pos + 1:] if leaf in info.loop_vars}
            load = E.substitute(E.substitute(TensorLoad(tensor, indices), values), first)
            load = self._to_buffers(load)
            assert isinstance(load, E.BufferLoad)
            found.setdefault(pos, []).append(S.Prefetch(load.buffer, load.indices))
        return found


def _clamped_width(index: E.PrimExpr, relax: dict[E.Var, Interval],
                   ranges: dict[Any, Any]) -> int | None:
    """A bound on the values ``index`` takes as ``relax`` sweeps: those of ``index`` with every
    clamp (a min or max with a value that does not sweep) taken away, when that is a constant
    width. A clamp is monotone and moves two values no further apart, so the clamped index
    spans no more: a window ``max(min(y + ry - 1, h - 1), 0)`` takes at most the window's
    3 rows, where the interval of the clamped form, ``[max(y - 1, 0), min(y + 1, h - 1)]``,
    has no constant width the simplifier can see. None when there is no such bound."""
    swept: dict[int, bool] = {}  # by node, each node once (a subtree is not walked again)
    held: list[E.PrimExpr] = []  # the nodes of ``swept``, so no other node takes one's id

    def sweeps(node: E.PrimExpr) -> bool:
        for n in E.post_order(node, enter=lambda n: id(n) not in swept):
            if id(n) not in swept:
                swept[id(n)] = ((isinstance(n, E.Var) and n in relax)
                                or any(swept[id(c)] for c in n.children()))
                held.append(n)
        return swept[id(node)]

    def strip(node: E.PrimExpr) -> E.PrimExpr | None:  # children are already stripped
        if isinstance(node, (E.Min, E.Max)) and sweeps(node.a) != sweeps(node.b):
            return node.a if sweeps(node.a) else node.b
        return None

    interval = eval_interval(E.rewrite(index, strip), relax, ranges)
    if interval is None:
        return None
    span = simplify(E.add(E.sub(interval[1], interval[0]), 1), ranges)
    return span.value if isinstance(span, E.IntImm) else None


def _same(a: E.PrimExpr, b: E.PrimExpr) -> tuple[E.PrimExpr, E.PrimExpr]:
    return (a, E.cast(b, a.dtype)) if a.dtype != b.dtype else (a, b)


class _NestBuilder:
    """Builds loop nests over chosen leaf positions of one stage, placing guards and attached
    producer stages."""

    def __init__(self, info: _StageInfo, kinds: list[S.ForKind],
                 emitted: dict[int, list[tuple[E.Buffer | None, S.Stmt]]],
                 prefetches: dict[int, list[S.Stmt]], double: set[int] | None = None,
                 asyncs: dict[int, int] | None = None) -> None:
        self.info = info
        self.double = double or set()
        self.asyncs = asyncs or {}
        self.leaves = info.stage.leaf_iter_vars
        self.kinds = kinds
        self.emitted = emitted
        self.prefetches = prefetches
        self.position = {info.loop_vars[v]: p for p, v in enumerate(self.leaves)
                         if v in info.loop_vars}

    def depth(self, cond: E.PrimExpr) -> int:
        """1 + the innermost leaf position whose variable ``cond`` uses (0: none)."""
        used = [self.position[v] for v in E.free_vars(cond) if v in self.position]
        return 1 + max(used) if used else 0

    def split_conditions(self, r: int) -> tuple[list[E.PrimExpr], list[tuple[E.PrimExpr, bool]]]:
        outer = [c for c, _ in self.info.conditions if self.depth(c) <= r]
        inner = [(c, red) for c, red in self.info.conditions if self.depth(c) > r]
        return outer, inner

    @staticmethod
    def _loop_bound(cond: E.PrimExpr, var: E.Var) -> tuple[str, E.PrimExpr] | None:
        """If ``cond`` is linear in ``var`` with the other terms fixed outside ``var``'s loop,
        the bound it puts on ``var``: ("lo", first allowed value) or ("hi", one past the last).
        """
        if not isinstance(cond, E.CmpOp) or not E.is_int(cond.a.dtype):
            return None
        # every comparison as `lin <= 0` over integers
        if isinstance(cond, E.LT):
            lin = linear_form(E.add(E.sub(cond.a, cond.b), 1))
        elif isinstance(cond, E.LE):
            lin = linear_form(E.sub(cond.a, cond.b))
        elif isinstance(cond, E.GT):
            lin = linear_form(E.add(E.sub(cond.b, cond.a), 1))
        elif isinstance(cond, E.GE):
            lin = linear_form(E.sub(cond.b, cond.a))
        else:
            return None
        coef = lin.coef_of(var)
        if coef == 0:
            return None
        rest: E.PrimExpr = E.IntImm(lin.const, lin.dtype)
        for c, atom in lin.terms.values():
            if atom is var:
                continue
            if any(v is var for v in E.free_vars(atom)):
                return None
            rest = E.add(rest, E.mul(atom, c))
        if coef > 0:
            # coef*var + rest <= 0  <=>  var <= floor(-rest / coef)
            return "hi", E.add(E.floordiv(E.sub(0, rest), coef), 1)
        # var >= ceil(rest / -coef)
        return "lo", E.floordiv(E.add(rest, -coef - 1), -coef)

    def _pipelined(self, p: int, bounds: tuple[E.PrimExpr, E.PrimExpr] | None,
                   guards: list[E.PrimExpr], body: S.Stmt) -> S.Stmt | None:
        """The loop at leaf position ``p`` around ``body``, its shared stages double-buffered
        (:func:`opfusion.tir.pipeline.double_buffer_loop`) when every stage computed at it
        asks for that (``Stage.double_buffer``), or pipelined with async copies
        (:func:`opfusion.tir.pipeline.async_pipeline_loop`) when every one asks for the same
        stages (``Stage.async_pipeline``), and the loop is a constant range with no guard;
        else None (the plain form)."""
        kids = self.emitted.get(p, [])
        var = self.info.loop_vars.get(self.leaves[p])
        if (not kids or var is None or bounds is None or guards or p in self.prefetches
                or any(local is None for local, _ in kids)):
            return None
        start, end = (_constant(b) for b in bounds)
        if start is None or end is None:
            return None
        copies = [(local, kid) for local, kid in kids if local is not None]
        stages = {self.asyncs.get(id(local), 0) for local, _ in copies}
        if len(stages) == 1 and min(stages) >= 2:
            return async_pipeline_loop(var, start, end - start, self.kinds[p], copies, body,
                                       stages.pop())
        if not all(id(local) in self.double for local, _ in copies):
            return None
        return double_buffer_loop(var, start, end - start, self.kinds[p], copies, body)

    def build(self, positions: list[int], conds: list[E.PrimExpr], body: S.Stmt,
              attach: bool = True) -> S.Stmt:
        """Loops over ``positions`` (outermost first) around ``body``."""
        bounds: dict[int, tuple[E.PrimExpr, E.PrimExpr]] = {}  # [lo, hi) per loop
        for p in positions:
            var = self.info.loop_vars.get(self.leaves[p])
            if var is not None:
                bounds[p] = (E.IntImm(0, var.dtype),
                             E.IntImm(self.info.ext[self.leaves[p]], var.dtype))
        slot_of = {p: i + 1 for i, p in enumerate(positions)}
        placed: dict[int, list[E.PrimExpr]] = {}
        for cond in conds:
            d = self.depth(cond)
            slot = slot_of.get(d - 1, 0) if d > 0 else 0
            if slot > 0 and not self.kinds[positions[slot - 1]].is_thread_binding:
                # A guard on the innermost variable it uses narrows that loop instead: the
                # guard covered that loop's whole body, so skipping iterations is the same.
                p = positions[slot - 1]
                var = self.info.loop_vars[self.leaves[p]]
                found = self._loop_bound(cond, var)
                if found is not None:
                    side, value = found
                    lo, hi = bounds[p]
                    value = E.cast(value, var.dtype)
                    bounds[p] = (E.maximum(lo, value), hi) if side == "lo" else (
                        lo, E.minimum(hi, value))
                    continue
            placed.setdefault(slot, []).append(cond)
        stmt = body
        for i in range(len(positions) - 1, -1, -1):
            p = positions[i]
            pipelined = self._pipelined(p, bounds.get(p), placed.get(i + 1, []), stmt) \
                if attach else None
            if pipelined is not None:
                stmt = pipelined
                continue
            if attach:
                kids = self.emitted.get(p, [])
                barriers = _shared_barriers(kids)
                for k in range(len(kids) - 1, -1, -1):
                    local, kid = kids[k]
                    before, after = barriers[k]
                    parts = [*([S.Barrier()] if before else []), kid,
                             *([S.Barrier()] if after else [])]
                    stmt = S.SeqStmt([*parts, stmt])
                    if local is not None:
                        stmt = S.Allocate(local, stmt)
                if p in self.prefetches:
                    stmt = S.SeqStmt([*self.prefetches[p], stmt])
            stmt = _guard(placed.get(i + 1, []), stmt)
            var = self.info.loop_vars.get(self.leaves[p])
            if var is not None:
                lo, hi = bounds[p]
                stmt = S.For(var, lo, E.sub(hi, lo), self.kinds[p], stmt)
        return _guard(placed.get(0, []), stmt)


def _constant(value: E.PrimExpr) -> int | None:
    return value.value if isinstance(value, E.IntImm) else None


def _shared_barriers(kids: list[tuple[E.Buffer | None, S.Stmt]]) -> list[tuple[bool, bool]]:
    """Whether a barrier comes before and after each of the stages computed at one loop
    position (their buffers and statements, in order). A shared stage waits first for the
    last iteration's readers of its buffer, and its values are published to the block's
    threads after it. Shared stages in a row share their barriers: one before the first,
    one after the last, and one between two only where the later reads what the earlier
    ones of the row wrote. Two copies of a product's operands then wait together, and each
    thread's loads of both are in flight at once rather than one copy's after the other's."""
    shared = [local is not None and local.scope == "shared" for local, _ in kids]
    barriers: list[tuple[bool, bool]] = []
    unpublished: set[int] = set()  # shared buffers written since the last barrier
    for k, (local, _) in enumerate(kids):
        if not shared[k]:
            barriers.append((False, False))
            continue
        assert local is not None
        unpublished.add(id(local))
        before = k == 0 or not shared[k - 1]
        after = (k + 1 == len(kids) or not shared[k + 1]
                 or bool(S.read_buffers(kids[k + 1][1]) & unpublished))
        if after:
            unpublished.clear()
        barriers.append((before, after))
    return barriers


def _has_barrier(stmt: S.Stmt) -> bool:
    return any(isinstance(node, S.Barrier) for node in S.walk_stmts(stmt))


def _thread_bound(stage: Stage, leaf: IterVar) -> bool:
    kind = stage.iter_var_attrs.get(leaf)
    return kind is not None and kind.is_thread_binding and not kind.is_block


def _guard(conds: list[E.PrimExpr], stmt: S.Stmt) -> S.Stmt:
    if not conds:
        return stmt
    cond = conds[0]
    for c in conds[1:]:
        cond = E.logical_and(cond, c)
    return S.IfThenElse(cond, stmt)


# ---------------------------------------------------------------------------------------------
# names


_IDENT = re.compile(r"[^A-Za-z0-9_]")


def sanitize_name(name: str) -> str:
    """A C identifier made from ``name`` (other characters become ``_``)."""
    out = _IDENT.sub("_", name) or "v"
    return "_" + out if out[0].isdigit() else out


class _Names:
    def __init__(self) -> None:
        self.used: set[str] = set()

    def fresh(self, name: str) -> str:
        base = sanitize_name(name)
        out, n = base, 0
        while out in self.used:
            n += 1
            out = f"{base}_{n}"
        self.used.add(out)
        return out


def _rename(func: S.PrimFunc) -> S.PrimFunc:
    """Give every buffer and variable of ``func`` a unique C-safe name, in order of definition."""
    names = _Names()
    buffers: dict[E.Buffer, E.Buffer] = {}
    for b in func.params:
        buffers[b] = E.Buffer(names.fresh(b.name), b.shape, b.dtype, b.scope, b.padded_strides)
    variables: dict[E.Var, E.Var] = {}

    def fexpr(e: E.PrimExpr) -> E.PrimExpr:
        def visit(node: E.PrimExpr) -> E.PrimExpr | None:
            if isinstance(node, E.Var):
                return variables.get(node)
            if isinstance(node, E.BufferLoad) and node.buffer in buffers:
                return E.BufferLoad(buffers[node.buffer], node.indices)
            return None

        return E.rewrite(e, visit)

    def define(var: E.Var) -> E.Var:
        new = E.Var(names.fresh(var.name), var.dtype)
        variables[var] = new
        return new

    def walk(stmt: S.Stmt) -> S.Stmt:
        if isinstance(stmt, S.SeqStmt):
            return S.SeqStmt([walk(s) for s in stmt.stmts])
        if isinstance(stmt, S.BufferStore):
            return S.BufferStore(buffers.get(stmt.buffer, stmt.buffer), fexpr(stmt.value),
                                 [fexpr(i) for i in stmt.indices])
        if isinstance(stmt, S.For):
            lo, extent = fexpr(stmt.min), fexpr(stmt.extent)
            return S.For(define(stmt.loop_var), lo, extent, stmt.kind, walk(stmt.body))
        if isinstance(stmt, S.IfThenElse):
            return S.IfThenElse(fexpr(stmt.condition), walk(stmt.then_case),
                                None if stmt.else_case is None else walk(stmt.else_case))
        if isinstance(stmt, S.LetStmt):
            value = fexpr(stmt.value)
            return S.LetStmt(define(stmt.var), value, walk(stmt.body))
        if isinstance(stmt, S.Allocate):
            b = stmt.buffer
            buffers[b] = E.Buffer(names.fresh(b.name), b.shape, b.dtype, b.scope, b.padded_strides)
            return S.Allocate(buffers[b], walk(stmt.body))
        if isinstance(stmt, S.Evaluate):
            return S.Evaluate(fexpr(stmt.value))
        if isinstance(stmt, S.Prefetch):
            return S.Prefetch(buffers.get(stmt.buffer, stmt.buffer),
                              [fexpr(i) for i in stmt.indices])
        if isinstance(stmt, S.AsyncCopy):
            source = fexpr(stmt.source)
            assert isinstance(source, E.BufferLoad)
            return S.AsyncCopy(buffers.get(stmt.buffer, stmt.buffer),
                               [fexpr(i) for i in stmt.indices], source,
                               None if stmt.predicate is None else fexpr(stmt.predicate))
        if isinstance(stmt, (S.Barrier, S.AsyncCommit, S.AsyncWait)):
            return stmt
        raise TypeError(type(stmt).__name__)

    body = walk(func.body)
    return S.PrimFunc(func.name, [buffers[b] for b in func.params], body, func.attrs)


__all__ = ["lower", "sanitize_name"]
