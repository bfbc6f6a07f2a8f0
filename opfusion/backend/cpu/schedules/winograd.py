"""The Winograd rule (nn.conv2d_winograd_nchwc): tiles of output rows in parallel, each
task transforming its input tiles, multiplying them by the transformed weights and
transforming back, with every intermediate in cache.

A parallel task owns ``task_blocks`` output channel blocks x ``row_tiles`` rows of tiles. At
the task, the input tiles it reads are transformed (``B^T d B``: per tile and input channel
block, the rows then the columns, each of the alpha positions unrolled so that only the
transform's non-zero coefficients are multiplied) for every input channel; then, for each of
the alpha x alpha positions, register tiles of ``channel_tile`` output blocks x ``col_tiles``
tiles accumulate over the input channels (one broadcast of a transformed input times one
vector of transformed weights per multiply-add, as in the direct blocked convolution); the
result stage reads each output pixel's tile (``A^T M A``, rows and columns of the tile
unrolled) and the epilogue runs on it in registers. The padded input is built first, in
parallel.

Knobs: ``channel_tile``, ``col_tiles`` (the register tile), ``task_blocks`` (a multiple of
``channel_tile``), ``row_tiles``; each a divisor of its axis."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .... import te
from ....target import Target
from ....topi.nn import (
    WINO_INPUT,
    WINO_PAD,
    WINO_PRODUCT,
    WINO_ROWS,
    channel_tile,
    conv_accumulators,
)
from ...schedule_rule import Config, ConfigSpace, Knob, ScheduleRule
from .common import (
    arrange_rest,
    divisor,
    divisors,
    owner_of,
    padded_copy_first,
    parallel_outer,
    producer,
    tensor_bytes,
    tensor_size,
)

#: Parallel tasks a Winograd convolution is cut into at least, when it has the tiles: each
#: thread gets several, so that unequal tasks even out (each recomputes its input tiles'
#: transform, so more tasks cost more).
WINOGRAD_MIN_TASKS = 8


def _shape(product: te.Tensor) -> tuple[int, int, int, int]:
    """(output channel blocks, rows of tiles, tiles per row, input channel block)."""
    _, _, _, blocks, tiles_h, tiles_w, _ = (int(d) for d in product.shape)
    transformed = product.op.input_tensors[0]
    return blocks, tiles_h, tiles_w, int(transformed.shape[6])


class WinogradRule(ScheduleRule):
    """Winograd F(m x m, 3 x 3): per-task transforms, register-tiled products."""

    name = "conv2d_winograd"
    ops = ("nn.conv2d_winograd_nchwc",)

    def space(self, anchor: te.Tensor, output: te.Tensor, target: Target) -> ConfigSpace | None:
        product = producer(anchor, WINO_PRODUCT)
        if product is None:
            return None
        blocks, tiles_h, tiles_w, _ = _shape(product)
        registers = target.vector_registers

        def fits(config: Mapping[str, Any]) -> bool:
            """the register tile fits the vector registers and a task is whole tiles"""
            return (config["channel_tile"] * config["col_tiles"] <= registers
                    and config["task_blocks"] % config["channel_tile"] == 0)

        return ConfigSpace(self.name, [
            Knob("channel_tile", divisors(blocks, 4),
                 "output channel blocks of a register tile (one weight vector each)"),
            # (up to the registers, as the default may take them: 28 tiles of a 56-wide row
            # in one tile of one block on AVX-512, which a limit of 16 refused)
            Knob("col_tiles", divisors(tiles_w, registers), "tiles of a register tile"),
            Knob("task_blocks", divisors(blocks),
                 "output channel blocks of one parallel task (a multiple of channel_tile)"),
            Knob("row_tiles", divisors(tiles_h), "rows of tiles of one parallel task"),
        ], fits)

    def default_config(self, anchor: te.Tensor, output: te.Tensor, target: Target) -> Config:
        product = producer(anchor, WINO_PRODUCT)
        assert product is not None
        blocks, tiles_h, tiles_w, _ = _shape(product)
        budget = conv_accumulators(target)
        col_tiles = divisor(tiles_w, budget // 2)
        tile = channel_tile(blocks, col_tiles, budget)
        if tile * col_tiles <= budget // 2:
            # Too few independent sums to cover the multiply-add latency (7 tiles a row with
            # AVX2: 4 blocks x 1 tile); a wider row of tiles instead (1 x 7: resnet50's
            # 256-channel 14x14 layer 1.40 -> 0.78 ms on Zen 3).
            wide = divisor(tiles_w, budget)
            if channel_tile(blocks, wide, budget) * wide > tile * col_tiles:
                col_tiles, tile = wide, channel_tile(blocks, wide, budget)
        # Tasks: one row of tiles and every output block when that gives enough of them and
        # the blocks' weights fit in half the L2 cache; else output blocks split too (each
        # split transforms the same input tiles again).
        task_blocks = blocks
        block_bytes = tensor_bytes(product.op.input_tensors[1]) // blocks  # the weights
        while (tiles_h * (blocks // task_blocks) < WINOGRAD_MIN_TASKS
               or task_blocks * block_bytes > target.cache_bytes(2) // 2) \
                and task_blocks > tile and (task_blocks // 2) % tile == 0 \
                and blocks % (task_blocks // 2) == 0:
            task_blocks //= 2
        space = self.space(anchor, output, target)
        assert space is not None
        return space.config(channel_tile=tile, col_tiles=col_tiles,
                            task_blocks=task_blocks, row_tiles=1)

    def apply(self, s: te.Schedule, anchor: te.Tensor, output: te.Tensor, target: Target,
              config: Config) -> None:
        winograd_tiles(s, anchor, output, int(config["channel_tile"]),
                       int(config["col_tiles"]), int(config["task_blocks"]),
                       int(config["row_tiles"]))


def winograd_tiles(s: te.Schedule, anchor: te.Tensor, output: te.Tensor, channel_tile: int,
                   col_tiles: int, task_blocks: int, row_tiles: int) -> None:
    """The Winograd schedule with explicit sizes (see the module docstring)."""
    product = producer(anchor, WINO_PRODUCT)
    transformed = producer(anchor, WINO_INPUT)
    rows = producer(anchor, WINO_ROWS)
    pad = producer(anchor, WINO_PAD)
    assert product is not None and transformed is not None and rows is not None
    _, _, _, in_block = _shape(product)
    tile = int(rows.shape[5]) - 2
    owner = owner_of(s, anchor, output)
    stage = s[owner]
    n, k, y, x, o = stage.op.axis
    ko, ki = stage.split(k, factor=task_blocks)
    yt, yi = stage.split(y, factor=tile)
    yto, yti = stage.split(yt, factor=row_tiles)
    xt, xi = stage.split(x, factor=tile)
    stage.reorder(n, ko, yto, ki, yti, xt, yi, xi, o)
    task = parallel_outer(stage, [n, ko, yto], tensor_size(owner))
    stage.unroll(yi)
    stage.unroll(xi)
    stage.vectorize(o)

    prod = s[product]
    prod.compute_at(stage, task)
    px, py, pn, pk, pty, ptx, po = prod.op.axis
    (rc,) = prod.op.reduce_axis
    rco, rci = prod.split(rc, factor=in_block)
    pko, pki = prod.split(pk, factor=channel_tile)
    pxo, pxi = prod.split(ptx, factor=col_tiles)
    prod.reorder(pn, pko, pty, pxo, px, py, rco, rci, pki, pxi, po)
    prod.unroll(pki)
    prod.unroll(pxi)
    prod.vectorize(po)

    trans = s[transformed]
    trans.compute_at(prod, pn)  # once per task, before its products (the batch loop is 1)
    tx_, ty_, tn, tc, tty, ttx, ti = trans.op.axis
    trans.reorder(tn, tc, tty, ttx, tx_, ty_, ti)
    trans.unroll(ty_)
    trans.vectorize(ti)

    row_stage = s[rows]
    row_stage.compute_at(trans, ttx)
    rn, rc_, rty, rtx, rx, rb, ri = row_stage.op.axis
    row_stage.unroll(rx)
    row_stage.vectorize(ri)

    padded_copy_first(s, pad)
    arrange_rest(s)
