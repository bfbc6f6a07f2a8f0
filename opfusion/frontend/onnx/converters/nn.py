"""Converters of ONNX's neural-network operators: convolution and pooling, matrix products,
einsum and dropout. Normalization is in :mod:`.normalization`, the activations and the softmax
family in :mod:`.activation`; both are imported here so that importing this family registers
it all.

The IR's convolution and pooling are 2-D NCHW: a 1-D ONNX node runs as a 2-D one over a unit
height axis; a 3-D Conv is a sum of 2-D ones over the kernel's depth, a 3-D MaxPool or
AveragePool a 2-D pool of each depth plane followed by one over the depth (both separable);
a 3-D ConvTranspose is refused by name."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from .... import op
from ....ir.expr import Constant, Expr
from ....opdefs._nn_common import window_output_size
from ....opdefs.einsum import parse_equation
from ..registry import OnnxNode, converter
from . import activation  # noqa: F401  (registers the activation and softmax converters)
from ._common import filled
from ._common import shape_of as _shape
from ._common import tensor_type as _type
from .elementwise import scalar
from .normalization import abs_power, root

# ---------------------------------------------------------------------------------------------
# helpers




def _spatial_rank(node: OnnxNode, data: Expr, what: str, most: int = 3) -> int:
    """Number of spatial axes of NC... data: 1 to ``most`` are supported."""
    rank = len(_shape(data)) - 2
    if rank == 3 and most < 3:
        raise node.error(f"3-D {what} is not supported (opfusion has 2-D operators only); "
                         f"data {_shape(data)}")
    if not 1 <= rank <= most:
        raise node.error(f"{what} needs data of shape (N, C, W), (N, C, H, W) or (N, C, D, H, "
                         f"W), got {_shape(data)}")
    return rank


def _ints(node: OnnxNode, name: str, rank: int, default: int, least: int = 1) -> list[int]:
    """A per-spatial-axis attribute (strides, dilations, ...), checked for its length and
    for values of at least ``least`` (1 for strides and dilations: the window arithmetic
    divides by them, and the IR's operators would refuse them later anyway)."""
    values = node.attr(name)
    if values is None:
        return [default] * rank
    if len(values) != rank:
        raise node.error(f"attribute {name}={values} needs {rank} value(s), one per spatial "
                         "axis")
    if min(values) < least:
        raise node.error(f"attribute {name}={list(values)} must hold values >= {least}")
    return list(values)


def _kernel(node: OnnxNode, kernel: Sequence[int], what: str) -> list[int]:
    """A window's kernel shape, every extent at least 1: an empty (0 or negative) window has
    no output value to compute."""
    if min(kernel, default=1) < 1:
        raise node.error(f"{what} must be positive in every spatial axis, got {list(kernel)}; "
                         "an empty window has nothing to compute")
    return list(kernel)


def _lp_order(node: OnnxNode) -> float:
    """LpPool's and GlobalLpPool's p, which must be positive (p <= 0 is no norm: 1/p is
    undefined at 0 and negative p is not a norm)."""
    p = node.attr("p", 2)
    if not p >= 1:
        raise node.error(f"attribute p={p} must be a positive integer (the order of the norm)")
    return float(p)


_AUTO_PAD = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def _auto_pad(node: OnnxNode) -> str:
    mode = node.attr("auto_pad") or "NOTSET"  # some exporters write an empty string
    if mode not in _AUTO_PAD:
        raise node.error(f"attribute auto_pad={mode!r} is not one of {', '.join(_AUTO_PAD)}; "
                         "fix the attribute (explicit pads are the portable choice)")
    return mode


def _split(total: int, upper: bool) -> tuple[int, int]:
    """(before, after) of a total padding; the odd one goes after when ``upper``."""
    half = total // 2
    return (half, total - half) if upper else (total - half, half)


def _window_pads(node: OnnxNode, sizes: Sequence[int], kernel: Sequence[int],
                 strides: Sequence[int], dilations: Sequence[int]) -> list[tuple[int, int]]:
    """(before, after) padding per spatial axis of Conv and the pools, from auto_pad/pads."""
    mode, rank = _auto_pad(node), len(sizes)
    if mode == "VALID":
        return [(0, 0)] * rank
    if mode == "NOTSET":
        pads = node.attr("pads") or [0] * (2 * rank)
        if len(pads) != 2 * rank or min(pads) < 0:
            raise node.error(f"attribute pads={pads} needs {2 * rank} non-negative values "
                             "(all begins, then all ends)")
        return [(pads[i], pads[i + rank]) for i in range(rank)]
    # SAME_*: the output is ceil(size / stride) long, padded evenly, the odd one after (UPPER)
    # or before (LOWER).
    result = []
    for size, k, s, d in zip(sizes, kernel, strides, dilations):
        total = max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
        result.append(_split(total, mode == "SAME_UPPER"))
    return result


def _planar(values: Sequence, one: object, rank: int) -> list:
    """A per-spatial-axis list in 2-D form: a 1-D node gets the unit height axis first."""
    return [one, *values] if rank == 1 else list(values)


def _to_2d(data: Expr, rank: int) -> Expr:
    return op.expand_dims(data, axis=2) if rank == 1 else data


def _from_2d(data: Expr, rank: int) -> Expr:
    return op.squeeze(data, axis=[2]) if rank == 1 else data


def _window_attrs(strides: Sequence[int], dilations: Sequence[int],
                  pads: Sequence[tuple[int, int]], rank: int) -> dict[str, object]:
    """strides, dilation and (top, left, bottom, right) padding of the 2-D operator."""
    (top, bottom), (left, right) = _planar(pads, (0, 0), rank)
    return {"strides": _planar(strides, 1, rank), "dilation": _planar(dilations, 1, rank),
            "padding": (top, left, bottom, right)}


# ---------------------------------------------------------------------------------------------
# convolution


def _conv_geometry(node: OnnxNode, data: Expr, weight: Expr,
                   most: int = 3) -> tuple[int, tuple[int, ...]]:
    rank = _spatial_rank(node, data, "convolution" if most == 3 else "ConvTranspose", most)
    wshape = _shape(weight)
    if len(wshape) != rank + 2:
        kernel_axes = ", ".join(("kD", "kH", "kW")[-rank:])
        raise node.error(f"weight {wshape} must have the data's rank {rank + 2}: "
                         f"(M, C/group, {kernel_axes}) (ConvTranspose: (C, M/group, ...))")
    kernel = wshape[2:]
    declared = node.attr("kernel_shape")
    if declared is not None:
        _kernel(node, declared, "attribute kernel_shape")
        if tuple(declared) != kernel:
            raise node.error(f"attribute kernel_shape={declared} does not match weight "
                             f"{wshape}; fix the attribute or the weight")
    _kernel(node, kernel, f"the kernel extents of weight {wshape}")
    return rank, kernel


def _with_bias(node: OnnxNode, out: Expr, index: int) -> Expr:
    bias = node.optional_input(index)
    return out if bias is None else op.nn.bias_add(out, bias, axis=1)


@converter("Conv")
def conv(node: OnnxNode) -> Expr:
    data, weight = node.input(0), node.input(1)
    rank, kernel = _conv_geometry(node, data, weight)
    strides, dilations = _ints(node, "strides", rank, 1), _ints(node, "dilations", rank, 1)
    pads = _window_pads(node, _shape(data)[2:], kernel, strides, dilations)
    group = node.attr("group", 1)
    if rank == 3:
        out = _conv3d(node, data, weight, strides, dilations, pads, group)
    else:
        out = op.nn.conv2d(_to_2d(data, rank), _to_2d(weight, rank), groups=group,
                           **_window_attrs(strides, dilations, pads, rank))
    return _from_2d(_with_bias(node, out, 2), rank)


def _conv3d(node: OnnxNode, data: Expr, weight: Expr, strides: list[int], dilations: list[int],
            pads: list[tuple[int, int]], groups: int) -> Expr:
    """A 3-D convolution as a sum, over the kernel's depth taps, of 2-D convolutions of the
    input planes each output depth reads (output depths folded into the batch)."""
    batch, channels, depth, height, width = _shape(data)
    out_channels, _, taps = _shape(weight)[:3]
    (before, after), step, spacing = pads[0], strides[0], dilations[0]
    out_depth = (depth + before + after - spacing * (taps - 1) - 1) // step + 1
    if out_depth <= 0:
        raise node.error(f"the (dilated) kernel depth {spacing * (taps - 1) + 1} exceeds the "
                         f"padded data depth {depth + before + after}")
    planes = op.transpose(data, axes=[0, 2, 1, 3, 4])  # N, D, C, H, W
    if before or after:
        planes = op.nn.pad(planes, scalar(0, planes), pad_width=[0, 0, before, after] + [0] * 6)
    total: Expr | None = None
    for tap in range(taps):
        start = tap * spacing
        read = op.strided_slice(planes, begin=[start], end=[start + (out_depth - 1) * step + 1],
                                strides=[step], axes=[1])
        read = op.reshape(read, newshape=[batch * out_depth, channels, height, width])
        kernel = op.squeeze(op.strided_slice(weight, begin=[tap], end=[tap + 1], axes=[2]),
                            axis=[2])
        out = op.nn.conv2d(read, kernel, groups=groups,
                           **_window_attrs(strides[1:], dilations[1:], pads[1:], 2))
        total = out if total is None else total + out
    assert total is not None
    out_h, out_w = _shape(total)[2:]
    total = op.reshape(total, newshape=[batch, out_depth, out_channels, out_h, out_w])
    return op.transpose(total, axes=[0, 2, 1, 3, 4])


@converter("ConvTranspose")
def conv_transpose(node: OnnxNode) -> Expr:
    data, weight = node.input(0), node.input(1)
    rank, kernel = _conv_geometry(node, data, weight)
    strides, dilations = _ints(node, "strides", rank, 1), _ints(node, "dilations", rank, 1)
    extra = _ints(node, "output_padding", rank, 0, least=0)
    sizes = _shape(data)[2:]
    full = [(n - 1) * s + (k - 1) * d + 1 + e
            for n, k, s, d, e in zip(sizes, kernel, strides, dilations, extra)]
    mode = _auto_pad(node)
    output_shape = node.attr("output_shape")
    if output_shape is None and mode in ("SAME_UPPER", "SAME_LOWER"):
        output_shape = [n * s for n, s in zip(sizes, strides)]
    if output_shape is not None:
        # The spec: pads follow from the requested size; the odd one goes before unless
        # SAME_UPPER. A negative total (a larger output) extends the result with zeros.
        pads = [_split(f - o, mode == "SAME_UPPER")
                for f, o in zip(full, list(output_shape)[-rank:])]
    elif mode == "VALID":
        pads = [(0, 0)] * rank
    else:
        pads = _window_pads(node, sizes, kernel, strides, dilations)
    # (before, after) crops of the full result without output_padding.
    crops = [(before, after - e) for (before, after), e in zip(pads, extra)]
    if rank == 3:
        if not all(b >= 0 and a >= 0 and e < s for (b, a), e, s in zip(pads, extra, strides)):
            raise node.error("3-D ConvTranspose with an output larger than its full result "
                             "(negative pads, or output_padding >= stride) is not supported")
        return _with_bias(node, _conv_transpose_columns(node, data, weight, kernel, strides,
                                                        dilations, pads, extra), 2)
    data, weight, group = _to_2d(data, rank), _to_2d(weight, rank), node.attr("group", 1)
    if all(b >= 0 and a + e >= 0 and (e == 0 or e < max(s, d))
           for (b, a), e, s, d in zip(crops, extra, strides, dilations)):
        # The usual case: one conv2d_transpose does it all.
        out = op.nn.conv2d_transpose(data, weight, groups=group,
                                     output_padding=_planar(extra, 0, rank),
                                     **_window_attrs(strides, dilations, pads, rank))
    else:  # crop what can be cropped, then pad with zeros where the output is larger
        cropped = [(max(b, 0), max(a, 0)) for b, a in crops]
        out = op.nn.conv2d_transpose(data, weight, groups=group,
                                     **_window_attrs(strides, dilations, cropped, rank))
        grown = _planar([(max(-b, 0), max(-a, 0)) for b, a in crops], (0, 0), rank)
        out = op.nn.pad(out, scalar(0, out),
                        pad_width=[0, 0, 0, 0] + [w for pair in grown for w in pair])
    return _from_2d(_with_bias(node, out, 2), rank)


def _conv_transpose_columns(node: OnnxNode, data: Expr, weight: Expr, kernel: list[int],
                            strides: list[int], dilations: list[int],
                            pads: list[tuple[int, int]], extra: list[int]) -> Expr:
    """An N-D transposed convolution as a product and Col2Im: each group's weight^T times
    its input columns gives every kernel tap's contribution per input position; Col2Im sums
    the taps into the output (strides, dilations, and pads cropped)."""
    batch, channels, *sizes = _shape(data)
    group = int(node.attr("group", 1))
    out_channels = _shape(weight)[1] * group
    taps, positions = int(np.prod(kernel)), int(np.prod(sizes))
    per_in, per_out = channels // group, out_channels // group
    columns = op.nn.matmul(
        op.transpose(op.reshape(weight, newshape=[group, per_in, per_out * taps]),
                     axes=[0, 2, 1]),
        op.reshape(data, newshape=[batch, group, per_in, positions]))
    full = [(n - 1) * s + (k - 1) * d + 1 + e
            for n, k, s, d, e in zip(sizes, kernel, strides, dilations, extra)]
    image = [f - b - a for f, (b, a) in zip(full, pads)]
    return op.col2im(op.reshape(columns, newshape=[batch, out_channels * taps, positions]),
                     image_shape=image, block_shape=kernel, strides=strides,
                     pads=[b for b, _ in pads] + [a for _, a in pads], dilations=dilations)


# ---------------------------------------------------------------------------------------------
# pooling


class _PoolGeometry:
    """A pool's window over its 1 to 3 spatial axes, read from the node's attributes."""

    def __init__(self, node: OnnxNode, data: Expr) -> None:
        rank = self.rank = _spatial_rank(node, data, "pooling")
        kernel = node.attr("kernel_shape")
        if kernel is None or len(kernel) != rank:
            raise node.error(f"attribute kernel_shape={kernel} needs {rank} value(s), one per "
                             "spatial axis")
        self.kernel = _kernel(node, kernel, "attribute kernel_shape")
        self.strides = _ints(node, "strides", rank, 1)
        self.dilations = _ints(node, "dilations", rank, 1)
        self.pads = _window_pads(node, _shape(data)[2:], kernel, self.strides, self.dilations)
        # With auto_pad the output size is fixed (ceil(size / stride), or the VALID fit);
        # ceil_mode only matters for explicit pads.
        self.ceil_mode = bool(node.attr("ceil_mode", 0)) and _auto_pad(node) == "NOTSET"

    def attrs(self) -> dict[str, object]:
        """pool_size, strides, dilation and padding of the 2-D operator."""
        return {"pool_size": _planar(self.kernel, 1, self.rank),
                **_window_attrs(self.strides, self.dilations, self.pads, self.rank)}


def _pool(node: OnnxNode, build: Callable[..., Expr], **extra_attrs: object) -> Expr:
    data = node.input(0)
    window = _PoolGeometry(node, data)
    if window.rank == 3:
        return _pool3d(data, window, build, ceil_mode=window.ceil_mode, **extra_attrs)
    out = build(_to_2d(data, window.rank), ceil_mode=window.ceil_mode, **window.attrs(),
                **extra_attrs)
    return _from_2d(out, window.rank)


def _pool3d(data: Expr, window: _PoolGeometry, build: Callable[..., Expr],
            **common: object) -> Expr:
    """Max and average pooling are separable: pool every depth plane over (H, W), then the
    result over the depth, as a (depth, 1) window over (D, H * W). Averages stay exact, since
    the divisor is the product of the taps counted along each axis."""
    batch, channels, depth, height, width = _shape(data)
    planes = build(op.reshape(data, newshape=[batch, channels * depth, height, width]),
                   pool_size=window.kernel[1:], **common,
                   **_window_attrs(window.strides[1:], window.dilations[1:], window.pads[1:], 2))
    out_h, out_w = _shape(planes)[2:]
    (before, after) = window.pads[0]
    deep = build(op.reshape(planes, newshape=[batch, channels, depth, out_h * out_w]),
                 pool_size=[window.kernel[0], 1], strides=[window.strides[0], 1],
                 dilation=[window.dilations[0], 1], padding=(before, 0, after, 0), **common)
    return op.reshape(deep, newshape=[batch, channels, _shape(deep)[2], out_h, out_w])


@converter("MaxPool")
def max_pool(node: OnnxNode) -> Expr | list[Expr]:
    values = _pool(node, op.nn.max_pool2d)
    if node.num_outputs < 2:
        return values
    # Indices: where each window's maximum lies in the whole input. A 1-D pool is a 2-D one
    # over a unit height axis, whose flat indices are the same.
    data = node.input(0)
    window = _PoolGeometry(node, data)
    if window.rank == 3:
        raise node.error("the Indices output is supported for 1-D and 2-D pooling only")
    indices = op.nn.max_pool_indices(_to_2d(data, window.rank),
                                     out_size=_planar(_shape(values)[2:], 1, window.rank),
                                     storage_order=int(node.attr("storage_order", 0)),
                                     **window.attrs())
    return [values, _from_2d(indices, window.rank)]


@converter("AveragePool")
def avg_pool(node: OnnxNode) -> Expr:
    return _pool(node, op.nn.avg_pool2d,
                 count_include_pad=bool(node.attr("count_include_pad", 0)))


@converter("LpPool")
def lp_pool(node: OnnxNode) -> Expr:
    # sum |x|^p over each window as a depthwise convolution with a kernel of ones (padding
    # counts as zero), then the p-th root.
    data = node.input(0)
    window = _PoolGeometry(node, data)
    if window.ceil_mode:  # the last, partial windows read zeros past the end padding
        grown = []
        for size, k, s, d, (before, after) in zip(_shape(data)[2:], window.kernel,
                                                  window.strides, window.dilations, window.pads):
            out = window_output_size(size, k, s, d, before, after, ceil_mode=True)
            reach = (out - 1) * s + d * (k - 1) + 1
            grown.append((before, max(after, reach - size - before)))
        window.pads = grown
    p = _lp_order(node)
    channels = _shape(data)[1]
    ones = Constant(np.ones((channels, 1, *window.kernel), dtype=_type(data).dtype))
    if window.rank == 3:
        sums = _conv3d(node, abs_power(data, p), ones, window.strides, window.dilations,
                       window.pads, channels)
    else:
        attrs = window.attrs()
        del attrs["pool_size"]
        sums = _from_2d(op.nn.conv2d(abs_power(_to_2d(data, window.rank), p),
                                     _to_2d(ones, window.rank), groups=channels, **attrs),
                        window.rank)
    return root(sums, p)


def _global(node: OnnxNode, pooled: Callable[..., Expr], reduce: Callable[..., Expr]) -> Expr:
    data = node.input(0)
    ndim = len(_shape(data))
    if ndim < 3:
        raise node.error(f"needs data of shape (N, C, spatial...), got {_shape(data)}")
    if ndim == 4:
        return pooled(data)
    return reduce(data, axis=list(range(2, ndim)), keepdims=True)


@converter("GlobalAveragePool")
def global_avg_pool(node: OnnxNode) -> Expr:
    return _global(node, op.nn.global_avg_pool2d, op.mean)


@converter("GlobalMaxPool")
def global_max_pool(node: OnnxNode) -> Expr:
    return _global(node, op.nn.global_max_pool2d, op.max)


@converter("GlobalLpPool")
def global_lp_pool(node: OnnxNode) -> Expr:
    data = node.input(0)
    p = _lp_order(node)
    axes = list(range(2, len(_shape(data))))
    return root(op.sum(abs_power(data, p), axis=axes, keepdims=True), p)


# ---------------------------------------------------------------------------------------------
# matrix products


@converter("MatMul")
def matmul(node: OnnxNode) -> Expr:
    return op.nn.matmul(node.input(0), node.input(1))


@converter("Gemm")
def gemm(node: OnnxNode) -> Expr:
    a, b, c = node.input(0), node.input(1), node.optional_input(2)
    for name, value in (("A", a), ("B", b)):
        if len(_shape(value)) != 2:
            raise node.error(f"input {name} must be 2-D, got {_shape(value)}")
    alpha, beta = node.attr("alpha", 1.0), node.attr("beta", 1.0)
    if node.attr("transA", 0):
        a = op.transpose(a, axes=[1, 0])
    if alpha != 1.0 and isinstance(b, Constant):  # fold alpha into the weight
        b, alpha = Constant((b.data * alpha).astype(b.data.dtype)), 1.0
    if node.attr("transB", 0):
        out = op.nn.dense(a, b)
    elif isinstance(b, Constant):
        out = op.nn.dense(a, op.transpose(b, axes=[1, 0]))  # a weight: transposed at import
    else:
        out = op.nn.matmul(a, b)
    if alpha != 1.0:
        out = out * alpha
    if c is not None and beta != 0.0:
        out = out + (c * beta if beta != 1.0 else c)
    return out


@converter("Einsum", since=12)
def einsum(node: OnnxNode) -> Expr:
    """A product of two operands (``"bhid,bhjd->bhij"``) as ``nn.matmul`` between transposes
    (:func:`_einsum_as_matmul`); any other equation as ``einsum``."""
    equation = node.attr("equation")
    if not equation:
        raise node.error("attribute equation is required")
    operands = [node.input(i) for i in range(len(node.inputs))]
    if len(operands) == 2:
        product = _einsum_as_matmul(operands[0], operands[1], equation)
        if product is not None:
            return product
    return op.einsum(operands, equation=equation)


def _einsum_as_matmul(a: Expr, b: Expr, equation: str) -> Expr | None:
    """``einsum(a, b)`` as ``transpose(matmul(transpose(a), transpose(b)))`` (identity
    transposes left out) where the equation is a batch of matrix products: every letter of
    ``a`` and ``b`` is in the output or in both (the contraction), one letter each is the
    rows (``a`` and the output only), the columns (``b`` and the output only) and the
    contraction, and the rest are batch letters of equal extents in both; float operands of
    one dtype. None otherwise. MaxViT writes its attention this way
    (``torch.einsum("B G H I D, B G H J D -> B G H I J", q, k)``): as einsum each product
    was a reduction kernel at 7 GFLOP/s, as a product it is a packed one, and the chain is
    an attention that FuseAttention recognizes."""
    try:
        (ta, tb), out = parse_equation(equation)
    except ValueError:
        return None  # the einsum op reports it, naming the equation
    # (parse_equation writes "..." as "."; such broadcast axes stay einsum's)
    a_type, b_type = _type(a), _type(b)
    if ("." in ta + tb or len(set(ta)) != len(ta) or len(set(tb)) != len(tb)
            or a_type.dtype != b_type.dtype or a_type.dtype not in ("float32", "float64")
            or len(ta) != len(a_type.shape) or len(tb) != len(b_type.shape)):
        return None
    rows = [c for c in out if c in ta and c not in tb]
    cols = [c for c in out if c in tb and c not in ta]
    depth = [c for c in ta if c in tb and c not in out]
    batch = [c for c in out if c in ta and c in tb]
    if (len(rows) != 1 or len(cols) != 1 or len(depth) != 1
            or len(batch) + 2 != len(out) or len(ta) != len(batch) + 2
            or len(tb) != len(batch) + 2):
        return None
    extent = {c: a_type.shape[i] for i, c in enumerate(ta)}
    if any(b_type.shape[i] != extent.get(c, b_type.shape[i]) for i, c in enumerate(tb)):
        return None  # a batch or contraction extent that broadcasts: einsum's own rules

    def arranged(x: Expr, term: str, order: list[str]) -> Expr:
        axes = [term.index(c) for c in order]
        return x if axes == sorted(axes) else op.transpose(x, axes=axes)

    product = op.nn.matmul(arranged(a, ta, [*batch, *rows, *depth]),
                           arranged(b, tb, [*batch, *depth, *cols]))
    return arranged(product, "".join([*batch, *rows, *cols]), list(out))


# ---------------------------------------------------------------------------------------------
# dropout: the identity at inference; the mask, if asked for, keeps everything


def _dropout(node: OnnxNode, mask_dtype: object) -> Expr | list[Expr]:
    data = node.input(0)
    if node.num_outputs == 1:
        return data
    return [data, filled(_shape(data), 1, str(np.dtype(mask_dtype)), what="the mask")]


@converter("Dropout")
def dropout(node: OnnxNode) -> Expr | list[Expr]:
    # Opsets 7-9 type the mask like the data; 10 made it bool.
    return _dropout(node, _type(node.input(0)).dtype if node.opset < 10 else np.bool_)


@converter("Dropout", since=12)
def dropout_12(node: OnnxNode) -> Expr | list[Expr]:
    training = node.const_input(2, "training_mode")
    if training is not None and bool(training):
        ratio = node.const_input(1, "ratio")
        if ratio is None or float(ratio) != 0.0:
            raise node.error("training_mode=true drops values at random; opfusion imports "
                             "inference graphs: export the model in eval mode")
    return _dropout(node, np.bool_)
