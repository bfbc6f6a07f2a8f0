"""GPU products (nn.dense, nn.matmul, nn.batch_matmul): block tiles, register tiles and
operands staged in shared memory.

The result's last two axes (rows i, columns j) are cut into block tiles of ``block_rows`` x
``block_cols``, one GPU block each (``blockIdx.y``, ``blockIdx.x``; the batch axes, fused,
``blockIdx.z``). A block's threads form a grid of ``block_rows / thread_rows`` x
``block_cols / thread_cols`` (``threadIdx.y``, ``threadIdx.x``); each thread accumulates a
``thread_rows`` x ``thread_cols`` register tile over the contraction. With ``shared`` on,
the contraction runs in steps of ``k_step``: at each step the block's threads copy the
block's rows of the left operand and columns of the right one for that step into shared
memory together (consecutive threads, consecutive elements: coalesced), wait at a barrier,
and accumulate from shared memory; the next copy waits until every thread is done reading.
The elementwise epilogue (bias, activation, residual) is applied to the register tile
before the store, since the accumulating stage is computed at the owner's thread loop.

Knobs: ``block_rows``, ``block_cols`` (16, 32, 64), ``thread_rows``, ``thread_cols`` (1, 2,
4), ``k_step`` (8, 16, 32), ``shared``. A space point must give blocks of 32 to 1024
threads (a whole warp at least) whose shared tiles fit the target's shared memory."""

from __future__ import annotations

from typing import Any

import numpy as np

from .... import te
from ....target import Target
from ...schedule_rule import Config, ConfigSpace, Knob, KnobValue, ScheduleRule
from ..emitter import MAX_GRID
from .default import DEFAULT_THREADS, accumulator_and_owner, arrange_elementwise

#: The blocks a launch may have along ``blockIdx.y`` and ``blockIdx.z`` (CUDA's limit).
MAX_GRID_Z = MAX_GRID[2]


class GPUMatmulRule(ScheduleRule):
    """Tiled products: see the module docstring."""

    name = "gpu_matmul"
    ops = ("nn.dense", "nn.matmul", "nn.batch_matmul")

    def space(self, anchor: Any, output: Any, target: Target) -> ConfigSpace | None:
        if not _takes(anchor, output):
            return None
        limit = target.max_threads_per_block
        shared_bytes = target.max_shared_memory_per_block
        itemsize = np.dtype(anchor.dtype).itemsize

        def fits(c: dict[str, KnobValue]) -> bool:
            threads = (int(c["block_rows"]) // int(c["thread_rows"])) * (
                int(c["block_cols"]) // int(c["thread_cols"]))
            tiles = (int(c["block_rows"]) + int(c["block_cols"])) * int(c["k_step"])
            return 32 <= threads <= limit and (not c["shared"]
                                               or tiles * itemsize <= shared_bytes)

        fits.__doc__ = "blocks of 32 to the target's threads whose tiles fit shared memory"
        return ConfigSpace(self.name, [
            Knob("block_rows", (16, 32, 64), "result rows per block"),
            Knob("block_cols", (16, 32, 64), "result columns per block"),
            Knob("thread_rows", (1, 2, 4), "rows of each thread's register tile"),
            Knob("thread_cols", (1, 2, 4), "columns of each thread's register tile"),
            Knob("k_step", (8, 16, 32), "contraction steps per shared-memory stage"),
            Knob("shared", (True, False), "stage the operands' tiles in shared memory"),
        ], fits)

    def default_config(self, anchor: Any, output: Any, target: Target) -> Config:
        space = self.space(anchor, output, target)
        assert space is not None
        rows, cols = (int(d) for d in anchor.shape[-2:])
        batch = _batch(anchor)
        # Few rows (a batch-1 dense): narrow, wide blocks, so that every column still has a
        # thread.
        if rows <= 16:
            return space.config(block_rows=16, block_cols=64, thread_rows=1, thread_cols=2,
                                k_step=32, shared=True)
        # Else the largest tile that still gives every multiprocessor a block: the
        # classifier of ResNet-50 at batch 32 (32 x 1000) in 64 x 64 tiles was 16 blocks
        # for 132 multiprocessors, 1.32 ms on an H200, and 0.12 ms in 16 x 16 tiles.
        for tile in _TILES:
            blocks = batch * -(-rows // tile["block_rows"]) * -(-cols // tile["block_cols"])
            if blocks >= target.multiprocessors:
                break
        return space.config(**tile)

    def apply(self, s: te.Schedule, anchor: Any, output: Any, target: Target,
              config: Config) -> None:
        arrange_product(s, anchor, output, int(config["block_rows"]),
                        int(config["block_cols"]), int(config["thread_rows"]),
                        int(config["thread_cols"]), int(config["k_step"]),
                        bool(config["shared"]))
        arrange_elementwise(s, DEFAULT_THREADS)


#: The heuristic's tiles, largest first: 4 x 4 register tiles of 256 threads, 2 x 2 of
#: 256, 1 x 4 of 64.
_TILES = (
    {"block_rows": 64, "block_cols": 64, "thread_rows": 4, "thread_cols": 4, "k_step": 16,
     "shared": True},
    {"block_rows": 32, "block_cols": 32, "thread_rows": 2, "thread_cols": 2, "k_step": 16,
     "shared": True},
    {"block_rows": 16, "block_cols": 16, "thread_rows": 1, "thread_cols": 4, "k_step": 16,
     "shared": True},
)


def _batch(anchor: Any) -> int:
    """The product's batch: its axes before the rows and columns, fused (blockIdx.z)."""
    batch = 1
    for d in anchor.shape[:-2]:
        batch *= int(d)
    return batch


def _takes(anchor: Any, output: Any) -> bool:
    """Products with one contraction whose result (or its same-shaped epilogue) is the
    group's output, and whose batch fits the grid."""
    op = anchor.op
    if not isinstance(op, te.ComputeOp) or len(op.reduce_axis) != 1 or len(op.axis) < 2:
        return False
    if tuple(output.shape) != tuple(anchor.shape):
        return False
    batch = _batch(anchor)
    # the row tiles go on blockIdx.y (at most 65535 of them, even for tiles of 16 rows)
    return batch <= MAX_GRID_Z and -(-int(anchor.shape[-2]) // 16) <= MAX_GRID_Z


def arrange_product(s: te.Schedule, anchor: Any, output: Any, block_rows: int,
                    block_cols: int, thread_rows: int, thread_cols: int, k_step: int,
                    shared: bool) -> None:
    """The tiling of the module docstring with explicit knobs."""
    acc, owner = accumulator_and_owner(s, anchor, output)
    *batch, i, j = owner.op.axis
    io, ii = owner.split(i, factor=block_rows)
    jo, ji = owner.split(j, factor=block_cols)
    ty, ri = owner.split(ii, factor=thread_rows)
    tx, rj = owner.split(ji, factor=thread_cols)
    owner.reorder(*batch, io, jo, ty, tx, ri, rj)
    if batch:
        owner.bind(owner.fuse(*batch) if len(batch) > 1 else batch[0], "blockIdx.z")
    owner.bind(io, "blockIdx.y")
    owner.bind(jo, "blockIdx.x")
    owner.bind(ty, "threadIdx.y")
    owner.bind(tx, "threadIdx.x")
    stage = s[acc]
    stage.compute_at(owner, tx)
    *_, ai, aj = stage.op.axis
    (k,) = stage.op.reduce_axis
    ko, ki = stage.split(k, factor=k_step)
    stage.reorder(ko, ki, ai, aj)
    if not shared:
        return
    for operand in _operands(acc):
        copy = s.cache_read(operand, "shared", [acc])
        s[copy].compute_at(stage, ko)
        cooperative_copy(s[copy], int(ty.dom.extent), int(tx.dom.extent))


def _operands(acc: Any) -> list[Any]:
    """The tensors the product reads (its two operands, placeholders or computed)."""
    return list(acc.op.input_tensors)[:2]


def cooperative_copy(stage: te.Stage, threads_y: int, threads_x: int) -> None:
    """The block's threads copy a tile together: its elements in order, thread after
    thread (``threadIdx.x`` fastest), as many rounds as it takes. ``threads_y`` x
    ``threads_x`` must be the thread grid of the stage it is computed for (the extents of
    its bound loops, a block tile cut to the result): a longer copy loop would make threads
    past the owner's extent, which skip the owner's barriers."""
    axes = list(stage.op.axis)
    fused = stage.fuse(*axes) if len(axes) > 1 else axes[0]
    _, inside = stage.split(fused, factor=threads_y * threads_x)  # the rounds, serial
    ty, tx = stage.split(inside, factor=threads_x)
    stage.bind(ty, "threadIdx.y")
    stage.bind(tx, "threadIdx.x")
