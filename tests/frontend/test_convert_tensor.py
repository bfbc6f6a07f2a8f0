"""Tensor ONNX converters (shape, indexing, constants, padding, reductions, sorting, resizing):
imported graphs agree with onnx.reference at the opsets before and after each
attribute-to-input move, and shape arithmetic folds away at import."""

import numpy as np
import pytest

pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import opfusion as opf  # noqa: E402
from opfusion.frontend import from_onnx  # noqa: E402
from opfusion.testing import assert_close  # noqa: E402

rng = np.random.default_rng(7)
X = rng.standard_normal((2, 3, 4)).astype(np.float32)
IMAGE = rng.standard_normal((1, 2, 4, 5)).astype(np.float32)
INT64_MAX = np.iinfo(np.int64).max


def make_model(nodes, inputs, consts=None, outputs=("y",), opset=17):
    """A graph over ``inputs`` (graph inputs, name -> array) and ``consts`` (initializers)."""
    def info(name, array):
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(array.dtype),
                                             array.shape)

    inits = [helper.make_tensor(name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape,
                                a.reshape(-1).tolist()) for name, a in (consts or {}).items()]
    graph = helper.make_graph(
        nodes, "g", [info(n, a) for n, a in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in outputs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def check(op_type, inputs, consts=None, opset=17, outputs=("y",), rtol=1e-5, names=None,
          **attrs):
    """One node over ``inputs`` then ``consts`` (or in the order ``names`` gives; '' leaves
    an input out): import, evaluate, compare with onnx.reference. Returns the module."""
    consts = dict(consts or {})
    names = names or list(inputs) + list(consts)
    node = helper.make_node(op_type, names, list(outputs), **attrs)
    consts.pop("", None)
    model = make_model([node], inputs, consts, outputs, opset)
    want = ReferenceEvaluator(model).run(None, inputs)
    mod, _ = from_onnx(model)
    got = opf.ir.evaluate(mod, inputs)
    assert_close(got, want[0] if len(want) == 1 else tuple(want), rtol=rtol)
    return mod


def ints(*values):
    return np.array(values, np.int64)


def calls(mod):
    return [node.op.name for node in opf.ir.post_order(mod["main"].body)
            if isinstance(node, opf.ir.Call)]


# -- shape arithmetic folds at import --------------------------------------------------------

def test_shape_gather_unsqueeze_concat_reshape_folds_to_one_reshape():
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axis0"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    consts = {"zero": np.array(0, np.int64), "axis0": ints(0), "minus_one": ints(-1)}
    model = make_model(nodes, {"x": X}, consts, opset=13)
    mod, _ = from_onnx(model)
    assert calls(mod) == ["reshape"]
    assert_close(opf.ir.evaluate(mod, {"x": X}), X.reshape(2, 12))


def test_a_shape_input_computed_at_run_time_is_a_clear_error():
    model = make_model([helper.make_node("Reshape", ["x", "s"], ["y"])],
                       {"x": X, "s": ints(6, 4)}, opset=13)
    with pytest.raises(opf.OpfusionError, match=r"Reshape \(node 'y', opset 13\): input 1 "
                                                r"\(shape\) must be a constant known at import"):
        from_onnx(model, data_dependent="raise")
    staged, _ = from_onnx(model)  # by default: run in stages, specialized on the shape's value
    assert type(staged).__name__ == "OnnxStagedModel"


# -- shape and layout ------------------------------------------------------------------------

@pytest.mark.parametrize("axis, opset", [(0, 9), (2, 9), (-1, 13), (3, 13)])
def test_flatten(axis, opset):
    check("Flatten", {"x": X}, opset=opset, axis=axis)


def test_reshape_copies_zeros_and_infers_minus_one():
    check("Reshape", {"x": X}, {"s": ints(0, -1)}, opset=5)
    check("Reshape", {"x": X}, {"s": ints(4, 0, -1)}, opset=13)


def test_reshape_allowzero_makes_real_zero_dimensions():
    empty = np.zeros((0, 3), np.float32)
    check("Reshape", {"x": empty}, {"s": ints(3, 0)}, opset=14, allowzero=1)
    check("Reshape", {"x": X}, {"s": ints(6, 4)}, opset=14, allowzero=1)


def test_transpose_with_and_without_perm():
    check("Transpose", {"x": X}, perm=[1, 2, 0])
    check("Transpose", {"x": X})


def test_squeeze_axes_attribute_then_input():
    data = X.reshape(2, 1, 3, 1, 4)
    check("Squeeze", {"x": data}, opset=11, axes=[-2])
    check("Squeeze", {"x": data}, opset=11)
    check("Squeeze", {"x": data}, {"axes": ints(1, 3)}, opset=13)
    check("Squeeze", {"x": data}, opset=13)


def test_unsqueeze_axes_attribute_then_input():
    check("Unsqueeze", {"x": X}, opset=11, axes=[0, -1])
    check("Unsqueeze", {"x": X}, {"axes": ints(4, 1)}, opset=13)


def test_concat():
    check("Concat", {"a": X, "b": X[:, :1], "c": X[:, 1:]}, axis=1)
    check("Concat", {"a": X, "b": X}, axis=-1, opset=7)


def test_split_attribute_input_and_num_outputs():
    two = ("y0", "y1")
    check("Split", {"x": X}, opset=11, outputs=two, axis=1, split=[1, 2])
    check("Split", {"x": X}, opset=11, outputs=two, axis=-1)
    check("Split", {"x": X}, {"split": ints(3, 1)}, opset=13, outputs=two, axis=2)
    check("Split", {"x": X}, opset=13, outputs=two)
    # opset 18: num_outputs pieces of ceil(4 / 3) = 2, the last one smaller.
    check("Split", {"x": X}, opset=18, outputs=("y0", "y1", "y2"), axis=2, num_outputs=3)


def test_slice_attributes_before_opset_10():
    check("Slice", {"x": X}, opset=9, starts=[1, -3], ends=[INT64_MAX, -1], axes=[2, 1])
    check("Slice", {"x": X}, opset=7, starts=[0, 1], ends=[1, 3])


def test_slice_inputs_with_negative_steps_and_clamping():
    consts = {"starts": ints(-1, 0), "ends": ints(-INT64_MAX, 10), "axes": ints(2, 1),
              "steps": ints(-2, 2)}
    check("Slice", {"x": X}, consts, opset=13)
    check("Slice", {"x": X}, {"starts": ints(1), "ends": ints(2)}, opset=10)


def test_expand_broadcasts_both_ways():
    check("Expand", {"x": X[:, :1]}, {"s": ints(3, 2, 1, 4)}, opset=8)
    check("Expand", {"x": X}, {"s": ints(1, 1)}, opset=13)


def test_tile():
    check("Tile", {"x": X}, {"r": ints(2, 1, 3)})


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space(mode):
    data = rng.standard_normal((1, 8, 2, 3)).astype(np.float32)
    check("DepthToSpace", {"x": data}, opset=13, blocksize=2, mode=mode)


def test_space_to_depth_and_its_opset_28_mode():
    data = rng.standard_normal((1, 2, 4, 6)).astype(np.float32)
    check("SpaceToDepth", {"x": data}, opset=13, blocksize=2)
    check("SpaceToDepth", {"x": data}, opset=28, blocksize=2, mode="CRD")


# -- indexing --------------------------------------------------------------------------------

def test_gather_with_negative_and_scalar_indices():
    check("Gather", {"x": X}, {"i": ints(-1, 0, 2)}, axis=1)
    check("Gather", {"x": X}, {"i": np.array(-1, np.int64)}, axis=-1)
    check("Gather", {"x": X, "i": np.array([[1, 0]], np.int32)})


def test_gather_elements():
    index = rng.integers(-3, 3, size=(2, 2, 4)).astype(np.int64)
    check("GatherElements", {"x": X, "i": index}, axis=1)


@pytest.mark.parametrize("batch_dims, index", [
    (0, np.array([[0, 1], [1, -1]], np.int64)),
    (0, np.array([[[1]], [[0]]], np.int64)),
    (1, np.array([[2, 1], [0, 3]], np.int64)),
    (1, np.array([[1], [0]], np.int64)),
])
def test_gather_nd(batch_dims, index):
    check("GatherND", {"x": X, "i": index}, opset=13, batch_dims=batch_dims)


def test_one_hot_with_negative_and_out_of_range_indices():
    indices = np.array([[0, -1, 2], [5, 1, -4]], np.int64)
    values = np.array([-1.0, 3.0], np.float32)
    check("OneHot", {"i": indices}, {"depth": np.array(4, np.int64), "v": values}, opset=11)
    check("OneHot", {"i": indices.astype(np.float32)},
          {"depth": np.array(3.0, np.float32), "v": values}, opset=11, axis=0)


@pytest.mark.parametrize("upper", [0, 1])
def test_trilu(upper):
    check("Trilu", {"x": X}, upper=upper, opset=14)
    check("Trilu", {"x": X}, {"k": np.array(-1, np.int64)}, upper=upper, opset=14)


def test_non_zero_of_a_constant_folds():
    mask = np.array([[1, 0, 2], [0, 0, 3]], np.int32)
    mod = check("NonZero", {}, {"m": mask}, opset=13)
    assert calls(mod) == []


# -- constants and shape arithmetic ----------------------------------------------------------

def test_shape_with_start_and_end_and_size():
    check("Shape", {"x": X})
    check("Shape", {"x": X}, opset=15, start=1)
    check("Shape", {"x": X}, opset=15, start=-2, end=-1)
    check("Size", {"x": X})


def test_constant_of_shape():
    check("ConstantOfShape", {}, {"s": ints(2, 3)}, opset=9)
    value = helper.make_tensor("v", TensorProto.INT32, [1], [7])
    check("ConstantOfShape", {}, {"s": ints(4)}, opset=20, value=value)


def test_constant_forms():
    tensor = helper.make_tensor("t", TensorProto.FLOAT, [2, 2], [1, 2, 3, 4])
    check("Constant", {}, opset=9, value=tensor)
    check("Constant", {}, opset=13, value_floats=[1.5, 2.5])
    check("Constant", {}, opset=13, value_int=3)
    check("Constant", {}, opset=13, value_ints=[3, 4])


def test_sparse_and_string_constants_are_errors():
    sparse = helper.make_sparse_tensor(helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0]),
                                       helper.make_tensor("i", TensorProto.INT64, [1], [0]), [3])
    for attrs in ({"sparse_value": sparse}, {"value_string": "text"}):
        node = helper.make_node("Constant", [], ["y"], **attrs)
        with pytest.raises(opf.OpfusionError, match="sparse|not supported"):
            from_onnx(make_model([node], {}, opset=13))


def test_range():
    check("Range", {}, {"a": np.array(10, np.int64), "b": np.array(1, np.int64),
                        "d": np.array(-3, np.int64)}, opset=11)
    check("Range", {}, {"a": np.array(0.5, np.float32), "b": np.array(2.0, np.float32),
                        "d": np.array(0.3, np.float32)}, opset=11)
    check("Range", {}, {"a": np.array(1, np.int32), "b": np.array(1, np.int32),
                        "d": np.array(1, np.int32)}, opset=11)


# -- padding ---------------------------------------------------------------------------------

def test_pad_attributes_before_opset_11():
    check("Pad", {"x": X}, opset=10, pads=[0, 1, 2, 1, 0, 0], value=1.5)
    check("Pad", {"x": X}, opset=7, pads=[0, 0, 1, 0, 0, 2], mode="edge")


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect"])
def test_pad_inputs(mode):
    consts = {"p": ints(1, 0, 2, 0, 2, 1)}
    if mode == "constant":
        consts["v"] = np.array(-2.0, np.float32)
    check("Pad", {"x": X}, consts, opset=13, mode=mode)


def test_pad_with_a_run_time_constant_value():
    check("Pad", {"x": X, "v": np.array(0.25, np.float32)}, {"p": ints(0, 1, 1, 0, 0, 2)},
          opset=13, names=["x", "p", "v"])


def test_pad_axes_and_wrap():
    check("Pad", {"x": X}, {"p": ints(1, 2, 0, 3), "": None, "axes": ints(-1, 0)}, opset=18)
    check("Pad", {"x": X}, {"p": ints(0, 2, 5, 1, 1, 0)}, opset=19, mode="wrap")


def test_negative_pads_crop():
    node = helper.make_node("Pad", ["x", "p"], ["y"])
    model = make_model([node], {"x": X}, {"p": ints(0, -1, 2, 0, 1, -3)}, opset=13)
    mod, _ = from_onnx(model)
    want = np.pad(X[:, 1:, :1], [(0, 0), (0, 1), (2, 0)])
    assert_close(opf.ir.evaluate(mod, {"x": X}), want)


# -- reductions ------------------------------------------------------------------------------

REDUCE_OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
              "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]
POSITIVE = np.abs(X) + 0.5


@pytest.mark.parametrize("op_type", REDUCE_OPS)
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_axes_attribute(op_type, keepdims):
    check(op_type, {"x": POSITIVE}, opset=11, axes=[0, -1], keepdims=keepdims)
    check(op_type, {"x": POSITIVE}, opset=11, keepdims=keepdims)


@pytest.mark.parametrize("op_type", REDUCE_OPS)
def test_reduce_axes_input(op_type):
    opset = 13 if op_type == "ReduceSum" else 18
    check(op_type, {"x": POSITIVE}, {"axes": ints(1)}, opset=opset, keepdims=0)
    check(op_type, {"x": POSITIVE}, {"axes": ints(-1, 0)}, opset=opset)
    check(op_type, {"x": POSITIVE}, opset=opset, keepdims=0)
    # No axes with noop_with_empty_axes: each element reduced alone (ReduceSumSquare: x * x).
    data = POSITIVE if op_type == "ReduceLogSum" else X
    mod = check(op_type, {"x": data}, opset=opset, noop_with_empty_axes=1)
    assert len(calls(mod)) <= 1


def test_reduce_sum_on_integers_and_mean_truncates():
    data = rng.integers(-50, 50, size=(3, 4)).astype(np.int32)
    check("ReduceSum", {"x": data}, {"axes": ints(1)}, opset=13)
    check("ReduceMean", {"x": data}, opset=11, axes=[0])


@pytest.mark.filterwarnings("ignore:divide by zero encountered in log")
def test_reduce_log_sum_exp_is_stable_for_large_values():
    data = np.array([[1000.0, 999.0, -np.inf], [-np.inf, -np.inf, -np.inf]], np.float32)
    node = helper.make_node("ReduceLogSumExp", ["x"], ["y"], axes=[1], keepdims=0)
    mod, _ = from_onnx(make_model([node], {"x": data}, opset=13))
    want = np.array([1000 + np.log1p(np.exp(-1.0)), -np.inf], np.float32)
    assert_close(opf.ir.evaluate(mod, {"x": data}), want)


def test_reduce_max_of_bool_and_of_nothing():
    check("ReduceMax", {"x": X > 0}, {"axes": ints(1)}, opset=20)
    check("ReduceMin", {"x": X > 0}, opset=20, keepdims=0)
    empty = np.zeros((2, 0), np.float32)
    check("ReduceMax", {"x": empty}, {"axes": ints(1)}, opset=18)
    check("ReduceMin", {"x": empty.astype(np.int32)}, {"axes": ints(1)}, opset=18, keepdims=0)


@pytest.mark.parametrize("op_type", ["ArgMax", "ArgMin"])
def test_arg_reduce_with_ties_and_select_last_index(op_type):
    data = np.array([[1, 3, 3, 0], [2, 0, 0, 2]], np.float32)
    check(op_type, {"x": data}, opset=11, axis=1)
    check(op_type, {"x": data}, opset=12, axis=-1, keepdims=0, select_last_index=1)
    check(op_type, {"x": X}, opset=13)


# -- sorting and scans -----------------------------------------------------------------------

def test_topk_attribute_then_input():
    two = ("values", "indices")
    check("TopK", {"x": X}, opset=9, outputs=two, k=2, axis=1)
    check("TopK", {"x": X}, {"k": ints(3)}, opset=10, outputs=two)
    check("TopK", {"x": X}, {"k": ints(2)}, opset=11, outputs=two, axis=0, largest=0)


@pytest.mark.parametrize("exclusive, reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumsum(exclusive, reverse):
    check("CumSum", {"x": X}, {"axis": np.array(-2, np.int64)}, opset=14,
          exclusive=exclusive, reverse=reverse)
    check("CumSum", {"x": X.astype(np.int32)}, {"axis": np.array(0, np.int32)}, opset=11)


# -- resizing --------------------------------------------------------------------------------

def resize_consts(scales=None, sizes=None):
    consts = {"roi": np.zeros(0, np.float32)}
    consts["scales"] = np.array(scales or [], np.float32)
    if sizes is not None:
        consts["sizes"] = ints(*sizes)
    return consts


@pytest.mark.parametrize("mode, coordinates", [
    ("nearest", "asymmetric"), ("nearest", "half_pixel"), ("linear", "half_pixel"),
    ("linear", "align_corners"), ("linear", "pytorch_half_pixel"), ("cubic", "half_pixel"),
])
@pytest.mark.parametrize("scales", [[1, 1, 2, 1.5], [1, 1, 0.6, 0.7]])
def test_resize_scales_opset_11(mode, coordinates, scales):
    # Scales whose rounded sizes do not reproduce them (0.6 x 4 -> 2) keep the given scale in
    # the coordinate formulas, as onnx.reference.
    check("Resize", {"x": IMAGE}, resize_consts(scales), opset=11, mode=mode,
          coordinate_transformation_mode=coordinates)


@pytest.mark.parametrize("nearest_mode", ["round_prefer_ceil", "floor", "ceil"])
def test_resize_sizes_opset_13(nearest_mode):
    consts = {"roi": np.zeros(0, np.float32), **resize_consts(sizes=(1, 2, 7, 3))}
    check("Resize", {"x": IMAGE}, consts, opset=13, mode="nearest", nearest_mode=nearest_mode)
    check("Resize", {"x": IMAGE}, consts, opset=13, mode="cubic", exclude_outside=1,
          cubic_coeff_a=-0.5)


def test_resize_axes_and_keep_aspect_ratio_opset_18():
    consts = {"roi": np.zeros(0, np.float32), "scales": np.zeros(0, np.float32),
              "sizes": ints(3, 8)}
    for policy in ("stretch", "not_larger", "not_smaller"):
        check("Resize", {"x": IMAGE}, consts, opset=18, mode="linear", axes=[2, 3],
              keep_aspect_ratio_policy=policy)
    scales = {"": None, "scales": np.array([2.5], np.float32)}
    want = check("Resize", {"x": IMAGE}, scales, opset=18, mode="linear", axes=[3])
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear", axes=[-1])
    mod, _ = from_onnx(make_model([node], {"x": IMAGE}, {"scales": scales["scales"]}, opset=18))
    assert_close(opf.ir.evaluate(mod, {"x": IMAGE}), opf.ir.evaluate(want, {"x": IMAGE}))


def test_resize_half_pixel_symmetric_opset_19():
    check("Resize", {"x": IMAGE}, {"": None, "scales": np.array([1, 1, 1.7, 0.7], np.float32)},
          opset=19, mode="linear", coordinate_transformation_mode="half_pixel_symmetric")


def test_resize_antialias_growing_and_shrinking():
    # (shrinking goes to image.resample: more cases in test_convert_sampling.py)
    scales = {"": None, "scales": np.array([1, 1, 2, 1.5], np.float32)}
    check("Resize", {"x": IMAGE}, scales, opset=18, mode="linear", antialias=1)
    shrink = {"": None, "scales": np.array([1, 1, 0.5, 0.5], np.float32)}
    check("Resize", {"x": IMAGE}, shrink, opset=18, mode="linear", antialias=1)


def test_resize_of_rank_3_and_5_resizes_the_last_two_axes():
    check("Resize", {"x": X}, resize_consts([1, 2, 0.5]), opset=13, mode="linear")
    data = rng.standard_normal((1, 2, 2, 3, 3)).astype(np.float32)
    check("Resize", {"x": data}, resize_consts(sizes=(1, 2, 2, 6, 4)), opset=13, mode="nearest")


@pytest.mark.parametrize("attrs, scales, message", [
    ({}, [1, 2, 2, 2], r"resizing axis 1 \(scale 2, size 2 -> 4\) is not supported"),
])
def test_resize_unsupported_forms_are_errors(attrs, scales, message):
    node = helper.make_node("Resize", ["x", "roi", "scales"], ["y"], **attrs)
    model = make_model([node], {"x": IMAGE}, resize_consts(scales), opset=13)
    with pytest.raises(opf.OpfusionError, match=message):
        from_onnx(model)


def test_upsample_attribute_then_input():
    # onnx.reference runs only the input form; the attribute form must give the same numbers.
    node = helper.make_node("Upsample", ["x"], ["y"], scales=[1.0, 1.0, 2.0, 3.0])
    mod, _ = from_onnx(make_model([node], {"x": IMAGE}, opset=7))
    assert_close(opf.ir.evaluate(mod, {"x": IMAGE}), IMAGE.repeat(2, axis=2).repeat(3, axis=3))
    check("Upsample", {"x": IMAGE}, {"s": np.array([1, 1, 3, 2], np.float32)}, opset=9)


def test_upsample_linear_and_resize_10_are_asymmetric():
    data = np.arange(4, dtype=np.float32).reshape(1, 1, 1, 4)
    node = helper.make_node("Upsample", ["x", "s"], ["y"], mode="linear")
    model = make_model([node], {"x": data}, {"s": np.array([1, 1, 1, 2], np.float32)}, opset=9)
    mod, _ = from_onnx(model)
    want = np.array([0, 0.5, 1, 1.5, 2, 2.5, 3, 3], np.float32).reshape(1, 1, 1, 8)
    assert_close(opf.ir.evaluate(mod, {"x": data}), want)
    # Resize-10 nearest: floor when growing, ceil when shrinking (onnxruntime's rule).
    node = helper.make_node("Resize", ["x", "s"], ["y"], mode="nearest")
    model = make_model([node], {"x": IMAGE}, {"s": np.array([1, 1, 2, 0.5], np.float32)},
                       opset=10)
    mod, _ = from_onnx(model)
    want = IMAGE.repeat(2, axis=2)[..., [0, 2]]
    assert_close(opf.ir.evaluate(mod, {"x": IMAGE}), want)
