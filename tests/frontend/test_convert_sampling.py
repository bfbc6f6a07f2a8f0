"""GridSample, RoiAlign, DeformConv and Resize's crop and antialias modes: imported graphs
agree with onnx.reference in every mode, interpreted and compiled."""

import itertools

import numpy as np
import pytest

pytest.importorskip("onnx")
from onnx import helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402
from onnx_one_node import check, make_model  # noqa: E402

import opfusion as opf  # noqa: E402
from opfusion.errors import IndexOutOfRangeError, OnnxImportError, OpfusionError  # noqa: E402
from opfusion.frontend import from_onnx  # noqa: E402
from opfusion.testing import assert_close  # noqa: E402

rng = np.random.default_rng(11)


def normal(*shape):
    return rng.standard_normal(shape).astype(np.float32)


# -- GridSample ------------------------------------------------------------------------------

IMAGE = normal(2, 3, 4, 5)
# Points inside and outside [-1, 1], and a lattice whose pixel coordinates hit .5 ties.
GRID = np.concatenate([rng.uniform(-1.4, 1.4, (2, 3, 4, 2)),
                       np.stack(np.meshgrid(np.linspace(-1.25, 1.25, 4),
                                            np.linspace(-1, 1, 3)), -1)[None].repeat(2, 0)],
                      axis=1).astype(np.float32)


@pytest.mark.parametrize("mode,padding,align", itertools.product(
    ("linear", "nearest", "cubic"), ("zeros", "border", "reflection"), (0, 1)))
def test_grid_sample_2d(mode, padding, align):
    check("GridSample", {"x": IMAGE, "grid": GRID}, mode=mode, padding_mode=padding,
          align_corners=align)


@pytest.mark.parametrize("old,new", [("bilinear", "linear"), ("nearest", "nearest"),
                                     ("bicubic", "cubic")])
def test_grid_sample_opset16_mode_names(old, new):
    # onnx.reference knows only opset 20's names: compare with the renamed node.
    inputs = {"x": IMAGE, "grid": GRID}
    model = make_model(helper.make_node("GridSample", ["x", "grid"], ["y"], mode=new,
                                        padding_mode="border"), inputs)
    want = ReferenceEvaluator(model).run(None, inputs)[0]
    model = make_model(helper.make_node("GridSample", ["x", "grid"], ["y"], mode=old,
                                        padding_mode="border"), inputs, opset=16)
    assert_close(opf.ir.evaluate(from_onnx(model)[0], inputs), want)


@pytest.mark.parametrize("mode,padding,align", itertools.product(
    ("linear", "nearest"), ("zeros", "border", "reflection"), (0, 1)))
def test_grid_sample_volumetric(mode, padding, align):
    volume = normal(1, 2, 3, 4, 2)
    grid = rng.uniform(-1.3, 1.3, (1, 2, 3, 2, 3)).astype(np.float32)
    check("GridSample", {"x": volume, "grid": grid}, mode=mode, padding_mode=padding,
          align_corners=align)


def test_grid_sample_compiled_and_integer_nearest():
    check("GridSample", {"x": IMAGE, "grid": GRID}, compiled=True, mode="cubic",
          padding_mode="reflection")
    tokens = rng.integers(-50, 50, (2, 3, 4, 5)).astype(np.int64)
    check("GridSample", {"x": tokens, "grid": GRID}, compiled=True, mode="nearest")


def test_grid_sample_refuses_linear_on_integers():
    tokens = np.zeros((1, 1, 2, 2), np.int32)
    model = make_model(helper.make_node("GridSample", ["x", "g"], ["y"]),
                       {"x": tokens, "g": np.zeros((1, 1, 1, 2), np.float32)})
    with pytest.raises(OpfusionError, match="float"):
        from_onnx(model)


# -- RoiAlign --------------------------------------------------------------------------------

FEATURES = normal(2, 3, 8, 10)
ROIS = np.array([[0.5, 1.0, 6.2, 5.7], [-2.0, -1.0, 3.0, 2.5], [4.0, 3.0, 12.0, 9.5],
                 [2.0, 2.0, 2.0, 2.0], [7.0, 1.0, 3.0, 6.0]], np.float32)
BATCHES = np.array([0, 1, 1, 0, 1], np.int64)


@pytest.mark.parametrize("mode,coordinates,ratio", itertools.product(
    ("avg", "max"), ("half_pixel", "output_half_pixel"), (0, 2)))
def test_roi_align(mode, coordinates, ratio):
    check("RoiAlign", {"x": FEATURES, "rois": ROIS, "b": BATCHES}, opset=16, mode=mode,
          coordinate_transformation_mode=coordinates, sampling_ratio=ratio,
          output_height=3, output_width=4, spatial_scale=0.75)


def test_roi_align_opset10_and_compiled():
    # Opset 10 does not shift boxes by half a pixel: opset 16 kept that as output_half_pixel
    # (onnx.reference applies opset 16's default, half_pixel, to opset 10 too).
    inputs = {"x": FEATURES, "rois": ROIS, "b": BATCHES}
    attrs = dict(output_height=2, output_width=2, sampling_ratio=0)
    model = make_model(helper.make_node("RoiAlign", ["x", "rois", "b"], ["y"], **attrs,
                                        coordinate_transformation_mode="output_half_pixel"),
                       inputs, opset=16)
    want = ReferenceEvaluator(model).run(None, inputs)[0]
    model = make_model(helper.make_node("RoiAlign", ["x", "rois", "b"], ["y"], **attrs),
                       inputs, opset=10)
    assert_close(opf.ir.evaluate(from_onnx(model)[0], inputs), want)
    check("RoiAlign", {"x": FEATURES, "rois": ROIS, "b": BATCHES}, opset=16, compiled=True,
          mode="max", output_height=3, output_width=2, sampling_ratio=2)


def test_roi_align_batch_index_out_of_range_raises():
    inputs = {"x": FEATURES, "rois": ROIS[:2], "b": np.array([0, 2], np.int64)}
    model = make_model(helper.make_node("RoiAlign", ["x", "rois", "b"], ["y"]), inputs,
                       opset=16)
    mod, params = from_onnx(model)
    with pytest.raises(IndexOutOfRangeError, match="batch index 2 of RoI 1"):
        opf.ir.evaluate(mod, inputs)
    with pytest.raises(IndexOutOfRangeError, match="batch index 2"):
        opf.compile(mod, params=params).run(inputs)


# -- DeformConv ------------------------------------------------------------------------------


def deform_inputs(channels=4, out_channels=4, groups=1, offset_groups=1, kernel=(2, 2),
                  out_hw=(3, 3), mask=False, bias=False):
    inputs = {"x": normal(2, channels, 5, 5), "w": normal(out_channels, channels // groups,
                                                         *kernel),
              "offset": normal(2, 2 * offset_groups * kernel[0] * kernel[1], *out_hw)}
    names = ["x", "w", "offset", "", ""]
    if bias:
        inputs["b"], names[3] = normal(out_channels), "b"
    if mask:
        inputs["m"] = rng.uniform(0, 1, (2, offset_groups * kernel[0] * kernel[1],
                                         *out_hw)).astype(np.float32)
        names[4] = "m"
    while names[-1] == "":
        names.pop()
    return inputs, names


@pytest.mark.parametrize("case", [
    dict(out_hw=(4, 4)),
    dict(out_hw=(4, 4), bias=True, mask=True),
    dict(groups=2, offset_groups=2, out_hw=(4, 4), mask=True),
    dict(offset_groups=4, kernel=(3, 2), out_hw=(2, 2), strides=(2, 2), dilations=(1, 2),
         pads=(1, 0, 0, 1), bias=True),
])
def test_deform_conv(case):
    case = dict(case)
    attrs = {k: case.pop(k) for k in ("strides", "dilations", "pads") if k in case}
    inputs, names = deform_inputs(**case)
    check("DeformConv", inputs, opset=19, names=names, compiled=case.get("mask", False),
          group=case.get("groups", 1), offset_group=case.get("offset_groups", 1),
          rtol=1e-5, **attrs)


# -- Resize: tf_crop_and_resize and antialias ------------------------------------------------

PICTURE = normal(1, 2, 6, 7)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("given", [
    {"scales": np.array([1, 1, 0.5, 0.6], np.float32)},
    {"sizes": np.array([1, 2, 2, 4], np.int64)},
    {"sizes": np.array([1, 2, 9, 3], np.int64)},  # grows H, shrinks W
])
def test_resize_antialias(mode, given):
    names = ["x", "", *(["s"] if "scales" in given else ["", "s"])]
    check("Resize", {"x": PICTURE}, {"s": next(iter(given.values()))}, opset=19, names=names,
          mode=mode, antialias=1)


def test_resize_antialias_axes_exclude_outside_compiled():
    check("Resize", {"x": PICTURE}, {"s": np.array([0.4, 0.7], np.float32)}, opset=19,
          names=["x", "", "s"], mode="cubic", antialias=1, axes=[3, 2], exclude_outside=1,
          cubic_coeff_a=-0.5, coordinate_transformation_mode="align_corners", compiled=True)


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
def test_resize_tf_crop_and_resize(mode):
    roi = np.array([0, 0, 0.2, -0.1, 1, 1, 0.9, 1.2], np.float32)
    check("Resize", {"x": PICTURE, "roi": roi}, {"s": np.array([1, 2, 5, 6], np.int64)},
          opset=19, names=["x", "roi", "", "s"], mode=mode,
          coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=3.5)


def test_resize_tf_crop_and_resize_axes_roi_at_run_time_compiled():
    roi = np.array([0.1, 0.3, 0.8, 1.4], np.float32)  # axis 3's box, then axis 2's
    mod = check("Resize", {"x": PICTURE, "roi": roi},
                {"s": np.array([3, 4], np.float32)}, opset=19, names=["x", "roi", "s"],
                axes=[3, 2], coordinate_transformation_mode="tf_crop_and_resize",
                mode="linear", compiled=True)
    assert "image.resample" in mod.astext()


def test_resize_antialias_nearest_is_an_error():
    model = make_model(helper.make_node("Resize", ["x", "", "s"], ["y"], antialias=1),
                       {"x": PICTURE}, {"s": np.array([1, 1, 0.5, 0.5], np.float32)},
                       opset=19)
    with pytest.raises(OnnxImportError, match="nearest"):
        from_onnx(model)
