"""ONNX reductions over an empty axis give onnxruntime's values (0 for the mean and sums, 1
for the product, the dtype's extremes for max and min, -inf for the logs) in the reference
interpreter and in the compiled model alike."""

import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import helper, numpy_helper  # noqa: E402

import opfusion as opf  # noqa: E402
from opfusion.frontend import from_onnx  # noqa: E402

FLOAT_ONLY = ["ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]
EVERY_DTYPE = ["ReduceMean", "ReduceSum", "ReduceProd", "ReduceMax", "ReduceMin"]


def reduce_model(op_type, x, axes, keepdims):
    node = helper.make_node(op_type, ["x", "axes"], ["y"], keepdims=keepdims)
    elem = helper.np_dtype_to_tensor_dtype(x.dtype)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", elem, x.shape)],
                              [helper.make_tensor_value_info("y", elem, None)],
                              [numpy_helper.from_array(np.array(axes, np.int64), "axes")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("op_type, dtype", [(o, "float32") for o in EVERY_DTYPE + FLOAT_ONLY]
                         + [(o, "int32") for o in EVERY_DTYPE])
def test_reducing_an_empty_axis_agrees_with_onnxruntime(op_type, dtype, keepdims):
    x = np.zeros((2, 0, 3), dtype)
    model = reduce_model(op_type, x, [1], keepdims)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    want = session.run(None, {"x": x})[0]
    mod, params = from_onnx(model)
    got = opf.ir.evaluate(mod, {"x": x})
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(opf.compile(mod, params=params).run({"x": x})[0], want)
