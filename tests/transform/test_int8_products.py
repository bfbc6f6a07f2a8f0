"""Products of 8-bit operands in words (opfusion.transform.int8_products): an int32 product of
8-bit activations by a constant that fits int8 becomes a product of int32 words (nn.byte_words;
nn.matmul_packed with words=4 and dot4_u8s8 on VNNI, words=2 and dot2_s16 with AVX2 or
AVX512-BW) less the zero point times the weight's column sums; the result is the same int32,
exactly, in the reference interpreter and compiled (vpdpbusd, vpmaddwd, or loops over the
parts where the target has neither)."""

import tempfile
from pathlib import Path

import numpy as np
import pytest
from int8_helpers import AVX2, AVX512, SSE, VNNI, module, random_codes, runs_here

import opfusion as opf
from opfusion.compiler.compile import alter_layout
from opfusion.errors import OpfusionTypeError
from opfusion.ir.evaluate import evaluate
from opfusion.ir.expr import Call, Constant
from opfusion.ir.op import get_op
from opfusion.ir.visitor import post_order
from opfusion.target import Target, host_target
from opfusion.tir.expr import unpack_dot4_u8s8
from opfusion.transform.fold_constant import BindParams
from opfusion.transform.int8_products import has_vnni, int8_columns, word_panels, word_values

HOST_VNNI = has_vnni(host_target())
#: The targets of products of words, and the values in each word.
WORD_TARGETS = [(VNNI, 4), (AVX512, 2), (AVX2, 2)]

rng = np.random.default_rng(7)


def codes(shape, dtype):
    return random_codes(rng, shape, dtype)


def rewritten(mod, target):
    with opf.transform.PassContext(opt_level=3):
        return alter_layout(mod, target)


def op_names(mod):
    return [n.op.name for n in post_order(mod["main"].body) if isinstance(n, Call)]


def quantized_product(x_shape, x_dtype, weight, zero_point=None):
    """nn.matmul(cast(x, int32) - zero_point, weight) as the MatMulInteger converter writes
    it."""
    x = opf.var("x", shape=x_shape, dtype=x_dtype)
    wide = opf.op.cast(x, dtype="int32")
    if zero_point is not None:
        wide = opf.op.subtract(wide, opf.const(np.array(zero_point, np.int32)))
    return opf.op.nn.matmul(wide, opf.const(weight.astype(np.int32)))


def test_dot4_u8s8_multiplies_unsigned_bytes_by_signed_ones():
    assert unpack_dot4_u8s8(0x01020304, -1) == -10
    assert unpack_dot4_u8s8(-1, 0x7F7F7F7F) == 4 * 255 * 127
    assert unpack_dot4_u8s8(-1, -2139062144) == 4 * 255 * -128  # 0x80808080
    assert unpack_dot4_u8s8(0, -1) == 0
    with pytest.raises(opf.errors.TensorExprError, match="int32 words"):
        opf.te.dot4_u8s8(opf.te.const(1.0, "float32"), opf.te.const(1, "int32"))


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_byte_words_pack_four_bytes_and_pad_the_last_word(dtype):
    data = codes((3, 10), dtype)
    words = get_op("nn.byte_words").reference(data)
    assert words.shape == (3, 3) and words.dtype == np.int32
    as_bytes = np.ascontiguousarray(words).view(np.uint8).reshape(3, 12)
    offset = 128 if dtype == "int8" else 0
    np.testing.assert_array_equal(as_bytes[:, :10], data.astype(np.int32) + offset)
    assert not as_bytes[:, 10:].any()
    x = opf.var("x", shape=(3, 10), dtype=dtype)
    mod = module(Call(get_op("nn.byte_words"), [x], {}))
    np.testing.assert_array_equal(opf.compile(mod)(data), words)


def test_byte_words_refuses_other_types():
    x = opf.var("x", shape=(4,), dtype="int16")
    with pytest.raises(OpfusionTypeError, match="uint8 or int8"):
        module(Call(get_op("nn.byte_words"), [x], {}))


@pytest.mark.parametrize("per_word", [4, 2])
@pytest.mark.parametrize("rows,depth,width,cols", [(37, 40, 70, 48), (8, 13, 32, 16),
                                                   (1, 64, 100, 16)], ids=str)
def test_a_product_of_words_computes_the_int32_product(rows, depth, width, cols, per_word):
    """Compiled for the host (vpdpbusd with VNNI, vpmaddwd with AVX2, loops over the parts
    otherwise) and for SSE (loops)."""
    x, weight = codes((rows, depth), "uint8"), codes((depth, width), "int8")
    x[0, :3], weight[:3, 0] = 255, -128  # the extremes: 255 * -128 three times
    padded = -(-width // cols) * cols
    panels = word_panels(weight, cols, padded, per_word)
    assert panels.shape == (padded // cols, -(-depth // per_word), cols)
    var = opf.var("x", shape=(rows, depth), dtype="uint8")
    words = Call(get_op("nn.byte_words"), [var], {"per_word": per_word})
    product = Call(get_op("nn.matmul_packed"), [words, Constant(panels)],
                   {"columns": width if padded != width else 0, "words": per_word})
    mod = module(product)
    want = x.astype(np.int64) @ weight.astype(np.int64)
    np.testing.assert_array_equal(evaluate(mod, [x]), want)
    np.testing.assert_array_equal(opf.compile(mod)(x), want)
    if runs_here(SSE):
        np.testing.assert_array_equal(opf.compile(mod, target=SSE)(x), want)


def test_words_take_int32():
    x = opf.var("x", shape=(4, 8))
    with pytest.raises(OpfusionTypeError, match="int32 words"):
        module(Call(get_op("nn.matmul_packed"), [x, opf.const(np.zeros((1, 8, 16), "float32"))],
                    {"words": 4}))


@pytest.mark.parametrize("x_shape,x_dtype,w_dtype,w_zero,zero_point", [
    ((128, 768), "uint8", "int8", 0, 113),        # quantize_dynamic's form
    ((1, 20, 36), "uint8", "int8", 0, None),       # batch axes, no zero point
    ((33, 50), "int8", "int8", 0, -7),             # signed activations, depth not 4k
    ((16, 64), "uint8", "uint8", 128, 3),          # an unsigned weight centred on 128
    ((2, 96), "uint8", "int8", 0, 255),            # two rows, panels of the few-rows form
], ids=str)
@pytest.mark.parametrize("target,per_word", WORD_TARGETS, ids=["vnni", "avx512bw", "avx2"])
def test_quantized_products_become_products_of_words(x_shape, x_dtype, w_dtype, w_zero,
                                                      zero_point, target, per_word):
    width = 96
    weight = codes((x_shape[-1], width), w_dtype).astype(np.int32) - w_zero
    mod = module(quantized_product(x_shape, x_dtype, weight, zero_point))
    new = rewritten(mod, target)
    assert "nn.byte_words" in op_names(new) and "nn.matmul" not in op_names(new)
    (product,) = [n for n in post_order(new["main"].body)
                  if isinstance(n, Call) and n.op.name == "nn.matmul_packed"]
    assert product.attrs.words == per_word
    x = codes(x_shape, x_dtype)
    want = evaluate(mod, [x])
    np.testing.assert_array_equal(evaluate(new, [x]), want)
    if runs_here(target):
        np.testing.assert_array_equal(opf.compile(mod, target=target)(x), want)


@pytest.mark.parametrize("x_shape,width", [((3, 0), 16), ((0, 16), 32), ((4, 1), 16),
                                           ((4, 16), 1)], ids=str)
def test_empty_and_thin_quantized_products(x_shape, width):
    """An empty contraction stays the int32 product (zeros); no rows, one value of depth, one
    column: the reference's numbers."""
    weight = codes((x_shape[-1], width), "int8")
    mod = module(quantized_product(x_shape, "uint8", weight, 3))
    rewritten(mod, VNNI)
    x = codes(x_shape, "uint8")
    np.testing.assert_array_equal(opf.compile(mod)(x), evaluate(mod, [x]))
    if runs_here(AVX2):
        np.testing.assert_array_equal(opf.compile(mod, target=AVX2)(x), evaluate(mod, [x]))


def test_weights_outside_int8_and_targets_without_word_products_keep_the_int32_product():
    weight = codes((32, 48), "uint8").astype(np.int32) - 3  # 252 does not fit int8
    mod = module(quantized_product((16, 32), "uint8", weight, 5))
    assert "nn.byte_words" not in op_names(rewritten(mod, VNNI))
    fits = module(quantized_product((16, 32), "uint8", codes((32, 48), "int8"), 5))
    assert "nn.byte_words" not in op_names(rewritten(fits, SSE))
    assert word_values(SSE) == 0 and word_values(Target("c -mattr=+avx512f")) == 0
    x = codes((16, 32), "uint8")
    np.testing.assert_array_equal(opf.compile(mod)(x), evaluate(mod, [x]))


def test_the_quantized_bert_layer_matches_the_reference():
    """ONNX Runtime's quantize_dynamic of the BERT-base layer: every MatMul a MatMulInteger of
    DynamicQuantizeLinear's bytes. Compiled, its products of words give the reference
    interpreter's numbers."""
    pytest.importorskip("onnxruntime")
    if not HOST_VNNI:
        pytest.skip("the host has no AVX512-VNNI: its products stay int32 ones")
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from opfusion.frontend import from_onnx
    from opfusion.testing.transformer import transformer_model

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "bert_int8.onnx"
        quantize_dynamic(str(transformer_model("bert_layer")), str(path),
                         weight_type=QuantType.QInt8)
        mod, params = from_onnx(onnx.load(path))
    exe = opf.compile(mod, params=params)
    # (VNNI's vpdpbusd, or AMX's tdpbusd where the host has matrix tiles)
    assert ("_tile_dpbusd(" if Target("c").matrix_tiles else "opf_dot4_add_u8s8") \
        in exe.source_code
    # DynamicQuantizeLinear's bytes, 768 a row, are the products' words: no packing kernel
    assert not [s for s in exe.steps if "byte_words" in s.group.name]
    x = np.random.default_rng(0).standard_normal((1, 128, 768)).astype(np.float32)
    want = evaluate(BindParams(params)(mod), [x])
    got = exe(x)
    assert float(np.abs(got - want).max()) <= 1e-4 * float(np.abs(want).max())


def test_int8_columns_recover_codes_and_scales_of_dequantized_weights():
    codes_ = rng.integers(-127, 128, (64, 24)).astype(np.int8)
    codes_[0] = 127  # a quantizer maps each column's largest magnitude to 127
    scales = rng.uniform(0.001, 0.05, 24).astype(np.float32)
    weight = codes_.astype(np.float32) * scales
    found = int8_columns(weight)
    assert found is not None
    np.testing.assert_array_equal(found[0].astype(np.float32) * found[1], weight)
    # the activations' scale folded in after (FoldScaleAxis): rounded twice, still found
    assert int8_columns(weight * np.float32(0.0371)) is not None
    weight[:, 3] = 0.0  # a column of zeros
    assert int8_columns(weight) is not None
    assert int8_columns(rng.standard_normal((64, 24)).astype(np.float32)) is None


def test_int8_columns_check_every_row_beyond_the_probed_ones():
    from opfusion.transform.int8_products import PROBE_ROWS

    codes_ = rng.integers(-127, 128, (3 * PROBE_ROWS, 8)).astype(np.int8)
    codes_[0] = 127
    scales = rng.uniform(0.001, 0.05, 8).astype(np.float32)
    weight = codes_.astype(np.float32) * scales * np.float32(0.0371)  # folded: none exact
    found = int8_columns(weight)
    assert found is not None and np.array_equal(found[0], codes_)
    row = 2 * PROBE_ROWS + 1  # past the rows every candidate is first tried on
    weight[row, 5] = weight[row, 5] * np.float32(1.01) + np.float32(1e-4)  # off the grid
    assert int8_columns(weight) is None


def qdq_matmul_model(x_shape, k, n, activation="uint8", gemm=False):
    """x -> QuantizeLinear -> DequantizeLinear -> MatMul (or Gemm with transB) by a
    DequantizeLinear of per-column int8 weights, as ONNX Runtime's quantize_static writes."""
    from onnx import TensorProto, helper, numpy_helper

    weight = codes((n, k) if gemm else (k, n), "int8")
    weight[weight == -128] = -127
    weight[(slice(None), 0) if gemm else (0, slice(None))] = 127  # a column's largest: 127
    scales = rng.uniform(0.002, 0.02, n).astype(np.float32)
    point = np.array(7 if activation == "uint8" else -3, activation)
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s"),
             numpy_helper.from_array(point, "z"),
             numpy_helper.from_array(weight, "wq"),
             numpy_helper.from_array(scales, "ws"),
             numpy_helper.from_array(np.zeros(n, np.int8), "wz"),
             numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"],
                              axis=0 if gemm else 1)]
    if gemm:
        nodes.append(helper.make_node("Gemm", ["xd", "w", "b"], ["y"], transB=1))
    else:
        nodes.append(helper.make_node("MatMul", ["xd", "w"], ["y"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, list(x_shape))], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model


@pytest.mark.parametrize("x_shape,activation,gemm", [
    ((64, 96), "uint8", True), ((1, 24, 40), "uint8", False), ((33, 52), "int8", False),
], ids=str)
@pytest.mark.parametrize("target", [VNNI, AVX2], ids=["vnni", "avx2"])
def test_dequantized_products_become_products_of_words(x_shape, activation, gemm, target):
    from opfusion.frontend import from_onnx

    k = x_shape[-1]
    mod, params = from_onnx(qdq_matmul_model(x_shape, k, 80, activation, gemm))
    bound = BindParams(params)(mod)
    with opf.transform.PassContext(opt_level=3):
        optimized = opf.transform.optimize(opf.transform.InferType()(bound))
    new = rewritten(optimized, target)
    assert "nn.byte_words" in op_names(new)
    assert not {"nn.dense", "nn.matmul"} & set(op_names(new))
    x = rng.standard_normal(x_shape).astype(np.float32) * 2
    x.reshape(-1)[:3] = [np.nan, np.inf, -1e9]
    want = evaluate(bound, [x])
    scale = float(np.nanmax(np.abs(want)))
    np.testing.assert_allclose(evaluate(new, [x]), want, rtol=0, atol=1e-5 * scale)
    if runs_here(target):
        np.testing.assert_allclose(opf.compile(mod, params=params, target=target)(x), want,
                                   rtol=0, atol=1e-5 * scale)


def test_float_products_stay_float_where_words_are_slower():
    """AVX-512 without VNNI: vpmaddwd on one port, float multiply-adds on two."""
    from opfusion.frontend import from_onnx

    mod, params = from_onnx(qdq_matmul_model((64, 96), 96, 80))
    with opf.transform.PassContext(opt_level=3):
        optimized = opf.transform.optimize(opf.transform.InferType()(BindParams(params)(mod)))
    assert "nn.byte_words" not in op_names(rewritten(optimized, AVX512))


def test_a_float_weight_that_is_no_int8_grid_stays_a_float_product():
    x = opf.var("x", shape=(16, 32))
    codes_ = opf.op.clip(opf.op.round(x), a_min=0.0, a_max=255.0)
    values = opf.op.where(opf.op.isnan(codes_), opf.const(np.float32(0)), codes_)
    product = opf.op.nn.matmul(values, opf.const(rng.standard_normal((32, 48)).astype(
        np.float32)))
    assert "nn.byte_words" not in op_names(rewritten(module(product), VNNI))


def widened(var, zero_point):
    return opf.op.subtract(opf.op.cast(var, dtype="int32"), opf.const(np.int32(zero_point)))


@pytest.mark.parametrize("depth,points,exact", [
    (64, (128, 3), True), (128, (128, 3), True),
    (300, (128, 3), True),   # 300 x 128 x 252 = 9.7e6
    (258, (0, 0), True),     # 258 x 255 x 255 = 16776450 < 2^24
    (259, (0, 0), False),    # just past 2^24: a float sum could round
], ids=str)
def test_products_of_two_computed_byte_operands_run_in_float_where_that_is_exact(depth, points,
                                                                                exact):
    """An attention's int32 products of two computed 8-bit operands (QLinearMatMul's import):
    float32 sums them exactly while the depth times both operands' largest magnitudes (the
    bytes less their zero points) stays within 2^24, so they take the float products, cast
    back to int32; others stay int32. The sums are the int32 product's, exactly."""
    a = opf.var("a", shape=(2, 12, 9, depth), dtype="uint8")
    b = opf.var("b", shape=(2, 12, depth, 7), dtype="uint8")
    product = opf.op.nn.matmul(widened(a, points[0]), widened(b, points[1]))
    mod = module(product)
    new = rewritten(mod, AVX512)
    floats = [c for c in post_order(new["main"].body)
              if isinstance(c, Call) and c.op.name == "nn.matmul"
              and c.checked_type.dtype == "float32"]
    assert bool(floats) == exact
    feeds = [codes((2, 12, 9, depth), "uint8"), codes((2, 12, depth, 7), "uint8")]
    # a row and a column of the largest magnitudes: the largest sums
    feeds[0].reshape(-1)[:depth] = 0 if points[0] >= 128 else 255
    feeds[1][..., 0] = 255 if points[1] < 128 else 0
    want = np.matmul(feeds[0].astype(np.int64) - points[0], feeds[1].astype(np.int64) - points[1])
    np.testing.assert_array_equal(evaluate(new, feeds), want)
    with opf.transform.PassContext(opt_level=3):
        np.testing.assert_array_equal(opf.compile(mod)(*feeds), want)


def test_codes_with_a_nan_or_infinite_bound_or_zero_point_are_no_codes():
    """``clip(round(v) + z, low, high)`` with a NaN or infinite bound, or a NaN zero point
    (a damaged model's scalars), is not taken for byte codes: the recognisers say no
    instead of failing on ``round(nan)``."""
    from opfusion.transform.int8_products import codes_range, dequantized_codes

    v = opf.var("v", shape=(4,), dtype="float32")
    for low, high in ((float("nan"), 255.0), (0.0, float("inf")), (0.0, float("nan"))):
        clipped = opf.op.clip(opf.op.round(v), a_min=low, a_max=high)
        assert codes_range(clipped) is None
    nan_point = opf.op.subtract(opf.op.clip(opf.op.round(v), a_min=0.0, a_max=255.0),
                                opf.const(np.float32("nan")))
    shifted = opf.op.multiply(nan_point, opf.const(np.float32(0.5)))
    assert dequantized_codes(shifted) is None
