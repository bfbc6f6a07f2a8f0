"""DeadCodeElimination: unreachable values, unused fused parameters and uncalled functions go."""

import numpy as np
from hypothesis import HealthCheck, given, settings

import opfusion as opf
from opfusion.ir import Call, Tuple, assert_structural_equal, evaluate, post_order
from opfusion.testing.random_graphs import dataflow_graphs, random_inputs
from opfusion.transform.dead_code import DeadCodeElimination


def test_projection_of_a_literal_tuple_drops_the_other_fields():
    x = opf.var("x", (3,))
    pair = opf.Tuple([opf.op.exp(x), opf.op.log(x)])
    mod = DeadCodeElimination()(opf.IRModule.from_expr(opf.Function([x], opf.TupleGetItem(pair,
                                                                                        0))))
    x2 = opf.var("x", (3,))
    assert_structural_equal(mod, opf.IRModule.from_expr(opf.Function([x2], opf.op.exp(x2))))


def test_unused_parameters_of_a_primitive_function_are_removed_with_their_arguments():
    x, y = opf.var("x", (3,)), opf.var("y", (3,))
    p0, p1 = opf.var("p0", (3,)), opf.var("p1", (3,))
    fused = opf.Function([p0, p1], opf.op.exp(p0)).with_attr("Primitive", 1)
    mod = opf.IRModule.from_expr(opf.Function([x, y], opf.Call(fused, [x, opf.op.log(y)])))
    new = DeadCodeElimination()(mod)
    call = new["main"].body
    assert [p.name_hint for p in call.op.params] == ["p0"] and call.args == (x,)
    assert not any(isinstance(n, Call) and getattr(n.op, "name", "") == "log"
                   for n in post_order(new["main"]))
    xv, yv = np.ones(3, np.float32), np.ones(3, np.float32)
    np.testing.assert_array_equal(evaluate(new, [xv, yv]), evaluate(mod, [xv, yv]))


def test_functions_not_reachable_from_main_are_dropped():
    x = opf.var("x", (2,))
    helper_x = opf.var("hx", (2,))
    mod = opf.IRModule({"main": opf.Function([x], x),
                        "unused": opf.Function([helper_x], opf.op.exp(helper_x))})
    called = opf.IRModule({"helper": opf.Function([helper_x], opf.op.exp(helper_x))})
    gv = called.get_global_var("helper")
    called["main"] = opf.Function([x], opf.Call(gv, [x]))
    assert list(DeadCodeElimination()(mod)) == ["main"]
    assert list(DeadCodeElimination()(called)) == ["helper", "main"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dataflow_graphs())
def test_dce_keeps_random_graphs_bit_exact_and_removes_literal_tuples(mod):
    new = DeadCodeElimination()(mod)
    assert not any(isinstance(n, Tuple) for n in post_order(new["main"]))
    inputs = random_inputs(mod, seed=3)
    np.testing.assert_array_equal(evaluate(new, inputs), evaluate(mod, inputs))
