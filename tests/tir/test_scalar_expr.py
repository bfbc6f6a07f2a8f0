"""Scalar expressions: construction, constant folding, dtype promotion, printing, errors."""

import math

import pytest

from opfusion.errors import TensorExprError
from opfusion.tir import expr as E


def test_int_constants_fold_at_construction():
    got = E.IntImm(2) + E.IntImm(3)
    assert isinstance(got, E.IntImm) and got.value == 5 and got.dtype == "int32"


def test_identities_return_the_operand():
    x = E.Var("x")
    assert x * 1 is x and 1 * x is x
    assert x + 0 is x and 0 + x is x
    assert x - 0 is x
    assert x // 1 is x


def test_integer_zero_products_fold():
    x = E.Var("x")
    got = x * 0
    assert isinstance(got, E.IntImm) and got.value == 0


def test_float_zero_products_do_not_fold():
    # x * 0.0 is NaN for x = inf: not an identity on floats
    f = E.Var("f", "float32")
    assert isinstance(f * 0.0, E.Mul)


def test_float_constants_fold_in_float32():
    got = E.FloatImm(0.1) + E.FloatImm(0.2)
    assert isinstance(got, E.FloatImm)
    assert got.value == float(__import__("numpy").float32(0.1) + __import__("numpy").float32(0.2))


def test_comparisons_of_constants_fold_to_bool():
    got = E.IntImm(2) < 3
    assert isinstance(got, E.IntImm) and got.dtype == "bool" and got.value == 1


def test_python_literals_adopt_the_expression_dtype():
    f = E.Var("f", "float64")
    assert (f + 1).dtype == "float64"
    i = E.Var("i", "int64")
    assert (i * 3).dtype == "int64"


def test_float_literal_against_int_expression_is_float32():
    i = E.Var("i")
    got = i * 0.5
    assert got.dtype == "float32"
    assert isinstance(got.a, E.Cast)


def test_promotion_rules():
    assert E.promote_dtypes("int32", "int64") == "int64"
    assert E.promote_dtypes("int32", "float32") == "float32"
    assert E.promote_dtypes("float32", "float64") == "float64"
    assert E.promote_dtypes("uint32", "int32") == "int32"
    assert E.promote_dtypes("bool", "int8") == "int8"


def test_mixed_dtypes_are_cast_to_the_promoted_one():
    i = E.Var("i")
    j = E.Var("j", "int64")
    got = i + j
    assert got.dtype == "int64" and isinstance(got.a, E.Cast)


def test_true_division_of_integers_is_an_error():
    i = E.Var("i")
    with pytest.raises(TensorExprError, match="//"):
        _ = i / 2


def test_floor_division_and_modulo_fold_like_python():
    assert (E.IntImm(-7) // 2).value == -4
    assert (E.IntImm(-7) % 2).value == 1


def test_expression_has_no_truth_value():
    i = E.Var("i")
    with pytest.raises(TensorExprError, match="if_then_else"):
        bool(i < 3)


def test_equality_of_nodes_in_python_asks_identity():
    i, j = E.Var("i"), E.Var("j")
    assert bool(i == i)
    assert not bool(i == j)
    assert isinstance(i == j, E.EQ)


def test_logical_operators_need_bools():
    i = E.Var("i")
    both = (i < 3) & (i > 0)
    assert isinstance(both, E.And)
    with pytest.raises(TensorExprError, match="bool"):
        _ = i & (i < 3)


def test_logical_operators_fold_with_constants():
    c = E.Var("i") < 3
    assert ((E.const(True)) & c) is c
    assert isinstance(E.const(False) & c, E.IntImm)
    assert ~~c is c


def test_select_with_constant_condition_picks_a_branch():
    a, b = E.Var("a", "float32"), E.Var("b", "float32")
    assert E.select(True, a, b) is a
    assert E.select(E.IntImm(0, "bool"), a, b) is b


def test_cast_folds_constants_like_c():
    assert E.cast(E.FloatImm(-2.7), "int32").value == -2
    assert E.cast(300, "uint8").value == 44
    assert E.cast(E.IntImm(5), "float32").value == 5.0


def test_intrinsics_need_float_arguments():
    with pytest.raises(TensorExprError, match="cast"):
        E.call("exp", E.Var("i"))
    assert E.call("exp", E.Var("f", "float32")).dtype == "float32"


def test_unknown_intrinsic_is_an_error():
    with pytest.raises(TensorExprError, match="unknown intrinsic"):
        E.Call("softplus", [E.FloatImm(1.0)], "float32")


def test_nodes_are_immutable():
    x = E.Var("x")
    with pytest.raises(AttributeError):
        x.name = "y"


def test_constant_out_of_range_is_an_error():
    with pytest.raises(TensorExprError, match="does not fit"):
        E.IntImm(2**40, "int32")


def test_const_picks_dtypes_from_python_values():
    assert E.const(1).dtype == "int32"
    assert E.const(2**40).dtype == "int64"
    assert E.const(1.5).dtype == "float32"
    assert E.const(True).dtype == "bool"


def test_substitute_replaces_variables_and_folds():
    x, y = E.Var("x"), E.Var("y")
    got = E.substitute(x * 4 + y, {x: 2, y: E.IntImm(1)})
    assert isinstance(got, E.IntImm) and got.value == 9


def test_free_vars_in_first_seen_order():
    x, y = E.Var("x"), E.Var("y")
    assert E.free_vars(y * 2 + x + y) == [y, x]


def test_buffer_offset_is_row_major():
    b = E.Buffer("A", (3, 4, 5))
    assert b.strides == (20, 5, 1)
    got = b.offset_of([E.IntImm(1), E.IntImm(2), E.IntImm(3)])
    assert got.value == 1 * 20 + 2 * 5 + 3


def test_big_buffers_index_in_int64():
    b = E.Buffer("A", (65536, 65536))
    assert b.index_dtype == "int64"
    assert b.offset_of([E.Var("i"), E.Var("j")]).dtype == "int64"
    assert E.Buffer("B", (1024,)).index_dtype == "int32"


def test_buffer_load_checks_index_count():
    b = E.Buffer("A", (3, 4))
    with pytest.raises(TensorExprError, match="2 dimension"):
        E.BufferLoad(b, [E.IntImm(0)])


@pytest.mark.parametrize(("expr", "text"), [
    (lambda x, y: x * 64 + y, "x*64 + y"),
    (lambda x, y: (x + y) * 3, "(x + y)*3"),
    (lambda x, y: x - (y - 1), "x - (y - 1)"),
    (lambda x, y: x // 4 % 3, "x // 4 % 3"),
    (lambda x, y: E.minimum(x, y + 1), "min(x, y + 1)"),
    (lambda x, y: (x < 3) & (y >= 2), "x < 3 && y >= 2"),
    (lambda x, y: E.cast(x, "float32") * 0.5, "float32(x)*0.5f"),
    (lambda x, y: E.select(x < y, x, y), "select(x < y, x, y)"),
    (lambda x, y: E.IntImm(5, "int64") + E.cast(x, "int64"), "5i64 + int64(x)"),
])
def test_expression_printing(expr, text):
    x, y = E.Var("x"), E.Var("y")
    assert str(expr(x, y)) == text


def test_infinite_constants_print_with_their_dtype():
    assert str(E.FloatImm(math.inf)) == "float32(inf)"
