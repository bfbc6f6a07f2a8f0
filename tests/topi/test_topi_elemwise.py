"""The TE computes of the elementwise operators agree with their NumPy references."""

import shutil

import numpy as np
import pytest

import opfusion as opf
from opfusion.topi.testing import check_compute

needs_cc = pytest.mark.skipif(not (shutil.which("gcc") or shutil.which("cc")),
                              reason="no C compiler")


@pytest.fixture
def kernel_cache(tmp_path, monkeypatch):
    """Compiled kernels go to a private cache, not ~/.cache."""
    monkeypatch.setenv("OPFUSION_CACHE_DIR", str(tmp_path))


def _normal(shape=(3, 5), dtype="float32", seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# op name -> a float input inside its domain
_FLOAT_UNARY = {
    "negative": lambda: _normal(),
    "abs": lambda: _normal(),
    "exp": lambda: _normal(),
    "log": lambda: np.abs(_normal()) + 0.1,
    "sqrt": lambda: np.abs(_normal()),
    "rsqrt": lambda: np.abs(_normal()) + 0.1,
    "sigmoid": lambda: _normal() * 5,
    "tanh": lambda: _normal(),
    "erf": lambda: _normal(),
    "floor": lambda: _normal() * 3,
    "ceil": lambda: _normal() * 3,
    "round": lambda: _normal() * 3,
    "trunc": lambda: _normal() * 3,
    "sign": lambda: _normal(),
    "sin": lambda: _normal(),
    "cos": lambda: _normal(),
    "tan": lambda: _normal(),
    "asin": lambda: np.tanh(_normal()),
    "acos": lambda: np.tanh(_normal()),
    "atan": lambda: _normal(),
    "sinh": lambda: _normal(),
    "cosh": lambda: _normal(),
    "asinh": lambda: _normal() * 3,
    "acosh": lambda: np.abs(_normal()) * 3 + 1,
    "atanh": lambda: np.tanh(_normal()),
    "copy": lambda: _normal(),
    "nn.relu": lambda: _normal(),
    "nn.leaky_relu": lambda: _normal(),
}


def _builder(name):
    builder = opf.op
    for part in name.split("."):
        builder = getattr(builder, part)
    return builder


@pytest.mark.parametrize("name", sorted(_FLOAT_UNARY))
def test_float_unary_matches_reference(name):
    check_compute(_builder(name), _FLOAT_UNARY[name]())


@pytest.mark.parametrize("name", ["exp", "sigmoid", "tanh", "round", "asinh", "nn.relu"])
def test_float16_unary_matches_reference(name):
    check_compute(_builder(name), _FLOAT_UNARY[name]().astype("float16"), rtol=2e-3)


@pytest.mark.parametrize("name", ["exp", "sin", "abs", "negative"])
def test_float64_unary_matches_reference(name):
    check_compute(_builder(name), _FLOAT_UNARY[name]().astype("float64"), rtol=1e-12)


def test_unary_on_a_scalar():
    check_compute(opf.op.exp, np.float32(0.75))


def test_round_is_half_to_even():
    check_compute(opf.op.round, np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5], "float32"))


def test_floor_ceil_trunc_of_negative_halves():
    x = np.array([-2.5, -1.0, -0.5, 0.0, 0.5, 1.0, 2.5], "float32")
    for builder in (opf.op.floor, opf.op.ceil, opf.op.trunc):
        check_compute(builder, x)


def test_sign_keeps_zero_and_nan():
    check_compute(opf.op.sign, np.array([-3.0, -0.0, 0.0, 2.0, np.nan, -np.inf], "float32"))


def test_sigmoid_saturates_without_nan():
    check_compute(opf.op.sigmoid, np.array([-1000.0, -90.0, 0.0, 90.0, 1000.0], "float32"))


def test_inverse_hyperbolics_at_large_and_tiny_values():
    x = np.array([-1e30, -1e5, -3.0, -1e-7, 0.0, 1e-7, 3.0, 1e5, 1e30], "float32")
    check_compute(opf.op.asinh, x)
    check_compute(opf.op.acosh, np.abs(x) + 1)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_acosh_below_one_and_atanh_beyond_one_are_nan():
    check_compute(opf.op.acosh, np.array([-2.0, 0.0, 0.5, 1.0, 1.5], "float32"))
    check_compute(opf.op.atanh, np.array([-2.0, -1.0, -0.5, 0.0, 0.999, 1.0, 1.5], "float32"))


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64"])
def test_integer_unary_matches_reference(dtype):
    info = np.iinfo(dtype)
    x = np.array([info.min, info.min + 1, -7, -1, 0, 1, 9, info.max], dtype)
    for builder in (opf.op.negative, opf.op.abs, opf.op.sign, opf.op.copy, opf.op.nn.relu,
                    opf.op.bitwise_not):
        check_compute(builder, x)


@pytest.mark.parametrize("dtype", ["uint8", "uint32"])
def test_unsigned_unary_matches_reference(dtype):
    x = np.array([0, 1, 7, np.iinfo(dtype).max], dtype)
    for builder in (opf.op.negative, opf.op.sign, opf.op.bitwise_not, opf.op.abs):
        check_compute(builder, x)


def test_logical_not_and_bool_copy():
    x = np.array([[True, False, True]])
    check_compute(opf.op.logical_not, x)
    check_compute(opf.op.copy, x)


def test_isnan_and_isinf():
    x = np.array([0.0, -1.5, np.nan, np.inf, -np.inf, 3e38], "float32")
    check_compute(opf.op.isnan, x)
    check_compute(opf.op.isinf, x)


def test_clip_floats():
    check_compute(opf.op.clip, _normal(), a_min=-0.5, a_max=0.25)
    check_compute(opf.op.clip, _normal(), a_min=-np.inf, a_max=0.25)
    check_compute(opf.op.clip, np.array([np.nan, -9.0, 9.0], "float32"), a_min=-1.0, a_max=1.0)


def test_clip_integers_with_fractional_bounds_truncate():
    x = np.arange(-4, 5, dtype="int32")
    check_compute(opf.op.clip, x, a_min=-1.5, a_max=2.5)
    check_compute(opf.op.clip, x, a_min=1.5, a_max=1.75)
    check_compute(opf.op.clip, x, a_min=-2.0, a_max=np.inf)


def test_clip_unsigned_with_bounds_outside_the_dtype():
    check_compute(opf.op.clip, np.array([0, 3, 200, 255], "uint8"), a_min=-1.0, a_max=300.0)
    check_compute(opf.op.clip, np.array([0, 3, 200, 255], "uint8"), a_min=2.0, a_max=100.0)


def test_leaky_relu_alpha():
    check_compute(opf.op.nn.leaky_relu, _normal(), alpha=0.3)


@pytest.mark.parametrize("source, target", [
    ("float32", "int32"), ("float32", "int8"), ("float32", "float64"), ("float32", "float16"),
    ("float64", "float32"), ("int32", "float32"), ("int64", "int8"), ("int32", "uint8"),
    ("bool", "float32"), ("bool", "int64"), ("float32", "bool"), ("int32", "bool"),
])
def test_cast(source, target):
    x = (_normal((4, 3)) * 50).astype(source) if source != "bool" else _normal((4, 3)) > 0
    if target == "bool":
        x = x.copy()
        x[0, :2] = 0
    check_compute(opf.op.cast, x, dtype=target)


def test_cast_float_to_int_truncates_toward_zero():
    check_compute(opf.op.cast, np.array([-2.7, -0.5, 0.5, 2.7], "float32"), dtype="int32")


def test_cast_nan_to_bool_is_true():
    check_compute(opf.op.cast, np.array([np.nan, 0.0, -0.0, 2.0], "float32"), dtype="bool")


@needs_cc
@pytest.mark.parametrize("name", ["exp", "erf", "round", "sign", "asinh", "acosh", "atanh",
                                  "sigmoid", "nn.relu"])
def test_unary_compiled(name, kernel_cache):
    check_compute(_builder(name), _FLOAT_UNARY[name](), compiled=True)


@needs_cc
def test_special_values_compiled(kernel_cache):
    x = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1.5, -2.5], "float32")
    for builder in (opf.op.isnan, opf.op.isinf, opf.op.sign, opf.op.nn.relu, opf.op.round):
        check_compute(builder, x, compiled=True)
    check_compute(opf.op.clip, x, a_min=-1.0, a_max=1.0, compiled=True)
    check_compute(opf.op.cast, x[3:], dtype="int32", compiled=True)


@needs_cc
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_inverse_hyperbolics_compiled(kernel_cache):
    x = np.array([-1e30, -1e5, -3.0, -1e-7, 0.0, 1e-7, 3.0, 1e5, 1e30], "float32")
    check_compute(opf.op.asinh, x, compiled=True)
    check_compute(opf.op.acosh, np.abs(x) + 1, compiled=True)
    check_compute(opf.op.atanh, np.tanh(x * 1e6), compiled=True)
    half = np.array([-6e4, -300.0, -0.5, 0.0, 1e-3, 2.0, 300.0, 6e4], "float16")
    check_compute(opf.op.asinh, half, rtol=2e-3, compiled=True)
    check_compute(opf.op.acosh, np.abs(half) + 1, rtol=2e-3, compiled=True)


@needs_cc
def test_integer_unary_compiled(kernel_cache):
    x = np.array([-(2**31), -7, -1, 0, 9, 2**31 - 1], "int32")
    for builder in (opf.op.bitwise_not, opf.op.sign, opf.op.abs):
        check_compute(builder, x, compiled=True)
