"""The row-operator rule (nn.softmax, nn.log_softmax, nn.layer_norm).

The normalized axis innermost, the rows in parallel, the row sums computed at each row (the
row maximum or mean, and softmax's exponentials, each read by two stages, are computed
first, in parallel).

Knob: ``vector_width``, the elements of the normalized axis per vectorized inner loop."""

from __future__ import annotations

from typing import Any

from .... import te
from ....target import Target
from ....topi.nn_norm import NORM_EXP, NORM_MAX, NORM_MEAN, NORM_SUM
from ...schedule_rule import Config, ConfigSpace, ScheduleRule
from .common import (
    arrange_rest,
    default_vector_width,
    owner_of,
    parallel_outer,
    producer,
    sum_parts_at,
    tensor_size,
    vector_width_knob,
)


def _stages(anchor: te.Tensor) -> tuple[te.Tensor | None, te.Tensor | None]:
    """The row statistic read twice (maximum or mean) and the row sum."""
    return (producer(anchor, NORM_MAX) or producer(anchor, NORM_MEAN),
            producer(anchor, NORM_SUM))


class RowsRule(ScheduleRule):
    """The normalized axis innermost and vectorized, rows in parallel."""

    name = "rows"
    ops = ("nn.softmax", "nn.log_softmax", "nn.layer_norm")

    def space(self, anchor: te.Tensor, output: te.Tensor, target: Target) -> ConfigSpace | None:
        first, second = _stages(anchor)
        if first is None or second is None:
            return None
        extent = int(anchor.shape[anchor.op.attrs["axis"]])
        return ConfigSpace(self.name, [
            vector_width_knob(extent, target.vector_lanes(anchor.dtype), "the normalized axis")])

    def default_config(self, anchor: te.Tensor, output: te.Tensor, target: Target) -> Config:
        space = self.space(anchor, output, target)
        assert space is not None
        return space.config(vector_width=default_vector_width(
            int(anchor.shape[anchor.op.attrs["axis"]]), target.vector_lanes(anchor.dtype)))

    def apply(self, s: te.Schedule, anchor: te.Tensor, output: te.Tensor, target: Target,
              config: Config) -> None:
        normalized_rows(s, anchor, output, int(config["vector_width"]))


def normalized_rows(s: te.Schedule, anchor: te.Tensor, output: te.Tensor,
                    vector_width: int) -> None:
    """The row schedule with an explicit vector width (1: the axis not split)."""
    first, second = _stages(anchor)
    assert first is not None and second is not None
    axis = anchor.op.attrs["axis"]
    owner = owner_of(s, anchor, output)
    stage = s[owner]
    row = _rows_in_parallel(stage, axis, tensor_size(owner), vector_width)
    first_stage = s[first]
    parallel_outer(first_stage, list(first.op.axis), tensor_size(anchor))
    sum_parts_at(s, first)
    exps = producer(anchor, NORM_EXP)
    if exps is not None:  # rows in parallel, as the result's, so each thread reuses its rows
        _rows_in_parallel(s[exps], axis, tensor_size(exps), vector_width)
    if row is not None:
        s[second].compute_at(stage, row)
    sum_parts_at(s, second)
    arrange_rest(s)


def _rows_in_parallel(stage: te.Stage, axis: int, size: int, vector_width: int) -> Any:
    """``stage``'s rows in parallel, the normalized ``axis`` innermost and vectorized by
    ``vector_width`` where that divides it; the row loop (None when not parallel)."""
    axes = list(stage.op.axis)
    inner = axes[axis]
    rest = axes[:axis] + axes[axis + 1:]
    stage.reorder(*rest, inner)
    row = parallel_outer(stage, rest, size)
    if vector_width > 1 and inner.dom.extent % vector_width == 0:
        _, lanes = stage.split(inner, factor=vector_width)
        stage.vectorize(lanes)
    return row
