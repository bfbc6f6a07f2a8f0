"""The seed rewrites: multiply+add into ewise_fma, dense+add into a primitive function."""

import numpy as np
import pytest

import opfusion as opf
from opfusion.errors import OpfusionTypeError
from opfusion.ir import (
    Call,
    Function,
    IRModule,
    OpPatternKind,
    assert_structural_equal,
    evaluate,
    get_op,
    infer_type,
    post_order,
)
from opfusion.testing import assert_close, eval_op
from opfusion.transform.context import PassContext
from opfusion.transform.pass_infra import Sequential
from opfusion.transform.rewrites import FuseDenseAdd, FuseMultiplyAdd

rng = np.random.default_rng(0)


def _normal(*shape):
    return rng.standard_normal(shape).astype(np.float32)


# -- the ewise_fma operator --------------------------------------------------------------------

def test_ewise_fma_is_declared_with_a_builder():
    op = get_op("ewise_fma")
    assert op.inputs == ("a", "b", "c") and op.pattern == OpPatternKind.kBroadcast
    assert opf.op.ewise_fma.__name__ == "ewise_fma"


def test_ewise_fma_broadcasts_its_three_inputs():
    a, b, c = _normal(2, 1, 4), _normal(3, 1), _normal(4)
    got = eval_op(opf.op.ewise_fma, a, b, c)
    assert got.shape == (2, 3, 4) and got.dtype == np.float32
    np.testing.assert_array_equal(got, a * b + c)


def test_ewise_fma_rejects_mixed_dtypes_and_bools():
    a = opf.var("a", (2,))
    with pytest.raises(OpfusionTypeError, match="share one dtype"):
        infer_type(opf.op.ewise_fma(a, a, opf.var("c", (2,), "float64")))
    flag = opf.var("f", (2,), "bool")
    with pytest.raises(OpfusionTypeError, match="bool"):
        infer_type(opf.op.ewise_fma(flag, flag, flag))
    with pytest.raises(OpfusionTypeError, match="cannot broadcast"):
        infer_type(opf.op.ewise_fma(a, a, opf.var("c", (3,))))


def test_ewise_fma_on_integers_wraps_like_multiply_and_add():
    a = np.array([2**30, 7], np.int32)
    want = eval_op(lambda x, y, z: opf.op.add(opf.op.multiply(x, y), z), a, a, a)
    np.testing.assert_array_equal(eval_op(opf.op.ewise_fma, a, a, a), want)


# -- FuseMultiplyAdd ---------------------------------------------------------------------------

def _seed_module():
    # The lecture's MyModule: gv0 = add(multiply(x, y), y)
    x, y = opf.var("x", (3, 4)), opf.var("y", (3, 4))
    return IRModule.from_expr(Function([x, y], opf.op.add(opf.op.multiply(x, y), y)))


def test_multiply_add_becomes_ewise_fma():
    mod = _seed_module()
    x, y = opf.var("x", (3, 4)), opf.var("y", (3, 4))
    expected = IRModule.from_expr(Function([x, y], opf.op.ewise_fma(x, y, y)))
    new = FuseMultiplyAdd()(mod)
    assert_structural_equal(new, expected)
    inputs = [_normal(3, 4), _normal(3, 4)]
    assert_close(evaluate(new, inputs), evaluate(mod, inputs), rtol=1e-5)


def test_multiply_add_with_the_product_second_and_broadcasting():
    a, b, c = opf.var("a", (4,)), opf.var("b", (2, 4)), opf.var("c", (3, 1, 1))
    mod = IRModule.from_expr(Function([a, b, c],
                                      opf.op.nn.relu(opf.op.add(c, opf.op.multiply(a, b)))))
    a2, b2, c2 = opf.var("a", (4,)), opf.var("b", (2, 4)), opf.var("c", (3, 1, 1))
    expected = IRModule.from_expr(Function([a2, b2, c2],
                                           opf.op.nn.relu(opf.op.ewise_fma(a2, b2, c2))))
    new = FuseMultiplyAdd()(mod)
    assert_structural_equal(new, expected)
    inputs = [_normal(4), _normal(2, 4), _normal(3, 1, 1)]
    assert_close(evaluate(new, inputs), evaluate(mod, inputs), rtol=1e-5)


def test_a_product_with_another_user_stays_for_it():
    # structural matching: the add is rewritten, the multiply remains for the relu
    x, y = opf.var("x", (3,)), opf.var("y", (3,))
    product = opf.op.multiply(x, y)
    mod = IRModule.from_expr(Function([x, y], opf.Tuple([opf.op.add(product, y),
                                                          opf.op.nn.relu(product)])))
    x2, y2 = opf.var("x", (3,)), opf.var("y", (3,))
    expected = IRModule.from_expr(Function([x2, y2], opf.Tuple([
        opf.op.ewise_fma(x2, y2, y2), opf.op.nn.relu(opf.op.multiply(x2, y2))])))
    new = FuseMultiplyAdd()(mod)
    assert_structural_equal(new, expected)
    inputs = [_normal(3), _normal(3)]
    assert_close(evaluate(new, inputs), evaluate(mod, inputs), rtol=1e-5)


def test_other_arithmetic_is_left_alone():
    x, y = opf.var("x", (3,)), opf.var("y", (3,))
    mod = IRModule.from_expr(Function([x, y], opf.op.subtract(opf.op.multiply(x, y), y)))
    assert FuseMultiplyAdd()(mod)["main"] is mod["main"]


def test_a_chain_of_multiply_adds_fuses_every_link():
    x = opf.var("x", (5,))
    value = x
    for _ in range(4):
        value = opf.op.add(opf.op.multiply(value, x), x)
    mod = IRModule.from_expr(Function([x], value))
    new = FuseMultiplyAdd()(mod)
    names = [n.op_name for n in post_order(new["main"]) if isinstance(n, Call)]
    assert names == ["ewise_fma"] * 4
    inputs = [_normal(5)]
    assert_close(evaluate(new, inputs), evaluate(mod, inputs), rtol=1e-5)


# -- FuseDenseAdd ------------------------------------------------------------------------------

def _mlp(names=("x", "w0", "b0", "w1", "b1")):
    # The lecture's MLP: dense+add, relu, dense+add
    x = opf.var(names[0], (1, 784))
    w0, b0 = opf.var(names[1], (128, 784)), opf.var(names[2], (128,))
    w1, b1 = opf.var(names[3], (10, 128)), opf.var(names[4], (10,))
    return x, w0, b0, w1, b1


def _fused_dense_add(x_shape, w_shape, b_shape):
    px, pw, pb = opf.var("x", x_shape), opf.var("w", w_shape), opf.var("b", b_shape)
    body = opf.op.add(opf.op.nn.dense(px, pw), pb)
    return Function([px, pw, pb], body).with_attr("Primitive", 1)


def test_dense_add_becomes_a_call_of_a_primitive_function():
    x, w0, b0, w1, b1 = _mlp()
    lv1 = opf.op.add(opf.op.nn.dense(x, w0), b0)
    lv4 = opf.op.add(opf.op.nn.dense(opf.op.nn.relu(lv1), w1), b1)
    mod = IRModule.from_expr(Function([x, w0, b0, w1, b1], lv4))

    x, w0, b0, w1, b1 = _mlp()
    f0 = _fused_dense_add((1, 784), (128, 784), (128,))
    f1 = _fused_dense_add((1, 128), (10, 128), (10,))
    hidden = Call(f0, [x, w0, b0])
    expected = IRModule.from_expr(Function([x, w0, b0, w1, b1],
                                           Call(f1, [opf.op.nn.relu(hidden), w1, b1])))
    new = FuseDenseAdd()(mod)
    assert_structural_equal(new, expected)
    inputs = [_normal(1, 784), _normal(128, 784), _normal(128), _normal(10, 128), _normal(10)]
    np.testing.assert_array_equal(evaluate(new, inputs), evaluate(mod, inputs))


def test_dense_attributes_and_the_bias_first_form_are_kept():
    x, w, b = opf.var("x", (2, 8)), opf.var("w", (4, 8)), opf.var("b", (2, 4))
    mod = IRModule.from_expr(Function([x, w, b], opf.op.add(b, opf.op.nn.dense(x, w, units=4))))
    px, pw, pb = opf.var("x", (2, 8)), opf.var("w", (4, 8)), opf.var("b", (2, 4))
    fused = Function([px, pw, pb], opf.op.add(opf.op.nn.dense(px, pw, units=4), pb),
                     attrs={"Primitive": 1})
    x2, w2, b2 = opf.var("x", (2, 8)), opf.var("w", (4, 8)), opf.var("b", (2, 4))
    expected = IRModule.from_expr(Function([x2, w2, b2], Call(fused, [x2, w2, b2])))
    new = FuseDenseAdd()(mod)
    assert_structural_equal(new, expected)
    inputs = [_normal(2, 8), _normal(4, 8), _normal(2, 4)]
    np.testing.assert_array_equal(evaluate(new, inputs), evaluate(mod, inputs))


def test_fusing_twice_does_not_nest_primitive_functions():
    x, w0, b0, _, _ = _mlp()
    mod = IRModule.from_expr(Function([x, w0, b0], opf.op.add(opf.op.nn.dense(x, w0), b0)))
    once = FuseDenseAdd()(mod)
    twice = FuseDenseAdd()(once)
    assert twice["main"] is once["main"]
    primitives = [n for n in post_order(twice["main"]) if isinstance(n, Function) and
                  n.is_primitive]
    assert len(primitives) == 1


def test_dense_without_add_is_left_alone():
    x, w0, _, _, _ = _mlp()
    mod = IRModule.from_expr(Function([x, w0], opf.op.nn.relu(opf.op.nn.dense(x, w0))))
    assert FuseDenseAdd()(mod)["main"] is mod["main"]


# -- as passes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("make", [FuseMultiplyAdd, FuseDenseAdd])
def test_the_passes_are_opt_level_3(make):
    pass_ = make()
    assert pass_.info.opt_level == 3 and pass_.info.name == make.__name__


def test_below_opt_level_3_a_sequential_skips_them():
    mod = _seed_module()
    with PassContext(opt_level=2):
        new = Sequential([FuseMultiplyAdd()])(mod)
    assert new["main"] is mod["main"]
    with PassContext(opt_level=3):
        new = Sequential([FuseMultiplyAdd()])(mod)
    assert new["main"].body.op_name == "ewise_fma"


@pytest.mark.parametrize("make", [FuseMultiplyAdd, FuseDenseAdd])
def test_the_passes_never_change_their_input(make):
    x, w, b = opf.var("x", (2, 8)), opf.var("w", (4, 8)), opf.var("b", (4,))
    body = opf.op.add(opf.op.multiply(opf.op.add(opf.op.nn.dense(x, w), b), b), b)
    mod = IRModule.from_expr(Function([x, w, b], body))
    before, functions = mod.astext(), mod.functions
    new = make()(mod)
    assert new is not mod and mod.astext() == before and mod.functions == functions


def test_fused_modules_print_and_parse_back():
    x, w0, b0, _, _ = _mlp()
    mod = IRModule.from_expr(Function([x, w0, b0], opf.op.add(opf.op.nn.dense(x, w0), b0)))
    for new in (FuseDenseAdd()(mod), FuseMultiplyAdd()(_seed_module())):
        assert_structural_equal(opf.parse(new.astext()), new)
