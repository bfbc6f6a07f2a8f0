"""The TE compute of image.resize2d agrees with its NumPy reference (ONNX Resize)."""

import shutil

import numpy as np
import pytest

import opfusion as opf
from opfusion.topi.testing import check_compute

needs_cc = pytest.mark.skipif(not (shutil.which("gcc") or shutil.which("cc")),
                              reason="no C compiler")

_MODES = ["half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel",
          "tf_half_pixel_for_nn", "half_pixel_symmetric"]
_ROUNDING = ["round", "floor", "ceil", "round_prefer_floor", "round_prefer_ceil"]
_SIZES = [(5, 7), (1, 2), (6, 8), (2, 3)]  # up, to one row, exact 2x, down


@pytest.fixture
def kernel_cache(tmp_path, monkeypatch):
    """Compiled kernels go to a private cache, not ~/.cache."""
    monkeypatch.setenv("OPFUSION_CACHE_DIR", str(tmp_path))


def _image(dtype="float32"):
    return np.random.default_rng(0).standard_normal((1, 2, 3, 4)).astype(dtype)


@pytest.mark.parametrize("mode", _MODES)
@pytest.mark.parametrize("rounding", _ROUNDING)
def test_nearest(mode, rounding):
    for size in _SIZES:
        check_compute(opf.op.image.resize2d, _image(), size=size, method="nearest_neighbor",
                      coordinate_transformation_mode=mode, rounding_method=rounding)


@pytest.mark.parametrize("mode", _MODES)
@pytest.mark.parametrize("method", ["linear", "cubic"])
def test_interpolating(mode, method):
    for size in _SIZES:
        check_compute(opf.op.image.resize2d, _image(), size=size, method=method,
                      coordinate_transformation_mode=mode)


@pytest.mark.parametrize("mode", ["half_pixel", "align_corners", "asymmetric"])
def test_cubic_exclude_outside_and_alpha(mode):
    for size in _SIZES:
        check_compute(opf.op.image.resize2d, _image(), size=size, method="cubic",
                      coordinate_transformation_mode=mode, cubic_exclude=True, cubic_alpha=-0.5)


@pytest.mark.parametrize("method", ["nearest_neighbor", "linear", "cubic"])
def test_given_scale(method):
    check_compute(opf.op.image.resize2d, _image(), size=(5, 7), method=method, scale=(1.7, 1.8))
    check_compute(opf.op.image.resize2d, _image(), size=(5, 7), method=method,
                  coordinate_transformation_mode="half_pixel_symmetric", scale=(1.7, 1.8))


def test_nearest_keeps_integer_data():
    data = np.arange(24, dtype="int32").reshape(1, 2, 3, 4)
    check_compute(opf.op.image.resize2d, data, size=(7, 9), method="nearest_neighbor",
                  coordinate_transformation_mode="asymmetric", rounding_method="floor")


def test_float16_linear():
    check_compute(opf.op.image.resize2d, _image("float16"), size=(5, 7), method="linear",
                  rtol=2e-3)


@needs_cc
@pytest.mark.parametrize("method", ["nearest_neighbor", "linear", "cubic"])
def test_resize_compiled(method, kernel_cache):
    for mode in ["half_pixel", "asymmetric"]:
        check_compute(opf.op.image.resize2d, _image(), size=(6, 9), method=method,
                      coordinate_transformation_mode=mode, compiled=True)
