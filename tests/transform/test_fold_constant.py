"""FoldConstant and BindParams: constant-only subgraphs become constants, numbers unchanged."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import opfusion as opf
from opfusion.ir import Call, Constant, assert_structural_equal, evaluate, post_order
from opfusion.testing import assert_close
from opfusion.testing.random_graphs import dataflow_graphs, random_inputs
from opfusion.transform import PassContext
from opfusion.transform.fold_constant import BindParams, FoldConstant, bind_params

RNG = np.random.default_rng(0)


def c(*shape):
    return opf.const(RNG.standard_normal(shape).astype(np.float32))


def calls(mod):
    return [n for n in post_order(mod["main"]) if isinstance(n, Call)]


def constant_only_calls(mod):
    return [n for n in calls(mod) if all(isinstance(a, Constant) for a in n.args)]


def test_a_constant_subgraph_collapses_to_one_constant():
    x = opf.var("x", (2, 3))
    a, b = c(3, 4), c(4)
    weight = opf.op.transpose(opf.op.exp(a) * b + opf.const(1.0), axes=(1, 0))
    mod = opf.IRModule.from_expr(opf.Function([x], opf.op.nn.dense(x, weight)))
    folded = FoldConstant()(mod)
    body = folded["main"].body
    assert body.op.name == "nn.dense" and isinstance(body.args[1], Constant)
    want = np.transpose(np.exp(a.data) * b.data + 1.0)
    np.testing.assert_array_equal(body.args[1].data, want.astype(np.float32))
    xv = RNG.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_array_equal(evaluate(folded, [xv]), evaluate(mod, [xv]))


def test_tuple_producing_ops_and_projections_fold():
    x = opf.var("x", (2, 2))
    parts = opf.op.split(c(4, 2), indices_or_sections=2, axis=0)
    mod = opf.IRModule.from_expr(opf.Function([x], x + opf.TupleGetItem(parts, 1)))
    folded = FoldConstant()(mod)
    assert constant_only_calls(folded) == [] and len(calls(folded)) == 1
    xv = RNG.standard_normal((2, 2)).astype(np.float32)
    np.testing.assert_array_equal(evaluate(folded, [xv]), evaluate(mod, [xv]))


def test_calls_that_depend_on_an_input_stay():
    x = opf.var("x", (3,))
    mod = opf.IRModule.from_expr(opf.Function([x], opf.op.exp(x) + c(3)))
    assert_structural_equal(FoldConstant()(mod), mod)


def test_folding_keeps_the_inferred_dtype():
    x = opf.var("x", (3,), dtype="int32")
    cast = opf.op.cast(opf.const(np.array([1.7, 2.2, -3.9], np.float32)), dtype="int32")
    folded = FoldConstant()(opf.IRModule.from_expr(opf.Function([x], x + cast)))
    constant = folded["main"].body.args[1]
    assert constant.data.dtype == np.int32
    np.testing.assert_array_equal(constant.data, [1, 2, -3])


def test_results_above_the_size_limit_are_not_folded():
    x = opf.var("x", (64, 64))
    big = opf.op.broadcast_to(opf.const(1.0), shape=(64, 64))
    mod = opf.IRModule.from_expr(opf.Function([x], x + big))
    with PassContext(config={"FoldConstant.max_elements": 1000}):
        assert len(constant_only_calls(FoldConstant()(mod))) == 1
    assert constant_only_calls(FoldConstant()(mod)) == []


def test_folding_reaches_inside_nested_functions():
    p = opf.var("p0", (3,))
    inner = opf.Function([p], p * opf.op.exp(c(3))).with_attr("Primitive", 1)
    x = opf.var("x", (3,))
    mod = opf.IRModule.from_expr(opf.Function([x], opf.Call(inner, [x])))
    folded = FoldConstant()(mod)
    assert constant_only_calls(folded) == []
    xv = RNG.standard_normal(3).astype(np.float32)
    np.testing.assert_array_equal(evaluate(folded, [xv]), evaluate(mod, [xv]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dataflow_graphs())
def test_fold_constant_keeps_random_graphs_bit_exact(mod):
    folded = FoldConstant()(mod)
    assert constant_only_calls(folded) == []
    inputs = random_inputs(mod, seed=1)
    np.testing.assert_array_equal(evaluate(folded, inputs), evaluate(mod, inputs))


# ---------------------------------------------------------------------------------------------
# BindParams


def dense_module():
    x = opf.var("x", (2, 3))
    w = opf.var("w", (4, 3))
    b = opf.var("b", (4,))
    return opf.IRModule.from_expr(opf.Function([x, w, b], opf.op.nn.dense(x, w) + b))


def test_bind_params_turns_named_params_into_constants():
    w = RNG.standard_normal((4, 3)).astype(np.float32)
    b = RNG.standard_normal(4).astype(np.float32)
    mod = dense_module()
    bound = BindParams({"w": w, "b": b})(mod)
    assert [p.name_hint for p in bound["main"].params] == ["x"]
    xv = RNG.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_array_equal(evaluate(bound, [xv]), evaluate(mod, [xv, w, b]))
    assert [p.name_hint for p in mod["main"].params] == ["x", "w", "b"]  # input unchanged


def test_bind_params_rejects_unknown_names_and_wrong_arrays():
    func = dense_module()["main"]
    with pytest.raises(opf.OpfusionError, match=r"'weight', which is not a parameter.*x, w, b"):
        bind_params(func, {"weight": np.zeros((4, 3), np.float32)})
    with pytest.raises(opf.OpfusionError, match=r"shape \(3, 4\) but %w is declared"):
        bind_params(func, {"w": np.zeros((3, 4), np.float32)})
    with pytest.raises(opf.OpfusionError, match="dtype float64 .* cast the array first"):
        bind_params(func, {"w": np.zeros((4, 3))})


def test_bound_then_folded_weights_match_the_unbound_model():
    x = opf.var("x", (1, 3, 8, 8))
    w = opf.var("w", (4, 3, 3, 3))
    scale = opf.var("scale", (4, 1, 1, 1))
    mod = opf.IRModule.from_expr(opf.Function([x, w, scale],
                                              opf.op.nn.conv2d(x, w * scale, padding=1)))
    params = {"w": RNG.standard_normal((4, 3, 3, 3)).astype(np.float32),
              "scale": RNG.standard_normal((4, 1, 1, 1)).astype(np.float32)}
    folded = FoldConstant()(BindParams(params)(mod))
    assert [n.op.name for n in calls(folded)] == ["nn.conv2d"]
    xv = RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)
    assert_close(evaluate(folded, [xv]), evaluate(mod, {"x": xv, **params}))
