"""Expressions, types, modules and type inference."""

import numpy as np
import pytest

import opfusion as opf
from opfusion.ir import FuncType, TensorType, TupleType, infer_type


def test_var_takes_a_shape_or_a_type():
    assert opf.var("x", (1, 3)).type_annotation == TensorType((1, 3), "float32")
    assert opf.var("x", (2,), dtype="int64").type_annotation == TensorType((2,), "int64")
    ty = TensorType((4,), "float16")
    assert opf.var("x", ty).type_annotation is ty


def test_var_without_a_shape_is_an_error():
    with pytest.raises(opf.OpfusionError, match="variable %x needs a shape"):
        opf.var("x")


def test_bad_dimension_is_an_error():
    with pytest.raises(opf.OpfusionError, match="bad dimension -1"):
        TensorType((1, -1))


def test_unsupported_dtype_is_an_error():
    with pytest.raises(opf.OpfusionError, match="complex64"):
        opf.var("x", (2,), dtype="complex64")


def test_nodes_are_immutable():
    x = opf.var("x", (2,))
    call = opf.op.exp(x)
    with pytest.raises(AttributeError):
        call.args = ()
    with pytest.raises(AttributeError):
        x.name_hint = "y"


def test_constant_freezes_a_copy_of_its_array():
    array = np.ones(3, np.float32)
    c = opf.const(array)
    array[0] = 5
    assert c.data[0] == 1
    with pytest.raises(ValueError):
        c.data[0] = 2


def test_const_defaults_follow_tvm():
    assert opf.const(0.5).data.dtype == np.float32
    assert opf.const(3).data.dtype == np.int32
    assert opf.const(True).data.dtype == np.bool_
    assert opf.const(np.arange(3)).data.dtype == np.int64
    assert opf.const(1, dtype="float16").data.dtype == np.float16


def test_python_operators_build_calls():
    x = opf.var("x", (2,))
    y = opf.var("y", (2,))
    assert [c.op.name for c in (x + y, x - y, x * y, x / y, -x)] == [
        "add", "subtract", "multiply", "divide", "negative"]
    assert (2.0 - x).args[0].data == 2.0


def test_call_with_a_non_expression_argument_names_the_op():
    with pytest.raises(opf.OpfusionError, match="add: argument 1 must be an expression"):
        opf.Call("add", [opf.var("x", (2,)), 3])


def test_unknown_op_suggests_a_name():
    with pytest.raises(opf.UnknownOpError, match="did you mean 'multiply'"):
        opf.Call("multipy", [])


def test_function_and_tuple_types():
    x = opf.var("x", (2, 3))
    t = opf.Tuple([opf.op.exp(x), x])
    f = opf.Function([x], opf.TupleGetItem(t, 0))
    assert t.checked_type == TupleType([TensorType((2, 3)), TensorType((2, 3))])
    assert f.checked_type == FuncType([TensorType((2, 3))], TensorType((2, 3)))


def test_return_annotation_is_checked():
    x = opf.var("x", (2,))
    f = opf.Function([x], opf.op.exp(x), ret_type=TensorType((3,)))
    with pytest.raises(opf.OpfusionTypeError, match="annotated"):
        _ = f.checked_type


def test_tuple_index_out_of_range():
    x = opf.var("x", (2,))
    with pytest.raises(opf.OpfusionTypeError, match="index out of range"):
        _ = opf.TupleGetItem(opf.Tuple([x]), 1).checked_type


def test_call_of_a_function_checks_argument_types():
    p = opf.var("p", (2,))
    inner = opf.Function([p], opf.op.exp(p), attrs={"Primitive": 1})
    x = opf.var("x", (3,))
    with pytest.raises(opf.OpfusionTypeError, match="argument 0 has type"):
        _ = inner(x).checked_type


def test_span_names_the_source_node_in_errors():
    x = opf.var("x", (2, 3))
    y = opf.var("y", (4,))
    call = opf.Call("add", [x, y], span="encoder/add_1")
    with pytest.raises(opf.OpfusionTypeError, match="node 'encoder/add_1'"):
        _ = call.checked_type


def test_global_function_calls_resolve_through_the_module():
    a = opf.var("a", (2,))
    mod = opf.IRModule({"double": opf.Function([a], a + a)})
    x = opf.var("x", (2,))
    main = opf.Function([x], opf.Call(mod.get_global_var("double"), [x]))
    mod["main"] = main
    assert infer_type(main, mod) == FuncType([TensorType((2,))], TensorType((2,)))
    assert list(mod) == ["double", "main"]


def test_module_from_expr_collects_free_variables_in_use_order():
    x, y = opf.var("x", (2,)), opf.var("y", (2,))
    mod = opf.IRModule.from_expr(y * x + y)
    assert [p.name_hint for p in mod["main"].params] == ["y", "x"]


def test_module_lookup_of_a_missing_function_lists_the_known_ones():
    mod = opf.IRModule.from_expr(opf.var("x", (1,)))
    with pytest.raises(opf.OpfusionError, match="no function @f .*@main"):
        mod["f"]


def test_with_function_leaves_the_original_unchanged():
    x = opf.var("x", (1,))
    mod = opf.IRModule.from_expr(opf.Function([x], x))
    new = mod.with_function("main", opf.Function([x], -x))
    assert mod["main"].body is x and new["main"].body is not x
