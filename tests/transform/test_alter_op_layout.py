"""AlterOpLayout: convolutions and the operators between them in NCHW<x>c, transforms only at
the boundaries, weights folded into blocked constants, and the same numbers as the reference
interpreter (opf.compile runs the pass; every model here is checked end to end)."""

import numpy as np
import pytest

import opfusion as opf
from opfusion.compiler.compile import alter_layout
from opfusion.ir.evaluate import evaluate
from opfusion.ir.expr import Call, Constant, Function, Tuple
from opfusion.ir.module import IRModule
from opfusion.ir.visitor import post_order
from opfusion.target import Target
from opfusion.testing import assert_close, workloads
from opfusion.testing.workloads import workload_input
from opfusion.transform.alter_op_layout import WINOGRAD

nn = opf.op.nn
AVX512 = Target("c -mattr=+avx512f,+avx512dq,+avx512bw,+avx512vl,+avx2,+fma")
AVX2 = Target("c -mattr=+avx2,+fma")


def normal(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def laid_out(expr, target=AVX512, winograd="never", disabled=()):
    """``@main`` of ``expr`` (free variables as parameters) after the layout pass and
    FoldConstant, as opf.compile runs them (direct convolutions unless ``winograd`` says;
    without the passes ``disabled`` names)."""
    params = [n for n in post_order(expr) if isinstance(n, opf.ir.Var)]
    mod = opf.transform.InferType()(IRModule.from_expr(Function(params, expr)))
    with opf.transform.PassContext(opt_level=3, config={WINOGRAD: winograd},
                                   disabled_pass=disabled):
        return alter_layout(mod, target)["main"]


def calls(func, name):
    return [n for n in post_order(func.body) if isinstance(n, Call) and n.op_name == name]


def conv_bn_relu(x, in_channels, out_channels, seed, kernel=3, **attrs):
    w = opf.const(normal(out_channels, in_channels, kernel, kernel, seed=seed) * 0.2)
    b = opf.const(normal(out_channels, 1, 1, seed=seed + 100))
    return nn.relu(opf.op.add(nn.conv2d(x, w, padding=kernel // 2, **attrs), b))


def block(channels=32, size=12):
    x = opf.var("x", shape=(1, channels, size, size))
    y = conv_bn_relu(x, channels, channels, 1)
    y = conv_bn_relu(y, channels, channels, 2)
    return x, nn.relu(opf.op.add(y, x))


def test_a_residual_block_runs_blocked_between_two_transforms():
    _, out = block()
    func = laid_out(out)
    transforms = calls(func, "layout_transform")
    assert [(t.attrs.src_layout, t.attrs.dst_layout) for t in transforms] == [
        ("NCHW", "NCHW16c"), ("NCHW16c", "NCHW")]
    convs = calls(func, "nn.conv2d_nchwc")
    assert len(convs) == 2 and not calls(func, "nn.conv2d")
    for c in convs:  # weights packed at compile time: constants in OIHW16i16o
        assert isinstance(c.args[1], Constant) and c.args[1].data.shape == (2, 2, 3, 3, 16, 16)
    # The residual add reads the blocked input: the one transform of x is shared.
    add = calls(func, "add")[-1]
    assert add.checked_type.shape == (1, 2, 12, 12, 16)


def test_the_block_is_the_target_vector():
    _, out = block()
    assert calls(laid_out(out, AVX2), "nn.conv2d_nchwc")[0].attrs.out_layout == "NCHW8c"


@pytest.mark.parametrize("target", [AVX512, AVX2], ids=["avx512", "avx2"])
def test_a_residual_block_computes_the_reference(target):
    x, out = block(24, 9)
    mod = IRModule.from_expr(Function([x], out))
    value = normal(1, 24, 9, 9, seed=5)
    want = evaluate(mod, [value])
    exe = opf.compile(mod, target=target) if target.missing_on_host() == [] else None
    if exe is None:
        pytest.skip(f"{target} does not run here")
    assert_close(exe(value), want, 1e-5)


def classifier(channels=1000, size=13):
    """SqueezeNet's last convolution: 1x1, 1000 channels, bias, relu, global pooling."""
    x = opf.var("x", shape=(1, 128, size, size))
    y = conv_bn_relu(x, 128, channels, 3, kernel=1)
    return x, nn.global_avg_pool2d(y)


#: (PadChannelBlocks would round these classifiers' channels up to whole vectors instead: the
#: split is for values read at many pixels unpadded)
UNPADDED = ("PadChannelBlocks",)


def test_channels_no_vector_divides_run_whole_vectors_apart_from_the_rest():
    _, out = classifier()
    func = laid_out(out, disabled=UNPADDED)
    convs = calls(func, "nn.conv2d_nchwc")
    # 62 vectors of 16 channels in NCHW16c, the 8 left in NCHW8c, concatenated in 8c blocks
    assert [(c.attrs.channels, c.attrs.out_layout) for c in convs] == [
        (992, "NCHW16c"), (8, "NCHW8c")]
    (concat,) = calls(func, "concatenate")
    first, second = concat.args[0].fields
    assert first.op_name == "layout_transform" and first.args[0] is convs[0]
    assert (first.attrs.src_layout, first.attrs.dst_layout) == ("NCHW16c", "NCHW8c")
    assert second is convs[1]
    # on AVX2 1000 channels are 125 whole vectors: one convolution
    assert len(calls(laid_out(out, AVX2, disabled=UNPADDED), "nn.conv2d_nchwc")) == 1


@pytest.mark.parametrize("channels", [1000, 100, 72])
def test_convolutions_split_by_vectors_compute_the_reference(channels):
    # 100: 6 vectors and a block of 4; 72: 4 vectors and 8 (the fewest that split)
    x, out = classifier(channels)
    mod = IRModule.from_expr(Function([x], out))
    value = normal(1, 128, 13, 13, seed=6)
    func = laid_out(out, disabled=UNPADDED)
    assert len(calls(func, "nn.conv2d_nchwc")) == 2
    assert_close(evaluate(IRModule.from_expr(func), [value]), evaluate(mod, [value]), 1e-5)
    if AVX512.missing_on_host() == []:
        with opf.transform.PassContext(opt_level=3, disabled_pass=UNPADDED):
            exe = opf.compile(mod, target=AVX512)
        assert_close(exe(value), evaluate(mod, [value]), 1e-5)


def test_grouped_small_and_unblockable_convolutions_stay_nchw():
    x = opf.var("x", shape=(1, 16, 64, 64))
    grouped = nn.conv2d(x, opf.const(normal(16, 2, 3, 3)), groups=8, padding=1)  # 2 a group
    odd = nn.conv2d(x, opf.const(normal(6, 16, 3, 3)), padding=1)  # 6: no block of 4 or more
    small = nn.conv2d(x, opf.const(normal(8, 16, 1, 1)))  # 524k multiply-adds
    func = laid_out(opf.op.concatenate([grouped, odd, small], axis=1))
    assert len(calls(func, "nn.conv2d")) == 3
    assert not calls(func, "nn.conv2d_nchwc") and not calls(func, "layout_transform")


def test_grouped_and_depthwise_convolutions_run_blocked():
    x = opf.var("x", shape=(1, 48, 28, 28))
    y = nn.relu(nn.conv2d(x, opf.const(normal(96, 16, 1, 1) * .3), groups=3))
    y = nn.conv2d(y, opf.const(normal(96, 1, 3, 3) * .3), groups=96, padding=1, strides=2)
    y = nn.conv2d(y, opf.const(normal(32, 96, 1, 1) * .3))
    func = laid_out(y)
    convs = calls(func, "nn.conv2d_nchwc")
    assert [(c.attrs.kernel_layout, c.attrs.groups) for c in convs] == [
        ("OIHW16i16o", 3), ("OIHW1i16o", 96), ("OIHW16i16o", 1)]
    assert len(calls(func, "layout_transform")) == 2
    mod = IRModule.from_expr(Function([x], y))
    value = normal(1, 48, 28, 28, seed=4)
    assert_close(opf.compile(mod)(value), evaluate(mod, [value]), 1e-5)


def test_a_few_groups_no_block_divides_sum_their_own_channels():
    x = opf.var("x", shape=(1, 136, 28, 28))
    y = nn.relu(nn.conv2d(x, opf.const(normal(136, 136, 1, 1) * .2)))
    y = nn.conv2d(y, opf.const(normal(136, 34, 1, 1) * .2), groups=4)  # 34 a group
    func = laid_out(y)
    convs = calls(func, "nn.conv2d_nchwc")
    # (the dense one's 136 channels: 8 vectors of 16 and a block of 8)
    assert [(c.attrs.groups, c.attrs.group_window, c.attrs.kernel_layout) for c in convs] == [
        (1, False, "OIHW8i16o"), (1, False, "OIHW8i8o"), (4, True, "OIHW34i8o")]
    # each group's 34 input channels into the 5 output blocks its 34 outputs touch; group 1's
    # first block (channels 32-39) holds group 0's last two outputs, zero in its weight
    local = convs[2].args[1].data
    assert local.shape == (4, 5, 1, 1, 34, 8) and not local[1, 0, :, :, :, :2].any()
    assert local[1, 0, :, :, :, 2:].all() and local[0, 4, :, :, :, :2].all()
    mod = IRModule.from_expr(Function([x], y))
    value = normal(1, 136, 28, 28, seed=8)
    assert_close(opf.compile(mod)(value), evaluate(mod, [value]), 1e-5)


def test_groups_that_touch_every_output_block_run_as_one_dense_convolution():
    x = opf.var("x", shape=(1, 24, 56, 56))
    y = nn.conv2d(x, opf.const(normal(8, 6, 3, 3) * .3), groups=4, padding=1)  # 6 in, 2 out
    (conv,) = calls(laid_out(y), "nn.conv2d_nchwc")
    assert (conv.attrs.groups, conv.attrs.group_window) == (1, False)
    dense = conv.args[1].data  # block diagonal: group 0's outputs read its inputs only
    assert dense.shape == (1, 3, 3, 3, 8, 8) and not dense[0, 0, :, :, 6:, :2].any()
    mod = IRModule.from_expr(Function([x], y))
    value = normal(1, 24, 56, 56, seed=9)
    assert_close(opf.compile(mod)(value), evaluate(mod, [value]), 1e-5)


def test_an_rgb_input_is_blocked_by_its_three_channels():
    x = opf.var("x", shape=(1, 3, 64, 64))
    out = nn.conv2d(x, opf.const(normal(16, 3, 7, 7)), strides=2, padding=3)
    (c,) = calls(laid_out(out), "nn.conv2d_nchwc")
    assert c.attrs.data_layout == "NCHW3c" and c.attrs.kernel_layout == "OIHW3i16o"


def test_bias_add_scale_and_clip_stay_blocked():
    x = opf.var("x", shape=(1, 16, 16, 16))
    y = nn.conv2d(x, opf.const(normal(32, 16, 3, 3)), padding=1)
    y = nn.bias_add(y, opf.const(normal(32)))
    y = opf.op.multiply(y, opf.const(normal(32, 1, 1, seed=2)))
    y = opf.op.clip(opf.op.add(y, opf.const(np.float32(0.5))), a_min=0.0, a_max=6.0)
    func = laid_out(y)
    assert len(calls(func, "layout_transform")) == 2  # in and out; the vectors are folded
    mod = IRModule.from_expr(Function([x], y))
    value = normal(1, 16, 16, 16, seed=3)
    assert_close(opf.compile(mod)(value), evaluate(mod, [value]), 1e-5)


def test_concatenation_of_whole_blocks_stays_blocked():
    x = opf.var("x", shape=(1, 16, 32, 32))
    y = nn.conv2d(x, opf.const(normal(16, 16, 3, 3)), padding=1)
    a = nn.conv2d(y, opf.const(normal(16, 16, 1, 1)))
    b = nn.conv2d(y, opf.const(normal(32, 16, 3, 3)), padding=1)
    out = nn.conv2d(opf.op.concatenate([a, b], axis=1), opf.const(normal(16, 48, 1, 1)))
    func = laid_out(out)
    assert [c.checked_type.shape for c in calls(func, "concatenate")] == [(1, 3, 32, 32, 16)]
    assert len(calls(func, "layout_transform")) == 2


def test_a_value_used_in_both_layouts_is_transformed_once():
    x = opf.var("x", shape=(1, 16, 32, 32))
    y = nn.conv2d(x, opf.const(normal(16, 16, 3, 3)), padding=1)
    out = Tuple([nn.relu(y), nn.softmax(y, axis=1), nn.softmax(y, axis=2)])
    transforms = calls(laid_out(out), "layout_transform")
    # x in; y out once for both softmaxes; relu(y) out.
    assert len(transforms) == 3
    assert len({t.args[0] for t in transforms}) == 3


def test_a_channel_shuffle_of_a_blocked_tensor_is_one_blocked_permutation():
    x = opf.var("x", shape=(1, 48, 28, 28))
    y = nn.relu(nn.conv2d(x, opf.const(normal(48, 48, 1, 1) * .2)))
    y = opf.op.reshape(opf.op.transpose(opf.op.reshape(y, newshape=(1, 3, 16, 28, 28)),
                                        axes=(0, 2, 1, 3, 4)), newshape=(1, 48, 28, 28))
    y = nn.conv2d(y, opf.const(normal(32, 48, 3, 3) * .2), padding=1)
    func = laid_out(y)
    (shuffle,) = calls(func, "channel_shuffle")
    assert shuffle.attrs.groups == 3 and shuffle.attrs.layout == "NCHW16c"
    assert len(calls(func, "layout_transform")) == 2
    mod = IRModule.from_expr(Function([x], y))
    value = normal(1, 48, 28, 28, seed=6)
    assert_close(opf.compile(mod)(value), evaluate(mod, [value]), 1e-5)


def test_a_shufflenet_v2_unit_stays_blocked_through_its_split():
    # shuffle, split in two halves of whole blocks, one half through a convolution and the
    # other concatenated back: blocked from the first convolution to the last
    x = opf.var("x", shape=(1, 64, 28, 28))
    y = nn.relu(nn.conv2d(x, opf.const(normal(64, 64, 1, 1) * .2)))
    y = opf.op.reshape(opf.op.transpose(opf.op.reshape(y, newshape=(1, 2, 32, 28, 28)),
                                        axes=(0, 2, 1, 3, 4)), newshape=(1, 64, 28, 28))
    halves = opf.op.split(y, indices_or_sections=2, axis=1)
    left, right = (opf.ir.TupleGetItem(halves, i) for i in range(2))
    right = nn.relu(nn.conv2d(right, opf.const(normal(32, 32, 1, 1, seed=1) * .2)))
    y = nn.conv2d(opf.op.concatenate([left, right], axis=1),
                  opf.const(normal(16, 64, 1, 1, seed=2) * .2))
    func = laid_out(y)
    slices = calls(func, "strided_slice")
    assert [(tuple(s.attrs.begin), tuple(s.attrs.end)) for s in slices] == [((0,), (2,)),
                                                                            ((2,), (4,))]
    assert not calls(func, "split") and len(calls(func, "layout_transform")) == 2
    mod = IRModule.from_expr(Function([x], y))
    value = normal(1, 64, 28, 28, seed=6)
    assert_close(opf.compile(mod)(value), evaluate(mod, [value]), 1e-5)
    # a split that cuts a block keeps NCHW parts
    parts = opf.op.split(nn.relu(nn.conv2d(x, opf.const(normal(64, 64, 1, 1)))),
                         indices_or_sections=[24], axis=1)
    func = laid_out(opf.op.concatenate([opf.ir.TupleGetItem(parts, i) for i in (1, 0)],
                                       axis=1))
    assert calls(func, "split") and not calls(func, "strided_slice")


def test_mixed_operands_stay_nchw_unless_a_blocked_convolution_wants_the_result():
    x = opf.var("x", shape=(1, 32, 28, 28))
    blocked = nn.conv2d(x, opf.const(normal(32, 32, 3, 3) * .1), padding=1)
    plain = nn.conv2d(x, opf.const(normal(32, 4, 3, 3) * .1), padding=1, groups=8)
    mixed = opf.op.add(blocked, plain)
    # Only NCHW consumers: the add runs in NCHW, with one transform of the blocked operand.
    func = laid_out(nn.conv2d(mixed, opf.const(normal(32, 4, 1, 1)), groups=8))
    assert [a.checked_type.ndim for a in calls(func, "add")] == [4]
    # A blocked convolution reads it: the add runs blocked.
    func = laid_out(nn.conv2d(mixed, opf.const(normal(32, 32, 3, 3)), padding=1))
    assert [a.checked_type.ndim for a in calls(func, "add")] == [5]


def test_3x3_convolutions_with_enough_channels_run_winograd_f2_by_default():
    _, out = block()
    func = laid_out(out, winograd="auto")
    convs = calls(func, "nn.conv2d_winograd_nchwc")
    assert [c.attrs.tile_size for c in convs] == [2, 2] and not calls(func, "nn.conv2d_nchwc")
    for c in convs:  # the weight transformed at compile time
        assert isinstance(c.args[1], Constant) and c.args[1].data.shape == (4, 4, 2, 2, 16, 16)
    assert [c.attrs.tile_size for c in calls(laid_out(out, winograd="f4"),
                                             "nn.conv2d_winograd_nchwc")] == [4, 4]


def test_a_grouped_convolution_reblocks_data_whose_blocks_straddle_its_groups():
    # RegNetX's 7 x 7 layers: 16-channel blocks from the 1x1 before, groups of 24 channels;
    # the input is re-blocked by 8 rather than the convolution run in NCHW
    x = opf.var("x", shape=(1, 48, 28, 28))
    y = conv_bn_relu(conv_bn_relu(x, 48, 48, 1, kernel=1), 24, 48, 2, groups=2)
    func = laid_out(y, AVX512)
    (grouped,) = [c for c in calls(func, "nn.conv2d_nchwc") if c.attrs.groups == 2]
    assert not calls(func, "nn.conv2d") and grouped.attrs.data_layout == "NCHW8c"
    mod = IRModule.from_expr(Function([x], y))
    value = normal(1, 48, 28, 28, seed=7)
    with AVX512 if not AVX512.missing_on_host() else AVX2:
        exe = opf.compile(mod)
    assert_close(exe(value), evaluate(mod, [value]), 1e-5)


def test_grouped_convolutions_of_small_groups_stay_one_direct_kernel():
    # RegNet's groups of 16 channels at 14 x 14: 0.45 million multiply-adds a group, less
    # than a kernel of its own pays for (WINOGRAD_MIN_GROUP_MACS)
    x = opf.var("x", shape=(1, 48, 14, 14))
    func = laid_out(conv_bn_relu(x, 16, 48, 3, groups=3), AVX512, winograd="auto")
    assert not calls(func, "nn.conv2d_winograd_nchwc") and len(calls(func, "nn.conv2d_nchwc")) == 1


@pytest.mark.parametrize("shape, weight, attrs", [
    ((1, 32, 3, 3), (32, 32, 3, 3), {"padding": 1}),  # a 3x3 output: too small
    ((1, 8, 32, 32), (32, 8, 3, 3), {"padding": 1}),  # 8 input channels
    ((1, 32, 32, 32), (32, 32, 3, 3), {"padding": 1, "strides": 2}),
    ((1, 32, 32, 32), (32, 32, 3, 3), {"padding": 2, "dilation": 2}),
    ((1, 32, 32, 32), (32, 32, 5, 5), {"padding": 2}),
])
def test_winograd_is_only_for_3x3_stride_1_with_enough_channels(shape, weight, attrs):
    x = opf.var("x", shape=shape)
    y = nn.conv2d(nn.relu(nn.conv2d(x, opf.const(normal(shape[1], shape[1], 1, 1)))),
                  opf.const(normal(*weight)), **attrs)
    assert not calls(laid_out(y, winograd="auto"), "nn.conv2d_winograd_nchwc")


@pytest.mark.parametrize("winograd", ["f2", "f4"])
def test_grouped_3x3_convolutions_of_whole_blocks_run_winograd_per_group(winograd):
    # AlexNet's conv4: 2 groups (here of 32 channels) at 13 x 13
    x = opf.var("x", shape=(1, 64, 13, 13))
    y = conv_bn_relu(x, 32, 96, 3, groups=2)
    func = laid_out(y, AVX2, winograd=winograd)
    convs = calls(func, "nn.conv2d_winograd_nchwc")
    assert not calls(func, "nn.conv2d_nchwc") and len(convs) == 2
    assert [c.attrs.channels for c in convs] == [48, 48]
    assert [(s.attrs.begin, s.attrs.end) for s in calls(func, "strided_slice")] == [
        ((0,), (4,)), ((4,), (8,))]  # each group's 4 input blocks of 8
    assert len(calls(func, "concatenate")) == 1
    assert not calls(laid_out(y, AVX2, winograd="never"), "nn.conv2d_winograd_nchwc")
    mod = IRModule.from_expr(Function([x], y))
    value = normal(1, 64, 13, 13, seed=6)
    with AVX2, opf.transform.PassContext(opt_level=3, config={WINOGRAD: winograd}):
        exe = opf.compile(mod)
    assert_close(exe(value), evaluate(mod, [value]), 4e-5)


def test_grouped_convolutions_whose_groups_split_blocks_stay_direct():
    x = opf.var("x", shape=(1, 48, 32, 32))  # 3 groups of 16: blocks of 16 with AVX-512
    y = conv_bn_relu(x, 16, 48, 3, groups=3)
    assert calls(laid_out(y, AVX512, winograd="auto"), "nn.conv2d_winograd_nchwc")
    y = conv_bn_relu(x, 12, 48, 3, groups=4)  # 12 a group: no whole blocks of 8 or 16
    func = laid_out(y, AVX512, winograd="auto")
    assert not calls(func, "nn.conv2d_winograd_nchwc")


@pytest.mark.parametrize("winograd", ["f2", "f4"])
def test_a_winograd_block_computes_the_reference(winograd):
    x, out = block(32, 14)
    mod = IRModule.from_expr(Function([x], out))
    value = normal(1, 32, 14, 14, seed=5)
    with opf.transform.PassContext(opt_level=3, config={WINOGRAD: winograd}):
        exe = opf.compile(mod)
    assert "winograd" in exe.source()
    assert_close(exe(value), evaluate(mod, [value]), 4e-5)


def test_the_pass_is_switched_off_from_the_pass_context():
    x, out = block()
    mod = IRModule.from_expr(Function([x], out))
    with opf.transform.PassContext(opt_level=3, disabled_pass=["AlterOpLayout"]):
        func = alter_layout(opf.transform.InferType()(mod), AVX512)["main"]
        exe = opf.compile(mod)
    assert not calls(func, "nn.conv2d_nchwc")
    assert "conv2d_nchwc" not in exe.source()
    with opf.transform.PassContext(opt_level=2):
        assert not calls(alter_layout(opf.transform.InferType()(mod), AVX512)["main"],
                         "nn.conv2d_nchwc")


def test_printing_shows_the_layouts():
    _, out = block()
    text = str(IRModule.from_expr(laid_out(out)))
    assert 'layout_transform(%x, src_layout="NCHW", dst_layout="NCHW16c")' in text
    assert 'nn.conv2d_nchwc(' in text and 'out_layout="NCHW16c"' in text


@pytest.mark.parametrize("name, build", [
    ("resnet18", lambda: workloads.resnet(num_layers=18, image_shape=(3, 64, 64))),
    ("squeezenet", lambda: workloads.squeezenet(image_shape=(3, 64, 64))),
    ("mobilenet_v2", lambda: workloads.mobilenet_v2(image_shape=(3, 128, 128))),
    ("shufflenet_v2", lambda: workloads.shufflenet_v2(image_shape=(3, 64, 64))),
])
def test_workloads_compile_blocked_to_the_reference(name, build):
    mod, params = build()
    inputs = workload_input(mod, params)
    want = evaluate(mod, {**inputs, **params})
    exe = opf.compile(mod, params=params)
    assert "conv2d_nchwc" in exe.source()
    assert_close(exe.run(inputs)[0], np.asarray(want), 1e-4)
