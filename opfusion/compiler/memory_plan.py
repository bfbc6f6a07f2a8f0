"""Static memory planning: which intermediate tensor lives in which block of memory.

Sizes are known at compile time, so the plan is made once. Steps run in order; a tensor is
live from the step that writes it to the last step that reads it. When a step starts, its
outputs take free blocks (the smallest that fits, else a new block, or the largest free
block grown to fit); the blocks of tensors whose last reader is this step become free only
after it, because a kernel's output must never share memory with its inputs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import OutOfMemoryError
from .limits import bytes_text

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

    @property
    def block_offsets(self) -> list[int]:
        """Where each block starts in a run's workspace: the blocks lie one after another
        (each size is a multiple of ``ALIGNMENT``, so every block is aligned)."""
        offsets, offset = [], 0
        for size in self.block_sizes:
            offsets.append(offset)
            offset += size
        return offsets

    @property
    def workspace_bytes(self) -> int:
        """The size of one run's workspace: every block, one after another."""
        return self.total_bytes

    def allocate_workspace(self, describe: Callable[[int], str] | None = None
                           ) -> tuple[np.ndarray, list[np.ndarray]]:
        """Fresh, uninitialized memory for the plan: one ``ALIGNMENT``-aligned byte array (the
        workspace the native entry takes) and each block as a view of it, at
        :attr:`block_offsets`. Each concurrent run needs its own (see
        ``executor.WorkspacePool``). OutOfMemoryError if the machine does not give it, naming
        the largest block with ``describe(block)`` (e.g. the values it holds)."""
        name = describe or (lambda block: f"block {block} of the memory plan")
        largest = max(range(len(self.block_sizes)), key=self.block_sizes.__getitem__,
                      default=None)
        if largest is None or len(self.block_sizes) == 1:
            what = "the workspace" if largest is None else name(largest)
        else:
            what = (f"the workspace of {len(self.block_sizes)} blocks (the largest: "
                    f"{name(largest)})")
        workspace = aligned_empty(self.workspace_bytes, what)
        blocks = [workspace[offset:offset + size]
                  for offset, size in zip(self.block_offsets, self.block_sizes)]
        return workspace, blocks


def aligned_empty(nbytes: int, what: str = "a buffer") -> np.ndarray:
    """An uninitialized byte array of ``nbytes`` whose first byte is ``ALIGNMENT``-aligned;
    OutOfMemoryError naming ``what`` and the size if the machine does not give it."""
    raw = allocate(lambda: np.empty(nbytes + ALIGNMENT, dtype=np.uint8), nbytes, what)
    offset = (-raw.ctypes.data) % ALIGNMENT
    return raw[offset:offset + nbytes]


def allocate(make: Callable[[], np.ndarray], nbytes: int, what: str) -> np.ndarray:
    """``make()``, an allocation of ``nbytes`` for ``what``, with NumPy's failures for a size
    the machine (MemoryError) or NumPy (ValueError: a dimension or byte count past its
    int64 range) cannot hold reported as an OutOfMemoryError naming ``what``. Every
    allocation of the executor goes through here."""
    try:
        return make()
    except (MemoryError, ValueError) as err:
        advice = ("free memory (other processes, earlier results), or lower "
                  "compile.max_allocation_bytes so that opf.compile refuses such a model"
                  if isinstance(err, MemoryError) else
                  "that is more than NumPy can address; check the shapes")
        raise OutOfMemoryError(f"could not allocate {bytes_text(nbytes)} for {what} "
                               f"({type(err).__name__}: {err}): {advice}") from err


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
