"""One-node ONNX models for the converter tests, checked against onnx.reference: the model of
one node over graph inputs and initializers, and the check that imports it, evaluates it (and
compiles and runs it) and compares with the oracle."""

import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import opfusion as opf
from opfusion.frontend import from_onnx
from opfusion.testing import assert_close


def make_model(node, inputs, consts=None, opset=20):
    """A graph of ``node`` over graph ``inputs`` and initializers ``consts`` (name -> array),
    its outputs the node's, of types left to inference."""
    def info(name, array):
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(array.dtype),
                                             array.shape)

    inits = [helper.make_tensor(name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape,
                                a.reshape(-1).tolist()) for name, a in (consts or {}).items()]
    graph = helper.make_graph(
        [node], "g", [info(n, a) for n, a in inputs.items()],
        [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in node.output],
        inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def check(op_type, inputs, consts=None, opset=20, names=None, compiled=False, rtol=1e-5,
          **attrs):
    """One node over ``inputs`` then ``consts`` (or ``names``; '' leaves one out): import,
    evaluate (and compile and run), compare with onnx.reference. Returns the module."""
    consts = dict(consts or {})
    node = helper.make_node(op_type, names or list(inputs) + list(consts), ["y"], **attrs)
    model = make_model(node, inputs, consts, opset)
    want = ReferenceEvaluator(model).run(None, inputs)[0]
    mod, params = from_onnx(model)
    assert_close(opf.ir.evaluate(mod, inputs), want, rtol=rtol)
    if compiled:
        assert_close(opf.compile(mod, params=params).run(inputs)[0], want, rtol=rtol)
    return mod



# -- graphs of several nodes -------------------------------------------------------------------

def value(name, elem, shape):
    """A graph input or output of element type ``elem`` and ``shape`` (None: unknown)."""
    return helper.make_tensor_value_info(name, elem, shape)


def const(name, array):
    """A Constant node giving ``array`` as ``name``."""
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(
        name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape,
        array.reshape(-1).tolist()))


def model(nodes, inputs, outputs, opset=17, inits=()):
    """A model of ``nodes`` over ``inputs`` (value infos) giving ``outputs``."""
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def check_model(proto, feeds, compiled=False, rtol=1e-5, oracle="reference"):
    """Import ``proto``, evaluate it (and compile and run it) on ``feeds`` and compare with
    onnx.reference, or with ONNX Runtime (``oracle="onnxruntime"``) for what onnx.reference
    does not implement. Returns the module."""
    if oracle == "onnxruntime":
        ort = pytest.importorskip("onnxruntime")
        want = ort.InferenceSession(proto.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, feeds)
    else:
        want = ReferenceEvaluator(proto).run(None, feeds)
    want = want[0] if len(want) == 1 else tuple(want)
    mod, params = from_onnx(proto)
    assert_close(opf.ir.evaluate(mod, feeds), want, rtol=rtol)
    if compiled:
        got = opf.compile(mod, params=params).run(feeds)
        assert_close(tuple(got) if len(got) > 1 else got[0], want, rtol=rtol)
    return mod
