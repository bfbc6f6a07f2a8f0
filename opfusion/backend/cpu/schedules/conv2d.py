"""The convolution rule (nn.conv2d, nn.conv2d_transpose): direct NCHW convolution.

A parallel task owns ``task_channels`` output channels x ``row_block`` rows, accumulated in
a per-task temporary in passes over ``channel_pass`` input channels; within a pass, register
tiles of ``channel_block`` channels x ``col_blocks`` vectors of columns accumulate over the
pass's input channels and kernel taps (see the CPU emitter's register tiles); the padded
input is built first, in parallel. The epilogue then reads the accumulator vector by vector.

Knobs: ``channel_block``, ``col_blocks`` (the register tile; at most ``vector_registers``
accumulators), ``task_channels`` (a multiple of ``channel_block``), ``row_block``,
``channel_pass``, each a divisor of its axis."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .... import te
from ....target import Target
from ....topi.nn import CONV_ACC, CONV_PAD
from ...schedule_rule import Config, ConfigSpace, Knob, ScheduleRule
from .common import (
    accumulators,
    arrange_rest,
    divisor,
    divisors,
    itemsize,
    l2_fraction,
    min_tasks,
    owner_of,
    padded_copy_first,
    parallel_outer,
    producer,
    reduction_work,
)

#: Output channels one convolution task computes at most (its weights stay in cache).
CONV_TASK_CHANNELS = 32
#: Input channels one pass covers at most.
CONV_PASS_CHANNELS = 64


def conv_task_bytes(target: Target) -> int:
    """Bytes of accumulator one task keeps (in L2) across its input-channel passes: 1/16 of
    L2 (64 KiB of a 1 MiB L2)."""
    return l2_fraction(target, 1)


def conv_pass_bytes(target: Target) -> int:
    """Bytes of padded input rows one input-channel pass reads; they stay in L2 while every
    channel block of the task reads them: 1/8 of L2 (128 KiB of a 1 MiB L2)."""
    return l2_fraction(target, 2)


def _shape(acc: te.Tensor) -> tuple[int, int, int, int, int, int, int, int]:
    batch, channels, height, blocks, lanes = (int(d) for d in acc.shape)
    per_group, kh, kw = (int(r.dom.extent) for r in acc.op.reduce_axis)
    return batch, channels, height, blocks, lanes, per_group, kh, kw


class Conv2dRule(ScheduleRule):
    """Direct NCHW convolution with a per-task accumulator and register tiles."""

    name = "conv2d"
    ops = ("nn.conv2d", "nn.conv2d_transpose")

    def space(self, anchor: te.Tensor, output: te.Tensor, target: Target) -> ConfigSpace | None:
        acc = producer(anchor, CONV_ACC)
        if acc is None:  # not our compute: the default takes it
            return None
        _, channels, height, blocks, _, per_group, _, _ = _shape(acc)
        registers = target.vector_registers

        def fits(config: Mapping[str, Any]) -> bool:
            """the register tile fits the vector registers and a task is whole tiles"""
            return (config["channel_block"] * config["col_blocks"] <= registers
                    and config["task_channels"] % config["channel_block"] == 0)

        return ConfigSpace(self.name, [
            Knob("channel_block", divisors(channels, registers),
                 "output channels of a register tile (unrolled)"),
            Knob("col_blocks", divisors(blocks, 4),
                 "vectors of output columns of a register tile (unrolled)"),
            Knob("task_channels", divisors(channels),
                 "output channels of one parallel task (a multiple of channel_block)"),
            Knob("row_block", divisors(height), "output rows of one parallel task"),
            Knob("channel_pass", divisors(per_group),
                 "input channels one accumulation pass covers (their rows stay in cache)"),
        ], fits)

    def default_config(self, anchor: te.Tensor, output: te.Tensor, target: Target) -> Config:
        acc = producer(anchor, CONV_ACC)
        assert acc is not None
        batch, channels, height, blocks, lanes, per_group, kh, kw = _shape(acc)
        budget = accumulators(target)
        # The register tile (measured on AVX2, 8 accumulators): budget/2 channels x 2 vectors
        # of columns when the row has an even number of vectors, else budget channels x 1
        # vector; the 2-vector tile loads fewer operands per multiply-add. Fewer than budget/2
        # channels: 2 vectors.
        if blocks % 2 == 0 and channels % (budget // 2) == 0:
            channel_block, col_blocks = budget // 2, 2
        else:
            channel_block = divisor(channels, budget)
            col_blocks = 2 if channel_block < budget // 2 and blocks % 2 == 0 else 1
        # A task: up to CONV_TASK_CHANNELS channels x the rows whose accumulator fits
        # conv_task_bytes, leaving min_tasks tasks or more when the shape has them.
        task_channels = channel_block * divisor(channels // channel_block,
                                                max(1, CONV_TASK_CHANNELS // channel_block))
        width = blocks * lanes
        item = itemsize(acc)
        row_limit = conv_task_bytes(target) // (task_channels * width * item)
        channel_tasks = batch * channels // task_channels
        row_limit = min(row_limit, height * channel_tasks // min_tasks(target))
        row_block = divisor(height, max(1, row_limit))
        # A pass: up to CONV_PASS_CHANNELS input channels whose rows fit conv_pass_bytes.
        rows_read = (row_block - 1) + kh
        pass_limit = conv_pass_bytes(target) // (rows_read * (width + kw) * item)
        channel_pass = divisor(per_group, max(1, min(CONV_PASS_CHANNELS, pass_limit)))
        space = self.space(anchor, output, target)
        assert space is not None
        return space.config(channel_block=channel_block, col_blocks=col_blocks,
                            task_channels=task_channels, row_block=row_block,
                            channel_pass=channel_pass)

    def apply(self, s: te.Schedule, anchor: te.Tensor, output: te.Tensor, target: Target,
              config: Config) -> None:
        conv2d_tiles(s, anchor, output, int(config["channel_block"]), int(config["row_block"]),
                     int(config["col_blocks"]), int(config["channel_pass"]),
                     int(config["task_channels"]))


def conv2d_tiles(s: te.Schedule, anchor: te.Tensor, output: te.Tensor, channel_block: int,
                 row_block: int, col_blocks: int, channel_pass: int,
                 task_channels: int | None = None) -> None:
    """The convolution schedule with explicit sizes. Each parallel task computes
    ``task_channels`` output channels (a multiple of ``channel_block``; default
    ``channel_block``) x ``row_block`` rows into a local accumulator, in passes over
    ``channel_pass`` input channels (whose rows stay in cache while every channel block of the
    task reads them); within a pass, register tiles of ``channel_block`` channels x
    ``col_blocks`` vectors of columns accumulate over the pass's input channels and kernel
    taps. The epilogue then reads the accumulator, vector by vector."""
    acc = producer(anchor, CONV_ACC)
    assert acc is not None
    pad = producer(acc, CONV_PAD)
    owner = owner_of(s, anchor, output)
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
    task = parallel_outer(stage, [n, oo, yo], reduction_work(acc.op))
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

    padded_copy_first(s, pad)
    arrange_rest(s)
