"""PadChannelBlocks: which regions get whole vectors of channels, what they read and give back,
and the same numbers as the reference interpreter before and after the pass (and compiled)."""

import numpy as np
import pytest

import opfusion as opf
from opfusion.ir.evaluate import evaluate
from opfusion.ir.expr import Call, Constant, Function
from opfusion.ir.module import IRModule
from opfusion.ir.visitor import post_order
from opfusion.target import Target
from opfusion.testing import assert_close
from opfusion.transform.pad_channel_blocks import PadChannelBlocks, padded_count

nn = opf.op.nn
AVX512 = Target("c -mattr=+avx512f,+avx512dq,+avx512bw,+avx512vl,+avx2,+fma")
AVX2 = Target("c -mattr=+avx2,+fma")


def normal(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype("float32")


def module(x, out):
    return opf.transform.InferType()(IRModule.from_expr(Function([x], out)))


def padded(mod, target=AVX512, **context):
    with opf.transform.PassContext(opt_level=3, **context):
        return opf.transform.InferType()(PadChannelBlocks(target)(mod))


def calls(mod, name):
    return [n for n in post_order(mod["main"].body)
            if isinstance(n, Call) and n.op_name == name]


def conv(x, cin, cout, seed, kernel=1, groups=1, **attrs):
    w = opf.const(normal(cout, cin // groups, kernel, kernel, seed=seed, scale=0.3))
    b = opf.const(normal(1, cout, 1, 1, seed=seed + 50))
    return opf.op.add(nn.conv2d(x, w, padding=kernel // 2, groups=groups, **attrs), b)


def inverted_residual(channels=72, size=10, squeeze=False):
    """MobileNet v3's block: expand 16 -> channels, depthwise 3x3, (squeeze-excitation,)
    project back to 16, add the input."""
    x = opf.var("x", shape=(1, 16, size, size))
    y = nn.relu(conv(x, 16, channels, 1))
    y = nn.relu(conv(y, channels, channels, 2, kernel=3, groups=channels))
    if squeeze:
        s = nn.relu(conv(nn.global_avg_pool2d(y), channels, 24, 3))
        gate = opf.op.clip(opf.op.add(opf.op.multiply(conv(s, 24, channels, 4),
                                                      opf.const(np.float32(1 / 6))),
                                      opf.const(np.float32(0.5))), a_min=0.0, a_max=1.0)
        y = opf.op.multiply(y, gate)
    return x, opf.op.add(conv(y, channels, 16, 5), x)


def same_numbers(before, after, shape, seed=7):
    value = normal(*shape, seed=seed)
    assert_close(evaluate(after, [value]), evaluate(before, [value]), 1e-6)


def test_padded_count_rounds_up_to_whole_vectors_within_a_third_more():
    assert padded_count(72, 16) == 80
    assert padded_count(24, 16) == 32  # exactly a third more
    assert padded_count(1000, 16) == 1008
    assert padded_count(8, 16) == 8  # twice: no
    assert padded_count(20, 16) == 20
    assert padded_count(64, 16) == 64
    assert padded_count(58, 8) == 64


def test_an_inverted_residual_block_runs_in_whole_vectors():
    x, out = inverted_residual()
    mod = module(x, out)
    new = padded(mod)
    expand, depthwise, project = calls(new, "nn.conv2d")
    assert expand.args[1].data.shape == (80, 16, 1, 1)
    assert depthwise.attrs.groups == 80 and depthwise.args[1].data.shape == (80, 1, 3, 3)
    assert project.args[1].data.shape == (16, 80, 1, 1)  # zero weights on the added inputs
    assert not np.any(expand.args[1].data[72:]) and not np.any(project.args[1].data[:, 72:])
    assert not calls(new, "strided_slice")  # nothing reads the padded values unpadded
    assert new["main"].checked_type == mod["main"].checked_type
    same_numbers(mod, new, (1, 16, 10, 10))


def test_squeeze_excitation_gates_are_padded_with_their_block():
    x, out = inverted_residual(squeeze=True)
    mod = module(x, out)
    new = padded(mod)
    assert [c.checked_type.shape[1] for c in calls(new, "nn.conv2d")] == [80, 80, 24, 80, 16]
    assert calls(new, "clip")[0].checked_type.shape == (1, 80, 1, 1)
    same_numbers(mod, new, (1, 16, 10, 10))


def test_a_concatenation_crops_the_padded_channels_as_it_copies():
    """ShuffleNet v2's branches end in a concatenation, which copies its parts anyway: the
    crop of a padded part is a slice that fuses into it."""
    x = opf.var("x", shape=(1, 16, 10, 10))
    y = nn.relu(conv(nn.relu(conv(x, 16, 58, 1)), 58, 58, 2, kernel=3, groups=58))
    mod = module(x, opf.op.concatenate([y, x], axis=1))
    new = padded(mod)
    (crop,) = calls(new, "strided_slice")
    assert crop.args[0].checked_type.shape == (1, 64, 10, 10)
    assert new["main"].checked_type == mod["main"].checked_type
    same_numbers(mod, new, (1, 16, 10, 10))


def test_a_large_value_read_unpadded_elsewhere_keeps_its_channels():
    """A crop for any other reader would cost a copy of its channels: no padding."""
    x = opf.var("x", shape=(1, 16, 10, 10))
    y = nn.relu(conv(nn.relu(conv(x, 16, 72, 1)), 72, 72, 2, kernel=3, groups=72))
    mod = module(x, opf.op.nn.softmax(y, axis=1))
    assert padded(mod)["main"] is mod["main"]


def test_channels_in_quarter_vectors_or_none_are_padded_without_a_depthwise_layer():
    """58 channels have no block of 4 or more (NCHW), 116 only blocks of 4 on AVX-512: both
    pay for the third more work of the convolutions that read them; 40 (blocks of 8) not."""
    x = opf.var("x", shape=(1, 16, 10, 10))
    for channels, want in ((58, 64), (116, 128), (40, 40)):
        mod = module(x, conv(nn.relu(conv(x, 16, channels, 1)), channels, 16, 2))
        first = calls(padded(mod), "nn.conv2d")[0]
        assert first.checked_type.shape[1] == want


def test_a_division_keeps_its_operands_unpadded():
    """x / y on an added channel would divide by zero, so divide is not in a region."""
    x = opf.var("x", shape=(1, 16, 10, 10))
    y = nn.relu(conv(nn.relu(conv(x, 16, 72, 1)), 72, 72, 2, kernel=3, groups=72))
    mod = module(x, conv(opf.op.divide(y, opf.op.add(y, opf.const(np.float32(2)))), 72, 16, 3))
    assert calls(padded(mod), "nn.conv2d")[0].checked_type.shape[1] == 72


def test_a_one_pixel_result_gets_its_channels_back():
    """SqueezeNet's classifier: 1000 channels, pooled to one pixel, then the result."""
    x = opf.var("x", shape=(1, 128, 6, 6))
    out = nn.global_avg_pool2d(nn.relu(conv(x, 128, 1000, 1)))
    mod = module(x, out)
    new = padded(mod)
    (crop,) = calls(new, "strided_slice")
    assert crop.args[0].checked_type.shape == (1, 1008, 1, 1)
    assert new["main"].checked_type == mod["main"].checked_type
    same_numbers(mod, new, (1, 128, 6, 6))


def test_a_weight_scaled_at_run_time_is_padded_by_a_pad():
    """FoldScaleAxis folds a squeeze-excitation gate into the next convolution's weight:
    a weight computed at run time gets its zero input channels from an nn.pad."""
    x = opf.var("x", shape=(1, 16, 10, 10))
    y = nn.relu(conv(nn.relu(conv(x, 16, 72, 1)), 72, 72, 2, kernel=3, groups=72))
    gate = opf.op.sigmoid(conv(nn.global_avg_pool2d(y), 72, 72, 3))
    weight = opf.op.multiply(opf.const(normal(16, 72, 1, 1, seed=4)),
                             opf.op.reshape(gate, newshape=[-1, 1, 1]))
    mod = module(x, nn.conv2d(y, weight))
    new = padded(mod)
    (pad,) = calls(new, "nn.pad")
    assert pad.checked_type.shape == (16, 80, 1, 1)
    same_numbers(mod, new, (1, 16, 10, 10))


def test_nothing_is_padded_where_no_vector_is_gained():
    # 40 channels between two convolutions, no depthwise one: the inputs' third more work
    # would cost what the outputs' whole vectors (16 + 16 + 8 lanes) save
    x = opf.var("x", shape=(1, 16, 10, 10))
    mod = module(x, conv(nn.relu(conv(x, 16, 40, 1)), 40, 16, 2))
    assert padded(mod)["main"] is mod["main"]
    # 72 channels in vectors of 8 are whole already
    x2, out = inverted_residual()
    mod2 = module(x2, out)
    assert padded(mod2, AVX2)["main"] is mod2["main"]


def test_without_alter_op_layout_nothing_is_padded():
    x, out = inverted_residual()
    mod = module(x, out)
    assert padded(mod, disabled_pass=["AlterOpLayout"])["main"] is mod["main"]
    with opf.transform.PassContext(opt_level=3, disabled_pass=["PadChannelBlocks"]):
        skipped = opf.transform.Sequential([PadChannelBlocks(AVX512)])(mod)
    assert skipped["main"] is mod["main"]


@pytest.mark.parametrize("target", [AVX512, AVX2], ids=["avx512", "avx2"])
@pytest.mark.parametrize("squeeze", [False, True], ids=["plain", "squeeze"])
def test_compiled_blocks_compute_the_reference(target, squeeze):
    if target.missing_on_host():
        pytest.skip(f"{target} does not run here")
    x, out = inverted_residual(72 if target is AVX512 else 58, squeeze=squeeze)
    mod = module(x, out)
    value = normal(1, 16, 10, 10, seed=3)
    exe = opf.compile(mod, target=target)
    assert_close(exe(value), evaluate(mod, [value]), 1e-5)


def test_added_channels_of_a_gate_stay_finite():
    """sigmoid and clip give the added channels of a gate 0.5; the values they multiply
    are zero there, and the next convolution's weights are zero on them."""
    x, out = inverted_residual(squeeze=True)
    new = padded(module(x, out))
    gate = calls(new, "clip")[0]
    body = Function(new["main"].params, gate)
    value = evaluate(IRModule.from_expr(body), [normal(1, 16, 10, 10, seed=2)])
    assert np.all(np.isfinite(value)) and np.all(value[:, 72:] == 0.5)
    assert isinstance(calls(new, "nn.conv2d")[-1].args[1], Constant)


def test_a_batch_of_two_through_a_pool_computes_the_reference():
    x = opf.var("x", shape=(2, 16, 12, 12))
    y = nn.relu(conv(x, 16, 72, 1))
    y = nn.max_pool2d(y, pool_size=(3, 3), strides=(2, 2), padding=(1, 1, 1, 1))
    y = nn.relu(conv(y, 72, 72, 2, kernel=3, groups=72))
    mod = module(x, conv(y, 72, 24, 3))
    new = padded(mod)
    assert calls(new, "nn.max_pool2d")[0].checked_type.shape == (2, 80, 6, 6)
    same_numbers(mod, new, (2, 16, 12, 12))


def test_a_nan_in_the_input_gives_nan_where_the_reference_does():
    """The added channels of a NaN pixel are NaN (0 x NaN) and spread as the real ones do:
    the compiled model's NaNs are where the reference's are."""
    if AVX512.missing_on_host():
        pytest.skip("no AVX-512 here")
    x, out = inverted_residual(squeeze=False)
    mod = module(x, out)
    value = normal(1, 16, 10, 10, seed=4)
    value[0, 3, 4, 5] = np.nan
    want = evaluate(mod, [value])
    got = opf.compile(mod, target=AVX512)(value)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    assert_close(got[finite], want[finite], 1e-5)


def quantized_unit(channels=58, size=12, divisor=None):
    """ShuffleNet v2's unit as ONNX Runtime's QOperator format imports it: an int32 1x1
    convolution of bytes, requantized (multiply, round, add the zero point, clip, cast to
    bytes), then a depthwise and a 1x1 convolution of the bytes less their zero point, and
    a dequantize-quantize pair around the result (where(isnan), a division by the scale)."""
    x = opf.var("x", shape=(1, 24, size, size), dtype="uint8")

    def int_conv(data, cin, cout, seed, kernel=1, groups=1):
        rng = np.random.default_rng(seed)
        weight = opf.const(rng.integers(-127, 128, (cout, cin // groups, kernel, kernel))
                           .astype(np.int32))
        wide = opf.op.subtract(opf.op.cast(data, dtype="int32"), opf.const(np.int32(9)))
        acc = opf.op.add(nn.conv2d(wide, weight, padding=kernel // 2, groups=groups),
                         opf.const(rng.integers(-500, 500, (cout, 1, 1)).astype(np.int32)))
        scaled = opf.op.multiply(opf.op.cast(acc, dtype="float32"), opf.const(
            rng.uniform(1e-4, 1e-3, (1, cout, 1, 1)).astype(np.float32)))
        codes = opf.op.clip(opf.op.add(opf.op.round(scaled), opf.const(np.float32(9))),
                            a_min=0.0, a_max=255.0)
        return codes

    codes = int_conv(x, 24, channels, 1)
    codes = int_conv(opf.op.cast(codes, dtype="uint8"), channels, channels, 2, kernel=3,
                     groups=channels)
    codes = int_conv(opf.op.cast(codes, dtype="uint8"), channels, channels, 3)
    kept = opf.op.where(opf.op.isnan(codes), opf.const(np.float32(0)), codes)
    values = opf.op.multiply(opf.op.subtract(kept, opf.const(np.float32(9))),
                             opf.const(np.float32(0.05)))
    scale = opf.const(np.float32(0.07) if divisor is None else divisor)
    requantized = opf.op.clip(opf.op.round(opf.op.divide(values, scale)), a_min=0.0,
                              a_max=255.0)
    return x, int_conv(opf.op.cast(requantized, dtype="uint8"), channels, 32, 4)


def test_quantized_regions_are_padded_through_their_quantizing_steps():
    """Bytes, int32 sums and the (de)quantizing steps between int32 convolutions pad as
    floats do (58 -> 64 channels): the added channels hold the zero point and zero sums,
    which zero weights cancel; the codes are the same."""
    x, out = quantized_unit()
    mod = module(x, out)
    new = padded(mod)
    assert [c.checked_type.shape[1] for c in calls(new, "nn.conv2d")] == [64, 64, 64, 32]
    assert calls(new, "nn.conv2d")[1].attrs.groups == 64
    feed = np.random.default_rng(3).integers(0, 256, (1, 24, 12, 12)).astype(np.uint8)
    want = evaluate(mod, [feed])
    np.testing.assert_array_equal(evaluate(new, [feed]), want)
    with opf.transform.PassContext(opt_level=3):
        np.testing.assert_array_equal(opf.compile(mod)(feed), want)


def test_a_division_by_a_per_channel_scale_keeps_a_quantized_region_unpadded():
    """A per-channel divisor would be zero on an added channel: the region stays."""
    divisor = np.full((1, 58, 1, 1), 0.07, np.float32)
    x, out = quantized_unit(divisor=divisor)
    new = padded(module(x, out))
    assert calls(new, "nn.conv2d")[-1].args[1].checked_type.shape[1] == 58
