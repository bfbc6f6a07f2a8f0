"""The local-response-normalization rule (nn.lrn over NCHW, the window along the channels).

Rows of pixels in parallel, and for each row the padded squares of every channel computed at
the row, just before the quotients that read them: the squares (float64, see
:func:`opfusion.topi.nn_norm.lrn`) stay in the core's cache instead of going to memory
whole and coming back five times. Columns inside, split in vectors.

Knob: ``vector_width``, the columns of a vectorized inner loop (the last one of a row may be
shorter)."""

from __future__ import annotations

from .... import te
from ....target import Target
from ...schedule_rule import Config, ConfigSpace, Knob, ScheduleRule
from .common import arrange_rest, owner_of, parallel_outer, tensor_size


def _squares(anchor: te.Tensor) -> te.Tensor | None:
    """The padded squares' stage the quotient reads (the compute's only computed input)."""
    computed = [t for t in anchor.op.input_tensors if isinstance(t.op, te.ComputeOp)]
    return computed[0] if len(computed) == 1 else None


def _widths(extent: int, lanes: int) -> tuple[int, ...]:
    """Vector widths that fit a row of ``extent`` columns: the target's lanes, halved down
    to 4, then 1 (scalar)."""
    widths = []
    width = lanes
    while width >= 4:
        if width <= extent:
            widths.append(width)
        width //= 2
    return (*widths, 1)


class LrnRule(ScheduleRule):
    """Rows in parallel, each row's squares computed at the row, columns vectorized."""

    name = "lrn"
    ops = ("nn.lrn",)

    def space(self, anchor: te.Tensor, output: te.Tensor, target: Target) -> ConfigSpace | None:
        if len(anchor.shape) != 4 or anchor.op.attrs.get("axis") != 1 \
                or _squares(anchor) is None:
            return None
        width = int(anchor.shape[3])
        return ConfigSpace(self.name, [
            Knob("vector_width", _widths(width, target.vector_lanes(anchor.dtype)),
                 "columns per vectorized inner loop (1: not vectorized)")])

    def default_config(self, anchor: te.Tensor, output: te.Tensor, target: Target) -> Config:
        space = self.space(anchor, output, target)
        assert space is not None
        return space.config(vector_width=space.knobs[0].values[0])

    def apply(self, s: te.Schedule, anchor: te.Tensor, output: te.Tensor, target: Target,
              config: Config) -> None:
        squares = _squares(anchor)
        assert squares is not None
        owner = owner_of(s, anchor, output)
        stage = s[owner]
        n, c, y, x = stage.op.axis
        stage.reorder(n, y, c, x)
        row = parallel_outer(stage, [n, y], tensor_size(owner))
        width = int(config["vector_width"])
        if width > 1:
            _, lanes = stage.split(x, factor=width)
            stage.vectorize(lanes)
        sq = s[squares]
        sq.compute_at(stage, row)
        if width > 1:
            _, lanes = sq.split(sq.op.axis[3], factor=width)
            sq.vectorize(lanes)
        arrange_rest(s)
