"""The local-response-normalization rule (nn.lrn, the window along the channels): over NCHW,
and over NCHW<k>c (:func:`opfusion.topi.nn_norm._lrn_blocked`).

Rows of pixels in parallel, and for each row the padded squares of every channel computed at
the row, just before the quotients that read them: the squares (float64, see
:func:`opfusion.topi.nn_norm.lrn`) stay in the core's cache instead of going to memory
whole and coming back five times. Columns inside, split in vectors.

Blocked: rows of pixels in parallel as well, each row's squares (channels last, padded with
zero blocks) computed at the row, a block's lanes one vector in both stages.

Knob: ``vector_width``, the columns of a vectorized inner loop (the last one of a row may be
shorter); blocked, the lanes of a block or 1 (not vectorized)."""

from __future__ import annotations

from .... import te
from ....target import Target
from ....topi.nn_norm import LRN_BLOCKED_SQUARES
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
        squares = _squares(anchor)
        if anchor.op.attrs.get("axis") != 1 or squares is None:
            return None
        if squares.op.tag == LRN_BLOCKED_SQUARES:
            return ConfigSpace(self.name, [
                Knob("vector_width", (int(anchor.shape[4]), 1),
                     "lanes per vector (a channel block's, or 1: not vectorized)")])
        if len(anchor.shape) != 4:
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
        if squares.op.tag == LRN_BLOCKED_SQUARES:
            _blocked_rows(s, anchor, output, squares, int(config["vector_width"]))
            return
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


def _blocked_rows(s: te.Schedule, anchor: te.Tensor, output: te.Tensor, squares: te.Tensor,
                  width: int) -> None:
    """Rows (n, y) in parallel; at each, its squares, then the blocks of its pixels, the
    lanes of a block one vector (``width`` of them) in both stages."""
    owner = owner_of(s, anchor, output)
    stage = s[owner]
    n, b, y, x, lane = stage.op.axis
    stage.reorder(n, y, b, x, lane)
    row = parallel_outer(stage, [n, y], tensor_size(owner))
    if width > 1:
        stage.vectorize(lane)
    sq = s[squares]
    sq.compute_at(stage, row)
    if width > 1:
        sq.vectorize(sq.op.axis[5])
    arrange_rest(s)
