"""Neural-network ONNX converters: one-node models imported and evaluated agree with
onnx.reference (or, where that evaluator does not follow the spec, a NumPy oracle)."""

import numpy as np
import pytest

pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import opfusion as opf  # noqa: E402
from opfusion.errors import OpfusionError  # noqa: E402
from opfusion.frontend import from_onnx  # noqa: E402
from opfusion.testing import assert_close  # noqa: E402


def randn(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def one_node(op_type, inputs, *, opset=17, weights=(), outputs=1, **attrs):
    """A one-node model and its feeds. ``inputs`` maps names to arrays in the node's input
    order (None: an omitted optional input); the names in ``weights`` become initializers."""
    names = [name if value is not None else "" for name, value in inputs.items()]
    out_names = [f"y{i}" for i in range(outputs)]
    node = helper.make_node(op_type, names, out_names, name=f"{op_type.lower()}_node", **attrs)
    feeds = {n: v for n, v in inputs.items() if v is not None and n not in weights}
    graph = helper.make_graph(
        [node], "one",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for n, v in feeds.items()],
        [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in out_names],
        [numpy_helper.from_array(inputs[n], n) for n in weights])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return model, feeds


def ours(model, feeds):
    mod, _ = from_onnx(model)
    got = opf.ir.evaluate(mod, feeds)
    return list(got) if isinstance(got, tuple) else [got]


def check(op_type, inputs, *, rtol=1e-5, **kw):
    """Import and evaluate the one-node model; compare every output with onnx.reference."""
    model, feeds = one_node(op_type, inputs, **kw)
    with np.errstate(over="ignore"):  # the oracle's exp overflows where ours does not
        want = ReferenceEvaluator(model).run(None, feeds)
    got = ours(model, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert_close(g, w, rtol=rtol)


def import_error(op_type, inputs, **kw):
    model, _ = one_node(op_type, inputs, **kw)
    with pytest.raises(OpfusionError) as info:
        from_onnx(model)
    return str(info.value)


# ---------------------------------------------------------------------------------------------
# convolution

X4 = randn(1, 4, 7, 8)
X3 = randn(2, 4, 11)


@pytest.mark.parametrize("attrs", [
    {},
    {"pads": [1, 0, 2, 1], "strides": [2, 3]},
    {"dilations": [2, 1], "pads": [2, 1, 2, 1]},
    {"auto_pad": "SAME_UPPER", "strides": [2, 2]},
    {"auto_pad": "SAME_LOWER", "strides": [2, 3]},
    {"auto_pad": "SAME_UPPER", "dilations": [2, 2]},
    {"auto_pad": "VALID", "strides": [2, 1]},
    {"kernel_shape": [3, 3], "group": 2},
])
def test_conv_2d(attrs):
    groups = attrs.get("group", 1)
    check("Conv", {"x": X4, "w": randn(6, 4 // groups, 3, 3, seed=1)}, weights=["w"], **attrs)


def test_conv_depthwise_with_bias():
    check("Conv", {"x": X4, "w": randn(4, 1, 3, 3, seed=1), "b": randn(4, seed=2)},
          weights=["w", "b"], group=4, pads=[1, 1, 1, 1])


def test_conv_with_runtime_weight():
    check("Conv", {"x": X4, "w": randn(3, 4, 2, 2, seed=1)}, strides=[2, 2])


@pytest.mark.parametrize("attrs", [
    {},
    {"pads": [2, 1], "strides": [2], "dilations": [2]},
    {"auto_pad": "SAME_UPPER", "strides": [3]},
    {"auto_pad": "SAME_LOWER"},
    {"group": 2, "pads": [1, 1]},
])
def test_conv_1d(attrs):
    groups = attrs.get("group", 1)
    check("Conv", {"x": X3, "w": randn(6, 4 // groups, 3, seed=1), "b": randn(6, seed=2)},
          weights=["w", "b"], **attrs)


X5 = randn(2, 4, 5, 6, 7)


@pytest.mark.parametrize("attrs", [
    {},
    {"pads": [1, 0, 2, 1, 1, 0], "strides": [2, 1, 2]},
    {"dilations": [2, 1, 2], "group": 2},
    {"auto_pad": "SAME_LOWER", "strides": [2, 2, 3]},
])
def test_conv_3d_sums_2d_convolutions_over_the_depth(attrs):
    groups = attrs.get("group", 1)
    check("Conv", {"x": X5, "w": randn(6, 4 // groups, 3, 2, 3, seed=1), "b": randn(6, seed=2)},
          weights=["w", "b"], **attrs)


@pytest.mark.parametrize("attrs", [
    {},
    {"strides": [2, 1, 2], "pads": [1, 0, 1, 0, 1, 1], "output_padding": [1, 0, 1]},
    {"dilations": [1, 2, 1]},
])
def test_conv_transpose_3d_is_a_product_and_col2im(attrs):
    check("ConvTranspose", {"x": X5, "w": randn(4, 6, 3, 2, 3, seed=1), "b": randn(6, seed=2)},
          weights=["w", "b"], **attrs)


def test_grouped_conv_transpose_3d_matches_onnxruntime():
    # (onnx.reference cannot run a grouped 3-D ConvTranspose)
    ort = pytest.importorskip("onnxruntime")
    model, feeds = one_node("ConvTranspose", {"x": X5, "w": randn(4, 3, 3, 2, 3, seed=1)},
                            weights=["w"], group=2, strides=[1, 2, 1])
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)
    assert_close(ours(model, feeds)[0], want[0])


def test_conv_transpose_3d_larger_than_its_full_result_is_an_error_naming_the_node():
    message = import_error("ConvTranspose", {"x": X5, "w": randn(4, 2, 1, 1, 1)},
                           weights=["w"], output_shape=[6, 6, 7])
    assert "3-D ConvTranspose" in message and "convtranspose_node" in message


def test_conv_errors_say_what_to_fix():
    x, w = X4, randn(6, 4, 3, 3)
    assert "auto_pad='SAME'" in import_error("Conv", {"x": x, "w": w}, auto_pad="SAME")
    assert "must have the data's rank" in import_error("Conv", {"x": x, "w": w[:, :, 0]})
    assert "kernel_shape" in import_error("Conv", {"x": x, "w": w}, kernel_shape=[2, 2])


@pytest.mark.parametrize("attrs", [
    {},
    {"strides": [3, 2], "output_padding": [1, 1]},
    {"strides": [3, 2], "pads": [1, 2, 1, 2]},
    {"dilations": [2, 2]},
    {"auto_pad": "SAME_UPPER", "strides": [2, 2]},
    {"auto_pad": "SAME_LOWER", "strides": [2, 3]},
    {"strides": [3, 2], "output_shape": [22, 17]},  # one row/column more: zero-extended
])
def test_conv_transpose_2d(attrs):
    check("ConvTranspose", {"x": X4, "w": randn(4, 6, 3, 3, seed=1), "b": randn(6, seed=2)},
          weights=["w", "b"], **attrs)


def test_conv_transpose_grouped():
    # onnx.reference handles groups of one output channel, without bias, only.
    check("ConvTranspose", {"x": X4, "w": randn(4, 1, 3, 3, seed=1)}, weights=["w"], group=4,
          strides=[2, 1], pads=[1, 0, 0, 1])


def conv_transpose_reference(**attrs):
    """onnx.reference's ConvTranspose of X4 without bias, and the bias it would add."""
    inputs = {"x": X4, "w": randn(4, 3, 3, 3, seed=1)}
    model, feeds = one_node("ConvTranspose", inputs, weights=["w"], **attrs)
    return ReferenceEvaluator(model).run(None, feeds)[0]


def test_conv_transpose_output_shape_smaller_than_full_pads_per_the_spec():
    # total padding 3 and 2: the spec puts the odd one before (NOTSET), the oracle evaluator
    # would crop only at the end; compare with the explicit pads the spec prescribes.
    model, feeds = one_node("ConvTranspose", {"x": X4, "w": randn(4, 3, 3, 3, seed=1)},
                            weights=["w"], strides=[3, 2], output_shape=[18, 15])
    want = conv_transpose_reference(strides=[3, 2], pads=[2, 1, 1, 1])
    assert_close(ours(model, feeds)[0], want)


def test_conv_transpose_output_padding_beyond_the_stride_extends_with_zeros():
    # onnx.reference cannot run this (its col2im rejects the size); the spec's result is the
    # plain output with zero rows and columns appended.
    model, feeds = one_node("ConvTranspose", {"x": X4, "w": randn(4, 3, 3, 3, seed=1)},
                            weights=["w"], strides=[2, 2], output_padding=[2, 3])
    want = np.pad(conv_transpose_reference(strides=[2, 2]), ((0, 0), (0, 0), (0, 2), (0, 3)))
    assert_close(ours(model, feeds)[0], want)


def test_conv_transpose_1d():
    check("ConvTranspose", {"x": X3, "w": randn(4, 3, 3, seed=1)}, weights=["w"], strides=[2],
          pads=[1, 0], output_padding=[1])


# ---------------------------------------------------------------------------------------------
# pooling


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3]},
    {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [2, 2], "dilations": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
    {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "VALID"},
])
@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
def test_pool_2d(op_type, attrs):
    check(op_type, {"x": X4}, opset=19, **attrs)


def test_pool_same_lower_pads_the_odd_one_before():
    attrs = {"kernel_shape": [2, 3], "strides": [2, 2]}
    check("AveragePool", {"x": X4}, auto_pad="SAME_LOWER", **attrs)
    # onnx.reference's MaxPool pads SAME_LOWER like SAME_UPPER; the spec's pads are explicit
    # here: 7 rows -> 4 windows need 1 more row, 8 columns -> 4 need 1 more, both before.
    model, feeds = one_node("MaxPool", {"x": X4}, auto_pad="SAME_LOWER", **attrs)
    want_model, _ = one_node("MaxPool", {"x": X4}, pads=[1, 1, 0, 0], **attrs)
    assert_close(ours(model, feeds)[0], ReferenceEvaluator(want_model).run(None, feeds)[0])


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1},
])
def test_avg_pool_counting_the_padding(attrs):
    check("AveragePool", {"x": X4}, count_include_pad=1, **attrs)


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [2, 2, 2]},
    {"kernel_shape": [3, 2, 3], "strides": [2, 1, 2], "pads": [1, 0, 1, 1, 1, 0]},
    {"kernel_shape": [3, 3, 2], "strides": [2, 2, 2], "ceil_mode": 1},
    {"kernel_shape": [2, 2, 2], "dilations": [2, 1, 2], "pads": [1, 1, 0, 0, 1, 1]},
    {"kernel_shape": [3, 3, 3], "strides": [2, 2, 2], "auto_pad": "SAME_UPPER"},
])
@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
def test_pool_3d_is_separable(op_type, attrs):
    check(op_type, {"x": X5}, opset=19, **attrs)
    if op_type == "AveragePool":
        check(op_type, {"x": X5}, opset=19, count_include_pad=1, **attrs)


@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
def test_pool_1d(op_type):
    check(op_type, {"x": X3}, kernel_shape=[3], strides=[2], pads=[1, 1])
    check(op_type, {"x": X3}, kernel_shape=[2], strides=[2], auto_pad="SAME_UPPER")


def test_max_pool_indices_output_of_a_3d_pool_is_an_error():
    # 1-D and 2-D pools give their Indices (tests/frontend/test_convert_scatter.py)
    assert "Indices" in import_error("MaxPool", {"x": randn(1, 2, 4, 4, 4)}, outputs=2,
                                     kernel_shape=[2, 2, 2])


@pytest.mark.parametrize("op_type, oracle", [
    ("GlobalAveragePool", lambda x, axes: x.mean(axis=axes, keepdims=True)),
    ("GlobalMaxPool", lambda x, axes: x.max(axis=axes, keepdims=True)),
    ("GlobalLpPool", lambda x, axes: np.sqrt(np.square(x).sum(axis=axes, keepdims=True))),
])
@pytest.mark.parametrize("data", [X4, X3, randn(1, 2, 3, 4, 2)], ids=["2d", "1d", "3d"])
def test_global_pools(op_type, oracle, data):
    # onnx.reference has no GlobalLpPool and reduces the wrong axes of GlobalMaxPool
    # unless the data is 4-D: NumPy is the oracle.
    model, feeds = one_node(op_type, {"x": data})
    axes = tuple(range(2, data.ndim))
    want = oracle(data.astype(np.float64), axes).astype(np.float32)
    assert_close(ours(model, feeds)[0], want)
    if data.ndim == 4 and op_type != "GlobalLpPool":
        check(op_type, {"x": data})


def lp_pool_oracle(x, p, kernel, pads, strides=(1, 1)):
    """sum |x|^p over each window of the zero-padded input, to the power 1/p."""
    (top, left, bottom, right) = pads
    padded = np.pad(np.abs(x.astype(np.float64)) ** p,
                    ((0, 0), (0, 0), (top, bottom), (left, right)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, kernel, axis=(2, 3))
    windows = windows[:, :, ::strides[0], ::strides[1]]
    return (windows.sum(axis=(-2, -1)) ** (1 / p)).astype(x.dtype)


def test_lp_pool():
    check("LpPool", {"x": X4}, kernel_shape=[2, 3], strides=[2, 1], p=3, opset=18)
    check("LpPool", {"x": X3}, kernel_shape=[3], p=2)
    check("LpPool", {"x": X5}, kernel_shape=[2, 3, 2], strides=[1, 2, 2], p=2)
    # onnx.reference divides padded windows by the wrong count; the spec sums |x|^p.
    model, feeds = one_node("LpPool", {"x": X4}, kernel_shape=[3, 3], pads=[1, 2, 1, 0], p=2)
    assert_close(ours(model, feeds)[0], lp_pool_oracle(X4, 2, (3, 3), (1, 2, 1, 0)))


def test_lp_pool_ceil_mode_keeps_the_partial_windows():
    # 7 rows, window 2, stride 2: 4 windows, the last one half outside (one zero row);
    # 8 columns, window 3, stride 2, one column padded before: 4 windows (one zero column).
    model, feeds = one_node("LpPool", {"x": X4}, kernel_shape=[2, 3], strides=[2, 2],
                            pads=[0, 1, 0, 0], ceil_mode=1, p=1, opset=18)
    want = lp_pool_oracle(X4, 1, (2, 3), (0, 1, 1, 1), strides=(2, 2))
    assert want.shape == (1, 4, 4, 4)
    assert_close(ours(model, feeds)[0], want)


# ---------------------------------------------------------------------------------------------
# matrix products


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_transposes(trans_a, trans_b):
    a = randn(5, 3) if trans_a else randn(3, 5)
    b = randn(4, 5, seed=1) if trans_b else randn(5, 4, seed=1)
    check("Gemm", {"a": a, "b": b, "c": randn(4, seed=2)}, weights=["b", "c"], transA=trans_a,
          transB=trans_b, alpha=0.5, beta=2.0)
    check("Gemm", {"a": a, "b": b}, transA=trans_a, transB=trans_b, alpha=1.5)  # runtime B


@pytest.mark.parametrize("c", [randn(3, 4, seed=3), randn(1, 4, seed=3),
                               np.array(0.7, np.float32), None], ids=["full", "row", "0d", "none"])
def test_gemm_bias_shapes(c):
    check("Gemm", {"a": randn(3, 5), "b": randn(4, 5, seed=1), "c": c}, weights=["b"],
          transB=1)


@pytest.mark.parametrize("a_shape, b_shape", [
    ((3, 5), (5, 4)), ((2, 3, 5), (5, 4)), ((2, 1, 3, 5), (4, 5, 2)), ((5,), (5, 4)),
    ((3, 5), (5,)),
])
def test_matmul(a_shape, b_shape):
    check("MatMul", {"a": randn(*a_shape), "b": randn(*b_shape, seed=1)})


@pytest.mark.parametrize("equation, shapes", [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)]),
    ("ij->ji", [(3, 4)]),
    ("ii->i", [(3, 3)]),
    ("ii", [(3, 3)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ij,jk", [(3, 4), (4, 5)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (4, 5)]),
    ("ij->", [(3, 4)]),
    ("i, i", [(5,), (5,)]),
])
def test_einsum(equation, shapes):
    inputs = {f"x{i}": randn(*shape, seed=i) for i, shape in enumerate(shapes)}
    check("Einsum", inputs, equation=equation)


@pytest.mark.parametrize("equation, shapes", [
    ("bghid,bghjd->bghij", [(1, 3, 2, 5, 4), (1, 3, 2, 6, 4)]),  # MaxViT's scores
    ("bghij,bghjd->bghid", [(1, 3, 2, 5, 6), (1, 3, 2, 6, 4)]),  # and its weighted values
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("hbi,bhj->hji", [(2, 3, 4), (3, 2, 5)]),  # a transposed result: b summed
    ("kb,bk->bb", None),
])
def test_einsum_of_a_batch_of_products_imports_as_a_product(equation, shapes):
    """A two-operand einsum that is a batch of matrix products imports as nn.matmul between
    transposes (a packed product, and FuseAttention's pattern); others stay einsum."""
    if shapes is None:  # a repeated output letter: not even valid, the einsum op says so
        with pytest.raises(OpfusionError, match="repeat"):
            from_onnx(one_node("Einsum", {"a": randn(3, 2), "b": randn(2, 3)},
                               equation=equation)[0])
        return
    inputs = {f"x{i}": randn(*shape, seed=i) for i, shape in enumerate(shapes)}
    check("Einsum", inputs, equation=equation)
    mod, _ = from_onnx(one_node("Einsum", inputs, equation=equation)[0])
    assert "nn.matmul(" in str(mod) and "einsum(" not in str(mod)


def test_einsum_products_that_broadcast_or_sum_alone_stay_einsum():
    for equation, shapes in [("bij,bjk->bik", [(1, 3, 4), (2, 4, 5)]),  # b broadcasts
                             ("ijl,jk->ik", [(3, 4, 2), (4, 5)]),  # l summed in one operand
                             ("...ij,...jk->...ik", [(2, 3, 4), (4, 5)])]:
        inputs = {f"x{i}": randn(*shape, seed=i) for i, shape in enumerate(shapes)}
        check("Einsum", inputs, equation=equation)
        mod, _ = from_onnx(one_node("Einsum", inputs, equation=equation)[0])
        assert "einsum(" in str(mod)


# ---------------------------------------------------------------------------------------------
# normalization


BN_PARAMS = {"scale": randn(4, seed=1), "bias": randn(4, seed=2), "mean": randn(4, seed=3),
             "var": np.abs(randn(4, seed=4)) + 0.1}


@pytest.mark.parametrize("data", [X4, X3], ids=["2d", "1d"])
def test_batch_norm(data):
    check("BatchNormalization", {"x": data, **BN_PARAMS}, weights=list(BN_PARAMS), opset=15,
          epsilon=1e-3)


def test_batch_norm_at_opset_9():
    # onnx.reference runs opset 9-13 BatchNormalization in training mode: NumPy is the oracle.
    model, feeds = one_node("BatchNormalization", {"x": X4, **BN_PARAMS},
                            weights=list(BN_PARAMS), opset=9)
    scale, bias, mean, var = (v.reshape(-1, 1, 1).astype(np.float64) for v in BN_PARAMS.values())
    want = (X4 - mean) / np.sqrt(var + 1e-5) * scale + bias
    assert_close(ours(model, feeds)[0], want.astype(np.float32))


def test_batch_norm_per_activation_at_opset_7():
    params = [randn(4, 7, 8, seed=i) for i in range(4)]
    params[3] = np.abs(params[3]) + 0.1
    scale, bias, mean, var = params
    model, feeds = one_node("BatchNormalization",
                            {"x": X4, "s": scale, "b": bias, "m": mean, "v": var},
                            weights=["s", "b", "m", "v"], opset=7, spatial=0)
    want = (X4 - mean) / np.sqrt(var + 1e-5) * scale + bias
    assert_close(ours(model, feeds)[0], want.astype(np.float32))


def test_batch_norm_training_is_an_error():
    params = {n: np.ones(4, np.float32) for n in ("s", "b", "m", "v")}
    assert "eval mode" in import_error("BatchNormalization", {"x": X4, **params}, outputs=3,
                                       opset=15, training_mode=1)
    assert "eval mode" in import_error("BatchNormalization", {"x": X4, **params}, outputs=3)


@pytest.mark.parametrize("shape, axis, scale_shape", [
    ((2, 3, 8), -1, (8,)),
    ((2, 3, 4, 5), 2, (4, 5)),
    ((2, 3, 4, 5), 1, (3, 4, 5)),
    ((2, 3, 4), 1, (1, 4)),
    ((2, 3, 4), -1, (1, 1, 4)),
    ((2, 3, 4), -1, (3, 1)),  # broadcasts over a leading axis: applied elementwise
])
def test_layer_norm(shape, axis, scale_shape):
    check("LayerNormalization", {"x": randn(*shape), "s": randn(*scale_shape, seed=1),
                                 "b": randn(*scale_shape, seed=2)}, axis=axis, epsilon=1e-3)


def test_layer_norm_without_bias_and_with_statistics():
    check("LayerNormalization", {"x": randn(2, 3, 4), "s": randn(3, 4, seed=1)}, weights=["s"],
          axis=1, outputs=3)


@pytest.mark.parametrize("data", [X4, X3], ids=["2d", "1d"])
def test_instance_norm(data):
    check("InstanceNormalization", {"x": data, "s": randn(4, seed=1), "b": randn(4, seed=2)},
          epsilon=1e-3)


@pytest.mark.parametrize("opset", [18, 21])
def test_group_norm_scales_per_group_then_per_channel(opset):
    params = 2 if opset < 21 else 4  # opset 21 moved scale and bias to the channels
    check("GroupNormalization", {"x": X4, "s": randn(params, seed=1), "b": randn(params, seed=2)},
          opset=opset, num_groups=2, epsilon=1e-3)
    check("GroupNormalization", {"x": X3, "s": randn(4, seed=1), "b": randn(4, seed=2)},
          opset=21, num_groups=4)


@pytest.mark.parametrize("axis", [-1, 1, 0])
def test_rms_norm(axis):
    x = randn(2, 3, 4)
    check("RMSNormalization", {"x": x, "s": randn(*x.shape[axis:], seed=1)}, opset=23,
          axis=axis)


@pytest.mark.parametrize("size", [3, 4])
def test_lrn(size):
    # onnx.reference's LRN loops over the batch instead of the channels: NumPy is the oracle.
    x = randn(2, 6, 3, 4).astype(np.float64)
    before, after = (size - 1) // 2, size - (size - 1) // 2 - 1
    squares = np.pad(x * x, ((0, 0), (before, after), (0, 0), (0, 0)))
    sums = sum(squares[:, i:i + x.shape[1]] for i in range(size))
    want = x / (1.5 + 1e-3 / size * sums) ** 0.6
    model, feeds = one_node("LRN", {"x": x.astype(np.float32)}, size=size, alpha=1e-3,
                            beta=0.6, bias=1.5)
    assert_close(ours(model, feeds)[0], want.astype(np.float32))


@pytest.mark.parametrize("p, axis", [(1, 1), (2, 1), (1, -1), (2, -1)])
def test_lp_normalization(p, axis):
    # onnx.reference leaves out the |x| of the 1-norm: NumPy is the oracle.
    x = X4.copy()
    x[0, :, 0, :] = 0  # zero slices along both axes normalize to zero
    x[0, :, :, 0] = 0
    wide = x.astype(np.float64)
    norm = (np.abs(wide) ** p).sum(axis=axis, keepdims=True) ** (1 / p)
    want = np.where(norm == 0, 0, wide / np.where(norm == 0, 1, norm)).astype(np.float32)
    model, feeds = one_node("LpNormalization", {"x": x}, axis=axis, p=p)
    assert_close(ours(model, feeds)[0], want)


def test_mean_variance_normalization():
    check("MeanVarianceNormalization", {"x": X4})
    check("MeanVarianceNormalization", {"x": X3}, axes=[2])


# ---------------------------------------------------------------------------------------------
# softmax family


@pytest.mark.parametrize("op_type", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_softmax_family_opset_13_single_axis(op_type, axis):
    check(op_type, {"x": randn(2, 3, 4)}, opset=13, axis=axis)


def coerced_oracle(op_type, x, axis):
    """ONNX before opset 13: flatten to 2-D at ``axis``, apply along the rows, restore."""
    flat = x.reshape(int(np.prod(x.shape[:axis])), -1).astype(np.float64)
    shifted = flat - flat.max(axis=1, keepdims=True)
    log_total = np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    if op_type == "Softmax":
        out = np.exp(shifted - log_total)
    elif op_type == "LogSoftmax":
        out = shifted - log_total
    else:
        out = np.zeros_like(flat)
        out[np.arange(len(flat)), flat.argmax(axis=1)] = 1
    return out.reshape(x.shape).astype(x.dtype)


@pytest.mark.parametrize("op_type", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("axis", [None, 0, 1, 2])
def test_softmax_family_opset_11_coerces_to_2d(op_type, axis):
    # onnx.reference ignores the coercion (and opset 11's default axis of 1): use NumPy.
    x = randn(2, 3, 4)
    attrs = {} if axis is None else {"axis": axis}
    model, feeds = one_node(op_type, {"x": x}, opset=11, **attrs)
    assert_close(ours(model, feeds)[0], coerced_oracle(op_type, x, 1 if axis is None else axis))


# ---------------------------------------------------------------------------------------------
# activations

XA = np.concatenate([randn(3, 20), np.array([[-80.0, -20.0, 0.0, 20.0, 90.0]] * 3,
                                            np.float32)], axis=1)


@pytest.mark.parametrize("op_type, attrs, opset", [
    ("HardSigmoid", {}, 17), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, 17),
    ("HardSwish", {}, 17), ("Elu", {}, 17), ("Elu", {"alpha": 0.5}, 17), ("Selu", {}, 17),
    ("Selu", {"alpha": 2.0, "gamma": 3.0}, 17), ("Celu", {}, 17), ("Celu", {"alpha": 2.0}, 17),
    ("Softplus", {}, 17), ("Softsign", {}, 17), ("ThresholdedRelu", {}, 17),
    ("ThresholdedRelu", {"alpha": 0.5}, 17), ("Mish", {}, 18), ("Gelu", {}, 20),
    ("Gelu", {"approximate": "tanh"}, 20), ("Shrink", {}, 17),
    ("Shrink", {"lambd": 0.7, "bias": 0.2}, 17), ("Swish", {"alpha": 0.5}, 24),
])
def test_activations_including_large_inputs(op_type, attrs, opset):
    check(op_type, {"x": XA}, opset=opset, **attrs)


@pytest.mark.parametrize("slope_shape", [(4, 1, 1), (1,), (1, 1, 1, 1), (7, 8), (1, 4, 7, 1),
                                         ()])
@pytest.mark.parametrize("constant", [True, False])
def test_prelu_broadcasts_the_slope(slope_shape, constant):
    slope = np.asarray(randn(*slope_shape, seed=1))
    check("PRelu", {"x": X4, "slope": slope}, weights=["slope"] if constant else [])


def test_swiglu_gates_the_second_input():
    check("SwiGLU", {"a": XA, "b": randn(*XA.shape, seed=1)}, opset=28, alpha=1.5)


def test_prelu_2d_data_with_per_channel_slope():
    check("PRelu", {"x": randn(3, 5), "slope": randn(5, seed=1)}, weights=["slope"])


def test_prelu_before_opset_7_lays_a_1d_slope_along_the_channels():
    slope = randn(4, seed=1)
    model, feeds = one_node("PRelu", {"x": X4, "slope": slope}, weights=["slope"], opset=6)
    want = np.where(X4 > 0, X4, X4 * slope.reshape(4, 1, 1))
    assert_close(ours(model, feeds)[0], want)


# ---------------------------------------------------------------------------------------------
# dropout


@pytest.mark.parametrize("opset", [10, 13])
def test_dropout_is_the_identity_with_an_all_true_mask(opset):
    check("Dropout", {"x": X4}, opset=opset)
    check("Dropout", {"x": X4}, opset=opset, outputs=2)


def test_dropout_mask_before_opset_10_has_the_data_type():
    model, feeds = one_node("Dropout", {"x": X4}, opset=9, outputs=2, ratio=0.3)
    y, mask = ours(model, feeds)
    assert_close(y, X4)
    assert_close(mask, np.ones_like(X4))


def test_dropout_training_mode():
    ratio, training = np.array(0.0, np.float32), np.array(True)
    check("Dropout", {"x": X4, "r": ratio, "t": training}, weights=["r", "t"], outputs=2)
    message = import_error("Dropout", {"x": X4, "r": np.array(0.5, np.float32), "t": training},
                           weights=["r", "t"])
    assert "eval mode" in message
