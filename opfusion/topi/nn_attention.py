"""TE compute of nn.attention: softmax(query @ key * scale + bias) @ value, a block of
queries at a time.

Stages, each found by its tag by the ``attention`` schedule rule
(:mod:`opfusion.backend.cpu.schedules.attention`), which computes all but the first at the
result's block of queries (so that a block's scores live in cache, never the whole matrix
in memory):

- ``attention_keys``: the keys padded with zeros to whole tiles (two vectors; one for few
  keys), when they are not (a vision transformer's 197 tokens), so the scores' register
  tiles need no guard; ``attention_bias`` (tag ``attention_pad``), the bias padded with
  -inf the same way, or ``attention_mask``, a row of 0 and -inf added to the scores when
  there is no bias along the keys: the padding columns' exponentials are then 0;
- ``attention_scores``: ``query @ key`` over rows padded to whole query blocks (the padding
  rows read the last query and are cropped);
- ``attention_max_lanes`` / ``attention_max``: each row's maximum of the scaled, biased
  scores, first as vector-wide partial maxima, then across the lanes;
- ``attention_exp``: ``exp(score - max)`` (0 in the padding columns, and where it is below
  the normal floats: :func:`opfusion.te.exp_normal`, so that the products by the values
  read no subnormal weight);
- ``attention_sum_lanes`` / ``attention_sum``: their row sums, the same way;
- ``attention_acc``: ``exp @ value`` over the real keys;
- ``attention``: the accumulator divided by the row sum (normalized last, as flash attention
  does: Sq x Dv divisions instead of Sq x Sk).

As in the softmax reference, a row whose maximum is infinite is not shifted (a row masked
out entirely gives NaN, as there)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .. import te
from ._util import accumulator_dtype, vector_lanes
from .nn import _batch_index, register_rows
from .nn_norm import _shift
from .registry import register_compute

ATTN_KEYS = "attention_keys"
ATTN_PAD = "attention_pad"
ATTN_SCORES = "attention_scores"
ATTN_MAX_LANES = "attention_max_lanes"
ATTN_MAX = "attention_max"
ATTN_EXP = "attention_exp"
ATTN_SUM_LANES = "attention_sum_lanes"
ATTN_SUM = "attention_sum"
ATTN_ACC = "attention_acc"
ATTN_OUT = "attention"


#: Register tiles of rows (:func:`.nn.register_rows`) per block of queries.
BLOCK_TILES = 2


def query_block(target: Any) -> int:
    """Query rows of one block: BLOCK_TILES register tiles of rows
    (:func:`.nn.register_rows`), so each tile of keys or values is read from L1 by
    several; on a target of 32 vector registers, one tile of :func:`query_tile_rows`."""
    return max(BLOCK_TILES * register_rows(target), query_tile_rows(target))


def query_tile_rows(target: Any) -> int:
    """Query rows of the attention's register tiles (rows x two vectors of keys, or of the
    values' columns): as the products' tiles, half the vector registers as accumulators in
    rows of two vectors (8 rows with 32 registers, each vector of keys or values loaded once
    for 16 multiply-adds, not 8), at least :func:`.nn.register_rows`. ViT-B/16's attention
    kernels on a Xeon with AVX-512: 10.2 -> 9.6 ms a run."""
    return max(register_rows(target), target.vector_registers // 4)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@register_compute("nn.attention")
def attention(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """See the module docstring."""
    from ..target import Target

    query, key, value, bias = inputs
    target = Target.current()
    assert target is not None
    dtype = accumulator_dtype(out_type.dtype)
    batch = tuple(int(d) for d in out_type.shape[:-2])
    rows, depth = int(query.shape[-2]), int(query.shape[-1])
    keys, width = int(key.shape[-1]), int(value.shape[-1])
    lanes = vector_lanes(dtype)
    block = query_block(target)
    padded_rows = _round_up(rows, block)
    # Whole tiles of two vectors of keys (the scores' register tile) once there are enough.
    padded_keys = _round_up(keys, 2 * lanes if keys > 2 * lanes else lanes)

    def row(i: Any) -> Any:  # padding rows read the last row (and are cropped)
        return te.min(i, rows - 1) if padded_rows != rows else i

    key_at = _padded_keys(key, keys, padded_keys)
    d = te.reduce_axis((0, depth), name="d")
    scores = te.compute(
        (*batch, padded_rows, padded_keys),
        lambda *i: te.sum(
            te.cast(query[(*_batch_index(i, batch, query.shape[:-2]), row(i[-2]), d)], dtype)
            * te.cast(key_at((*_batch_index(i, batch, key.shape[:-2]), d, i[-1])), dtype),
            axis=d),
        name="attention_scores", tag=ATTN_SCORES)
    scale = te.const(float(attrs.scale), dtype)

    bias_at, pad_mask = _padded_bias(bias, keys, padded_keys, dtype)

    def biased(i: Sequence[Any]) -> te.PrimExpr:
        """The scaled score plus the bias, -inf in the padding columns (from the padded bias
        or the padding mask: an addition, which vectorizes, not a guard)."""
        value_ = scores[tuple(i)] * scale
        if bias_at is not None:
            value_ = value_ + bias_at(_bias_index(i, bias.shape, row))
        if pad_mask is not None:
            value_ = value_ + pad_mask[i[-1]]
        return value_

    shape = (*batch, padded_rows)
    peak = _lane_reduce(shape, padded_keys, lanes, biased, te.max, "attention_max",
                        ATTN_MAX_LANES, ATTN_MAX)

    exps = te.compute((*batch, padded_rows, padded_keys),
                      lambda *i: te.exp_normal(biased(i) - _shift(peak, i[:-1])),
                      name="attention_exp", tag=ATTN_EXP)
    total = _lane_reduce(shape, padded_keys, lanes, lambda i: exps[tuple(i)], te.sum,
                         "attention_sum", ATTN_SUM_LANES, ATTN_SUM)
    j = te.reduce_axis((0, keys), name="j")
    acc = te.compute(
        (*batch, padded_rows, width),
        lambda *i: te.sum(
            exps[(*i[:-1], j)]
            * te.cast(value[(*_batch_index(i, batch, value.shape[:-2]), j, i[-1])], dtype),
            axis=j),
        name="attention_acc", tag=ATTN_ACC)
    return te.compute(out_type.shape,
                      lambda *i: te.cast(acc[i] / total[i[:-1]], out_type.dtype),
                      name="attention", tag=ATTN_OUT)


def _padded_keys(key: te.Tensor, keys: int, padded: int) -> Callable[[Sequence[Any]],
                                                                      te.PrimExpr]:
    """How the scores read the keys: directly when they are whole vectors, else from a copy
    padded with zeros (stage ``attention_keys``)."""
    if padded == keys:
        return lambda index: key[tuple(index)]
    zero = te.const(0, key.dtype)
    copy = te.compute((*key.shape[:-1], padded),
                      lambda *i: te.if_then_else(i[-1] < keys, key[i], zero),
                      name="attention_keys", tag=ATTN_KEYS)
    return lambda index: copy[tuple(index)]


def _padded_bias(bias: te.Tensor, keys: int, padded: int, dtype: str
                 ) -> tuple[Callable[[Sequence[Any]], te.PrimExpr] | None, te.Tensor | None]:
    """How the scores read the bias (None: no bias) and the padding mask (None: none), so
    that the padding columns get -inf. A bias with a key axis is copied padded with -inf
    (stage ``attention_bias``, built first); otherwise a row of 0 and -inf is added
    (``attention_mask``)."""
    minus_inf = te.const(float("-inf"), dtype)
    if padded == keys or not bias.ndim or int(bias.shape[-1]) == 1:
        at = (None if not bias.ndim
              else lambda index: te.cast(bias[tuple(index)], dtype))
        mask = None
        if padded != keys:
            zero = te.const(0, dtype)
            mask = te.compute((padded,), lambda j: te.select(j < keys, zero, minus_inf),
                              name="attention_mask", tag=ATTN_PAD)
        return at, mask
    copy = te.compute((*bias.shape[:-1], padded),
                      lambda *i: te.if_then_else(i[-1] < keys, te.cast(bias[i], dtype),
                                                 minus_inf),
                      name="attention_bias", tag=ATTN_PAD)
    return (lambda index: copy[tuple(index)]), None


def _bias_index(i: Sequence[Any], shape: Sequence[int], row: Callable[[Any], Any]
                ) -> tuple[Any, ...]:
    """The bias element of score ``i`` (NumPy broadcasting; padding rows read the last row)."""
    if not shape:
        return ()
    full = [*i[:-2], row(i[-2]), i[-1]]
    offset = len(full) - len(shape)
    return tuple(0 if size == 1 else full[offset + axis] for axis, size in enumerate(shape))


def _lane_reduce(shape: tuple[int, ...], extent: int, lanes: int,
                 value: Callable[[Sequence[Any]], te.PrimExpr], reducer: Any, name: str,
                 lanes_tag: str, tag: str) -> te.Tensor:
    """``reducer`` of ``value(i + (k,))`` over ``k < extent`` (a multiple of ``lanes``) for
    every index ``i`` of ``shape``: vector-wide partial results (``lanes`` of them, the
    schedule vectorizes that axis), then across the lanes."""
    b = te.reduce_axis((0, extent // lanes), name="b")
    partial = te.compute((*shape, lanes),
                         lambda *i: reducer(value((*i[:-1], b * lanes + i[-1])), axis=b),
                         name=f"{name}_lanes", tag=lanes_tag)
    lane = te.reduce_axis((0, lanes), name="lane")
    return te.compute(shape, lambda *i: reducer(partial[(*i, lane)], axis=lane), name=name,
                      tag=tag)
