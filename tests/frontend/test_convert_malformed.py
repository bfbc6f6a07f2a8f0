"""Malformed attributes and constant inputs of the window, resize, Range and Trilu converters:
each is an opfusion error naming the node (never a ZeroDivisionError, ValueError or
OverflowError from the arithmetic), and the extreme but valid cases agree with onnxruntime."""

import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import helper, numpy_helper  # noqa: E402

import opfusion as opf  # noqa: E402
from opfusion.errors import OpfusionError  # noqa: E402
from opfusion.frontend import from_onnx  # noqa: E402

INT64_MIN, INT64_MAX = np.iinfo(np.int64).min, np.iinfo(np.int64).max


def randn(*shape):
    return np.random.default_rng(0).standard_normal(shape, dtype=np.float32)


def model_of(op_type, inputs, consts=(), opset=19, out=np.float32, **attrs):
    """A one-node model with output dtype ``out``: ``inputs`` maps names to arrays (those in
    ``consts`` become initializers, the rest graph inputs); returns the model and its feeds."""
    node = helper.make_node(op_type, list(inputs), ["y"], name="bad_node", **attrs)
    feeds = {n: v for n, v in inputs.items() if n not in consts}
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for n, v in feeds.items()],
        [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(np.dtype(out)), None)],
        [numpy_helper.from_array(np.asarray(inputs[n]), n) for n in consts])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), feeds


def import_error(op_type, inputs, consts=(), **attrs):
    model, _ = model_of(op_type, inputs, consts, **attrs)
    with pytest.raises(OpfusionError) as info:
        from_onnx(model)
    message = str(info.value)
    assert op_type in message and "bad_node" in message, message
    return message


X = randn(1, 2, 6, 6)
W = randn(2, 2, 3, 3)
X3 = randn(1, 2, 5, 6, 6)


@pytest.mark.parametrize("op_type, inputs, attrs", [
    ("Conv", {"x": X, "w": np.zeros((2, 2, 0, 0), np.float32)}, {}),
    ("Conv", {"x": X, "w": np.zeros((2, 2, 0, 0), np.float32)}, {"kernel_shape": [0, 0]}),
    ("Conv", {"x": X3, "w": np.zeros((2, 2, 0, 3, 3), np.float32)}, {}),
    ("ConvTranspose", {"x": X, "w": np.zeros((2, 2, 0, 3), np.float32)}, {}),
    ("MaxPool", {"x": X}, {"kernel_shape": [0, 0]}),
    ("AveragePool", {"x": X}, {"kernel_shape": [-1, 2]}),
    ("LpPool", {"x": X}, {"kernel_shape": [0, 2]}),
    ("LpPool", {"x": X}, {"kernel_shape": [-1, 2], "ceil_mode": 1}),
    ("LpPool", {"x": X3}, {"kernel_shape": [0, 2, 2]}),
])
def test_empty_or_negative_kernels_are_errors(op_type, inputs, attrs):
    message = import_error(op_type, inputs, consts=("w",) if "w" in inputs else (), **attrs)
    assert "kernel" in message and "positive" in message


@pytest.mark.parametrize("value", [0, -1])
@pytest.mark.parametrize("op_type, inputs, attrs", [
    ("Conv", {"x": X, "w": W}, {"auto_pad": "SAME_UPPER"}),
    ("Conv", {"x": X3, "w": randn(2, 2, 3, 3, 3)}, {}),
    ("ConvTranspose", {"x": X, "w": W}, {}),
    ("MaxPool", {"x": X}, {"kernel_shape": [2, 2], "auto_pad": "SAME_LOWER"}),
    ("LpPool", {"x": X}, {"kernel_shape": [2, 2], "ceil_mode": 1}),
])
@pytest.mark.parametrize("name", ["strides", "dilations"])
def test_zero_or_negative_strides_and_dilations_are_errors(op_type, inputs, attrs, name, value):
    rank = inputs["x"].ndim - 2
    attrs = {**attrs, name: [value] + [1] * (rank - 1)}
    message = import_error(op_type, inputs, consts=("w",) if "w" in inputs else (), **attrs)
    assert name in message and ">= 1" in message


@pytest.mark.parametrize("op_type, attrs", [("LpPool", {"kernel_shape": [2, 2]}),
                                            ("GlobalLpPool", {})])
@pytest.mark.parametrize("p", [0, -1])
def test_lp_pool_order_must_be_positive(op_type, attrs, p):
    message = import_error(op_type, {"x": X}, p=p, **attrs)
    assert f"p={p}" in message and "positive" in message


def resize_inputs(scales=None, sizes=None):
    empty = np.zeros(0, np.float32)
    return {"x": X, "roi": empty,
            "scales": empty if scales is None else np.asarray(scales, np.float32),
            "sizes": np.zeros(0, np.int64) if sizes is None else np.asarray(sizes, np.int64)}


@pytest.mark.parametrize("scale", [np.nan, np.inf, -np.inf, -2.0, 0.0])
def test_resize_scales_must_be_finite_and_positive(scale):
    inputs = resize_inputs(scales=[1, 1, scale, 2])
    message = import_error("Resize", inputs, consts=("roi", "scales", "sizes"))
    assert "finite and positive" in message


@pytest.mark.parametrize("opset", [9, 10])
def test_legacy_upsample_and_resize_scales_must_be_finite(opset):
    op_type = "Upsample" if opset == 9 else "Resize"
    inputs = {"x": X, "scales": np.array([1, 1, np.nan, 2], np.float32)}
    model, _ = model_of(op_type, inputs, ("scales",), opset=opset)
    with pytest.raises(OpfusionError, match="finite and positive"):
        from_onnx(model)


def test_resize_sizes_must_not_be_negative():
    inputs = resize_inputs(sizes=[1, 2, -3, 4])
    message = import_error("Resize", inputs, consts=("roi", "scales", "sizes"))
    assert "negative" in message


def range_inputs(start, limit, delta, dtype):
    return {name: np.asarray(value, dtype) for name, value in
            (("start", start), ("limit", limit), ("delta", delta))}


@pytest.mark.parametrize("bad", ["start", "limit", "delta"])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_range_of_non_finite_floats_is_an_error(bad, value):
    inputs = range_inputs(0.0, 5.0, 1.0, np.float32)
    inputs[bad] = np.asarray(value, np.float32)
    message = import_error("Range", inputs, consts=tuple(inputs))
    assert f"{bad} is" in message and "finite" in message


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32])
def test_range_with_zero_delta_is_an_error(dtype):
    inputs = range_inputs(0, 5, 0, dtype)
    assert "delta is 0" in import_error("Range", inputs, consts=tuple(inputs))


@pytest.mark.parametrize("start, limit, delta", [
    (0, INT64_MAX, 1),        # float64 arithmetic made this range empty
    (INT64_MIN, INT64_MAX, 3),
    (INT64_MAX, INT64_MIN, -1),
])
def test_a_range_too_large_to_hold_is_an_error(start, limit, delta):
    inputs = range_inputs(start, limit, delta, np.int64)
    assert "elements" in import_error("Range", inputs, consts=tuple(inputs))


def run_ort(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


@pytest.mark.parametrize("start, limit, delta, dtype", [
    (INT64_MAX - 5, INT64_MAX, 2, np.int64),     # exact near the top of int64
    (INT64_MIN, INT64_MIN + 7, 3, np.int64),
    (2**53 + 1, 2**53 + 4, 1, np.int64),         # not representable in float64
    (10, -10, -7, np.int32),
    (0.5, 3.0, 0.75, np.float32),
])
def test_extreme_but_valid_ranges_agree_with_onnxruntime(start, limit, delta, dtype):
    inputs = range_inputs(start, limit, delta, dtype)
    model, _ = model_of("Range", inputs, consts=tuple(inputs), out=dtype)
    mod, params = from_onnx(model)
    want = run_ort(model, {})
    got = opf.ir.evaluate(mod, {})
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(opf.compile(mod, params=params).run({})[0], want)


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [INT64_MIN, INT64_MIN + 1, -4, 5, INT64_MAX])
def test_trilu_with_extreme_diagonals_agrees_with_onnxruntime(upper, k):
    x = randn(2, 3, 4)
    inputs = {"x": x, "k": np.asarray(k, np.int64)}
    model, feeds = model_of("Trilu", inputs, consts=("k",), upper=upper)
    mod, params = from_onnx(model)
    want = run_ort(model, feeds)
    np.testing.assert_array_equal(opf.ir.evaluate(mod, feeds), want)
    np.testing.assert_array_equal(opf.compile(mod, params=params).run(feeds)[0], want)
