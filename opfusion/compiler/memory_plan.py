"""Static memory planning: which intermediate tensor lives in which block of memory.

Sizes are known at compile time, so the plan is made once. Steps run in order; a tensor is
live from the step that writes it to the last step that reads it. When a step starts, its
outputs take free blocks (the smallest that fits, else a new block, or the largest free
block grown to fit); the blocks of tensors whose last reader is this step become free only
after it, because a kernel's output must never share memory with its inputs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

ALIGNMENT = 64  # bytes: a cache line, and enough for any vector load


@dataclass(frozen=True)
class PlannedStep:
    """What the planner needs of one step: the values it reads and the values it writes."""

    reads: tuple[int, ...]
    writes: tuple[int, ...]


@dataclass
class MemoryPlan:
    """``block_of[value]`` is the block holding an intermediate value; ``block_sizes`` the
    byte size of each block. ``naive_bytes`` is what one buffer per value would take."""

    block_of: dict[int, int]
    block_sizes: list[int]
    naive_bytes: int

    @property
    def total_bytes(self) -> int:
        return sum(self.block_sizes)


def _aligned(nbytes: int) -> int:
    return max(ALIGNMENT, (nbytes + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT)


def plan_memory(steps: Sequence[PlannedStep], nbytes: dict[int, int],
                keep: Sequence[int] = ()) -> MemoryPlan:
    """Assign a block to every value in ``nbytes`` (the intermediates, with their sizes).

    Values in ``keep`` (the results) are never freed; values not in ``nbytes`` (inputs and
    constants) are not planned."""
    last_read: dict[int, int] = {}
    for index, step in enumerate(steps):
        for value in step.reads:
            if value in nbytes:
                last_read[value] = index
    kept = set(keep)
    block_of: dict[int, int] = {}
    sizes: list[int] = []
    free: list[int] = []  # block ids, kept in creation order for determinism
    for index, step in enumerate(steps):
        for value in step.writes:
            if value not in nbytes or value in block_of:
                continue
            block_of[value] = _take_block(_aligned(nbytes[value]), sizes, free)
        for value in dict.fromkeys(step.reads + step.writes):
            if value in block_of and value not in kept and last_read.get(value, -1) <= index:
                block = block_of[value]
                if block not in free:
                    free.append(block)
    naive = sum(_aligned(size) for size in nbytes.values())
    return MemoryPlan(block_of, sizes, naive)


def _take_block(size: int, sizes: list[int], free: list[int]) -> int:
    fitting = [b for b in free if sizes[b] >= size]
    if fitting:
        block = min(fitting, key=lambda b: (sizes[b], b))
    elif free:
        block = max(free, key=lambda b: (sizes[b], -b))
        sizes[block] = size  # grow the largest free block rather than add one
    else:
        sizes.append(size)
        return len(sizes) - 1
    free.remove(block)
    return block
