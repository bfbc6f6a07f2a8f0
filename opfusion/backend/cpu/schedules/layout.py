"""The layout rule (layout_transform, channel_shuffle): loops ordered so that neither side
of the copy needs an index division inside them.

A blocked result (N, C/k, H, W, k) runs its lane axis outside the pixels: for each (n, block,
lane), the rows and columns of one channel, read contiguously from an NCHW source (or, for a
shuffle, from the source channel's block and lane, found once per channel) and written with
the block's stride. An NCHW result runs (n, c) in parallel and its rows and columns inside.
The default schedule instead fused every axis and recovered each index by division for every
element (or every vector of k lanes, read with a gather).

From NCHW into lanes (8 or 16, or an image's 3) the lanes stay inside the columns (the
source's rows for one block stay in cache while each is read once per lane).

A blocked shuffle runs its lanes innermost, unrolled, by default (see ``default_config``).

Knob: ``lanes_outside`` (for a blocked result: the lane axis outside the pixels)."""

from __future__ import annotations

import math
from typing import Any

from .... import te
from ....target import Target
from ...schedule_rule import Config, ConfigSpace, Knob, ScheduleRule
from .common import arrange_rest, min_tasks, owner_of, parallel_outer, tensor_size


class LayoutRule(ScheduleRule):
    """Channels outer, pixels inner, for the operators that move data between layouts."""

    name = "layout"
    ops = ("layout_transform", "channel_shuffle")

    def space(self, anchor: te.Tensor, output: Any, target: Target) -> ConfigSpace | None:
        if len(anchor.shape) not in (4, 5):
            return None
        return ConfigSpace(self.name, [
            Knob("lanes_outside", (True, False),
                 "a blocked result's lane axis outside its rows and columns")])

    def default_config(self, anchor: te.Tensor, output: Any, target: Target) -> Config:
        space = self.space(anchor, output, target)
        assert space is not None
        # Measured on AVX-512: from NCHW into 16 or 8 lanes, the lanes inside (the 16 source
        # rows stay in cache) is 1.5x faster; from a blocked source (a change of block), the
        # lanes outside is 2-12x faster. Into an RGB block of 3 the lanes inside write each
        # pixel's 3 channels together: 0.048 ms -> 0.008 for a 224 x 224 image (``opf.tune``,
        # a Xeon with AVX-512), where the lanes outside wrote every third float. A blocked
        # shuffle is 2x faster with the lanes inside, unrolled (each lane's source block and
        # lane are then found once per row, and a pixel's lanes are written together):
        # ShuffleNet's first, 112 channels at 56x56, 0.26 -> 0.13 ms.
        sources = [t for t in anchor.op.input_tensors if len(t.shape) == 5]
        shuffle = _is_shuffle(anchor)
        return space.config(lanes_outside=bool(sources) and not shuffle)

    def apply(self, s: te.Schedule, anchor: te.Tensor, output: Any, target: Target,
              config: Config) -> None:
        owner = owner_of(s, anchor, output)
        stage = s[owner]
        axes = list(stage.op.axis)
        if len(axes) == 5 and config["lanes_outside"]:
            n, block, y, x, lane = axes
            stage.reorder(n, block, lane, y, x)
            channels = [n, block, lane]
            if math.prod(int(a.dom.extent) for a in channels) < min_tasks(target):
                # Too few channels to share out (an RGB input's 3 in one block: 3 tasks
                # for 2 threads); each row of a channel is a task instead.
                channels.append(y)
            parallel_outer(stage, channels, tensor_size(owner))
        elif len(axes) == 5:
            parallel_outer(stage, axes[:3], tensor_size(owner))
            if _is_shuffle(anchor):
                stage.unroll(axes[4])
        else:
            parallel_outer(stage, axes[:2], tensor_size(owner))
        arrange_rest(s)


def _is_shuffle(anchor: te.Tensor) -> bool:
    """Whether ``anchor`` is a channel shuffle's stage (the compute names it after the op)."""
    return anchor.op.name == "channel_shuffle"
