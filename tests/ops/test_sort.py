"""sort, argsort, topk and cumsum: inference, errors, stability of ties, and numbers against
NumPy and onnx.reference (TopK, CumSum)."""

import numpy as np
import pytest

import opfusion as opf
from opfusion.ir.op import OpPatternKind, get_op
from opfusion.testing import assert_close, eval_op
from opfusion.testing import run_onnx_node as onnx_run

rng = np.random.default_rng(3)
X = rng.standard_normal((3, 4, 6)).astype(np.float32)
# Few distinct values, so that every row has ties.
TIES = rng.integers(0, 3, size=(4, 7)).astype(np.float32)


def infer(name, data_shape, data_dtype="float32", **attrs):
    return getattr(opf.op, name)(opf.var("x", data_shape, data_dtype), **attrs).checked_type


def order_by_rule(row, ascending):
    """Indices of a 1-D row sorted by value, ties by the lower index: the rule itself."""
    sign = 1 if ascending else -1
    return sorted(range(len(row)), key=lambda i: (sign * row[i], i))


def rowwise(data, fn):
    """Apply a 1-D function along the last axis."""
    flat = data.reshape(-1, data.shape[-1])
    return np.array([fn(row) for row in flat]).reshape(data.shape[:-1] + (-1,))


def test_patterns_are_opaque():
    assert all(get_op(name).pattern == OpPatternKind.kOpaque
               for name in ["sort", "argsort", "topk", "cumsum"])


# -- sort and argsort ------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, -1])
def test_sort_matches_numpy(axis):
    assert infer("sort", X.shape, axis=axis) == opf.TensorType(X.shape, "float32")
    assert_close(eval_op(opf.op.sort, X, axis=axis), np.sort(X, axis=axis))
    descending = np.flip(np.sort(X, axis=axis), axis=axis)
    assert_close(eval_op(opf.op.sort, X, axis=axis, is_ascend=False), descending)


def test_sort_integers_including_extremes():
    data = np.array([[3, -128, 127, 0, -1]], np.int8)
    assert_close(eval_op(opf.op.sort, data, is_ascend=False),
                 np.array([[127, 3, 0, -1, -128]], np.int8))
    unsigned = np.array([0, 255, 7], np.uint8)
    assert_close(eval_op(opf.op.sort, unsigned, is_ascend=False),
                 np.array([255, 7, 0], np.uint8))


@pytest.mark.parametrize("ascending", [True, False])
def test_argsort_is_stable_in_both_directions(ascending):
    got = eval_op(opf.op.argsort, TIES, is_ascend=ascending)
    want = rowwise(TIES, lambda row: order_by_rule(row, ascending)).astype(np.int64)
    assert_close(got, want)


def test_argsort_along_a_leading_axis_and_dtype():
    assert infer("argsort", X.shape, axis=0, dtype="int32") == opf.TensorType(X.shape, "int32")
    got = eval_op(opf.op.argsort, X, axis=0, dtype="int32")
    assert_close(got, np.argsort(X, axis=0, kind="stable").astype(np.int32))


@pytest.mark.parametrize("name", ["sort", "argsort", "topk", "cumsum"])
def test_axis_out_of_range(name):
    with pytest.raises(opf.OpfusionTypeError, match=f"^{name}: attribute 'axis'=3 is out of "
                                                    "range for a tensor of rank 3"):
        infer(name, X.shape, axis=3)


def test_argsort_and_topk_need_an_integer_index_dtype():
    for name in ["argsort", "topk"]:
        with pytest.raises(opf.OpfusionTypeError, match=f"^{name}: attribute 'dtype'=float32 "
                                                        "must be an integer type"):
            _ = getattr(opf.op, name)(opf.var("x", X.shape), dtype="float32").checked_type


# -- topk ------------------------------------------------------------------------------------

def test_topk_types():
    both = infer("topk", (3, 4, 6), k=2, axis=1)
    assert both == opf.TupleType([opf.TensorType((3, 2, 6), "float32"),
                                  opf.TensorType((3, 2, 6), "int64")])
    assert infer("topk", (3, 4, 6), k=6, ret_type="values") == opf.TensorType((3, 4, 6))
    assert infer("topk", (5,), ret_type="indices", dtype="int32") == opf.TensorType((1,), "int32")


@pytest.mark.parametrize("k", [0, 7, -1])
def test_topk_k_must_fit_the_axis(k):
    with pytest.raises(opf.OpfusionTypeError, match=rf"^topk: attribute 'k'={k} must be in 1..6, "
                                                    r"the size of axis 2 of data \(3, 4, 6\)"):
        infer("topk", X.shape, k=k)


def test_topk_bad_ret_type():
    with pytest.raises(opf.OpAttributeError, match="topk attribute 'ret_type' must be one of"):
        infer("topk", X.shape, ret_type="all")


@pytest.mark.parametrize("ascending", [False, True])
@pytest.mark.parametrize("k", [1, 3, 7])
def test_topk_ties_go_to_the_lower_index(ascending, k):
    values, indices = eval_op(opf.op.topk, TIES, k=k, is_ascend=ascending)
    want = rowwise(TIES, lambda row: order_by_rule(row, ascending)[:k]).astype(np.int64)
    assert_close(indices, want)
    assert_close(values, np.take_along_axis(TIES, want, axis=-1))
    onnx_values, onnx_indices = onnx_run("TopK", {"x": TIES, "k": np.array([k], np.int64)},
                                         num_outputs=2, largest=int(not ascending), axis=-1)
    assert_close(values, onnx_values)
    assert_close(indices, onnx_indices)


@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("largest", [True, False])
def test_topk_matches_onnx_along_each_axis(axis, largest):
    k = 2
    got = eval_op(opf.op.topk, X, k=k, axis=axis, is_ascend=not largest)
    onnx_values, onnx_indices = onnx_run("TopK", {"x": X, "k": np.array([k], np.int64)},
                                         num_outputs=2, largest=int(largest), axis=axis)
    assert_close(got, (onnx_values, onnx_indices))
    order = np.argsort(-X if largest else X, axis=axis, kind="stable")
    assert_close(got[1], np.take(order, range(k), axis=axis).astype(np.int64))


def test_topk_single_outputs():
    values = eval_op(opf.op.topk, X, k=3, ret_type="values")
    assert_close(values, -np.sort(-X, axis=-1)[..., :3])
    indices = eval_op(opf.op.topk, X, k=3, ret_type="indices", dtype="int32")
    assert_close(indices, np.argsort(-X, axis=-1, kind="stable")[..., :3].astype(np.int32))


# -- cumsum ----------------------------------------------------------------------------------

def cumsum_by_rule(data, axis, exclusive, reverse):
    data = np.moveaxis(data.astype(np.float64), axis, -1)
    out = np.zeros_like(data)
    n = data.shape[-1]
    for i in range(n):
        js = range(i, n) if reverse else range(i + 1)
        js = [j for j in js if not (exclusive and j == i)]
        out[..., i] = data[..., js].sum(axis=-1)
    return np.moveaxis(out, -1, axis).astype(np.float32)


def test_cumsum_types():
    assert infer("cumsum", (3, 4), axis=1) == opf.TensorType((3, 4))
    assert infer("cumsum", (3, 4)) == opf.TensorType((12,))
    assert infer("cumsum", (3, 4), "int32", axis=0, dtype="int64").dtype == "int64"
    with pytest.raises(opf.OpfusionTypeError, match="^cumsum: cannot sum bool values; cast"):
        infer("cumsum", (3,), "bool")


@pytest.mark.parametrize("axis", [0, 2, -2])
@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
def test_cumsum_matches_the_rule_and_onnx(axis, exclusive, reverse):
    got = eval_op(opf.op.cumsum, X, axis=axis, exclusive=exclusive, reverse=reverse)
    assert_close(got, cumsum_by_rule(X, axis % 3, exclusive, reverse))
    (want,) = onnx_run("CumSum", {"x": X, "axis": np.array(axis, np.int64)},
                       exclusive=int(exclusive), reverse=int(reverse))
    assert_close(got, want)


def test_cumsum_of_the_flattened_tensor_and_integers():
    assert_close(eval_op(opf.op.cumsum, X), np.cumsum(X.astype(np.float64)).astype(np.float32))
    ints = np.array([[1, 2, 3], [4, 5, 6]], np.int32)
    assert_close(eval_op(opf.op.cumsum, ints, axis=1, exclusive=True),
                 np.array([[0, 1, 3], [0, 4, 9]], np.int32))
    assert_close(eval_op(opf.op.cumsum, ints, axis=0, dtype="float32"),
                 np.array([[1, 2, 3], [5, 7, 9]], np.float32))
    empty = np.zeros((2, 0), np.float32)
    assert_close(eval_op(opf.op.cumsum, empty, axis=1, exclusive=True), empty)
