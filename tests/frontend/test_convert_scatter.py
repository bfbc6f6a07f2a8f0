"""The scatter family and small index ops (ScatterElements, ScatterND, TensorScatter,
CumProd, EyeLike, BitCast, ReverseSequence, MaxUnpool, MaxPool's Indices, Det, Col2Im,
Compress, Unique): imported graphs agree with onnx.reference, compiled ones too, and
out-of-range indices raise an opfusion error, never write out of bounds."""

import numpy as np
import pytest

pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx_one_node import check_model  # noqa: E402

import opfusion as opf  # noqa: E402
from opfusion.errors import IndexOutOfRangeError, OpfusionError  # noqa: E402
from opfusion.frontend import from_onnx  # noqa: E402
from opfusion.testing import assert_close  # noqa: E402

rng = np.random.default_rng(3)
FLOAT = TensorProto.FLOAT


def one_node(op_type, inputs, consts=None, outputs=("y",), opset=18, **attrs):
    consts = consts or {}
    node = helper.make_node(op_type, list(inputs) + list(consts), list(outputs), **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in outputs],
        [numpy_helper.from_array(a, n) for n, a in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def check(proto, feeds, compiled=False):
    check_model(proto, feeds, compiled=compiled)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements_every_reduction_with_negative_indices(reduction):
    data = rng.standard_normal((4, 5)).astype(np.float32)
    indices = rng.integers(-4, 4, (3, 5)).astype(np.int64)
    updates = rng.standard_normal((3, 5)).astype(np.float32)
    if reduction == "none":  # duplicates make "none" order-dependent: one index per column
        indices = np.array([[0, 1, -1, 2, 3], [1, 2, 0, -1, 0], [2, 3, 1, 0, -3]], np.int64)
    check(one_node("ScatterElements", {"data": data, "indices": indices, "updates": updates},
                   axis=0, reduction=reduction), {"data": data, "indices": indices,
                                                  "updates": updates},
          compiled=reduction == "add")


@pytest.mark.parametrize("reduction", ["none", "add", "max"])
def test_scatter_nd_slices(reduction):
    data = rng.standard_normal((4, 3, 2)).astype(np.float32)
    indices = np.array([[[0, 1]], [[-1, 2]]], np.int64)
    updates = rng.standard_normal((2, 1, 2)).astype(np.float32)
    feeds = {"data": data, "indices": indices, "updates": updates}
    check(one_node("ScatterND", feeds, reduction=reduction), feeds, compiled=True)


def test_duplicate_indices_without_reduction_keep_the_last_update():
    """ONNX's reference writes in order, so the last of several updates to one element wins
    (NumPy's fancy assignment does not promise that; the references make it explicit)."""
    data = rng.standard_normal((5, 3)).astype(np.float32)
    indices = np.array([[1, 0, 4], [-4, 2, -1], [3, 0, 4], [1, -5, 2]], np.int64)
    updates = rng.standard_normal((4, 3)).astype(np.float32)
    feeds = {"data": data, "indices": indices, "updates": updates}
    check(one_node("ScatterElements", feeds, axis=0), feeds, compiled=True)
    nd_indices = np.array([[[1], [3]], [[-4], [0]], [[1], [-2]]], np.int64)
    nd_updates = rng.standard_normal((3, 2, 3)).astype(np.float32)
    feeds = {"data": data, "indices": nd_indices, "updates": nd_updates}
    check(one_node("ScatterND", feeds), feeds)
    tuples = np.array([[0, 1], [4, 2], [0, 1], [-5, -2], [2, 0]], np.int64)
    feeds = {"data": data, "indices": tuples, "updates": rng.standard_normal(5).astype(
        np.float32)}
    check(one_node("ScatterND", feeds), feeds)


@pytest.mark.parametrize("reduction", ["mul", "min"])
def test_scatter_nd_reductions_on_duplicates(reduction):
    data = rng.standard_normal((3, 4)).astype(np.float32)
    indices = np.array([[0, 1], [2, 3], [0, 1], [-3, -3]], np.int64)
    updates = rng.standard_normal(4).astype(np.float32)
    feeds = {"data": data, "indices": indices, "updates": updates}
    check(one_node("ScatterND", feeds, reduction=reduction), feeds)


@pytest.mark.parametrize("op_type,attrs", [("ScatterElements", {"axis": 1}), ("ScatterND", {})])
def test_out_of_range_indices_raise_in_the_interpreter_and_compiled(op_type, attrs):
    data = np.zeros((3, 4), np.float32)
    if op_type == "ScatterND":
        indices, updates = np.array([[1, 4]], np.int64), np.ones(1, np.float32)
    else:
        indices, updates = np.array([[0, 9]], np.int64), np.ones((1, 2), np.float32)
    feeds = {"data": data, "indices": indices, "updates": updates}
    mod, params = from_onnx(one_node(op_type, feeds, **attrs))
    with pytest.raises(IndexOutOfRangeError, match="scatter"):
        opf.ir.evaluate(mod, feeds)
    exe = opf.compile(mod, params=params)
    with pytest.raises(OpfusionError, match="out of range"):
        exe.run(feeds)
    # in range counted from the end: fine
    feeds["indices"] = np.array([[1, -4]] if op_type == "ScatterND" else [[0, -4]], np.int64)
    exe.run(feeds)


@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter_writes_a_kv_cache(mode):
    cache = rng.standard_normal((2, 3, 6, 4)).astype(np.float32)
    update = rng.standard_normal((2, 3, 2, 4)).astype(np.float32)
    write = np.array([1, 5 if mode == "circular" else 4], np.int64)
    feeds = {"cache": cache, "update": update, "write": write}
    check(one_node("TensorScatter", feeds, opset=24, mode=mode, axis=2), feeds,
          compiled=mode == "circular")
    if mode == "linear":
        feeds["write"] = np.array([1, 5], np.int64)  # 5 + 2 steps do not fit in 6
        mod, _ = from_onnx(one_node("TensorScatter", feeds, opset=24, axis=2))
        with pytest.raises(IndexOutOfRangeError, match="tensor_scatter"):
            opf.ir.evaluate(mod, feeds)
        feeds["write"] = np.array([-1, 0], np.int64)  # linear mode does not wrap
        with pytest.raises(IndexOutOfRangeError, match="write index -1"):
            opf.ir.evaluate(mod, feeds)


@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumprod(exclusive, reverse):
    x = rng.uniform(0.5, 1.5, (3, 4)).astype(np.float32)
    check(one_node("CumProd", {"x": x}, {"axis": np.array(1, np.int64)}, opset=26,
                   exclusive=exclusive, reverse=reverse), {"x": x}, compiled=exclusive == 1)


def test_eyelike_bitcast_det_reverse_sequence():
    x = rng.standard_normal((3, 5)).astype(np.float32)
    check(one_node("EyeLike", {"x": x}, k=1, dtype=TensorProto.INT32), {"x": x})
    check(one_node("BitCast", {"x": x}, opset=26, to=TensorProto.INT32), {"x": x},
          compiled=True)
    m = rng.standard_normal((2, 3, 3)).astype(np.float32)
    check(one_node("Det", {"m": m}), {"m": m})
    seq = rng.standard_normal((4, 3, 2)).astype(np.float32)
    lengths = np.array([4, 1, 3], np.int64)
    proto = one_node("ReverseSequence", {"seq": seq, "lengths": lengths}, batch_axis=1,
                     time_axis=0)
    check(proto, {"seq": seq, "lengths": lengths}, compiled=True)
    mod, _ = from_onnx(proto)
    with pytest.raises(IndexOutOfRangeError, match=r"sequence_lens\[0\] = 5"):
        opf.ir.evaluate(mod, {"seq": seq, "lengths": np.array([5, 1, 3], np.int64)})


def test_max_pool_indices_and_max_unpool_round_trip():
    x = rng.standard_normal((1, 2, 5, 5)).astype(np.float32)
    for order in (0, 1):
        check(one_node("MaxPool", {"x": x}, outputs=("y", "i"), kernel_shape=[2, 2],
                       strides=[2, 2], pads=[0, 0, 1, 1], storage_order=order), {"x": x},
              compiled=order == 0)
    check(one_node("MaxPool", {"x": x}, outputs=("y", "i"), kernel_shape=[3, 2],
                   strides=[1, 2], dilations=[1, 2], ceil_mode=1), {"x": x})
    line = rng.standard_normal((2, 3, 7)).astype(np.float32)
    check(one_node("MaxPool", {"x": line}, outputs=("y", "i"), kernel_shape=[3], strides=[2],
                   pads=[1, 1]), {"x": line}, compiled=True)
    pooled = rng.standard_normal((1, 2, 2, 2)).astype(np.float32)
    indices = np.array([[[[0, 3], [10, 13]], [[16, 19], [26, 29]]]], np.int64)
    feeds = {"p": pooled, "i": indices}
    check(one_node("MaxUnpool", feeds, kernel_shape=[2, 2], strides=[2, 2]), feeds,
          compiled=True)
    check(one_node("MaxUnpool", feeds, {"shape": np.array([1, 2, 5, 5], np.int64)},
                   kernel_shape=[2, 2], strides=[2, 2]), feeds)
    feeds["i"] = indices + 40  # past the 32 elements pooled from
    mod, _ = from_onnx(one_node("MaxUnpool", feeds, kernel_shape=[2, 2], strides=[2, 2]))
    with pytest.raises(IndexOutOfRangeError, match="max_unpool"):
        opf.ir.evaluate(mod, feeds)


def test_col2im_with_strides_pads_dilations():
    cols = rng.standard_normal((1, 2 * 4, 9)).astype(np.float32)
    check(one_node("Col2Im", {"cols": cols}, {"image": np.array([5, 5], np.int64),
                                              "block": np.array([2, 2], np.int64)},
                   strides=[2, 2], pads=[1, 1, 1, 1], dilations=[1, 1]), {"cols": cols},
          compiled=True)


@pytest.mark.parametrize("sort", [0, 1])
def test_unique_and_compress_fold_their_values(sort):
    x = np.array([[1, 3], [1, 3], [2, 0], [0, 2]], np.float32)
    proto = one_node("Unique", {}, {"x": x}, outputs=("y", "first", "inverse", "counts"),
                     sorted=sort, axis=0)
    check(proto, {})
    data = rng.standard_normal((3, 4)).astype(np.float32)
    check(one_node("Compress", {"data": data}, {"c": np.array([1, 0, 1], bool)}, axis=0),
          {"data": data}, compiled=True)


def test_swin_style_window_mask_with_scatter_nd_matches_onnxruntime():
    """A window mask built at run time: ScatterND of computed region ids into zeros at
    computed rows (a TopK permutation), then the pairwise comparison and an additive mask on
    attention scores (Swin's shifted windows)."""
    ort = pytest.importorskip("onnxruntime")
    node = helper.make_node
    nodes = [
        node("Constant", [], ["zeros"], value=numpy_helper.from_array(
            np.zeros((4, 4), np.float32), "zeros")),
        node("ReduceMean", ["x"], ["level"], keepdims=1, axes=[1]),
        node("Reshape", ["level", "grid_shape"], ["region"]),
        # the rows written: a permutation of 0..3 that the input decides
        node("ReduceMean", ["region"], ["key"], keepdims=0, axes=[1]),
        node("TopK", ["key", "four"], ["top", "order"]),
        node("Unsqueeze", ["order", "one"], ["rows"]),
        node("ScatterND", ["zeros", "rows", "region"], ["grid"]),
        node("Reshape", ["grid", "flat_shape"], ["flat"]),
        node("Unsqueeze", ["flat", "one"], ["a"]),
        node("Unsqueeze", ["flat", "zero"], ["b"]),
        node("Sub", ["a", "b"], ["diff"]),
        node("Abs", ["diff"], ["distance"]),
        node("Mul", ["distance", "penalty"], ["mask"]),
        node("MatMul", ["x", "xt"], ["scores"]),
        node("Sub", ["scores", "mask"], ["masked"]),
        node("Softmax", ["masked"], ["y"], axis=-1),
    ]
    consts = {"grid_shape": np.array([4, 4], np.int64), "flat_shape": np.array([16], np.int64),
              "one": np.array([1], np.int64), "zero": np.array([0], np.int64),
              "four": np.array([4], np.int64),
              "penalty": np.array(100.0, np.float32),
              "xt": rng.standard_normal((4, 16)).astype(np.float32)}
    graph = helper.make_graph(
        nodes, "swin_mask", [helper.make_tensor_value_info("x", FLOAT, [16, 4])],
        [helper.make_tensor_value_info("y", FLOAT, [16, 16])],
        [numpy_helper.from_array(a, n) for n, a in consts.items()])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    mod, params = from_onnx(proto)
    exe = opf.compile(mod, params=params)
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal((16, 4)).astype(np.float32)
        assert_close(exe.run({"x": x})[0], session.run(None, {"x": x})[0], rtol=1e-5)
