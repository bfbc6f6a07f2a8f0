"""Compiled sums, means, variances and the normalizations built on them are accurate: they
accumulate in float64 in vector partial sums (topi.reduce.blocked_sum) and center the
variance on the mean, so rows far from zero lose nothing and constant rows normalize to 0.

Errors are measured against float64 NumPy, relative to the largest magnitude of the exact
result; a float32 sequential sum misses these bounds by 10x or more (ONNX Runtime's
layer_norm is at ~3e-5 on the same rows)."""

import shutil

import numpy as np
import pytest
from onnx import TensorProto, helper

import opfusion as opf
from opfusion.ir.evaluate import evaluate
from opfusion.ir.expr import Constant, Function, Var
from opfusion.ir.module import IRModule
from opfusion.ir.types import TensorType
from opfusion.testing import assert_close

pytestmark = pytest.mark.skipif(not (shutil.which("gcc") or shutil.which("cc")),
                                reason="no C compiler")

nn = opf.op.nn
#: Bound for the normalizations (x - mean) / std on rows offset by 1000.
NORM_BOUND = 5e-5
#: Bound for a sum, mean or softmax: a few float32 roundings of the exact value.
SUM_BOUND = 3e-7


def _offset(shape, seed=0, offset=1000.0):
    rng = np.random.default_rng(seed)
    return (offset + rng.standard_normal(shape)).astype(np.float32)


def _compiled(build, x):
    """The compiled result of ``build(var)`` on ``x``, and the function itself."""
    var = Var("x", TensorType(x.shape, str(x.dtype)))
    func = Function([var], build(var))
    out = opf.compile(func)(x=x)
    return np.asarray(out[0] if isinstance(out, list) else out), func


def _relative_error(got, exact):
    return float(np.abs(got.astype(np.float64) - exact).max() / np.abs(exact).max())


def _normalized(x, axes, epsilon=1e-5):
    xd = x.astype(np.float64)
    mean = xd.mean(axis=axes, keepdims=True)
    var = ((xd - mean) ** 2).mean(axis=axes, keepdims=True)
    return (xd - mean) / np.sqrt(var + epsilon)


@pytest.mark.parametrize("name, kwargs", [("sum", {"axis": [-1]}), ("mean", {"axis": [-1]}),
                                          ("sum", {}), ("mean", {"axis": [0]})])
def test_sums_of_offset_rows(name, kwargs):
    x = _offset((16, 4096))
    got, _ = _compiled(lambda v: getattr(opf.op, name)(v, **kwargs), x)
    axis = kwargs.get("axis")
    exact = getattr(np, name)(x.astype(np.float64), axis=None if axis is None else tuple(axis))
    assert _relative_error(got, exact) < SUM_BOUND


def test_variance_of_offset_rows_is_centered():
    x = _offset((8, 1000), offset=1e4)
    got, _ = _compiled(lambda v: opf.op.variance(v, axis=[-1]), x)
    assert _relative_error(got, x.astype(np.float64).var(axis=-1)) < 1e-5


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_of_long_rows(name):
    x = (np.random.default_rng(1).standard_normal((16, 4096)) * 0.01).astype(np.float32)
    got, _ = _compiled(lambda v: getattr(nn, name)(v, axis=-1), x)
    xd = x.astype(np.float64)
    e = np.exp(xd - xd.max(-1, keepdims=True))
    exact = e / e.sum(-1, keepdims=True)
    assert _relative_error(got, exact if name == "softmax" else np.log(exact)) < SUM_BOUND


def test_layer_norm_of_offset_and_constant_rows():
    size = 768
    x = _offset((64, size))
    x[0] = np.float32(1000.1)  # a constant row not representable as a short sum
    x[1] = np.float32(-3.3e4)
    gamma, beta = Constant(np.ones(size, np.float32)), Constant(np.zeros(size, np.float32))
    got, _ = _compiled(lambda v: nn.layer_norm(v, gamma, beta, axis=-1, epsilon=1e-5), x)
    assert np.abs(got[:2]).max() < 1e-6
    assert _relative_error(got[2:], _normalized(x[2:], (-1,))) < NORM_BOUND


def _instance_norm_model(shape):
    channels = shape[1]
    node = helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-5)
    graph = helper.make_graph(
        [node], "instance_norm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor("s", TensorProto.FLOAT, [channels], np.ones(channels)),
         helper.make_tensor("b", TensorProto.FLOAT, [channels], np.zeros(channels))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_instance_norm_of_offset_and_constant_planes():
    shape = (2, 4, 32, 32)
    x = _offset(shape)
    x[0, 0] = np.float32(1000.1)
    mod, params = opf.frontend.from_onnx(_instance_norm_model(shape))
    got = np.asarray(opf.compile(mod, params=params)(x=x))
    assert np.abs(got[0, 0]).max() < 1e-6
    assert _relative_error(got[1], _normalized(x[1], (1, 2))) < NORM_BOUND


def test_global_average_pool_of_offset_planes():
    x = _offset((2, 8, 56, 56))
    got, _ = _compiled(nn.global_avg_pool2d, x)
    exact = x.astype(np.float64).mean(axis=(2, 3), keepdims=True)
    assert _relative_error(got, exact) < SUM_BOUND


def test_blocked_global_average_pool_of_offset_planes():
    """NCHW16c planes of 56 x 56, summed row by row and then over the rows."""
    x = _offset((2, 3, 56, 56, 16), seed=1)
    got, _ = _compiled(lambda v: nn.global_avg_pool2d(v, layout="NCHW16c"), x)
    exact = x.astype(np.float64).mean(axis=(2, 3), keepdims=True)
    assert _relative_error(got, exact) < SUM_BOUND


@pytest.mark.parametrize("shape", [(5, 37), (3, 1000), (7, 20)])
@pytest.mark.parametrize("op_name", ["sum", "mean", "variance", "softmax", "log_softmax",
                                     "layer_norm"])
def test_compiled_matches_reference_on_standard_rows(op_name, shape):
    """Rows with and without a tail past the last whole block of partial sums, and rows too
    short to block, agree with the reference interpreter."""
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    gamma = Constant(np.random.default_rng(3).standard_normal(shape[-1]).astype(np.float32))
    beta = Constant(np.random.default_rng(4).standard_normal(shape[-1]).astype(np.float32))
    builders = {
        "sum": lambda v: opf.op.sum(v, axis=[-1]),
        "mean": lambda v: opf.op.mean(v, axis=[-1], keepdims=True),
        "variance": lambda v: opf.op.variance(v, axis=[-1]),
        "softmax": lambda v: nn.softmax(v, axis=-1),
        "log_softmax": lambda v: nn.log_softmax(v, axis=-1),
        "layer_norm": lambda v: nn.layer_norm(v, gamma, beta, axis=-1, epsilon=1e-5),
    }
    got, func = _compiled(builders[op_name], x)
    assert_close(got, evaluate(IRModule.from_expr(func), [x]))


@pytest.mark.parametrize("op_name", ["sum", "softmax"])
def test_compiled_matches_reference_along_an_inner_axis(op_name):
    x = np.random.default_rng(5).standard_normal((3, 40, 6)).astype(np.float32)
    build = (lambda v: opf.op.sum(v, axis=[1, 2])) if op_name == "sum" else (
        lambda v: nn.softmax(v, axis=1))
    got, func = _compiled(build, x)
    assert_close(got, evaluate(IRModule.from_expr(func), [x]))
