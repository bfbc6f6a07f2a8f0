"""nn.* operator declarations: type inference, error messages, and references checked against
independent computations (direct loops written here, and ONNX's reference evaluator)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import opfusion as opf
from opfusion.ir import infer_type
from opfusion.testing import assert_close, eval_op, run_onnx_node

nn = opf.op.nn


def randn(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def infer(builder, *args, **attrs) -> opf.TensorType:
    """Inferred type of ``builder`` over variables; each arg is a shape (float32) or a
    (shape, dtype) pair."""
    params = []
    for index, arg in enumerate(args):
        typed = bool(arg) and isinstance(arg[0], tuple)  # ((shape), dtype) vs (shape)
        shape, dtype = arg if typed else (arg, "float32")
        params.append(opf.var(f"x{index}", shape, dtype))
    return infer_type(builder(*params, **attrs))


def run_onnx(op_type: str, inputs: list[np.ndarray], opset: int = 19, **attrs) -> np.ndarray:
    """Run a one-node ONNX model through onnx.reference.ReferenceEvaluator."""
    pytest.importorskip("onnx")
    return run_onnx_node(op_type, {f"in{i}": a for i, a in enumerate(inputs)}, opset=opset,
                         **attrs)[0]


# ---------------------------------------------------------------------------------------------
# direct-loop implementations: the definitions, written independently of the declarations


def conv2d_loop(x, w, strides=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1):
    n_batch, channels, height, width = x.shape
    out_channels, per_group, kh, kw = w.shape
    top, left, bottom, right = padding
    xp = np.zeros((n_batch, channels, height + top + bottom, width + left + right))
    xp[:, :, top:top + height, left:left + width] = x
    out_h = (xp.shape[2] - dilation[0] * (kh - 1) - 1) // strides[0] + 1
    out_w = (xp.shape[3] - dilation[1] * (kw - 1) - 1) // strides[1] + 1
    out = np.zeros((n_batch, out_channels, out_h, out_w))
    per_group_out = out_channels // groups
    for n in range(n_batch):
        for o in range(out_channels):
            g = o // per_group_out
            for i in range(out_h):
                for j in range(out_w):
                    acc = 0.0
                    for c in range(per_group):
                        for p in range(kh):
                            for q in range(kw):
                                acc += (xp[n, g * per_group + c, i * strides[0] + p * dilation[0],
                                           j * strides[1] + q * dilation[1]] * w[o, c, p, q])
                    out[n, o, i, j] = acc
    return out


def conv2d_transpose_loop(x, w, strides=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1),
                          groups=1, output_padding=(0, 0)):
    # Scatter form: every input pixel adds input * kernel into the output it touches.
    n_batch, channels, height, width = x.shape
    _, per_group_out, kh, kw = w.shape
    per_group_in = channels // groups
    full_h = (height - 1) * strides[0] + dilation[0] * (kh - 1) + 1 + output_padding[0]
    full_w = (width - 1) * strides[1] + dilation[1] * (kw - 1) + 1 + output_padding[1]
    full = np.zeros((n_batch, groups * per_group_out, full_h, full_w))
    for n in range(n_batch):
        for c in range(channels):
            g = c // per_group_in
            for h in range(height):
                for v in range(width):
                    for o in range(per_group_out):
                        for p in range(kh):
                            for q in range(kw):
                                row = h * strides[0] + p * dilation[0]
                                col = v * strides[1] + q * dilation[1]
                                full[n, g * per_group_out + o, row, col] += (
                                    x[n, c, h, v] * w[c, o, p, q])
    top, left, bottom, right = padding
    return full[:, :, top:full_h - bottom, left:full_w - right]


def pool_loop(x, kind, pool_size, strides=(1, 1), dilation=(1, 1), padding=(0, 0, 0, 0),
              ceil_mode=False, count_include_pad=False):
    n_batch, channels, height, width = x.shape
    top, left, bottom, right = padding
    out_hw = []
    for size, k, s, d, before, after in ((height, pool_size[0], strides[0], dilation[0], top,
                                          bottom),
                                         (width, pool_size[1], strides[1], dilation[1], left,
                                          right)):
        ratio = (size + before + after - d * (k - 1) - 1) / s
        out = math.ceil(ratio) + 1 if ceil_mode else math.floor(ratio) + 1
        if ceil_mode and (out - 1) * s >= size + before:
            out -= 1  # that window would start in the right padding
        out_hw.append(out)
    out = np.zeros((n_batch, channels, *out_hw))
    for n in range(n_batch):
        for c in range(channels):
            for i in range(out_hw[0]):
                for j in range(out_hw[1]):
                    values, padded_taps = [], 0
                    for p in range(pool_size[0]):
                        for q in range(pool_size[1]):
                            h = i * strides[0] - top + p * dilation[0]
                            v = j * strides[1] - left + q * dilation[1]
                            if 0 <= h < height and 0 <= v < width:
                                values.append(float(x[n, c, h, v]))
                            elif -top <= h < height + bottom and -left <= v < width + right:
                                padded_taps += 1
                    if kind == "max":
                        out[n, c, i, j] = max(values)
                    else:
                        count = len(values) + (padded_taps if count_include_pad else 0)
                        out[n, c, i, j] = sum(values) / count
    return out


# ---------------------------------------------------------------------------------------------
# convolution

CONV_CASES = [
    # data shape, weight shape, attrs
    ((2, 3, 7, 7), (4, 3, 3, 3), {}),
    ((1, 3, 10, 9), (4, 3, 3, 3), {"strides": 3, "padding": (1, 0, 2, 1)}),
    ((1, 2, 9, 9), (3, 2, 3, 2), {"dilation": 2, "padding": (2, 1)}),
    ((1, 4, 6, 6), (6, 2, 3, 3), {"groups": 2, "padding": 1}),
    ((1, 4, 7, 7), (4, 1, 3, 3), {"groups": 4, "strides": 2, "padding": 1}),
    ((1, 3, 5, 8), (2, 3, 1, 3), {"strides": (2, 1), "dilation": (1, 2)}),
]


def _conv_attrs(attrs):
    """The normalized strides/padding/dilation/groups of a case, for the loop and ONNX."""
    full = opf.op.get_op("nn.conv2d").make_attrs(attrs)
    return full.strides, full.padding, full.dilation, full.groups


@pytest.mark.parametrize("data_shape, weight_shape, attrs", CONV_CASES)
def test_conv2d_matches_direct_loop_and_onnx(data_shape, weight_shape, attrs):
    x, w = randn(*data_shape), randn(*weight_shape, seed=1)
    got = eval_op(nn.conv2d, x, w, **attrs)
    strides, padding, dilation, groups = _conv_attrs(attrs)
    want = conv2d_loop(x, w, strides, padding, dilation, groups).astype(np.float32)
    assert_close(got, want)
    onnx_out = run_onnx("Conv", [x, w], kernel_shape=list(weight_shape[2:]), strides=strides,
                        pads=padding, dilations=dilation, group=groups)
    assert_close(got, onnx_out, rtol=1e-5)


def test_conv2d_int8_with_out_dtype_is_exact():
    rng = np.random.default_rng(0)
    x = rng.integers(-128, 128, (1, 3, 6, 6), dtype=np.int8)
    w = rng.integers(-128, 128, (2, 3, 3, 3), dtype=np.int8)
    got = eval_op(nn.conv2d, x, w, padding=1, out_dtype="int32")
    want = conv2d_loop(x.astype(np.int64), w.astype(np.int64), padding=(1, 1, 1, 1))
    assert_close(got, want.astype(np.int32))


@pytest.mark.parametrize("data, weight, attrs, shape, dtype", [
    ((1, 3, 224, 224), (64, 3, 7, 7), {"strides": 2, "padding": 3}, (1, 64, 112, 112),
     "float32"),
    ((2, 32, 14, 14), (32, 1, 3, 3), {"groups": 32, "padding": (1, 1)}, (2, 32, 14, 14),
     "float32"),
    ((1, 8, 10, 10), (16, 4, 3, 3), {"groups": 2, "dilation": 2}, (1, 16, 6, 6), "float32"),
    ((1, 3, 10, 9), (4, 3, 3, 3), {"strides": 3, "padding": (1, 0, 2, 1)}, (1, 4, 4, 3),
     "float32"),
    (((1, 3, 8, 8), "float16"), ((4, 3, 3, 3), "float16"), {}, (1, 4, 6, 6), "float16"),
    (((1, 3, 8, 8), "int8"), ((4, 3, 1, 1), "int8"), {"out_dtype": "int32", "channels": 4,
                                                       "kernel_size": 1}, (1, 4, 8, 8), "int32"),
])
def test_conv2d_infers_shape_and_dtype(data, weight, attrs, shape, dtype):
    assert infer(nn.conv2d, data, weight, **attrs) == opf.TensorType(shape, dtype)


def test_conv2d_padding_normalizes_to_four_values():
    op = opf.op.get_op("nn.conv2d")
    assert op.make_attrs({}).padding == (0, 0, 0, 0)
    assert op.make_attrs({"padding": 2}).padding == (2, 2, 2, 2)
    assert op.make_attrs({"padding": (1, 2)}).padding == (1, 2, 1, 2)
    assert op.make_attrs({"padding": (1, 2, 3, 4)}).padding == (1, 2, 3, 4)
    assert op.attrs["padding"].always_print


@pytest.mark.parametrize("data, weight, attrs, error, match", [
    ((1, 6, 8, 8), (4, 4, 3, 3), {"groups": 2}, opf.OpfusionTypeError,
     r"nn\.conv2d: data \(1, 6, 8, 8\) has 6 input channels but weight .* takes 4 per group "
     r"x groups=2 = 8"),
    ((1, 4, 8, 8), (5, 2, 3, 3), {"groups": 2}, opf.OpfusionTypeError,
     r"nn\.conv2d: weight \(5, 2, 3, 3\) has 5 output channels, not divisible by groups=2"),
    ((1, 3, 2, 2), (4, 3, 3, 3), {}, opf.OpfusionTypeError,
     r"nn\.conv2d: output height would be 0"),
    ((1, 3, 8, 8), (4, 3, 3, 3), {"channels": 8}, opf.OpfusionTypeError,
     r"nn\.conv2d: attribute 'channels'=8 .* 4 output channels"),
    ((1, 3, 8, 8), (4, 3, 3, 3), {"kernel_size": 5}, opf.OpfusionTypeError,
     r"nn\.conv2d: attribute 'kernel_size'=\(5, 5\)"),
    ((3, 8, 8), (4, 3, 3, 3), {}, opf.OpfusionTypeError,
     r"nn\.conv2d: input 'data' must be 4-D \(N, C, H, W\), got shape \(3, 8, 8\)"),
    ((1, 3, 8, 8), ((4, 3, 3, 3), "float16"), {}, opf.OpfusionTypeError,
     r"nn\.conv2d: inputs must share one dtype"),
    ((1, 3, 8, 8), (4, 3, 3, 3), {"padding": (1, 2, 3)}, opf.OpAttributeError,
     r"nn\.conv2d attribute 'padding' takes 1, 2 or 4 values"),
    ((1, 3, 8, 8), (4, 3, 3, 3), {"padding": -1}, opf.OpAttributeError,
     r"nn\.conv2d attribute 'padding' must not be negative"),
    ((1, 3, 8, 8), (4, 3, 3, 3), {"strides": 0}, opf.OpAttributeError,
     r"nn\.conv2d attribute 'strides' must be positive"),
    ((1, 3, 8, 8), (4, 3, 3, 3), {"data_layout": "NHWC"}, opf.OpAttributeError,
     r"nn\.conv2d attribute 'data_layout' must be one of 'NCHW'"),
    ((1, 3, 8, 8), (4, 3, 0, 0), {}, opf.OpfusionTypeError,
     r"nn\.conv2d: weight \(4, 3, 0, 0\) has an empty kernel \(0, 0\)"),
])
def test_conv2d_errors_name_the_op_and_the_cause(data, weight, attrs, error, match):
    with pytest.raises(error, match=match):
        infer(nn.conv2d, data, weight, **attrs)


CONV_TRANSPOSE_CASES = [
    ((1, 4, 5, 5), (4, 3, 3, 3), {"strides": 2, "padding": 1, "output_padding": 1}),
    ((1, 4, 4, 5), (4, 2, 3, 2), {"groups": 2, "strides": (2, 3), "dilation": 2,
                                  "padding": (0, 1, 1, 0), "output_padding": (1, 0)}),
    ((2, 3, 4, 4), (3, 2, 2, 2), {}),
    ((1, 3, 3, 4), (3, 1, 3, 3), {"groups": 3, "strides": 3, "padding": (2, 0, 1, 1),
                                  "output_padding": (2, 1)}),
]


@pytest.mark.parametrize("data_shape, weight_shape, attrs", CONV_TRANSPOSE_CASES)
def test_conv2d_transpose_matches_direct_loop_and_onnx(data_shape, weight_shape, attrs):
    x, w = randn(*data_shape), randn(*weight_shape, seed=1)
    got = eval_op(nn.conv2d_transpose, x, w, **attrs)
    full = opf.op.get_op("nn.conv2d_transpose").make_attrs(attrs)
    want = conv2d_transpose_loop(x, w, full.strides, full.padding, full.dilation, full.groups,
                                 full.output_padding).astype(np.float32)
    assert_close(got, want)
    # onnx's reference ConvTranspose mis-assembles groups of more than one output channel
    # (onnx 1.23), so run it once per group and concatenate.
    per_group = data_shape[1] // full.groups
    onnx_out = np.concatenate([
        run_onnx("ConvTranspose", [x[:, g * per_group:(g + 1) * per_group],
                                   w[g * per_group:(g + 1) * per_group]],
                 kernel_shape=list(weight_shape[2:]), strides=full.strides, pads=full.padding,
                 dilations=full.dilation, output_padding=full.output_padding)
        for g in range(full.groups)], axis=1)
    assert_close(got, onnx_out, rtol=1e-5)


@pytest.mark.parametrize("data, weight, attrs, shape", [
    ((1, 4, 5, 5), (4, 3, 3, 3), {"strides": 2, "padding": 1, "output_padding": 1},
     (1, 3, 10, 10)),
    ((1, 4, 4, 5), (4, 2, 3, 2), {"groups": 2, "strides": (2, 3), "dilation": 2,
                                  "padding": (0, 1, 1, 0), "output_padding": (1, 0)},
     (1, 4, 11, 14)),
    ((2, 16, 7, 7), (16, 8, 4, 4), {"strides": 2, "padding": 1, "channels": 8},
     (2, 8, 14, 14)),
])
def test_conv2d_transpose_infers_shape(data, weight, attrs, shape):
    assert infer(nn.conv2d_transpose, data, weight, **attrs) == opf.TensorType(shape)


@pytest.mark.parametrize("data, weight, attrs, error, match", [
    ((1, 4, 5, 5), (3, 4, 3, 3), {}, opf.OpfusionTypeError,
     r"nn\.conv2d_transpose: data \(1, 4, 5, 5\) has 4 input channels but weight "
     r"\(3, 4, 3, 3\) \(IOHW\) expects 3"),
    ((1, 3, 5, 5), (3, 4, 3, 3), {"groups": 2}, opf.OpfusionTypeError,
     r"nn\.conv2d_transpose: .* 3 input channels, not divisible by groups=2"),
    ((1, 3, 1, 1), (3, 4, 1, 1), {"padding": (1, 0)}, opf.OpfusionTypeError,
     r"nn\.conv2d_transpose: output height would be -1"),
    ((1, 3, 5, 5), (3, 4, 3, 3), {"strides": 2, "output_padding": 2}, opf.OpAttributeError,
     r"nn\.conv2d_transpose attribute 'output_padding'=\(2, 2\) must be .* smaller than the "
     r"stride"),
    ((1, 3, 5, 5), (3, 4, 3, 0), {}, opf.OpfusionTypeError,
     r"nn\.conv2d_transpose: weight \(3, 4, 3, 0\) has an empty kernel"),
])
def test_conv2d_transpose_errors(data, weight, attrs, error, match):
    with pytest.raises(error, match=match):
        infer(nn.conv2d_transpose, data, weight, **attrs)


# ---------------------------------------------------------------------------------------------
# dense and matrix products


@pytest.mark.parametrize("data_shape", [(5, 8), (2, 3, 8), (8,)])
def test_dense_matches_einsum(data_shape):
    x, w = randn(*data_shape), randn(6, 8, seed=1)
    want = np.einsum("...k,nk->...n", x.astype(np.float64), w.astype(np.float64))
    assert_close(eval_op(nn.dense, x, w, units=6), want.astype(np.float32))


def test_dense_infers_shape_and_out_dtype():
    assert infer(nn.dense, (4, 3, 16), (10, 16)) == opf.TensorType((4, 3, 10))
    assert infer(nn.dense, ((2, 16), "int8"), ((10, 16), "int8"), out_dtype="int32") == \
        opf.TensorType((2, 10), "int32")


@pytest.mark.parametrize("data, weight, attrs, match", [
    ((2, 5), (3, 4), {}, r"nn\.dense: data \(2, 5\) has 5 features .* weight \(3, 4\) takes 4"),
    ((2, 4), (3, 4), {"units": 5}, r"nn\.dense: attribute 'units'=5 but weight \(3, 4\)"),
    ((2, 4), (3, 4, 1), {}, r"nn\.dense: input 'weight' must be 2-D"),
])
def test_dense_errors(data, weight, attrs, match):
    with pytest.raises(opf.OpfusionTypeError, match=match):
        infer(nn.dense, data, weight, **attrs)


MATMUL_CASES = [
    ((3, 4), (4, 5), {}),
    ((2, 1, 3, 4), (5, 4, 6), {}),
    ((4,), (4, 5), {}),
    ((2, 3, 4), (4,), {}),
    ((4,), (4,), {}),
    ((4, 3), (5, 4), {"transpose_a": True, "transpose_b": True}),
    ((2, 4, 3), (3, 4), {"transpose_a": True, "transpose_b": True}),
]


@pytest.mark.parametrize("a_shape, b_shape, attrs", MATMUL_CASES)
def test_matmul_matches_onnx_and_numpy(a_shape, b_shape, attrs):
    a, b = randn(*a_shape), randn(*b_shape, seed=1)
    got = eval_op(nn.matmul, a, b, **attrs)
    if attrs.get("transpose_a"):
        a = np.swapaxes(a, -1, -2)
    if attrs.get("transpose_b"):
        b = np.swapaxes(b, -1, -2)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(np.float32)
    assert_close(got, want)
    assert_close(got, run_onnx("MatMul", [np.ascontiguousarray(a), np.ascontiguousarray(b)]))


@pytest.mark.parametrize("a, b, attrs, shape", [
    ((2, 1, 3, 4), (5, 4, 6), {}, (2, 5, 3, 6)),
    ((4,), (4, 5), {}, (5,)),
    ((2, 3, 4), (4,), {}, (2, 3)),
    ((4,), (4,), {}, ()),
    ((7, 4, 3), (5, 4), {"transpose_a": True, "transpose_b": True}, (7, 3, 5)),
])
def test_matmul_infers_numpy_shapes(a, b, attrs, shape):
    assert infer(nn.matmul, a, b, **attrs) == opf.TensorType(shape)


@pytest.mark.parametrize("a, b, match", [
    ((3, 4), (5, 6), r"nn\.matmul: a \(3, 4\) .* contracts 4 values but b \(5, 6\) .* has 5"),
    ((2, 3, 4), (3, 4, 5), r"nn\.matmul: cannot broadcast a's batch axes \(2,\), b's batch "
                           r"axes \(3,\)"),
    ((), (3,), r"nn\.matmul: input 'a' is a scalar"),
])
def test_matmul_errors(a, b, match):
    with pytest.raises(opf.OpfusionTypeError, match=match):
        infer(nn.matmul, a, b)


@pytest.mark.parametrize("x_shape, y_shape, attrs", [
    ((3, 4, 5), (3, 6, 5), {}),
    ((1, 4, 5), (3, 6, 5), {}),
    ((3, 5, 4), (1, 5, 6), {"transpose_a": True, "transpose_b": False}),
])
def test_batch_matmul_matches_einsum(x_shape, y_shape, attrs):
    x, y = randn(*x_shape), randn(*y_shape, seed=1)
    xs = "bkm" if attrs.get("transpose_a") else "bmk"
    ys = "bnk" if attrs.get("transpose_b", True) else "bkn"
    want = np.einsum(f"{xs},{ys}->bmn", x.astype(np.float64), y.astype(np.float64))
    assert_close(eval_op(nn.batch_matmul, x, y, **attrs), want.astype(np.float32))


def test_batch_matmul_infers_shape():
    assert infer(nn.batch_matmul, (1, 4, 5), (3, 6, 5)) == opf.TensorType((3, 4, 6))
    assert infer(nn.batch_matmul, (3, 5, 4), (3, 5, 6), transpose_a=True,
                 transpose_b=False) == opf.TensorType((3, 4, 6))


@pytest.mark.parametrize("x, y, match", [
    ((3, 4, 5), (3, 6, 4), r"nn\.batch_matmul: x \(3, 4, 5\) .* contracts 5 values but y "
                           r"\(3, 6, 4\) .* has 4"),
    ((2, 4, 5), (3, 6, 5), r"nn\.batch_matmul: batch sizes differ"),
    ((4, 5), (3, 6, 5), r"nn\.batch_matmul: input 'x' must be 3-D"),
])
def test_batch_matmul_errors(x, y, match):
    with pytest.raises(opf.OpfusionTypeError, match=match):
        infer(nn.batch_matmul, x, y)


# ---------------------------------------------------------------------------------------------
# per-channel layers


@pytest.mark.parametrize("axis", [1, -1, 3])
def test_bias_add_adds_along_axis(axis):
    x = randn(2, 3, 4, 5)
    bias = randn(x.shape[axis], seed=1)
    shape = [1] * 4
    shape[axis] = -1
    assert_close(eval_op(nn.bias_add, x, bias, axis=axis), x + bias.reshape(shape))
    assert infer(nn.bias_add, x.shape, bias.shape, axis=axis) == opf.TensorType(x.shape)


def test_bias_add_errors():
    with pytest.raises(opf.OpfusionTypeError, match=r"nn\.bias_add: input 'bias' must be 1-D "
                                                    r"with data's axis 1 size 3"):
        infer(nn.bias_add, (2, 3, 4), (4,))
    with pytest.raises(opf.OpfusionTypeError, match=r"nn\.bias_add: attribute 'axis'=3"):
        infer(nn.bias_add, (2, 3, 4), (4,), axis=3)


def test_prelu_matches_onnx():
    x, alpha = randn(2, 3, 4, 5), randn(3, seed=1)
    got = eval_op(nn.prelu, x, alpha)
    assert_close(got, run_onnx("PRelu", [x, alpha.reshape(3, 1, 1)]))
    assert_close(got, np.where(x > 0, x, x * alpha[:, None, None]))


def test_prelu_infers_and_rejects_bad_alpha():
    assert infer(nn.prelu, (2, 5, 3), (3,), axis=2) == opf.TensorType((2, 5, 3))
    with pytest.raises(opf.OpfusionTypeError, match=r"nn\.prelu: input 'alpha' must be 1-D"):
        infer(nn.prelu, (2, 3, 4), (4,))
    with pytest.raises(opf.OpfusionTypeError, match=r"nn\.prelu: .* floating point"):
        infer(nn.prelu, ((2, 3), "int32"), ((3,), "int32"))


# ---------------------------------------------------------------------------------------------
# normalization


def _norm_params(channels: int) -> list[np.ndarray]:
    gamma, beta, mean = randn(channels, seed=1), randn(channels, seed=2), randn(channels, seed=3)
    var = np.abs(randn(channels, seed=4)) + 0.5
    return [gamma, beta, mean, var]


@pytest.mark.parametrize("center, scale", [(True, True), (False, True), (True, False)])
def test_batch_norm_matches_onnx(center, scale):
    x = randn(2, 3, 4, 5)
    gamma, beta, mean, var = _norm_params(3)
    got = eval_op(nn.batch_norm, x, gamma, beta, mean, var, epsilon=1e-3, center=center,
                  scale=scale)
    onnx_gamma = gamma if scale else np.ones_like(gamma)
    onnx_beta = beta if center else np.zeros_like(beta)
    want = run_onnx("BatchNormalization", [x, onnx_gamma, onnx_beta, mean, var], opset=15,
                    epsilon=1e-3)
    assert_close(got, want)


def test_batch_norm_on_last_axis():
    x = randn(4, 6)
    gamma, beta, mean, var = _norm_params(6)
    want = (x - mean) / np.sqrt(var + 1e-5) * gamma + beta
    assert_close(eval_op(nn.batch_norm, x, gamma, beta, mean, var, axis=-1), want)


def test_batch_norm_infers_one_tensor_and_checks_params():
    c = (8,)
    assert infer(nn.batch_norm, (2, 8, 3, 3), c, c, c, c) == opf.TensorType((2, 8, 3, 3))
    with pytest.raises(opf.OpfusionTypeError, match=r"nn\.batch_norm: input 'moving_var' must "
                                                    r"be 1-D of data's axis 1 size 8"):
        infer(nn.batch_norm, (2, 8, 3, 3), c, c, c, (4,))


def test_layer_norm_matches_onnx():
    x = randn(2, 3, 16)
    gamma, beta = randn(16, seed=1), randn(16, seed=2)
    got = eval_op(nn.layer_norm, x, gamma, beta, epsilon=1e-5)
    assert_close(got, run_onnx("LayerNormalization", [x, gamma, beta], opset=17, axis=-1,
                               epsilon=1e-5))


def test_layer_norm_on_middle_axis_without_affine():
    x = randn(2, 5, 3).astype(np.float64)
    ones, zeros = np.ones(5), np.zeros(5)
    got = eval_op(nn.layer_norm, x, ones, zeros, axis=1, center=False, scale=False)
    centered = x - x.mean(axis=1, keepdims=True)
    assert_close(got, centered / np.sqrt(np.var(x, axis=1, keepdims=True) + 1e-5))


def test_layer_norm_errors():
    with pytest.raises(opf.OpfusionTypeError, match=r"nn\.layer_norm: input 'gamma' must be "
                                                    r"1-D of data's axis -1 size 16"):
        infer(nn.layer_norm, (2, 16), (8,), (16,))
    with pytest.raises(opf.OpAttributeError, match=r"nn\.layer_norm attribute 'epsilon'"):
        infer(nn.layer_norm, (2, 16), (16,), (16,), epsilon=-1.0)


@pytest.mark.parametrize("axis", [-1, 1])
def test_softmax_and_log_softmax_match_onnx(axis):
    x = randn(2, 5, 7) * 8
    assert_close(eval_op(nn.softmax, x, axis=axis), run_onnx("Softmax", [x], axis=axis))
    assert_close(eval_op(nn.log_softmax, x, axis=axis), run_onnx("LogSoftmax", [x], axis=axis))


@pytest.mark.parametrize("shape", [(2, 0), (0, 3), (2, 0, 3)])
def test_softmax_of_no_elements_is_empty_in_both_engines(shape):
    # max over a row of no elements has no identity in NumPy; the result simply has none.
    x = opf.var("x", shape)
    for builder in (nn.softmax, nn.log_softmax):
        mod = opf.IRModule.from_expr(opf.Function([x], builder(x, axis=1)))
        data = np.zeros(shape, np.float32)
        assert opf.ir.evaluate(mod, [data]).shape == shape
        assert opf.compile(mod)(data).shape == shape


def test_softmax_is_stable_for_huge_inputs():
    x = np.array([[1000.0, 1000.0, -1000.0]], dtype=np.float32)
    assert_close(eval_op(nn.softmax, x), np.array([[0.5, 0.5, 0.0]], dtype=np.float32))
    assert np.isfinite(eval_op(nn.log_softmax, x)).all()


@pytest.mark.parametrize("builder", [nn.softmax, nn.log_softmax])
def test_softmax_infers_and_rejects(builder):
    assert infer(builder, ((2, 3), "float16")) == opf.TensorType((2, 3), "float16")
    name = builder.__name__
    with pytest.raises(opf.OpfusionTypeError, match=rf"nn\.{name}: attribute 'axis'=2 is out "
                                                    r"of range for a tensor of rank 2"):
        infer(builder, (2, 3), axis=2)
    with pytest.raises(opf.OpfusionTypeError, match=rf"nn\.{name}: input 'data' must be "
                                                    r"floating point"):
        infer(builder, ((2, 3), "int32"))


@pytest.mark.parametrize("size", [5, 3, 4, 1])
def test_lrn_matches_onnx(size):
    # onnx's reference LRN (1.23) loops its channel index over the batch axis, so it is only
    # right when N == C.
    x = randn(6, 6, 3, 4)
    got = eval_op(nn.lrn, x, size=size, bias=1.5, alpha=0.3, beta=0.6)
    assert_close(got, run_onnx("LRN", [x], size=size, bias=1.5, alpha=0.3, beta=0.6))


def test_lrn_infers_and_rejects():
    assert infer(nn.lrn, (1, 8, 4, 4)) == opf.TensorType((1, 8, 4, 4))
    with pytest.raises(opf.OpAttributeError, match=r"nn\.lrn attribute 'size' must be positive"):
        infer(nn.lrn, (1, 8, 4, 4), size=0)
    with pytest.raises(opf.OpfusionTypeError, match=r"nn\.lrn: attribute 'axis'=4"):
        infer(nn.lrn, (1, 8, 4, 4), axis=4)


# ---------------------------------------------------------------------------------------------
# pooling

POOL_CASES = [
    # data shape, attrs
    ((1, 2, 8, 8), {"pool_size": 3, "strides": 2}),
    ((1, 2, 8, 8), {"pool_size": 3, "strides": 2, "ceil_mode": True}),
    ((2, 2, 7, 9), {"pool_size": 3, "strides": 3, "padding": (1, 0, 2, 1), "ceil_mode": True}),
    ((1, 2, 7, 7), {"pool_size": 3, "strides": 3, "padding": (1, 0, 0, 1)}),
    ((1, 2, 9, 8), {"pool_size": 2, "dilation": 2, "padding": 1}),
    ((1, 2, 8, 7), {"pool_size": (2, 3), "strides": (2, 1), "dilation": (2, 1),
                    "padding": (1, 1, 0, 2), "ceil_mode": True}),
    ((1, 1, 6, 6), {"pool_size": 2, "strides": 2, "padding": 1, "ceil_mode": True}),
    # the last window overhangs the input by 2: ceil_mode's partial window past the padding
    ((1, 2, 7, 8), {"pool_size": 3, "strides": 3, "padding": (0, 1, 0, 0), "ceil_mode": True}),
]


def _pool_attrs(attrs):
    full = opf.op.get_op("nn.max_pool2d").make_attrs(attrs)
    return full.pool_size, full.strides, full.dilation, full.padding, full.ceil_mode


def _onnx_pool_attrs(attrs):
    pool_size, strides, dilation, padding, ceil_mode = _pool_attrs(attrs)
    return {"kernel_shape": pool_size, "strides": strides, "dilations": dilation,
            "pads": padding, "ceil_mode": int(ceil_mode)}


@pytest.mark.parametrize("data_shape, attrs", POOL_CASES)
def test_max_pool2d_matches_direct_loop_and_onnx(data_shape, attrs):
    x = randn(*data_shape)
    got = eval_op(nn.max_pool2d, x, **attrs)
    assert_close(got, pool_loop(x, "max", *_pool_attrs(attrs)).astype(np.float32))
    assert_close(got, run_onnx("MaxPool", [x], **_onnx_pool_attrs(attrs)))


@pytest.mark.parametrize("count_include_pad", [False, True])
@pytest.mark.parametrize("data_shape, attrs", POOL_CASES)
def test_avg_pool2d_matches_direct_loop_and_onnx(data_shape, attrs, count_include_pad):
    x = randn(*data_shape)
    got = eval_op(nn.avg_pool2d, x, count_include_pad=count_include_pad, **attrs)
    want = pool_loop(x, "avg", *_pool_attrs(attrs), count_include_pad=count_include_pad)
    assert_close(got, want.astype(np.float32))
    if _ceil_overhang(data_shape, attrs) < 2:
        onnx_out = run_onnx("AveragePool", [x], count_include_pad=int(count_include_pad),
                            **_onnx_pool_attrs(attrs))
        assert_close(got, onnx_out)


def _ceil_overhang(data_shape, attrs) -> int:
    """How far ceil_mode's last window reaches past the padded input (the larger axis).

    onnx's reference AveragePool (1.23) pads half of an overhang of 2 or more *before* the
    input, shifting every window; MaxPool and the loop above do not."""
    pool_size, strides, dilation, padding, ceil_mode = _pool_attrs(attrs)
    reach = []
    for axis in range(2):
        padded = data_shape[2 + axis] + padding[axis] + padding[axis + 2]
        out = pool_loop(np.zeros((1, 1, *data_shape[2:])), "max", pool_size, strides, dilation,
                        padding, ceil_mode).shape[2 + axis]
        reach.append((out - 1) * strides[axis] + dilation[axis] * (pool_size[axis] - 1) + 1
                     - padded)
    return max(reach)


def test_max_pool2d_on_integers_pads_with_the_lowest_value():
    x = -np.arange(16, dtype=np.int32).reshape(1, 1, 4, 4) - 100
    got = eval_op(nn.max_pool2d, x, pool_size=2, strides=2, padding=1)
    assert_close(got, np.array([[[[-100, -101, -103], [-104, -105, -107],
                                  [-112, -113, -115]]]], dtype=np.int32))


@pytest.mark.parametrize("builder, attrs, shape", [
    (nn.max_pool2d, {"pool_size": 3, "strides": 2}, (1, 4, 3, 3)),
    (nn.max_pool2d, {"pool_size": 3, "strides": 2, "ceil_mode": True}, (1, 4, 4, 4)),
    (nn.avg_pool2d, {"pool_size": 3, "strides": 2, "padding": 1}, (1, 4, 4, 4)),
    (nn.avg_pool2d, {"pool_size": 2, "strides": 2, "padding": 1, "ceil_mode": True},
     (1, 4, 5, 5)),
    # ceil_mode keeps no window that would start in the right padding: 4 not 5
    (nn.max_pool2d, {"pool_size": 2, "strides": 2, "padding": (0, 0, 1, 1), "ceil_mode": True},
     (1, 4, 4, 4)),
])
def test_pool2d_infers_shape(builder, attrs, shape):
    assert infer(builder, (1, 4, 8, 8), **attrs) == opf.TensorType(shape)


@pytest.mark.parametrize("size, padding, floor_size, ceil_size", [
    (5, 0, 2, 3),  # windows start at 0, 2 and 4; the last one is partial but kept
    (4, (0, 0, 1, 1), 2, 2),  # a third window would start at 4, in the padding: dropped
    (6, (1, 1, 0, 0), 3, 4),  # starts at -1, 1, 3 and 5 (partial, kept)
])
def test_pool2d_ceil_mode_keeps_partial_windows_that_start_inside(size, padding, floor_size,
                                                                   ceil_size):
    for ceil_mode, out in ((False, floor_size), (True, ceil_size)):
        got = infer(nn.max_pool2d, (1, 1, size, size), pool_size=2, strides=2, padding=padding,
                    ceil_mode=ceil_mode)
        assert got == opf.TensorType((1, 1, out, out))


@pytest.mark.parametrize("builder, data, attrs, error, match", [
    (nn.max_pool2d, (1, 2, 2, 2), {"pool_size": 3}, opf.OpfusionTypeError,
     r"nn\.max_pool2d: output height would be 0: .* \(dilated\) pool_size spans 3"),
    (nn.max_pool2d, (1, 2, 8, 8), {"pool_size": 2, "padding": 2}, opf.OpAttributeError,
     r"nn\.max_pool2d attribute 'padding'=\(2, 2, 2, 2\) must be smaller than the \(dilated\) "
     r"window"),
    (nn.avg_pool2d, ((1, 2, 8, 8), "int32"), {"pool_size": 2}, opf.OpfusionTypeError,
     r"nn\.avg_pool2d: input 'data' must be floating point"),
    (nn.avg_pool2d, (2, 8, 8), {"pool_size": 2}, opf.OpfusionTypeError,
     r"nn\.avg_pool2d: input 'data' must be 4-D"),
    (nn.max_pool2d, (1, 2, 8, 8), {"pool_size": 0}, opf.OpAttributeError,
     r"nn\.max_pool2d attribute 'pool_size' must be positive"),
    (nn.max_pool2d, (1, 2, 8, 8), {"pool_sise": 2}, opf.OpAttributeError,
     r"nn\.max_pool2d: unknown attribute 'pool_sise'; did you mean 'pool_size'"),
])
def test_pool2d_errors(builder, data, attrs, error, match):
    with pytest.raises(error, match=match):
        infer(builder, data, **attrs)


@pytest.mark.parametrize("builder, onnx_op, numpy_fn", [
    (nn.global_avg_pool2d, "GlobalAveragePool", np.mean),
    (nn.global_max_pool2d, "GlobalMaxPool", np.max),
])
def test_global_pools_match_onnx(builder, onnx_op, numpy_fn):
    x = randn(2, 3, 5, 6)
    got = eval_op(builder, x)
    assert_close(got, numpy_fn(x.astype(np.float64), axis=(2, 3), keepdims=True)
                 .astype(np.float32))
    assert_close(got, run_onnx(onnx_op, [x]))
    assert infer(builder, (2, 3, 5, 6)) == opf.TensorType((2, 3, 1, 1))
    with pytest.raises(opf.OpfusionTypeError, match=rf"nn\.{builder.__name__}: input 'data' "
                                                    r"must be 4-D"):
        infer(builder, (3, 5, 6))


# ---------------------------------------------------------------------------------------------
# pad, batch_flatten, dropout


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect"])
def test_pad_matches_onnx(mode):
    x = randn(2, 3, 4)
    widths = (0, 1, 2, 0, 1, 3)
    got = eval_op(nn.pad, x, np.float32(1.5), pad_width=widths, pad_mode=mode)
    onnx_pads = np.array(widths[0::2] + widths[1::2], dtype=np.int64)
    want = run_onnx("Pad", [x, onnx_pads, np.array(1.5, dtype=np.float32)], mode=mode)
    assert_close(got, want)
    assert got.shape == (3, 5, 8)


def test_pad_value_can_be_a_python_scalar():
    x = opf.var("x", (2, 2))
    call = nn.pad(x, 7.0, pad_width=(1, 0, 0, 1))
    got = opf.ir.evaluate(opf.IRModule.from_expr(opf.Function([x], call)),
                          [np.zeros((2, 2), np.float32)])
    assert_close(got, np.array([[7, 7, 7], [0, 0, 7], [0, 0, 7]], dtype=np.float32))


@pytest.mark.parametrize("data, value, attrs, error, match", [
    ((2, 3), (), {"pad_width": (1, 1)}, opf.OpfusionTypeError,
     r"nn\.pad: attribute 'pad_width' needs 2 x rank = 4 values"),
    ((2, 3), (), {"pad_width": (1, -1, 0, 0)}, opf.OpAttributeError,
     r"nn\.pad attribute 'pad_width'=\(1, -1, 0, 0\) must not be negative"),
    ((2, 3), (), {"pad_width": (0, 0, 3, 0), "pad_mode": "reflect"}, opf.OpfusionTypeError,
     r"nn\.pad: attribute 'pad_width' pads axis 1 .* reflect mode pads at most size - 1 = 2"),
    ((2, 3), (1,), {"pad_width": (0, 0, 1, 0)}, opf.OpfusionTypeError,
     r"nn\.pad: input 'pad_value' must be a scalar \(0-d\) tensor"),
    ((2, 3), (), {"pad_width": (0, 0, 1, 0), "pad_mode": "wrap"}, opf.OpAttributeError,
     r"nn\.pad attribute 'pad_mode' must be one of"),
])
def test_pad_errors(data, value, attrs, error, match):
    with pytest.raises(error, match=match):
        infer(nn.pad, data, value, **attrs)


def test_batch_flatten():
    x = randn(2, 3, 4, 5)
    assert_close(eval_op(nn.batch_flatten, x), x.reshape(2, 60))
    assert_close(eval_op(nn.batch_flatten, x), run_onnx("Flatten", [x], axis=1))
    assert infer(nn.batch_flatten, ((4, 3, 0), "int8")) == opf.TensorType((4, 0), "int8")
    with pytest.raises(opf.OpfusionTypeError, match=r"nn\.batch_flatten: input 'data' must "
                                                    r"have a batch axis"):
        infer(nn.batch_flatten, ())


def test_dropout_is_identity_at_inference():
    x = randn(3, 4)
    assert_close(eval_op(nn.dropout, x, rate=0.3), x)
    assert infer(nn.dropout, ((3, 4), "float16")) == opf.TensorType((3, 4), "float16")
    with pytest.raises(opf.OpAttributeError, match=r"nn\.dropout attribute 'rate'=1\.0 must be "
                                                   r"in \[0, 1\)"):
        infer(nn.dropout, (3, 4), rate=1.0)


# ---------------------------------------------------------------------------------------------
# einsum

EINSUM_CASES = [
    # equation, operand shapes, result shape
    ("ij,jk->ik", [(3, 4), (4, 5)], (3, 5)),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)], (2, 3, 5)),
    ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)], (1, 2, 3, 5)),
    ("ij->ji", [(3, 4)], (4, 3)),
    ("ii->i", [(3, 3)], (3,)),
    ("ii", [(3, 3)], ()),
    ("ij,jk", [(3, 4), (4, 5)], (3, 5)),
    ("ba", [(3, 4)], (4, 3)),
    ("i,j->ij", [(3,), (4,)], (3, 4)),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 6)], (2, 5, 3, 6)),
    ("...i,...i", [(2, 1, 3), (4, 3)], (2, 4)),
    ("ij,ik->jk", [(1, 3), (2, 4)], (3, 4)),  # size-1 labels broadcast, as in NumPy
    ("i j , j k -> i k", [(3, 4), (4, 5)], (3, 5)),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)], (2, 5)),
    ("Aa->aA", [(2, 3)], (3, 2)),
]


@pytest.mark.parametrize("equation, shapes, result", EINSUM_CASES)
def test_einsum_infers_the_shape_and_matches_numpy(equation, shapes, result):
    arrays = [randn(*shape, seed=i) for i, shape in enumerate(shapes)]
    assert infer(lambda *xs, **kw: opf.op.einsum(list(xs), **kw), *shapes,
                 equation=equation) == opf.TensorType(result, "float32")
    want = np.einsum(equation.replace(" ", ""), *[a.astype(np.float64) for a in arrays])
    got = eval_op(opf.op.einsum, arrays, equation=equation)
    assert_close(got, want.astype(np.float32))


@pytest.mark.parametrize("equation, shapes", [(case[0], case[1]) for case in EINSUM_CASES[:8]])
def test_einsum_matches_onnx(equation, shapes):
    arrays = [randn(*shape, seed=i) for i, shape in enumerate(shapes)]
    got = eval_op(opf.op.einsum, arrays, equation=equation)
    assert_close(got, run_onnx("Einsum", arrays, equation=equation))


def test_einsum_of_integers_stays_integer():
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    got = eval_op(opf.op.einsum, [a, a], equation="ij,ij->i")
    assert_close(got, np.einsum("ij,ij->i", a, a).astype(np.int32))


@pytest.mark.parametrize("equation, shapes, message", [
    ("ij,jk->ik", [(3, 4)], r"2 operand term\(s\) but 1 tensor\(s\)"),
    ("ij->ij", [(3, 4, 5)], r"operand 0 has shape \(3, 4, 5\) \(rank 3\) but its subscripts "
                            r"'ij' name 2 axes"),
    ("ij,jk->ik", [(3, 4), (5, 6)], r"letter 'j' .* is size 4 in one place and 5 in operand 1"),
    ("...ij->ij", [(2, 3, 4)], r"'\.\.\.' axes \(2,\) .* must appear in the output"),
    ("...i,...i->...", [(2, 3), (4, 3)], r"'\.\.\.' axes of the operands.* do not broadcast"),
])
def test_einsum_type_errors(equation, shapes, message):
    with pytest.raises(opf.OpfusionTypeError, match=r"einsum: .*" + message):
        infer(lambda *xs, **kw: opf.op.einsum(list(xs), **kw), *shapes, equation=equation)


@pytest.mark.parametrize("equation, message", [
    ("ij->i->j", r"more than one '->'"),
    ("i1,j", r"subscripts 'i1' hold '1'"),
    ("ij->ii", r"output subscripts 'ii' repeat a letter"),
    ("ij->k", r"output letter 'k' names no input axis"),
    ("ij->...", r"the output has '\.\.\.' but no input does"),
    ("......i", r"hold '\.\.\.' more than once"),
])
def test_einsum_rejects_malformed_equations(equation, message):
    with pytest.raises(opf.OpAttributeError, match=r"einsum attribute 'equation'=.*" + message):
        opf.op.einsum([opf.var("x", (3, 3))], equation=equation)


def test_einsum_rejects_bool_and_mixed_dtypes():
    with pytest.raises(opf.OpfusionTypeError, match=r"einsum: inputs must share one dtype"):
        infer(lambda *xs, **kw: opf.op.einsum(list(xs), **kw), (3,), ((3,), "float16"),
              equation="i,i")
    with pytest.raises(opf.OpfusionTypeError, match=r"einsum: input 'operand 0' is bool"):
        infer(lambda *xs, **kw: opf.op.einsum(list(xs), **kw), ((3,), "bool"), equation="i")


def test_einsum_declaration():
    op = opf.op.get_op("einsum")
    assert op.pattern.name == "kOpaque" and op.tuple_input
    assert op.doc and "\n" not in op.doc
    assert opf.op.einsum.__doc__.startswith(op.doc)


# ---------------------------------------------------------------------------------------------
# declarations


EXPECTED_PATTERNS = {
    "nn.conv2d": "kOutEWiseFusable", "nn.conv2d_transpose": "kOutEWiseFusable",
    "nn.dense": "kOutEWiseFusable", "nn.matmul": "kOutEWiseFusable",
    "nn.batch_matmul": "kOutEWiseFusable", "nn.bias_add": "kBroadcast",
    "nn.prelu": "kBroadcast", "nn.batch_norm": "kOpaque", "nn.layer_norm": "kOpaque",
    "nn.softmax": "kOpaque", "nn.log_softmax": "kOpaque", "nn.max_pool2d": "kOutEWiseFusable",
    "nn.avg_pool2d": "kOutEWiseFusable", "nn.global_avg_pool2d": "kOutEWiseFusable",
    "nn.global_max_pool2d": "kOutEWiseFusable", "nn.lrn": "kOpaque", "nn.dropout": "kOpaque",
    "nn.pad": "kInjective", "nn.batch_flatten": "kInjective",
}


@pytest.mark.parametrize("name, pattern", EXPECTED_PATTERNS.items())
def test_declaration_has_pattern_doc_and_builder(name, pattern):
    op = opf.op.get_op(name)
    assert op.pattern.name == pattern
    assert op.doc and "\n" not in op.doc
    assert getattr(nn, name.split(".", 1)[1]).__doc__.startswith(op.doc)
