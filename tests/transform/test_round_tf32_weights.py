"""RoundTF32Weights: with a CUDA target that allows TF32, the constant operands of products
are rounded to TF32 once, at compile time (a shared constant keeps its values for the other
operators that read it); elsewhere nothing changes."""

import numpy as np
import pytest

import opfusion as opf
from opfusion import op
from opfusion.ir.expr import Call, Constant, Function, Var
from opfusion.ir.types import TensorType
from opfusion.ir.visitor import post_order
from opfusion.tir.mma import round_tf32_array
from opfusion.transform import InferType, RoundTF32Weights

TF32 = "cuda -arch=sm_90 -tf32=1"
rng = np.random.default_rng(0)


def _weights(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def _model():
    """A convolution and a product whose weights are constants, and an add that reads the
    product's weight too."""
    x = Var("x", TensorType((8, 8, 4, 4), "float32"))
    y = Var("y", TensorType((2, 16), "float32"))
    w_conv, w_dense = Constant(_weights(16, 8, 3, 3)), Constant(_weights(16, 16))
    conv = op.nn.conv2d(x, w_conv, padding=(1, 1))
    dense = op.add(op.nn.dense(y, w_dense), op.sum(w_dense, axis=[0]))
    mod = opf.IRModule.from_expr(Function([x, y], opf.ir.expr.Tuple([conv, dense])))
    return InferType()(mod), w_conv, w_dense


def _calls(mod, name):
    return [n for n in post_order(mod["main"].body) if isinstance(n, Call)
            and getattr(n.op, "name", None) == name]


def _round(mod, target):
    with opf.transform.PassContext(opt_level=3):
        return InferType()(RoundTF32Weights(target)(mod))


def test_products_constant_operands_are_rounded_and_other_readers_keep_theirs():
    mod, w_conv, w_dense = _model()
    out = _round(mod, TF32)
    (conv,), (dense,) = _calls(out, "nn.conv2d"), _calls(out, "nn.dense")
    np.testing.assert_array_equal(conv.args[1].data, round_tf32_array(w_conv.data))
    np.testing.assert_array_equal(dense.args[1].data, round_tf32_array(w_dense.data))
    (total,) = _calls(out, "sum")  # the add's read of the product's weight: unrounded
    assert total.args[0] is w_dense


@pytest.mark.parametrize("target", ["cuda -arch=sm_90", "c"])
def test_nothing_changes_without_tf32(target):
    mod, w_conv, w_dense = _model()
    out = _round(mod, target)
    assert _calls(out, "nn.conv2d")[0].args[1] is w_conv
    assert _calls(out, "nn.dense")[0].args[1] is w_dense


def test_weights_tf32_holds_already_are_kept_and_the_pass_can_be_disabled():
    x = Var("x", TensorType((2, 16), "float32"))
    exact = Constant(round_tf32_array(_weights(16, 16)))
    mod = InferType()(opf.IRModule.from_expr(Function([x], op.nn.dense(x, exact))))
    assert _calls(_round(mod, TF32), "nn.dense")[0].args[1] is exact
    raw = Constant(_weights(16, 16))
    mod = InferType()(opf.IRModule.from_expr(Function([x], op.nn.dense(x, raw))))
    with opf.transform.PassContext(opt_level=3, disabled_pass=["RoundTF32Weights"]):
        out = opf.transform.Sequential([RoundTF32Weights(TF32)])(mod)
    assert _calls(out, "nn.dense")[0].args[1] is raw
