"""The attention rule (nn.attention): one parallel task per (batch..., block of queries).

The result's rows go in blocks of :func:`opfusion.topi.nn_attention.query_block` rows; the
(batch..., block) loops are fused and parallel, and every stage of the compute but the
padded copies is computed inside a task, for its block alone: the scores as register tiles
of 4 rows x ``key_cols`` keys (a broadcast query value times a vector of keys per
multiply-add, the contraction outside), the row maxima and sums as vector-wide partial
results, the exponentials vectorized along the keys, and ``exp @ value`` as register tiles
of 4 rows x ``value_cols`` columns. So a block's scores and exponentials (rows x keys
floats: 8 x 208 for a vision transformer) stay in L1 and the (Sq, Sk) matrix never goes to
memory. The padded copies of the keys and of the bias, when there are some, are built
first, their rows in parallel.

Knobs: ``key_cols`` and ``value_cols`` (the columns of the two products' register tiles)."""

from __future__ import annotations

from typing import Any

from .... import te
from ....target import Target
from ....topi.nn_attention import (
    ATTN_ACC,
    ATTN_EXP,
    ATTN_KEYS,
    ATTN_MAX,
    ATTN_MAX_LANES,
    ATTN_PAD,
    ATTN_SCORES,
    ATTN_SUM,
    ATTN_SUM_LANES,
    query_block,
    query_tile_rows,
)
from ...schedule_rule import Config, ConfigSpace, Knob, ScheduleRule
from .common import arrange_rest, owner_of, parallel_outer, producer, tensor_size


def _column_choices(extent: int, lanes: int) -> tuple[int, ...]:
    """Register-tile widths for ``extent`` columns: one or two vectors where they divide it,
    else the largest divisor up to a vector."""
    choices = tuple(w for w in (lanes, 2 * lanes) if extent % w == 0)
    if choices:
        return choices
    return (max(d for d in range(1, min(lanes, extent) + 1) if extent % d == 0),)


class AttentionRule(ScheduleRule):
    """Blocks of queries in parallel, each block's scores in cache."""

    name = "attention"
    ops = ("nn.attention",)

    def space(self, anchor: te.Tensor, output: te.Tensor, target: Target) -> ConfigSpace | None:
        scores = producer(anchor, ATTN_SCORES)
        acc = producer(anchor, ATTN_ACC)
        if scores is None or acc is None:
            return None
        lanes = target.vector_lanes(scores.dtype)
        return ConfigSpace(self.name, [
            Knob("key_cols", _column_choices(int(scores.shape[-1]), lanes),
                 "keys of a register tile of the scores (vectorized)"),
            Knob("value_cols", _column_choices(int(acc.shape[-1]), lanes),
                 "columns of a register tile of exp @ value (vectorized)"),
        ])

    def default_config(self, anchor: te.Tensor, output: te.Tensor, target: Target) -> Config:
        space = self.space(anchor, output, target)
        assert space is not None
        # Two vectors where they divide: 4 rows x 2 vectors = 8 accumulators, the products'
        # measured best (see common.accumulators).
        return space.config(**{knob.name: knob.values[-1] for knob in space.knobs})

    def apply(self, s: te.Schedule, anchor: te.Tensor, output: te.Tensor, target: Target,
              config: Config) -> None:
        attention_blocks(s, anchor, output, target, int(config["key_cols"]),
                         int(config["value_cols"]))


def attention_blocks(s: te.Schedule, anchor: te.Tensor, output: te.Tensor, target: Target,
                     key_cols: int, value_cols: int) -> None:
    """The attention schedule with explicit tile widths (see the module docstring)."""
    stages = {tag: producer(anchor, tag) for tag in (
        ATTN_SCORES, ATTN_MAX_LANES, ATTN_MAX, ATTN_EXP, ATTN_SUM_LANES, ATTN_SUM,
        ATTN_ACC)}
    scores, acc = stages[ATTN_SCORES], stages[ATTN_ACC]
    assert scores is not None and acc is not None
    block = query_block(target)
    lanes = target.vector_lanes(scores.dtype)
    owner = owner_of(s, anchor, output)
    stage = s[owner]
    axes = list(stage.op.axis)
    qo, qi = stage.split(axes[-2], factor=block)
    task = parallel_outer(stage, [*axes[:-2], qo], tensor_size(scores))
    width = int(owner.shape[-1])
    if width % lanes == 0:
        _, lane = stage.split(axes[-1], factor=lanes)
        stage.vectorize(lane)

    for copy in s.stages:  # the padded keys and bias: rows in parallel, each row a loop
        if isinstance(copy.op, te.ComputeOp) and copy.op.tag in (ATTN_KEYS, ATTN_PAD):
            copy_axes = list(copy.op.axis)
            parallel_outer(copy, copy_axes[:-1], tensor_size(copy.op.output(0)))
    _register_tile(s[scores], key_cols, query_tile_rows(target))
    for tag in (ATTN_MAX_LANES, ATTN_SUM_LANES):
        partial = stages[tag]
        assert partial is not None
        part = s[partial]
        *rows, lane = part.op.axis
        (b,) = part.op.reduce_axis
        part.reorder(*rows, b, lane)
        part.vectorize(lane)
    exps = s[stages[ATTN_EXP]]
    _, exp_lane = exps.split(exps.op.axis[-1], factor=lanes)
    exps.vectorize(exp_lane)
    _register_tile(s[acc], value_cols, query_tile_rows(target))
    for tag in (ATTN_SCORES, ATTN_MAX_LANES, ATTN_MAX, ATTN_EXP, ATTN_SUM_LANES, ATTN_SUM,
                ATTN_ACC):
        tensor = stages[tag]
        assert tensor is not None
        s[tensor].compute_at(stage, task)
    arrange_rest(s)


def _register_tile(stage: Any, cols: int, rows: int) -> None:
    """A product's stage (a block's rows x columns, one contraction) as register tiles of
    ``rows`` rows x ``cols`` columns: the columns in tiles, the tile's rows outside the
    contraction, the rows of a tile unrolled, its columns vectorized. A block of several
    tiles of rows reuses each tile of columns of the right operand from L1."""
    *_, block_rows, columns = stage.op.axis
    (k,) = stage.op.reduce_axis
    co, ci = stage.split(columns, factor=cols)
    ro, ri = stage.split(block_rows, factor=rows)
    stage.reorder(co, ro, k, ri, ci)
    stage.unroll(ri)
    stage.vectorize(ci)
