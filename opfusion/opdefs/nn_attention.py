"""Scaled dot-product attention as one operator: ``nn.attention``, the target of the
FuseAttention rewrite (:mod:`opfusion.transform.fuse_attention`).

``softmax(query @ key * scale + bias) @ value`` along the keys, where ``key`` is given with
the keys last, (..., D, Sk), as the scores' matrix product reads it (what an exporter's
``Transpose(K)`` or ``K^T`` gives). A kernel computes it a block of queries at a time, the
scores of the block in cache, never the whole (Sq, Sk) matrix in memory."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..ir.op import Attr, Attrs, Op, OpPatternKind, register_op
from ..ir.types import TensorType, Type
from ._common import broadcast_shape
from ._nn_common import float_dtype, wide
from .nn_norm import Softmax


@register_op
class Attention(Op):
    name = "nn.attention"
    doc = ("softmax(query @ key * scale + bias) @ value, the softmax along the keys: query "
           "(..., Sq, D), key with the keys last (..., D, Sk), value (..., Sk, Dv), the batch "
           "axes broadcast together; bias (a mask of 0 and large negative values, or "
           "relative positions) broadcasts to the scores (..., Sq, Sk), a scalar 0 when there "
           "is none. The result is (..., Sq, Dv).")
    inputs = ("query", "key", "value", "bias")
    pattern = OpPatternKind.kOutEWiseFusable
    attrs = {"scale": Attr("float", 1.0, doc="multiplies the scores before the bias")}

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        query, key, value, bias = self.expect_tensors(arg_types)
        dtype = float_dtype(self, [query, key, value, bias], self.inputs)
        for name, ty in (("query", query), ("key", key), ("value", value)):
            if ty.ndim < 2:
                raise self.type_error(f"input {name!r} {ty.shape} must have rank 2 or more "
                                      "(rows and columns, after any batch axes)")
        if query.shape[-1] != key.shape[-2]:
            raise self.type_error(f"query {query.shape} has {query.shape[-1]} values a row but "
                                  f"key {key.shape} (keys last) has {key.shape[-2]}")
        if key.shape[-1] != value.shape[-2]:
            raise self.type_error(f"key {key.shape} holds {key.shape[-1]} keys but value "
                                  f"{value.shape} has {value.shape[-2]} rows")
        batch = broadcast_shape(
            self, [TensorType(t.shape[:-2], dtype) for t in (query, key, value)],
            ("query's batch axes", "key's batch axes", "value's batch axes"))
        scores = TensorType((*batch, query.shape[-2], key.shape[-1]), dtype)
        if broadcast_shape(self, [scores, bias], ("scores", "bias")) != scores.shape:
            raise self.type_error(f"bias {bias.shape} must broadcast to the scores "
                                  f"{scores.shape}")
        return TensorType((*batch, query.shape[-2], value.shape[-1]), dtype)

    def reference(self, query: np.ndarray, key: np.ndarray, value: np.ndarray,
                  bias: np.ndarray, scale: float) -> np.ndarray:
        scores = np.matmul(wide(query), wide(key)) * scale + wide(bias)
        with np.errstate(divide="ignore", invalid="ignore"):  # a row masked out: NaN
            shifted, log_total = Softmax.shifted(scores, -1)
            return np.matmul(np.exp(shifted - log_total), wide(value))
