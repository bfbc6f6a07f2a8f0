"""image.resize2d: inference, errors, and numbers against a per-pixel evaluation of the ONNX
Resize formulas written here and against onnx.reference's Resize."""

import itertools

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import opfusion as opf
from opfusion.ir.op import OpPatternKind, get_op
from opfusion.testing import assert_close, eval_op

rng = np.random.default_rng(5)
IMAGE = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
resize2d = opf.op.image.resize2d

ONNX_MODE = {"nearest_neighbor": "nearest", "linear": "linear", "cubic": "cubic"}


def infer(shape, dtype="float32", **attrs):
    return resize2d(opf.var("x", shape, dtype), **attrs).checked_type


def onnx_resize(data, size, method, coordinate_transformation_mode, rounding_method=None,
                cubic_alpha=-0.75, cubic_exclude=False):
    attrs = dict(mode=ONNX_MODE[method],
                 coordinate_transformation_mode=coordinate_transformation_mode,
                 cubic_coeff_a=cubic_alpha, exclude_outside=int(cubic_exclude))
    if rounding_method:
        attrs["nearest_mode"] = rounding_method
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], **attrs)
    graph = helper.make_graph(
        [node], "resize",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, data.shape),
         helper.make_tensor_value_info("sizes", TensorProto.INT64, (4,))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    sizes = np.array(data.shape[:2] + tuple(size), np.int64)
    return ReferenceEvaluator(model).run(None, {"x": data, "sizes": sizes})[0]


# -- an independent evaluation: the ONNX formulas, one output pixel at a time ----------------

def source(mode, out_index, out_len, in_len):
    scale = out_len / in_len
    if mode == "half_pixel":
        return (out_index + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (out_index + 0.5) / scale - 0.5 if out_len > 1 else 0.0
    if mode == "align_corners":
        return out_index * (in_len - 1) / (out_len - 1) if out_len > 1 else 0.0
    if mode == "asymmetric":
        return out_index / scale
    return (out_index + 0.5) / scale  # tf_half_pixel_for_nn


def nearest(x, rounding):
    lower = np.floor(x)
    frac = x - lower
    if rounding == "round":  # C round(): half away from zero
        return int(np.sign(x) * np.floor(abs(x) + 0.5))
    up = {"floor": False, "ceil": frac > 0, "round_prefer_floor": frac > 0.5,
          "round_prefer_ceil": frac >= 0.5}[rounding]
    return int(lower) + int(up)


def cubic_kernel(t, a):
    t = abs(t)
    if t <= 1:
        return (a + 2) * t**3 - (a + 3) * t**2 + 1
    if t < 2:
        return a * t**3 - 5 * a * t**2 + 8 * a * t - 4 * a
    return 0.0


def taps(x, method, in_len, alpha, exclude):
    """(index, weight) pairs of one source coordinate along one axis."""
    if method == "nearest_neighbor":
        return [(x, 1.0)]
    base = int(np.floor(x))
    if method == "linear":
        return [(base, 1 - (x - base)), (base + 1, x - base)]
    pairs = [(base + k, cubic_kernel(x - (base + k), alpha)) for k in range(-1, 3)]
    if exclude:
        pairs = [(i, w) for i, w in pairs if 0 <= i < in_len]
        total = sum(w for _, w in pairs)
        pairs = [(i, w / total) for i, w in pairs]
    return pairs


def resize_per_pixel(data, size, method="linear", coordinate_transformation_mode="half_pixel",
                     rounding_method="round_prefer_floor", cubic_alpha=-0.75,
                     cubic_exclude=False):
    _, _, in_h, in_w = data.shape
    out = np.zeros(data.shape[:2] + tuple(size))
    for oy, ox in itertools.product(range(size[0]), range(size[1])):
        sy = source(coordinate_transformation_mode, oy, size[0], in_h)
        sx = source(coordinate_transformation_mode, ox, size[1], in_w)
        if method == "nearest_neighbor":
            sy, sx = nearest(sy, rounding_method), nearest(sx, rounding_method)
        for (iy, wy), (ix, wx) in itertools.product(
                taps(sy, method, in_h, cubic_alpha, cubic_exclude),
                taps(sx, method, in_w, cubic_alpha, cubic_exclude)):
            # Out-of-image taps read the edge pixel.
            out[:, :, oy, ox] += wy * wx * data[:, :, min(max(iy, 0), in_h - 1),
                                                min(max(ix, 0), in_w - 1)]
    return out.astype(data.dtype)


# -- inference and errors --------------------------------------------------------------------

def test_resize_shape_dtype_and_pattern():
    assert infer((2, 3, 4, 5), size=(7, 9)) == opf.TensorType((2, 3, 7, 9), "float32")
    assert infer((1, 1, 4, 4), "int32", size=8, method="nearest_neighbor").shape == (1, 1, 8, 8)
    assert get_op("image.resize2d").pattern == OpPatternKind.kInjective


@pytest.mark.parametrize(
    "shape, dtype, attrs, message",
    [
        ((3, 4, 5), "float32", {"size": (2, 2)}, r"input 'data' must be 4-D NCHW, got shape "
                                                 r"\(3, 4, 5\)"),
        ((1, 1, 4, 4), "int32", {"size": (2, 2)}, "method 'linear' needs floating-point data, "
                                                  "got int32; cast it or use 'nearest_neighbor'"),
        ((1, 1, 4, 4), "float32", {"size": (0, 2)}, r"attribute 'size'=\(0, 2\) must be positive"),
        ((1, 1, 0, 4), "float32", {"size": (2, 2)}, r"input 'data' \(1, 1, 0, 4\) has an empty "
                                                    "image"),
        ((1, 1, 4, 4), "bool", {"size": (2, 2), "method": "nearest_neighbor"},
         "input 'data' is bool; cast"),
    ],
)
def test_resize_type_errors(shape, dtype, attrs, message):
    with pytest.raises(opf.OpfusionTypeError, match="^image.resize2d: " + message):
        infer(shape, dtype, **attrs)


@pytest.mark.parametrize(
    "attrs, message",
    [({"size": (2, 2, 2)}, "attribute 'size' must have 2 values, got 3"),
     ({"size": (2, 2), "method": "bilinear"}, "attribute 'method' must be one of"),
     ({"size": (2, 2), "coordinate_transformation_mode": "tf_crop_and_resize"},
      "attribute 'coordinate_transformation_mode' must be one of"),
     ({"size": (2, 2), "rounding_method": ""}, "attribute 'rounding_method' must be one of"),
     ({}, "attribute 'size' is required")],
)
def test_resize_attribute_errors(attrs, message):
    with pytest.raises(opf.OpAttributeError, match="^image.resize2d.*" + message):
        infer((1, 1, 4, 4), **attrs)


# -- numbers ---------------------------------------------------------------------------------

SIZES = [(7, 9), (3, 2), (8, 10), (4, 5), (1, 3)]
COORDINATE_MODES = ["half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel"]
ROUNDINGS = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("mode", COORDINATE_MODES)
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_nearest_matches_onnx(size, mode, rounding):
    attrs = dict(method="nearest_neighbor", coordinate_transformation_mode=mode,
                 rounding_method=rounding)
    got = eval_op(resize2d, IMAGE, size=size, **attrs)
    assert_close(got, resize_per_pixel(IMAGE, size, **attrs))
    assert_close(got, onnx_resize(IMAGE, size, **attrs))


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("mode", COORDINATE_MODES)
def test_linear_matches_onnx(size, mode):
    attrs = dict(method="linear", coordinate_transformation_mode=mode)
    got = eval_op(resize2d, IMAGE, size=size, **attrs)
    assert_close(got, resize_per_pixel(IMAGE, size, **attrs))
    assert_close(got, onnx_resize(IMAGE, size, **attrs))


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("mode", COORDINATE_MODES)
@pytest.mark.parametrize("exclude", [False, True])
def test_cubic_matches_onnx(size, mode, exclude):
    attrs = dict(method="cubic", coordinate_transformation_mode=mode, cubic_exclude=exclude)
    got = eval_op(resize2d, IMAGE, size=size, **attrs)
    assert_close(got, resize_per_pixel(IMAGE, size, **attrs))
    if mode == "pytorch_half_pixel" and 1 in size:
        return  # onnx.reference maps a length-1 output to -0.5, the spec (and we) to 0
    assert_close(got, onnx_resize(IMAGE, size, **attrs))


def test_cubic_alpha_is_the_kernel_coefficient():
    attrs = dict(method="cubic", cubic_alpha=-0.5, coordinate_transformation_mode="asymmetric")
    got = eval_op(resize2d, IMAGE, size=(6, 7), **attrs)
    assert_close(got, resize_per_pixel(IMAGE, (6, 7), **attrs))
    assert_close(got, onnx_resize(IMAGE, (6, 7), **attrs))


@pytest.mark.parametrize("size", [(8, 10), (3, 2), (5, 5)])
@pytest.mark.parametrize("rounding", ["round", "round_prefer_floor", "ceil"])
def test_tf_half_pixel_for_nn_and_round(size, rounding):
    # tf_half_pixel_for_nn left ONNX in opset 13 and onnx.reference has no "round", so these
    # are checked against the per-pixel formulas only.
    attrs = dict(method="nearest_neighbor", coordinate_transformation_mode="tf_half_pixel_for_nn",
                 rounding_method=rounding)
    got = eval_op(resize2d, IMAGE, size=size, **attrs)
    assert_close(got, resize_per_pixel(IMAGE, size, **attrs))
    attrs["coordinate_transformation_mode"] = "half_pixel"
    got = eval_op(resize2d, IMAGE, size=size, **attrs)
    assert_close(got, resize_per_pixel(IMAGE, size, **attrs))


def test_nearest_keeps_integer_data_exact():
    data = rng.integers(-100, 100, size=(1, 2, 3, 4)).astype(np.int32)
    attrs = dict(method="nearest_neighbor", coordinate_transformation_mode="asymmetric",
                 rounding_method="floor")
    got = eval_op(resize2d, data, size=(6, 8), **attrs)
    assert_close(got, data.repeat(2, axis=2).repeat(2, axis=3))


def test_upsampling_by_two_asymmetric_linear_interpolates_midpoints():
    data = np.arange(4, dtype=np.float32).reshape(1, 1, 1, 4)
    got = eval_op(resize2d, data, size=(1, 8), coordinate_transformation_mode="asymmetric")
    want = np.array([0, 0.5, 1, 1.5, 2, 2.5, 3, 3], np.float32).reshape(1, 1, 1, 8)
    assert_close(got, want)


# -- a given scale (ONNX Resize's `scales` input) ---------------------------------------------

def onnx_resize_scales(data, scales, method, coordinate_transformation_mode):
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode=ONNX_MODE[method],
                            coordinate_transformation_mode=coordinate_transformation_mode)
    graph = helper.make_graph(
        [node], "resize", [helper.make_tensor_value_info("x", TensorProto.FLOAT, data.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("scales", TensorProto.FLOAT, [4], [1, 1, *scales])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    return ReferenceEvaluator(model).run(None, {"x": data})[0]


@pytest.mark.parametrize("scale", [(0.6, 0.7), (1.7, 2.5), (0.3, 1.0)])
@pytest.mark.parametrize("mode", COORDINATE_MODES + ["half_pixel_symmetric"])
@pytest.mark.parametrize("method", ["nearest_neighbor", "linear", "cubic"])
def test_a_given_scale_enters_the_coordinate_formulas(scale, mode, method):
    # 4 x 0.6 rounds down to 2, whose ratio 0.5 is not the scale: the scale is what counts.
    size = tuple(int(s * n) for s, n in zip(np.float32(scale).astype(float), IMAGE.shape[2:]))
    got = eval_op(resize2d, IMAGE, size=size, scale=scale, method=method,
                  coordinate_transformation_mode=mode)
    assert_close(got, onnx_resize_scales(IMAGE, scale, method, mode))


def test_half_pixel_symmetric_without_a_scale_is_half_pixel():
    attrs = dict(size=(7, 3), method="linear")
    assert_close(eval_op(resize2d, IMAGE, coordinate_transformation_mode="half_pixel_symmetric",
                         **attrs), eval_op(resize2d, IMAGE, **attrs))


def test_scale_must_be_positive():
    with pytest.raises(opf.OpfusionTypeError, match=r"attribute 'scale'=\(0.0, 1.0\) must be "
                                                    "positive"):
        infer((1, 1, 4, 4), size=(2, 2), scale=(0.0, 1.0))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_scale_must_be_finite(bad):
    with pytest.raises(opf.OpfusionTypeError, match="must be positive and finite"):
        infer((1, 1, 4, 4), size=(2, 2), scale=(bad, 1.0))
