"""Shape and indexing transforms: inference (with property tests against NumPy), errors, and
numbers against NumPy and, for the ONNX-defined ones, onnx.reference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import opfusion as opf
from opfusion.ir.op import OpPatternKind, get_op
from opfusion.testing import assert_close, eval_op
from opfusion.testing import run_onnx_node as onnx_run

rng = np.random.default_rng(11)
X = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)


def infer(name, data_shape, dtype="float32", **attrs):
    return getattr(opf.op, name)(opf.var("x", data_shape, dtype), **attrs).checked_type


def test_pattern_kinds():
    injective = ["reshape", "transpose", "squeeze", "expand_dims", "flatten", "concatenate",
                 "split", "strided_slice", "take", "gather_elements", "tile", "arange",
                 "depth_to_space", "space_to_depth", "reverse"]
    assert all(get_op(name).pattern == OpPatternKind.kInjective for name in injective)
    assert get_op("broadcast_to").pattern == OpPatternKind.kBroadcast


# -- reshape ---------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "shape, newshape, expected",
    [
        ((2, 3, 4), (6, 4), (6, 4)),
        ((2, 3, 4), (0, -1), (2, 12)),
        ((2, 3, 4), (-1,), (24,)),
        ((2, 3, 4), (0, 0, -1, 1), (2, 3, 4, 1)),
        ((2, 3, 4), (4, -1, 2), (4, 3, 2)),
        ((1, 1), (), ()),
        ((), (1, -1), (1, 1)),
        ((2, 0), (-1, 5), (0, 5)),
    ],
)
def test_reshape_shapes(shape, newshape, expected):
    assert infer("reshape", shape, "int8", newshape=newshape) == opf.TensorType(expected, "int8")


@pytest.mark.parametrize(
    "newshape, message",
    [
        ((4, 2), r"cannot reshape data \(2, 3, 4\) \(24 elements\) to 'newshape'=\(4, 2\) "
                 r"\(= \(4, 2\), 8 elements\)"),
        ((5, -1), r"cannot reshape data \(2, 3, 4\) \(24 elements\) to 'newshape'=\(5, -1\)"),
        ((-1, -1), r"'newshape'=\(-1, -1\) has more than one -1"),
        ((0, 0, 0, 0), r"'newshape'=\(0, 0, 0, 0\) has 0 at position 3, which copies a "
                       r"dimension that data \(2, 3, 4\) does not have"),
        ((-2, 12), r"'newshape'=\(-2, 12\) has -2"),
    ],
)
def test_reshape_errors_name_both_shapes(newshape, message):
    with pytest.raises(opf.OpfusionTypeError, match="^reshape: (attribute )?" + message):
        infer("reshape", (2, 3, 4), newshape=newshape)


def test_reshape_cannot_infer_next_to_a_zero_size():
    with pytest.raises(opf.OpfusionTypeError, match="-1 cannot be inferred"):
        infer("reshape", (0, 3), newshape=(0, -1))


def test_reshape_requires_newshape():
    with pytest.raises(opf.OpAttributeError, match="reshape: attribute 'newshape' is required"):
        infer("reshape", (2,))


@pytest.mark.parametrize("newshape", [(0, -1, 5), (0, 0, 20), (-1, 4, 5), (6, 20), (0, 3, 0, 5)])
def test_reshape_matches_numpy_and_onnx(newshape):
    got = eval_op(opf.op.reshape, X, newshape=newshape)
    resolved = [X.shape[i] if d == 0 else d for i, d in enumerate(newshape)]
    assert_close(got, X.reshape(resolved))
    (want,) = onnx_run("Reshape", {"data": X, "shape": np.array(newshape, np.int64)})
    assert_close(got, want)


@st.composite
def regroupings(draw):
    """A shape and a new shape with the same number of elements, using 0 and -1."""
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=1, max_side=4))
    factors = [d for d in shape if d > 1]
    factors = draw(st.permutations(factors))
    cuts = sorted(draw(st.lists(st.integers(0, len(factors)), max_size=3)))
    bounds = [0, *cuts, len(factors)]
    newshape = [int(np.prod(factors[a:b], dtype=np.int64)) for a, b in zip(bounds, bounds[1:])]
    for index in draw(st.lists(st.integers(0, len(newshape) - 1), max_size=2)):
        if index < len(shape) and newshape[index] == shape[index]:
            newshape[index] = 0
    if newshape and draw(st.booleans()):
        newshape[draw(st.integers(0, len(newshape) - 1))] = -1
    return shape, tuple(newshape)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(regroupings())
def test_reshape_inference_matches_numpy(case):
    shape, newshape = case
    resolved = [shape[i] if d == 0 else d for i, d in enumerate(newshape)]
    assert infer("reshape", shape, newshape=newshape).shape == np.empty(shape).reshape(
        resolved).shape


@settings(max_examples=60, deadline=None, derandomize=True)
@given(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
       st.lists(st.integers(-1, 5), max_size=3))
def test_reshape_accepts_exactly_what_numpy_accepts(shape, newshape):
    call = opf.op.reshape(opf.var("x", shape), newshape=newshape)
    try:
        resolved = [shape[i] if d == 0 else d for i, d in enumerate(newshape)]
        expected = np.empty(shape).reshape(resolved).shape
    except (IndexError, ValueError):
        with pytest.raises(opf.OpfusionTypeError, match="^reshape: "):
            _ = call.checked_type
    else:
        assert call.checked_type.shape == expected


# -- transpose, squeeze, expand_dims, flatten, reverse ---------------------------------------

def test_transpose_shapes_and_numbers():
    assert infer("transpose", (2, 3, 4)).shape == (4, 3, 2)
    assert infer("transpose", (2, 3, 4), axes=(1, -1, 0)).shape == (3, 4, 2)
    assert infer("transpose", ()).shape == ()
    assert_close(eval_op(opf.op.transpose, X), X.T)
    assert_close(eval_op(opf.op.transpose, X, axes=(2, 0, 3, 1)), X.transpose(2, 0, 3, 1))


@pytest.mark.parametrize(
    "axes, message",
    [((0, 1), r"'axes'=\(0, 1\) has 2 entries but data has rank 3; give a permutation of "
              r"0..2"),
     ((0, 1, 1), r"'axes'=\(0, 1, 1\) repeats an axis"),
     ((0, 1, 3), r"'axes'=3 is out of range")],
)
def test_transpose_needs_a_permutation(axes, message):
    with pytest.raises(opf.OpfusionTypeError, match="^transpose: attribute " + message):
        infer("transpose", (2, 3, 4), axes=axes)


@settings(max_examples=50, deadline=None, derandomize=True)
@given(st.data())
def test_transpose_inference_matches_numpy(data):
    shape = data.draw(hnp.array_shapes(min_dims=0, max_dims=5, min_side=1, max_side=5))
    perm = data.draw(st.permutations(range(len(shape))))
    signs = data.draw(st.lists(st.booleans(), min_size=len(shape), max_size=len(shape)))
    axes = [a - len(shape) if neg else a for a, neg in zip(perm, signs)]
    want = np.empty(shape).transpose(perm).shape
    assert infer("transpose", shape, axes=axes).shape == want


def test_squeeze():
    assert infer("squeeze", (1, 3, 1, 2)).shape == (3, 2)
    assert infer("squeeze", (1, 3, 1, 2), axis=[-2]).shape == (1, 3, 2)
    assert infer("squeeze", (1, 3, 1, 2), axis=[]).shape == (1, 3, 1, 2)
    data = X.reshape(2, 1, 3, 1, 20)
    assert_close(eval_op(opf.op.squeeze, data), np.squeeze(data))
    assert_close(eval_op(opf.op.squeeze, data, axis=(3,)), np.squeeze(data, 3))
    with pytest.raises(opf.OpfusionTypeError,
                       match=r"^squeeze: attribute 'axis'=\(1,\) names axis 1 of data "
                             r"\(1, 3, 1\), which has size 3; only size-1 axes"):
        infer("squeeze", (1, 3, 1), axis=1)


@pytest.mark.parametrize(
    "axis, num, expected",
    [(0, 1, (1, 2, 3)), (2, 1, (2, 3, 1)), (-1, 2, (2, 3, 1, 1)), (-3, 1, (1, 2, 3)),
     (1, 3, (2, 1, 1, 1, 3)), (1, 0, (2, 3))],
)
def test_expand_dims(axis, num, expected):
    assert infer("expand_dims", (2, 3), axis=axis, num_newaxis=num).shape == expected
    data = X[0, 0, :2, :3]
    assert_close(eval_op(opf.op.expand_dims, data, axis=axis, num_newaxis=num),
                 data.reshape(expected))


def test_expand_dims_errors():
    with pytest.raises(opf.OpfusionTypeError, match=r"^expand_dims: attribute 'axis'=3 is out "
                                                    r"of range for data \(2, 3\); use -3..2"):
        infer("expand_dims", (2, 3), axis=3)
    with pytest.raises(opf.OpfusionTypeError, match="expand_dims: attribute 'num_newaxis'=-1"):
        infer("expand_dims", (2, 3), axis=0, num_newaxis=-1)
    with pytest.raises(opf.OpAttributeError, match="expand_dims: attribute 'axis' is required"):
        infer("expand_dims", (2, 3))
    assert_close(eval_op(opf.op.expand_dims, X, axis=-1), np.expand_dims(X, -1))


@pytest.mark.parametrize("axis, expected", [(0, (1, 120)), (1, (2, 60)), (-1, (24, 5)),
                                            (4, (120, 1)), (-4, (1, 120))])
def test_flatten_is_onnx_flatten(axis, expected):
    assert infer("flatten", X.shape, axis=axis).shape == expected
    got = eval_op(opf.op.flatten, X, axis=axis)
    assert_close(got, X.reshape(expected))
    assert_close(got, onnx_run("Flatten", {"x": X}, axis=axis)[0])


def test_flatten_axis_out_of_range():
    with pytest.raises(opf.OpfusionTypeError, match=r"^flatten: attribute 'axis'=5 is out of "
                                                    r"range for data \(2, 3, 4, 5\); use -4..4"):
        infer("flatten", X.shape, axis=5)


def test_reverse():
    assert infer("reverse", (2, 3), axis=-1).shape == (2, 3)
    assert_close(eval_op(opf.op.reverse, X, axis=1), X[:, ::-1])
    assert_close(eval_op(opf.op.reverse, X, axis=-1), X[..., ::-1])
    with pytest.raises(opf.OpfusionTypeError, match="^reverse: attribute 'axis'=2 is out of"):
        infer("reverse", (2, 3), axis=2)


# -- concatenate and split -------------------------------------------------------------------

def test_concatenate():
    a, b = X[:, :1], X[:, 1:]
    call = opf.op.concatenate([opf.var("a", a.shape), opf.var("b", b.shape)], axis=1)
    assert call.checked_type == opf.TensorType(X.shape, "float32")
    assert_close(eval_op(opf.op.concatenate, [a, b], axis=1), X)
    assert_close(eval_op(opf.op.concatenate, [X, X[:1], X], axis=-4),
                 np.concatenate([X, X[:1], X]))


@pytest.mark.parametrize(
    "shapes, dtypes, message",
    [
        ([(2, 3), (2, 4)], None, r"data\[1\] has shape \(2, 4\) but data\[0\] has \(2, 3\); "
                                 r"every dimension except 'axis'=0 must match"),
        ([(2, 3), (2, 3, 1)], None, r"data\[1\] has shape \(2, 3, 1\) .* the same rank"),
        ([(2, 3), (2, 3)], ["float32", "int32"], r"data\[0\]: float32, data\[1\]: int32; "
                                                 "insert a cast"),
        ([(), ()], None, r"data\[0\] is a scalar"),
    ],
)
def test_concatenate_errors(shapes, dtypes, message):
    dtypes = dtypes or ["float32"] * len(shapes)
    fields = [opf.var(f"x{i}", s, d) for i, (s, d) in enumerate(zip(shapes, dtypes))]
    with pytest.raises(opf.OpfusionTypeError, match="^concatenate: .*" + message):
        _ = opf.op.concatenate(fields).checked_type


def test_concatenate_axis_out_of_range():
    with pytest.raises(opf.OpfusionTypeError, match="^concatenate: attribute 'axis'=2"):
        _ = opf.op.concatenate([opf.var("a", (2, 3))], axis=2).checked_type


def test_split_into_sections():
    ty = infer("split", (6, 4), indices_or_sections=3)
    assert ty == opf.TupleType([opf.TensorType((2, 4), "float32")] * 3)
    got = eval_op(opf.op.split, X, indices_or_sections=2, axis=-2)
    assert isinstance(got, tuple)
    assert_close(got, tuple(np.split(X, 2, axis=2)))


@pytest.mark.parametrize("indices", [[1, 3], [0, 5], [2, 2, 4], [], [5]])
def test_split_at_indices(indices):
    got = eval_op(opf.op.split, X, indices_or_sections=indices, axis=3)
    want = tuple(np.split(X, indices, axis=3))
    assert_close(got, want)


def test_split_of_one_index_is_not_one_section():
    assert len(infer("split", (6,), indices_or_sections=[3]).fields) == 2
    assert len(infer("split", (6,), indices_or_sections=3).fields) == 3


@pytest.mark.parametrize(
    "spec, message",
    [(4, r"axis 1 of data \(2, 6\) has size 6, which does not divide into "
         r"'indices_or_sections'=4 equal parts; give split indices instead"),
     (0, r"'indices_or_sections'=0 must be a positive count"),
     ([4, 2], r"'indices_or_sections'=\(4, 2\) must be non-decreasing indices in 0..6"),
     ([7], r"'indices_or_sections'=\(7,\) must be non-decreasing")],
)
def test_split_errors(spec, message):
    with pytest.raises(opf.OpfusionTypeError, match="^split: .*" + message):
        infer("split", (2, 6), indices_or_sections=spec, axis=1)


def test_split_rejects_a_fractional_count():
    with pytest.raises(opf.OpAttributeError, match="split attribute 'indices_or_sections'"):
        infer("split", (6,), indices_or_sections=1.5)


# -- strided_slice ---------------------------------------------------------------------------

BIG = 2**63 - 1
SLICES = [
    dict(begin=[0, 1], end=[2, 3]),
    dict(begin=[1], end=[-1], axes=[3]),
    dict(begin=[-1, 0], end=[-BIG, BIG], strides=[-1, 2], axes=[2, 1]),
    dict(begin=[3, -2], end=[0, -100], strides=[-2, -1], axes=[-1, 2]),
    dict(begin=[-100, 10], end=[100, 20], axes=[0, 1]),
    dict(begin=[4], end=[1], axes=[3]),  # empty
    dict(begin=[1, 0, 1, 4], end=[2, 3, 4, 0], strides=[1, 1, 2, -3]),
]


def _numpy_slice(data, begin, end, strides=None, axes=None):
    index = [slice(None)] * data.ndim
    axes = range(len(begin)) if axes is None else axes
    strides = strides or [1] * len(begin)
    for axis, b, e, s in zip(axes, begin, end, strides):
        index[axis] = slice(b, e, s)
    return data[tuple(index)]


@pytest.mark.parametrize("attrs", SLICES)
def test_strided_slice_matches_numpy_and_onnx_slice(attrs):
    got = eval_op(opf.op.strided_slice, X, **attrs)
    assert_close(got, _numpy_slice(X, **attrs))
    feeds = {"data": X, "starts": np.array(attrs["begin"], np.int64),
             "ends": np.array(attrs["end"], np.int64)}
    axes = attrs.get("axes", list(range(len(attrs["begin"]))))
    feeds["axes"] = np.array(axes, np.int64)
    feeds["steps"] = np.array(attrs.get("strides", [1] * len(axes)), np.int64)
    assert_close(got, onnx_run("Slice", feeds)[0])


@pytest.mark.parametrize(
    "attrs, message",
    [(dict(begin=[0, 0], end=[1]), r"attribute 'end'=\(1,\) has 1 entries but 'begin'=\(0, 0\)"
                                   " has 2"),
     (dict(begin=[0], end=[1], strides=[0]), r"attribute 'strides'=\(0,\) has a 0 step"),
     (dict(begin=[0] * 5, end=[1] * 5), r"attribute 'begin'=\(0, 0, 0, 0, 0\) slices 5 axes but "
                                        r"data \(2, 3, 4, 5\) has rank 4"),
     (dict(begin=[0], end=[1], axes=[4]), r"attribute 'axes'=4 is out of range"),
     (dict(begin=[0, 0], end=[1, 1], axes=[1, -3]), r"attribute 'axes'=\(1, -3\) repeats")],
)
def test_strided_slice_errors(attrs, message):
    with pytest.raises(opf.OpfusionTypeError, match="^strided_slice: " + message):
        infer("strided_slice", X.shape, **attrs)


@settings(max_examples=80, deadline=None, derandomize=True)
@given(st.data())
def test_strided_slice_inference_matches_numpy(data):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=6))
    axes = data.draw(st.lists(st.integers(0, len(shape) - 1), unique=True, max_size=len(shape)))
    index = st.integers(-9, 9)
    begin = data.draw(st.lists(index, min_size=len(axes), max_size=len(axes)))
    end = data.draw(st.lists(index | st.sampled_from([BIG, -BIG]), min_size=len(axes),
                             max_size=len(axes)))
    strides = data.draw(st.lists(st.integers(-3, 3).filter(bool), min_size=len(axes),
                                 max_size=len(axes)))
    attrs = dict(begin=begin, end=end, strides=strides, axes=axes)
    want = _numpy_slice(np.empty(shape), **attrs).shape
    assert infer("strided_slice", shape, **attrs).shape == want


# -- take and gather_elements ----------------------------------------------------------------

def test_take_shapes():
    data, idx = opf.var("d", (5, 6, 7)), opf.var("i", (2, 3), "int32")
    assert opf.op.take(data, idx, axis=1).checked_type == opf.TensorType((5, 2, 3, 7))
    assert opf.op.take(data, idx).checked_type == opf.TensorType((2, 3))
    scalar = opf.var("s", (), "int64")
    assert opf.op.take(data, scalar, axis=-1).checked_type.shape == (5, 6)


def test_take_errors():
    data = opf.var("d", (5, 6))
    with pytest.raises(opf.OpfusionTypeError, match="^take: input 'indices' must be int32 or "
                                                    "int64, got float32; cast it"):
        _ = opf.op.take(data, opf.var("i", (2,)), axis=0).checked_type
    with pytest.raises(opf.OpfusionTypeError, match="^take: attribute 'axis'=2 is out of range"):
        _ = opf.op.take(data, opf.var("i", (2,), "int64"), axis=2).checked_type
    with pytest.raises(opf.OpfusionTypeError, match=r"^take: cannot take from data \(5, 0\)"):
        _ = opf.op.take(opf.var("e", (5, 0)), opf.var("i", (2,), "int64"), axis=1).checked_type
    with pytest.raises(opf.OpAttributeError, match="take attribute 'mode' must be one of"):
        opf.op.take(data, opf.var("i", (2,), "int64"), mode="raise")


@pytest.mark.parametrize("axis", [0, 2, -1])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_take_negative_indices_count_from_the_end_as_onnx_gather(axis, dtype):
    size = X.shape[axis]
    indices = rng.integers(-size, size, size=(3, 2)).astype(dtype)
    got = eval_op(opf.op.take, X, indices, axis=axis)
    assert_close(got, np.take(X, np.where(indices < 0, indices + size, indices), axis=axis))
    assert_close(got, onnx_run("Gather", {"data": X, "indices": indices}, axis=axis)[0])


def test_take_out_of_range_modes():
    data = np.arange(5, dtype=np.float32) * 10
    indices = np.array([-7, -5, -1, 0, 4, 5, 12], np.int64)
    assert_close(eval_op(opf.op.take, data, indices, axis=0, mode="clip"),
                 np.array([0, 0, 40, 0, 40, 40, 40], np.float32))
    assert_close(eval_op(opf.op.take, data, indices, axis=0, mode="wrap"),
                 np.array([30, 0, 40, 0, 40, 0, 20], np.float32))
    in_range = indices[1:5]
    assert_close(eval_op(opf.op.take, data, in_range, axis=0, mode="fast"),
                 np.array([0, 40, 0, 40], np.float32))


def test_take_of_the_flattened_tensor():
    indices = np.array([[0, 119], [-1, 7]], np.int64)
    assert_close(eval_op(opf.op.take, X, indices), X.reshape(-1)[[[0, 119], [119, 7]]])


def _gather_elements_loop(data, indices, axis):
    out = np.empty(indices.shape, data.dtype)
    for where in np.ndindex(*indices.shape):
        source = list(where)
        source[axis] = indices[where] % data.shape[axis]
        out[where] = data[tuple(source)]
    return out


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements_matches_a_loop_and_onnx(axis):
    data = X[0]  # (3, 4, 5)
    shape = list(data.shape)
    shape[axis] = 6  # more indices than data along the axis is fine
    size = data.shape[axis]
    indices = rng.integers(-size, size, size=shape).astype(np.int64)
    got = eval_op(opf.op.gather_elements, data, indices, axis=axis)
    assert_close(got, _gather_elements_loop(data, indices, axis))
    # onnx.reference mishandles a negative axis (it slices shapes with it), so give it >= 0.
    want = onnx_run("GatherElements", {"data": data, "indices": indices}, axis=axis % 3)[0]
    assert_close(got, want)


def test_gather_elements_indices_may_be_smaller_off_the_axis():
    data = X[0]  # (3, 4, 5)
    indices = rng.integers(-4, 4, size=(2, 7, 3)).astype(np.int32)
    got = eval_op(opf.op.gather_elements, data, indices, axis=1)
    assert got.shape == (2, 7, 3)
    assert_close(got, _gather_elements_loop(data, indices, 1))


def test_gather_elements_errors():
    data = opf.var("d", (3, 4))
    with pytest.raises(opf.OpfusionTypeError, match=r"^gather_elements: input 'indices' \(3,\) "
                                                    r"must have the rank of data \(3, 4\)"):
        _ = opf.op.gather_elements(data, opf.var("i", (3,), "int64")).checked_type
    with pytest.raises(opf.OpfusionTypeError,
                       match=r"^gather_elements: input 'indices' \(2, 5\) is larger than data "
                             r"\(3, 4\) in dimension 1, which is not 'axis'=0"):
        _ = opf.op.gather_elements(data, opf.var("i", (2, 5), "int64")).checked_type
    with pytest.raises(opf.OpfusionTypeError, match="^gather_elements: input 'indices' must be "
                                                    "int32 or int64"):
        _ = opf.op.gather_elements(data, opf.var("i", (3, 4), "uint8")).checked_type


# -- broadcast_to and tile -------------------------------------------------------------------

def test_broadcast_to():
    data = X[:1, :, :1, :]  # (1, 3, 1, 5)
    assert infer("broadcast_to", data.shape, shape=(2, 2, 3, 4, 5)).shape == (2, 2, 3, 4, 5)
    assert_close(eval_op(opf.op.broadcast_to, data, shape=(2, 3, 4, 5)),
                 np.broadcast_to(data, (2, 3, 4, 5)).copy())
    with pytest.raises(opf.OpfusionTypeError,
                       match=r"^broadcast_to: data \(1, 3, 1, 5\) cannot be broadcast to "
                             r"'shape'=\(2, 4, 4, 5\): dimension 1 has size 3, not 1 or 4"):
        infer("broadcast_to", data.shape, shape=(2, 4, 4, 5))
    with pytest.raises(opf.OpfusionTypeError, match="target needs at least data's rank"):
        infer("broadcast_to", data.shape, shape=(3, 4, 5))


@pytest.mark.parametrize("reps", [(2,), (1, 3), (2, 1, 2), (2, 1, 1, 1, 2), (0, 2)])
def test_tile_matches_numpy(reps):
    data = X[0, :, :2]  # (3, 2, 5)
    assert infer("tile", data.shape, reps=reps).shape == np.tile(data, reps).shape
    assert_close(eval_op(opf.op.tile, data, reps=reps), np.tile(data, reps))


def test_tile_rejects_negative_reps():
    with pytest.raises(opf.OpfusionTypeError, match=r"^tile: attribute 'reps'=\(2, -1\) must"):
        infer("tile", (2, 3), reps=(2, -1))


# -- arange ----------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "attrs",
    [dict(stop=5), dict(start=2, stop=11, step=3), dict(start=1, stop=-2, step=-0.5),
     dict(start=5, stop=1), dict(start=-3, stop=4, step=2, dtype="int32"),
     dict(start=0, stop=1, step=0.1, dtype="float64"), dict(start=10, stop=0, step=-3,
                                                            dtype="int64")],
)
def test_arange_matches_numpy(attrs):
    dtype = attrs.get("dtype", "float32")
    want = np.arange(attrs.get("start", 0), attrs["stop"], attrs.get("step", 1), dtype=dtype)
    call = opf.op.arange(**attrs)
    assert call.checked_type == opf.TensorType(want.shape, dtype)
    assert_close(eval_op(opf.op.arange, **attrs), want)


def test_arange_length_of_whole_numbers_is_exact():
    # float64 rounds 2**60 / 3 to 384307168202282325.33... -> ...304, 22 short of the ceiling.
    call = opf.op.arange(start=0, stop=2.0**60, step=3, dtype="int64")
    assert call.checked_type.shape == (-(-(2**60) // 3),)


def test_arange_errors():
    with pytest.raises(opf.OpfusionTypeError, match="^arange: attribute 'step'=0"):
        _ = opf.op.arange(stop=3, step=0).checked_type
    with pytest.raises(opf.OpfusionTypeError, match="^arange: attribute 'step'=0.5 is not an "
                                                    "integer but 'dtype' is int32"):
        _ = opf.op.arange(stop=3, step=0.5, dtype="int32").checked_type
    with pytest.raises(opf.OpfusionTypeError, match="^arange: attribute 'stop'=inf must be"):
        _ = opf.op.arange(stop=float("inf")).checked_type
    with pytest.raises(opf.OpAttributeError, match="arange: attribute 'stop' is required"):
        opf.op.arange()


# -- depth_to_space / space_to_depth ---------------------------------------------------------

D2S = rng.standard_normal((2, 12, 3, 2)).astype(np.float32)


def _depth_to_space_by_index(data, b, mode):
    n, c, h, w = data.shape
    c_out = c // (b * b)
    ni, ci, yi, xi = np.indices((n, c_out, h * b, w * b))
    i, j = yi % b, xi % b
    channel = (i * b + j) * c_out + ci if mode == "DCR" else ci * b * b + i * b + j
    return data[ni, channel, yi // b, xi // b]


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
@pytest.mark.parametrize("b", [1, 2])
def test_depth_to_space_matches_index_formula_and_onnx(mode, b):
    got = eval_op(opf.op.depth_to_space, D2S, block_size=b, mode=mode)
    assert got.shape == (2, 12 // (b * b), 3 * b, 2 * b)
    assert_close(got, _depth_to_space_by_index(D2S, b, mode))
    assert_close(got, onnx_run("DepthToSpace", {"x": D2S}, blocksize=b, mode=mode)[0])


@pytest.mark.parametrize("b", [1, 2, 3])
def test_space_to_depth_matches_index_formula_and_onnx(b):
    data = rng.standard_normal((2, 3, 6, 6 * b)).astype(np.float32)
    got = eval_op(opf.op.space_to_depth, data, block_size=b)
    n, c, h, w = data.shape
    ni, co, yi, xi = np.indices((n, c * b * b, h // b, w // b))
    block, ci = co // c, co % c
    assert_close(got, data[ni, ci, yi * b + block // b, xi * b + block % b])
    assert_close(got, onnx_run("SpaceToDepth", {"x": data}, blocksize=b)[0])
    # They are inverses (DCR).
    assert_close(eval_op(opf.op.depth_to_space, got, block_size=b), data)


def test_space_to_depth_crd_puts_depth_first_as_onnx_opset_28():
    data = rng.standard_normal((2, 3, 4, 6)).astype(np.float32)
    got = eval_op(opf.op.space_to_depth, data, block_size=2, mode="CRD")
    n, c, h, w = data.shape
    ni, co, yi, xi = np.indices((n, c * 4, h // 2, w // 2))
    ci, block = co // 4, co % 4
    assert_close(got, data[ni, ci, yi * 2 + block // 2, xi * 2 + block % 2])
    assert_close(got, onnx_run("SpaceToDepth", {"x": data}, opset=28, blocksize=2,
                               mode="CRD")[0])
    # CRD is depth_to_space's CRD inverted.
    assert_close(eval_op(opf.op.depth_to_space, got, block_size=2, mode="CRD"), data)


def test_depth_space_errors():
    with pytest.raises(opf.OpfusionTypeError,
                       match=r"^depth_to_space: data \(2, 12, 3, 2\) has 12 channels, which "
                             r"'block_size'=3 cannot split into 3x3 blocks"):
        infer("depth_to_space", D2S.shape, block_size=3)
    with pytest.raises(opf.OpfusionTypeError,
                       match=r"^space_to_depth: data \(2, 12, 3, 2\) has spatial size 3x2, "
                             r"which 'block_size'=2 does not divide"):
        infer("space_to_depth", D2S.shape, block_size=2)
    with pytest.raises(opf.OpfusionTypeError, match="^depth_to_space: input 'data' must be 4-D"):
        infer("depth_to_space", (4, 2, 2), block_size=2)
    with pytest.raises(opf.OpAttributeError, match="depth_to_space attribute 'mode' must be one "
                                                   "of 'DCR', 'CRD'"):
        infer("depth_to_space", D2S.shape, block_size=2, mode="dcr")
