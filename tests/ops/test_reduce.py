"""Reductions: axis/keepdims/exclude inference, errors, and numbers against NumPy."""

import numpy as np
import pytest

import opfusion as opf
from opfusion.ir.op import OpPatternKind, get_op
from opfusion.testing import assert_close, eval_op

rng = np.random.default_rng(7)
X = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
INTS = rng.integers(-50, 50, size=(3, 4, 5)).astype(np.int32)

REDUCTIONS = ["sum", "mean", "max", "min", "prod", "variance"]
NUMPY = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min, "prod": np.prod,
         "variance": np.var}


def infer(name, shape, dtype="float32", **attrs):
    return getattr(opf.op, name)(opf.var("x", shape, dtype), **attrs).checked_type


def expected(name, data, axis, keepdims):
    want = NUMPY[name](data.astype(np.float64), axis=axis, keepdims=keepdims)
    return np.asarray(want).astype(data.dtype)


# -- inference -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", REDUCTIONS)
@pytest.mark.parametrize(
    "attrs, shape",
    [
        ({}, ()),
        ({"axis": None, "keepdims": True}, (1, 1, 1, 1)),
        ({"axis": 1}, (2, 4, 5)),
        ({"axis": (1, -1), "keepdims": True}, (2, 1, 4, 1)),
        ({"axis": (1, 3), "exclude": True}, (3, 5)),
        ({"axis": (0,), "exclude": True, "keepdims": True}, (2, 1, 1, 1)),
        ({"axis": ()}, (2, 3, 4, 5)),
        ({"axis": None, "exclude": True}, ()),  # TVM: exclude means nothing without axes
    ],
)
def test_reduction_shapes(name, attrs, shape):
    assert infer(name, (2, 3, 4, 5), **attrs) == opf.TensorType(shape, "float32")


@pytest.mark.parametrize("name", ["sum", "max", "min", "prod"])
def test_integer_reductions_keep_the_dtype(name):
    assert infer(name, (3, 4), "int32", axis=0).dtype == "int32"
    assert infer(name, (3, 4), "uint8", axis=0).dtype == "uint8"


@pytest.mark.parametrize("name", ["argmax", "argmin"])
@pytest.mark.parametrize(
    "attrs, shape",
    [({}, ()), ({"keepdims": True}, (1, 1, 1)), ({"axis": 1}, (2, 4)),
     ({"axis": -1, "keepdims": True}, (2, 3, 1)), ({"axis": [0]}, (3, 4))],
)
def test_arg_reduction_shapes_are_int64(name, attrs, shape):
    assert infer(name, (2, 3, 4), **attrs) == opf.TensorType(shape, "int64")
    assert infer(name, (2, 3, 4), "int8", **attrs).dtype == "int64"


def test_reductions_are_comm_reduce():
    for name in [*REDUCTIONS, "argmax", "argmin"]:
        assert get_op(name).pattern == OpPatternKind.kCommReduce


# -- errors ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [*REDUCTIONS, "argmax", "argmin"])
def test_axis_out_of_range_names_op_and_attribute(name):
    with pytest.raises(opf.OpfusionTypeError, match=rf"^{name}: attribute 'axis'=3 is out of "
                                                    "range for a tensor of rank 3"):
        infer(name, (2, 3, 4), axis=3)


def test_repeated_axis_is_an_error():
    with pytest.raises(opf.OpfusionTypeError, match=r"sum: attribute 'axis'=\(1, -2\) repeats"):
        infer("sum", (2, 3, 4), axis=(1, -2))


@pytest.mark.parametrize("name", ["max", "min", "argmax", "argmin"])
def test_reducing_nothing_without_an_identity_is_an_error(name):
    with pytest.raises(opf.OpfusionTypeError,
                       match=rf"^{name}: attribute 'axis'=\(1,\) reduces zero elements of data "
                             rf"\(3, 0\), and the {name} of nothing is undefined"):
        infer(name, (3, 0), axis=1)
    with pytest.raises(opf.OpfusionTypeError, match=f"^{name}: .*zero elements"):
        infer(name, (3, 0))
    assert infer(name, (3, 0), axis=0).shape == (0,)  # nothing empty is reduced


@pytest.mark.parametrize("name", ["mean", "variance"])
def test_mean_and_variance_need_floats(name):
    with pytest.raises(opf.OpfusionTypeError,
                       match=f"^{name}: input 'data' must be floating point, got int32"):
        infer(name, (3,), "int32")


@pytest.mark.parametrize("name", ["sum", "max", "argmax"])
def test_bool_data_is_rejected(name):
    with pytest.raises(opf.OpfusionTypeError, match=f"^{name}: input 'data' is bool; cast"):
        infer(name, (3,), "bool")


@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_arg_reductions_take_one_axis(name):
    with pytest.raises(opf.OpfusionTypeError,
                       match=rf"^{name}: attribute 'axis'=\(0, 1\) must name exactly one axis"):
        infer(name, (2, 3), axis=(0, 1))
    with pytest.raises(opf.OpfusionTypeError, match="must name exactly one axis"):
        infer(name, (2, 3), axis=())


def test_bad_attribute_values_name_the_attribute():
    with pytest.raises(opf.OpAttributeError, match="sum attribute 'keepdims' must be a boolean"):
        infer("sum", (2,), keepdims="yes")
    with pytest.raises(opf.OpAttributeError, match="sum attribute 'axis' must be an integer"):
        infer("sum", (2,), axis=[0.5])
    with pytest.raises(opf.OpAttributeError, match="variance: unknown attribute 'unbiassed'; "
                                                   "did you mean 'unbiased'"):
        infer("variance", (2,), unbiassed=True)


# -- numbers ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["sum", "mean", "max", "min", "variance"])
@pytest.mark.parametrize("axis", [None, 0, (1, 3), (-1,), ()])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions_match_numpy(name, axis, keepdims):
    got = eval_op(getattr(opf.op, name), X, axis=axis, keepdims=keepdims)
    assert_close(got, expected(name, X, axis, keepdims))


def test_prod_matches_numpy():
    data = (1.0 + 0.1 * X).astype(np.float32)  # near 1, so products neither vanish nor blow up
    for axis in [None, 2, (0, 1)]:
        assert_close(eval_op(opf.op.prod, data, axis=axis), expected("prod", data, axis, False))


def test_exclude_reduces_the_other_axes():
    got = eval_op(opf.op.sum, X, axis=(0, 2), exclude=True, keepdims=True)
    assert_close(got, expected("sum", X, (1, 3), True))


def test_unbiased_variance_divides_by_n_minus_1():
    got = eval_op(opf.op.variance, X, axis=(0, 2), unbiased=True)
    want = np.var(X.astype(np.float64), axis=(0, 2), ddof=1).astype(np.float32)
    assert_close(got, want)


def test_variance_of_offset_data_does_not_cancel():
    data = (1000.0 + X).astype(np.float32)
    got = eval_op(opf.op.variance, data, axis=1)
    assert_close(got, np.var(data.astype(np.float64), axis=1).astype(np.float32), rtol=1e-4)


@pytest.mark.parametrize("name", ["sum", "max", "min", "prod"])
def test_integer_reductions_are_exact(name):
    got = eval_op(getattr(opf.op, name), INTS, axis=(0, 2))
    want = NUMPY[name](INTS.astype(np.int64), axis=(0, 2)).astype(np.int32)
    assert_close(got, want)


def test_integer_sum_wraps_in_the_input_dtype():
    data = np.full((4,), 100, np.int8)
    assert_close(eval_op(opf.op.sum, data), np.array(400 - 512, np.int8))  # 400 mod 256, signed


def test_sum_of_an_empty_axis_is_zero_and_mean_is_nan():
    empty = np.zeros((3, 0), np.float32)
    assert_close(eval_op(opf.op.sum, empty, axis=1), np.zeros(3, np.float32))
    assert_close(eval_op(opf.op.prod, empty, axis=1), np.ones(3, np.float32))
    assert np.isnan(eval_op(opf.op.mean, empty, axis=1)).all()


@pytest.mark.parametrize("name, find", [("argmax", np.argmax), ("argmin", np.argmin)])
@pytest.mark.parametrize("axis", [0, 2, -1])
@pytest.mark.parametrize("keepdims", [False, True])
def test_arg_reductions_match_numpy(name, find, axis, keepdims):
    got = eval_op(getattr(opf.op, name), X, axis=axis, keepdims=keepdims)
    assert_close(got, find(X, axis=axis, keepdims=keepdims).astype(np.int64))


@pytest.mark.parametrize("name, find", [("argmax", np.argmax), ("argmin", np.argmin)])
def test_arg_reduction_of_the_flattened_tensor(name, find):
    assert_close(eval_op(getattr(opf.op, name), X), np.array(find(X), np.int64))
    got = eval_op(getattr(opf.op, name), X, keepdims=True)
    assert_close(got, np.full((1, 1, 1, 1), find(X), np.int64))


def test_arg_reduction_ties_take_the_first_or_last_index():
    data = np.array([[1, 3, 3, 0], [2, 2, 2, 2], [0, 0, 5, 0]], np.float32)
    assert_close(eval_op(opf.op.argmax, data, axis=1), np.array([1, 0, 2], np.int64))
    assert_close(eval_op(opf.op.argmax, data, axis=1, select_last_index=True),
                 np.array([2, 3, 2], np.int64))
    assert_close(eval_op(opf.op.argmin, data, axis=1, select_last_index=True),
                 np.array([3, 3, 3], np.int64))
    assert_close(eval_op(opf.op.argmin, data, axis=0, select_last_index=True, keepdims=True),
                 np.array([[2, 2, 1, 2]], np.int64))
    assert_close(eval_op(opf.op.argmax, data, select_last_index=True), np.array(10, np.int64))
    assert_close(eval_op(opf.op.argmax, data), np.array(10, np.int64))
    assert_close(eval_op(opf.op.argmin, data, select_last_index=True), np.array(11, np.int64))
