"""Broadcasting binary operators and where: inference (with property tests) and numbers."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis.extra import numpy as hnp

import opfusion as opf
from opfusion.ir.op import OpPatternKind, get_op
from opfusion.testing import assert_close, eval_op

rng = np.random.default_rng(1)
A = rng.standard_normal((2, 3, 4)).astype(np.float32)
B = rng.standard_normal((3, 1)).astype(np.float32)
NONZERO = np.where(np.abs(B) < 0.1, 0.5, B).astype(np.float32)


@pytest.mark.parametrize(
    "name, rhs, expected",
    [
        ("add", B, A + B),
        ("subtract", B, A - B),
        ("multiply", B, A * B),
        ("divide", NONZERO, A / NONZERO),
        ("floor_divide", NONZERO, np.floor(A / NONZERO)),
        ("mod", NONZERO, np.mod(A, NONZERO)),
        ("maximum", B, np.maximum(A, B)),
        ("minimum", B, np.minimum(A, B)),
        ("equal", B, A == B),
        ("not_equal", B, A != B),
        ("less", B, A < B),
        ("less_equal", B, A <= B),
        ("greater", B, A > B),
        ("greater_equal", B, A >= B),
    ],
)
def test_binary_matches_numpy(name, rhs, expected):
    got = eval_op(getattr(opf.op, name), A, rhs)
    want = expected if expected.dtype == bool else expected.astype(np.float32)
    assert_close(got, want)


def test_power_of_positive_base():
    base = np.abs(A) + 0.5
    assert_close(eval_op(opf.op.power, base, B), np.power(base, B))


def test_integer_division_truncates_toward_zero_like_onnx():
    lhs = np.array([7, -7, 7, -7], np.int32)
    rhs = np.array([2, 2, -2, -2], np.int32)
    assert_close(eval_op(opf.op.divide, lhs, rhs), np.array([3, -3, -3, 3], np.int32))
    assert_close(eval_op(opf.op.floor_divide, lhs, rhs), np.array([3, -4, -4, 3], np.int32))


def test_logical_ops_need_bool():
    p = np.array([True, True, False, False])
    q = np.array([True, False, True, False])
    assert_close(eval_op(opf.op.logical_and, p, q), p & q)
    assert_close(eval_op(opf.op.logical_or, p, q), p | q)
    x = opf.var("x", (4,))
    with pytest.raises(opf.OpfusionTypeError, match="logical_and: inputs must be bool"):
        _ = opf.op.logical_and(x, x).checked_type


def test_where_broadcasts_all_three_inputs():
    cond = A > 0
    got = eval_op(opf.op.where, cond, A, B)
    assert_close(got, np.where(cond, A, B))


def test_mixed_dtypes_are_an_error_that_suggests_a_cast():
    x = opf.var("x", (3,), dtype="float32")
    y = opf.var("y", (3,), dtype="float64")
    with pytest.raises(opf.OpfusionTypeError, match="lhs: float32, rhs: float64; insert a cast"):
        _ = opf.op.add(x, y).checked_type


def test_incompatible_shapes_name_the_op_and_inputs():
    x = opf.var("x", (2, 3))
    y = opf.var("y", (4, 3))
    with pytest.raises(opf.OpfusionTypeError,
                       match=r"multiply: cannot broadcast lhs \(2, 3\), rhs \(4, 3\)"):
        _ = (x * y).checked_type


def test_scalar_operands_take_the_tensor_dtype():
    x = opf.var("x", (2,), dtype="float64")
    call = x * 0.5
    assert call.args[1].data.dtype == np.float64
    assert_close(opf.ir.evaluate(opf.Function([x], 1.0 - call), [np.array([2.0, 4.0])]),
                 np.array([0.0, -1.0]))


def test_binary_ops_have_the_broadcast_pattern():
    assert all(get_op(n).pattern == OpPatternKind.kBroadcast
               for n in ["add", "subtract", "multiply", "divide", "power", "where", "less"])


# -- property tests: inference agrees with NumPy's broadcasting ---------------------------------

shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=1, max_side=4)


@given(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=5, max_side=4))
def test_broadcast_inference_matches_numpy(shapes_pair):
    (lhs, rhs), expected = shapes_pair.input_shapes, shapes_pair.result_shape
    ty = opf.op.add(opf.var("a", lhs), opf.var("b", rhs)).checked_type
    assert ty.shape == expected == np.broadcast_shapes(lhs, rhs)


@given(shapes, shapes)
def test_broadcast_inference_accepts_exactly_what_numpy_accepts(lhs, rhs):
    try:
        expected = np.broadcast_shapes(lhs, rhs)
    except ValueError:
        expected = None
    call = opf.op.maximum(opf.var("a", lhs), opf.var("b", rhs))
    if expected is None:
        with pytest.raises(opf.OpfusionTypeError, match="cannot broadcast"):
            _ = call.checked_type
    else:
        assert call.checked_type.shape == expected


@given(hnp.mutually_broadcastable_shapes(num_shapes=3, max_dims=4, max_side=3))
def test_where_inference_matches_numpy(shapes_triple):
    cond, x, y = shapes_triple.input_shapes
    call = opf.op.where(opf.var("c", cond, "bool"), opf.var("x", x), opf.var("y", y))
    assert call.checked_type.shape == shapes_triple.result_shape


@pytest.mark.parametrize("name, fn", [
    ("bitwise_and", np.bitwise_and), ("bitwise_or", np.bitwise_or),
    ("bitwise_xor", np.bitwise_xor), ("left_shift", np.left_shift),
    ("right_shift", np.right_shift),
])
def test_integer_bit_operations(name, fn):
    lhs = np.array([[1, 6, 255], [16, 3, 128]], np.uint32)
    rhs = np.array([1, 2, 3], np.uint32)
    assert_close(eval_op(getattr(opf.op, name), lhs, rhs), fn(lhs, rhs))
    with pytest.raises(opf.OpfusionTypeError, match=f"{name}: inputs must be integers"):
        _ = getattr(opf.op, name)(opf.var("x", (2,)), opf.var("y", (2,))).checked_type
