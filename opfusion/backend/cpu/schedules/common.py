"""What the CPU schedule rules share: finding stages by tag, the tiled *owner* of a group,
divisors, parallel loops, blocked sums, the default for untouched stages, and the hardware
facts the heuristics read from the target.

The hardware sizes here were measured on one machine (AVX2 code, 16 vector registers, a
1 MiB per-core L2) and are expressed relative to it, so that the heuristics reproduce those
choices there and scale with another target's registers and caches."""

from __future__ import annotations

import math
from typing import Any

from .... import te
from ....target import Target
from ....topi.reduce import SUM_PARTIAL, SUM_TAIL
from ...schedule_rule import Knob

#: Loops with fewer iterations in all stay serial: starting threads costs more.
PARALLEL_MIN_ELEMENTS = 1 << 12


# ---------------------------------------------------------------------------------------------
# hardware facts, from the target


def accumulators(target: Target) -> int:
    """Vector accumulators a register tile holds by default: 8, or half the vector registers
    when there are fewer than 16. Measured: 8 is best with AVX2's 16 registers (Zen 3) and
    also with AVX-512's 32 (Zen 4, resnet50 58 ms at 8, 104 ms at 12, 127 ms at 16): a
    wider tile loads one broadcast operand per extra accumulator, and the loads, not the
    registers, are what runs out. The spaces still offer tiles up to the register count."""
    return max(2, min(8, target.vector_registers // 2))


def min_tasks(target: Target) -> int:
    """Parallel tasks a convolution is cut into at least (when it has the rows): 16, so that
    any thread count up to 16 finds work and unequal tasks even out; two per core beyond."""
    return max(16, 2 * target.num_cores)


def l2_fraction(target: Target, sixteenths: int) -> int:
    """``sixteenths``/16 of the target's per-core L2 cache, in bytes (the measured sizes were
    fractions of a 1 MiB L2: 192 KiB of weight rows per dot block is 3/16)."""
    return target.cache_bytes(2) * sixteenths // 16


def vector_widths(extent: int, lanes: int) -> tuple[int, ...]:
    """Candidate vector splits of a loop of ``extent``: 1 (not split) and each of half a
    vector, one and two vectors of ``lanes`` that divides it."""
    return (1, *(w for w in (lanes // 2, lanes, 2 * lanes) if w > 1 and extent % w == 0))


def default_vector_width(extent: int, lanes: int) -> int:
    """One vector of ``lanes`` when it divides the row of ``extent``, else 1 (scalar)."""
    return lanes if extent % lanes == 0 else 1


def vector_width_knob(extent: int, lanes: int, what: str) -> Knob:
    return Knob("vector_width", vector_widths(extent, lanes),
                f"elements of {what} per vectorized inner loop (1: not vectorized)")


# ---------------------------------------------------------------------------------------------
# stages and shapes


def producer(tensor: te.Tensor, tag: str) -> te.Tensor | None:
    """The tensor tagged ``tag`` that ``tensor`` reads, directly or through other computed
    stages of the same operator (None if there is none)."""
    stack = [tensor]
    seen: list[Any] = []
    while stack:
        current = stack.pop()
        for t in current.op.input_tensors:
            if not isinstance(t.op, te.ComputeOp) or any(t.op is op for op in seen):
                continue
            if t.op.tag == tag:
                return t
            seen.append(t.op)
            stack.append(t)
    return None


def is_reduction(tensor: te.Tensor) -> bool:
    return isinstance(tensor.op, te.ComputeOp) and bool(tensor.op.reduce_axis)


def owner_of(s: te.Schedule, anchor: te.Tensor, output: te.Tensor) -> te.Tensor:
    """The tensor whose loops are tiled: the output when it is an epilogue of the anchor's
    shape (the anchor inlined into it unless it is a reduction), else the anchor."""
    if output is anchor:
        return anchor
    if tuple(output.shape) != tuple(anchor.shape):
        # Not an elementwise epilogue: the anchor keeps its own loops, the rest its default.
        return anchor
    if not is_reduction(anchor):
        s[anchor].compute_inline()
    return output


def divisor(extent: int, limit: int) -> int:
    """The largest divisor of ``extent`` that is at most ``limit`` (1 for an empty axis)."""
    for d in range(max(1, min(limit, extent)), 0, -1):
        if extent % d == 0:
            return d
    return 1


def divisors(extent: int, limit: int | None = None) -> tuple[int, ...]:
    """Every divisor of ``extent`` up to ``limit``, ascending ((1,) for an empty axis).

    Found in pairs (d, extent // d), d up to the square root, or up to ``limit`` where that
    is smaller: a long axis costs its root, not its length (an axis of 2^31 rows from a
    hostile model's padding). Past 2^40 elements, an axis no kernel runs (the compile limits
    refuse it), only the divisors from d up to 2^20 are listed."""
    top = extent if limit is None else min(limit, extent)
    if extent < 1 or top < 1:
        return (1,)
    found = set()
    reach = min(math.isqrt(extent), top, 1 << 20)  # (a pair past top is past the limit)
    for d in range(1, reach + 1):
        if extent % d == 0:
            found.add(d)
            if extent // d <= top:
                found.add(extent // d)
    return tuple(sorted(found))


def powers_of_two_and(limit: int, *extra: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to ``limit``, and ``extra`` values, ascending and distinct."""
    values = set(extra)
    p = 1
    while p <= max(1, limit):
        values.add(p)
        p *= 2
    return tuple(sorted(values))


def tensor_size(tensor: te.Tensor) -> int:
    size = 1
    for d in tensor.shape:
        size *= int(d)
    return size


def itemsize(tensor: te.Tensor) -> int:
    digits = "".join(ch for ch in tensor.dtype if ch.isdigit())
    return max(1, int(digits or 32) // 8)


def tensor_bytes(tensor: te.Tensor) -> int:
    """The bytes ``tensor`` holds."""
    return tensor_size(tensor) * itemsize(tensor)


# ---------------------------------------------------------------------------------------------
# loops


def parallel_outer(stage: te.Stage, axes: list[Any], elements: int) -> Any:
    """Fuse ``axes`` (adjacent, outermost first) into one loop, parallel if the stage is big
    enough; returns the loop (None for no axes)."""
    if not axes:
        return None
    fused = stage.fuse(*axes) if len(axes) > 1 else axes[0]
    if elements >= PARALLEL_MIN_ELEMENTS:
        stage.parallel(fused)
    return fused


def padded_copy_first(s: te.Schedule, pad: te.Tensor | None) -> None:
    """A padded copy of an input (convolution, pooling), when there is one, built whole
    before the kernel's main loops: its outer three axes (batch, channels, rows) fused and
    parallel, a blocked copy's lanes vectorized (:func:`vectorize_block_lanes`)."""
    if pad is None:
        return
    stage = s[pad]
    stage.compute_root()
    parallel_outer(stage, list(pad.op.axis)[:3], tensor_size(pad))
    vectorize_block_lanes(stage, pad)


def vectorize_block_lanes(stage: te.Stage, tensor: te.Tensor) -> None:
    """Vectorize the channel block of a blocked (NCHW<x>c) copy such as a padded input, x a
    power of two from 4: one vector load or zero per pixel under its padding test. Left to
    the C compiler, the copy's conditional loads stayed scalar, one element at a time
    (EfficientNet's 5x5 stride-2 depthwise layer spent 0.58 of its 0.68 ms in them)."""
    axes = list(tensor.op.axis)
    lanes = int(axes[-1].dom.extent) if len(axes) == 5 else 0
    if lanes >= 4 and lanes & (lanes - 1) == 0:
        stage.vectorize(axes[-1])


def untouched(s: te.Schedule, stage: te.Stage) -> bool:
    """A root compute stage no rule arranged: no split, fuse, loop kind or reorder, nothing
    computed at it."""
    op = stage.op
    if not isinstance(op, te.ComputeOp) or stage.attach_type != "root" or not op.axis:
        return False
    untouched_axes = [*op.axis, *op.reduce_axis]
    reordered = len(stage.leaf_iter_vars) != len(untouched_axes) or any(
        a is not b for a, b in zip(stage.leaf_iter_vars, untouched_axes))
    parents = [st.attach_stage for st in s.stages if st.attach_type == "scope"]
    return not (stage.relations or stage.iter_var_attrs or reordered
                or any(p is stage for p in parents))


def reduction_work(op: te.ComputeOp) -> int:
    """Iterations of ``op``'s loops, the reduction's inputs (partial sums) included."""
    work = tensor_size(op.output(0))
    for r in op.reduce_axis:
        work *= int(r.dom.extent)
    for t in op.input_tensors:
        if isinstance(t.op, te.ComputeOp) and t.op.tag == SUM_PARTIAL:
            work = max(work, reduction_work(t.op))
    return work


# ---------------------------------------------------------------------------------------------
# blocked sums and the rest of a group


def sum_parts_at(s: te.Schedule, total: te.Tensor) -> None:
    """The partial sums and the tail of the blocked sum ``total`` (see
    :func:`opfusion.topi.reduce.blocked_sum`) computed at ``total``'s innermost data loop, so
    that they are a small temporary per row (at the root when ``total`` is a scalar); each
    partial sum's lanes innermost and vectorized: SUM_LANES independent accumulators, the
    reduction around them. Call it once ``total``'s own loops are arranged."""
    parent = s[total]
    data_loops = [v for v in parent.leaf_iter_vars if not v.is_reduce]
    loop = data_loops[-1] if data_loops else None
    for tensor in total.op.input_tensors:
        if not isinstance(tensor.op, te.ComputeOp) or tensor.op.tag not in (SUM_PARTIAL,
                                                                             SUM_TAIL):
            continue
        stage = s[tensor]
        if loop is not None:
            stage.compute_at(parent, loop)
        elif tensor.op.tag == SUM_TAIL:
            continue  # a root tail gets the default
        if tensor.op.tag == SUM_PARTIAL:
            axes = list(stage.op.axis)
            stage.reorder(*axes[:-1], *stage.op.reduce_axis, axes[-1])
            stage.vectorize(axes[-1])


def arrange_blocked_sums(s: te.Schedule) -> None:
    """Every blocked sum whose result no rule arranged: the result's data loops fused (and
    parallel when big enough), its partial sums computed at them."""
    for stage in list(s.stages):
        op = stage.op
        if not isinstance(op, te.ComputeOp) or not any(
                isinstance(t.op, te.ComputeOp) and t.op.tag == SUM_PARTIAL
                and s[t].attach_type == "root" and not s[t].relations
                for t in op.input_tensors):
            continue
        if untouched(s, stage):
            parallel_outer(stage, list(op.axis), reduction_work(op))
        sum_parts_at(s, op.output(0))


def arrange_rest(s: te.Schedule) -> None:
    """The default for every root stage an anchor rule did not touch (no split, fuse, loop
    kind or reorder, nothing computed at it): data loops fused and parallel; blocked sums as
    :func:`arrange_blocked_sums` arranges them."""
    arrange_blocked_sums(s)
    for stage in s.stages:
        if untouched(s, stage):
            parallel_outer(stage, list(stage.op.axis), tensor_size(stage.op.output(0)))
