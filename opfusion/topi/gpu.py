"""Computes for GPU targets (``register_compute(..., device="cuda")``), where the CPU's
differ for the CPU's sake.

The CPU's convolution reads a padded copy of its input, split into column phases for strided
windows and laid out in vector-wide column blocks. On a GPU each thread computes whole output
elements, so the convolution reads its input directly, with a bounds test for the padding:
one stage, no copy, every read of a thread at its own output position."""

from __future__ import annotations

from typing import Any

from .. import te
from ._util import accumulator_dtype
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


__all__ = ["conv2d_direct"]
