"""FoldScaleAxis: per-channel multiplies fold into conv2d/dense weights, backward (the scale after
the layer) and forward (the scale before it); what must not fold stays as it is; the numbers
always agree with the reference interpreter."""

import numpy as np
import pytest

import opfusion as opf
from opfusion.ir import Call, Constant, Op, assert_structural_equal, evaluate, post_order
from opfusion.testing import assert_close
from opfusion.transform import PassContext, Sequential, get_pass
from opfusion.transform.fold_constant import FoldConstant
from opfusion.transform.fold_scale_axis import (
    BackwardFoldScaleAxis,
    FoldScaleAxis,
    ForwardFoldScaleAxis,
    fold_scale_axis,
)
from opfusion.transform.simplify_inference import SimplifyInference

rng = np.random.default_rng(31337)
f32 = np.float32
nn = opf.op.nn


def _randn(*shape):
    return rng.standard_normal(shape).astype(f32)


def _positive(*shape):
    return rng.uniform(0.5, 2.0, shape).astype(f32)


def _module(params, body):
    return opf.IRModule.from_expr(opf.Function(params, body))


def _ops(mod):
    return [node.op.name for name in mod for node in post_order(mod[name])
            if isinstance(node, Call) and isinstance(node.op, Op)]


def _random_inputs(mod):
    return [rng.standard_normal(p.type_annotation.shape).astype(p.type_annotation.dtype)
            for p in mod["main"].params]


def _check_numbers(before, after):
    inputs = _random_inputs(before)
    assert_close(evaluate(after, inputs), evaluate(before, inputs), rtol=1e-5)


def _times(array, factor, shape):
    """array * factor.reshape(shape) in float64, rounded once (as the pass folds constants)."""
    return (array.astype(np.float64) * factor.astype(np.float64).reshape(shape)).astype(f32)


def _full_pipeline(mod):
    """SimplifyInference, FoldConstant, FoldScaleAxis, FoldConstant: the issue's bar."""
    return FoldConstant()(FoldScaleAxis()(FoldConstant()(SimplifyInference()(mod))))


def _bn(data, channels, axis=1):
    gamma, beta, mean = _randn(channels), _randn(channels), _randn(channels)
    var = _positive(channels)
    return nn.batch_norm(data, opf.const(gamma), opf.const(beta), opf.const(mean),
                         opf.const(var), axis=axis, epsilon=1e-3)


def _bn_scale_shift(call):
    """The constants SimplifyInference makes of a constant batch_norm call."""
    gamma, beta, mean, var = (arg.data.astype(np.float64) for arg in call.args[1:])
    scale = gamma / np.sqrt(var + call.attrs.epsilon)
    return scale.astype(f32), (beta - mean * scale).astype(f32)


# ---------------------------------------------------------------------------------------------
# the bar: conv2d + batch_norm -> one conv2d and one add


def test_conv_batch_norm_ends_as_one_conv_and_an_add():
    x = opf.var("x", shape=(2, 3, 8, 8))
    weight = _randn(6, 3, 3, 3)
    bn = _bn(nn.conv2d(x, opf.const(weight), padding=1), 6)
    before = _module([x], bn)
    after = _full_pipeline(before)

    scale, shift = _bn_scale_shift(bn)
    x2 = opf.var("x", shape=(2, 3, 8, 8))
    conv = nn.conv2d(x2, opf.const(_times(weight, scale, (-1, 1, 1, 1))), padding=1)
    want = opf.op.add(conv, opf.const(shift.reshape(6, 1, 1)))
    assert_structural_equal(after, _module([x2], want))
    _check_numbers(before, after)


def test_conv_batch_norm_relu_keeps_only_conv_add_relu():
    x = opf.var("x", shape=(1, 4, 6, 6))
    before = _module([x], nn.relu(_bn(nn.conv2d(x, opf.const(_randn(8, 4, 1, 1))), 8)))
    after = _full_pipeline(before)
    assert _ops(after) == ["nn.conv2d", "add", "nn.relu"]
    _check_numbers(before, after)


@pytest.mark.parametrize("groups,out_channels", [(2, 6), (4, 4), (4, 8)])
def test_grouped_and_depthwise_conv_batch_norm_fold(groups, out_channels):
    x = opf.var("x", shape=(2, 4, 7, 7))
    weight = opf.const(_randn(out_channels, 4 // groups, 3, 3))
    before = _module([x], _bn(nn.conv2d(x, weight, groups=groups, padding=1), out_channels))
    after = _full_pipeline(before)
    assert _ops(after) == ["nn.conv2d", "add"]
    _check_numbers(before, after)


def test_dense_batch_norm_on_the_last_axis_folds():
    # Channels last: batch_norm along axis -1 after a dense.
    x = opf.var("x", shape=(3, 10))
    before = _module([x], _bn(nn.dense(x, opf.const(_randn(7, 10))), 7, axis=-1))
    after = _full_pipeline(before)
    assert _ops(after) == ["nn.dense", "add"]
    _check_numbers(before, after)


def test_resnet_block_has_no_batch_norm_and_no_multiply_left():
    # conv-bn-relu-conv-bn, plus a conv-bn shortcut, added and relu'd; then one more block
    # with an identity shortcut.
    x = opf.var("x", shape=(2, 4, 8, 8))

    def conv_bn(data, in_c, out_c, kernel, padding):
        conv = nn.conv2d(data, opf.const(_randn(out_c, in_c, kernel, kernel) * f32(0.3)),
                         padding=padding)
        return _bn(conv, out_c)

    branch = conv_bn(nn.relu(conv_bn(x, 4, 8, 3, 1)), 8, 8, 3, 1)
    shortcut = conv_bn(x, 4, 8, 1, 0)
    block1 = nn.relu(opf.op.add(branch, shortcut))
    branch2 = conv_bn(nn.relu(conv_bn(block1, 8, 8, 3, 1)), 8, 8, 3, 1)
    block2 = nn.relu(opf.op.add(branch2, block1))
    before = _module([x], block2)
    after = _full_pipeline(before)

    ops = _ops(after)
    assert "nn.batch_norm" not in ops and "multiply" not in ops
    assert ops.count("nn.conv2d") == 5
    _check_numbers(before, after)


# ---------------------------------------------------------------------------------------------
# backward folding


def test_variable_weight_gets_a_multiply_of_the_scale():
    x, w = opf.var("x", shape=(1, 3, 5, 5)), opf.var("w", shape=(4, 3, 3, 3))
    scale = _randn(4, 1, 1)
    before = _module([x, w], opf.op.multiply(nn.conv2d(x, w), opf.const(scale)))
    after = FoldScaleAxis()(before)

    x2, w2 = opf.var("x", shape=(1, 3, 5, 5)), opf.var("w", shape=(4, 3, 3, 3))
    want = nn.conv2d(x2, opf.op.multiply(w2, opf.const(scale.reshape(4, 1, 1, 1))))
    assert_structural_equal(after, _module([x2, w2], want))
    _check_numbers(before, after)


def test_a_1_c_1_1_scale_folds_like_a_c_1_1_scale():
    x = opf.var("x", shape=(2, 3, 5, 5))
    weight, scale = _randn(4, 3, 3, 3), _randn(1, 4, 1, 1)
    before = _module([x], opf.op.multiply(opf.const(scale), nn.conv2d(x, opf.const(weight))))
    after = FoldScaleAxis()(before)
    x2 = opf.var("x", shape=(2, 3, 5, 5))
    want = nn.conv2d(x2, opf.const(_times(weight, scale, (-1, 1, 1, 1))))
    assert_structural_equal(after, _module([x2], want))
    _check_numbers(before, after)


def test_a_variable_scale_is_reshaped_onto_the_weight():
    x, w = opf.var("x", shape=(1, 3, 5, 5)), opf.var("w", shape=(4, 3, 3, 3))
    s = opf.var("s", shape=(4, 1, 1))
    before = _module([x, w, s], opf.op.multiply(nn.conv2d(x, w), s))
    after = FoldScaleAxis()(before)

    x2, w2 = opf.var("x", shape=(1, 3, 5, 5)), opf.var("w", shape=(4, 3, 3, 3))
    s2 = opf.var("s", shape=(4, 1, 1))
    want = nn.conv2d(x2, opf.op.multiply(w2, opf.op.reshape(s2, newshape=[-1, 1, 1, 1])))
    assert_structural_equal(after, _module([x2, w2, s2], want))
    _check_numbers(before, after)


def test_dense_times_scale_folds_into_the_weight_rows():
    x = opf.var("x", shape=(4, 6))
    weight, scale = _randn(5, 6), _randn(5)
    before = _module([x], opf.op.multiply(nn.dense(x, opf.const(weight)), opf.const(scale)))
    after = BackwardFoldScaleAxis()(before)
    x2 = opf.var("x", shape=(4, 6))
    want = nn.dense(x2, opf.const(_times(weight, scale, (-1, 1))))
    assert_structural_equal(after, _module([x2], want))
    _check_numbers(before, after)


def test_conv_bias_add_scale_scales_weight_and_bias():
    x = opf.var("x", shape=(1, 3, 6, 6))
    weight, bias, scale = _randn(4, 3, 3, 3), _randn(4), _randn(4, 1, 1)
    conv = nn.bias_add(nn.conv2d(x, opf.const(weight)), opf.const(bias))
    before = _module([x], opf.op.multiply(conv, opf.const(scale)))
    after = FoldScaleAxis()(before)

    x2 = opf.var("x", shape=(1, 3, 6, 6))
    want = nn.bias_add(nn.conv2d(x2, opf.const(_times(weight, scale, (-1, 1, 1, 1)))),
                       opf.const(_times(bias, scale, (-1,))))
    assert_structural_equal(after, _module([x2], want))
    _check_numbers(before, after)


@pytest.mark.parametrize("bias_shape", [(4, 1, 1), (1, 4, 1, 1), (1, 1, 1), ()])
def test_conv_add_bias_scale_scales_weight_and_bias(bias_shape):
    x = opf.var("x", shape=(1, 3, 6, 6))
    weight, bias, scale = _randn(4, 3, 3, 3), _randn(*bias_shape), _randn(4, 1, 1)
    conv = opf.op.add(nn.conv2d(x, opf.const(weight)), opf.const(bias))
    before = _module([x], opf.op.multiply(conv, opf.const(scale)))
    after = FoldScaleAxis()(before)
    assert _ops(after) == ["nn.conv2d", "add"]
    _check_numbers(before, after)


def test_scale_folds_through_subtract_on_either_side():
    x = opf.var("x", shape=(1, 3, 6, 6))
    conv = nn.conv2d(x, opf.const(_randn(4, 3, 3, 3)))
    bias = opf.const(_randn(4, 1, 1))
    out = opf.op.multiply(opf.op.subtract(bias, opf.op.subtract(conv, bias)),
                          opf.const(_randn(4, 1, 1)))
    before = _module([x], out)
    after = FoldScaleAxis()(before)
    assert "multiply" not in _ops(after)
    _check_numbers(before, after)


def test_positive_scale_folds_through_relu():
    x = opf.var("x", shape=(1, 3, 6, 6))
    weight, scale = _randn(4, 3, 3, 3), _positive(4, 1, 1)
    before = _module([x], opf.op.multiply(nn.relu(nn.conv2d(x, opf.const(weight))),
                                          opf.const(scale)))
    after = FoldScaleAxis()(before)
    x2 = opf.var("x", shape=(1, 3, 6, 6))
    want = nn.relu(nn.conv2d(x2, opf.const(_times(weight, scale, (-1, 1, 1, 1)))))
    assert_structural_equal(after, _module([x2], want))
    _check_numbers(before, after)


def test_two_scales_in_a_row_fold_in_one_pass():
    x = opf.var("x", shape=(1, 3, 6, 6))
    conv = nn.leaky_relu(nn.conv2d(x, opf.const(_randn(4, 3, 3, 3))), alpha=0.1)
    out = opf.op.multiply(opf.op.multiply(conv, opf.const(_positive(4, 1, 1))),
                          opf.const(_positive(1, 4, 1, 1)))
    before = _module([x], out)
    after = FoldScaleAxis()(before)
    assert _ops(after) == ["nn.conv2d", "nn.leaky_relu"]
    _check_numbers(before, after)


def test_residual_add_of_two_conv_branches_scales_both():
    x = opf.var("x", shape=(1, 3, 6, 6))
    left = nn.conv2d(x, opf.const(_randn(4, 3, 3, 3)), padding=1)
    right = nn.bias_add(nn.conv2d(x, opf.const(_randn(4, 3, 1, 1))), opf.const(_randn(4)))
    before = _module([x], opf.op.multiply(opf.op.add(left, right), opf.const(_randn(4, 1, 1))))
    after = FoldScaleAxis()(before)
    assert _ops(after) == ["nn.conv2d", "nn.conv2d", "nn.bias_add", "add"]
    _check_numbers(before, after)


def test_a_scalar_scale_folds_both_ways():
    x = opf.var("x", shape=(1, 3, 6, 6))
    weight = _randn(4, 3, 3, 3)
    conv = nn.conv2d(opf.op.multiply(x, opf.const(f32(0.5))), opf.const(weight))
    before = _module([x], opf.op.multiply(conv, opf.const(f32(3.0))))
    after = FoldScaleAxis()(before)
    x2 = opf.var("x", shape=(1, 3, 6, 6))
    want = nn.conv2d(x2, opf.const((weight.astype(np.float64) * 3.0 * 0.5).astype(f32)))
    assert_structural_equal(after, _module([x2], want))
    _check_numbers(before, after)


# ---------------------------------------------------------------------------------------------
# what must not fold


def _unchanged(before):
    after = FoldScaleAxis()(before)
    assert_structural_equal(after, before)
    _check_numbers(before, after)


def test_a_scale_that_is_not_per_channel_does_not_fold():
    x = opf.var("x", shape=(1, 3, 6, 6))
    conv = nn.conv2d(x, opf.const(_randn(4, 3, 3, 3)))
    _unchanged(_module([x], opf.op.multiply(conv, opf.const(_randn(1, 4, 4, 4)))))
    _unchanged(_module([x], opf.op.multiply(conv, opf.const(_randn(4, 4, 1)))))


def test_a_scale_along_the_wrong_axis_does_not_fold():
    # (4,) lines up with W (which also has 4 entries), not with the 4 channels.
    x = opf.var("x", shape=(1, 3, 6, 6))
    conv = nn.conv2d(x, opf.const(_randn(4, 3, 3, 3)))
    _unchanged(_module([x], opf.op.multiply(conv, opf.const(_randn(4)))))
    _unchanged(_module([x], opf.op.multiply(conv, opf.const(_randn(1, 1, 4, 1)))))


def test_a_scale_that_broadcasts_the_conv_up_does_not_fold():
    x = opf.var("x", shape=(1, 3, 6, 6))
    conv = nn.conv2d(x, opf.const(_randn(4, 3, 3, 3)))
    _unchanged(_module([x], opf.op.multiply(conv, opf.const(_randn(2, 4, 1, 1)))))


def test_a_conv_with_another_consumer_does_not_fold():
    x = opf.var("x", shape=(1, 3, 6, 6))
    conv = nn.conv2d(x, opf.const(_randn(4, 3, 3, 3)))
    scaled = opf.op.multiply(conv, opf.const(_randn(4, 1, 1)))
    _unchanged(_module([x], opf.op.add(scaled, nn.relu(conv))))
    _unchanged(_module([x], opf.Tuple([scaled, conv])))


def test_a_relu_with_another_consumer_blocks_the_chain():
    x = opf.var("x", shape=(1, 3, 6, 6))
    act = nn.relu(nn.conv2d(x, opf.const(_randn(4, 3, 3, 3))))
    _unchanged(_module([x], opf.op.add(opf.op.multiply(act, opf.const(_positive(4, 1, 1))),
                                       act)))


def test_a_negative_scale_does_not_pass_a_relu():
    x = opf.var("x", shape=(1, 3, 6, 6))
    scale = _positive(4, 1, 1)
    scale[2] = -scale[2]
    act = nn.relu(nn.conv2d(x, opf.const(_randn(4, 3, 3, 3))))
    _unchanged(_module([x], opf.op.multiply(act, opf.const(scale))))


def test_a_variable_scale_does_not_pass_a_relu():
    x, s = opf.var("x", shape=(1, 3, 6, 6)), opf.var("s", shape=(4, 1, 1))
    act = nn.relu(nn.conv2d(x, opf.const(_randn(4, 3, 3, 3))))
    _unchanged(_module([x, s], opf.op.multiply(act, s)))


def test_an_integer_conv_does_not_fold():
    x = opf.var("x", shape=(1, 3, 6, 6), dtype="int32")
    weight = opf.const(rng.integers(-3, 3, (4, 3, 3, 3)).astype(np.int32))
    scale = opf.const(rng.integers(1, 4, (4, 1, 1)).astype(np.int32))
    before = _module([x], opf.op.multiply(nn.conv2d(x, weight), scale))
    assert_structural_equal(FoldScaleAxis()(before), before)


def test_a_scale_after_a_non_channel_op_does_not_fold():
    x = opf.var("x", shape=(1, 3, 6, 6))
    pooled = nn.max_pool2d(nn.conv2d(x, opf.const(_randn(4, 3, 3, 3))), pool_size=2)
    _unchanged(_module([x], opf.op.multiply(pooled, opf.const(_randn(4, 1, 1)))))


# ---------------------------------------------------------------------------------------------
# forward folding


def test_forward_input_scale_folds_into_the_input_channels():
    x = opf.var("x", shape=(2, 3, 6, 6))
    weight, scale = _randn(4, 3, 3, 3), _randn(3, 1, 1)
    before = _module([x], nn.conv2d(opf.op.multiply(x, opf.const(scale)), opf.const(weight)))
    after = ForwardFoldScaleAxis()(before)
    x2 = opf.var("x", shape=(2, 3, 6, 6))
    want = nn.conv2d(x2, opf.const(_times(weight, scale, (-1, 1, 1))))
    assert_structural_equal(after, _module([x2], want))
    _check_numbers(before, after)


def test_forward_positive_scale_folds_through_relu():
    x = opf.var("x", shape=(2, 3, 6, 6))
    weight, scale = _randn(4, 3, 3, 3), _positive(3, 1, 1)
    scaled = nn.relu(opf.op.multiply(x, opf.const(scale)))
    before = _module([x], nn.conv2d(scaled, opf.const(weight), padding=1))
    after = FoldScaleAxis()(before)
    x2 = opf.var("x", shape=(2, 3, 6, 6))
    want = nn.conv2d(nn.relu(x2), opf.const(_times(weight, scale, (-1, 1, 1))), padding=1)
    assert_structural_equal(after, _module([x2], want))
    _check_numbers(before, after)


def test_forward_negative_scale_does_not_pass_a_relu():
    x = opf.var("x", shape=(2, 3, 6, 6))
    scale = -_positive(3, 1, 1)
    scaled = nn.relu(opf.op.multiply(x, opf.const(scale)))
    _unchanged(_module([x], nn.conv2d(scaled, opf.const(_randn(4, 3, 3, 3)))))


def test_forward_scale_passes_an_add_by_dividing_the_bias():
    # conv(x * s + b, w) -> conv(x + b / s, w * s): an input normalization folded away
    x = opf.var("x", shape=(2, 3, 6, 6))
    weight, scale, bias = _randn(4, 3, 3, 3), _positive(3, 1, 1), _randn(3, 1, 1)
    normalized = opf.op.add(opf.op.multiply(x, opf.const(scale)), opf.const(bias))
    before = _module([x], nn.conv2d(normalized, opf.const(weight)))
    after = FoldScaleAxis()(before)

    x2 = opf.var("x", shape=(2, 3, 6, 6))
    new_bias = (bias.astype(np.float64) / scale.astype(np.float64)).astype(f32)
    want = nn.conv2d(opf.op.add(x2, opf.const(new_bias)),
                     opf.const(_times(weight, scale, (-1, 1, 1))))
    assert_structural_equal(after, _module([x2], want))
    _check_numbers(before, after)


def test_forward_scale_passes_subtract_and_bias_add():
    x = opf.var("x", shape=(2, 3, 6, 6))
    scaled = opf.op.multiply(opf.const(_randn(1, 3, 1, 1)), x)
    shifted = nn.bias_add(opf.op.subtract(opf.const(_randn(3, 1, 1)), scaled),
                          opf.const(_randn(3)))
    before = _module([x], nn.conv2d(shifted, opf.const(_randn(4, 3, 3, 3))))
    after = FoldScaleAxis()(before)
    assert "multiply" not in _ops(after)
    _check_numbers(before, after)


def test_forward_scale_with_a_zero_does_not_pass_an_add():
    x = opf.var("x", shape=(2, 3, 6, 6))
    scale = _positive(3, 1, 1)
    scale[1] = 0.0
    normalized = opf.op.add(opf.op.multiply(x, opf.const(scale)), opf.const(_randn(3, 1, 1)))
    _unchanged(_module([x], nn.conv2d(normalized, opf.const(_randn(4, 3, 3, 3)))))


@pytest.mark.parametrize("groups,out_channels", [(2, 6), (4, 4), (4, 8), (1, 5)])
def test_forward_folds_into_grouped_and_depthwise_convs(groups, out_channels):
    x = opf.var("x", shape=(2, 4, 6, 6))
    weight = opf.const(_randn(out_channels, 4 // groups, 3, 3))
    scaled = opf.op.multiply(x, opf.const(_randn(4, 1, 1)))
    before = _module([x], nn.conv2d(scaled, weight, groups=groups))
    after = FoldScaleAxis()(before)
    assert _ops(after) == ["nn.conv2d"]
    _check_numbers(before, after)


@pytest.mark.parametrize("groups,out_channels", [(2, 6), (4, 8), (4, 4)])
def test_forward_variable_scale_and_weight_in_grouped_convs(groups, out_channels):
    x, s = opf.var("x", shape=(1, 4, 7, 7)), opf.var("s", shape=(4, 1, 1))
    w = opf.var("w", shape=(out_channels, 4 // groups, 3, 3))
    before = _module([x, s, w], nn.conv2d(opf.op.multiply(x, s), w, groups=groups))
    after = FoldScaleAxis()(before)
    assert "nn.conv2d" in _ops(after)
    conv = after["main"].body
    assert conv.args[0] is after["main"].params[0]  # the conv reads x itself
    _check_numbers(before, after)


def test_a_run_time_scale_stays_on_the_value_when_the_weights_are_larger():
    # a squeeze-excitation gate on a 7x7 layer: scaling the 64x32 weight at every run would
    # cost more than scaling the 32x7x7 value
    x, gate = opf.var("x", shape=(1, 32, 7, 7)), opf.var("gate", shape=(1, 32, 1, 1))
    weight = opf.const(_randn(64, 32, 1, 1))
    before = _module([x, gate], nn.conv2d(opf.op.multiply(x, gate), weight))
    _unchanged(before)
    # the same gate on a 14x14 layer folds: 2048 weights against 6272 values
    x14 = opf.var("x", shape=(1, 32, 14, 14))
    before = _module([x14, gate], nn.conv2d(opf.op.multiply(x14, gate), weight))
    after = FoldScaleAxis()(before)
    assert after["main"].body.args[0] is after["main"].params[0]
    _check_numbers(before, after)


def test_a_run_time_scale_counts_the_weights_of_every_consumer():
    x, gate = opf.var("x", shape=(1, 8, 4, 4)), opf.var("gate", shape=(8, 1, 1))
    scaled = opf.op.multiply(x, gate)  # 128 values; 72 weights alone, 144 together
    convs = [nn.conv2d(scaled, opf.const(_randn(9, 8, 1, 1))) for _ in range(2)]
    _unchanged(_module([x, gate], opf.op.add(*convs)))
    after = FoldScaleAxis()(_module([x, gate], convs[0]))
    assert after["main"].body.args[0] is after["main"].params[0]


def test_forward_dense_input_scale():
    x = opf.var("x", shape=(3, 6))
    weight, scale = _randn(5, 6), _randn(6)
    before = _module([x], nn.dense(opf.op.multiply(x, opf.const(scale)), opf.const(weight)))
    after = FoldScaleAxis()(before)
    x2 = opf.var("x", shape=(3, 6))
    want = nn.dense(x2, opf.const(_times(weight, scale, (-1,))))
    assert_structural_equal(after, _module([x2], want))
    _check_numbers(before, after)


def test_forward_scale_read_by_two_convs_folds_into_both():
    x = opf.var("x", shape=(1, 3, 6, 6))
    scaled = opf.op.multiply(x, opf.const(_randn(3, 1, 1)))
    out = opf.op.add(nn.conv2d(scaled, opf.const(_randn(4, 3, 3, 3)), padding=1),
                     nn.conv2d(scaled, opf.const(_randn(4, 3, 1, 1))))
    before = _module([x], out)
    after = FoldScaleAxis()(before)
    assert _ops(after) == ["nn.conv2d", "nn.conv2d", "add"]
    _check_numbers(before, after)


def test_forward_scale_with_a_consumer_that_cannot_take_it_does_not_fold():
    x = opf.var("x", shape=(1, 3, 6, 6))
    scaled = opf.op.multiply(x, opf.const(_randn(3, 1, 1)))
    conv = nn.conv2d(scaled, opf.const(_randn(4, 3, 3, 3)))
    _unchanged(_module([x], opf.Tuple([conv, scaled])))
    _unchanged(_module([x], opf.Tuple([conv, opf.op.exp(scaled)])))


def test_forward_scale_on_the_wrong_axis_does_not_fold():
    x = opf.var("x", shape=(1, 3, 6, 3))
    scaled = opf.op.multiply(x, opf.const(_randn(3)))  # along W, which has 3 entries too
    _unchanged(_module([x], nn.conv2d(scaled, opf.const(_randn(4, 3, 3, 3)))))


# ---------------------------------------------------------------------------------------------
# the passes themselves


def test_passes_do_not_change_their_input():
    x = opf.var("x", shape=(1, 3, 6, 6))
    weight = opf.const(_randn(4, 3, 3, 3))
    inner = opf.op.multiply(x, opf.const(_randn(3, 1, 1)))
    before = _module([x], opf.op.multiply(nn.conv2d(inner, weight), opf.const(_randn(4, 1, 1))))
    text, func = before.astext(), before["main"]
    for make in (FoldScaleAxis, BackwardFoldScaleAxis, ForwardFoldScaleAxis):
        after = make()(before)
        assert after is not before and after["main"] is not func
        assert before["main"] is func and before.astext() == text
    assert _ops(FoldScaleAxis()(before)) == ["nn.conv2d"]


def test_pass_infos_and_registration():
    for make, name in ((FoldScaleAxis, "FoldScaleAxis"),
                       (BackwardFoldScaleAxis, "BackwardFoldScaleAxis"),
                       (ForwardFoldScaleAxis, "ForwardFoldScaleAxis")):
        assert (make().info.name, make().info.opt_level) == (name, 3)
        assert get_pass(name).info.name == name


def test_a_sequential_runs_fold_scale_axis_only_at_opt_level_3():
    x = opf.var("x", shape=(1, 3, 6, 6))
    conv = nn.conv2d(x, opf.const(_randn(4, 3, 3, 3)))
    before = _module([x], opf.op.multiply(conv, opf.const(_randn(4, 1, 1))))
    with PassContext(opt_level=2):
        assert "multiply" in _ops(Sequential([FoldScaleAxis()])(before))
    with PassContext(opt_level=3):
        assert "multiply" not in _ops(Sequential([FoldScaleAxis()])(before))


def test_fold_scale_axis_on_a_function_and_unchanged_functions_are_kept():
    x = opf.var("x", shape=(2, 3))
    func = opf.Function([x], opf.op.nn.relu(x))
    assert fold_scale_axis(func) is func


def test_every_global_function_is_folded():
    x = opf.var("x", shape=(2, 6))
    helper_x = opf.var("h", shape=(2, 6))
    weight = opf.const(_randn(4, 6))
    helper = opf.Function([helper_x], opf.op.multiply(nn.dense(helper_x, weight),
                                                      opf.const(_randn(4))))
    mod = opf.IRModule({"helper": helper})
    main = opf.Function([x], opf.op.nn.relu(Call(mod.get_global_var("helper"), [x])))
    mod = mod.with_function("main", main)
    after = FoldScaleAxis()(mod)
    assert "multiply" not in _ops(after)
    _check_numbers(mod, after)


def test_a_deep_chain_does_not_recurse():
    x = opf.var("x", shape=(2, 4))
    weight, scale = opf.const(_randn(4, 4)), opf.const(_positive(4))
    out = x
    for _ in range(2000):
        out = opf.op.multiply(nn.relu(nn.dense(out, weight)), scale)
    after = FoldScaleAxis()(_module([x], out))
    ops = _ops(after)
    assert "multiply" not in ops and ops.count("nn.dense") == 2000
    weights = [n for n in post_order(after["main"]) if isinstance(n, Constant)]
    assert len(weights) == 2000  # every layer got its own folded weight


# ---------------------------------------------------------------------------------------------
# random graphs: whatever folds, the numbers stay


def _random_graph(seed):
    """A small random NCHW graph of convolutions, per-channel (and not per-channel) scales,
    biases, relus and residual adds; some values are read twice, some returned."""
    gen = np.random.default_rng(seed)
    x = opf.var("x", shape=(1, 4, 5, 5))
    values = [x]

    def channels(value):
        return value.checked_type.shape[1]

    def pick():
        return values[int(gen.integers(len(values)))]

    def const(*shape, positive=False, factor=1.0):
        data = gen.standard_normal(shape).astype(f32) * f32(factor)
        return opf.const(np.abs(data) + f32(0.1) if positive else data)

    for _ in range(int(gen.integers(4, 12))):
        value = values[-1] if gen.random() < 0.7 else pick()
        c = channels(value)
        kind = gen.choice(["conv", "conv", "scale", "scale", "relu", "bias", "add", "bn"])
        if kind == "conv":
            groups = int(gen.choice([g for g in (1, 2, 4) if c % g == 0]))
            out_c = groups * int(gen.integers(1, 3))
            kernel = int(gen.choice([1, 3]))
            weight = const(out_c, c // groups, kernel, kernel, factor=0.5)
            value = nn.conv2d(value, weight, groups=groups, padding=kernel // 2)
        elif kind == "scale":
            shape = [(c, 1, 1), (1, c, 1, 1), (1, 1, 1), (), (5,), (c, 5, 1)][
                int(gen.integers(6))]
            scale = const(*shape, positive=bool(gen.integers(2)))
            value = opf.op.multiply(scale, value) if gen.integers(2) else \
                opf.op.multiply(value, scale)
        elif kind == "relu":
            value = nn.relu(value)
        elif kind == "bias":
            value = nn.bias_add(value, const(c)) if gen.integers(2) else \
                opf.op.add(value, const(c, 1, 1))
        elif kind == "add":
            same = [v for v in values if v.checked_type == value.checked_type]
            value = opf.op.add(value, same[int(gen.integers(len(same)))])
        else:
            value = _bn(value, c)
        values.append(value)
    outputs = [values[-1]] + ([pick()] if gen.integers(2) else [])
    body = outputs[0] if len(outputs) == 1 else opf.Tuple(outputs)
    return _module([x], body)


@pytest.mark.parametrize("seed", range(40))
def test_random_graphs_keep_their_numbers(seed):
    before = SimplifyInference()(_random_graph(seed))
    for make in (FoldScaleAxis, BackwardFoldScaleAxis, ForwardFoldScaleAxis):
        _check_numbers(before, make()(before))
    _check_numbers(before, FoldConstant()(FoldScaleAxis()(FoldConstant()(before))))
