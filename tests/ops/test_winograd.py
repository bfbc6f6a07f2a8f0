"""Winograd F(2x2, 3x3) and F(4x4, 3x3): the NumPy algorithm equals direct convolution, the
operators' types and errors, and the compiled kernels stay within the documented rounding
bounds (opfusion/opdefs/_winograd.py)."""

from fractions import Fraction

import numpy as np
import pytest

import opfusion as opf
from opfusion.errors import OpfusionError
from opfusion.ir.evaluate import evaluate
from opfusion.ir.expr import Function
from opfusion.ir.layout import Layout, transform_array
from opfusion.ir.module import IRModule
from opfusion.ir.op import get_op
from opfusion.opdefs import _winograd as winograd
from opfusion.testing import assert_close
from opfusion.topi.testing import check_compute

nn = opf.op.nn


def normal(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def relayout(array, src, dst):
    return transform_array(array, Layout.parse(src), Layout.parse(dst))


def direct(x, w, padding):
    return get_op("nn.conv2d").reference(x, w, **get_op("nn.conv2d").make_attrs(
        {"padding": padding}))


CASES = [  # (channels, out channels, height, width, padding)
    (8, 8, 6, 6, 1), (8, 16, 7, 9, 1), (16, 8, 10, 10, 0), (8, 8, 5, 11, (0, 1, 2, 1)),
    (8, 8, 4, 4, 1),
]


@pytest.mark.parametrize("tile", [2, 4])
@pytest.mark.parametrize("c, k, h, w, padding", CASES, ids=str)
def test_the_algorithm_is_direct_convolution(tile, c, k, h, w, padding):
    x, wt = normal(1, c, h, w), normal(k, c, 3, 3, seed=1)
    want = direct(x, wt, padding)
    u = winograd.transform_weight(relayout(wt, "OIHW", "OIHW8i8o"), tile)
    got = winograd.convolve(relayout(x, "NCHW", "NCHW8c").astype(np.float64), u, tile,
                            get_op("nn.conv2d").make_attrs({"padding": padding}).padding,
                            want.shape[2:])
    np.testing.assert_allclose(relayout(got, "NCHW8c", "NCHW"), want, atol=1e-9 * np.abs(
        want).max() + 1e-6)


@pytest.mark.parametrize("tile", [2, 4])
@pytest.mark.parametrize("c, k, h, w, padding", CASES[:3], ids=str)
def test_the_compute_matches_the_reference(tile, c, k, h, w, padding):
    x = relayout(normal(1, c, h, w), "NCHW", "NCHW8c")
    u = winograd.transform_weight(relayout(normal(k, c, 3, 3, seed=1), "OIHW", "OIHW8i8o"),
                                  tile).astype(np.float32)
    check_compute(nn.conv2d_winograd_nchwc, x, u, tile_size=tile, padding=padding,
                  data_layout="NCHW8c", out_layout="NCHW8c", rtol=1e-5)


@pytest.mark.parametrize("tile", [2, 4])
def test_the_weight_transform_compute_matches_the_reference(tile):
    w = relayout(normal(16, 8, 3, 3), "OIHW", "OIHW8i8o")
    check_compute(nn.winograd_weight_transform, w, tile_size=tile, rtol=1e-6)


# The documented bounds (of the largest output), with a margin of 2.
BOUNDS = {"f2": 2e-6, "f4": 7e-6}


@pytest.mark.parametrize("algorithm", ["f2", "f4"])
def test_compiled_layers_stay_within_the_documented_rounding(algorithm):
    tile = int(algorithm[1])
    x = relayout(normal(1, 64, 14, 14), "NCHW", "NCHW16c")
    w = relayout(normal(64, 64, 3, 3, seed=1) / 24, "OIHW", "OIHW16i16o")
    u = winograd.transform_weight(w, tile).astype(np.float32)
    data = opf.var("x", shape=x.shape)
    mod = IRModule.from_expr(Function([data], nn.relu(nn.conv2d_winograd_nchwc(
        data, opf.const(u), tile_size=tile, padding=1))))
    want = direct(relayout(x, "NCHW16c", "NCHW"), relayout(w, "OIHW16i16o", "OIHW"), 1)
    got = relayout(opf.compile(mod)(x), "NCHW16c", "NCHW")
    error = np.abs(got - np.maximum(want, 0)).max() / np.abs(want).max()
    assert error <= BOUNDS[algorithm], error
    assert_close(opf.compile(mod)(x), evaluate(mod, [x]), BOUNDS[algorithm])


LAVIN = tuple(Fraction(p) for p in (0, 1, -1, 2, -2))  # Lavin and Gray's F(4x4) points


@pytest.mark.parametrize("points", [winograd.POINTS[2], winograd.POINTS[4], LAVIN],
                         ids=["f2", "f4", "f4-lavin"])
def test_toom_cook_matrices_compute_the_correlation(points):
    bt, g, at = winograd.toom_cook(points)
    rng = np.random.default_rng(0)
    for _ in range(5):
        taps, data = rng.standard_normal(3), rng.standard_normal(bt.shape[0])
        want = [taps @ data[i:i + 3] for i in range(at.shape[0])]
        np.testing.assert_allclose(at @ ((g @ taps) * (bt @ data)), want, atol=1e-12)
    assert all(row[row != 0][0] > 0 for row in bt)  # each row's first coefficient positive


def _float32_f4_error(points):
    """F(4x4) of post-ReLU tiles over 256 channels in float32 (transforms and the channel
    sum), against float64, relative to the largest output."""
    bt, g, at = winograd.toom_cook(points)
    rng = np.random.default_rng(0)
    d = np.maximum(rng.standard_normal((256, 64, 6, 6)), 0)
    w = rng.standard_normal((16, 256, 3, 3)) / 48
    u = np.einsum("xa,kcab,yb->xykc", g, w, g).astype(np.float32)
    v = np.einsum("xa,ctab,yb->xyct", bt.astype(np.float32), d.astype(np.float32),
                  bt.astype(np.float32))
    m = np.zeros((6, 6, 16, 64), np.float32)
    for c in range(256):  # one channel at a time, as the kernels sum
        m += u[:, :, :, c, None] * v[:, :, None, c, :]
    got = np.einsum("px,xykt,qy->ktpq", at.astype(np.float32), m, at.astype(np.float32))
    want = np.einsum("px,xykt,qy->ktpq", at, np.einsum("xykc,xyct->xykt", np.einsum(
        "xa,kcab,yb->xykc", g, w, g), np.einsum("xa,ctab,yb->xyct", bt, d, bt)), at)
    return np.abs(got - want).max() / np.abs(want).max()


def test_the_f4_points_round_better_than_lavins():
    assert _float32_f4_error(winograd.POINTS[4]) < 0.6 * _float32_f4_error(LAVIN)


def _infer(data_shape, weight_shape, **attrs):
    data, weight = opf.var("x", shape=data_shape), opf.var("w", shape=weight_shape)
    mod = IRModule.from_expr(Function([data, weight],
                                      nn.conv2d_winograd_nchwc(data, weight, **attrs)))
    return opf.transform.InferType()(mod)["main"].body.checked_type


def test_types():
    assert _infer((1, 2, 14, 14, 16), (6, 6, 3, 2, 16, 16), tile_size=4, padding=1).shape == (
        1, 3, 14, 14, 16)
    assert _infer((1, 2, 9, 7, 8), (4, 4, 1, 2, 8, 16), tile_size=2, data_layout="NCHW8c",
                  out_layout="NCHW16c").shape == (1, 1, 7, 5, 16)


@pytest.mark.parametrize("weight, attrs, words", [
    ((4, 4, 3, 2, 16, 16), {"tile_size": 4}, "do not match tile_size=4"),
    ((6, 6, 3, 3, 16, 16), {"tile_size": 4}, "the weight must be"),
    ((6, 6, 3, 2, 16, 16), {"tile_size": 3}, "tile_size"),
    ((6, 6, 3, 2, 16, 16), {"tile_size": 4, "channels": 32}, "'channels'=32"),
])
def test_type_errors_say_what_the_weight_must_be(weight, attrs, words):
    with pytest.raises(OpfusionError, match=words):
        _infer((1, 2, 14, 14, 16), weight, **attrs)


def test_the_weight_transform_wants_3x3_float_filters():
    w = opf.var("w", shape=(1, 1, 5, 5, 8, 8))
    mod = IRModule.from_expr(Function([w], nn.winograd_weight_transform(w)))
    with pytest.raises(OpfusionError, match="Winograd here is for 3x3"):
        opf.transform.InferType()(mod)
