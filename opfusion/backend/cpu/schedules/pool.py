"""The pooling rule (nn.max_pool2d, nn.avg_pool2d and their global forms).

One output row (n, c, y) per parallel iteration, its window reduction computed at it, the
window loops outside the columns and the columns vectorized (a register tile per vector); a
padded, column-phased copy of the input is built first, in parallel, when windows cross the
edge or stride the columns.

Knob: ``vector_width``, the columns per vectorized inner loop (1, or half a vector, one or
two vectors dividing the row; a row the compute laid out in blocks of vectors keeps them)."""

from __future__ import annotations

from .... import te
from ....target import Target
from ....topi.nn_pool import POOL_ACC, POOL_PAD, POOL_SUM
from ...schedule_rule import Config, ConfigSpace, ScheduleRule
from .common import (
    arrange_rest,
    default_vector_width,
    is_reduction,
    owner_of,
    parallel_outer,
    producer,
    sum_parts_at,
    tensor_size,
    vector_width_knob,
)


class PoolRule(ScheduleRule):
    """Rows in parallel, window reductions at each row, columns vectorized."""

    name = "pool"
    ops = ("nn.max_pool2d", "nn.avg_pool2d", "nn.global_max_pool2d", "nn.global_avg_pool2d")

    def space(self, anchor: te.Tensor, output: te.Tensor, target: Target) -> ConfigSpace | None:
        if len(anchor.shape) != 4:
            return None
        width = int(anchor.shape[3])
        return ConfigSpace(self.name, [
            vector_width_knob(width, target.vector_lanes(anchor.dtype), "an output row")])

    def default_config(self, anchor: te.Tensor, output: te.Tensor, target: Target) -> Config:
        space = self.space(anchor, output, target)
        assert space is not None
        return space.config(vector_width=default_vector_width(
            int(anchor.shape[3]), target.vector_lanes(anchor.dtype)))

    def apply(self, s: te.Schedule, anchor: te.Tensor, output: te.Tensor, target: Target,
              config: Config) -> None:
        pool_rows(s, anchor, output, int(config["vector_width"]))


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
    if pad is not None:
        pad_stage = s[pad]
        pad_stage.compute_root()
        parallel_outer(pad_stage, list(pad.op.axis)[:3], tensor_size(pad))
    arrange_rest(s)
