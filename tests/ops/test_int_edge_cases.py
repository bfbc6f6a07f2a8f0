"""Integer division, remainder and power at their edges (zero divisors, INT_MIN / -1,
negative exponents, int64 beyond float64's precision): the reference interpreter and the
compiled kernels give the same, documented values (opfusion/opdefs/broadcast.py), and ONNX
Runtime's where it defines one."""

import numpy as np
import pytest

import opfusion as opf
from opfusion.ir.evaluate import evaluate
from opfusion.ir.expr import Function
from opfusion.ir.module import IRModule
from opfusion.topi.testing import call_over_arrays

ort = pytest.importorskip("onnxruntime")
from onnx import helper  # noqa: E402

SIGNED = ["int8", "int32", "int64"]


def both(builder, *arrays, **attrs):
    """(reference, compiled) results of ``builder(*vars, **attrs)`` on ``arrays``."""
    call, params, values = call_over_arrays(builder, arrays, attrs)
    mod = IRModule.from_expr(Function(params, call))
    feeds = {p.name_hint: v for p, v in zip(params, values)}
    return evaluate(mod, feeds), opf.compile(mod).run(feeds)[0]


def agree(builder, a, b, want):
    reference, compiled = both(builder, a, b)
    np.testing.assert_array_equal(reference, want)
    np.testing.assert_array_equal(compiled, want)
    assert reference.dtype == compiled.dtype == want.dtype


@pytest.mark.parametrize("dtype", SIGNED + ["uint8"])
@pytest.mark.parametrize("builder", [opf.op.divide, opf.op.floor_divide, opf.op.mod])
def test_integer_division_by_zero_is_zero_in_both_engines(builder, dtype):
    a = np.array([7, 0, 5, 100], dtype)
    if dtype != "uint8":
        a[1] = -7
    agree(builder, a, np.zeros(4, dtype), np.zeros(4, dtype))


@pytest.mark.parametrize("dtype", SIGNED)
def test_int_min_over_minus_one_wraps_in_both_engines(dtype):
    info = np.iinfo(dtype)
    a = np.array([info.min, info.min, info.max, -5], dtype)
    b = np.array([-1, 1, -1, -1], dtype)
    agree(opf.op.divide, a, b, np.array([info.min, info.min, -info.max, 5], dtype))
    agree(opf.op.floor_divide, a, b, np.array([info.min, info.min, -info.max, 5], dtype))
    agree(opf.op.mod, a, b, np.zeros(4, dtype))


def test_int64_division_is_exact_beyond_float64_precision():
    a = np.array([2**62 + 1, -(2**62 + 3), 2**63 - 1, -(2**63 - 1)], np.int64)
    b = np.array([3, 7, 2, -2], np.int64)
    # Truncation toward zero in exact Python integers.
    want = np.array([abs(int(x)) // abs(int(y)) * (1 if (x < 0) == (y < 0) else -1)
                     for x, y in zip(a, b)], np.int64)
    agree(opf.op.divide, a, b, want)


def run_ort(op_type, inputs, out_dtype, **attrs):
    node = helper.make_node(op_type, list(inputs), ["y"], **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for n, v in inputs.items()],
        [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(np.dtype(out_dtype)),
                                       None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, inputs)[0]


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_negative_integer_exponents_agree_with_onnxruntime(dtype):
    base = np.array([2, 1, -1, -1, 3, -3, 2, 5, -2], dtype)
    exponent = np.array([-1, -1, -1, -2, -2, -1, -63, -7, 3], dtype)
    want = run_ort("Pow", {"a": base, "b": exponent}, dtype)
    np.testing.assert_array_equal(want, [0, 1, -1, 1, 0, 0, 0, 0, -8])
    agree(opf.op.power, base, exponent, want)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_zero_to_a_negative_power_is_a_division_by_zero(dtype):
    # ONNX Runtime gives the cast of inf (INT_MIN on x86); opfusion's division by zero is 0.
    agree(opf.op.power, np.zeros(2, dtype), np.array([-1, -4], dtype), np.zeros(2, dtype))


@pytest.mark.parametrize("fmod", [0, 1])
def test_onnx_mod_by_zero_imports_to_zero_in_both_engines(fmod):
    onnx = pytest.importorskip("onnx")
    a = np.array([7, -7, 0, 9], np.int32)
    b = np.array([0, 0, 0, 4], np.int32)
    node = helper.make_node("Mod", ["a", "b"], ["y"], fmod=fmod)
    graph = helper.make_graph([node], "g", [
        helper.make_tensor_value_info(n, onnx.TensorProto.INT32, (4,)) for n in "ab"],
        [helper.make_tensor_value_info("y", onnx.TensorProto.INT32, (4,))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    mod, params = opf.frontend.from_onnx(model)
    feeds = {"a": a, "b": b}
    want = np.array([0, 0, 0, 1], np.int32)
    np.testing.assert_array_equal(evaluate(mod, feeds), want)
    np.testing.assert_array_equal(opf.compile(mod, params=params).run(feeds)[0], want)


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int16", "int32", "int64", "uint64"])
def test_power_past_the_width_wraps_exactly_in_both_engines(dtype):
    # Odd bases raised to exponents of at least the dtype's width: the compiled power used to
    # stop at `bits` factors (3 ** 9 came out as 3 ** 8 in uint8).
    base = np.array([3, 5, 7, -3, 2, 255, 1, 0, 9, 11, -1, -5], np.int64).astype(dtype)
    exponent = np.array([9, 40, 100, 63, 9, 7, 1000, 3, 2, 127, 5, 4], np.int64).astype(dtype)
    want = np.array([pow(int(b), int(e), 1 << 64) for b, e in zip(base, exponent)],
                    np.uint64).astype(dtype)
    agree(opf.op.power, base, exponent, want)


def test_uint64_exponents_past_2_to_63_are_positive():
    base = np.array([3, 5, 2, 1], np.uint64)
    exponent = np.array([2**64 - 2, 2**63 + 1, 2**63, 2**64 - 1], np.uint64)
    want = np.array([pow(int(b), int(e), 1 << 64) for b, e in zip(base, exponent)], np.uint64)
    agree(opf.op.power, base, exponent, want)
