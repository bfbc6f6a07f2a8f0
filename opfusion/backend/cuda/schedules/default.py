"""The GPU default schedule: one thread per output element, for every group no rule takes.

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
``elements`` per thread (1 to 8, or 0, the default: 8 for stages of 1M elements or more,
where memory bandwidth is the limit, else 1). A GPU keeps its memory busy only with tens of
KiB of loads in flight per multiprocessor, and one float per resident thread is 8 KiB: on
an H200 a 64M-element chain took 0.213 ms with one element per thread (256 threads), 0.177
with 4 and 0.174 with 8, against a copy bound of 0.128."""

from __future__ import annotations

from typing import Any

from .... import te
from ....target import Target
from ...schedule_rule import Config, ConfigSpace, Knob, ScheduleRule

#: Threads per block of the default schedule.
DEFAULT_THREADS = 256
#: Elements per thread of large elementwise stages, and what "large" is: enough blocks of
#: ``DEFAULT_THREADS * ELEMENTS`` elements to fill a big GPU several times over.
LARGE_ELEMENTS = 8
LARGE_EXTENT = 1 << 20


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
        ])

    def default_config(self, anchor: Any, output: Any, target: Target) -> Config:
        return self.space(anchor, output, target).config(threads=DEFAULT_THREADS, elements=0)

    def apply(self, s: te.Schedule, anchor: Any, output: Any, target: Target,
              config: Config) -> None:
        arrange_elementwise(s, int(config["threads"]), int(config["elements"]))


def arrange_elementwise(s: te.Schedule, threads: int, elements: int = 1) -> None:
    """Every root stage that no rule arranged: ``elements`` elements per thread (0: by the
    stage's size; module docstring)."""
    for stage in s.stages:
        op = stage.op
        if not isinstance(op, te.ComputeOp) or stage.attach_type != "root" or not op.axis:
            continue
        if stage.relations or stage.iter_var_attrs:
            continue  # a rule already arranged it
        per_thread = elements or _elements_for(op)
        bind_flat(stage, list(op.axis), threads, per_thread)


def _elements_for(op: te.ComputeOp) -> int:
    """Elements per thread for a stage of ``op``'s size (the ``elements=0`` heuristic)."""
    count = 1
    for axis in op.axis:
        count *= int(axis.dom.extent)
    return LARGE_ELEMENTS if count >= LARGE_EXTENT else 1


def accumulator_and_owner(s: te.Schedule, anchor: Any, output: Any) -> tuple[Any, te.Stage]:
    """The accumulating tensor of a tiled rule and the stage whose tiles own it: the group's
    epilogue, or, when the anchor is the result, the anchor's stage computing from a local
    copy (``cache_write``), so that the accumulation stays in registers until the store."""
    if output.op is anchor.op:
        return s.cache_write(anchor, "local"), s[anchor]
    return anchor, s[output]


def bind_flat(stage: te.Stage, axes: list[te.IterVar], threads: int,
              elements: int = 1) -> None:
    """Fuse ``axes`` (data axes, outermost first) and bind them to blocks of ``threads``
    threads, each computing ``elements`` elements ``threads`` apart in an unrolled loop
    (fewer when the stage has fewer blocks' worth)."""
    fused = stage.fuse(*axes) if len(axes) > 1 else axes[0]
    if int(fused.dom.extent) <= threads:
        stage.bind(fused, "threadIdx.x")
        return
    outer, inner = stage.split(fused, factor=threads)
    elements = min(elements, int(outer.dom.extent))
    if elements > 1:
        block, step = stage.split(outer, factor=elements)
        stage.reorder(block, inner, step)
        stage.bind(block, "blockIdx.x")
        stage.unroll(step)
    else:
        stage.bind(outer, "blockIdx.x")
    stage.bind(inner, "threadIdx.x")
