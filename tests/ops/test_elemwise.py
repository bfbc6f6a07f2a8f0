"""Elementwise operators: inference, errors and numbers against NumPy written here."""

import math

import numpy as np
import pytest

import opfusion as opf
from opfusion.ir.op import OpPatternKind, get_op
from opfusion.testing import assert_close, eval_op

rng = np.random.default_rng(0)
X = rng.standard_normal((3, 4, 5)).astype(np.float32)
POSITIVE = np.abs(X) + 0.1


@pytest.mark.parametrize(
    "name, data, expected",
    [
        ("negative", X, -X),
        ("abs", X, np.abs(X)),
        ("exp", X, np.exp(X)),
        ("log", POSITIVE, np.log(POSITIVE)),
        ("sqrt", POSITIVE, np.sqrt(POSITIVE)),
        ("rsqrt", POSITIVE, 1 / np.sqrt(POSITIVE)),
        ("sigmoid", X, 1 / (1 + np.exp(-X))),
        ("tanh", X, np.tanh(X)),
        ("erf", X, np.array([math.erf(v) for v in X.ravel()], np.float32).reshape(X.shape)),
        ("floor", X * 3, np.floor(X * 3)),
        ("ceil", X * 3, np.ceil(X * 3)),
        ("round", np.array([0.5, 1.5, 2.5, -0.5, -1.7], np.float32),
         np.array([0.0, 2.0, 2.0, -0.0, -2.0], np.float32)),
        ("trunc", X * 3, np.trunc(X * 3)),
        ("sign", X, np.sign(X)),
        ("sin", X, np.sin(X)),
        ("cos", X, np.cos(X)),
        ("copy", X, X),
        ("nn.relu", X, np.where(X > 0, X, 0)),
    ],
)
def test_unary_matches_numpy(name, data, expected):
    builder = _builder(name)
    got = eval_op(builder, data)
    assert_close(got, expected.astype(np.float32))


def _builder(name):
    namespace = opf.op.nn if name.startswith("nn.") else opf.op
    return getattr(namespace, name.rsplit(".", 1)[-1])


def test_sigmoid_does_not_overflow_for_large_inputs():
    data = np.array([-1000.0, -30.0, 0.0, 30.0, 1000.0], np.float32)
    got = eval_op(opf.op.sigmoid, data)
    assert np.all(np.isfinite(got))
    assert got[0] == 0.0 and got[-1] == 1.0 and got[2] == 0.5


def test_elementwise_keeps_shape_and_dtype():
    x = opf.var("x", (2, 7), dtype="float64")
    ty = opf.op.tanh(x).checked_type
    assert ty == opf.TensorType((2, 7), "float64")


def test_every_elementwise_op_has_the_elementwise_pattern():
    names = ["negative", "abs", "exp", "log", "sqrt", "rsqrt", "sigmoid", "tanh", "erf", "floor",
             "ceil", "round", "sign", "sin", "cos", "cast", "logical_not", "isnan", "isinf",
             "clip", "nn.relu", "nn.leaky_relu"]
    assert all(get_op(n).pattern == OpPatternKind.kElemWise for n in names)


def test_float_only_op_rejects_integers():
    x = opf.var("x", (3,), dtype="int32")
    with pytest.raises(opf.OpfusionTypeError, match="exp: input 'data' must be floating point"):
        _ = opf.op.exp(x).checked_type


def test_integer_abs_and_negative_stay_integer():
    data = np.array([-3, 0, 5], np.int64)
    assert_close(eval_op(opf.op.abs, data), np.array([3, 0, 5], np.int64))
    assert_close(eval_op(opf.op.negative, data), np.array([3, 0, -5], np.int64))


def test_clip_clamps_and_checks_bounds():
    assert_close(eval_op(opf.op.clip, X, a_min=-0.5, a_max=0.25), np.clip(X, -0.5, 0.25))
    x = opf.var("x", (3,))
    with pytest.raises(opf.OpfusionTypeError, match="clip: attribute 'a_min'=1.0 exceeds"):
        _ = opf.op.clip(x, a_min=1.0, a_max=0.0).checked_type
    with pytest.raises(opf.OpAttributeError, match="clip: attribute 'a_max' is required"):
        opf.op.clip(x, a_min=1.0)


def test_leaky_relu_scales_negative_values():
    got = eval_op(opf.op.nn.leaky_relu, X, alpha=0.2)
    assert_close(got, np.where(X > 0, X, 0.2 * X).astype(np.float32))


def test_unknown_attribute_suggests_the_closest():
    x = opf.var("x", (3,))
    with pytest.raises(opf.OpAttributeError, match="did you mean 'alpha'"):
        opf.op.nn.leaky_relu(x, alpah=0.1)


def test_cast_converts_dtype_truncating_toward_zero():
    data = np.array([-1.7, -0.2, 0.5, 2.9], np.float32)
    got = eval_op(opf.op.cast, data, dtype="int32")
    assert_close(got, np.array([-1, 0, 0, 2], np.int32))
    x = opf.var("x", (4,))
    assert opf.op.cast(x, dtype=np.float16).checked_type.dtype == "float16"


def test_logical_not_and_nan_inf_tests_return_bool():
    special = np.array([np.nan, np.inf, -np.inf, 1.0], np.float32)
    assert_close(eval_op(opf.op.isnan, special), np.array([True, False, False, False]))
    assert_close(eval_op(opf.op.isinf, special), np.array([False, True, True, False]))
    flags = np.array([True, False])
    assert_close(eval_op(opf.op.logical_not, flags), np.array([False, True]))
    with pytest.raises(opf.OpfusionTypeError, match="logical_not: input 'data' must be bool"):
        _ = opf.op.logical_not(opf.var("x", (2,))).checked_type


@pytest.mark.parametrize("name, fn, data", [
    ("tan", np.tan, X), ("asin", np.arcsin, np.tanh(X)), ("acos", np.arccos, np.tanh(X)),
    ("atan", np.arctan, X), ("sinh", np.sinh, X), ("cosh", np.cosh, X),
    ("asinh", np.arcsinh, X), ("acosh", np.arccosh, POSITIVE + 1), ("atanh", np.arctanh,
                                                                     np.tanh(X)),
])
def test_trigonometric_and_hyperbolic(name, fn, data):
    assert_close(eval_op(getattr(opf.op, name), data), fn(data).astype(np.float32))


def test_bitwise_not_needs_integers():
    data = np.array([0, 1, 255], np.uint8)
    assert_close(eval_op(opf.op.bitwise_not, data), np.array([255, 254, 0], np.uint8))
    with pytest.raises(opf.OpfusionTypeError, match="bitwise_not: input 'data' must be an int"):
        _ = opf.op.bitwise_not(opf.var("x", (2,))).checked_type
