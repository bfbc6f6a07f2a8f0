"""Schedules: how to compute the operations of a tensor expression.

A :class:`Schedule` holds one :class:`Stage` per operation, producers first. A stage starts
with one loop per axis (data axes, then reduction axes) and is transformed by primitives that
record relations between iteration variables, as in Halide and TVM:

- ``split(x, factor=f)`` -> ``(x_outer, x_inner)`` records ``Split(x, outer, inner)``;
- ``fuse(a, b)`` -> ``a_b_fused`` records ``Fuse(a, b, fused)``;
- ``reorder``, ``tile`` (two splits and a reorder), ``parallel``, ``vectorize``, ``unroll``;
- ``compute_inline``, ``compute_at(parent_stage, var)``, ``compute_root`` choose where the
  stage's values are computed; ``Schedule.cache_write`` computes into a temporary first,
  ``Schedule.cache_read`` copies what some readers read into one;
- ``prefetch(tensor, x, indices)`` starts each iteration of loop ``x`` with a hint that
  ``tensor[indices]`` will be read soon (a CPU prefetch into L2; nothing on a GPU);
- for GPUs, ``bind(x, thread_axis("threadIdx.x"))`` makes a loop a block or thread index and
  ``set_scope("shared")`` keeps a stage's buffer in the memory a block's threads share (its
  region then covers every thread of the block; lowering puts a barrier before and after
  each computation of it).

``all_iter_vars`` lists every variable a stage ever had, ``leaf_iter_vars`` the current loops,
outermost first. Illegal requests raise :class:`~opfusion.errors.ScheduleError` naming the
stage and variable. Loop extents are final only once lowering knows each stage's region
(a stage computed at a consumer's loop computes just the part that consumer needs)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ScheduleError
from ..tir.expr import Var, select
from ..tir.stmt import THREAD_TAGS, ForKind
from .reduction import Reduce
from .tensor import (
    DATA_PAR,
    REDUCE,
    ComputeOp,
    IterVar,
    Operation,
    PlaceholderOp,
    Range,
    Tensor,
    _as_ops,
    post_dfs_order,
    replace_reads,
    substitute_axes,
)


@dataclass(frozen=True, eq=False)
class Split:
    """``parent`` = ``outer * factor + inner`` (by factor) or into ``nparts`` outer steps."""

    parent: IterVar
    outer: IterVar
    inner: IterVar
    factor: int | None
    nparts: int | None


@dataclass(frozen=True, eq=False)
class Fuse:
    """``fused`` = ``outer * extent(inner) + inner``."""

    outer: IterVar
    inner: IterVar
    fused: IterVar


@dataclass(frozen=True)
class ThreadAxis:
    """A GPU index a loop can be bound to: ``blockIdx.x|y|z`` or ``threadIdx.x|y|z``."""

    tag: str


def thread_axis(tag: str) -> ThreadAxis:
    """The GPU index ``tag`` (``"blockIdx.x"``, ``"threadIdx.y"``, ...), for
    :meth:`Stage.bind`."""
    if tag not in THREAD_TAGS:
        raise ScheduleError(f"unknown thread axis {tag!r}; known: {', '.join(THREAD_TAGS)}")
    return ThreadAxis(tag)


#: Storage scopes a stage's buffer may have (:meth:`Stage.set_scope`).
STAGE_SCOPES = ("global", "local", "shared")


def _index(var: Any, items: Sequence[IterVar]) -> int:
    for i, v in enumerate(items):
        if v is var:
            return i
    return -1


def _names(items: Sequence[IterVar]) -> str:
    return ", ".join(v.name for v in items) or "(none)"


def split_extents(extent: int, factor: int | None, nparts: int | None) -> tuple[int, int]:
    """Extents of (outer, inner) when a loop of ``extent`` is split (inner * outer >= extent)."""
    if extent <= 0:
        return 0, 0
    if factor is not None:
        inner = min(factor, extent)
        return -(-extent // inner), inner
    assert nparts is not None
    inner = -(-extent // nparts)
    return -(-extent // inner), inner


class Stage:
    """How one operation is computed: its loop nest, loop kinds and where it is attached."""

    def __init__(self, op: Operation, schedule: Schedule) -> None:
        self.op: Operation = op
        self.origin_op: Operation = op
        self.schedule = schedule
        axes: list[IterVar] = []
        if isinstance(op, ComputeOp):
            axes = list(op.axis) + list(op.reduce_axis)
        self.all_iter_vars: list[IterVar] = list(axes)
        self.leaf_iter_vars: list[IterVar] = list(axes)
        self.relations: list[Split | Fuse] = []
        self.iter_var_attrs: dict[IterVar, ForKind] = {}
        self.attach_type = "root"  # "root", "inline" or "scope"
        self.attach_stage: Stage | None = None
        self.attach_ivar: IterVar | None = None
        self.scope = "local"  # of its buffer, when it is not an argument
        # (tensor, loop, indices) of each prefetch hint, in the order given
        self.prefetches: list[tuple[Tensor, IterVar, tuple[Any, ...]]] = []
        # dimension -> (factor, offset) of its buffer's stride (storage_align)
        self.storage_aligns: dict[int, tuple[int, int]] = {}
        self.double_buffered = False  # see double_buffer()
        self.async_stages = 0  # see async_pipeline(): tiles in flight, 0 for none

    # -- helpers -----------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The name of the stage's operation."""
        return self.op.name

    @property
    def is_output(self) -> bool:
        """True if the operation is an output of the schedule."""
        return any(self.origin_op is o or self.op is o for o in self.schedule.outputs)

    def _fail(self, message: str) -> ScheduleError:
        return ScheduleError(f"stage {self.name}: {message}")

    def _need_compute(self, primitive: str) -> None:
        if isinstance(self.op, PlaceholderOp):
            raise self._fail(
                f"{primitive} on a placeholder; placeholders are inputs and have no loops"
            )

    def _leaf(self, var: Any, primitive: str) -> int:
        """The position of ``var`` among the leaf variables, or a clear error."""
        self._need_compute(primitive)
        if not isinstance(var, IterVar):
            raise self._fail(
                f"{primitive} needs an IterVar of this stage (e.g. {self.name}.op.axis[0]), got "
                f"{var!r}"
            )
        pos = _index(var, self.leaf_iter_vars)
        if pos >= 0:
            return pos
        if _index(var, self.all_iter_vars) >= 0:
            by = next((r for r in self.relations
                       if (isinstance(r, Split) and r.parent is var)
                       or (isinstance(r, Fuse) and (r.outer is var or r.inner is var))), None)
            how = ""
            if isinstance(by, Split):
                how = f" (it was split into {by.outer.name}, {by.inner.name})"
            elif isinstance(by, Fuse):
                how = f" (it was fused into {by.fused.name})"
            raise self._fail(
                f"cannot {primitive} {var.name}: it is no longer a loop of this stage{how}; "
                f"the current loops are {_names(self.leaf_iter_vars)}"
            )
        raise self._fail(
            f"cannot {primitive} {var.name}: it does not belong to this stage (its loops are "
            f"{_names(self.leaf_iter_vars)}); did you take the axis of another tensor's op?"
        )

    # -- loop transformations ------------------------------------------------------------------

    def split(self, parent: IterVar, factor: int | None = None,
              nparts: int | None = None) -> tuple[IterVar, IterVar]:
        """Split ``parent`` into ``(outer, inner)``: by ``factor`` (inner extent) or into
        ``nparts`` outer iterations. A factor that does not divide the extent leaves a partial
        last tile, handled by lowering."""
        pos = self._leaf(parent, "split")
        if (factor is None) == (nparts is None):
            raise self._fail(f"split of {parent.name} needs exactly one of factor= or nparts=")
        given = factor if factor is not None else nparts
        if isinstance(given, bool) or not isinstance(given, int) or given <= 0:
            what = "factor" if factor is not None else "nparts"
            raise self._fail(f"split of {parent.name}: {what} must be a positive int, "
                             f"got {given!r}")
        outer_ext, inner_ext = split_extents(parent.dom.extent, factor, nparts)
        outer = IterVar(Range(0, outer_ext), Var(f"{parent.name}_outer"), parent.iter_type)
        inner = IterVar(Range(0, inner_ext), Var(f"{parent.name}_inner"), parent.iter_type)
        self.relations.append(Split(parent, outer, inner, factor, nparts))
        self.all_iter_vars += [outer, inner]
        self.leaf_iter_vars[pos:pos + 1] = [outer, inner]
        return outer, inner

    def tile(self, x_parent: IterVar, y_parent: IterVar, x_factor: int,
             y_factor: int) -> tuple[IterVar, IterVar, IterVar, IterVar]:
        """Split two axes and order the loops ``x_outer, y_outer, x_inner, y_inner``."""
        if x_parent is y_parent:
            raise self._fail(f"tile needs two different axes, got {x_parent.name} twice")
        self._leaf(x_parent, "tile")
        self._leaf(y_parent, "tile")
        xo, xi = self.split(x_parent, factor=x_factor)
        yo, yi = self.split(y_parent, factor=y_factor)
        self.reorder(xo, yo, xi, yi)
        return xo, yo, xi, yi

    def reorder(self, *order: IterVar) -> None:
        """Put the given loops in this order, in the positions they occupy together."""
        if len(order) == 1 and isinstance(order[0], (list, tuple)):
            order = tuple(order[0])
        positions = [self._leaf(v, "reorder") for v in order]
        for i, v in enumerate(order):
            if _index(v, order[:i]) >= 0:
                raise self._fail(f"reorder lists {v.name} twice")
        for slot, v in zip(sorted(positions), order):
            self.leaf_iter_vars[slot] = v

    def fuse(self, *vars: IterVar) -> IterVar:
        """Fuse adjacent loops, given outermost first, into one loop over their product."""
        if len(vars) == 1 and isinstance(vars[0], (list, tuple)):
            vars = tuple(vars[0])
        if not vars:
            raise self._fail("fuse needs at least one loop")
        positions = [self._leaf(v, "fuse") for v in vars]
        for a, b, pa, pb in zip(vars, vars[1:], positions, positions[1:]):
            if pb != pa + 1:
                raise self._fail(
                    f"cannot fuse {a.name} and {b.name}: fused loops must be adjacent and given "
                    f"outermost first; the loops are {_names(self.leaf_iter_vars)} (reorder "
                    "first)"
                )
            if a.iter_type != b.iter_type:
                raise self._fail(
                    f"cannot fuse {a.name} and {b.name}: one is a reduction loop and the other "
                    "is not"
                )
        fused = vars[0]
        for inner in vars[1:]:
            outer = fused
            ext = outer.dom.extent * inner.dom.extent
            fused = IterVar(Range(0, ext), Var(f"{outer.name}_{inner.name}_fused"),
                            outer.iter_type)
            self.relations.append(Fuse(outer, inner, fused))
            self.all_iter_vars.append(fused)
            pos = _index(outer, self.leaf_iter_vars)
            self.leaf_iter_vars[pos:pos + 2] = [fused]
        return fused

    def _set_kind(self, var: IterVar, kind: ForKind, primitive: str) -> None:
        pos = self._leaf(var, primitive)
        if kind in (ForKind.PARALLEL, ForKind.VECTORIZED) and var.is_reduce:
            raise self._fail(
                f"cannot {primitive} {var.name}: it is a reduction loop, whose iterations "
                "all update the same element; split it and reorder a data-parallel loop "
                f"inward to {primitive} that one instead"
            )
        if kind == ForKind.PARALLEL:
            outer_reduce = [v for v in self.leaf_iter_vars[:pos] if v.is_reduce]
            if outer_reduce:
                raise self._fail(
                    f"cannot parallelize {var.name}: it is inside the reduction loop "
                    f"{outer_reduce[0].name}, so threads would start and stop on every "
                    "reduction step; reorder it outside the reduction loops first"
                )
        self.iter_var_attrs[var] = kind

    def parallel(self, var: IterVar) -> None:
        """Run the iterations of ``var`` on several threads."""
        self._set_kind(var, ForKind.PARALLEL, "parallel")

    def vectorize(self, var: IterVar) -> None:
        """Run the iterations of ``var`` in SIMD lanes (best on the innermost loop)."""
        self._set_kind(var, ForKind.VECTORIZED, "vectorize")

    def unroll(self, var: IterVar) -> None:
        """Unroll the loop over ``var``."""
        self._set_kind(var, ForKind.UNROLLED, "unroll")

    def tensorize(self, var: IterVar, intrinsic: str) -> None:
        """Let a GPU run the nest the loop over ``var`` heads as one tensor-core instruction.
        ``intrinsic`` is ``"mma_tf32"``: ``var`` is a reduction loop of 8 steps around two
        data-parallel loops of 2 (the tile-row half, then the column of the pair), inside
        loops bound to threadIdx.x (4) and threadIdx.y (8); :mod:`opfusion.tir.mma` says
        what the nest may read. On other targets the nest runs as written."""
        if intrinsic != "mma_tf32":
            raise self._fail(f"unknown tensor intrinsic {intrinsic!r}; known: 'mma_tf32'")
        pos = self._leaf(var, "tensorize")
        inner = self.leaf_iter_vars[pos + 1:]
        # The inner loops' extents are known once lowering has inferred this stage's region
        # (a stage computed at another's loop): they are checked there (tir/mma.py).
        if (not var.is_reduce or int(var.dom.extent) != 8 or len(inner) != 2
                or any(v.is_reduce for v in inner)):
            raise self._fail(
                f"cannot tensorize {var.name} as mma_tf32: it must be a reduction loop of 8 "
                "steps with exactly two data-parallel loops (of 2) inside it, found "
                f"{_names([var, *inner])}")
        self.iter_var_attrs[var] = ForKind.MMA_TF32

    def prefetch(self, tensor: Tensor, var: IterVar, indices: Sequence[Any]) -> None:
        """At the start of every iteration of the loop over ``var``, hint that
        ``tensor[indices]`` will be read soon (its cache line is fetched toward the core; no
        value changes). ``indices`` are expressions of this stage's iteration variables
        (its axes, reduction axes and the loops made from them): loops outside ``var`` and
        ``var`` itself at their current values, loops inside it at their first. The indices
        must stay within ``tensor``'s shape (clamp them with ``te.min``). A schedule
        prefetches what a later iteration, or a later task, will read from memory that the
        hardware prefetchers do not follow in time."""
        self._leaf(var, "prefetch")
        if not isinstance(tensor, Tensor):
            raise self._fail(f"prefetch needs a te.Tensor, got {type(tensor).__name__}")
        indices = tuple(indices)
        if len(indices) != len(tensor.shape):
            raise self._fail(f"prefetch of {tensor.name} with {len(indices)} indices; it has "
                             f"{len(tensor.shape)} dimension(s)")
        self.prefetches.append((tensor, var, indices))

    def bind(self, var: IterVar, axis: ThreadAxis | str) -> None:
        """Make the loop over ``var`` a GPU block or thread index (``thread_axis(...)`` or its
        tag): every block or thread runs the loop's body for its own index."""
        tag = axis.tag if isinstance(axis, ThreadAxis) else thread_axis(axis).tag
        pos = self._leaf(var, "bind")
        if var.is_reduce:
            raise self._fail(
                f"cannot bind {var.name} to {tag}: it is a reduction loop, whose iterations "
                "all update the same element; bind a data-parallel loop")
        inside = [v for v in self.leaf_iter_vars[:pos] if v.is_reduce]
        if inside:
            raise self._fail(f"cannot bind {var.name} to {tag}: it is inside the reduction "
                             f"loop {inside[0].name}; reorder it outward first")
        for other, kind in self.iter_var_attrs.items():
            if kind.value == tag and other is not var:
                raise self._fail(f"cannot bind {var.name} to {tag}: {other.name} already is")
        self.iter_var_attrs[var] = ForKind(tag)

    def storage_align(self, axis: IterVar, factor: int, offset: int) -> None:
        """Space the stage's buffer along ``axis`` (one of its axes, not the last) so that
        its stride, in elements, is ``offset`` modulo ``factor``: the rows of a shared tile
        moved off each other's memory banks. The padding is never read or written. Only a
        temporary's buffer (a stage computed at another's loop) is padded."""
        axes = list(self.op.axis) if isinstance(self.op, ComputeOp) else []
        dim = next((d for d, a in enumerate(axes) if a is axis), None)
        if dim is None or dim == len(axes) - 1:
            raise self._fail(f"storage_align needs one of {self.name}'s axes but the last, "
                             f"not {getattr(axis, 'name', axis)!r}")
        if not (isinstance(factor, int) and isinstance(offset, int) and factor > 0
                and 0 <= offset < factor):
            raise self._fail(f"storage_align needs a factor > 0 and 0 <= offset < factor, "
                             f"not {factor!r} and {offset!r}")
        self.storage_aligns[dim] = (factor, offset)

    def double_buffer(self) -> None:
        """Give a shared stage two buffers that the loop it is computed at alternates
        between (TVM's primitive): while the block's threads compute with one step's tile,
        each thread has already loaded its share of the next step's into registers, and
        stores it into the other buffer after the computation, so the loads' latency is
        hidden behind it and a step needs one barrier, not two. Lowering pipelines the
        stage where it can (see :func:`opfusion.tir.pipeline.double_buffer_loop`) and
        computes it as a plain shared stage where it cannot."""
        if self.scope != "shared":
            raise self._fail("double_buffer needs a shared stage (set_scope('shared') or "
                             f"cache_read(..., 'shared', ...)), not scope {self.scope!r}")
        self.double_buffered = True

    def async_pipeline(self, stages: int) -> None:
        """Give a shared stage ``stages`` buffers (2 or more) that the loop it is computed at
        cycles through, filled by async copies (``cp.async``, Ampere and later) up to
        ``stages - 1`` steps ahead of the step the block computes with, from global memory
        straight into shared memory: no registers hold them in between, and a step waits at
        one barrier. Lowering pipelines the stage where it can (each copy one load of a
        function's buffer, or such a load where a condition holds and zero elsewhere; see
        :func:`opfusion.tir.pipeline.async_pipeline_loop`) and computes it as a plain shared
        stage where it cannot. A tile of tensor-core operands filled this way holds its
        values as loaded (an async copy converts nothing), so the instruction rounds them to
        TF32 as it reads them."""
        if self.scope != "shared":
            raise self._fail("async_pipeline needs a shared stage (set_scope('shared') or "
                             f"cache_read(..., 'shared', ...)), not scope {self.scope!r}")
        if not (isinstance(stages, int) and stages >= 2):
            raise self._fail(f"async_pipeline needs 2 or more stages, not {stages!r}")
        self.async_stages = stages

    def set_scope(self, scope: str) -> None:
        """Where the stage's buffer lives when it is not an argument: "local" (the default:
        one per thread on a GPU), "shared" (one per GPU block, filled by its threads
        together) or "global"."""
        if scope not in STAGE_SCOPES:
            raise self._fail(f"scope must be one of {', '.join(STAGE_SCOPES)}, not {scope!r}")
        self._need_compute("set_scope")
        self.scope = scope

    # -- placement -------------------------------------------------------------------------------

    def compute_inline(self) -> None:
        """Compute each value where it is read, instead of storing the tensor."""
        self._need_compute("compute_inline")
        if isinstance(self.op, ComputeOp) and isinstance(self.op.body, Reduce):
            raise self._fail(
                "cannot compute_inline a reduction: each read would redo the whole reduction; "
                "compute_at it into its consumer instead"
            )
        if self.is_output:
            raise self._fail("cannot compute_inline an output of the schedule: it must be "
                             "stored")
        self.attach_type = "inline"
        self.attach_stage = None
        self.attach_ivar = None

    def compute_root(self) -> None:
        """Compute the whole tensor before its consumers (the default)."""
        self._need_compute("compute_root")
        self.attach_type = "root"
        self.attach_stage = None
        self.attach_ivar = None

    def compute_at(self, parent: Stage, scope: IterVar) -> None:
        """Compute the part of this tensor that ``parent`` needs inside its loop ``scope``,
        just before that part is used."""
        self._need_compute("compute_at")
        if not isinstance(parent, Stage):
            raise self._fail(f"compute_at needs a Stage (s[tensor]), got {parent!r}")
        if parent is self:
            raise self._fail("cannot compute_at its own loop")
        if isinstance(scope, IterVar) and _index(scope, parent.leaf_iter_vars) < 0:
            raise self._fail(
                f"cannot compute_at {parent.name}'s loop {scope.name}: it is not one of "
                f"{parent.name}'s current loops ({_names(parent.leaf_iter_vars)})"
            )
        parent._leaf(scope, "compute_at")
        if not _reads_transitively(parent.op, self):
            raise self._fail(
                f"cannot compute_at stage {parent.name}: {parent.name} does not read "
                f"{self.name}; attach a stage inside one of its consumers"
            )
        self.attach_type = "scope"
        self.attach_stage = parent
        self.attach_ivar = scope

    def __repr__(self) -> str:
        loops = []
        for v in self.leaf_iter_vars:
            kind = self.iter_var_attrs.get(v)
            loops.append(f"{v.name}:{kind.value}" if kind else v.name)
        where = self.attach_type
        if self.attach_type == "scope" and self.attach_stage and self.attach_ivar:
            where = f"at {self.attach_stage.name}.{self.attach_ivar.name}"
        return f"stage({self.name}, [{', '.join(loops)}], {where})"


def _reads_transitively(op: Operation, producer: Stage) -> bool:
    """Does ``op`` read ``producer``'s tensor, directly or through other operations (as the
    schedule now computes them: a stage that cache_write or rfactor rewrote reads what its
    new operation reads)?"""
    targets = (producer.op, producer.origin_op)
    stage_map = producer.schedule.stage_map
    seen: set[int] = set()
    stack = [op]
    keep: list[Operation] = []
    while stack:
        cur = stack.pop()
        for t in cur.input_tensors:
            if any(t.op is x for x in targets):
                return True
            current = stage_map[t.op].op if t.op in stage_map else t.op
            for nxt in (t.op, current):
                if id(nxt) not in seen:
                    seen.add(id(nxt))
                    keep.append(nxt)
                    stack.append(nxt)
    return False


class Schedule:
    """The stages of every operation reachable from ``outputs``, producers first."""

    def __init__(self, outputs: Sequence[Operation]) -> None:
        self.outputs: list[Operation] = list(outputs)
        self.stages: list[Stage] = []
        self.stage_map: dict[Operation, Stage] = {}
        for op in post_dfs_order(self.outputs):
            stage = Stage(op, self)
            self.stages.append(stage)
            self.stage_map[op] = stage

    def __getitem__(self, key: Tensor | Operation) -> Stage:
        op = key.op if isinstance(key, Tensor) else key
        stage = self.stage_map.get(op) if isinstance(op, Operation) else None
        if stage is None:
            name = getattr(op, "name", repr(key))
            raise ScheduleError(
                f"{name} is not part of this schedule (its stages are "
                f"{', '.join(s.name for s in self.stages)}); create the schedule from the "
                "outputs that read it"
            )
        return stage

    def cache_write(self, tensor: Tensor, scope: str = "local") -> Tensor:
        """Compute ``tensor`` into a temporary first and copy it out afterwards.

        Returns the temporary (``<name>.<scope>``), a new stage just before the original one;
        the original stage becomes the copy and keeps its axes, so ``tensor.op.axis`` still
        names its loops. Typical use: ``compute_at`` the temporary inside a tile of the copy
        (register blocking). Call it before other primitives on ``tensor``'s stage."""
        if scope not in ("local", "global"):
            raise ScheduleError(f"cache_write of {tensor.name}: scope must be 'local' or "
                                f"'global', not {scope!r}")
        stage = self[tensor]
        op = stage.op
        if not isinstance(op, ComputeOp):
            raise stage._fail("cache_write of a placeholder; only computed tensors have one")
        if stage.relations or stage.iter_var_attrs or stage.attach_type != "root":
            raise stage._fail(
                "cache_write must come before other schedule primitives on this stage (it "
                "already has splits, fuses, loop kinds or an attachment)"
            )
        new_axis = [IterVar(Range(iv.dom.min, iv.dom.extent), Var(iv.name), DATA_PAR)
                    for iv in op.axis]
        body = substitute_axes(op.body, {old.var: new.var for old, new in zip(op.axis,
                                                                              new_axis)})
        cache_op = ComputeOp(f"{op.name}.{scope}", op.tag, op.attrs, new_axis, body)
        cache = cache_op.output(0)
        copy_op = ComputeOp(op.name, op.tag, op.attrs, op.axis,
                            cache[tuple(iv.var for iv in op.axis)])
        stage.op = copy_op
        stage.all_iter_vars = list(op.axis)
        stage.leaf_iter_vars = list(op.axis)
        self.stage_map[copy_op] = stage
        cache_stage = Stage(cache_op, self)
        self.stage_map[cache_op] = cache_stage
        self.stages.insert(self.stages.index(stage), cache_stage)
        return cache

    def cache_read(self, tensor: Tensor, scope: str, readers: Sequence[Tensor | Operation]
                   ) -> Tensor:
        """Copy ``tensor`` into a temporary of ``scope`` that ``readers`` read instead.

        Returns the copy (``<name>.<scope>``), a new stage just after ``tensor``'s; the
        readers' stages keep their loops. Typical use on a GPU: ``set_scope`` is implied,
        and the copy is ``compute_at`` a tile loop of the reader and bound to its threads
        (each block fetches the operands of its tile once, together)."""
        if scope not in STAGE_SCOPES:
            raise ScheduleError(f"cache_read of {tensor.name}: scope must be one of "
                                f"{', '.join(STAGE_SCOPES)}, not {scope!r}")
        source = self[tensor]
        reader_stages = [self[r] for r in readers]
        if not reader_stages:
            raise ScheduleError(f"cache_read of {tensor.name} needs at least one reader")
        axes = [IterVar(Range(0, int(d)), Var(f"ax{i}"), DATA_PAR)
                for i, d in enumerate(tensor.shape)]
        copy_op = ComputeOp(f"{tensor.op.name}.{scope}", "", {}, axes,
                            tensor[tuple(iv.var for iv in axes)])
        copy = copy_op.output(0)
        for stage in reader_stages:
            op = stage.op
            if not isinstance(op, ComputeOp) or not any(
                    t.op is tensor.op for t in op.input_tensors):
                raise stage._fail(f"cache_read of {tensor.name}: {stage.name} does not read it")
            new_op = ComputeOp(op.name, op.tag, op.attrs, op.axis,
                               replace_reads(op.body, tensor, copy))
            stage.op = new_op
            self.stage_map[new_op] = stage
        copy_stage = Stage(copy_op, self)
        copy_stage.scope = scope
        self.stage_map[copy_op] = copy_stage
        self.stages.insert(self.stages.index(source) + 1, copy_stage)
        return copy

    def rfactor(self, tensor: Tensor, parts: int) -> Tensor:
        """Reduce ``tensor``'s reduction in two steps: ``parts`` partial results first, each
        over every ``parts``-th element (partial ``p`` folds elements ``p``, ``p + parts``,
        ...; the identity past the end), then the partials. Returns the partials
        (``<name>.rf``, axes: ``tensor``'s, then one of ``parts``), a new stage just before
        ``tensor``'s, which now folds them over a reduction axis of ``parts``. On a GPU the
        partials' last axis is bound to threads: each folds its share, and one pass over the
        partials finishes the reduction. Call it before other primitives on the stage."""
        from .reduction import Reduce

        stage = self[tensor]
        op = stage.op
        if not isinstance(op, ComputeOp) or not isinstance(op.body, Reduce):
            raise stage._fail("rfactor needs a reduction (a te.compute whose body is one)")
        if len(op.reduce_axis) != 1:
            raise stage._fail(f"rfactor needs one reduction axis; this one has "
                              f"{len(op.reduce_axis)} (reduce them in two computes first)")
        if stage.relations or stage.iter_var_attrs or stage.attach_type != "root":
            raise stage._fail("rfactor must come before other schedule primitives on this stage")
        if isinstance(parts, bool) or not isinstance(parts, int) or parts <= 0:
            raise stage._fail(f"rfactor: parts must be a positive int, got {parts!r}")
        body = op.body
        (r,) = op.reduce_axis
        extent, start = int(r.dom.extent), r.dom.min
        steps = -(-extent // parts)
        new_axis = [IterVar(Range(iv.dom.min, iv.dom.extent), Var(iv.name), DATA_PAR)
                    for iv in op.axis]
        part = IterVar(Range(0, parts), Var(f"{r.name}_part"), DATA_PAR)
        step = IterVar(Range(0, steps), Var(f"{r.name}_step"), REDUCE)
        position = step.var * parts + part.var
        source = substitute_axes(body.source, {
            **{old.var: new.var for old, new in zip(op.axis, new_axis)},
            r.var: position + start})
        if steps * parts != extent:
            source = select(position < extent, source, body.combiner.identity)
        partial_op = ComputeOp(f"{op.name}.rf", op.tag, op.attrs, [*new_axis, part],
                               Reduce(body.combiner, source, [step]))
        partial = partial_op.output(0)
        fold = IterVar(Range(0, parts), Var(f"{r.name}_parts"), REDUCE)
        final_op = ComputeOp(op.name, op.tag, op.attrs, op.axis, Reduce(
            body.combiner, partial[(*[iv.var for iv in op.axis], fold.var)], [fold]))
        stage.op = final_op
        stage.all_iter_vars = [*op.axis, fold]
        stage.leaf_iter_vars = [*op.axis, fold]
        self.stage_map[final_op] = stage
        partial_stage = Stage(partial_op, self)
        self.stage_map[partial_op] = partial_stage
        self.stages.insert(self.stages.index(stage), partial_stage)
        return partial

    def __repr__(self) -> str:
        return "schedule(\n" + "\n".join(f"  {s!r}" for s in self.stages) + "\n)"


def create_schedule(ops: Any) -> Schedule:
    """A default schedule for the operations (or tensors) ``ops`` and everything they read:
    every stage computed at root, one serial loop per axis."""
    outputs = _as_ops(ops)
    if not outputs:
        raise ScheduleError("create_schedule needs at least one operation")
    for op in outputs:
        if isinstance(op, PlaceholderOp):
            raise ScheduleError(f"create_schedule: {op.name} is a placeholder, not a computed "
                                "output")
    return Schedule(outputs)


__all__ = ["DATA_PAR", "REDUCE", "Fuse", "Schedule", "Split", "Stage", "ThreadAxis",
           "create_schedule", "thread_axis"]
