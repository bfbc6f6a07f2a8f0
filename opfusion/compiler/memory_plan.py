"""Static memory planning: which intermediate tensor lives in which block of memory.

Sizes are known at compile time, so the plan is made once. Steps run in order; a tensor is
live from the step that writes it to the last step that reads it. When a step starts, its
outputs take free blocks (the smallest that fits, else a new block, or the largest free
block grown to fit); the blocks of tensors whose last reader is this step become free only
after it, because a kernel's output must never share memory with its inputs.

*Aliases* place a value inside another one, at a byte offset: the operands of a
concatenation written where the concatenation's result has them (see
``opfusion.compiler.compile``'s in-place concatenation), so that no step copies them. A value
and everything aliased into it, transitively, are one *storage*, planned as one tensor of
the outermost value's size, live from the first write of any of them to the last use of any
of them.

A *view* is an alias the other way round: a value no step writes, read in place inside the
value that holds it (a contiguous slice of an intermediate: a split's part along the channels
at batch 1). It is made when its holder is; its reads keep the storage alive."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

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
    """``block_of[value]`` is the block holding an intermediate value, at byte
    :meth:`byte_offset` of it (non-zero for a value aliased inside another); ``block_sizes``
    the byte size of each block; ``aliases`` the placements the plan was made with (value:
    (the value holding it, byte offset)). ``naive_bytes`` is what one buffer per value would
    take."""

    block_of: dict[int, int]
    block_sizes: list[int]
    naive_bytes: int
    aliases: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: the aliased values that are views (read in place in their holder, written by no step)
    views: tuple[int, ...] = ()
    _offsets: dict[int, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._offsets = {value: offset
                         for value, (_, offset) in resolve_aliases(self.aliases).items()}

    def byte_offset(self, value: int) -> int:
        """Where ``value`` starts in its block (from its storage's start)."""
        return self._offsets.get(value, 0)

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


def resolve_aliases(aliases: Mapping[int, tuple[int, int]]) -> dict[int, tuple[int, int]]:
    """Each aliased value's storage: (the outermost value holding it, its byte offset there),
    following chains of aliases (a concatenation's result inside the next one's) without
    recursion. ValueError for a cycle."""
    resolved: dict[int, tuple[int, int]] = {}
    for value in aliases:
        chain, seen, current = [], set(), value
        while current in aliases and current not in resolved:
            if current in seen:
                raise ValueError(f"values {chain} are aliased into each other in a cycle")
            chain.append(current)
            seen.add(current)
            current = aliases[current][0]
        root, base = resolved.get(current, (current, 0))
        # every value of the chain, from the last, gets its offset from the root
        for member in reversed(chain):
            base += aliases[member][1]
            resolved[member] = (root, base)
    return resolved


def plan_memory(steps: Sequence[PlannedStep], nbytes: dict[int, int],
                keep: Sequence[int] = (),
                aliases: Mapping[int, tuple[int, int]] | None = None,
                views: Sequence[int] = ()) -> MemoryPlan:
    """Assign a block to every value in ``nbytes`` (the intermediates, with their sizes).

    Values in ``keep`` (the results) are never freed; values not in ``nbytes`` (inputs and
    constants) are not planned. ``aliases`` (value: (value holding it, byte offset)), all of
    them intermediates, share their holder's storage (see the module docstring)."""
    aliases = dict(aliases or {})
    storage = resolve_aliases(aliases)

    def root(value: int) -> int:
        return storage[value][0] if value in storage else value

    last_use: dict[int, int] = {}
    for index, step in enumerate(steps):
        for value in (*step.reads, *step.writes):
            if value in nbytes:
                last_use[root(value)] = index
    kept = {root(v) for v in keep}
    block_of: dict[int, int] = {}
    sizes: list[int] = []
    free: list[int] = []  # block ids, kept in creation order for determinism
    for index, step in enumerate(steps):
        for value in step.writes:
            if value not in nbytes or root(value) in block_of:
                continue
            block_of[root(value)] = _take_block(_aligned(nbytes[root(value)]), sizes, free)
        for value in dict.fromkeys(step.reads + step.writes):
            owner = root(value)
            if owner in block_of and owner not in kept and last_use.get(owner, -1) <= index:
                block = block_of[owner]
                if block not in free:
                    free.append(block)
    for value, (owner, _) in storage.items():
        if owner in block_of:
            block_of[value] = block_of[owner]
    naive = sum(_aligned(size) for size in nbytes.values())
    return MemoryPlan(block_of, sizes, naive, aliases, tuple(views))


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
