"""InferType: every expression typed; errors name the function and the failing expression."""

import pytest

import opfusion as opf
from opfusion.ir import post_order
from opfusion.transform.infer_type import InferType


def test_every_node_gets_its_type():
    x = opf.var("x", (1, 3, 8, 8))
    w = opf.var("w", (4, 3, 3, 3))
    body = opf.op.nn.relu(opf.op.nn.conv2d(x, w, padding=1))
    mod = InferType()(opf.IRModule.from_expr(opf.Function([x, w], body)))
    for node in post_order(mod["main"]):
        assert node._checked_type is not None
    assert mod["main"].body.checked_type == opf.TensorType((1, 4, 8, 8))


def test_type_errors_name_the_function_and_the_expression():
    x = opf.var("x", (2, 3))
    y = opf.var("y", (4,))
    mod = opf.IRModule.from_expr(opf.Function([x, y], opf.op.exp(x + y)))
    with pytest.raises(opf.OpfusionTypeError) as info:
        InferType()(mod)
    message = str(info.value)
    assert message.startswith("in @main: ")
    assert "cannot broadcast" in message
    assert "add(Tensor[(2, 3), float32], Tensor[(4,), float32])" in message
