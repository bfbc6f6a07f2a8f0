"""The TE computes of max_pool2d, avg_pool2d and the global pools agree with their NumPy
references (padding, dilation, ceil_mode, count_include_pad), run by the loop-IR interpreter."""

import numpy as np
import pytest

import opfusion as opf
from opfusion.topi.testing import check_compute

nn = opf.op.nn


def normal(*shape, dtype="float32", seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


WINDOWS = [
    {"pool_size": 2},
    {"pool_size": 2, "strides": 2},
    {"pool_size": 3, "strides": 2, "padding": 1},
    {"pool_size": 3, "strides": 2, "padding": 1, "ceil_mode": True},
    {"pool_size": (3, 2), "strides": (2, 1), "padding": (1, 0, 0, 1)},
    {"pool_size": 3, "strides": 2, "padding": (0, 1, 2, 0), "ceil_mode": True},
    {"pool_size": 2, "strides": 3, "ceil_mode": True},
    {"pool_size": 2, "dilation": 2, "padding": 1},
    {"pool_size": (2, 3), "dilation": (2, 1), "strides": 2, "padding": 1, "ceil_mode": True},
    {"pool_size": 7},
]


@pytest.mark.parametrize("attrs", WINDOWS, ids=str)
def test_max_pool2d(attrs):
    check_compute(nn.max_pool2d, normal(2, 2, 7, 8), **attrs)


@pytest.mark.parametrize("count_include_pad", [False, True])
@pytest.mark.parametrize("attrs", WINDOWS, ids=str)
def test_avg_pool2d(attrs, count_include_pad):
    check_compute(nn.avg_pool2d, normal(2, 2, 7, 8), count_include_pad=count_include_pad,
                  **attrs)


def test_max_pool2d_integers_pad_with_the_lowest_value():
    x = np.random.default_rng(1).integers(-100, -50, (1, 2, 5, 5)).astype("int32")
    check_compute(nn.max_pool2d, x, pool_size=3, strides=2, padding=1, ceil_mode=True)


def test_avg_pool2d_float64():
    check_compute(nn.avg_pool2d, normal(1, 2, 6, 6, dtype="float64"), pool_size=3,
                  padding=1, rtol=1e-12)


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (1, 2, 1, 1), (1, 1, 7, 7)])
def test_global_pools(shape):
    check_compute(nn.global_avg_pool2d, normal(*shape))
    check_compute(nn.global_max_pool2d, normal(*shape))


def test_global_max_pool2d_integers():
    x = np.random.default_rng(2).integers(-9, 9, (2, 3, 3, 4)).astype("int32")
    check_compute(nn.global_max_pool2d, x)
