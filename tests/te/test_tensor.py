"""Tensors and operations: placeholder, compute, reductions, the read graph and its order."""

import pytest

from opfusion import te
from opfusion.errors import TensorExprError
from opfusion.tir import expr as E


def test_placeholder_has_shape_dtype_and_op():
    a = te.placeholder((3, 4), dtype="float64", name="A")
    assert a.shape == (3, 4) and a.dtype == "float64" and a.name == "A"
    assert isinstance(a.op, te.PlaceholderOp) and a.op.output(0) is a


def test_compute_names_axes_after_the_lambda_parameters():
    a = te.placeholder((3, 4), name="A")
    b = te.compute(a.shape, lambda x, y: a[x, y] * 2.0, name="B")
    assert [iv.name for iv in b.op.axis] == ["x", "y"]
    assert [iv.dom.extent for iv in b.op.axis] == [3, 4]
    assert b.op.input_tensors == [a]
    assert str(b.op.body) == "A[x, y]*2.0f"


def test_compute_builds_tensor_loads_with_operator_overloading():
    a = te.placeholder((8,), name="A")
    b = te.placeholder((8,), name="B")
    c = te.compute(a.shape, lambda i: a[i] + b[i], name="C")
    body = c.op.body
    assert isinstance(body, E.Add)
    assert isinstance(body.a, te.TensorLoad) and body.a.tensor is a
    assert c.op.input_tensors == [a, b]


def test_reduction_compute_has_reduce_axis():
    a = te.placeholder((4, 5), name="A")
    k = te.reduce_axis((0, 5), name="k")
    c = te.compute((4,), lambda i: te.sum(a[i, k], axis=k), name="C")
    assert c.op.reduce_axis == (k,)
    assert str(c.op.body) == "sum(A[i, k], axis=[k])"


def test_reduction_must_be_the_whole_body():
    a = te.placeholder((4, 5), name="A")
    k = te.reduce_axis((0, 5), name="k")
    with pytest.raises(TensorExprError, match="whole body"):
        te.compute((4,), lambda i: te.sum(a[i, k], axis=k) * 2.0, name="C")


def test_reduction_axis_must_be_listed():
    a = te.placeholder((4, 5), name="A")
    k = te.reduce_axis((0, 5), name="k")
    with pytest.raises(TensorExprError, match="neither an index"):
        te.compute((4,), lambda i: a[i, k], name="C")


def test_reducer_with_two_values_combines_elementwise():
    a = te.placeholder((4,), name="A")
    relu = te.compute(a.shape, lambda i: te.max(a[i], 0.0), name="relu")
    assert isinstance(relu.op.body, E.Max)


def test_reducer_without_axis_is_an_error():
    a = te.placeholder((4,), name="A")
    with pytest.raises(TensorExprError, match="axis"):
        te.sum(a[0])


def test_reducer_rejects_data_axis():
    a = te.placeholder((4,), name="A")
    b = te.compute(a.shape, lambda i: a[i], name="B")
    with pytest.raises(TensorExprError, match="not a reduction axis"):
        te.sum(a[0], axis=b.op.axis[0])


def test_comm_reducer_makes_a_custom_reduction():
    product = te.comm_reducer(lambda x, y: x * y, lambda t: te.const(1, t), name="product")
    a = te.placeholder((4, 5), name="A")
    k = te.reduce_axis((0, 5), name="k")
    c = te.compute((4,), lambda i: product(a[i, k], axis=k), name="C")
    assert c.op.body.combiner.name == "product"
    assert c.op.body.combiner.identity.value == 1.0


def test_compute_arity_must_match_shape():
    a = te.placeholder((3, 4), name="A")
    with pytest.raises(TensorExprError, match="2 dimension"):
        te.compute(a.shape, lambda i: a[i, 0], name="B")


def test_indexing_with_wrong_rank_is_an_error():
    a = te.placeholder((3, 4), name="A")
    with pytest.raises(TensorExprError, match="indexed with 1"):
        te.compute((3,), lambda i: a[i], name="B")


def test_slices_are_refused():
    a = te.placeholder((3, 4), name="A")
    with pytest.raises(TensorExprError, match="slice"):
        _ = a[0:2, 1]


def test_float_index_is_an_error():
    a = te.placeholder((3,), name="A")
    b = te.placeholder((3,), name="B")
    with pytest.raises(TensorExprError, match="indices are ints"):
        te.compute((3,), lambda i: a[b[i]], name="C")


def test_symbolic_shape_is_refused_clearly():
    n = te.var("n")
    with pytest.raises(TensorExprError, match="symbolic"):
        te.placeholder((n,), name="A")


def test_math_intrinsics_and_helpers():
    a = te.placeholder((4,), name="A")
    b = te.compute(a.shape, lambda i: te.exp(a[i]) + te.sigmoid(a[i]) + te.power(a[i], 2.0),
                   name="B")
    text = str(b.op.body)
    assert "exp(A[i])" in text and "pow(A[i], 2.0f)" in text
    c = te.compute(a.shape, lambda i: te.if_then_else(i > 0, a[i - 1], 0.0), name="C")
    assert isinstance(c.op.body, E.Select)
    with pytest.raises(TensorExprError, match="cast"):
        te.compute((4,), lambda i: te.exp(i), name="D")


def test_max_and_min_value():
    assert te.max_value("int8").value == 127
    assert te.min_value("float32").value < -3e38


def test_post_dfs_order_puts_producers_first():
    a = te.placeholder((4,), name="A")
    b = te.compute(a.shape, lambda i: a[i] + 1.0, name="B")
    c = te.compute(a.shape, lambda i: a[i] * 2.0, name="C")
    d = te.compute(a.shape, lambda i: b[i] + c[i], name="D")
    assert [op.name for op in te.post_dfs_order(d.op)] == ["A", "B", "C", "D"]
    graph = te.read_graph(d)
    assert [t.name for t in graph[d.op]] == ["B", "C"]
    assert graph[a.op] == []


def test_post_dfs_order_is_iterative_on_long_chains():
    t = te.placeholder((2,), name="A")
    for n in range(3000):
        prev = t
        t = te.compute((2,), lambda i, p=prev: p[i] + 1.0, name=f"T{n}")
    order = te.post_dfs_order(t.op)
    assert len(order) == 3001 and order[0].name == "A"
