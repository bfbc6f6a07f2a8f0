"""The TE computes of the reductions agree with their NumPy references."""

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


def _normal(shape=(2, 3, 4), dtype="float32", seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


_AXES = [
    {},
    {"axis": [1]},
    {"axis": [-1, 0]},
    {"axis": [0], "keepdims": True},
    {"axis": [2, 1], "keepdims": True},
    {"axis": [1], "exclude": True},
    {"axis": [0, 2], "exclude": True, "keepdims": True},
    {"axis": []},
    {"keepdims": True},
]


@pytest.mark.parametrize("name", ["sum", "prod", "max", "min", "mean", "variance"])
@pytest.mark.parametrize("attrs", _AXES, ids=str)
def test_float_reductions(name, attrs):
    check_compute(getattr(opf.op, name), _normal(), **attrs)


@pytest.mark.parametrize("name", ["sum", "prod", "max", "min"])
@pytest.mark.parametrize("dtype", ["int32", "int8", "uint8"])
def test_integer_reductions(name, dtype):
    x = np.random.default_rng(1).integers(0 if dtype == "uint8" else -5, 6, (3, 4)).astype(dtype)
    check_compute(getattr(opf.op, name), x, axis=[1])
    check_compute(getattr(opf.op, name), x, keepdims=True)


def test_integer_sum_wraps_like_the_reference():
    check_compute(opf.op.sum, np.full((2, 40), 100, "int8"), axis=[1])


def test_variance_unbiased():
    check_compute(opf.op.variance, _normal(), axis=[2], unbiased=True)
    check_compute(opf.op.variance, _normal() + 1000.0, axis=[0, 1], unbiased=True, rtol=1e-4)


@pytest.mark.parametrize("name", ["sum", "mean", "variance", "prod", "max"])
def test_float16_reductions_accumulate_widely(name):
    check_compute(getattr(opf.op, name), _normal((3, 16), "float16"), axis=[1], rtol=2e-3)


def test_float64_sum():
    check_compute(opf.op.sum, _normal(dtype="float64"), axis=[1], rtol=1e-12)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_reductions_over_empty_axes():
    empty = np.zeros((2, 0, 3), "float32")
    check_compute(opf.op.sum, empty, axis=[1])
    check_compute(opf.op.prod, empty, axis=[1])
    check_compute(opf.op.mean, empty, axis=[1])


def test_reduction_of_a_scalar():
    check_compute(opf.op.sum, np.float32(2.5))
    check_compute(opf.op.argmax, np.float32(2.5))


@pytest.mark.parametrize("name", ["argmax", "argmin"])
@pytest.mark.parametrize("attrs", [{}, {"keepdims": True}, {"axis": [1]}, {"axis": [-1]},
                                   {"axis": [0], "keepdims": True},
                                   {"select_last_index": True},
                                   {"axis": [2], "select_last_index": True, "keepdims": True}],
                         ids=str)
def test_arg_reductions(name, attrs):
    check_compute(getattr(opf.op, name), _normal(), **attrs)


@pytest.mark.parametrize("name", ["argmax", "argmin"])
@pytest.mark.parametrize("last", [False, True])
def test_arg_reductions_break_ties_by_index(name, last):
    x = np.random.default_rng(2).integers(0, 3, (3, 4, 5)).astype("int32")
    check_compute(getattr(opf.op, name), x, axis=[1], select_last_index=last)
    check_compute(getattr(opf.op, name), x, select_last_index=last)


@needs_cc
def test_reductions_compiled(kernel_cache):
    x = _normal((3, 4, 5))
    for name in ["sum", "mean", "variance", "max", "argmax", "argmin"]:
        check_compute(getattr(opf.op, name), x, axis=[1], compiled=True)
    check_compute(opf.op.prod, x, axis=[0, 2], keepdims=True, compiled=True)
    check_compute(opf.op.min, x, compiled=True)


@needs_cc
def test_max_min_and_arg_reductions_see_nan_compiled(kernel_cache):
    x = _normal((3, 5))
    x[0, 2] = x[0, 4] = np.nan
    x[2, 0] = np.nan
    for name in ["max", "min", "argmax", "argmin"]:
        check_compute(getattr(opf.op, name), x, axis=[1], compiled=True)
    check_compute(opf.op.argmax, x, axis=[1], select_last_index=True, compiled=True)
    check_compute(opf.op.argmin, x, compiled=True)


@needs_cc
@pytest.mark.parametrize("shape,attrs", [((128, 768), {}), ((3, 47), {"axis": [1]}),
                                         ((5, 32), {"axis": [1], "keepdims": True}),
                                         ((4, 40, 33), {"axis": [0, 2]}),
                                         ((2, 100), {"axis": [1]})], ids=str)
def test_max_and_min_along_memory_in_lanes_compiled(kernel_cache, shape, attrs):
    """Reduced along the innermost axis, max and min take the blocked sums' interleaved
    lanes (and a tail); NaN anywhere (in a lane, in the tail) and -inf/+inf still win."""
    x = _normal(shape, seed=3)
    flat = x.reshape(-1, shape[-1])
    flat[0, 1] = np.nan              # in a lane
    flat[-1, shape[-1] - 1] = np.nan  # in the tail, if there is one
    flat[1 % flat.shape[0], 0] = np.inf
    flat[1 % flat.shape[0], 2] = -np.inf
    for name in ["max", "min"]:
        check_compute(getattr(opf.op, name), x, compiled=True, **attrs)
        check_compute(getattr(opf.op, name), np.abs(_normal(shape, seed=4)), compiled=True,
                      **attrs)
