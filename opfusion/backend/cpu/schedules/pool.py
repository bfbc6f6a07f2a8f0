"""The pooling rule (nn.max_pool2d, nn.avg_pool2d and their global forms).

NCHW data: one output row (n, c, y) per parallel iteration, its window reduction computed at
it, the window loops outside the columns and the columns vectorized (a register tile per
vector); a padded, column-phased copy of the input is built first, in parallel, when windows
cross the edge or stride the columns.

NCHW<k>c data (the layout pass's blocked pools): the channel block is the vector. Output rows
(n, channel block, y) run in parallel; each row's windows are reduced in register tiles of
output columns x the channel block, the window loops around the tile, reading the input in
place (no padded copy: see :func:`opfusion.topi.nn_pool._blocked_reader`).

Knobs: ``vector_width`` (NCHW), the columns per vectorized inner loop (1, or half a vector,
one or two vectors dividing the row; a row the compute laid out in blocks of vectors keeps
them); ``col_tile`` (NCHW<k>c), the output columns of a register tile, a divisor of the
columns the compute reduces (:func:`opfusion.topi.nn_pool.blocked_columns`) up to the
accumulator budget (8 vectors: 4 to 8 columns measured alike, 1 column 1.3-2x slower)."""

from __future__ import annotations

from .... import te
from ....target import Target
from ....topi.nn_pool import POOL_ACC, POOL_PAD, POOL_ROWS, POOL_SUM
from ...schedule_rule import Config, ConfigSpace, Knob, ScheduleRule
from .common import (
    accumulators,
    arrange_rest,
    default_vector_width,
    divisors,
    is_reduction,
    owner_of,
    padded_copy_first,
    parallel_outer,
    producer,
    reduction_work,
    sum_parts_at,
    tensor_size,
    vector_width_knob,
)


class PoolRule(ScheduleRule):
    """Rows in parallel, window reductions at each row, columns (NCHW) or channel blocks
    (NCHW<k>c) vectorized."""

    name = "pool"
    ops = ("nn.max_pool2d", "nn.avg_pool2d", "nn.global_max_pool2d", "nn.global_avg_pool2d")

    def space(self, anchor: te.Tensor, output: te.Tensor, target: Target) -> ConfigSpace | None:
        if len(anchor.shape) == 5:
            return ConfigSpace(self.name, [Knob(
                "col_tile", _col_tiles(anchor, target),
                "output columns of a register tile (each a vector of the channel block)")])
        if len(anchor.shape) != 4:
            return None
        width = int(anchor.shape[3])
        return ConfigSpace(self.name, [
            vector_width_knob(width, target.vector_lanes(anchor.dtype), "an output row")])

    def default_config(self, anchor: te.Tensor, output: te.Tensor, target: Target) -> Config:
        space = self.space(anchor, output, target)
        assert space is not None
        if len(anchor.shape) == 5:
            return space.config(col_tile=_col_tiles(anchor, target)[-1])
        return space.config(vector_width=default_vector_width(
            int(anchor.shape[3]), target.vector_lanes(anchor.dtype)))

    def apply(self, s: te.Schedule, anchor: te.Tensor, output: te.Tensor, target: Target,
              config: Config) -> None:
        if len(anchor.shape) == 5:
            pool_blocked_rows(s, anchor, output, int(config["col_tile"]), target)
        else:
            pool_rows(s, anchor, output, int(config["vector_width"]))


def _col_tiles(anchor: te.Tensor, target: Target) -> tuple[int, ...]:
    """The register tiles of a blocked pool, ascending: the divisors of the columns its
    window reduction computes, up to the accumulators over the vectors of one column's
    channel block."""
    lanes = target.vector_lanes(anchor.dtype)
    vectors = max(1, -(-int(anchor.shape[4]) // lanes))
    budget = max(1, accumulators(target) // vectors)
    return divisors(int(_window_reduction(anchor).shape[3]), budget)


def _window_reduction(anchor: te.Tensor) -> te.Tensor:
    """The stage that reduces the windows: the anchor itself, or the sum or the (wider)
    accumulator it reads."""
    return producer(anchor, POOL_SUM) or producer(anchor, POOL_ACC) or anchor


def pool_blocked_rows(s: te.Schedule, anchor: te.Tensor, output: te.Tensor,
                      col_tile: int, target: Target) -> None:
    """The schedule of pooling NCHW<k>c data: (n, output row, channel block) in parallel,
    rows first, so that each core pools the rows that it mostly computed itself in the
    convolution before (see ``conv2d_nchwc.rows_first``; channel blocks first, each core read
    every row of half the blocks: squeezenet 0.943-0.963x the time with rows first, the
    inception models 0.970-1.021x, a Xeon with AVX-512); each row's windows reduced in
    register tiles of ``col_tile`` columns x the channel block (vectorized), the window loops
    around the tile."""
    reduced = _window_reduction(anchor)
    owner = owner_of(s, anchor, output)
    stage = s[owner]
    n, b, y, x, c = stage.op.axis
    stage.reorder(n, y, b, x, c)
    # The work is the windows' terms: a global pool's few rows of output still read the
    # whole input (EfficientNet's squeeze-excitation pools ran on one thread, 4x ONNX
    # Runtime's time).
    row = parallel_outer(stage, [n, y, b], max(tensor_size(owner) * 4,
                                               reduction_work(reduced.op)))
    # A row whose reduction is wider (blocked_columns) ends in a partial tile: its last
    # columns are computed and not stored.
    xo, xi = stage.split(x, factor=col_tile)
    if owner is reduced:
        stage.reorder(row, xo, *owner.op.reduce_axis, xi, c)
    stage.unroll(xi)
    stage.vectorize(c)
    if owner is not reduced:
        red = s[reduced]
        red.compute_at(stage, xo)
        rn, rb, ry, rx, rc = red.op.axis
        red.reorder(rn, rb, ry, *red.op.reduce_axis, rx, rc)
        red.unroll(rx)
        red.vectorize(rc)
        rows = producer(reduced, POOL_ROWS)
        if rows is not None:
            row_sums_in_parallel(s, rows, target)
    arrange_rest(s)


def row_sums_in_parallel(s: te.Schedule, rows: te.Tensor, target: Target) -> None:
    """A blocked global pool's row sums (see :func:`opfusion.topi.nn_pool.global_avg_pool2d`)
    at the root, tasks of rows by channel block in parallel, rows first, as the convolutions
    before split their rows between the cores (each core then sums what it wrote); each
    task's rows side by side in a register tile (as many rows as fit the accumulators with
    the channel block's vectors), the columns around it: independent sums, not one chain."""
    stage = s[rows]
    n, b, y, k = stage.op.axis
    (rx,) = stage.op.reduce_axis
    vectors = max(1, -(-int(rows.shape[3]) // target.vector_lanes(rows.dtype)))
    tile = divisors(int(rows.shape[2]), max(1, accumulators(target) // vectors))[-1]
    yo, yi = stage.split(y, factor=tile)
    stage.reorder(n, yo, b, rx, yi, k)
    parallel_outer(stage, [n, yo, b], reduction_work(rows.op))
    stage.unroll(yi)
    stage.vectorize(k)


def pool_rows(s: te.Schedule, anchor: te.Tensor, output: te.Tensor, vector_width: int) -> None:
    """The pooling schedule with an explicit vector width (1: columns not split)."""
    owner = owner_of(s, anchor, output)
    stage = s[owner]
    n, c, y, x = stage.op.axis
    row = parallel_outer(stage, [n, c, y], tensor_size(owner) * 4)
    if vector_width > 1 and int(x.dom.extent) % vector_width == 0:
        xo, xi = stage.split(x, factor=vector_width)
        stage.vectorize(xi)
        if is_reduction(owner):
            stage.reorder(xo, *owner.op.reduce_axis, xi)
    for reduced in (producer(anchor, POOL_SUM), producer(anchor, POOL_ACC), anchor):
        if reduced is None or reduced is owner or not is_reduction(reduced):
            continue
        red = s[reduced]
        red.compute_at(stage, row)
        axes = list(red.op.axis)
        if len(axes) == 5:  # blocks of vectors (see nn_pool._window)
            red.reorder(*axes[:4], *red.op.reduce_axis, axes[4])
            red.vectorize(axes[4])
        elif vector_width > 1 and int(reduced.shape[3]) % vector_width == 0:
            xo, xi = red.split(axes[3], factor=vector_width)
            red.reorder(*axes[:3], xo, *red.op.reduce_axis, xi)
            red.vectorize(xi)
        sum_parts_at(s, reduced)  # a blocked sum's partial sums (global average pooling)
    pad = producer(anchor, POOL_PAD)
    padded_copy_first(s, pad)
    arrange_rest(s)
