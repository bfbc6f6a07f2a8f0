"""Converters of ATen's neural-network operators: convolution and pooling, normalization,
matrix products, softmax, scaled dot-product attention (one ``nn.attention``), dropout in
inference and upsampling.

The IR's convolution and pooling are 2-D NCHW: a 1-D one runs over a unit height axis. A
normalization's saved statistics and max-pooling's indices exist only for training and
unpooling; they are :class:`~opfusion.frontend.pytorch.registry.Unavailable` here, an error
only if the graph reads them."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from .... import op
from ....ir.expr import Constant, Expr
from ...common import gelu
from ..registry import AtenNode, Unavailable, converter
from ._common import as_dtype, dim, filled, number, shape_of, tensor_type

_TRAINING = ("exists only in training; call model.eval() before compiling (opfusion compiles "
             "inference)")

# ---------------------------------------------------------------------------------------------
# convolution


def _per_axis(node: AtenNode, name: str, rank: int, default: int) -> list[int]:
    """A per-spatial-axis int list (one value stands for every axis)."""
    values = node.ints(name, [default])
    if len(values) == 1:
        values = values * rank
    if len(values) != rank:
        raise node.error(f"{name}={values} needs {rank} value(s), one per spatial axis")
    return values


def _planar(values: Sequence[int], one: int, rank: int) -> list[int]:
    return [one, *values] if rank == 1 else list(values)


@converter("aten.convolution.default")
def convolution(node: AtenNode) -> Expr:
    x, weight, bias = node.tensor("input"), node.tensor("weight"), node.optional_tensor("bias")
    rank = len(shape_of(weight)) - 2
    if rank not in (1, 2) or len(shape_of(x)) != rank + 2:
        raise node.error(f"{rank}-D convolution of input {shape_of(x)} is not supported "
                         "(opfusion has 1-D and 2-D convolutions over batched NC... data)")
    strides = _planar(_per_axis(node, "stride", rank, 1), 1, rank)
    dilation = _planar(_per_axis(node, "dilation", rank, 1), 1, rank)
    pads = _planar(_per_axis(node, "padding", rank, 0), 0, rank)
    groups = int(node.get("groups", 1))
    if rank == 1:
        x, weight = op.expand_dims(x, axis=2), op.expand_dims(weight, axis=2)
    padding = (pads[0], pads[1], pads[0], pads[1])
    if node.get("transposed", False):
        extra = _planar(_per_axis(node, "output_padding", rank, 0), 0, rank)
        out = op.nn.conv2d_transpose(x, weight, strides=strides, padding=padding,
                                     dilation=dilation, groups=groups, output_padding=extra)
    else:
        out = op.nn.conv2d(x, weight, strides=strides, padding=padding, dilation=dilation,
                           groups=groups)
    if bias is not None:
        out = op.nn.bias_add(out, bias, axis=1)
    return op.squeeze(out, axis=[2]) if rank == 1 else out


# ---------------------------------------------------------------------------------------------
# pooling


def _pool_window(node: AtenNode) -> dict[str, object]:
    x = node.tensor("self")
    if len(shape_of(x)) not in (3, 4):
        raise node.error(f"2-D pooling needs (C, H, W) or (N, C, H, W) data, got {shape_of(x)}")
    kernel = _per_axis(node, "kernel_size", 2, 1)
    stride = node.ints("stride", []) or kernel  # an empty stride is the kernel's
    stride = stride * 2 if len(stride) == 1 else stride
    pads = _per_axis(node, "padding", 2, 0)
    return {"pool_size": kernel, "strides": stride,
            "padding": (pads[0], pads[1], pads[0], pads[1]),
            "ceil_mode": bool(node.get("ceil_mode", False))}


def _batched(x: Expr, fn: Callable[[Expr], Expr]) -> Expr:
    """``fn`` of (C, H, W) data through a unit batch axis."""
    if len(shape_of(x)) == 4:
        return fn(x)
    return op.squeeze(fn(op.expand_dims(x, axis=0)), axis=[0])


@converter("aten.max_pool2d_with_indices.default")
def max_pool2d_with_indices(node: AtenNode) -> tuple[Expr, Unavailable]:
    return max_pool2d(node), Unavailable("max_pool2d's indices (for max_unpool) are not "
                                         "computed by opfusion")


@converter("aten.max_pool2d.default")
def max_pool2d(node: AtenNode) -> Expr:
    window = _pool_window(node)
    dilation = _per_axis(node, "dilation", 2, 1)
    return _batched(node.tensor("self"),
                    lambda x: op.nn.max_pool2d(x, dilation=dilation, **window))


@converter("aten.avg_pool2d.default")
def avg_pool2d(node: AtenNode) -> Expr:
    if node.get("divisor_override") is not None:
        raise node.error("divisor_override is not supported")
    window = _pool_window(node)
    include = bool(node.get("count_include_pad", True))
    return _batched(node.tensor("self"),
                    lambda x: op.nn.avg_pool2d(x, count_include_pad=include, **window))


def _adaptive(node: AtenNode, reduce: Callable[..., Expr],
              pool: Callable[..., Expr]) -> Expr:
    """Adaptive pooling: a plain pool when the sizes divide, else one reduction per output
    cell over torch's window [floor(i*in/out), ceil((i+1)*in/out))."""
    x = node.tensor("self")
    height, width = shape_of(x)[-2:]
    out_h, out_w = _per_axis(node, "output_size", 2, 1)
    if height % out_h == 0 and width % out_w == 0:
        kernel = [height // out_h, width // out_w]
        return _batched(x, lambda data: pool(data, pool_size=kernel, strides=kernel))
    if out_h * out_w > 1024:
        raise node.error(f"adaptive pooling of {height}x{width} to {out_h}x{out_w} (sizes "
                         "that do not divide) is supported up to 1024 output cells")
    rows = []
    for i in range(out_h):
        top, bottom = (i * height) // out_h, -((-(i + 1) * height) // out_h)
        cells = []
        for j in range(out_w):
            left, right = (j * width) // out_w, -((-(j + 1) * width) // out_w)
            cell = op.strided_slice(x, begin=[top, left], end=[bottom, right], axes=[-2, -1])
            cells.append(reduce(cell, axis=[-2, -1], keepdims=True))
        rows.append(cells[0] if len(cells) == 1 else op.concatenate(cells, axis=-1))
    return rows[0] if len(rows) == 1 else op.concatenate(rows, axis=-2)


@converter("aten._adaptive_avg_pool2d.default", "aten.adaptive_avg_pool2d.default")
def adaptive_avg_pool2d(node: AtenNode) -> Expr:
    return _adaptive(node, op.mean, op.nn.avg_pool2d)


@converter("aten.adaptive_max_pool2d.default")
def adaptive_max_pool2d(node: AtenNode) -> tuple[Expr, Unavailable]:
    return _adaptive(node, op.max, op.nn.max_pool2d), Unavailable(
        "adaptive_max_pool2d's indices are not computed by opfusion")


# ---------------------------------------------------------------------------------------------
# normalization


def _affine(node: AtenNode, name: str, size: int, value: float, dtype: str) -> Expr:
    given = node.optional_tensor(name)
    return filled([size], value, dtype) if given is None else as_dtype(given, dtype)


def _batch_norm(node: AtenNode, eps_name: str = "eps") -> tuple[Expr, Unavailable, Unavailable]:
    x = node.tensor("input")
    dtype, channels = tensor_type(x).dtype, shape_of(x)[1]
    mean, var = node.optional_tensor("running_mean"), node.optional_tensor("running_var")
    if mean is None or var is None:
        raise node.error("batch norm without running statistics normalizes with the batch's "
                         f"own; that {_TRAINING}")
    out = op.nn.batch_norm(x, _affine(node, "weight", channels, 1.0, dtype),
                           _affine(node, "bias", channels, 0.0, dtype), as_dtype(mean, dtype),
                           as_dtype(var, dtype), axis=1, epsilon=float(node.get(eps_name)))
    saved = Unavailable(f"batch norm's saved mean and variance {_TRAINING}")
    return out, saved, saved


@converter("aten._native_batch_norm_legit_no_training.default")
def batch_norm_inference(node: AtenNode) -> tuple[Expr, Unavailable, Unavailable]:
    return _batch_norm(node)


@converter("aten._native_batch_norm_legit.default", "aten.native_batch_norm.default",
           "aten._native_batch_norm_legit_functional.default")
def batch_norm(node: AtenNode) -> tuple[Expr, ...]:
    if node.get("training", False):
        raise node.error(f"batch norm in training mode {_TRAINING}")
    return _batch_norm(node)


@converter("aten.native_layer_norm.default")
def layer_norm(node: AtenNode) -> tuple[Expr, Unavailable, Unavailable]:
    x = node.tensor("input")
    shape, dtype = shape_of(x), tensor_type(x).dtype
    inner = tuple(node.ints("normalized_shape"))
    if shape[len(shape) - len(inner):] != inner:
        raise node.error(f"normalized_shape {list(inner)} is not the trailing shape of the "
                         f"input {shape}")
    size = math.prod(inner)
    flat = x if len(inner) == 1 else op.reshape(x, newshape=[*shape[:len(shape) - len(inner)],
                                                             size])
    gamma = _affine(node, "weight", size, 1.0, dtype)
    beta = _affine(node, "bias", size, 0.0, dtype)
    if len(inner) != 1:
        gamma, beta = op.reshape(gamma, newshape=[size]), op.reshape(beta, newshape=[size])
    out = op.nn.layer_norm(flat, gamma, beta, axis=-1, epsilon=float(node.get("eps")))
    out = out if len(inner) == 1 else op.reshape(out, newshape=list(shape))
    saved = Unavailable(f"layer norm's saved mean and rstd {_TRAINING}")
    return out, saved, saved


@converter("aten.native_group_norm.default")
def group_norm(node: AtenNode) -> tuple[Expr, Unavailable, Unavailable]:
    x = node.tensor("input")
    shape, dtype = shape_of(x), tensor_type(x).dtype
    groups, channels = int(node.get("group")), shape[1]
    if channels % groups:
        raise node.error(f"{channels} channels do not split into {groups} groups")
    grouped = op.reshape(x, newshape=[shape[0], groups, -1])
    mean = op.mean(grouped, axis=[2], keepdims=True)
    centred = grouped - mean
    var = op.mean(centred * centred, axis=[2], keepdims=True)
    normed = op.reshape(centred * op.rsqrt(var + float(node.get("eps"))),
                        newshape=list(shape))
    trailing = [1] * (len(shape) - 2)
    gamma = op.reshape(_affine(node, "weight", channels, 1.0, dtype),
                       newshape=[channels, *trailing])
    beta = op.reshape(_affine(node, "bias", channels, 0.0, dtype),
                      newshape=[channels, *trailing])
    saved = Unavailable(f"group norm's saved mean and rstd {_TRAINING}")
    return normed * gamma + beta, saved, saved


# ---------------------------------------------------------------------------------------------
# matrix products


def _product(a: Expr, b: Expr) -> Expr:
    """``a @ b``; a constant 2-D ``b`` (a weight) becomes dense's (units, in) layout at import."""
    if isinstance(b, Constant) and b.data.ndim == 2:
        return op.nn.dense(a, Constant(np.ascontiguousarray(b.data.T)))
    return op.nn.matmul(a, b)


@converter("aten.addmm.default")
def addmm(node: AtenNode) -> Expr:
    dtype = node.dtype
    product = _product(as_dtype(node.tensor("mat1"), dtype), as_dtype(node.tensor("mat2"), dtype))
    alpha, beta = node.get("alpha", 1), node.get("beta", 1)
    if alpha != 1:
        product = product * number(alpha, dtype)
    if beta == 0:
        return product
    bias = as_dtype(node.tensor("self"), dtype)
    return product + (bias if beta == 1 else bias * number(beta, dtype))


@converter("aten.mm.default", "aten.bmm.default", "aten.matmul.default")
def matmul(node: AtenNode) -> Expr:
    a = as_dtype(node.tensor("self"), node.dtype)
    b = as_dtype(node.tensor("mat2" if "mat2" in node.values else "other"), node.dtype)
    return _product(a, b)


# ---------------------------------------------------------------------------------------------
# softmax and attention


@converter("aten._softmax.default", "aten.softmax.int")
def softmax(node: AtenNode) -> Expr:
    x = as_dtype(node.tensor("self"), node.dtype)
    return op.nn.softmax(x, axis=dim(node, node.get("dim"), len(shape_of(x))))


@converter("aten._log_softmax.default", "aten.log_softmax.int")
def log_softmax(node: AtenNode) -> Expr:
    x = as_dtype(node.tensor("self"), node.dtype)
    return op.nn.log_softmax(x, axis=dim(node, node.get("dim"), len(shape_of(x))))


@converter("aten.scaled_dot_product_attention.default")
def scaled_dot_product_attention(node: AtenNode) -> Expr:
    """One ``nn.attention``: key transposed to (..., D, Sk), a boolean mask as 0/-inf bias,
    ``is_causal`` as the lower-triangular (top-left aligned) mask torch applies."""
    query, key, value = node.tensor("query"), node.tensor("key"), node.tensor("value")
    dtype = tensor_type(query).dtype
    if node.get("dropout_p", 0.0):
        raise node.error("dropout_p > 0 is training; pass dropout_p=0.0 in inference")
    if node.get("enable_gqa", False) and shape_of(query)[-3] != shape_of(key)[-3]:
        raise node.error("grouped-query attention (enable_gqa with fewer key heads) is not "
                         "supported")
    rows, keys, depth = shape_of(query)[-2], shape_of(key)[-2], shape_of(query)[-1]
    scale = node.get("scale")
    scale = 1.0 / math.sqrt(depth) if scale is None else float(scale)
    bias: Expr = number(0, dtype)
    mask = node.optional_tensor("attn_mask")
    if mask is not None:
        bias = (op.where(mask, number(0, dtype), number(-np.inf, dtype))
                if tensor_type(mask).dtype == "bool" else as_dtype(mask, dtype))
    if node.get("is_causal", False):
        if mask is not None:
            raise node.error("attn_mask and is_causal=True together are an error in torch")
        allowed = np.tril(np.ones((rows, keys), dtype=bool))
        bias = Constant(np.where(allowed, 0, -np.inf).astype(dtype))
    ndim = len(shape_of(key))
    key_t = op.transpose(key, axes=[*range(ndim - 2), ndim - 1, ndim - 2])
    return op.nn.attention(query, key_t, value, bias, scale=scale)


# ---------------------------------------------------------------------------------------------
# dropout and resizing


@converter("aten.native_dropout.default")
def native_dropout(node: AtenNode) -> tuple[Expr, Unavailable]:
    if node.get("train", False):
        raise node.error(f"dropout in training mode {_TRAINING}")
    return node.tensor("input"), Unavailable(f"dropout's mask {_TRAINING}")


@converter("aten.dropout.default")
def dropout(node: AtenNode) -> Expr:
    if node.get("train", False):
        raise node.error(f"dropout in training mode {_TRAINING}")
    return node.tensor("input")


def _resize(node: AtenNode, method: str, mode: str) -> Expr:
    x = node.tensor("input" if "input" in node.values else "self")
    height, width = shape_of(x)[-2:]
    size = node.values.get("output_size")
    if size is None:
        factors = node.values.get("scale_factors") or [node.get("scales_h"),
                                                       node.get("scales_w")]
        if any(f is None for f in factors):
            raise node.error("needs output_size or scale factors")
        size = [int(math.floor(height * factors[0])), int(math.floor(width * factors[-1]))]
    kwargs = {"rounding_method": "floor"} if method == "nearest_neighbor" else {}
    return op.image.resize2d(x, size=[int(s) for s in size], method=method,
                             coordinate_transformation_mode=mode, **kwargs)


@converter("aten.upsample_nearest2d.vec", "aten.upsample_nearest2d.default")
def upsample_nearest2d(node: AtenNode) -> Expr:
    return _resize(node, "nearest_neighbor", "asymmetric")


@converter("aten.upsample_bilinear2d.vec", "aten.upsample_bilinear2d.default")
def upsample_bilinear2d(node: AtenNode) -> Expr:
    mode = "align_corners" if node.get("align_corners", False) else "half_pixel"
    return _resize(node, "linear", mode)


# ---------------------------------------------------------------------------------------------
# PyTorch's fused inference fast paths: nn.TransformerEncoderLayer and nn.MultiheadAttention
# call these under no_grad / inference_mode, so dynamo's graphs hold them whole.


def _linear(x: Expr, weight: Expr, bias: Expr) -> Expr:
    return op.nn.dense(x, weight) + bias


def _fast_path_bias(node: AtenNode, dtype: str, batch: int, keys: int) -> Expr:
    """The fast paths' mask as an additive bias: True (or a float) marks what to leave out;
    mask_type 1 is a (batch, keys) padding mask, 0 and 2 broadcast to the scores."""
    mask = node.optional_tensor("mask")
    if mask is None:
        return number(0, dtype)
    bias = (op.where(mask, number(-np.inf, dtype), number(0, dtype))
            if tensor_type(mask).dtype == "bool" else as_dtype(mask, dtype))
    if node.get("mask_type") == 1:
        if shape_of(mask) != (batch, keys):
            raise node.error(f"a padding mask must be (batch, keys) = {(batch, keys)}, got "
                             f"{shape_of(mask)}")
        bias = op.reshape(bias, newshape=[batch, 1, 1, keys])
    return bias


def _heads(x: Expr, heads: int) -> Expr:
    """(B, L, E) -> (B, heads, L, E / heads)."""
    batch, length, width = shape_of(x)
    split = op.reshape(x, newshape=[batch, length, heads, width // heads])
    return op.transpose(split, axes=[0, 2, 1, 3])


def _multi_head(node: AtenNode, query: Expr, key: Expr, value: Expr, heads: int) -> Expr:
    """Self- or cross-attention with the packed in-projection (3E, E) and out-projection."""
    weight, bias = node.tensor("qkv_weight"), node.tensor("qkv_bias")
    batch, length, width = shape_of(query)
    if width % heads:
        raise node.error(f"embed_dim {width} does not split into {heads} heads")
    parts = [op.strided_slice(w, begin=[i * width], end=[(i + 1) * width], axes=[0])
             for w in (weight, bias) for i in range(3)]
    q, k, v = (_heads(_linear(x, parts[i], parts[3 + i]), heads)
               for i, x in enumerate((query, key, value)))
    keys = shape_of(key)[1]
    scores_bias = _fast_path_bias(node, tensor_type(query).dtype, batch, keys)
    attended = op.nn.attention(q, op.transpose(k, axes=[0, 1, 3, 2]), v, scores_bias,
                               scale=1.0 / math.sqrt(width // heads))
    merged = op.reshape(op.transpose(attended, axes=[0, 2, 1, 3]),
                        newshape=[batch, length, width])
    return _linear(merged, node.tensor("proj_weight"), node.tensor("proj_bias"))


@converter("aten._native_multi_head_attention.default")
def native_multi_head_attention(node: AtenNode) -> tuple[Expr, Expr | Unavailable]:
    query, key, value = node.tensor("query"), node.tensor("key"), node.tensor("value")
    if any(len(shape_of(t)) != 3 for t in (query, key, value)):
        raise node.error("needs batched (B, L, E) query, key and value")
    out = _multi_head(node, query, key, value, int(node.get("num_head")))
    weights = Unavailable("the fast path's attention weights are not computed by opfusion "
                          "(pass need_weights=False)")
    return out, weights


@converter("aten._transformer_encoder_layer_fwd.default")
def transformer_encoder_layer(node: AtenNode) -> Expr:
    """``nn.TransformerEncoderLayer``'s fused forward: attention and feed-forward blocks with
    residuals and layer norms, before (norm_first) or after each block."""
    x = node.tensor("src")
    if len(shape_of(x)) != 3:
        raise node.error(f"needs a batched (B, L, E) source, got {shape_of(x)}")
    heads, eps = int(node.get("num_heads")), float(node.get("eps"))
    activation = gelu if node.get("use_gelu") else op.nn.relu

    def norm(h: Expr, index: int) -> Expr:
        return op.nn.layer_norm(h, node.tensor(f"norm_weight_{index}"),
                                node.tensor(f"norm_bias_{index}"), axis=-1, epsilon=eps)

    def attention(h: Expr) -> Expr:
        return _multi_head(node, h, h, h, heads)

    def feed_forward(h: Expr) -> Expr:
        hidden = activation(_linear(h, node.tensor("ffn_weight_1"), node.tensor("ffn_bias_1")))
        return _linear(hidden, node.tensor("ffn_weight_2"), node.tensor("ffn_bias_2"))

    if node.get("norm_first"):
        x = x + attention(norm(x, 1))
        return x + feed_forward(norm(x, 2))
    x = norm(x + attention(x), 1)
    return norm(x + feed_forward(x), 2)
