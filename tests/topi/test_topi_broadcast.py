"""The TE computes of the broadcasting operators agree with their NumPy references."""

import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis.extra.numpy import mutually_broadcastable_shapes

import opfusion as opf
from opfusion.topi.testing import check_compute

needs_cc = pytest.mark.skipif(not (shutil.which("gcc") or shutil.which("cc")),
                              reason="no C compiler")


@pytest.fixture
def kernel_cache(tmp_path, monkeypatch):
    """Compiled kernels go to a private cache, not ~/.cache."""
    monkeypatch.setenv("OPFUSION_CACHE_DIR", str(tmp_path))


def _normal(shape, dtype="float32", seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _ints(shape, dtype="int32", low=-20, high=20, seed=0):
    return np.random.default_rng(seed).integers(low, high, shape).astype(dtype)


_FLOAT_BINARY = ["add", "subtract", "multiply", "divide", "floor_divide", "mod", "maximum",
                 "minimum", "equal", "not_equal", "less", "less_equal", "greater",
                 "greater_equal"]
_SHAPES = [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (4,)), ((3, 1), (1, 4)), ((1, 3, 1), (2, 1, 5)),
           ((), (2, 3)), ((4,), ())]


@pytest.mark.parametrize("name", _FLOAT_BINARY)
@pytest.mark.parametrize("shapes", _SHAPES, ids=str)
def test_float_binary_broadcasts(name, shapes):
    lhs, rhs = _normal(shapes[0], seed=1), _normal(shapes[1], seed=2)
    check_compute(getattr(opf.op, name), lhs, rhs)


@settings(max_examples=25, deadline=None)
@given(mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=3, max_side=3))
def test_where_and_fma_broadcast_any_shapes(shapes):
    a, b, c = shapes.input_shapes
    check_compute(opf.op.where, _normal(a, seed=3) > 0, _normal(b, seed=4), _normal(c, seed=5))
    check_compute(opf.op.ewise_fma, _normal(a, seed=3), _normal(b, seed=4), _normal(c, seed=5))


@settings(max_examples=25, deadline=None)
@given(mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, max_side=3))
def test_add_and_maximum_broadcast_any_shapes(shapes):
    lhs, rhs = _normal(shapes.input_shapes[0], seed=6), _normal(shapes.input_shapes[1], seed=7)
    check_compute(opf.op.add, lhs, rhs)
    check_compute(opf.op.maximum, lhs, rhs)


def test_float16_arithmetic():
    lhs, rhs = _normal((3, 4), "float16"), _normal((4,), "float16", seed=1)
    for builder in (opf.op.add, opf.op.multiply, opf.op.divide, opf.op.mod):
        check_compute(builder, lhs, rhs, rtol=2e-3)


def test_float_mod_takes_the_divisor_sign():
    lhs = np.array([5.5, -5.5, 5.5, -5.5, 0.0, 4.0, -1e-8], "float32")
    rhs = np.array([2.0, 2.0, -2.0, -2.0, -3.0, 2.0, 3.0], "float32")
    check_compute(opf.op.mod, lhs, rhs)
    check_compute(opf.op.floor_divide, lhs, rhs)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_float_division_by_zero():
    lhs = np.array([1.0, -1.0, 0.0, 2.0], "float32")
    rhs = np.array([0.0, 0.0, 0.0, -0.0], "float32")
    check_compute(opf.op.divide, lhs, rhs)
    check_compute(opf.op.mod, lhs, rhs)


@needs_cc
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_float_floor_divide_by_zero_compiled(kernel_cache):
    # compiled only: the interpreter's floor(-inf) is +inf (opfusion/tir/interp.py `_safe`)
    lhs = np.array([1.0, -1.0, 0.0, 2.0], "float32")
    rhs = np.array([0.0, 0.0, 0.0, -0.0], "float32")
    check_compute(opf.op.floor_divide, lhs, rhs, compiled=True)


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint8", "uint32"])
def test_integer_division_signs(dtype):
    low = 0 if dtype.startswith("u") else -9
    lhs = np.array([[v] for v in range(low, 10)], dtype)  # every dividend against
    rhs = np.array([v for v in range(low, 5) if v], dtype)  # every non-zero divisor
    for builder in (opf.op.divide, opf.op.floor_divide, opf.op.mod):
        check_compute(builder, lhs, rhs)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_integer_floor_divide_and_mod_by_zero_give_zero():
    lhs, rhs = np.array([7, -7, 0], "int32"), np.zeros(3, "int32")
    check_compute(opf.op.floor_divide, lhs, rhs)
    check_compute(opf.op.mod, lhs, rhs)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype", ["int8", "int32", "int64"])
def test_integer_division_of_the_minimum_by_minus_one_wraps(dtype):
    low = np.iinfo(dtype).min
    # (the int64 reference divides through float64, which rounds low + 1: left out)
    lhs = np.array([low, low, 7, -7, 0] + ([low + 1] if dtype != "int64" else []), dtype)
    rhs = np.array([-1, 1, -1, -1, -1] + ([-1] if dtype != "int64" else []), dtype)
    for builder in (opf.op.divide, opf.op.floor_divide, opf.op.mod):
        check_compute(builder, lhs, rhs)


def test_integer_arithmetic_wraps():
    info = np.iinfo("int8")
    lhs = np.array([info.max, info.min, 100, -100], "int8")
    rhs = np.array([1, -1, 100, 3], "int8")
    for builder in (opf.op.add, opf.op.subtract, opf.op.multiply):
        check_compute(builder, lhs, rhs)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_float_power():
    check_compute(opf.op.power, np.abs(_normal((3, 4))) + 0.1, _normal((4,), seed=1))
    check_compute(opf.op.power, np.array([-2.0, -2.0, 0.0, 4.0], "float32"),
                  np.array([3.0, 0.5, 0.0, -0.5], "float32"))


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint8"])
def test_integer_power(dtype):
    bits = np.iinfo(dtype).bits
    signed = not dtype.startswith("u")
    bases = np.array([-3, -2, -1, 0, 1, 2, 3] if signed else [0, 1, 2, 3], dtype)[:, None]
    exponents = np.arange(0, bits, dtype=dtype)[None, :]
    check_compute(opf.op.power, bases, exponents)


def test_integer_power_beyond_the_dtype_bits():
    # even bases vanish, -1 keeps its parity, 1 and 0 stay: all exact past `bits` factors
    bases = np.array([-2, -1, 0, 1, 2, 4], "int32")[:, None]
    exponents = np.array([32, 33, 63, 100, 1001], "int32")[None, :]
    check_compute(opf.op.power, bases, exponents)


def test_comparisons_with_nan_and_bools():
    lhs = np.array([1.0, np.nan, np.nan, 2.0], "float32")
    rhs = np.array([np.nan, 1.0, np.nan, 2.0], "float32")
    for name in ["equal", "not_equal", "less", "less_equal", "greater", "greater_equal"]:
        check_compute(getattr(opf.op, name), lhs, rhs)
    check_compute(opf.op.equal, np.array([True, False]), np.array([[True], [False]]))


def test_logical_ops():
    lhs = np.array([[True, False]])
    rhs = np.array([[True], [False]])
    for builder in (opf.op.logical_and, opf.op.logical_or, opf.op.logical_xor):
        check_compute(builder, lhs, rhs)


def _extremes(dtype, count=24, seed=0):
    info = np.iinfo(dtype)
    rng = np.random.default_rng(seed)
    values = rng.integers(info.min, info.max, count, dtype=dtype, endpoint=True)
    values[:4] = [info.min, info.max, 0, info.max // 2]
    return values


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64", "uint8", "uint32"])
def test_bitwise_ops(dtype):
    lhs, rhs = _extremes(dtype), _extremes(dtype, seed=1)
    for builder in (opf.op.bitwise_and, opf.op.bitwise_or, opf.op.bitwise_xor):
        check_compute(builder, lhs, rhs)


@needs_cc
def test_uint64_bitwise_and_shifts_compiled(kernel_cache):
    # compiled only: the interpreter returns uint64 values >= 2**63 through float64
    lhs, rhs = _extremes("uint64"), _extremes("uint64", seed=1)
    for builder in (opf.op.bitwise_and, opf.op.bitwise_or, opf.op.bitwise_xor):
        check_compute(builder, lhs, rhs, compiled=True)
    counts = np.arange(0, 67, dtype="uint64")[None, :]
    check_compute(opf.op.left_shift, lhs[:4, None], counts, compiled=True)
    check_compute(opf.op.right_shift, lhs[:4, None], counts, compiled=True)


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint8", "uint32"])
def test_shifts_including_out_of_range_counts(dtype):
    bits = np.iinfo(dtype).bits
    values = _extremes(dtype, count=8)[:, None]
    low = -2 if not dtype.startswith("u") else 0
    counts = np.arange(low, bits + 3, dtype=dtype)[None, :]
    check_compute(opf.op.left_shift, values, counts)
    check_compute(opf.op.right_shift, values, counts)


def test_where_picks_per_element():
    condition = np.array([[True], [False], [True]])
    check_compute(opf.op.where, condition, _normal((3, 4)), _normal((4,), seed=1))
    check_compute(opf.op.where, condition, _ints((3, 4)), _ints((1, 4), seed=1))


def test_ewise_fma():
    check_compute(opf.op.ewise_fma, _normal((2, 3)), _normal((3,), seed=1), _normal((2, 1), seed=2))
    check_compute(opf.op.ewise_fma, _ints((2, 3)), _ints((3,), seed=1), _ints((2, 1), seed=2))


@needs_cc
def test_maximum_minimum_propagate_nan_compiled(kernel_cache):
    lhs = np.array([1.0, np.nan, 2.0, np.nan, -0.0], "float32")
    rhs = np.array([np.nan, 1.0, 3.0, np.nan, 0.0], "float32")
    check_compute(opf.op.maximum, lhs, rhs, compiled=True)
    check_compute(opf.op.minimum, lhs, rhs, compiled=True)


def test_maximum_propagates_nan_interpreted():
    check_compute(opf.op.maximum, np.array([1.0], "float32"), np.array([np.nan], "float32"))


@needs_cc
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype", ["int8", "int32", "int64"])
def test_integer_ops_compiled(dtype, kernel_cache):
    lhs = np.array([[v] for v in range(-9, 10)], dtype)
    rhs = np.array([v for v in range(-4, 5) if v], dtype)
    for builder in (opf.op.divide, opf.op.floor_divide, opf.op.mod, opf.op.maximum):
        check_compute(builder, lhs, rhs, compiled=True)
    bases = np.array([-3, -2, -1, 0, 1, 2, 3], dtype)[:, None]
    exponents = np.arange(0, np.iinfo(dtype).bits, dtype=dtype)[None, :]
    check_compute(opf.op.power, bases, exponents, compiled=True)
    low = np.iinfo(dtype).min  # C's INT_MIN / -1 traps; the computes must not reach it
    for builder in (opf.op.floor_divide, opf.op.mod):
        check_compute(builder, np.array([low, low, 0], dtype), np.array([-1, 0, 0], dtype),
                      compiled=True)
    values, other = _extremes(dtype), _extremes(dtype, seed=1)
    for builder in (opf.op.bitwise_and, opf.op.bitwise_or, opf.op.bitwise_xor):
        check_compute(builder, values, other, compiled=True)
    counts = np.arange(-2, np.iinfo(dtype).bits + 2, dtype=dtype)[None, :]
    check_compute(opf.op.left_shift, values[:6, None], counts, compiled=True)
    check_compute(opf.op.right_shift, values[:6, None], counts, compiled=True)


@needs_cc
def test_float_ops_compiled(kernel_cache):
    lhs, rhs = _normal((3, 4)), _normal((4,), seed=1)
    for name in ["add", "divide", "floor_divide", "mod", "less"]:
        check_compute(getattr(opf.op, name), lhs, rhs, compiled=True)
    check_compute(opf.op.power, np.abs(lhs), rhs, compiled=True)
    check_compute(opf.op.where, lhs > 0, lhs, rhs, compiled=True)
