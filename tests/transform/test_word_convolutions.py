"""Quantized convolutions as products of words (opfusion.transform.word_convolutions): a blocked
convolution of dequantized codes by a weight that is an int8 tensor times a scale per output
channel becomes nn.conv2d_nchwc of the bytes with words=4 (dot4_u8s8: VNNI) or words=2
(dot2_s16: AVX2), less the zero point times the weight's sums, scaled per channel. The
convolution of words computes the exact int32 sums, in the reference and compiled; the
rewritten model gives the float model's numbers to within the float convolution's own
rounding."""

import numpy as np
import pytest
from int8_helpers import AVX2, AVX512, AVXVNNI, SSE, VNNI, module, random_codes, runs_here

import opfusion as opf
from opfusion.compiler.compile import alter_layout
from opfusion.errors import OpfusionTypeError
from opfusion.ir.evaluate import evaluate
from opfusion.ir.expr import Call, Constant
from opfusion.ir.op import get_op
from opfusion.ir.visitor import post_order
from opfusion.transform.fold_constant import BindParams
from opfusion.transform.word_convolutions import takes_words, word_weight

rng = np.random.default_rng(11)


def codes(shape, dtype):
    return random_codes(rng, shape, dtype)


def calls(mod, name):
    return [n for n in post_order(mod["main"].body) if isinstance(n, Call) and n.op.name == name]


def plain_convolution(x, weight, stride, pad, fill):
    """The int64 convolution of NCHW ``x`` (padded with ``fill``) by OIHW ``weight``."""
    padded = np.pad(x.astype(np.int64), [(0, 0), (0, 0), (pad, pad), (pad, pad)],
                    constant_values=fill)
    return get_op("nn.conv2d").reference(padded, weight.astype(np.int64), strides=(stride,) * 2,
                                         padding=(0, 0, 0, 0), dilation=(1, 1), groups=1)


def blocked(x, block):
    n, c, h, w = x.shape
    return np.ascontiguousarray(x.reshape(n, c // block, block, h, w).transpose(0, 1, 3, 4, 2))


def blocked_weight(weight, in_block, out_block):
    o, c, kh, kw = weight.shape
    return np.ascontiguousarray(weight.reshape(o // out_block, out_block, c // in_block, in_block,
                                               kh, kw).transpose(0, 2, 4, 5, 3, 1))


@pytest.mark.parametrize("per_word", [4, 2])
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("channels,outs,size,kernel,stride,pad,in_block", [
    (32, 32, (9, 11), 3, 1, 1, 16),    # 3x3, two input blocks, odd sizes
    (3, 16, (15, 15), 7, 2, 3, 3),     # a stem: one block of 3, a word part left over
    (16, 32, (8, 8), 1, 2, 0, 16),     # a strided 1x1 (its compact copy)
    (32, 16, (7, 7), 1, 1, 0, 16),     # a 1x1 over its pixels as one line
    (8, 16, (6, 5), 3, 1, 1, 8),       # blocks of 8 (AVX2's)
    (16, 16, (5, 5), 3, 2, 1, 16),     # strided 3x3
], ids=str)
def test_a_convolution_of_words_computes_the_int32_convolution(channels, outs, size, kernel,
                                                                stride, pad, in_block, dtype,
                                                                per_word):
    """The reference and the compiled kernel (dot4_u8s8 / dot2_s16 on the host, loops over the
    parts for SSE) against an int64 convolution of the values padded with the zero point."""
    x = codes((1, channels, *size), dtype)
    weight = codes((outs, channels, kernel, kernel), "int8")
    x.reshape(-1)[:5] = np.iinfo(dtype).max
    weight.reshape(-1)[:5] = -128  # the extremes, several times in one sum
    point = 200 if dtype == "uint8" else -100
    offset = 128 if dtype == "int8" else 0
    want = plain_convolution(x.astype(np.int64) + offset, weight, stride, pad, point + offset)
    want = blocked(want, 16)
    data = opf.var("x", shape=(1, channels // in_block, *size, in_block), dtype=dtype)
    words = word_weight(blocked_weight(weight, in_block, 16), per_word)
    packed = Call(get_op("nn.byte_words"), [data], {"per_word": per_word})
    conv = Call(get_op("nn.conv2d_nchwc"), [packed, Constant(words)], {
        "strides": [stride, stride], "padding": [pad] * 4, "data_layout": f"NCHW{in_block}c",
        "kernel_layout": f"OIHW{in_block}i16o", "out_layout": "NCHW16c", "words": per_word,
        "pad_value": point + offset, "out_dtype": "int32"})
    mod = module(conv)
    assert mod["main"].body.checked_type.dtype == "int32"
    feed = blocked(x, in_block)
    np.testing.assert_array_equal(evaluate(mod, [feed]), want)
    np.testing.assert_array_equal(opf.compile(mod)(feed), want)
    if runs_here(SSE):
        np.testing.assert_array_equal(opf.compile(mod, target=SSE)(feed), want)


@pytest.mark.parametrize("size,kernel", [((7, 12), 3), ((5, 14), 3), ((7, 7), 1)], ids=str)
def test_avx_vnni_tiles_of_many_sums_read_their_weights_from_memory(size, kernel):
    """AVX-VNNI (no AVX-512: 16 registers) takes register tiles of up to 14 sums (2 channel
    blocks x 6 or 7 columns), which leave no register for the weight vectors: each vpdpbusd
    reads its weight vector from memory (an asm operand). The sums are the int64
    convolution's exactly."""
    channels, outs, in_block, point = 32, 64, 8, 77
    x = codes((1, channels, *size), "uint8")
    weight = codes((outs, channels, kernel, kernel), "int8")
    weight.reshape(-1)[:7] = -128
    want = blocked(plain_convolution(x.astype(np.int64), weight, 1, kernel // 2, point), 8)
    data = opf.var("x", shape=(1, channels // in_block, *size, in_block), dtype="uint8")
    packed = Call(get_op("nn.byte_words"), [data], {"per_word": 4})
    conv = Call(get_op("nn.conv2d_nchwc"), [packed, Constant(word_weight(
        blocked_weight(weight, in_block, 8), 4))], {
        "padding": [kernel // 2] * 4, "data_layout": f"NCHW{in_block}c",
        "kernel_layout": f"OIHW{in_block}i8o", "out_layout": "NCHW8c", "words": 4,
        "pad_value": point, "out_dtype": "int32"})
    mod = module(conv)
    exe = opf.compile(mod, target=AVXVNNI)
    source = exe.source()
    assert "opf_dot4_add_memory_u8s8_int32x8(" in source and "_mm256_dpbusd_avx_epi32" in source
    assert "#pragma GCC unroll 1" in source  # (the taps' loops: see regtile)
    feed = blocked(x, in_block)
    np.testing.assert_array_equal(evaluate(mod, [feed]), want)
    if runs_here(AVXVNNI):
        np.testing.assert_array_equal(exe(feed), want)
    # with VNNI on 32 registers, or AVX2's pairs, every operand stays in registers
    assert "dot4_add_memory" not in opf.compile(mod, target=VNNI).source()


def test_words_need_words_a_word_weight_and_one_group():
    data = opf.var("x", shape=(1, 1, 4, 4, 4), dtype="int32")
    weight = Constant(np.zeros((1, 1, 3, 3, 4, 16), np.int32))
    attrs = {"padding": [1] * 4, "words": 4, "data_layout": "NCHW16c",
             "kernel_layout": "OIHW16i16o", "out_layout": "NCHW16c"}
    module(Call(get_op("nn.conv2d_nchwc"), [data, weight], attrs))
    floats = opf.var("x", shape=(1, 1, 4, 4, 4))
    with pytest.raises(OpfusionTypeError, match="takes int32 words"):
        module(Call(get_op("nn.conv2d_nchwc"), [floats, weight], attrs))
    with pytest.raises(OpfusionTypeError, match="do not have the blocks"):
        module(Call(get_op("nn.conv2d_nchwc"), [data, Constant(np.zeros((1, 1, 3, 3, 16, 16),
                                                                        np.int32))], attrs))
    with pytest.raises(OpfusionTypeError, match="not a byte"):
        module(Call(get_op("nn.conv2d_nchwc"), [data, weight], {**attrs, "pad_value": 300}))
    with pytest.raises(OpfusionTypeError, match="one group"):
        module(Call(get_op("nn.conv2d_nchwc"), [data, weight], {**attrs, "groups": 2}))
    with pytest.raises(OpfusionTypeError, match="2 or 4"):
        module(Call(get_op("nn.conv2d_nchwc"), [data, weight], {**attrs, "words": 3}))


def qdq_conv_model(x_shape, outs, kernel, stride=1, pad=0, activation="uint8", chained=False):
    """x -> QuantizeLinear -> DequantizeLinear -> Conv (a DequantizeLinear of per-channel int8
    weights, a bias) [-> Relu -> QuantizeLinear -> DequantizeLinear -> Conv 3x3 -> Add of the
    first], as ONNX Runtime's quantize_static writes a vision model."""
    from onnx import TensorProto, helper, numpy_helper

    channels = x_shape[1]
    point = np.array(7 if activation == "uint8" else -3, activation)
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s"),
             numpy_helper.from_array(point, "z")]

    def weight(name, shape):
        q = codes(shape, "int8")
        q[q == -128] = -127
        q[:, 0] = 127  # each output channel's largest magnitude: 127
        inits.extend([numpy_helper.from_array(q, f"{name}q"),
                      numpy_helper.from_array(rng.uniform(0.002, 0.02, shape[0]).astype(
                          np.float32), f"{name}s"),
                      numpy_helper.from_array(np.zeros(shape[0], np.int8), f"{name}z"),
                      numpy_helper.from_array(rng.standard_normal(shape[0]).astype(np.float32),
                                              f"{name}b")])
        return helper.make_node("DequantizeLinear", [f"{name}q", f"{name}s", f"{name}z"],
                                [f"{name}w"], axis=0)

    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             weight("a", (outs, channels, kernel, kernel)),
             helper.make_node("Conv", ["xd", "aw", "ab"], ["y" if not chained else "c1"],
                              strides=[stride] * 2, pads=[pad] * 4)]
    if chained:
        inits.append(numpy_helper.from_array(np.array(0.04, np.float32), "s2"))
        inits.append(numpy_helper.from_array(np.array(0, "uint8"), "z2"))
        nodes += [helper.make_node("Relu", ["c1"], ["r"]),
                  helper.make_node("QuantizeLinear", ["r", "s2", "z2"], ["rq"]),
                  helper.make_node("DequantizeLinear", ["rq", "s2", "z2"], ["rd"]),
                  weight("b", (outs, outs, 3, 3)),
                  helper.make_node("Conv", ["rd", "bw", "bb"], ["c2"], pads=[1] * 4),
                  helper.make_node("Add", ["c2", "rd"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, list(x_shape))], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def optimized(model):
    from opfusion.frontend import from_onnx

    mod, params = from_onnx(model)
    bound = BindParams(params)(mod)
    with opf.transform.PassContext(opt_level=3):
        return bound, opf.transform.optimize(opf.transform.InferType()(bound))


def rewritten(mod, target):
    with opf.transform.PassContext(opt_level=3):
        return alter_layout(mod, target)


@pytest.mark.parametrize("x_shape,outs,kernel,stride,pad,activation,chained", [
    ((1, 32, 12, 12), 32, 3, 1, 1, "uint8", True),   # 3x3 (not Winograd with VNNI), chained
    ((1, 3, 48, 48), 16, 7, 2, 3, "uint8", False),   # a stem: its input blocked after
    ((1, 64, 40, 40), 64, 1, 2, 0, "int8", False),   # signed codes, a strided 1x1
    ((1, 64, 14, 14), 128, 1, 1, 0, "uint8", False),  # a 1x1 over its pixels
], ids=str)
@pytest.mark.parametrize("target,per_word", [(VNNI, 4), (AVXVNNI, 4), (AVX2, 2)],
                         ids=["vnni", "avxvnni", "avx2"])
def test_quantized_convolutions_become_convolutions_of_words(x_shape, outs, kernel, stride, pad,
                                                             activation, chained, target,
                                                             per_word):
    bound, mod = optimized(qdq_conv_model(x_shape, outs, kernel, stride, pad, activation,
                                          chained))
    new = rewritten(mod, target)
    convs = calls(new, "nn.conv2d_nchwc")
    winograd = calls(new, "nn.conv2d_winograd_nchwc")
    assert all(c.attrs.words == per_word for c in convs)
    assert len(convs) + len(winograd) == (2 if chained else 1)
    assert bool(winograd) == (per_word == 2 and kernel == 3)  # AVX2 keeps Winograd's 3x3
    x = rng.standard_normal(x_shape).astype(np.float32) * 3
    x.reshape(-1)[:3] = [np.nan, np.inf, -1e9]
    want = evaluate(bound, [x])
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(evaluate(new, [x]), want, rtol=0, atol=1e-5 * scale)
    if runs_here(target):
        with opf.transform.PassContext(opt_level=3):
            exe = opf.compile(mod, target=target)
        np.testing.assert_allclose(exe(x), want, rtol=0, atol=1e-5 * scale)
        # bytes in whole words are the words' memory: no kernel packs them
        packing = [s for s in exe.steps if "byte_words" in s.group.name]
        whole = per_word == 4 and activation == "uint8" and x_shape[1] % 4 == 0
        assert not packing if whole or not convs else packing


def test_avx2_keeps_winograd_and_avx512_without_vnni_keeps_floats():
    """AVX2's pairs do a float multiply-add's work: Winograd's 3x3 stays; AVX-512 without VNNI
    runs 64-byte pairs on one port: every convolution stays float."""
    _, mod = optimized(qdq_conv_model((1, 32, 12, 12), 32, 3, 1, 1))
    assert takes_words(VNNI) and takes_words(AVXVNNI)
    assert not takes_words(AVX2) and not takes_words(AVX512)
    assert calls(rewritten(mod, AVX2), "nn.conv2d_winograd_nchwc")
    new = rewritten(mod, AVX512)
    assert all(not c.attrs.words for c in calls(new, "nn.conv2d_nchwc"))
    with opf.transform.PassContext(opt_level=3, disabled_pass=["WordConvolutions"]):
        off = alter_layout(mod, VNNI)
    assert calls(off, "nn.conv2d_winograd_nchwc")


def test_float_weights_and_codes_of_no_rounding_stay_float():
    """A weight that is no int8 grid, and clipped values that were never rounded (not whole
    numbers, so the bytes would truncate them), keep the float convolution."""
    x = opf.var("x", shape=(1, 32, 32, 32))
    rounded = opf.op.clip(opf.op.add(opf.op.round(x), opf.const(np.float32(3))), a_min=0.0,
                          a_max=255.0)
    unrounded = opf.op.clip(x, a_min=0.0, a_max=255.0)
    grid = rng.integers(-127, 128, (32, 32, 3, 3)).astype(np.float32)
    grid[:, 0, 0, 0] = 127  # each output channel's largest magnitude, as quantizers make it
    grid *= np.float32(0.01)
    for values, weight, words in [(rounded, grid, True), (unrounded, grid, False),
                                  (rounded, rng.standard_normal(grid.shape).astype(np.float32),
                                   False)]:
        data = opf.op.where(opf.op.isnan(values), opf.const(np.float32(0)), values)
        conv = opf.op.nn.conv2d(data, opf.const(weight), padding=[1, 1, 1, 1])
        new = rewritten(module(conv), VNNI)
        assert any(c.attrs.words for c in calls(new, "nn.conv2d_nchwc")) == words


#: The output scale of :func:`qlinear_conv_model`: one code of its result.
OUT_STEP = 0.08


def qlinear_conv_model(x_shape, outs, kernel, stride=1, pad=0, activation="uint8",
                       weight_type="int8", weight_point=0, group=1):
    """x -> QuantizeLinear -> QLinearConv (per-channel weights, an int32 bias) -> QLinearConv
    3x3 -> QLinearAdd (com.microsoft) of the first -> DequantizeLinear: ONNX Runtime's
    QOperator format, whose convolutions import as int32 convolutions of the bytes."""
    from onnx import TensorProto, helper, numpy_helper

    channels = x_shape[1]
    low = 0 if activation == "uint8" else -128
    inits = []

    def add(name, array):
        inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def params(name, scale, point):
        return [add(f"{name}s", np.float32(scale)), add(f"{name}z", np.array(point, activation))]

    def conv(name, data, data_params, ins, size, out_params, group=1, **attrs):
        weight = codes((outs, ins // group, size, size), weight_type)
        scales = rng.uniform(0.002, 0.02, outs).astype(np.float32)
        points = np.full(outs, weight_point, weight_type)
        bias = rng.integers(-2000, 2000, outs).astype(np.int32)
        return helper.make_node("QLinearConv", [data, *data_params, add(f"{name}w", weight),
                                                add(f"{name}ws", scales),
                                                add(f"{name}wz", points), *out_params,
                                                add(f"{name}b", bias)], [name], group=group,
                                **attrs)

    x_params, a_params = params("x", 0.05, low + 7), params("a", 0.04, low + 5)
    b_params, y_params = params("b", 0.06, low + 9), params("y", OUT_STEP, low + 3)
    nodes = [helper.make_node("QuantizeLinear", ["x", *x_params], ["xq"]),
             conv("a", "xq", x_params, channels, kernel, a_params, group, strides=[stride] * 2,
                  pads=[pad] * 4),
             conv("b", "a", a_params, outs, 3, b_params, pads=[1] * 4),
             helper.make_node("QLinearAdd", ["b", *b_params, "a", *a_params, *y_params], ["s"],
                              domain="com.microsoft"),
             helper.make_node("DequantizeLinear", ["s", *y_params], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, list(x_shape))], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])


@pytest.mark.parametrize("x_shape,outs,kernel,stride,pad,activation,weight_type,point", [
    ((1, 32, 12, 12), 32, 3, 1, 1, "uint8", "int8", 0),    # 3x3, then 3x3 and a residual
    ((1, 3, 48, 48), 16, 7, 2, 3, "uint8", "int8", 0),     # a stem: its bytes blocked
    ((1, 64, 40, 40), 64, 1, 2, 0, "int8", "int8", 0),     # signed bytes, a strided 1x1
    ((1, 32, 15, 15), 32, 3, 1, 1, "uint8", "uint8", 128),  # uint8 weights about 128
], ids=str)
@pytest.mark.parametrize("target,per_word", [(VNNI, 4), (AVXVNNI, 4), (AVX2, 2), (AVX512, 2),
                                              (SSE, 0)],
                         ids=["vnni", "avxvnni", "avx2", "avx512", "sse"])
def test_int32_convolutions_of_bytes_take_words_and_stay_exact(x_shape, outs, kernel, stride,
                                                               pad, activation, weight_type,
                                                               point, target, per_word):
    """QLinearConv's int32 convolution becomes one of words where the target has them (any
    width: the int32 multiplies they replace are ten times slower), blocked, with its
    requantizing epilogue in the layout; the codes stay exactly those of the reference. The
    compiled codes are within one of them: GCC contracts the residual add's products and sum
    into a multiply-add, whose single rounding moves a value across a rounding boundary now
    and then (as unfused kernels it is exact)."""
    bound, mod = optimized(qlinear_conv_model(x_shape, outs, kernel, stride, pad, activation,
                                              weight_type, point))
    new = rewritten(mod, target)
    convs = calls(new, "nn.conv2d_nchwc")
    if per_word:
        assert len(convs) == 2 and all(c.attrs.words == per_word for c in convs)
        assert not calls(new, "nn.conv2d") and not calls(new, "nn.conv2d_winograd_nchwc")
        # from the bytes to the last convolution's sums, nothing goes back to NCHW
        assert len(calls(new, "layout_transform")) <= 2
    else:
        assert not convs and len(calls(new, "nn.conv2d")) == 2
    x = rng.standard_normal(x_shape).astype(np.float32) * 3
    x.reshape(-1)[:3] = [np.nan, np.inf, -1e9]
    want = evaluate(bound, [x])
    np.testing.assert_array_equal(evaluate(new, [x]), want)
    if runs_here(target):
        with opf.transform.PassContext(opt_level=3):
            exe = opf.compile(mod, target=target)
        np.testing.assert_allclose(exe(x), want, rtol=0, atol=OUT_STEP * 1.01)
        with opf.transform.PassContext(opt_level=3):
            unfused = opf.compile(mod, target=target, fusion="none")
        np.testing.assert_array_equal(unfused(x), want)


def test_int32_convolutions_of_weights_past_int8_stay_int32():
    """uint8 weights about zero (values to 255) do not fit the words' int8: the int32
    convolution stays, NCHW, and right."""
    bound, mod = optimized(qlinear_conv_model((1, 16, 8, 8), 16, 3, 1, 1, "uint8", "uint8", 0))
    new = rewritten(mod, VNNI)
    assert not calls(new, "nn.conv2d_nchwc") and len(calls(new, "nn.conv2d")) == 2
    x = rng.standard_normal((1, 16, 8, 8)).astype(np.float32)
    np.testing.assert_array_equal(evaluate(new, [x]), evaluate(bound, [x]))


@pytest.mark.parametrize("target", [VNNI, AVX2], ids=["vnni", "avx2"])
def test_grouped_int32_convolutions_of_bytes_run_in_float_where_that_is_exact(target):
    """A depthwise QLinearConv (9 products of at most 255 x 128 an output) is exact in
    float32: it runs as a blocked float convolution, cast back to int32, and the codes are
    the reference's."""
    bound, mod = optimized(qlinear_conv_model((1, 32, 64, 64), 32, 3, 1, 1, group=32))
    new = rewritten(mod, target)
    convs = calls(new, "nn.conv2d_nchwc")
    depthwise = [c for c in convs if c.attrs.groups > 1]
    assert len(depthwise) == 1 and depthwise[0].checked_type.dtype == "float32"
    assert not calls(new, "nn.conv2d")
    x = rng.standard_normal((1, 32, 64, 64)).astype(np.float32) * 3
    want = evaluate(bound, [x])
    np.testing.assert_array_equal(evaluate(new, [x]), want)
    if runs_here(target):
        with opf.transform.PassContext(opt_level=3):
            unfused = opf.compile(mod, target=target, fusion="none")
        np.testing.assert_array_equal(unfused(x), want)


def test_grouped_int32_convolutions_past_float_exactness_stay_int32():
    """Two groups of 64 channels, 3 x 3, weights to 127: 576 x 255 x 127 passes 2^24, so a
    float sum could round; the convolution stays int32."""
    bound, mod = optimized(qlinear_conv_model((1, 128, 16, 16), 128, 3, 1, 1, group=2))
    new = rewritten(mod, VNNI)
    assert [c.attrs.groups for c in calls(new, "nn.conv2d")] == [2]
    x = rng.standard_normal((1, 128, 16, 16)).astype(np.float32)
    np.testing.assert_array_equal(evaluate(new, [x]), evaluate(bound, [x]))


def test_codes_through_a_shuffle_of_quantize_dequantize_pairs_still_take_words():
    """ONNX Runtime's QDQ ShuffleNet shuffles its channels between quantize/dequantize pairs
    of one scale: SimplifyExpr makes them the codes moved, and the convolution reading them
    takes words."""
    x = opf.var("x", shape=(1, 32, 16, 16))

    def quantize(v):
        return opf.op.clip(opf.op.add(opf.op.round(opf.op.divide(v, opf.const(np.float32(0.05)))),
                                      opf.const(np.float32(3))), a_min=0.0, a_max=255.0)

    def dequantize(c):
        kept = opf.op.where(opf.op.isnan(c), opf.const(np.float32(0)), c)
        return opf.op.multiply(opf.op.subtract(kept, opf.const(np.float32(3))),
                               opf.const(np.float32(0.05)))

    shuffled = opf.op.reshape(opf.op.transpose(opf.op.reshape(dequantize(quantize(x)),
                                                              newshape=[1, 2, 16, 16, 16]),
                                               axes=[0, 2, 1, 3, 4]), newshape=[1, 32, 16, 16])
    grid = rng.integers(-127, 128, (32, 32, 3, 3)).astype(np.float32)
    grid[:, 0, 0, 0] = 127
    weight = opf.const(grid * np.float32(0.01))
    conv = opf.op.nn.conv2d(dequantize(quantize(shuffled)), weight, padding=[1, 1, 1, 1])
    mod = module(conv)
    with opf.transform.PassContext(opt_level=3):
        simplified = opf.transform.optimize(mod)
    new = rewritten(simplified, VNNI)
    assert [c.attrs.words for c in calls(new, "nn.conv2d_nchwc")] == [4]
    feed = rng.standard_normal((1, 32, 16, 16)).astype(np.float32) * 3
    want = evaluate(mod, [feed])
    np.testing.assert_allclose(evaluate(new, [feed]), want, rtol=0,
                               atol=1e-5 * np.abs(want).max())
