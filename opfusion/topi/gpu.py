"""Computes for GPU targets (``register_compute(..., device="cuda")``), where the CPU's
differ for the CPU's sake.

The CPU's convolution reads a padded copy of its input, split into column phases for strided
windows and laid out in vector-wide column blocks. On a GPU each thread computes whole output
elements, so the convolution reads its input directly, with a bounds test for the padding:
one stage, no copy, every read of a thread at its own output position.

The CPU's attention pads keys and queries to whole register tiles and reduces in vector
lanes; on a GPU it is plain rows (scores, their maximum, exponentials, their sum, the
exponentials times the values, the quotient), which the GPU's rows rule computes one block
per query row, the row's stages in shared memory."""

from __future__ import annotations

from typing import Any

from .. import te
from ._util import accumulator_dtype
from .nn import _batch_index
from .nn_attention import _bias_index
from .nn_norm import _shift
from .registry import register_compute


@register_compute("nn.conv2d", device="cuda")
def conv2d_direct(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """NCHW x OIHW convolution (groups and depthwise included), padding tested in place."""
    data, weight = inputs
    _, in_channels, height, width = (int(d) for d in data.shape)
    out_channels, group_channels, kh, kw = (int(d) for d in weight.shape)
    _, _, out_h, out_w = (int(d) for d in out_type.shape)
    stride_h, stride_w = attrs.strides
    dil_h, dil_w = attrs.dilation
    top, left = attrs.padding[0], attrs.padding[1]
    per_group = out_channels // int(attrs.groups)
    acc = accumulator_dtype(out_type.dtype)
    rc = te.reduce_axis((0, group_channels), name="rc")
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")

    def element(n: Any, o: Any, y: Any, x: Any) -> Any:
        c = (o // per_group) * group_channels + rc if int(attrs.groups) > 1 else rc
        iy = y * stride_h + ry * dil_h - top
        ix = x * stride_w + rx * dil_w - left
        inside = te.all(iy >= 0, iy < height, ix >= 0, ix < width)
        value = te.if_then_else(
            inside, data[n, c, te.max(te.min(iy, height - 1), 0),
                         te.max(te.min(ix, width - 1), 0)], te.const(0, data.dtype))
        return te.sum(te.cast(value, acc) * te.cast(weight[o, rc, ry, rx], acc),
                      axis=[rc, ry, rx])

    out = te.compute((int(data.shape[0]), out_channels, out_h, out_w), element,
                     name="conv2d")
    if acc == out_type.dtype:
        return out
    return te.compute(out.shape, lambda *i: te.cast(out[i], out_type.dtype), name="conv2d_cast")


@register_compute("nn.attention", device="cuda")
def attention_rows(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """softmax(query @ key * scale + bias) @ value as rows (see the module docstring); a
    row whose maximum is infinite is not shifted, as in the reference."""
    query, key, value, bias = inputs
    dtype = accumulator_dtype(out_type.dtype)
    batch = tuple(int(d) for d in out_type.shape[:-2])
    rows, depth = int(query.shape[-2]), int(query.shape[-1])
    keys, width = int(key.shape[-1]), int(value.shape[-1])
    d = te.reduce_axis((0, depth), name="d")
    scale = te.const(float(attrs.scale), dtype)

    def score(*i: Any) -> Any:
        dot = te.sum(te.cast(query[(*_batch_index(i, batch, query.shape[:-2]), i[-2], d)], dtype)
                     * te.cast(key[(*_batch_index(i, batch, key.shape[:-2]), d, i[-1])], dtype),
                     axis=d)
        return dot

    scores = te.compute((*batch, rows, keys), score, name="attention_scores")

    def biased(i: Any) -> Any:
        value_ = scores[tuple(i)] * scale
        if bias.ndim:
            value_ = value_ + te.cast(bias[_bias_index(i, bias.shape, lambda r: r)], dtype)
        return value_

    j = te.reduce_axis((0, keys), name="j")
    peak = te.compute((*batch, rows), lambda *i: te.max(biased((*i, j)), axis=j),
                      name="attention_max")
    exps = te.compute((*batch, rows, keys),
                      lambda *i: te.exp(biased(i) - _shift(peak, i[:-1])), name="attention_exp")
    k = te.reduce_axis((0, keys), name="k")
    total = te.compute((*batch, rows), lambda *i: te.sum(exps[(*i, k)], axis=k),
                       name="attention_sum")
    m = te.reduce_axis((0, keys), name="m")
    acc = te.compute(
        (*batch, rows, width),
        lambda *i: te.sum(exps[(*i[:-1], m)] * te.cast(
            value[(*_batch_index(i, batch, value.shape[:-2]), m, i[-1])], dtype), axis=m),
        name="attention_acc")
    return te.compute(out_type.shape,
                      lambda *i: te.cast(acc[i] / total[i[:-1]], out_type.dtype),
                      name="attention")


__all__ = ["attention_rows", "conv2d_direct"]
