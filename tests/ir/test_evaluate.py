"""The reference interpreter: numbers, nested functions, tuples and input checking."""

import numpy as np
import pytest

import opfusion as opf
from opfusion.ir import evaluate
from opfusion.testing import assert_close

rng = np.random.default_rng(7)


def _conv2d_direct(x, w):
    """Valid, stride-1 NCHW convolution written as plain loops, independent of opfusion."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    out = np.zeros((n, o, h - kh + 1, wd - kw + 1), np.float64)
    for b in range(n):
        for oc in range(o):
            for i in range(h - kh + 1):
                for j in range(wd - kw + 1):
                    out[b, oc, i, j] = np.sum(x[b, :, i:i + kh, j:j + kw] * w[oc])
    return out


def seed_example():
    """Seed 000's graph: conv2d, add a constant, relu; the conv times 0.5; add the two."""
    x = opf.var("x", shape=(1, 3, 16, 16))
    weight = opf.var("weight", shape=(3, 3, 3, 3))
    conv = opf.op.nn.conv2d(x, weight)
    act = opf.op.nn.relu(opf.op.add(conv, opf.const(np.ones((1, 3, 14, 14), np.float32))))
    out = act + opf.op.multiply(conv, opf.const(0.5, "float32"))
    return opf.IRModule.from_expr(opf.Function([x, weight], out))


def test_seed_example_matches_an_independent_numpy_computation():
    x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    w = rng.standard_normal((3, 3, 3, 3)).astype(np.float32)
    conv = _conv2d_direct(x, w)
    want = (np.maximum(conv + 1.0, 0.0) + conv * 0.5).astype(np.float32)
    got = evaluate(seed_example(), {"x": x, "weight": w})
    assert_close(got, want)
    assert_close(evaluate(seed_example(), [x, w]), want)


def test_nested_primitive_function_runs_like_its_inline_body():
    p0, p1 = opf.var("p0", (2, 3)), opf.var("p1", (3,))
    fused = opf.Function([p0, p1], opf.op.nn.relu(p0 + p1), attrs={"Primitive": 1})
    x, b = opf.var("x", (2, 3)), opf.var("b", (3,))
    mod = opf.IRModule.from_expr(opf.Function([x, b], opf.op.exp(fused(x, b))))
    xv = rng.standard_normal((2, 3)).astype(np.float32)
    bv = rng.standard_normal(3).astype(np.float32)
    assert_close(evaluate(mod, [xv, bv]), np.exp(np.maximum(xv + bv, 0)))


def test_tuple_results_come_back_as_tuples():
    x = opf.var("x", (3,))
    t = opf.Tuple([opf.op.exp(x), opf.op.negative(x)])
    mod = opf.IRModule.from_expr(opf.Function([x], opf.Tuple([opf.TupleGetItem(t, 1), x])))
    xv = np.arange(3, dtype=np.float32)
    got = evaluate(mod, [xv])
    assert isinstance(got, tuple) and len(got) == 2
    assert_close(got[0], -xv)
    assert_close(got[1], xv)


def test_global_function_calls():
    a = opf.var("a", (2,))
    mod = opf.IRModule({"square": opf.Function([a], a * a)})
    x = opf.var("x", (2,))
    mod["main"] = opf.Function([x], opf.Call(mod.get_global_var("square"), [x + 1.0]))
    assert_close(evaluate(mod, [np.array([1.0, 2.0], np.float32)]),
                 np.array([4.0, 9.0], np.float32))


def test_outputs_take_the_inferred_dtype():
    x = opf.var("x", (3,), dtype="float16")
    got = evaluate(opf.Function([x], opf.op.sigmoid(x)), [np.zeros(3, np.float16)])
    assert got.dtype == np.float16


def test_float64_inputs_are_converted_to_the_parameter_dtype():
    x = opf.var("x", (2,))
    got = evaluate(opf.Function([x], x * 2.0), [np.array([1.0, 2.0])])
    assert got.dtype == np.float32


def test_input_errors_name_the_input():
    x = opf.var("x", (2,))
    func = opf.Function([x], opf.op.exp(x))
    with pytest.raises(opf.EvaluationError, match=r"%x expects shape \(2,\), got \(3,\)"):
        evaluate(func, [np.zeros(3, np.float32)])
    with pytest.raises(opf.EvaluationError, match="input 'x' is missing"):
        evaluate(func, {})
    with pytest.raises(opf.EvaluationError, match="no parameter named 'y'"):
        evaluate(func, {"x": np.zeros(2, np.float32), "y": 1})
    with pytest.raises(opf.EvaluationError, match="expects float32, got complex128"):
        evaluate(func, [np.zeros(2, np.complex128)])
    with pytest.raises(opf.EvaluationError, match="takes 1 input"):
        evaluate(func, [])


def test_type_error_surfaces_before_running():
    x, y = opf.var("x", (2,)), opf.var("y", (3,))
    with pytest.raises(opf.OpfusionTypeError, match="cannot broadcast"):
        evaluate(opf.Function([x, y], x + y), [np.zeros(2), np.zeros(3)])
