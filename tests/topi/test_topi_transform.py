"""The TE computes of the shape and indexing transforms agree with their NumPy references."""

import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import opfusion as opf
from opfusion import te
from opfusion.tir.expr import FloorDiv, FloorMod, post_order
from opfusion.topi._util import reshape_indices
from opfusion.topi.testing import check_compute

needs_cc = pytest.mark.skipif(not (shutil.which("gcc") or shutil.which("cc")),
                              reason="no C compiler")


@pytest.fixture
def kernel_cache(tmp_path, monkeypatch):
    """Compiled kernels go to a private cache, not ~/.cache."""
    monkeypatch.setenv("OPFUSION_CACHE_DIR", str(tmp_path))


def _normal(shape=(2, 3, 4), dtype="float32", seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("newshape", [(6, 4), (4, -1), (0, 12), (1, 24, 1), (2, 2, 3, 2),
                                      (24,), (3, 8), (2, 12)], ids=str)
def test_reshape(newshape):
    check_compute(opf.op.reshape, _normal(), newshape=newshape)


@st.composite
def _reshape_pair(draw):
    factors = draw(st.lists(st.sampled_from([1, 2, 3]), min_size=0, max_size=5))
    size = int(np.prod(factors)) if factors else 1

    def shape_of(order):
        shape, rest = [], list(order)
        while rest:
            take = draw(st.integers(1, len(rest)))
            shape.append(int(np.prod(rest[:take])))
            rest = rest[take:]
            if draw(st.booleans()):
                shape.append(1)
        return tuple(shape) or (1,) * draw(st.integers(0, 2))

    return shape_of(factors), shape_of(draw(st.permutations(factors))), size


@settings(max_examples=40, deadline=None)
@given(_reshape_pair())
def test_reshape_any_shapes(pair):
    source, target, _ = pair
    check_compute(opf.op.reshape, _normal(source), newshape=target)


def test_reshape_keeps_copied_dimensions_free_of_division():
    indices = [te.var(f"i{d}") for d in range(3)]
    mapped = reshape_indices(indices, (2, 12, 5), (2, 3, 4, 5))
    assert mapped[0] is indices[0] and mapped[3] is indices[2]
    nodes = [n for m in mapped[1:3] for n in post_order(te.const(0) + m)]
    assert sum(isinstance(n, (FloorDiv, FloorMod)) for n in nodes) == 2


@pytest.mark.parametrize("axes", [None, (1, -1, 0), (0, 2, 1), (2, 1, 0)], ids=str)
def test_transpose(axes):
    check_compute(opf.op.transpose, _normal(), axes=axes)


def test_squeeze_expand_dims_flatten():
    x = _normal((2, 1, 3, 1))
    check_compute(opf.op.squeeze, x)
    check_compute(opf.op.squeeze, x, axis=[-1])
    check_compute(opf.op.expand_dims, _normal(), axis=-2, num_newaxis=2)
    check_compute(opf.op.expand_dims, _normal(), axis=0)
    check_compute(opf.op.expand_dims, _normal(), axis=3, num_newaxis=0)
    for axis in (0, 1, 2, -1, 3):
        check_compute(opf.op.flatten, _normal(), axis=axis)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_reverse(axis):
    check_compute(opf.op.reverse, _normal(), axis=axis)


@pytest.mark.parametrize("attrs", [
    {"begin": [1, -1], "end": [3, -10], "strides": [1, -2], "axes": [1, 2]},
    {"begin": [0], "end": [100]},
    {"begin": [-100, 1], "end": [100, 3]},
    {"begin": [3], "end": [0], "strides": [-1], "axes": [-1]},
    {"begin": [-1, 2, 3], "end": [-3, 0, -5], "strides": [-1, -1, -2]},
    {"begin": [0], "end": [4], "strides": [3], "axes": [2]},
    {"begin": [2], "end": [1], "axes": [1]},
], ids=str)
def test_strided_slice(attrs):
    check_compute(opf.op.strided_slice, _normal(), **attrs)


@pytest.mark.parametrize("sections, axis", [(2, 2), ([1, 1, 3], -1), ([0, 2], 1), (1, 0),
                                            ([], 0)], ids=str)
def test_split(sections, axis):
    check_compute(opf.op.split, _normal(), indices_or_sections=sections, axis=axis)


def test_concatenate():
    x = _normal()
    check_compute(opf.op.concatenate, [x, x[:, :1], x], axis=1)
    check_compute(opf.op.concatenate, [x], axis=0)
    check_compute(opf.op.concatenate, [x[..., k:k + 1] for k in range(4)] + [x], axis=-1)
    check_compute(opf.op.concatenate, [np.arange(3, dtype="int64"), np.arange(5, dtype="int64")])


@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("mode", ["clip", "wrap", "fast"])
def test_take_along_an_axis(dtype, mode):
    indices = np.array([[0, -1], [5, 2], [-7, 1]], dtype)
    check_compute(opf.op.take, _normal(), indices, axis=1, mode=mode)
    check_compute(opf.op.take, _normal(), indices[0], axis=-1, mode=mode)
    check_compute(opf.op.take, _normal(), np.array(2, dtype), axis=0, mode=mode)


@pytest.mark.parametrize("mode", ["clip", "wrap"])
def test_take_from_the_flat_tensor(mode):
    check_compute(opf.op.take, _normal(), np.array([3, -2, 40, 23], "int32"), mode=mode)


def test_gather_elements():
    x = _normal()
    for axis in (0, 1, -1):
        indices = np.random.default_rng(axis + 5).integers(-3, 4, (2, 2, 3)).astype("int64")
        check_compute(opf.op.gather_elements, x, indices, axis=axis, mode="clip")


@pytest.mark.parametrize("shape", [(5, 2, 3, 4), (2, 3, 4)], ids=str)
def test_broadcast_to(shape):
    check_compute(opf.op.broadcast_to, _normal((3, 1)), shape=shape)
    check_compute(opf.op.broadcast_to, _normal(()), shape=shape)


@pytest.mark.parametrize("reps", [(2, 1, 3, 2), (2,), (1, 1, 1), (2, 2), (0, 2)], ids=str)
def test_tile(reps):
    check_compute(opf.op.tile, _normal((2, 1, 3)), reps=reps)


@pytest.mark.parametrize("attrs", [
    {"stop": 5.5, "start": -1.0, "step": 0.7},
    {"stop": 10.0},
    {"stop": -5.0, "start": 7.0, "step": -3.0, "dtype": "int32"},
    {"stop": 4.0, "dtype": "int64"},
    {"stop": 0.3, "start": 0.0, "step": 0.1, "dtype": "float64"},
    {"stop": 1.0, "start": 2.0},
], ids=str)
def test_arange(attrs):
    check_compute(opf.op.arange, **attrs)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
@pytest.mark.parametrize("block", [1, 2, 3])
def test_depth_to_space_and_back(mode, block):
    check_compute(opf.op.depth_to_space, _normal((2, 2 * block * block, 2, 3)),
                  block_size=block, mode=mode)
    check_compute(opf.op.space_to_depth, _normal((1, 3, 2 * block, 2 * block)),
                  block_size=block, mode=mode)


def test_transforms_keep_integer_and_bool_dtypes():
    ints = np.arange(24, dtype="int64").reshape(2, 3, 4)
    check_compute(opf.op.transpose, ints, axes=(2, 0, 1))
    check_compute(opf.op.reshape, ints > 5, newshape=(4, 6))
    check_compute(opf.op.take, ints, np.array([1, 0], "int32"), axis=2)


@needs_cc
def test_transforms_compiled(kernel_cache):
    x = _normal()
    check_compute(opf.op.reshape, x, newshape=(4, 3, 2), compiled=True)
    check_compute(opf.op.transpose, x, axes=(2, 0, 1), compiled=True)
    check_compute(opf.op.strided_slice, x, begin=[-1, 2], end=[-3, 0], strides=[-1, -1],
                  compiled=True)
    check_compute(opf.op.concatenate, [x, np.ascontiguousarray(x[:, :2])], axis=1, compiled=True)
    check_compute(opf.op.split, x, indices_or_sections=[1, 3], axis=2, compiled=True)
    check_compute(opf.op.take, x, np.array([[0, -1], [9, 2]], "int64"), axis=1, mode="clip",
                  compiled=True)
    check_compute(opf.op.gather_elements, x, np.array([[[2, -1, 0, 5]]], "int64"), axis=1,
                  mode="clip", compiled=True)
    check_compute(opf.op.tile, x, reps=(2, 1, 1), compiled=True)
    check_compute(opf.op.arange, stop=5.0, start=-1.0, step=0.5, compiled=True)
    check_compute(opf.op.depth_to_space, _normal((1, 8, 2, 3)), block_size=2, compiled=True)
