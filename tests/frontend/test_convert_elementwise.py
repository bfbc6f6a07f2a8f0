"""Elementwise ONNX converters: imported graphs agree with onnx.reference."""

import numpy as np
import pytest

pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import opfusion as opf  # noqa: E402
from opfusion.frontend import from_onnx  # noqa: E402
from opfusion.testing import assert_close  # noqa: E402

rng = np.random.default_rng(3)


def check_against_onnx(op_type, inputs, opset=17, initializers=(), **attrs):
    """One-node model over ``inputs`` (name -> array); import, evaluate, compare."""
    names = list(inputs)
    node = helper.make_node(op_type, names + [i.name for i in initializers], ["y"], **attrs)
    graph = helper.make_graph(
        [node], "one", [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype),
                                                      a.shape) for n, a in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)], list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    want = ReferenceEvaluator(model).run(None, inputs)[0]
    mod, _ = from_onnx(model)
    got = opf.ir.evaluate(mod, inputs)
    assert_close(got, want, rtol=1e-6)
    return mod


X = rng.standard_normal((2, 3, 4)).astype(np.float32)
Y = rng.standard_normal((3, 1)).astype(np.float32)
POS = np.abs(X) + 0.2


@pytest.mark.parametrize("op_type, data", [
    ("Neg", X), ("Abs", X), ("Exp", X), ("Log", POS), ("Sqrt", POS), ("Sigmoid", X),
    ("Tanh", X), ("Erf", X), ("Floor", X * 3), ("Ceil", X * 3), ("Relu", X), ("Sign", X),
    ("Sin", X), ("Cos", X), ("Reciprocal", POS), ("Identity", X), ("Round", X * 3),
])
def test_unary(op_type, data):
    check_against_onnx(op_type, {"x": data})


@pytest.mark.parametrize("op_type", ["Add", "Sub", "Mul", "Div", "Equal", "Less", "Greater",
                                     "LessOrEqual", "GreaterOrEqual"])
def test_binary_with_broadcasting(op_type):
    check_against_onnx(op_type, {"a": X, "b": Y})


def test_pow_with_integer_exponent_casts_it():
    check_against_onnx("Pow", {"a": POS, "b": np.array(2, np.int64)})


@pytest.mark.parametrize("op_type", ["Max", "Min", "Sum", "Mean"])
def test_variadic(op_type):
    check_against_onnx(op_type, {"a": X, "b": Y, "c": X[0]})


def test_logical_ops_and_where():
    p, q = X > 0, Y > 0
    for op_type in ("And", "Or", "Xor"):
        check_against_onnx(op_type, {"p": p, "q": q})
    check_against_onnx("Not", {"p": p})
    check_against_onnx("Where", {"c": p, "a": X, "b": Y})


def test_mod_both_ways():
    a = (X * 10).astype(np.float32)
    b = np.full((3, 1), 3.0, np.float32)
    check_against_onnx("Mod", {"a": a, "b": b}, fmod=1)
    ints_a = np.array([7, -7, 7, -7], np.int32)
    ints_b = np.array([3, 3, -3, -3], np.int32)
    check_against_onnx("Mod", {"a": ints_a, "b": ints_b})
    check_against_onnx("Mod", {"a": ints_a, "b": ints_b}, fmod=1)


def test_cast_and_leaky_relu():
    check_against_onnx("Cast", {"x": X * 5}, to=TensorProto.INT32)
    check_against_onnx("LeakyRelu", {"x": X}, alpha=0.3)


def test_clip_before_and_after_opset_11():
    check_against_onnx("Clip", {"x": X}, opset=6, min=-0.5, max=0.5)
    lo = helper.make_tensor("lo", TensorProto.FLOAT, [], [-0.25])
    hi = helper.make_tensor("hi", TensorProto.FLOAT, [], [0.75])
    mod = check_against_onnx("Clip", {"x": X}, opset=13, initializers=[lo, hi])
    assert mod["main"].body.op.name == "clip"  # constant bounds make one elementwise clip
    check_against_onnx("Clip", {"x": X, "lo": np.array(-0.1, np.float32)}, opset=13)


def test_clip_bounds_of_another_type_or_shape_are_refused_by_name():
    """Clip's min and max are scalars of the input's type: a float bound on an integer
    input (a NaN one made an opaque ValueError deep in the optimizer) or a vector bound is
    an import error naming the node and the input."""
    x = helper.make_tensor_value_info("x", TensorProto.INT32, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.INT32, [2, 3])
    for hi in (helper.make_tensor("hi", TensorProto.FLOAT, [], [float("nan")]),
               helper.make_tensor("hi", TensorProto.INT32, [2], [1, 2])):
        graph = helper.make_graph([helper.make_node("Clip", ["x", "", "hi"], ["y"],
                                                    name="clamp")], "clip", [x], [y], [hi])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        with pytest.raises(opf.errors.OnnxImportError, match="clamp.*'max'"):
            from_onnx(model)


def test_isinf_directions():
    special = np.array([np.inf, -np.inf, 1.0, np.nan], np.float32)
    check_against_onnx("IsInf", {"x": special})
    check_against_onnx("IsInf", {"x": special}, detect_negative=0)
    check_against_onnx("IsInf", {"x": special}, detect_positive=0)
    check_against_onnx("IsNaN", {"x": special})


@pytest.mark.parametrize("op_type, data", [
    ("Tan", X), ("Asin", np.tanh(X)), ("Acos", np.tanh(X)), ("Atan", X), ("Sinh", X),
    ("Cosh", X), ("Asinh", X), ("Acosh", POS + 1), ("Atanh", np.tanh(X)),
])
def test_trigonometric(op_type, data):
    check_against_onnx(op_type, {"x": data})


def test_bit_shift_and_bitwise_ops():
    a = np.array([1, 6, 255, 16], np.uint16)
    b = np.array([1, 2, 3, 4], np.uint16)
    check_against_onnx("BitShift", {"a": a, "b": b}, direction="LEFT")
    check_against_onnx("BitShift", {"a": a, "b": b}, direction="RIGHT")
    for op_type in ("BitwiseAnd", "BitwiseOr", "BitwiseXor"):
        check_against_onnx(op_type, {"a": a.astype(np.int32), "b": b.astype(np.int32)}, opset=18)
    check_against_onnx("BitwiseNot", {"a": a}, opset=18)


def test_function_operators_expand_into_their_onnx_body():
    # Swish has no converter of its own: ONNX defines it by a function body
    # (x * sigmoid(alpha * x)), which the importer expands and converts.
    mod = check_against_onnx("Swish", {"x": X * 3}, opset=24, alpha=0.7)
    ops = {n.op.name for n in opf.ir.post_order(mod["main"]) if isinstance(n, opf.Call)}
    assert "sigmoid" in ops and "multiply" in ops


def test_attention_expands_through_its_function_body():
    q = rng.standard_normal((1, 2, 4, 8)).astype(np.float32)
    k = rng.standard_normal((1, 2, 6, 8)).astype(np.float32)
    v = rng.standard_normal((1, 2, 6, 8)).astype(np.float32)
    check_against_onnx("Attention", {"q": q, "k": k, "v": v}, opset=25)


def test_context_dependent_function_operator_expands():
    # CenterCropPad's body depends on the input shape; ONNX builds it from the node.
    data = rng.standard_normal((5, 7, 3)).astype(np.float32)
    shape = helper.make_tensor("shape", TensorProto.INT64, [3], [4, 9, 3])
    check_against_onnx("CenterCropPad", {"x": data}, opset=18, initializers=[shape])
