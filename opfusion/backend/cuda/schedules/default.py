"""The GPU default schedule: one thread per output element, for every group no rule takes.

Each root stage (the group's result, and each reduction or other stage not inlined into it)
is one launch: its data axes fused into one index, split into blocks of ``threads`` threads
(``blockIdx.x`` x ``threadIdx.x``); a thread computes its element whole, reductions in a
serial loop. Consecutive threads write consecutive elements (the innermost axis is the
fused index's fastest), so stores coalesce. A stage without data axes (a sum to a scalar)
runs on one thread.

Knob: ``threads`` per block (a multiple of the warp, 32 to 1024; 256 by default: enough warps
per block to hide latency, blocks small enough to spread over every multiprocessor)."""

from __future__ import annotations

from typing import Any

from .... import te
from ....target import Target
from ...schedule_rule import Config, ConfigSpace, Knob, ScheduleRule

#: Threads per block of the default schedule.
DEFAULT_THREADS = 256


class GPUDefaultRule(ScheduleRule):
    """One thread per element of each root stage."""

    name = "gpu_default"
    ops = ()

    def space(self, anchor: Any, output: Any, target: Target) -> ConfigSpace:
        limit = target.max_threads_per_block
        return ConfigSpace(self.name, [
            Knob("threads", tuple(t for t in (64, 128, 256, 512, 1024) if t <= limit),
                 "threads per block, each computing one element"),
        ])

    def default_config(self, anchor: Any, output: Any, target: Target) -> Config:
        return self.space(anchor, output, target).config(threads=DEFAULT_THREADS)

    def apply(self, s: te.Schedule, anchor: Any, output: Any, target: Target,
              config: Config) -> None:
        arrange_elementwise(s, int(config["threads"]))


def arrange_elementwise(s: te.Schedule, threads: int) -> None:
    """Every root stage that no rule arranged: one thread per element (module docstring)."""
    for stage in s.stages:
        op = stage.op
        if not isinstance(op, te.ComputeOp) or stage.attach_type != "root" or not op.axis:
            continue
        if stage.relations or stage.iter_var_attrs:
            continue  # a rule already arranged it
        bind_flat(stage, list(op.axis), threads)


def accumulator_and_owner(s: te.Schedule, anchor: Any, output: Any) -> tuple[Any, te.Stage]:
    """The accumulating tensor of a tiled rule and the stage whose tiles own it: the group's
    epilogue, or, when the anchor is the result, the anchor's stage computing from a local
    copy (``cache_write``), so that the accumulation stays in registers until the store."""
    if output.op is anchor.op:
        return s.cache_write(anchor, "local"), s[anchor]
    return anchor, s[output]


def bind_flat(stage: te.Stage, axes: list[te.IterVar], threads: int) -> None:
    """Fuse ``axes`` (data axes, outermost first) and bind them to blocks of ``threads``."""
    fused = stage.fuse(*axes) if len(axes) > 1 else axes[0]
    if int(fused.dom.extent) <= threads:
        stage.bind(fused, "threadIdx.x")
        return
    outer, inner = stage.split(fused, factor=threads)
    stage.bind(outer, "blockIdx.x")
    stage.bind(inner, "threadIdx.x")
