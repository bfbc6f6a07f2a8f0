"""nn.attention: the operator's checks, its TE compute (run by the loop-IR interpreter) and
its compiled kernel (the attention rule's default schedule) against the NumPy reference, on
shapes with tails (queries not a whole block, keys not whole vectors, odd head sizes),
broadcast batches and biases, a causal mask, fully masked rows, huge scores and NaN."""

import shutil

import numpy as np
import pytest

import opfusion as opf
from opfusion.errors import OpfusionTypeError
from opfusion.ir.evaluate import evaluate
from opfusion.ir.expr import Function
from opfusion.ir.module import IRModule
from opfusion.testing import assert_close
from opfusion.topi.testing import call_over_arrays, check_compute

nn = opf.op.nn
compiler = pytest.mark.skipif(not (shutil.which("gcc") or shutil.which("cc")),
                              reason="no C compiler")


@pytest.fixture(autouse=True)
def private_kernel_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("OPFUSION_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "kernels"))


def normal(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def causal(rows, keys):
    return np.triu(np.full((rows, keys), -10000.0, "float32"), k=1)


def operands(batch, rows, keys, depth, width, seed=0):
    return (normal(*batch, rows, depth, seed=seed), normal(*batch, depth, keys, seed=seed + 1),
            normal(*batch, keys, width, seed=seed + 2))


def compiled(arrays, scale):
    """The op compiled alone by opf.compile, run on ``arrays``; and the reference."""
    call, params, values = call_over_arrays(nn.attention, arrays, {"scale": scale})
    mod = IRModule.from_expr(Function(params, call))
    want = evaluate(mod, values)
    return opf.compile(mod).run(values)[0], want


SHAPES = [  # batch, query rows, keys, head size, value width
    ((1, 2), 5, 7, 4, 3),
    ((1, 3), 13, 37, 16, 8),
    ((2,), 9, 16, 8, 16),
    ((1, 2), 8, 197 % 40, 64 // 8, 24),
    ((), 1, 1, 1, 1),
]


@pytest.mark.parametrize("batch, rows, keys, depth, width", SHAPES)
def test_compute_matches_the_reference(batch, rows, keys, depth, width):
    q, k, v = operands(batch, rows, keys, depth, width)
    check_compute(nn.attention, q, k, v, np.float32(0), scale=0.3, rtol=1e-5)


@compiler
@pytest.mark.parametrize("batch, rows, keys, depth, width", SHAPES)
def test_kernel_matches_the_reference(batch, rows, keys, depth, width):
    q, k, v = operands(batch, rows, keys, depth, width)
    got, want = compiled((q, k, v, np.float32(0)), 1 / np.sqrt(depth))
    assert_close(got, want, 1e-5)


@compiler
@pytest.mark.parametrize("bias_shape", [(11, 19), (1, 1, 11, 19), (1, 3, 1, 19), (19,),
                                        (1, 3, 11, 19)])
def test_broadcast_biases(bias_shape):
    q, k, v = operands((1, 3), 11, 19, 8, 8)
    bias = normal(*bias_shape, seed=7) * 3
    got, want = compiled((q, k, v, bias), 0.5)
    assert_close(got, want, 1e-5)


@compiler
@pytest.mark.parametrize("rows", [16, 21])
def test_causal_mask_and_broadcast_batches(rows):
    q = normal(2, 1, rows, 8)
    k = normal(1, 4, 8, rows, seed=1)
    v = normal(2, 4, rows, 16, seed=2)
    got, want = compiled((q, k, v, causal(rows, rows)), 0.125)
    assert got.shape == (2, 4, rows, 16)
    assert_close(got, want, 1e-5)


@compiler
def test_fully_masked_rows_give_nan_as_the_reference_and_huge_scores_stay_finite():
    q, k, v = operands((1, 1), 6, 12, 4, 8)
    q[0, 0, 2] *= 1e4  # scores in the tens of thousands: the shift keeps exp finite
    bias = np.zeros((6, 12), "float32")
    bias[4] = -np.inf  # row 4 masked out entirely: 0/0 in the reference
    got, want = compiled((q, k, v, bias), 1.0)
    assert np.isnan(want[0, 0, 4]).all() and np.isnan(got[0, 0, 4]).all()
    finite = np.isfinite(want)
    assert np.isfinite(got[finite]).all()
    assert_close(np.where(finite, got, 0), np.where(finite, want, 0), 1e-5)


@compiler
def test_nan_inputs_propagate_to_their_rows():
    q, k, v = operands((1, 1), 5, 9, 4, 8)
    q[0, 0, 3, 1] = np.nan
    got, want = compiled((q, k, v, np.float32(0)), 1.0)
    assert np.isnan(want[0, 0, 3]).all() and np.isnan(got[0, 0, 3]).all()
    assert_close(np.delete(got, 3, axis=2), np.delete(want, 3, axis=2), 1e-5)


@pytest.mark.parametrize("shapes, message", [
    (((2, 4, 3), (2, 5, 6), (2, 6, 3), ()), "query .* has 3 values a row but key"),
    (((2, 4, 3), (2, 3, 6), (2, 5, 3), ()), "holds 6 keys but value"),
    (((2, 4, 3), (2, 3, 6), (2, 6, 3), (4, 7)), "bias"),
    (((3,), (3, 6), (6, 3), ()), "input 'query' .* rank 2 or more"),
])
def test_shape_errors_name_the_inputs(shapes, message):
    args = [opf.var(f"x{i}", shape=s) for i, s in enumerate(shapes)]
    with pytest.raises(OpfusionTypeError, match=message):
        nn.attention(*args).checked_type  # noqa: B018
