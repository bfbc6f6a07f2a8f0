"""The blocked-layout operators: layout_transform and nn.conv2d_nchwc. Their references agree
with NCHW convolution and plain reshapes; malformed layouts and shapes are type errors that
name the attribute."""

import numpy as np
import pytest

import opfusion as opf
from opfusion.errors import OpfusionError
from opfusion.ir.expr import Function, Var
from opfusion.ir.layout import Layout, transform_array
from opfusion.ir.module import IRModule
from opfusion.ir.op import get_op
from opfusion.ir.visitor import post_order
from opfusion.opdefs.nn import group_local_blocks, group_window_weight
from opfusion.testing import assert_close

nn = opf.op.nn


def normal(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def relayout(array, src, dst):
    return transform_array(array, Layout.parse(src), Layout.parse(dst))


def infer(expr):
    """The type of ``expr``, a call of variables."""
    params = [node for node in post_order(expr) if isinstance(node, Var)]
    mod = opf.transform.InferType()(IRModule.from_expr(Function(params, expr)))
    return mod["main"].body.checked_type


def test_layout_transform_infers_the_blocked_shape():
    x = opf.var("x", shape=(2, 32, 5, 7))
    ty = infer(opf.op.layout_transform(x, src_layout="NCHW", dst_layout="NCHW16c"))
    assert ty.shape == (2, 2, 5, 7, 16)
    w = opf.var("w", shape=(32, 8, 3, 3))
    assert infer(opf.op.layout_transform(w, src_layout="OIHW",
                                         dst_layout="OIHW8i16o")).shape == (2, 1, 3, 3, 8, 16)


@pytest.mark.parametrize("shape, src, dst, words", [
    ((1, 12, 5, 5), "NCHW", "NCHW8c", "not a multiple of the block 8"),
    ((1, 2, 5, 5, 8), "NCHW16c", "NCHW", "block 16c has 8 elements"),
    ((1, 16, 5, 5), "NCHW", "OIHW", "primal axes differ"),
    ((1, 16, 5), "NCHW", "NCHW8c", "rank 3"),
    ((1, 16, 5, 5), "NCHW", "NCHW8", "does not parse"),
])
def test_layout_transform_type_errors_name_the_problem(shape, src, dst, words):
    x = opf.var("x", shape=shape)
    with pytest.raises(OpfusionError, match=words):
        infer(opf.op.layout_transform(x, src_layout=src, dst_layout=dst))


CONV_CASES = [
    # (data NCHW, weight OIHW, in block, out block, attrs)
    ((1, 32, 9, 9), (48, 32, 3, 3), 8, 16, {"strides": 2, "padding": 1}),
    ((1, 3, 11, 11), (16, 3, 5, 5), 3, 16, {"padding": 2}),
    ((2, 16, 7, 6), (8, 16, 1, 1), 16, 8, {}),
    ((1, 8, 9, 9), (4, 8, 3, 3), 4, 4, {"dilation": 2, "padding": (2, 1, 0, 3)}),
    ((1, 16, 7, 7), (8, 8, 3, 3), 4, 4, {"groups": 2, "padding": 1}),
]


def test_conv2d_nchwc_depthwise_reference():
    x, w = normal(1, 16, 9, 9), normal(16, 1, 3, 3, seed=1)
    want = get_op("nn.conv2d").reference(x, w, **get_op("nn.conv2d").make_attrs(
        {"groups": 16, "padding": 1, "strides": 2}))
    got = get_op("nn.conv2d_nchwc").reference(
        relayout(x, "NCHW", "NCHW8c"), relayout(w, "OIHW", "OIHW1i8o"),
        **get_op("nn.conv2d_nchwc").make_attrs({
            "groups": 16, "padding": 1, "strides": 2, "data_layout": "NCHW8c",
            "kernel_layout": "OIHW1i8o", "out_layout": "NCHW8c"}))
    assert_close(relayout(got, "NCHW8c", "NCHW").astype("float32"), want.astype("float32"),
                 1e-5)


@pytest.mark.parametrize("data, weight, ib, ob, attrs", CONV_CASES, ids=str)
def test_conv2d_nchwc_reference_is_the_blocked_conv2d(data, weight, ib, ob, attrs):
    x, w = normal(*data), normal(*weight, seed=1)
    want = get_op("nn.conv2d").reference(
        x, w, **get_op("nn.conv2d").make_attrs(attrs))
    got = get_op("nn.conv2d_nchwc").reference(
        relayout(x, "NCHW", f"NCHW{ib}c"), relayout(w, "OIHW", f"OIHW{ib}i{ob}o"),
        **get_op("nn.conv2d_nchwc").make_attrs({
            **attrs, "data_layout": f"NCHW{ib}c", "kernel_layout": f"OIHW{ib}i{ob}o",
            "out_layout": f"NCHW{ob}c"}))
    assert_close(relayout(got, f"NCHW{ob}c", "NCHW").astype("float32"), want.astype("float32"),
                 1e-5)


GROUP_WINDOW_CASES = [
    # (data NCHW, weight OIHW (grouped), groups, in block, out block, attrs)
    ((1, 136, 5, 5), (136, 34, 1, 1), 4, 8, 8, {}),  # ShuffleNet's 34 a group
    ((1, 48, 7, 9), (40, 12, 3, 3), 4, 8, 8, {"strides": 2, "padding": 1}),  # 12 in, 10 out
    ((2, 48, 5, 4), (24, 16, 3, 2), 3, 8, 8, {"padding": (2, 0, 1, 3)}),  # pad > kernel
]


@pytest.mark.parametrize("data, weight, groups, ib, ob, attrs", GROUP_WINDOW_CASES, ids=str)
def test_group_window_reference_is_the_grouped_conv2d(data, weight, groups, ib, ob, attrs):
    x, w = normal(*data), normal(*weight, seed=1)
    want = get_op("nn.conv2d").reference(
        x, w, **get_op("nn.conv2d").make_attrs({**attrs, "groups": groups}))
    packed = group_window_weight(w, groups, ob)
    local = group_local_blocks(weight[0], groups, ob)
    assert packed.shape == (groups, local, *weight[2:], weight[1], ob)
    assert local < weight[0] // ob  # a group touches fewer output blocks than there are
    got = get_op("nn.conv2d_nchwc").reference(
        relayout(x, "NCHW", f"NCHW{ib}c"), packed,
        **get_op("nn.conv2d_nchwc").make_attrs({
            **attrs, "groups": groups, "group_window": True, "channels": weight[0],
            "data_layout": f"NCHW{ib}c", "kernel_layout": f"OIHW{weight[1]}i{ob}o",
            "out_layout": f"NCHW{ob}c"}))
    assert_close(relayout(got, f"NCHW{ob}c", "NCHW").astype("float32"), want.astype("float32"),
                 1e-5)


def test_group_window_weight_of_the_wrong_width_is_a_type_error():
    with pytest.raises(OpfusionError, match=r"group-window weight .* expected \(4, 5, 1, 1, 34"):
        infer(_conv((1, 17, 5, 5, 8), (4, 4, 1, 1, 34, 8), groups=4, group_window=True,
                    channels=136, data_layout="NCHW8c", kernel_layout="OIHW34i8o",
                    out_layout="NCHW8c"))


def test_group_window_needs_the_channels_attribute():
    with pytest.raises(OpfusionError, match="'channels'=None: the attribute must be set"):
        infer(_conv((1, 17, 5, 5, 8), (4, 5, 1, 1, 34, 8), groups=4, group_window=True,
                    data_layout="NCHW8c", kernel_layout="OIHW34i8o", out_layout="NCHW8c"))


def _conv(data_shape, weight_shape, **attrs):
    x, w = opf.var("x", shape=data_shape), opf.var("w", shape=weight_shape)
    return nn.conv2d_nchwc(x, w, **attrs)


def test_conv2d_nchwc_infers_the_blocked_result():
    ty = infer(_conv((1, 4, 14, 14, 8), (3, 4, 3, 3, 8, 16), padding=1, strides=2,
                     data_layout="NCHW8c", kernel_layout="OIHW8i16o", out_layout="NCHW16c"))
    assert ty.shape == (1, 3, 7, 7, 16)


@pytest.mark.parametrize("shapes, attrs, words", [
    (((1, 2, 5, 5, 16), (2, 4, 3, 3, 8, 16)), {"kernel_layout": "OIHW8i16o"},
     "the weight's input block equal to the data's"),
    (((1, 2, 5, 5, 16), (2, 2, 3, 3, 16, 16)), {"out_layout": "NCHW8c"},
     "must block O as 'out_layout'"),
    (((1, 2, 5, 5, 8), (2, 2, 3, 3, 8, 16)), {}, "do not have the blocks of their layouts"),
    (((1, 2, 5, 5, 16), (2, 2, 3, 3, 16, 16)), {"kernel_layout": "OIHW16o16i"},
     "must have the form OIHW<k>i<k>o"),
    (((1, 2, 5, 5, 16), (2, 2, 3, 3, 16, 16)), {"data_layout": "NHWC16c"},
     "must have the form NCHW<k>c"),
    (((1, 2, 5, 5, 16), (2, 3, 3, 3, 16, 16)), {}, "which groups=1 does not split"),
    (((1, 2, 5, 5, 8), (2, 1, 3, 3, 4, 16)),
     {"data_layout": "NCHW8c", "kernel_layout": "OIHW4i16o", "groups": 4},
     "every block inside one group"),
    (((1, 2, 5, 5, 8), (4, 1, 3, 3, 1, 8)),
     {"data_layout": "NCHW8c", "kernel_layout": "OIHW1i8o", "out_layout": "NCHW8c",
      "groups": 16}, "or a depthwise form"),
    (((1, 2, 5, 5, 16), (2, 2, 3, 3, 16, 16)), {"channels": 16}, "'channels'=16"),
    (((1, 2, 5, 5), (2, 2, 3, 3, 16, 16)), {}, "must be 5-D"),
])
def test_conv2d_nchwc_type_errors_name_the_attribute(shapes, attrs, words):
    with pytest.raises(OpfusionError, match=words):
        infer(_conv(*shapes, **attrs))


@pytest.mark.parametrize("layout", ["NCHW", "NCHW4c", "NCHW8c"])
def test_channel_shuffle_is_the_reshape_transpose_reshape(layout):
    x = normal(2, 24, 3, 5)
    want = x.reshape(2, 3, 8, 3, 5).transpose(0, 2, 1, 3, 4).reshape(2, 24, 3, 5)
    got = get_op("channel_shuffle").reference(relayout(x, "NCHW", layout), groups=3,
                                              layout=layout)
    np.testing.assert_array_equal(relayout(got, layout, "NCHW"), want)


@pytest.mark.parametrize("shape, attrs, words", [
    ((1, 10, 4, 4), {"groups": 3}, "does not divide"),
    ((1, 2, 4, 4, 8), {"groups": 2, "layout": "NHWC8c"}, "must be NCHW or NCHW<k>c"),
    ((1, 2, 4, 4, 8), {"groups": 2}, "must be NCHW or NCHW<k>c for data of rank 5"),
])
def test_channel_shuffle_type_errors(shape, attrs, words):
    with pytest.raises(OpfusionError, match=words):
        infer(opf.op.channel_shuffle(opf.var("x", shape=shape), **attrs))
