"""Converter of ONNX's Attention (opset 23+) to the fused ``nn.attention`` operator.

The common forms become one ``nn.attention`` (a kernel that never holds the whole score
matrix): float32 query, key and value of rank 4 ``(batch, heads, sequence, head size)``, or
of rank 3 with ``q_num_heads`` = ``kv_num_heads``, the same number of heads for queries and
keys, no past cache, optionally causal with as many queries as keys, optionally a bool or
float mask over every key (added to the scores; a query whose keys are all masked gives
zeros, as ONNX says), and only the output ``Y`` asked for. Every other form (past and
present caches, grouped heads, softcap, the QK output, windows, a mask shorter than the keys,
float16) converts ONNX's function body instead: the converter declines with
``NotImplemented``."""

from __future__ import annotations

import math

import numpy as np

from .... import op
from ....ir.expr import Constant, Expr
from ..registry import OnnxNode, converter
from ._common import tensor_type

_FLOAT = 1  # TensorProto.FLOAT


@converter("Attention", since=23)
def attention(node: OnnxNode) -> Expr:
    if not _fused_form(node):
        return NotImplemented
    query, key, value = node.input(0), node.input(1), node.input(2)
    rank = tensor_type(query).ndim
    if rank == 3:
        heads = int(node.attr("q_num_heads"))
        query, key, value = (_split_heads(x, heads) for x in (query, key, value))
    seq_q, size = tensor_type(query).shape[-2:]
    seq_k = tensor_type(key).shape[-2]
    scale = node.attr("scale")
    scale = 1.0 / math.sqrt(size) if scale is None else float(scale)
    bias: Expr = Constant(np.array(0, np.float32))
    if node.attr("is_causal", 0):
        # Query i sees keys 0..i: -inf above the diagonal.
        bias = Constant(np.triu(np.full((seq_q, seq_k), -np.inf, np.float32), k=1))
    mask = node.optional_input(3)
    if mask is not None:
        if tensor_type(mask).dtype == "bool":  # True: the query attends to the key
            mask = op.where(mask, Constant(np.array(0, np.float32)),
                            Constant(np.array(-np.inf, np.float32)))
        bias = mask if isinstance(bias, Constant) and not bias.data.ndim else op.add(bias, mask)
    out = op.nn.attention(query, op.transpose(key, axes=[0, 1, 3, 2]), value, bias,
                          scale=scale)
    if mask is not None:
        # A query whose every key is masked attends to nothing: zeros (ONNX), not NaN.
        masked = op.equal(op.max(bias, axis=[-1], keepdims=True),
                          Constant(np.array(-np.inf, np.float32)))
        out = op.where(masked, Constant(np.array(0, np.float32)), out)
    return _merge_heads(out) if rank == 3 else out


def _fused_form(node: OnnxNode) -> bool:
    """Whether the node is one of the forms ``nn.attention`` computes exactly."""
    if node.num_outputs > 1 or any(x is not None for x in node.inputs[4:]):
        return False
    if any(node.attr(name) not in (None, 0, 0.0) for name in ("softcap",
                                                               "qk_matmul_output_mode")):
        return False
    if node.attr("softmax_precision") not in (None, _FLOAT):
        return False
    if any(node.attr(name) not in (None, -1) for name in ("left_window_size",
                                                          "right_window_size")):
        return False
    types = [tensor_type(node.input(i)) for i in range(3)]
    if any(ty.dtype != "float32" for ty in types) or len({ty.ndim for ty in types}) != 1:
        return False
    query, key, value = types
    if query.ndim == 4:
        if node.attr("q_num_heads") is not None or node.attr("kv_num_heads") is not None:
            return False
        same_heads = query.shape[1] == key.shape[1] == value.shape[1]
        shapes_fit = (query.shape[0] == key.shape[0] == value.shape[0]
                      and query.shape[3] == key.shape[3] and key.shape[2] == value.shape[2])
        seq_q, seq_k = query.shape[2], key.shape[2]
    elif query.ndim == 3:
        heads, kv_heads = node.attr("q_num_heads"), node.attr("kv_num_heads")
        same_heads = heads is not None and heads == kv_heads and heads > 0
        shapes_fit = (same_heads and query.shape[0] == key.shape[0] == value.shape[0]
                      and query.shape[2] % heads == 0 and key.shape[2] == query.shape[2]
                      and value.shape[2] % heads == 0 and key.shape[1] == value.shape[1])
        seq_q, seq_k = query.shape[1], key.shape[1]
    else:
        return False
    causal_fits = not node.attr("is_causal", 0) or seq_q == seq_k
    return same_heads and shapes_fit and causal_fits and _mask_fits(node, seq_q, seq_k)


def _mask_fits(node: OnnxNode, seq_q: int, seq_k: int) -> bool:
    """No mask, or a bool or float32 one that broadcasts to the scores (batch, heads,
    queries, keys) with every key (ONNX lets a shorter one stand for padding: declined)."""
    mask = node.optional_input(3)
    if mask is None:
        return True
    ty = tensor_type(mask)
    return (ty.dtype in ("bool", "float32") and 2 <= ty.ndim <= 4 and ty.shape[-1] == seq_k
            and ty.shape[-2] in (1, seq_q))


def _split_heads(x: Expr, heads: int) -> Expr:
    """(batch, sequence, heads * size) as (batch, heads, sequence, size)."""
    batch, seq, width = tensor_type(x).shape
    return op.transpose(op.reshape(x, newshape=[batch, seq, heads, width // heads]),
                        axes=[0, 2, 1, 3])


def _merge_heads(x: Expr) -> Expr:
    """(batch, heads, sequence, size) as (batch, sequence, heads * size)."""
    batch, heads, seq, size = tensor_type(x).shape
    return op.reshape(op.transpose(x, axes=[0, 2, 1, 3]), newshape=[batch, seq, heads * size])
