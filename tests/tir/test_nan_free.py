"""NaN facts (opfusion.tir.nan_free): values of a quantized epilogue (an integer accumulator,
finite scales and biases, clips) are proved never NaN, so their NaN tests fold and their
mins and maxes are the machine's; loads of other floats, products of a maybe-infinite value
by a maybe-zero one, and sums of infinities of both signs stay possibly NaN. Compiled, the
kernels give the reference's numbers either way (NaN and infinities included)."""

import math

import numpy as np
import pytest

import opfusion as opf
from opfusion.ir.evaluate import evaluate
from opfusion.ir.expr import Function
from opfusion.ir.module import IRModule
from opfusion.tir import expr as E
from opfusion.tir.nan_free import (
    FINITE_LIMIT,
    NanFacts,
    always_false_nan_test,
    constant_fact,
)


def f32(value):
    return E.FloatImm(value, "float32")


def accumulator():
    buffer = E.Buffer("acc", (16,), "int32")
    return E.cast(E.BufferLoad(buffer, [E.Var("i")]), "float32")


def requantized(value, scale=0.05, point=3.0):
    """clip(round(value / scale) + point, 0, 255)"""
    rounded = E.Call("round", [E.Div(value, f32(scale))], "float32")
    return E.Min(E.Max(E.Add(rounded, f32(point)), f32(0.0)), f32(255.0))


def test_a_requantized_accumulator_is_never_nan():
    facts = NanFacts()
    codes = requantized(accumulator() * f32(0.02) + f32(1.5))
    fact = facts.fact(codes)
    assert not fact.nan and (fact.low, fact.high) == (0.0, 255.0)
    test = E.NE(codes, codes)
    assert always_false_nan_test(test, facts) is False
    assert always_false_nan_test(E.EQ(codes, codes), facts) is True


def test_constant_buffers_bound_their_loads():
    scales = E.Buffer("scales", (16,), "float32")
    load = E.BufferLoad(scales, [E.Var("i")])
    data = np.array([0.01, 0.5, 2.0], np.float32)
    facts = NanFacts({id(scales): constant_fact(data)})
    value = requantized(accumulator() * load)
    assert facts.nan_free(value)
    # a residual read back from bytes, added to the dequantized codes, requantized again
    residual = E.cast(E.BufferLoad(E.Buffer("bytes", (16,), "uint8"), [E.Var("i")]), "float32")
    again = requantized((value - f32(3.0)) * f32(0.05) + residual * f32(0.02))
    assert facts.nan_free(again)
    # without the facts, a load of floats may be NaN
    assert not NanFacts().nan_free(value)


@pytest.mark.parametrize("data", [
    np.array([0.5, np.nan, -2.0], np.float32), np.array([np.nan, np.nan]), np.array(3.0),
    np.array([-0.0, 1.0], np.float16), np.array([np.inf, -np.inf, np.nan]),
    np.array([3.4e38, -3.4e38], np.float32), np.array([[1.0, 2.0], [0.0, np.nan]]),
], ids=["nan", "all_nan", "scalar", "negative_zero", "infinities", "beyond_limit", "matrix"])
def test_a_constants_fact_is_its_values_bounds(data):
    fact = constant_fact(data)
    values = data[~np.isnan(data)].astype(np.float64)
    if not values.size:
        assert (fact.low, fact.high, fact.nan) == (-math.inf, math.inf, True)
        return
    assert fact.nan == bool(np.isnan(data).any())
    assert fact.zero == bool((values == 0).any())
    low, high = float(values.min()), float(values.max())
    assert fact.low == (low if low >= -FINITE_LIMIT else -math.inf)  # past it: unbounded
    assert fact.high == (high if high <= FINITE_LIMIT else math.inf)


def test_a_constants_tf32_fact_says_whether_tf32_holds_every_value():
    """Asked for (a TF32 target), a float32 constant's fact records whether each value has
    its low 13 mantissa bits clear (NaN and infinities count as held); joined over calls,
    both must hold it. Not asked, or not float32, it is False."""
    from opfusion.tir.mma import round_tf32_array
    from opfusion.tir.nan_free import join_facts

    rng = np.random.default_rng(0)
    weights = rng.standard_normal(64).astype(np.float32)
    rounded = round_tf32_array(weights)
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.5], np.float32)
    assert not constant_fact(weights, tf32=True).tf32
    assert constant_fact(rounded, tf32=True).tf32
    assert constant_fact(special, tf32=True).tf32
    assert not constant_fact(rounded).tf32  # not asked
    assert not constant_fact(rounded.astype(np.float64), tf32=True).tf32
    denormal = np.array([np.float32(1e-45)], np.float32)  # the lowest mantissa bit: not held
    assert not constant_fact(denormal, tf32=True).tf32
    both = join_facts({0: constant_fact(rounded, True)}, {0: constant_fact(special, True)})
    assert both[0].tf32
    mixed = join_facts({0: constant_fact(rounded, True)}, {0: constant_fact(weights, True)})
    assert not mixed[0].tf32


@pytest.mark.parametrize("data", [np.array([0.5, np.nan], np.float32),
                                  np.array([1.0, np.inf], np.float32),
                                  np.array([0.0, 2.0], np.float32)], ids=["nan", "inf", "zero"])
def test_constants_that_may_make_a_nan_keep_it_possible(data):
    scales = E.Buffer("scales", (16,), "float32")
    load = E.BufferLoad(scales, [E.Var("i")])
    facts = NanFacts({id(scales): constant_fact(data)})
    fact = constant_fact(data)
    assert fact.nan == bool(np.isnan(data).any()) and fact.zero == bool((data == 0).any())
    # an unbounded value (maybe infinite, maybe zero) times the constant: NaN when the
    # constant may be NaN, zero or infinite
    unbounded = E.Div(accumulator() * f32(1e30), f32(1e-30))
    product = E.Mul(unbounded, load)
    finite = math.isfinite(fact.low) and math.isfinite(fact.high)
    assert facts.nan_free(product) == (not fact.nan and not fact.zero and finite)
    assert not any(facts.nan_free(product) for fact in [fact] if not finite or fact.zero)


def test_infinities_of_both_signs_may_make_nan():
    facts = NanFacts()
    huge = E.Div(accumulator() * f32(1e30), f32(1e-30))  # may overflow either way
    assert not facts.fact(huge).nan and math.isinf(facts.fact(huge).high)
    assert not facts.nan_free(huge - huge)
    assert not facts.nan_free(huge * accumulator())  # inf * 0
    assert facts.nan_free(E.Max(huge, f32(0.0)))
    assert not facts.nan_free(E.Div(accumulator(), accumulator()))  # 0 / 0
    assert not facts.nan_free(E.Call("sqrt", [accumulator()], "float32"))
    assert not facts.nan_free(f32(math.nan))


def test_let_bound_values_keep_their_facts():
    facts = NanFacts()
    var = E.Var("v", "float32")
    body = E.Let(var, requantized(accumulator()), E.Max(var, f32(1.0)))
    assert facts.nan_free(body)


def _qdq_relu_model():
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s"),
             numpy_helper.from_array(np.array(3, np.uint8), "z")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
             helper.make_node("Relu", ["d"], ["r"]),
             helper.make_node("Max", ["r", "x"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [64])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_compiled_kernels_keep_the_nan_rules_where_values_may_be_nan():
    """The dequantized codes' relu takes the machine's max, the max with the input itself
    (a load: maybe NaN) keeps the NaN-propagating form; NaN, infinities and the rest give the
    reference's values."""
    from opfusion.frontend import from_onnx

    mod, params = from_onnx(_qdq_relu_model())
    exe = opf.compile(mod, params=params)
    assert "_max_not_nan_float32x" in exe.source_code
    assert "opf_max_float32x" in exe.source_code
    x = np.random.default_rng(0).standard_normal(64).astype(np.float32) * 10
    x[:5] = [np.nan, np.inf, -np.inf, -0.0, 1e30]
    want = evaluate(opf.transform.BindParams(params)(mod), [x])
    np.testing.assert_array_equal(exe(x), want)


def test_expressions_with_a_constant_operand_lifted_out_compile_to_the_reference():
    """A scale vector with an infinity is lifted out of its group like any constant: its
    facts keep the product's NaN rules (inf * 0)."""
    x = opf.var("x", shape=(4, 16))
    scales = np.linspace(-2, 2, 16).astype(np.float32)
    scales[3] = np.inf
    expr = opf.op.maximum(opf.op.multiply(opf.op.cast(opf.op.cast(x, dtype="int32"),
                                                      dtype="float32"),
                                          opf.const(scales)), opf.const(np.float32(0)))
    mod = IRModule.from_expr(Function([x], expr))
    data = np.random.default_rng(1).integers(-3, 4, (4, 16)).astype(np.float32)
    np.testing.assert_array_equal(opf.compile(mod)(data), evaluate(mod, [data]))
