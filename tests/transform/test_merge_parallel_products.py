"""MergeParallelProducts: products of one operand by several constant weights (a
transformer's queries, keys and values) become one product by the weights side by side and a
slice of it each, with the same numbers; products of other operands, computed weights,
transposed products or weights of another depth stay; opf.compile runs it for the fusing
strategies."""

import numpy as np
import pytest

import opfusion as opf
from opfusion.ir.evaluate import evaluate
from opfusion.ir.expr import Call, Function
from opfusion.ir.module import IRModule
from opfusion.ir.visitor import post_order
from opfusion.testing import assert_close
from opfusion.transform import InferType, MergeParallelProducts, PassContext

nn = opf.op.nn


def normal(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def calls(mod, name):
    return [n for n in post_order(mod["main"].body)
            if isinstance(n, Call) and getattr(n.op, "name", None) == name]


def merged(mod):
    with PassContext(opt_level=3):
        return MergeParallelProducts()(InferType()(mod))


def module(x, out):
    return IRModule.from_expr(Function([x], out))


def check_same_numbers(mod, new, shape):
    value = normal(*shape, seed=9)
    assert_close(evaluate(new, [value]), evaluate(mod, [value]), 1e-5)


def test_query_key_and_value_projections_become_one_product():
    x = opf.var("x", shape=(1, 6, 16))
    q, k, v = (nn.matmul(x, opf.const(normal(16, n, seed=n))) for n in (16, 16, 8))
    mod = module(x, opf.Tuple([opf.op.add(q, opf.const(normal(16))), k, opf.op.exp(v)]))
    new = merged(mod)
    (product,) = calls(new, "nn.matmul")
    assert product.args[1].data.shape == (16, 40)
    slices = calls(new, "strided_slice")
    assert [(s.attrs.begin, s.attrs.end) for s in slices] == [((0,), (16,)), ((16,), (32,)),
                                                            ((32,), (40,))]
    check_same_numbers(mod, new, (1, 6, 16))


def test_dense_products_merge_along_their_weight_rows():
    x = opf.var("x", shape=(4, 12))
    outs = [nn.dense(x, opf.const(normal(n, 12, seed=n)), units=n) for n in (8, 24)]
    mod = module(x, opf.op.concatenate(outs, axis=1))
    new = merged(mod)
    (product,) = calls(new, "nn.dense")
    assert product.args[1].data.shape == (32, 12)
    check_same_numbers(mod, new, (4, 12))


@pytest.mark.parametrize("case", ["other operands", "a computed weight", "transposed",
                                  "another depth", "one product"])
def test_products_that_cannot_merge_stay(case):
    x = opf.var("x", shape=(3, 8))
    w = opf.const(normal(8, 8))
    if case == "other operands":
        outs = [nn.matmul(x, w), nn.matmul(opf.op.exp(x), opf.const(normal(8, 8, seed=1)))]
    elif case == "a computed weight":
        outs = [nn.matmul(x, w), nn.matmul(x, opf.op.exp(w))]
    elif case == "transposed":
        outs = [nn.matmul(x, w), nn.matmul(x, opf.const(normal(8, 8, seed=1)),
                                           transpose_b=True)]
    elif case == "another depth":
        outs = [nn.matmul(x, w), nn.matmul(opf.op.concatenate([x, x], axis=1),
                                           opf.const(normal(16, 8, seed=1)))]
    else:
        outs = [nn.matmul(x, w), opf.op.exp(x)]
    mod = module(x, opf.Tuple(outs))
    new = merged(mod)
    assert calls(new, "strided_slice") == []
    check_same_numbers(mod, new, (3, 8))


def test_compile_merges_the_projections_of_a_bert_layer():
    from opfusion.frontend import from_onnx
    from opfusion.testing.transformer import transformer_model

    mod, params = from_onnx(transformer_model("bert_layer"))
    x = normal(1, 128, 768, seed=2)
    want = opf.compile(mod, params=params, fusion="none").run([x])[0]
    products = {}
    for disabled in ([], ["MergeParallelProducts"]):
        with PassContext(opt_level=3, disabled_pass=disabled):
            exe = opf.compile(mod, params=params)
        assert_close(exe.run([x])[0], want, 1e-4)
        products[bool(disabled)] = sum(
            op == "nn.matmul_packed" for step in exe.steps for op in step.group.op_names)
    assert products == {False: 4, True: 6}  # q, k, v as one; the output and two FFN ones
