"""Gather, GatherElements and GatherND with out-of-range indices raise, as ONNX Runtime does,
in the reference interpreter and in compiled models alike (an IndexOutOfRangeError naming the
node); constant ones are refused at import; in-range ones, the negative bounds included,
agree with ONNX Runtime. At the operator level take and gather_elements check by default and
clamp only when asked to."""

import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import helper, numpy_helper  # noqa: E402

import opfusion as opf  # noqa: E402
from opfusion.errors import IndexOutOfRangeError, OpfusionError  # noqa: E402
from opfusion.frontend import from_onnx  # noqa: E402
from opfusion.testing import eval_op  # noqa: E402

DATA = np.arange(30, dtype=np.float32).reshape(5, 3, 2)


def gather_model(op_type, indices, consts=(), **attrs):
    node = helper.make_node(op_type, ["data", "indices"], ["y"], name="picker", **attrs)
    inputs = {"data": DATA, "indices": indices}
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for n, v in inputs.items() if n not in consts],
        [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(DATA.dtype), None)],
        [numpy_helper.from_array(inputs[n], n) for n in consts])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return model, {n: v for n, v in inputs.items() if n not in consts}


def run_ort(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


CASES = [  # op type, attributes, in-range indices, out-of-range indices
    ("Gather", {"axis": 0}, np.array([[0, -5], [4, -1]]), np.array([[0, 5]])),
    ("Gather", {"axis": 1}, np.array([-3, 2]), np.array([1, -4])),
    ("Gather", {"axis": -1}, np.array(-2), np.array(2)),
    ("GatherElements", {"axis": 1}, np.array([[[0, -3], [2, 1]]] * 5),
     np.array([[[0, 3], [2, 1]]] * 5)),
    ("GatherND", {}, np.array([[4, -3], [-5, 2]]), np.array([[4, -3], [0, 3]])),
    ("GatherND", {"batch_dims": 1}, np.array([[[2, -1]]] * 5), np.array([[[-4, 0]]] * 5)),
]


@pytest.mark.parametrize("op_type, attrs, good, bad, dtype", [
    (*case, dtype) for case in CASES for dtype in (np.int32, np.int64)
    if dtype == np.int64 or case[0] != "GatherND"])  # GatherND's indices are int64 only
def test_in_range_indices_agree_with_onnxruntime(op_type, attrs, good, bad, dtype):
    model, feeds = gather_model(op_type, good.astype(dtype), **attrs)
    want = run_ort(model, feeds)
    mod, params = from_onnx(model)
    np.testing.assert_array_equal(opf.ir.evaluate(mod, feeds), want)
    np.testing.assert_array_equal(opf.compile(mod, params=params).run(feeds)[0], want)


@pytest.mark.parametrize("op_type, attrs, good, bad", CASES)
def test_out_of_range_indices_raise_in_both_engines_as_in_onnxruntime(op_type, attrs, good,
                                                                      bad):
    model, feeds = gather_model(op_type, bad.astype(np.int64), **attrs)
    with pytest.raises(Exception, match="(?i)out of|invalid"):  # ORT's words vary per op
        run_ort(model, feeds)
    mod, params = from_onnx(model)
    exe = opf.compile(mod, params=params)
    for run in (lambda: opf.ir.evaluate(mod, feeds), lambda: exe.run(feeds)):
        with pytest.raises(IndexOutOfRangeError, match=rf"{op_type} \(node 'picker'\) "
                                                        r"indices: index -?\d+ at position"):
            run()


@pytest.mark.parametrize("op_type, attrs, good, bad", CASES)
def test_constant_out_of_range_indices_are_import_errors(op_type, attrs, good, bad):
    model, _ = gather_model(op_type, bad.astype(np.int64), consts=("indices",), **attrs)
    with pytest.raises(OpfusionError, match=rf"{op_type} \(node 'picker'.*out of range"):
        from_onnx(model)


def test_take_and_gather_elements_check_unless_asked_to_clamp():
    data = np.arange(5, dtype=np.float32)
    indices = np.array([1, 5, -6], np.int64)
    with pytest.raises(IndexOutOfRangeError, match=r"^take along axis 0 .*index 5 at position "
                                                   r"\(1,\).* size 5.*\[-5, 4\]"):
        eval_op(opf.op.take, data, indices, axis=0)
    np.testing.assert_array_equal(eval_op(opf.op.take, data, indices, axis=0, mode="clip"),
                                  [1, 4, 0])
    with pytest.raises(IndexOutOfRangeError, match="^gather_elements along axis 0"):
        eval_op(opf.op.gather_elements, data, indices)
    np.testing.assert_array_equal(eval_op(opf.op.gather_elements, data, indices, mode="clip"),
                                  [1, 4, 0])


def test_check_indices_passes_indices_through_and_checks_its_bounds():
    tuples = np.array([[1, -2], [0, 2]], np.int64)
    np.testing.assert_array_equal(eval_op(opf.op.check_indices, tuples, bounds=[2, 3]), tuples)
    with pytest.raises(IndexOutOfRangeError, match=r"index 2 at position \(1, 1\).* size 2"):
        eval_op(opf.op.check_indices, tuples, bounds=[2, 2])
    with pytest.raises(opf.OpfusionTypeError, match="one size per position of the last axis"):
        _ = opf.op.check_indices(opf.var("i", (2, 3), "int64"), bounds=[2, 2]).checked_type
    with pytest.raises(opf.OpfusionTypeError, match="must be int32 or int64"):
        _ = opf.op.check_indices(opf.var("i", (2,), "float32"), bounds=[2]).checked_type
