"""Pooling in the blocked layout NCHW<k>c (data (N, C/k, H, W, k)): the TE computes (run by
the loop-IR interpreter) and the scheduled kernels (the CPU rule's default config, compiled,
alone and with a bias + relu epilogue) agree with the NumPy reference on edge shapes; windows
that cross the edge read the input in place, through no padded copy; and the attributes are
checked with errors that name the op and the attribute."""

import re
import shutil

import numpy as np
import pytest

import opfusion as opf
from opfusion import te
from opfusion.backend import get_backend
from opfusion.errors import OpAttributeError, OpfusionTypeError
from opfusion.ir.evaluate import evaluate
from opfusion.ir.expr import Function
from opfusion.ir.layout import Layout, transform_array
from opfusion.ir.module import IRModule
from opfusion.target import Target
from opfusion.testing import assert_close, eval_op
from opfusion.topi import get_compute
from opfusion.topi.nn_pool import blocked_columns
from opfusion.topi.testing import call_over_arrays, check_compute

nn = opf.op.nn
compiler = pytest.mark.skipif(not (shutil.which("gcc") or shutil.which("cc")),
                              reason="no C compiler")


@pytest.fixture(autouse=True)
def private_kernel_cache(tmp_path_factory, monkeypatch):
    """Compiled kernels go to a cache of this module's own, not ~/.cache."""
    monkeypatch.setenv("OPFUSION_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "kernels"))


def normal(*shape, dtype="float32", seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def blocked(x, block):
    """NCHW ``x`` in NCHW<block>c."""
    return transform_array(x, Layout.parse("NCHW"), Layout.parse(f"NCHW{block}c"))


WINDOWS = [
    {"pool_size": 2},
    {"pool_size": 2, "strides": 2},
    {"pool_size": 3, "strides": 2, "padding": 1},
    {"pool_size": 3, "strides": 2, "ceil_mode": True},
    {"pool_size": 3, "strides": 2, "padding": 1, "ceil_mode": True},
    {"pool_size": 3, "padding": 1},
    {"pool_size": (3, 2), "strides": (2, 1), "padding": (1, 0, 0, 1)},
    {"pool_size": 3, "strides": 2, "padding": (0, 1, 2, 0), "ceil_mode": True},
    {"pool_size": 2, "strides": 3, "ceil_mode": True},
    {"pool_size": 2, "dilation": 2, "padding": 1},
    {"pool_size": (2, 3), "dilation": (2, 1), "strides": 2, "padding": 1, "ceil_mode": True},
    {"pool_size": (7, 9)},
]


# ---------------------------------------------------------------------------------------------
# the reference


def test_blocked_reference_is_the_nchw_pool_in_blocks():
    x = normal(2, 16, 9, 7)
    attrs = {"pool_size": 3, "strides": 2, "padding": 1, "ceil_mode": True}
    for builder in (nn.max_pool2d, nn.avg_pool2d):
        got = eval_op(builder, blocked(x, 8), layout="NCHW8c", **attrs)
        assert_close(got, blocked(eval_op(builder, x, **attrs), 8))
    for builder in (nn.global_max_pool2d, nn.global_avg_pool2d):
        got = eval_op(builder, blocked(x, 4), layout="NCHW4c")
        assert got.shape == (2, 4, 1, 1, 4)
        assert_close(got, blocked(eval_op(builder, x), 4))


# ---------------------------------------------------------------------------------------------
# the computes, interpreted


@pytest.mark.parametrize("block", [4, 16])
@pytest.mark.parametrize("attrs", WINDOWS, ids=str)
def test_max_pool2d_compute(attrs, block):
    check_compute(nn.max_pool2d, normal(2, 2, 9, 11, block), layout=f"NCHW{block}c", **attrs)


@pytest.mark.parametrize("count_include_pad", [False, True])
@pytest.mark.parametrize("attrs", WINDOWS, ids=str)
def test_avg_pool2d_compute(attrs, count_include_pad):
    check_compute(nn.avg_pool2d, normal(2, 2, 9, 11, 8), layout="NCHW8c",
                  count_include_pad=count_include_pad, **attrs)


@pytest.mark.parametrize("dtype", ["int32", "int8"])
def test_max_pool2d_integers_pad_with_the_lowest_value(dtype):
    x = np.random.default_rng(1).integers(-100, -50, (1, 2, 5, 7, 4)).astype(dtype)
    check_compute(nn.max_pool2d, x, layout="NCHW4c", pool_size=3, strides=2, padding=1,
                  ceil_mode=True)


@pytest.mark.parametrize("shape", [(2, 3, 4, 5, 8), (1, 2, 1, 1, 4), (1, 1, 7, 7, 16)])
def test_global_pools_compute(shape):
    layout = f"NCHW{shape[4]}c"
    check_compute(nn.global_avg_pool2d, normal(*shape), layout=layout)
    check_compute(nn.global_max_pool2d, normal(*shape), layout=layout)


# ---------------------------------------------------------------------------------------------
# the scheduled kernels, compiled


def scheduled(builder, x, epilogue=False, **attrs):
    """The compiled kernel of ``builder(x, **attrs)`` scheduled by its rule's default
    config (with ``relu(result + bias[channel block])`` fused when ``epilogue``), the
    lowered loops' text, the arguments and the expected result."""
    call, params, values = call_over_arrays(builder, (x,), attrs)
    want = evaluate(IRModule.from_expr(Function(params, call)), values)
    holders = [te.placeholder(p.type_annotation.shape, p.type_annotation.dtype,
                              name=p.name_hint) for p in params]
    anchor = get_compute(call.op.name)(holders, call.attrs, call.checked_type)
    output, added = anchor, None
    if epilogue:
        bias = te.placeholder((anchor.shape[1],), anchor.dtype, name="bias")
        added = te.compute(anchor.shape, lambda *i: anchor[i] + bias[i[1]], name="add")
        output = te.compute(anchor.shape, lambda *i: te.max(added[i], 0.0), name="relu")
        b = normal(anchor.shape[1], seed=9)
        want = np.maximum(want + b.reshape(1, -1, 1, 1, 1), 0).astype(want.dtype)
        holders, values = [*holders, bias], [*values, b]
    s = te.create_schedule(output.op)
    if added is not None:
        s[added].compute_inline()
    get_backend().schedule(s, anchor, output, call.op.name)
    args = [*holders, output]
    return opf.build(s, args, name="blocked_pool"), str(opf.lower(s, args)), values, want


def check_scheduled(builder, x, epilogue=False, **attrs):
    kernel, text, values, want = scheduled(builder, x, epilogue, **attrs)
    got = np.empty(want.shape, want.dtype)
    kernel(*values, got)
    assert_close(got, want, 1e-5)
    return kernel, text


@compiler
@pytest.mark.parametrize("target", ["c -mattr=+avx2,+fma", "c"])
@pytest.mark.parametrize("block", [4, 8, 16])
@pytest.mark.parametrize("attrs", WINDOWS, ids=str)
def test_max_pool2d_kernel(attrs, block, target):
    with Target(target):
        check_scheduled(nn.max_pool2d, normal(1, 2, 13, 15, block), layout=f"NCHW{block}c",
                        **attrs)


@compiler
@pytest.mark.parametrize("count_include_pad", [False, True])
@pytest.mark.parametrize("attrs", WINDOWS, ids=str)
def test_avg_pool2d_kernel(attrs, count_include_pad):
    check_scheduled(nn.avg_pool2d, normal(1, 3, 13, 15, 16), layout="NCHW16c",
                    count_include_pad=count_include_pad, **attrs)


@compiler
@pytest.mark.parametrize("builder, attrs", [
    (nn.max_pool2d, {"pool_size": 3, "strides": 2, "padding": 1}),
    (nn.max_pool2d, {"pool_size": 3, "strides": 2, "ceil_mode": True}),
    (nn.avg_pool2d, {"pool_size": 3, "padding": 1}),
    (nn.avg_pool2d, {"pool_size": 2, "strides": 2, "count_include_pad": True}),
    (nn.global_avg_pool2d, {}),
    (nn.global_max_pool2d, {}),
])
def test_kernels_with_epilogue(builder, attrs):
    check_scheduled(builder, normal(2, 3, 11, 9, 8), epilogue=True, layout="NCHW8c", **attrs)


@compiler
@pytest.mark.parametrize("epilogue", [False, True])
@pytest.mark.parametrize("builder, width, attrs", [
    (nn.max_pool2d, 13, {"pool_size": 3, "padding": 1}),  # 13 columns: reduced as 16
    (nn.max_pool2d, 23, {"pool_size": 3, "strides": 2}),  # 11 columns: reduced as 12
    (nn.avg_pool2d, 13, {"pool_size": 3, "padding": 1, "ceil_mode": True}),
    (nn.avg_pool2d, 26, {"pool_size": 2, "strides": 2, "count_include_pad": True}),
])
def test_rows_without_a_register_tile_are_reduced_wider_and_cropped(builder, width, attrs,
                                                                     epilogue):
    check_scheduled(builder, normal(1, 2, 9, width, 8), epilogue=epilogue, layout="NCHW8c",
                    **attrs)


def test_blocked_columns():
    assert [blocked_columns(w) for w in (1, 7, 8, 11, 13, 17, 27, 55, 56, 111)] == [
        1, 7, 8, 12, 16, 20, 27, 55, 56, 111]


@compiler
@pytest.mark.parametrize("block", [1, 3])
def test_blocks_narrower_than_a_vector(block):
    x = normal(1, 3, 9, 9, block)
    layout = f"NCHW{block}c"
    check_scheduled(nn.max_pool2d, x, layout=layout, pool_size=3, strides=2, padding=1)
    check_scheduled(nn.avg_pool2d, x, layout=layout, pool_size=3, padding=1)
    check_scheduled(nn.global_avg_pool2d, x, layout=layout)


@compiler
@pytest.mark.parametrize("dtype", ["int32", "int8"])
def test_max_pool2d_integer_kernel(dtype):
    x = np.random.default_rng(3).integers(-100, 100, (1, 2, 9, 10, 8)).astype(dtype)
    check_scheduled(nn.max_pool2d, x, layout="NCHW8c", pool_size=3, strides=2, padding=1,
                    ceil_mode=True)
    check_scheduled(nn.global_max_pool2d, x, layout="NCHW8c")


@compiler
@pytest.mark.parametrize("shape", [(1, 4, 7, 7, 16), (2, 3, 13, 1, 8), (1, 2, 40, 40, 4)])
def test_global_pool_kernels(shape):
    layout = f"NCHW{shape[4]}c"
    check_scheduled(nn.global_avg_pool2d, normal(*shape), layout=layout)
    check_scheduled(nn.global_max_pool2d, normal(*shape), layout=layout)


@compiler
@pytest.mark.parametrize("builder, attrs", [
    (nn.max_pool2d, {"pool_size": 3, "strides": 2, "padding": 1}),
    (nn.max_pool2d, {"pool_size": 3, "strides": 2, "padding": 1, "dilation": 2}),
    (nn.avg_pool2d, {"pool_size": 3, "strides": 2, "padding": 1, "ceil_mode": True}),
])
def test_windows_across_the_edge_read_the_input_in_place(builder, attrs):
    kernel, text = check_scheduled(builder, normal(1, 4, 28, 28, 16), epilogue=True,
                                   layout="NCHW16c", **attrs)
    # No padded copy: the only buffers allocated are the per-task window reductions, and
    # the rows run in parallel, a channel block per vector.
    allocated = re.findall(r"allocate\((\w+):", text)
    assert not [name for name in allocated if "pad" in name]
    source = kernel.get_source()
    assert "#pragma omp parallel for" in source
    assert re.search(r"opf_load_float32x\d+\(&x0\[", source)


# ---------------------------------------------------------------------------------------------
# attributes and types


@pytest.mark.parametrize("layout", ["NHWC", "NCHW16h", "NCHWc", "NCHW0c", "NCHW8c4h", "nchw"])
def test_other_layouts_are_refused_naming_the_attribute(layout):
    x = opf.var("x", shape=(1, 2, 8, 8, 8))
    for builder in (nn.max_pool2d, nn.avg_pool2d, nn.global_avg_pool2d, nn.global_max_pool2d):
        with pytest.raises(OpAttributeError, match=rf"{builder.__name__}.*'layout'.*NCHW<k>c"):
            builder(x, layout=layout)


def test_the_data_must_have_the_layout_block():
    x = opf.var("x", shape=(1, 2, 8, 8, 8))
    with pytest.raises(OpfusionTypeError, match="8 channels per block.*'NCHW4c'"):
        nn.max_pool2d(x, pool_size=2, layout="NCHW4c").checked_type  # noqa: B018
    with pytest.raises(OpfusionTypeError, match="5-D but attribute 'layout' is 'NCHW'"):
        nn.avg_pool2d(x, pool_size=2).checked_type  # noqa: B018
    nchw = opf.var("y", shape=(1, 16, 8, 8))
    with pytest.raises(OpfusionTypeError, match="'NCHW8c' takes 5-D data"):
        nn.global_max_pool2d(nchw, layout="NCHW8c").checked_type  # noqa: B018


def test_blocked_result_types():
    x = opf.var("x", shape=(2, 3, 111, 111, 16))
    pooled = nn.max_pool2d(x, pool_size=3, strides=2, ceil_mode=True, layout="NCHW16c")
    assert pooled.checked_type.shape == (2, 3, 55, 55, 16)
    assert nn.global_avg_pool2d(x, layout="NCHW16c").checked_type.shape == (2, 3, 1, 1, 16)
