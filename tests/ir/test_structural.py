"""Structural equality and hashing, with variables up to renaming."""

import numpy as np
import pytest

import opfusion as opf
from opfusion.ir import assert_structural_equal, structural_equal, structural_hash


def _graph(names=("x", "w"), scale=0.5):
    x = opf.var(names[0], (1, 4))
    w = opf.var(names[1], (1, 4))
    return opf.Function([x, w], opf.op.nn.relu(x * w) * opf.const(scale))


def test_renamed_variables_are_equal_and_hash_alike():
    a, b = _graph(("x", "w")), _graph(("p0", "p1"))
    assert structural_equal(a, b)
    assert structural_hash(a) == structural_hash(b)


def test_different_constant_is_not_equal():
    assert not structural_equal(_graph(scale=0.5), _graph(scale=0.25))


def test_swapped_parameters_are_not_equal():
    x, w = opf.var("x", (1, 4)), opf.var("w", (1, 4))
    assert not structural_equal(opf.Function([x, w], x - w), opf.Function([w, x], x - w))


def test_variables_must_correspond_one_to_one():
    x, y = opf.var("x", (2,)), opf.var("y", (2,))
    assert not structural_equal(opf.Function([x, y], x + x), opf.Function([x, y], x + y))


def test_sharing_does_not_matter():
    x = opf.var("x", (2,))
    shared = opf.op.exp(x)
    y = opf.var("y", (2,))
    assert structural_equal(opf.Function([x], shared + shared),
                            opf.Function([y], opf.op.exp(y) + opf.op.exp(y)))


def test_attributes_and_function_attrs_are_compared():
    x = opf.var("x", (3,))
    assert not structural_equal(opf.op.clip(x, a_min=0, a_max=1), opf.op.clip(x, a_min=0, a_max=2))
    f = opf.Function([x], opf.op.exp(x))
    assert not structural_equal(f, f.with_attr("Primitive", 1))


def test_modules_compare_function_by_function():
    a = opf.IRModule.from_expr(_graph())
    b = opf.IRModule.from_expr(_graph(("a", "b")))
    assert structural_equal(a, b) and structural_hash(a) == structural_hash(b)
    b["helper"] = _graph()
    assert not structural_equal(a, b)


def test_assert_structural_equal_reports_where_and_shows_a_diff():
    x = opf.var("x", (2,))
    with pytest.raises(AssertionError) as info:
        assert_structural_equal(opf.Function([x], opf.op.exp(x)), opf.Function([x], opf.op.log(x)))
    message = str(info.value)
    assert "op exp vs log" in message and "body" in message
    assert "-" in message and "+" in message


def test_nan_constants_equal_themselves():
    c = np.array([np.nan, 1.0], np.float32)
    assert structural_equal(opf.const(c), opf.const(c.copy()))


def test_wide_graph_equality_is_iterative():
    x = opf.var("x", (2,))
    y = x
    for _ in range(30000):
        y = opf.op.exp(y)
    z = opf.var("z", (2,))
    w = z
    for _ in range(30000):
        w = opf.op.exp(w)
    assert structural_equal(opf.Function([x], y), opf.Function([z], w))
    assert structural_hash(opf.Function([x], y)) == structural_hash(opf.Function([z], w))
