"""The GPU default schedule: elements spread over threads, for every group no rule takes.

Each root stage (the group's result, and each reduction or other stage not inlined into it)
is one launch: its data axes fused into one index, split into blocks of ``elements`` x
``threads`` elements (``blockIdx.x``); thread ``t`` (``threadIdx.x``) of a block computes
elements ``t``, ``t + threads``, ... of its block in an unrolled loop, each whole
(reductions in a serial loop). At each step consecutive threads read and write consecutive
elements (the innermost axis is the fused index's fastest), so accesses coalesce; the
unrolled steps are independent, so a thread has ``elements`` loads in flight at once. A
stage without data axes (a sum to a scalar) runs on one thread.

Knobs: ``threads`` per block (a multiple of the warp, 32 to 1024; 256 by default: enough
warps per block to hide latency, blocks small enough to spread over every multiprocessor);
``elements`` steps per thread (1 to 8, or 0, the default: 8 elements in all for stages of
1M elements or more, where memory bandwidth is the limit, else 1 step); ``vector`` (1 or
4): with 4, each step is 4 consecutive elements of the innermost axis (when it holds whole
vectors; else the stage keeps single elements): the inputs of the result's shape are read
into registers with one 16-byte load, the 4 results computed there and stored with one
16-byte store (``float4``, :meth:`~opfusion.backend.cuda.emitter.CUDAEmitter.
_emit_vector_copy`); operands broadcast along the step are read in place. 4 by default.

A GPU keeps its memory busy only with tens of KiB of loads in flight per multiprocessor,
and one float per resident thread is 8 KiB. On an H200 (``benchmarks/gpu.py --sweep``,
kernels back to back) a 64M-element chain took 0.213 ms with one element per thread (256
threads), 0.177 with 4 and 0.174 with 8, against a copy bound of 0.128-0.129; in 16-byte
steps, 0.129-0.131 ms with 1 or 2 steps per thread (64 to 512 threads), 0.134 with 8."""

from __future__ import annotations

from typing import Any

from .... import te
from ....target import Target
from ...schedule_rule import Config, ConfigSpace, Knob, ScheduleRule

#: Threads per block of the default schedule.
DEFAULT_THREADS = 256
#: float32 lanes of one 16-byte access (a CUDA ``float4``), the widest a thread can make.
VECTOR_LANES = 4
#: Elements per thread of large elementwise stages, and what "large" is: enough blocks of
#: ``DEFAULT_THREADS * ELEMENTS`` elements to fill a big GPU several times over.
LARGE_ELEMENTS = 8
LARGE_EXTENT = 1 << 20
#: Consecutive elements per step by default: whole 16-byte vectors, so that a thread's
#: loads in flight are 4 times the bytes for the same instructions.
DEFAULT_VECTOR = VECTOR_LANES


class GPUDefaultRule(ScheduleRule):
    """One thread per element of each root stage."""

    name = "gpu_default"
    ops = ()

    def space(self, anchor: Any, output: Any, target: Target) -> ConfigSpace:
        limit = target.max_threads_per_block
        return ConfigSpace(self.name, [
            Knob("threads", tuple(t for t in (64, 128, 256, 512, 1024) if t <= limit),
                 "threads per block"),
            Knob("elements", (0, 1, 2, 4, 8),
                 "elements per thread, threads apart, unrolled (0: by the stage's size)"),
            Knob("vector", (1, VECTOR_LANES),
                 "consecutive elements per element step, moved with one 16-byte access"),
        ])

    def default_config(self, anchor: Any, output: Any, target: Target) -> Config:
        return self.space(anchor, output, target).config(threads=DEFAULT_THREADS, elements=0,
                                                         vector=DEFAULT_VECTOR)

    def apply(self, s: te.Schedule, anchor: Any, output: Any, target: Target,
              config: Config) -> None:
        arrange_elementwise(s, int(config["threads"]), int(config["elements"]),
                            int(config["vector"]))


def arrange_elementwise(s: te.Schedule, threads: int, elements: int = 1,
                        vector: int = 1) -> None:
    """Every root stage that no rule arranged: ``elements`` elements per thread (0: by the
    stage's size), each ``vector`` consecutive ones where the stage allows (module
    docstring)."""
    for stage in list(s.stages):
        op = stage.op
        if not isinstance(op, te.ComputeOp) or stage.attach_type != "root" or not op.axis:
            continue
        if stage.relations or stage.iter_var_attrs:
            continue  # a rule already arranged it
        if vector > 1 and _vectorizable(op, vector):
            arrange_vectors(s, op.output(0), threads, elements or _elements_for(op, vector),
                            vector)
        else:
            bind_flat(stage, list(op.axis), threads, elements or _elements_for(op))


def _vectorizable(op: te.ComputeOp, lanes: int) -> bool:
    """Whether a stage's innermost axis splits into whole vectors of ``lanes`` (and it is no
    reduction, whose stage is not a plain copy-out)."""
    return not op.reduce_axis and int(op.axis[-1].dom.extent) % lanes == 0


def arrange_vectors(s: te.Schedule, tensor: Any, threads: int, elements: int,
                    lanes: int) -> None:
    """``tensor``'s stage in steps of ``lanes`` consecutive elements: each thread reads the
    inputs of a step that have the result's shape into registers with one vector load
    (``cache_read`` to "local", vectorized), computes the ``lanes`` results into registers
    (``cache_write``), and stores them with one vector store. Steps go ``threads`` apart
    as in :func:`bind_flat`."""
    local = s.cache_write(tensor, "local")
    owner = s[tensor]
    *outer_axes, last = owner.op.axis
    last_outer, lane = owner.split(last, factor=lanes)
    steps = owner.fuse(*outer_axes, last_outer) if outer_axes else last_outer
    step_loop = _bind_steps(owner, steps, threads, elements)
    assert owner.leaf_iter_vars[-1] is lane  # the binding reorders only the steps' loops
    owner.vectorize(lane)
    compute_in_registers(s, local, owner, step_loop, tuple(tensor.shape))


def compute_in_registers(s: te.Schedule, local: Any, owner: te.Stage, step: Any,
                         shape: tuple[Any, ...]) -> None:
    """A thread's vector step of ``owner`` (its last loop vectorized) computed into the
    registers of ``local`` (its ``cache_write``) at loop ``step``, each input of the result's
    ``shape`` loaded whole into registers there (one vector load): what ``owner`` then
    stores as one vector."""
    s[local].compute_at(owner, step)
    s[local].unroll(s[local].op.axis[-1])  # its registers indexed by constants
    for source, readers in full_inputs(s, local, shape):
        copy = s.cache_read(source, "local", readers)
        s[copy].compute_at(owner, step)
        s[copy].vectorize(s[copy].op.axis[-1])


def full_inputs(s: te.Schedule, local: Any, shape: tuple[Any, ...]
                 ) -> list[tuple[Any, list[Any]]]:
    """The group's inputs (placeholders) of the result's ``shape`` that ``local`` reads,
    directly or through stages inlined into it, each with those readers: the operands a
    vector step reads whole. Broadcast operands are read in place, and so is an input that
    other stages (a reduction of the group) read too: they keep reading it from memory."""
    readers_of: dict[Any, list[Any]] = {}
    ops, index = [local.op], 0
    while index < len(ops):  # the stages inlined into ``local``, breadth first
        op = ops[index]
        index += 1
        for source in op.input_tensors:
            if isinstance(source.op, te.PlaceholderOp):
                if tuple(source.shape) == shape and op not in readers_of.setdefault(source, []):
                    readers_of[source].append(op)
            elif s[source].attach_type == "inline" and source.op not in ops:
                ops.append(source.op)
    return list(readers_of.items())


def _elements_for(op: te.ComputeOp, lanes: int = 1) -> int:
    """Steps per thread for a stage of ``op``'s size, each of ``lanes`` elements (the
    ``elements=0`` heuristic): :data:`LARGE_ELEMENTS` elements per thread in all for large
    stages, one step for the rest."""
    count = 1
    for axis in op.axis:
        count *= int(axis.dom.extent)
    return max(1, LARGE_ELEMENTS // lanes) if count >= LARGE_EXTENT else 1


def accumulator_and_owner(s: te.Schedule, anchor: Any, output: Any) -> tuple[Any, te.Stage]:
    """The accumulating tensor of a tiled rule and the stage whose tiles own it: the group's
    epilogue, or, when the anchor is the result, the anchor's stage computing from a local
    copy (``cache_write``), so that the accumulation stays in registers until the store."""
    if output.op is anchor.op:
        return s.cache_write(anchor, "local"), s[anchor]
    return anchor, s[output]


def _bind_steps(stage: te.Stage, fused: te.IterVar, threads: int, elements: int
                ) -> te.IterVar:
    """Bind ``fused`` to blocks of ``threads`` threads, each taking ``elements`` steps
    ``threads`` apart in an unrolled loop (fewer when the stage has fewer blocks' worth),
    and return the innermost loop of a thread's steps (where its registers live)."""
    if int(fused.dom.extent) <= threads:
        stage.bind(fused, "threadIdx.x")
        return fused
    outer, inner = stage.split(fused, factor=threads)
    elements = min(elements, int(outer.dom.extent))
    if elements > 1:
        block, step = stage.split(outer, factor=elements)
        stage.reorder(block, inner, step)
        stage.bind(block, "blockIdx.x")
        stage.bind(inner, "threadIdx.x")
        stage.unroll(step)
        return step
    stage.bind(outer, "blockIdx.x")
    stage.bind(inner, "threadIdx.x")
    return inner


def bind_flat(stage: te.Stage, axes: list[te.IterVar], threads: int,
              elements: int = 1) -> None:
    """Fuse ``axes`` (data axes, outermost first) and bind them to blocks of ``threads``
    threads, each computing ``elements`` elements ``threads`` apart in an unrolled loop
    (fewer when the stage has fewer blocks' worth)."""
    _bind_steps(stage, stage.fuse(*axes) if len(axes) > 1 else axes[0], threads, elements)
