"""The default schedule: what every group no anchor rule takes gets (elementwise,
injective, and reduction groups), and the fallback rule of the CPU backend.

Every root stage not yet arranged: the innermost data axis split by ``vector_width`` and
vectorized when no reduction runs inside it (and it is at least that long); when the stage is
big enough and ``parallel`` is on, the outermost loops fused into one parallel loop of
enough tasks, the rest nested inside it (see :func:`task_axes`).
Blocked sums first (:func:`.common.arrange_blocked_sums`): their partial sums vectorized at
the result's rows.

Knobs: ``vector_width`` (1: not split; else one, two or four float32 vectors of the target;
two, 16 elements with AVX2, is the default) and ``parallel``. They hold for the group's
every stage; the space is the same for every group."""

from __future__ import annotations

from typing import Any

from .... import te
from ....target import Target
from ...schedule_rule import Config, ConfigSpace, Knob, ScheduleRule
from .common import arrange_blocked_sums

#: Elements below which a kernel's loops stay serial (starting threads costs more).
PARALLEL_MIN_ELEMENTS = 1 << 14


def default_vector_width(target: Target) -> int:
    """Two float32 vectors of the target (16 elements with AVX2, 32 with AVX-512)."""
    return 2 * target.vector_lanes("float32")


class DefaultRule(ScheduleRule):
    """Data loops fused and parallel, the innermost split and vectorized."""

    name = "default"
    ops = ()

    def space(self, anchor: Any, output: Any, target: Target) -> ConfigSpace:
        lanes = target.vector_lanes("float32")
        return ConfigSpace(self.name, [
            Knob("vector_width", (1, lanes, 2 * lanes, 4 * lanes),
                 "elements of each stage's innermost loop per vectorized loop (1: none)"),
            Knob("parallel", (True, False),
                 "run each big enough stage's fused outer loop in parallel"),
        ])

    def default_config(self, anchor: Any, output: Any, target: Target) -> Config:
        return self.space(anchor, output, target).config(
            vector_width=default_vector_width(target), parallel=True)

    def apply(self, s: te.Schedule, anchor: Any, output: Any, target: Target,
              config: Config) -> None:
        arrange_default(s, int(config["vector_width"]), bool(config["parallel"]))


def default_schedule(s: te.Schedule, target: Target | None = None) -> None:
    """The default schedule with the target's default knobs (the current target's when
    ``target`` is None)."""
    resolved = target or Target.current()
    assert resolved is not None
    arrange_default(s, default_vector_width(resolved), True)


#: The narrowest split a stage shorter than ``vector_width`` falls back to: 4, so that the
#: lane axis of an NCHW4c or NCHW8c tensor runs in vectors (ShuffleNet's concatenations of
#: 136 channels in blocks of 8 ran as one scalar loop, 2.5x slower, when this was 16;
#: ShuffleNet v2's of 116 channels in blocks of 4 2.4x slower when it was 8).
MIN_FALLBACK_WIDTH = 4


def _width_for(extent: int, vector_width: int) -> int:
    """The split of an innermost loop of ``extent``: ``vector_width``, halved (not below
    :data:`MIN_FALLBACK_WIDTH`) while the loop is shorter; 1 (no split) when even that does
    not fit. A 28-wide row on AVX-512 (width 32) is split by 16, as on AVX2, instead of
    left as one scalar loop over the whole tensor (measured 20x slower on densenet121's
    elementwise kernels)."""
    width = vector_width
    while width > MIN_FALLBACK_WIDTH and extent < width:
        width //= 2
    return width if vector_width > 1 and extent >= width else 1


#: Parallel iterations a default stage's fused outer loops reach at least, when the stage has
#: them: enough that any thread count up to 16 finds work (see :func:`task_axes`).
DEFAULT_MIN_TASKS = 64


def task_axes(extents: list[int]) -> int:
    """How many of a stage's outer loops (outermost first, the vectorized one's outer part
    last) to fuse into its parallel loop: the fewest whose iterations reach DEFAULT_MIN_TASKS
    (all of them when they do not). The loops inside stay nested, so that a task walks its
    rows with plain increments: fusing every loop, as TVM's injective schedule does, makes
    each vector's indices divisions of the fused counter (three per vector of an NCHW8c
    tensor, plus a cancellation check per vector), which on densenet121's batch-norm-ReLU
    kernels ran at a fifth of the cache's bandwidth."""
    count = 1
    for axes, extent in enumerate(extents, start=1):
        count *= extent
        if count >= DEFAULT_MIN_TASKS:
            return axes
    return len(extents)


def arrange_default(s: te.Schedule, vector_width: int, parallel: bool) -> None:
    """The default schedule with explicit knobs (see the module docstring)."""
    arrange_blocked_sums(s)
    for stage in s.stages:
        op = stage.op
        if not isinstance(op, te.ComputeOp) or stage.attach_type != "root" or not op.axis:
            continue
        if stage.relations or stage.iter_var_attrs:
            continue  # an anchor schedule already arranged it
        axes = list(op.axis)
        size = 1
        for iv in axes:
            size *= int(iv.dom.extent)
        outer = axes
        width = _width_for(int(axes[-1].dom.extent), vector_width)
        if width > 1 and not op.reduce_axis:
            xo, xi = stage.split(axes[-1], factor=width)
            stage.vectorize(xi)
            outer = axes[:-1] + [xo]
        if not (parallel and size >= PARALLEL_MIN_ELEMENTS):
            continue  # serial: the loops nested as they are
        tasks = task_axes([int(iv.dom.extent) for iv in outer])
        fused = stage.fuse(*outer[:tasks]) if tasks > 1 else outer[0]
        stage.parallel(fused)
