"""Pooling over the H and W axes of NCHW data: max_pool2d, avg_pool2d and their global forms.

Each also takes data in a blocked layout, ``layout="NCHW<k>c"``: rank 5, (N, C/k, H, W, k),
the result in the same layout; the layout pass (:mod:`opfusion.transform.alter_op_layout`)
uses it to keep pooling between blocked convolutions without converting to NCHW and back.

Window geometry follows ONNX: padding is (top, left, bottom, right); with ``ceil_mode`` a last
partial window is kept unless it would start in the bottom/right padding. Max pooling treats
padding as -inf; average pooling divides by the taps inside the input, or with
``count_include_pad`` by the taps inside the padded input (never the ceil_mode overhang)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import OpAttributeError
from ..ir.op import Attr, Attrs, Op, OpPatternKind, register_op
from ..ir.types import TensorType, Type
from ._nn_common import (
    LAYOUT_ATTR,
    check_layout_data,
    check_positive,
    float_dtype,
    in_nchw,
    layout_block,
    normalize_padding,
    numeric_dtype,
    pad_spatial,
    spatial_output,
    window_output_size,
    windows,
)


class _Pool2D(Op):
    inputs = ("data",)
    pattern = OpPatternKind.kOutEWiseFusable
    float_only = False
    attrs = {
        "pool_size": Attr("ints", 1, length=2, doc="(height, width) of the window"),
        "strides": Attr("ints", 1, length=2, doc="(height, width) step of the window"),
        "dilation": Attr("ints", 1, length=2, doc="(height, width) spacing of window taps"),
        "padding": Attr("ints", 0, always_print=True,
                        doc="1, 2 or 4 values, normalized to (top, left, bottom, right)"),
        "layout": LAYOUT_ATTR,
        "ceil_mode": Attr("bool", False, doc="round the output size up (keep partial windows)"),
    }

    def normalize_attrs(self, attrs: dict[str, Any]) -> dict[str, Any]:
        layout_block(self, attrs["layout"])
        padding = normalize_padding(self, attrs["padding"])
        attrs["padding"] = padding
        check_positive(self, attrs, ("pool_size", "strides", "dilation"))
        for axis in range(2):
            extent = attrs["dilation"][axis] * (attrs["pool_size"][axis] - 1) + 1
            if max(padding[axis], padding[axis + 2]) >= extent:
                raise OpAttributeError(
                    f"{self.name} attribute 'padding'={padding} must be smaller than the "
                    f"(dilated) window, which spans {extent} along the "
                    f"{('height', 'width')[axis]}; otherwise a window could hold only padding")
        return attrs

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        (data,) = self.expect_tensors(arg_types)
        check_layout_data(self, data, attrs.layout)
        check = float_dtype if self.float_only else numeric_dtype
        check(self, [data], self.inputs)
        out_h, out_w = spatial_output(self, data, attrs.pool_size, attrs.strides, attrs.dilation,
                                      attrs.padding, attrs.ceil_mode, kernel_name="pool_size")
        return TensorType((*data.shape[:2], out_h, out_w, *data.shape[4:]), data.dtype)

    @staticmethod
    def _geometry(data: np.ndarray, pool_size: tuple, strides: tuple, dilation: tuple,
                  padding: tuple, ceil_mode: bool) -> tuple[tuple[int, int], tuple[int, int]]:
        """Output size and the overhang past the bottom/right padding that ceil_mode needs."""
        out, extra = [], []
        for axis in range(2):
            size, before, after = data.shape[2 + axis], padding[axis], padding[axis + 2]
            n = window_output_size(size, pool_size[axis], strides[axis], dilation[axis], before,
                                   after, ceil_mode)
            needed = (n - 1) * strides[axis] + dilation[axis] * (pool_size[axis] - 1) + 1
            out.append(n)
            extra.append(max(0, needed - (size + before + after)))
        return (out[0], out[1]), (extra[0], extra[1])


@register_op
class MaxPool2D(_Pool2D):
    name = "nn.max_pool2d"
    doc = ("Maximum over each (dilated) pool_size window of NCHW (or NCHW<k>c) data; padding "
           "counts as -inf.")

    def reference(self, data: np.ndarray, *, layout: str, **attrs: Any) -> np.ndarray:
        return in_nchw(self._nchw, data, layout, **attrs)

    def _nchw(self, data: np.ndarray, *, pool_size: tuple, strides: tuple, dilation: tuple,
              padding: tuple, ceil_mode: bool) -> np.ndarray:
        out, extra = self._geometry(data, pool_size, strides, dilation, padding, ceil_mode)
        lowest = -np.inf if data.dtype.kind == "f" else np.iinfo(data.dtype).min
        padded = pad_spatial(data, padding, lowest, extra)
        return windows(padded, pool_size, strides, dilation, out).max(axis=(-2, -1))


@register_op
class AvgPool2D(_Pool2D):
    name = "nn.avg_pool2d"
    doc = "Mean over each (dilated) pool_size window of NCHW (or NCHW<k>c) data."
    float_only = True
    attrs = {
        **_Pool2D.attrs,
        "count_include_pad": Attr("bool", False,
                                  doc="divide by the taps in the padded input, not the input"),
    }

    def reference(self, data: np.ndarray, *, layout: str, **attrs: Any) -> np.ndarray:
        return in_nchw(self._nchw, data, layout, **attrs)

    def _nchw(self, data: np.ndarray, *, pool_size: tuple, strides: tuple, dilation: tuple,
              padding: tuple, ceil_mode: bool, count_include_pad: bool) -> np.ndarray:
        out, extra = self._geometry(data, pool_size, strides, dilation, padding, ceil_mode)
        padded = pad_spatial(data.astype(np.float64), padding, 0.0, extra)
        sums = windows(padded, pool_size, strides, dilation, out).sum(axis=(-2, -1))
        # The divisor is separable: (taps counted along H) x (taps counted along W).
        counts = []
        for axis in range(2):
            size, before, after = data.shape[2 + axis], padding[axis], padding[axis + 2]
            counted = np.zeros(size + before + after + extra[axis])
            if count_include_pad:
                counted[:before + size + after] = 1
            else:
                counted[before:before + size] = 1
            extent = dilation[axis] * (pool_size[axis] - 1) + 1
            taps = np.lib.stride_tricks.sliding_window_view(counted, extent)
            counts.append(taps[::strides[axis], ::dilation[axis]][:out[axis]].sum(axis=-1))
        return sums / np.multiply.outer(counts[0], counts[1])


class _GlobalPool2D(Op):
    inputs = ("data",)
    pattern = OpPatternKind.kOutEWiseFusable
    attrs = {"layout": LAYOUT_ATTR}
    float_only = False

    def normalize_attrs(self, attrs: dict[str, Any]) -> dict[str, Any]:
        layout_block(self, attrs["layout"])
        return attrs

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        (data,) = self.expect_tensors(arg_types)
        check_layout_data(self, data, attrs.layout)
        check = float_dtype if self.float_only else numeric_dtype
        check(self, [data], self.inputs)
        if data.shape[2] == 0 or data.shape[3] == 0:
            raise self.type_error(f"input 'data' {data.shape} has an empty spatial axis; there "
                                  "is nothing to pool")
        return TensorType((*data.shape[:2], 1, 1, *data.shape[4:]), data.dtype)


@register_op
class GlobalAvgPool2D(_GlobalPool2D):
    name = "nn.global_avg_pool2d"
    doc = ("Mean over H and W of NCHW data: (N, C, H, W) -> (N, C, 1, 1); NCHW<k>c data: "
           "(N, C/k, H, W, k) -> (N, C/k, 1, 1, k).")
    float_only = True

    def reference(self, data: np.ndarray, layout: str) -> np.ndarray:
        # The blocked layout only moves the channels: H and W are axes 2 and 3 either way.
        return data.astype(np.float64).mean(axis=(2, 3), keepdims=True)


@register_op
class GlobalMaxPool2D(_GlobalPool2D):
    name = "nn.global_max_pool2d"
    doc = ("Maximum over H and W of NCHW data: (N, C, H, W) -> (N, C, 1, 1); NCHW<k>c data: "
           "(N, C/k, H, W, k) -> (N, C/k, 1, 1, k).")

    def reference(self, data: np.ndarray, layout: str) -> np.ndarray:
        return data.max(axis=(2, 3), keepdims=True)
