"""CPU schedules of the anchor operators: convolution, the matrix products, pooling and the row
operators (softmax, log_softmax, layer_norm).

Every schedule has the registry's shape ``fn(s, anchor, output)``. The loops that matter are
tiled on the *owner*: ``output`` when the group ends in an elementwise epilogue of the
anchor's shape (the anchor is then inlined into it, or computed at the owner's tiles when it
is a reduction), else the anchor itself. The accumulating stage is computed at the owner's
tile, so an intermediate result never goes to memory: each tile is accumulated in registers
or in a small per-task temporary, and passed through the epilogue from there.

- convolution: a parallel task owns up to 32 output channels x a block of rows, accumulated
  in a temporary in passes over the input channels; within a pass, register tiles of 4
  channels x 2 vectors of columns (8 x 1 on rows of an odd number of vectors) accumulate
  over the pass's input channels and kernel taps; the padded input is built first, in
  parallel;
- matrix products, dot form: mb x nb tiles of lane-interleaved partial sums (mb*nb vectors)
  over the whole depth, then the lanes summed; plain form: mb rows x nb columns of the result
  in vectors (outer products), the right operand read from column panels when it was packed.
  Column tiles go in blocks that keep their part of the right operand in L2 while every row
  tile passes;
- pooling: one output row per parallel iteration, its window reduction computed at it with
  the window loops outside the vectorized columns (reading a padded, column-phased copy of
  the input when windows cross the edge or stride the columns);
- row operators: the normalized axis innermost, the rows in parallel, the row sums computed
  at each row (the row maximum or mean, and softmax's exponentials, each read by two stages,
  are computed first, in parallel).

The sizes come from the shapes; ``conv2d_tiles``, ``dot_tiles`` and ``plain_tiles`` take them
explicitly (for tuning). Stages no rule arranged get the default: data loops fused and
parallel."""

from __future__ import annotations

from typing import Any

from .... import te
from ....topi.nn import CONV_ACC, CONV_PAD, LANES, MATMUL_DOT, MATMUL_PACK, MATMUL_PARTIAL
from ....topi.nn_norm import NORM_EXP, NORM_MAX, NORM_MEAN, NORM_SUM
from ....topi.nn_pool import POOL_ACC, POOL_PAD, POOL_SUM
from ....topi.reduce import SUM_PARTIAL, SUM_TAIL
from ....topi.registry import register_schedule

#: Loops with fewer iterations in all stay serial: starting threads costs more.
PARALLEL_MIN_ELEMENTS = 1 << 12
#: Parallel tasks a convolution is cut into at least (when it has the rows), so that any
#: thread count up to 16 finds work, and unequal tasks even out.
MIN_TASKS = 16
#: Bytes of weight rows a dot-form block keeps in the (per-core) L2 cache.
L2_BLOCK_BYTES = 192 * 1024


# ---------------------------------------------------------------------------------------------
# helpers


def _producer(tensor: te.Tensor, tag: str) -> te.Tensor | None:
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


def _is_reduction(tensor: te.Tensor) -> bool:
    return isinstance(tensor.op, te.ComputeOp) and bool(tensor.op.reduce_axis)


def _owner(s: te.Schedule, anchor: te.Tensor, output: te.Tensor) -> te.Tensor:
    """The tensor whose loops are tiled: the output when it is an epilogue of the anchor's
    shape (the anchor inlined into it unless it is a reduction), else the anchor."""
    if output is anchor:
        return anchor
    if tuple(output.shape) != tuple(anchor.shape):
        # Not an elementwise epilogue: the anchor keeps its own loops, the rest its default.
        return anchor
    if not _is_reduction(anchor):
        s[anchor].compute_inline()
    return output


def _divisor(extent: int, limit: int) -> int:
    """The largest divisor of ``extent`` that is at most ``limit`` (1 for an empty axis)."""
    for d in range(max(1, min(limit, extent)), 0, -1):
        if extent % d == 0:
            return d
    return 1


def _size(tensor: te.Tensor) -> int:
    size = 1
    for d in tensor.shape:
        size *= int(d)
    return size


def _parallel_outer(stage: te.Stage, axes: list[Any], elements: int) -> Any:
    """Fuse ``axes`` (adjacent, outermost first) into one loop, parallel if the stage is big
    enough; returns the loop (None for no axes)."""
    if not axes:
        return None
    fused = stage.fuse(*axes) if len(axes) > 1 else axes[0]
    if elements >= PARALLEL_MIN_ELEMENTS:
        stage.parallel(fused)
    return fused


def _untouched(s: te.Schedule, stage: te.Stage) -> bool:
    """A root compute stage no rule arranged: no split, fuse, loop kind or reorder, nothing
    computed at it."""
    op = stage.op
    if not isinstance(op, te.ComputeOp) or stage.attach_type != "root" or not op.axis:
        return False
    untouched = [*op.axis, *op.reduce_axis]
    reordered = len(stage.leaf_iter_vars) != len(untouched) or any(
        a is not b for a, b in zip(stage.leaf_iter_vars, untouched))
    parents = [st.attach_stage for st in s.stages if st.attach_type == "scope"]
    return not (stage.relations or stage.iter_var_attrs or reordered
                or any(p is stage for p in parents))


def _reduction_work(op: te.ComputeOp) -> int:
    """Iterations of ``op``'s loops, the reduction's inputs (partial sums) included."""
    work = _size(op.output(0))
    for r in op.reduce_axis:
        work *= int(r.dom.extent)
    for t in op.input_tensors:
        if isinstance(t.op, te.ComputeOp) and t.op.tag == SUM_PARTIAL:
            work = max(work, _reduction_work(t.op))
    return work


def sum_parts_at(s: te.Schedule, total: te.Tensor) -> None:
    """The partial sums and the tail of the blocked sum ``total`` (see
    :func:`.reduce.blocked_sum`) computed at ``total``'s innermost data loop, so that they
    are a small temporary per row (at the root when ``total`` is a scalar); each partial
    sum's lanes innermost and vectorized: SUM_LANES independent accumulators, the reduction
    around them. Call it once ``total``'s own loops are arranged."""
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
        if _untouched(s, stage):
            _parallel_outer(stage, list(op.axis), _reduction_work(op))
        sum_parts_at(s, op.output(0))


def _arrange_rest(s: te.Schedule) -> None:
    """The default for every root stage no rule touched (no split, fuse, loop kind or
    reorder, nothing computed at it): data loops fused and parallel; blocked sums as
    :func:`arrange_blocked_sums` arranges them."""
    arrange_blocked_sums(s)
    for stage in s.stages:
        if _untouched(s, stage):
            _parallel_outer(stage, list(stage.op.axis), _size(stage.op.output(0)))


# ---------------------------------------------------------------------------------------------
# convolution


#: Bytes of accumulator one convolution task keeps (in L2) across its input-channel passes.
CONV_TASK_BYTES = 64 * 1024
#: Bytes of padded input rows one input-channel pass reads (they stay in L2 while every
#: channel block of the task reads them).
CONV_PASS_BYTES = 128 * 1024
#: Output channels one convolution task computes at most (its weights stay in cache).
CONV_TASK_CHANNELS = 32
#: Input channels one pass covers at most.
CONV_PASS_CHANNELS = 64


@register_schedule("nn.conv2d", "nn.conv2d_transpose")
def schedule_conv2d(s: te.Schedule, anchor: te.Tensor, output: te.Tensor) -> None:
    """Direct NCHW convolution, sized from the shapes (see :func:`conv2d_tiles`)."""
    acc = _producer(anchor, CONV_ACC)
    if acc is None:  # not our compute: leave it to the default
        _arrange_rest(s)
        return
    batch, channels, height, blocks, lanes = (int(d) for d in acc.shape)
    per_group, kh, kw = (int(r.dom.extent) for r in acc.op.reduce_axis)
    # The register tile (measured on AVX2): 4 channels x 2 vectors of columns when the row
    # has an even number of vectors, else 8 channels x 1 vector: 8 accumulators either way,
    # the 4 x 2 tile loading fewer operands per multiply-add. Fewer than 4 channels: 2 vectors.
    if blocks % 2 == 0 and channels % 4 == 0:
        channel_block, col_blocks = 4, 2
    else:
        channel_block = _divisor(channels, 8)
        col_blocks = 2 if channel_block < 4 and blocks % 2 == 0 else 1
    # A task: up to CONV_TASK_CHANNELS channels x the rows whose accumulator fits
    # CONV_TASK_BYTES, leaving MIN_TASKS tasks or more when the shape has them.
    task_channels = channel_block * _divisor(channels // channel_block,
                                             max(1, CONV_TASK_CHANNELS // channel_block))
    width = blocks * lanes
    item = _itemsize(acc)
    row_limit = CONV_TASK_BYTES // (task_channels * width * item)
    channel_tasks = batch * channels // task_channels
    row_limit = min(row_limit, height * channel_tasks // MIN_TASKS)
    row_block = _divisor(height, max(1, row_limit))
    # A pass: up to CONV_PASS_CHANNELS input channels whose rows fit CONV_PASS_BYTES.
    rows_read = (row_block - 1) + kh
    pass_limit = CONV_PASS_BYTES // (rows_read * (width + kw) * item)
    channel_pass = _divisor(per_group, max(1, min(CONV_PASS_CHANNELS, pass_limit)))
    conv2d_tiles(s, anchor, output, channel_block, row_block, col_blocks, channel_pass,
                 task_channels)


def conv2d_tiles(s: te.Schedule, anchor: te.Tensor, output: te.Tensor, channel_block: int,
                 row_block: int, col_blocks: int, channel_pass: int,
                 task_channels: int | None = None) -> None:
    """The convolution schedule with explicit sizes. Each parallel task computes
    ``task_channels`` output channels (a multiple of ``channel_block``; default
    ``channel_block``) x ``row_block`` rows into a local accumulator, in passes over
    ``channel_pass`` input channels (whose rows stay in cache while every channel block of the
    task reads them); within a pass, register tiles of ``channel_block`` channels x
    ``col_blocks`` vectors of columns accumulate over the pass's input channels and kernel
    taps (see :mod:`opfusion.codegen.c_regtile`). The epilogue then reads the accumulator,
    vector by vector."""
    acc = _producer(anchor, CONV_ACC)
    assert acc is not None
    pad = _producer(acc, CONV_PAD)
    owner = _owner(s, anchor, output)
    lanes = int(acc.shape[4])
    task_channels = task_channels or channel_block
    stage = s[owner]
    n, o, y, x = stage.op.axis
    oo, oi = stage.split(o, factor=task_channels)
    yo, yi = stage.split(y, factor=row_block)
    # Columns split by the accumulator's lanes: its block index (x // lanes) and lane
    # (x % lanes) become the two loops, and the accumulator's region is whole blocks.
    xo, xi = stage.split(x, factor=lanes)
    stage.reorder(n, oo, yo, oi, yi, xo, xi)
    task = _parallel_outer(stage, [n, oo, yo], _size(owner))
    stage.vectorize(xi)

    acc_stage = s[acc]
    acc_stage.compute_at(stage, task)
    an, ao, ay, ab, ax = acc_stage.op.axis
    rc, ry, rx = acc_stage.op.reduce_axis
    rco, rci = acc_stage.split(rc, factor=channel_pass)
    aoo, aoi = acc_stage.split(ao, factor=channel_block)
    abo, abi = acc_stage.split(ab, factor=col_blocks)
    acc_stage.reorder(an, rco, aoo, ay, abo, rci, ry, rx, aoi, abi, ax)
    acc_stage.unroll(aoi)
    acc_stage.unroll(abi)
    acc_stage.vectorize(ax)

    if pad is not None:
        pad_stage = s[pad]
        pad_stage.compute_root()
        axes = list(pad.op.axis)
        _parallel_outer(pad_stage, axes[:3], _size(pad))
    _arrange_rest(s)


# ---------------------------------------------------------------------------------------------
# dense and matrix products


@register_schedule("nn.dense", "nn.matmul", "nn.batch_matmul")
def schedule_matmul(s: te.Schedule, anchor: te.Tensor, output: te.Tensor) -> None:
    """Products: the dot form (partial sums in lanes) or the plain form (outer products)."""
    if anchor.op.tag == MATMUL_DOT:
        _schedule_dot(s, anchor, output)
    elif _is_reduction(anchor):
        _schedule_plain(s, anchor, output)
    _arrange_rest(s)


def _tile_last_two(stage: te.Stage, rows: int, cols: int) -> tuple[list[Any], list[Any]]:
    """Split the last two axes into (outer, inner) and order the loops ``batch..., row outer,
    column outer, row inner, column inner``; returns the outer and the inner loops (a rank-1
    tensor has only a column axis)."""
    axes = list(stage.op.axis)
    if len(axes) == 1:
        co, ci = stage.split(axes[0], factor=cols)
        return [co], [ci]
    ro, co, ri, ci = stage.tile(axes[-2], axes[-1], rows, cols)
    return [*axes[:-2], ro, co], [ri, ci]


def _schedule_dot(s: te.Schedule, anchor: te.Tensor, output: te.Tensor) -> None:
    partial = _producer(anchor, MATMUL_PARTIAL)
    assert partial is not None
    shape = [int(d) for d in anchor.shape]
    m = shape[-2] if len(shape) >= 2 else 1
    n = shape[-1] if shape else 1
    depth = int(partial.op.reduce_axis[0].dom.extent) * int(partial.shape[-1])
    rows = _divisor(m, 4) if len(shape) >= 2 else 1
    cols = _divisor(n, 8 // rows)
    block = max(1, L2_BLOCK_BYTES // (depth * _itemsize(partial) * cols))
    dot_tiles(s, anchor, output, rows, cols, block)


def dot_tiles(s: te.Schedule, anchor: te.Tensor, output: te.Tensor, rows: int, cols: int,
              block: int) -> None:
    """The dot-form schedule with explicit sizes: ``rows`` x ``cols`` output tiles, each
    accumulating rows*cols vectors of lane-interleaved partial sums over the whole depth
    (its rows and columns unrolled, the lanes vectorized); when the data has several row
    tiles, ``block`` column tiles (weight rows, sized for L2) are outermost, so that every
    row tile reuses a block while it is cached."""
    partial = _producer(anchor, MATMUL_PARTIAL)
    assert partial is not None
    owner = _owner(s, anchor, output)
    part = s[partial]
    axes = list(part.op.axis)
    part.vectorize(axes[-1])
    shape = [int(d) for d in anchor.shape]
    if not shape:  # a single dot product
        return
    depth = int(part.op.reduce_axis[0].dom.extent) * int(partial.shape[-1])
    stage = s[owner]
    outer, inner = _tile_last_two(stage, rows, cols)
    tile = _block_columns(stage, outer, anchor, rows, cols, block, _size(owner) * depth // 16)
    parent, loop = stage, tile
    lane_sum = s[anchor]
    if owner is not anchor:
        # The lane sum is computed at the tile; the partial sums just before it, at an outer
        # loop of one iteration (they are read by the lane sum only).
        lane_sum.compute_at(stage, tile)
        loop, _ = lane_sum.split(lane_sum.op.axis[0], nparts=1)
        parent = lane_sum
        inner = [v for v in lane_sum.leaf_iter_vars if v is not loop and not v.is_reduce]
    # Lanes outermost: the tile's rows*cols sums are independent chains, not one chain of
    # additions per output.
    (lane,) = lane_sum.op.reduce_axis
    lane_sum.reorder(lane, *inner)
    for axis in inner:
        lane_sum.unroll(axis)
    part.compute_at(parent, loop)
    (ko,) = part.op.reduce_axis
    part.reorder(ko, *axes)
    for axis in axes[-3:-1]:
        part.unroll(axis)


def _schedule_plain(s: te.Schedule, anchor: te.Tensor, output: te.Tensor) -> None:
    shape = [int(d) for d in anchor.shape]
    if not shape:
        plain_tiles(s, anchor, output, 1, 1, 1)
        return
    n = shape[-1]
    depth = int(anchor.op.reduce_axis[0].dom.extent)
    pack = _producer(anchor, MATMUL_PACK)
    if pack is not None:  # the tiles are the panels' columns
        cols = int(pack.shape[-1])
    else:
        cols = 2 * LANES if n % (2 * LANES) == 0 else LANES if n % LANES == 0 else _divisor(n, 16)
    rows = _divisor(shape[-2], 4) if len(shape) >= 2 else 1
    block = max(1, L2_BLOCK_BYTES // (max(depth, 1) * _itemsize(anchor) * cols))
    plain_tiles(s, anchor, output, rows, cols, block)


def plain_tiles(s: te.Schedule, anchor: te.Tensor, output: te.Tensor, rows: int, cols: int,
                block: int) -> None:
    """The plain-form schedule with explicit sizes: ``rows`` x ``cols`` output tiles
    accumulated as ``rows`` x ``cols/8`` vectors (outer products of a column of the left
    operand and a row piece of the right one), the reduction outside (unrolled by 4), the
    tile's rows unrolled, its columns vectorized; column tiles in blocks of ``block`` as in
    :func:`dot_tiles`."""
    owner = _owner(s, anchor, output)
    acc = s.cache_write(anchor, "local") if owner is anchor else anchor
    pack = _producer(acc, MATMUL_PACK)
    if pack is not None:
        pack_stage = s[pack]
        axes = list(pack.op.axis)
        _parallel_outer(pack_stage, axes[:-1], _size(pack))
        pack_stage.vectorize(axes[-1])
    if not anchor.shape:
        return
    stage = s[owner]
    outer, inner = _tile_last_two(stage, rows, cols)
    depth = int(acc.op.reduce_axis[0].dom.extent)
    tile = _block_columns(stage, outer, anchor, rows, cols, block, _size(owner) * depth // 16)
    stage.vectorize(inner[-1])
    acc_stage = s[acc]
    acc_stage.compute_at(stage, tile)
    axes = list(acc_stage.op.axis)
    (k,) = acc_stage.op.reduce_axis
    ko, ki = acc_stage.split(k, factor=4)
    acc_stage.reorder(ko, ki, *axes)
    acc_stage.unroll(ki)
    if len(axes) >= 2:
        acc_stage.unroll(axes[-2])
    acc_stage.vectorize(axes[-1])


def _block_columns(stage: te.Stage, outer: list[Any], result: te.Tensor, rows: int, cols: int,
                   block: int, work: int) -> Any:
    """Parallelize the tile loops ``outer`` (``batch..., row tiles, column tiles``) and return
    the loop a tile is computed at. With several row tiles and more than ``block`` column
    tiles, the column tiles go in blocks, outermost, so that all row tiles pass over a block
    of the right operand while it is in L2."""
    shape = [int(d) for d in result.shape]
    if len(outer) >= 2 and -(-shape[-2] // rows) > 1 and -(-shape[-1] // cols) > block:
        bo, bi = stage.split(outer[-1], factor=block)
        stage.reorder(bo, outer[-2])
        _parallel_outer(stage, [*outer[:-2], bo, outer[-2]], work)
        return bi
    return _parallel_outer(stage, outer, work)


def _itemsize(tensor: te.Tensor) -> int:
    digits = "".join(ch for ch in tensor.dtype if ch.isdigit())
    return max(1, int(digits or 32) // 8)


# ---------------------------------------------------------------------------------------------
# pooling


@register_schedule("nn.max_pool2d", "nn.avg_pool2d", "nn.global_max_pool2d",
                   "nn.global_avg_pool2d")
def schedule_pool(s: te.Schedule, anchor: te.Tensor, output: te.Tensor) -> None:
    """One output row (n, c, y) per parallel iteration, its window reduction computed at it,
    the window loops outside the columns and the columns vectorized (a register tile per
    vector: see :mod:`opfusion.codegen.c_regtile`). A padded copy of the input is built
    first, in parallel."""
    owner = _owner(s, anchor, output)
    stage = s[owner]
    n, c, y, x = stage.op.axis
    row = _parallel_outer(stage, [n, c, y], _size(owner) * 4)
    if int(x.dom.extent) % LANES == 0:
        xo, xi = stage.split(x, factor=LANES)
        stage.vectorize(xi)
        if _is_reduction(owner):
            stage.reorder(xo, *owner.op.reduce_axis, xi)
    for reduced in (_producer(anchor, POOL_SUM), _producer(anchor, POOL_ACC), anchor):
        if reduced is None or reduced is owner or not _is_reduction(reduced):
            continue
        red = s[reduced]
        red.compute_at(stage, row)
        axes = list(red.op.axis)
        if len(axes) == 5:  # blocks of vectors (see nn_pool._window)
            red.reorder(*axes[:4], *red.op.reduce_axis, axes[4])
            red.vectorize(axes[4])
        elif int(reduced.shape[3]) % LANES == 0:
            xo, xi = red.split(axes[3], factor=LANES)
            red.reorder(*axes[:3], xo, *red.op.reduce_axis, xi)
            red.vectorize(xi)
        sum_parts_at(s, reduced)  # a blocked sum's partial sums (global average pooling)
    pad = _producer(anchor, POOL_PAD)
    if pad is not None:
        pad_stage = s[pad]
        pad_stage.compute_root()
        _parallel_outer(pad_stage, list(pad.op.axis)[:3], _size(pad))
    _arrange_rest(s)


# ---------------------------------------------------------------------------------------------
# row operators


@register_schedule("nn.softmax", "nn.log_softmax", "nn.layer_norm")
def schedule_rows(s: te.Schedule, anchor: te.Tensor, output: te.Tensor) -> None:
    """The normalized axis innermost, rows in parallel, the row sum computed at each row."""
    first = _producer(anchor, NORM_MAX) or _producer(anchor, NORM_MEAN)
    second = _producer(anchor, NORM_SUM)
    if first is None or second is None:
        _arrange_rest(s)
        return
    axis = anchor.op.attrs["axis"]
    owner = _owner(s, anchor, output)
    stage = s[owner]
    axes = list(stage.op.axis)
    inner = axes[axis]
    rest = axes[:axis] + axes[axis + 1:]
    stage.reorder(*rest, inner)
    row = _parallel_outer(stage, rest, _size(owner))
    if inner.dom.extent % LANES == 0:
        _, lanes = stage.split(inner, factor=LANES)
        stage.vectorize(lanes)
    first_stage = s[first]
    _parallel_outer(first_stage, list(first.op.axis), _size(anchor))
    sum_parts_at(s, first)
    exps = _producer(anchor, NORM_EXP)
    if exps is not None:  # rows in parallel, as the result's, so each thread reuses its rows
        exp_stage = s[exps]
        exp_axes = list(exp_stage.op.axis)
        exp_rest = exp_axes[:axis] + exp_axes[axis + 1:]
        exp_stage.reorder(*exp_rest, exp_axes[axis])
        _parallel_outer(exp_stage, exp_rest, _size(exps))
    if row is not None:
        s[second].compute_at(stage, row)
    sum_parts_at(s, second)
    _arrange_rest(s)


__all__ = ["arrange_blocked_sums", "schedule_conv2d", "schedule_matmul", "schedule_pool",
           "schedule_rows", "sum_parts_at"]
