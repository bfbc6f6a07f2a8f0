"""PackMatmulWeights: constant right operands of matrix products packed into column panels at
compile time (nn.matmul_packed of a folded layout_transform), rows that do not cut into whole
register tiles computed and cropped by the packed kernel itself (no copy, the epilogue in the
kernel), products of computed operands with awkward sizes (a vision
transformer's 197 tokens) padded and cropped; every rewrite computes the reference's numbers."""

import numpy as np
import pytest

import opfusion as opf
from opfusion.compiler.compile import alter_layout
from opfusion.errors import OpfusionError
from opfusion.ir.evaluate import evaluate
from opfusion.ir.expr import Call, Constant, Function
from opfusion.ir.module import IRModule
from opfusion.ir.op import get_op
from opfusion.ir.visitor import post_order
from opfusion.target import Target
from opfusion.testing import assert_close

nn = opf.op.nn
AVX512 = Target("c -mattr=+avx512f,+avx512dq,+avx512bw,+avx512vl,+avx2,+fma")
AVX2 = Target("c -mattr=+avx2,+fma")


def normal(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def rewritten(expr, target=AVX512):
    params = [n for n in post_order(expr) if isinstance(n, opf.ir.Var)]
    mod = opf.transform.InferType()(IRModule.from_expr(Function(params, expr)))
    with opf.transform.PassContext(opt_level=3):
        return alter_layout(mod, target)["main"]


def ops(func):
    return [n.op.name for n in post_order(func.body) if isinstance(n, Call)]


def check(expr, *values, rtol=1e-5, target=None):
    params = [n for n in post_order(expr) if isinstance(n, opf.ir.Var)]
    mod = IRModule.from_expr(Function(params, expr))
    assert_close(opf.compile(mod, target=target)(*values), evaluate(mod, list(values)), rtol)


@pytest.mark.parametrize("shape", [(1, 128, 96), (64, 96), (197, 1, 96)], ids=str)
def test_a_constant_weight_is_packed_at_compile_time(shape):
    x = opf.var("x", shape=shape)
    y = nn.matmul(x, opf.const(normal(96, 64, seed=1))) + opf.const(normal(64, seed=2))
    func = rewritten(y)
    (product,) = [n for n in post_order(func.body)
                  if isinstance(n, Call) and n.op.name == "nn.matmul_packed"]
    panels = product.args[1]
    assert isinstance(panels, Constant) and panels.data.shape == (2, 96, 32)  # folded
    assert "layout_transform" not in ops(func) and "nn.matmul" not in ops(func)
    check(y, normal(*shape, seed=3))


@pytest.mark.parametrize("target", [AVX512, Target("c -mattr=+avx2,+fma")], ids=["avx512",
                                                                                   "avx2"])
@pytest.mark.parametrize("shape", [(197, 96), (1, 197, 96), (9, 96), (30, 96)], ids=str)
def test_rows_not_a_multiple_of_the_tile_need_no_copy_and_keep_the_epilogue(shape, target):
    x = opf.var("x", shape=shape)
    y = nn.dense(x, opf.const(normal(48, 96, seed=1)))  # dense: an (N, K) weight
    y = opf.op.nn.relu(y + opf.const(normal(48, seed=2)))
    names = ops(rewritten(y, target))
    assert "nn.pad" not in names and "strided_slice" not in names
    params = [n for n in post_order(y) if isinstance(n, opf.ir.Var)]
    mod = IRModule.from_expr(Function(params, y))
    value = normal(*shape, seed=4)
    exe = opf.compile(mod)  # for this machine: the AVX-512 code may not run here
    assert_close(exe(value), evaluate(mod, [value]), 1e-5)
    assert exe.num_kernels == 1  # the product, its crop, the bias and the relu in one


def test_attention_products_of_an_odd_length_are_padded():
    q, k = opf.var("q", shape=(1, 3, 197, 64)), opf.var("k", shape=(1, 3, 64, 197))
    scores = nn.matmul(q, k)
    names = ops(rewritten(scores))
    assert names.count("nn.pad") == 2 and names.count("strided_slice") == 1
    check(scores, normal(1, 3, 197, 64, seed=5), normal(1, 3, 64, 197, seed=6))


def test_small_or_even_products_are_left_alone():
    a, b = opf.var("a", shape=(4, 8, 16)), opf.var("b", shape=(4, 16, 32))
    assert ops(rewritten(nn.matmul(a, b))) == ["nn.matmul"]
    x = opf.var("x", shape=(3, 90))  # columns not in whole vectors
    assert ops(rewritten(nn.matmul(x, opf.const(normal(90, 20))))) == ["nn.matmul"]



@pytest.mark.parametrize("rows, width, target, cols", [
    (1, 96, AVX2, 48),     # 12 vectors: the most up to 8 that divide them, 6
    (1, 4096, AVX2, 64),   # 1 row x 8 vectors
    (2, 64, AVX2, 32),     # 2 rows x 4 vectors
    (3, 64, AVX2, 16),     # 3 rows x 2 vectors
    (5, 64, AVX2, 64),     # 5 rows cut into 1-row tiles: 8 vectors
    (1, 96, AVX512, 96),   # 6 vectors of 16
    (6, 1000, AVX2, 16),   # 3 rows x 2 vectors: 125 vectors padded to 126 (8 columns)
    (6, 504, AVX2, 8),     # 63 vectors: padding to 64 would add 8 columns, over 1/64
    (1, 50257, AVX2, 64),  # a vocabulary in no whole vectors: 6283 padded to 6288
], ids=str)
def test_few_rows_are_packed_in_panels_of_their_register_tile(rows, width, target, cols):
    for dense in (False, True):
        x = opf.var("x", shape=(rows, 40))
        weight = normal(width, 40, seed=1) if dense else normal(40, width, seed=1)
        y = nn.dense(x, opf.const(weight)) if dense else nn.matmul(x, opf.const(weight))
        (product,) = [n for n in post_order(rewritten(y, target).body)
                      if isinstance(n, Call) and n.op.name == "nn.matmul_packed"]
        assert product.args[1].data.shape == (-(-width // cols), 40, cols)
        assert product.checked_type.shape == (rows, width)


@pytest.mark.parametrize("rows, width, dense", [(1, 96, False), (2, 64, True), (3, 40, False),
                                                (5, 1000, True), (7, 24, False),
                                                (1, 1001, False), (3, 1000, True)], ids=str)
def test_few_rows_packed_compute_the_reference(rows, width, dense):
    # AVX2's vectors of 8, which every width divides, whatever vectors the host has
    if AVX2.missing_on_host():
        pytest.skip(f"the host lacks {AVX2.missing_on_host()}")
    x = opf.var("x", shape=(rows, 72))
    weight = normal(width, 72, seed=1) if dense else normal(72, width, seed=1)
    y = nn.dense(x, opf.const(weight)) if dense else nn.matmul(x, opf.const(weight))
    y = opf.op.nn.relu(y + opf.const(normal(width, seed=2)))
    assert "nn.matmul_packed" in ops(rewritten(y, AVX2))
    check(y, normal(rows, 72, seed=3), target=AVX2)


@pytest.mark.parametrize("width, target, panels, cols", [
    (1024, AVX2, 43, 24),     # 4 x 3 tiles: 8 zero columns (1/128) in the last panel
    (1024, AVX512, 32, 32),   # 48-column panels would add 32 (1/32): two vectors, no padding
    (4096, AVX512, 86, 48),   # 32 zero columns of 4128 (1/128)
    (1000, AVX512, 21, 48),   # no whole vectors: 8 zero columns
    (1001, AVX2, 42, 24),     # no whole vectors: 7 zero columns
], ids=str)
def test_columns_are_padded_with_zeros_to_whole_panels(width, target, panels, cols):
    for dense in (False, True):
        x = opf.var("x", shape=(64, 40))
        weight = normal(width, 40, seed=1) if dense else normal(40, width, seed=1)
        y = nn.dense(x, opf.const(weight)) if dense else nn.matmul(x, opf.const(weight))
        (product,) = [n for n in post_order(rewritten(y, target).body)
                      if isinstance(n, Call) and n.op.name == "nn.matmul_packed"]
        assert product.args[1].data.shape == (panels, 40, cols)
        assert product.attrs["columns"] == (0 if panels * cols == width else width)
        assert product.checked_type.shape == (64, width)
        assert not product.args[1].data.transpose(1, 0, 2).reshape(40, -1)[:, width:].any()


@pytest.mark.parametrize("rows, width", [(64, 1024), (197, 1000), (130, 1001), (8, 4100)],
                         ids=str)
def test_padded_panels_compute_the_reference(rows, width):
    # the zero columns and any rows past whole tiles cropped in the kernel, with the epilogue
    if AVX2.missing_on_host():
        pytest.skip(f"the host lacks {AVX2.missing_on_host()}")
    x = opf.var("x", shape=(rows, 40))
    y = opf.op.nn.relu(nn.matmul(x, opf.const(normal(40, width, seed=1)))
                       + opf.const(normal(width, seed=2)))
    (product,) = [n for n in post_order(rewritten(y, AVX2).body)
                  if isinstance(n, Call) and n.op.name == "nn.matmul_packed"]
    assert product.attrs["columns"] == width
    params = [n for n in post_order(y) if isinstance(n, opf.ir.Var)]
    mod = IRModule.from_expr(Function(params, y))
    exe = opf.compile(mod, target=AVX2)
    assert exe.num_kernels == 1
    value = normal(rows, 40, seed=3)
    assert_close(exe(value), evaluate(mod, [value]), 1e-5)


def test_a_weight_above_the_folding_limit_is_packed_all_the_same():
    x = opf.var("x", shape=(1, 96))
    mod = opf.transform.InferType()(IRModule.from_expr(
        Function([x], nn.matmul(x, opf.const(normal(96, 64))))))
    with opf.transform.PassContext(opt_level=3, config={"FoldConstant.max_elements": 100}):
        func = alter_layout(mod, AVX2)["main"]
    assert ops(func) == ["nn.matmul_packed"]  # no layout_transform left to run per call
    (product,) = [n for n in post_order(func.body) if isinstance(n, Call)]
    assert isinstance(product.args[1], Constant) and product.args[1].data.shape == (1, 96, 64)


def test_disabled_pass_keeps_the_product():
    x = opf.var("x", shape=(64, 96))
    mod = opf.transform.InferType()(IRModule.from_expr(
        Function([x], nn.matmul(x, opf.const(normal(96, 64))))))
    with opf.transform.PassContext(opt_level=3, disabled_pass=["PackMatmulWeights"]):
        assert ops(alter_layout(mod, AVX512)["main"]) == ["nn.matmul"]


def test_matmul_packed_reference_and_type_errors():
    op = get_op("nn.matmul_packed")
    a, w = normal(5, 12), normal(12, 32, seed=1)
    panels = w.reshape(12, 2, 16).transpose(1, 0, 2)
    np.testing.assert_allclose(op.reference(a, panels), a.astype("float64") @ w, rtol=1e-6)
    x = opf.var("x", shape=(5, 12))
    with pytest.raises(OpfusionError, match="column panels"):
        opf.transform.InferType()(IRModule.from_expr(Function(
            [x], Call(op, [x, opf.const(w)], {}))))
    with pytest.raises(OpfusionError, match="contracts 12 values"):
        opf.transform.InferType()(IRModule.from_expr(Function(
            [x], Call(op, [x, opf.const(normal(2, 11, 16))], {}))))
    # columns: the real ones of panels whose last ends in zeros
    np.testing.assert_allclose(op.reference(a, panels, columns=20),
                               a.astype("float64") @ w[:, :20], rtol=1e-6)
    for columns in (16, 33):  # the last panel all zeros; more than the panels hold
        with pytest.raises(OpfusionError, match="must end in the last of the 2 panels"):
            opf.transform.InferType()(IRModule.from_expr(Function(
                [x], Call(op, [x, opf.const(panels)], {"columns": columns}))))
