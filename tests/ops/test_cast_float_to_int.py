"""Float to integer casts of NaN, infinities and out-of-range values: one rule (NaN to 0,
truncate toward zero, saturate; see opfusion.opdefs.elemwise.Cast) in the reference, in constant
folding, in the loop-IR interpreter and in compiled kernels, scalar and vectorized alike.
C leaves these conversions undefined and NumPy gives the CPU's answer, so before the rule the
compiled kernels and the reference disagreed (fuzz cases 1262, 2434, 3058 seed 1, 1829 seed 0).
"""

import math

import numpy as np
import pytest

import opfusion as opf
from opfusion import te
from opfusion.ir.evaluate import evaluate
from opfusion.ir.expr import Constant, Function
from opfusion.ir.module import IRModule
from opfusion.ir.types import float_to_int
from opfusion.tir import expr as E
from opfusion.tir import interp
from opfusion.topi.testing import call_over_arrays

INTS = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]
FLOATS = ["float16", "float32", "float64"]

SPECIAL = [-3.7, 300.0, math.nan, math.inf, -math.inf, 3.9, -1.0, 1e10, -1e10, 255.5,
           70000.0, -0.5, 2.0**31, -(2.0**31), 2.0**32, 2.0**63, -(2.0**63), 2.0**64, 0.0,
           -0.0, 127.99, -128.99, 65535.5, 1e30]


def values(dtype: str, size: int = 64) -> np.ndarray:
    """SPECIAL (those that survive the conversion to ``dtype``), repeated to ``size``."""
    with np.errstate(over="ignore"):
        base = np.array(SPECIAL, dtype)
    return np.resize(base, size)


def expected(data: np.ndarray, dtype: str) -> np.ndarray:
    return np.array([float_to_int(float(v), dtype) for v in data.ravel()],
                    dtype).reshape(data.shape)


def compiled_and_reference(data: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    call, params, arrays = call_over_arrays(opf.op.cast, (data,), {"dtype": dtype})
    mod = IRModule.from_expr(Function(params, call))
    feeds = {params[0].name_hint: arrays[0]}
    return opf.compile(mod).run(feeds)[0], evaluate(mod, feeds)


def test_the_rule_on_examples():
    assert [float_to_int(v, "uint8") for v in (-3.7, 300.0, math.nan, math.inf, 3.9)] == [
        0, 255, 0, 255, 3]
    assert [float_to_int(v, "int32") for v in (1e10, -1e10, -math.inf, -2.5)] == [
        2**31 - 1, -(2**31), -(2**31), -2]
    assert float_to_int(2.0**64, "uint64") == 2**64 - 1
    assert float_to_int(-(2.0**63), "int64") == -(2**63)


@pytest.mark.parametrize("source", FLOATS)
@pytest.mark.parametrize("target", INTS)
def test_compiled_cast_follows_the_reference(source, target):
    # 64 elements: the float32/float64 -> 32/64-bit cases are vectorizable loops.
    data = values(source)
    want = expected(data, target)
    compiled, reference = compiled_and_reference(data, target)
    np.testing.assert_array_equal(reference, want)
    np.testing.assert_array_equal(compiled, want)
    assert compiled.dtype == reference.dtype == np.dtype(target)


@pytest.mark.parametrize("target", ["uint8", "int32", "uint64"])
def test_constant_folding_follows_the_rule(target):
    data = values("float32", 24)
    mod = IRModule.from_expr(Function([], opf.op.cast(Constant(data), dtype=target)))
    exe = opf.compile(mod)  # the cast of a constant is folded by the reference
    np.testing.assert_array_equal(exe.run({})[0], expected(data, target))


@pytest.mark.parametrize("target", ["uint8", "int16", "uint32", "int64"])
def test_loop_ir_folding_and_interpreter_follow_the_rule(target):
    for v in SPECIAL:
        folded = E.cast(E.FloatImm(v, "float64"), target)
        assert isinstance(folded, E.IntImm) and folded.value == float_to_int(v, target), v
    data = values("float64", 24)
    A = te.placeholder(data.shape, "float64", name="A")
    B = te.compute(data.shape, lambda i: te.cast(A[i], target), name="B")
    func = opf.lower(te.create_schedule(B.op), [A, B])
    out = np.zeros(data.shape, target)
    interp.run(func, data, out)
    np.testing.assert_array_equal(out, expected(data, target))


def test_in_range_values_agree_with_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    data = np.array([-3.7, 3.9, -0.5, 127.9, -128.9, 0.0, 100.5], np.float32)
    node = helper.make_node("Cast", ["x"], ["y"], to=TensorProto.INT8)
    graph = helper.make_graph([node], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, (7,))],
                              [helper.make_tensor_value_info("y", TensorProto.INT8, (7,))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    want = session.run(None, {"x": data})[0]
    mod, params = opf.frontend.from_onnx(model)
    np.testing.assert_array_equal(evaluate(mod, {"x": data}), want)
    np.testing.assert_array_equal(opf.compile(mod, params=params).run({"x": data})[0], want)
