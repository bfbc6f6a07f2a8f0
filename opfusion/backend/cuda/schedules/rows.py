"""GPU rows (nn.softmax, nn.log_softmax, nn.layer_norm along the last axis, and nn.attention
as :mod:`opfusion.topi.gpu` computes it: rows of scores per query): one block per row, its
threads across the row.

The group's result (the normalized rows, or an elementwise epilogue of them) is computed by
one block per row (the leading axes fused, ``blockIdx.x``), each thread taking every
``threads``-th element of the row. Every intermediate stage is computed inside that block:

- a stage along the row (softmax's exponentials, a blocked sum's partials) in shared memory,
  its elements spread over the threads the same way;
- a per-row reduction (the maximum, a sum) that is long enough is split by
  :meth:`~opfusion.te.Schedule.rfactor` into one partial per thread in shared memory, those
  by the first warp's threads into one per lane (with more than a warp of threads), then
  folded by each thread into a register of its own; a short one is folded by each thread
  directly.

Barriers separate the stages that read what other threads wrote. Knob: ``threads`` per block.
A row whose shared stages do not fit the target's shared memory is left to the default
schedule."""

from __future__ import annotations

from typing import Any

import numpy as np

from .... import te
from ....target import Target
from ...schedule_rule import Config, ConfigSpace, Knob, ScheduleRule
from .default import DEFAULT_THREADS, arrange_elementwise

#: Threads of a warp (the second level of a split reduction).
WARP = 32


class GPURowsRule(ScheduleRule):
    """One block per row: see the module docstring."""

    name = "gpu_rows"
    ops = ("nn.softmax", "nn.log_softmax", "nn.layer_norm", "nn.attention")

    def space(self, anchor: Any, output: Any, target: Target) -> ConfigSpace | None:
        if tuple(output.shape) != tuple(anchor.shape) or len(anchor.shape) < 1:
            return None
        limit = target.max_threads_per_block
        return ConfigSpace(self.name, [
            Knob("threads", tuple(t for t in (32, 64, 128, 256, 512, 1024) if t <= limit),
                 "threads per block (per row)"),
        ])

    def default_config(self, anchor: Any, output: Any, target: Target) -> Config:
        space = self.space(anchor, output, target)
        assert space is not None
        # the longest row any stage computes (attention's scores run along the keys)
        width = max(int(op.output(0).shape[-1]) for op in te.post_dfs_order([anchor.op])
                    if isinstance(op, te.ComputeOp) and len(op.output(0).shape) == anchor.ndim)
        threads = 32
        while threads < 256 and threads * 4 < width:  # about four elements per thread
            threads *= 2
        return space.config(threads=threads)

    def apply(self, s: te.Schedule, anchor: Any, output: Any, target: Target,
              config: Config) -> None:
        if not arrange_rows(s, output, int(config["threads"]),
                            target.max_shared_memory_per_block):
            arrange_elementwise(s, DEFAULT_THREADS)


def arrange_rows(s: te.Schedule, output: Any, threads: int, shared_bytes: int) -> bool:
    """The schedule of the module docstring; False (nothing changed) when the group's stages
    are not all rows of the output's rows, or their shared stages would not fit."""
    rows = tuple(int(d) for d in output.shape[:-1])
    stages = [st for st in s.stages if isinstance(st.op, te.ComputeOp)
              and st.attach_type != "inline" and st.op is not output.op]
    plan = []
    used = 0
    for stage in stages:
        shape = tuple(int(d) for d in stage.op.output(0).shape)
        if shape == rows:
            plan.append((stage, "scalar"))
        elif shape[:-1] == rows and len(shape) == len(rows) + 1:
            plan.append((stage, "row"))
            used += shape[-1] * np.dtype(stage.op.output(0).dtype).itemsize
        else:
            return False
        if stage.relations or stage.iter_var_attrs or stage.attach_type != "root":
            return False
    if used > shared_bytes:
        return False
    owner = s[output]
    *lead, last = owner.op.axis
    row = owner.fuse(*lead) if len(lead) > 1 else (lead[0] if lead else None)
    _, inner = owner.split(last, factor=threads)  # the outer part: rounds, serial
    if row is not None:
        owner.bind(row, "blockIdx.x")
    owner.bind(inner, "threadIdx.x")
    for stage, kind in plan:
        if kind == "row":
            stage.set_scope("shared")
            if row is not None:
                stage.compute_at(owner, row)
            _spread(stage, threads)
            continue
        op = stage.op
        reduce_axis = op.reduce_axis
        if len(reduce_axis) == 1 and int(reduce_axis[0].dom.extent) >= 2 * threads:
            # a partial per thread, then (from more than a warp of them) a partial per lane
            # of one warp, so that each thread's own fold reads a warp's worth, not all
            for parts in (threads, WARP) if threads > WARP else (threads,):
                partial = s.rfactor(op.output(0), parts)
                part_stage = s[partial]
                part_stage.set_scope("shared")
                if row is not None:
                    part_stage.compute_at(owner, row)
                part_stage.bind(part_stage.op.axis[-1], "threadIdx.x")
        if row is not None:
            s[stage.op.output(0)].compute_at(owner, row)
    return True


def _spread(stage: te.Stage, threads: int) -> None:
    """A row-wide stage's elements over the block's threads: element k on thread k % T."""
    last = stage.op.axis[-1]
    _, inner = stage.split(last, factor=threads)
    stage.bind(inner, "threadIdx.x")
