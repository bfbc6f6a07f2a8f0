"""Element types of binary ONNX operators: inputs of two types are refused where ONNX gives
both one type T (the importer used to cast B to A's type, so a float/uint16 Div became an
integer division: fuzz case 2303 seed 0), and Pow's exponent of another type (allowed from
opset 12) gives ONNX Runtime's values."""

import numpy as np
import pytest

pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

import opfusion as opf  # noqa: E402
from opfusion.errors import OnnxImportError  # noqa: E402
from opfusion.frontend import from_onnx  # noqa: E402
from opfusion.ir.evaluate import evaluate  # noqa: E402


def one_node(op_type, inputs, opset=17, out_dtype=None):
    node = helper.make_node(op_type, list(inputs), ["y"], name="n0")
    out = (TensorProto.UNDEFINED if out_dtype is None
           else helper.np_dtype_to_tensor_dtype(np.dtype(out_dtype)))
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in inputs.items()],
        [helper.make_tensor_value_info("y", out, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("op_type, a_dtype, b_dtype", [
    ("Div", np.uint16, np.float32), ("Add", np.float32, np.int64), ("Mul", np.int32, np.int64),
    ("Sub", np.float64, np.float32), ("Less", np.float32, np.int32),
    ("BitwiseAnd", np.int32, np.uint8),
])
def test_binary_inputs_of_two_types_are_refused(op_type, a_dtype, b_dtype):
    model = one_node(op_type, {"a": np.ones(3, a_dtype), "b": np.ones(3, b_dtype)}, opset=18)
    with pytest.raises(OnnxImportError, match=r"node 'n0'.*differ in element type"):
        from_onnx(model)


def test_pow_of_two_types_before_opset_12_is_refused():
    model = one_node("Pow", {"a": np.ones(3, np.float32), "b": np.ones(3, np.float64)},
                     opset=11)
    with pytest.raises(OnnxImportError, match="node 'n0'.*before opset 12"):
        from_onnx(model)


@pytest.mark.parametrize("base, exponent", [
    (np.array([2, 3, 4, -2, 5, 0], np.int32), np.array([0.5, 2.0, -1.0, 3.0, 1.5, 2.0],
                                                        np.float32)),
    (np.array([2, 3, -4, 7, 1, 0], np.int32), np.array([3, 2, 3, 0, 40, 2], np.int64)),
    (np.array([1.5, -2.0, 0.25, 3.0], np.float32), np.array([2, 3, -1, 0], np.int64)),
    (np.array([200, 3, -16, 255], np.int64), np.array([1, 4, 2, 7], np.int32)),
])
def test_pow_with_an_exponent_of_another_type_agrees_with_onnxruntime(base, exponent):
    ort = pytest.importorskip("onnxruntime")
    inputs = {"a": base, "b": exponent}
    model = one_node("Pow", inputs, opset=15, out_dtype=base.dtype)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    want = session.run(None, inputs)[0]
    mod, params = from_onnx(model)
    reference = evaluate(mod, inputs)
    compiled = opf.compile(mod, params=params).run(inputs)[0]
    assert reference.dtype == compiled.dtype == want.dtype == base.dtype
    np.testing.assert_allclose(reference, want, rtol=1e-6)
    np.testing.assert_allclose(compiled, want, rtol=1e-6)
