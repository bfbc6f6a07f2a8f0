"""The importer never materialises a constant beyond the folding limit: what ConstantOfShape,
Range and the converters' own shape-sized constants would make is an array only up to
FoldConstant.max_elements, else an operator (a broadcast, an arange) that compiles to a
kernel; beyond compile.max_allocation_bytes the constant, like a graph input, is refused at
once with a ResourceLimitError naming the node or input."""

import time

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import opfusion as opf
from opfusion.backend.cpu.toolchain import have_c_compiler
from opfusion.compiler.limits import MAX_ALLOCATION_BYTES
from opfusion.errors import OpfusionError, ResourceLimitError
from opfusion.frontend import from_onnx
from opfusion.ir.expr import Constant
from opfusion.ir.visitor import post_order
from opfusion.transform import PassContext

FOLD = "FoldConstant.max_elements"
needs_cc = pytest.mark.skipif(not have_c_compiler(), reason="no C compiler installed")


def _model(nodes, inputs=(), initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", list(inputs),
                              [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)],
                              list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _constant_of_shape(shape, value=None):
    value = np.float32(2.5) if value is None else value
    shape = numpy_helper.from_array(np.array(shape, np.int64), "s")
    node = helper.make_node("ConstantOfShape", ["s"], ["y"], name="cos",
                            value=numpy_helper.from_array(np.array([value])))
    return _model([node], initializers=[shape])


def _range(start, limit, delta, dtype=np.int64):
    bounds = [numpy_helper.from_array(np.array(v, dtype), n)
              for v, n in zip((start, limit, delta), "abc")]
    return _model([helper.make_node("Range", ["a", "b", "c"], ["y"], name="rng")],
                  initializers=bounds)


def _largest_constant(mod):
    return max((node.data.size for node in post_order(mod["main"])
                if isinstance(node, Constant)), default=0)


def _refused_quickly(model, match, config=None):
    start = time.perf_counter()
    with PassContext(config=config or {}), pytest.raises(ResourceLimitError, match=match) as info:
        from_onnx(model)
    assert time.perf_counter() - start < 2.0
    assert isinstance(info.value, OpfusionError)
    assert MAX_ALLOCATION_BYTES in str(info.value) and "from_onnx" in str(info.value)


def test_constant_of_shape_beyond_memory_is_refused_at_import():
    _refused_quickly(_constant_of_shape([10**6, 10**6]),
                     r"ConstantOfShape \(node 'cos'\): its result \(1000000000000 elements\)")


def test_constant_of_shape_beyond_the_set_limit_is_refused_not_allocated():
    # 2**33 float64 elements (64 GiB): the old importer called np.full with it.
    _refused_quickly(_constant_of_shape([2**17, 2**16], np.float64(1)), r"node 'cos'",
                     {MAX_ALLOCATION_BYTES: 1 << 30})


@pytest.mark.parametrize("bounds", [(0, 10**12, 1), (0, 2**31 - 1, 1), (2**40, 0, -2**8)])
def test_range_beyond_the_limit_is_refused_at_import(bounds):
    _refused_quickly(_range(*bounds), r"Range \(node 'rng'\): Range\(.*\), \d+ elements",
                     {MAX_ALLOCATION_BYTES: 1 << 30})


def test_a_graph_input_beyond_memory_is_refused_naming_it():
    for dim in (2**31, 2**62):
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, dim])
        model = _model([helper.make_node("Relu", ["x"], ["y"])], inputs=[x])
        _refused_quickly(model, r"graph input 'x' of shape \[2, \d+\]",
                         {MAX_ALLOCATION_BYTES: 1 << 30})


def _layer_norm():
    """The scale is an input, so that the only constants are the importer's (its zero bias)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8])
    scale = helper.make_tensor_value_info("scale", TensorProto.FLOAT, [3, 8])
    return _model([helper.make_node("LayerNormalization", ["x", "scale"], ["y"], axis=1)],
                  [x, scale])


def _reduce_max_of_nothing():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [0, 6, 5])
    return _model([helper.make_node("ReduceMax", ["x"], ["y"], axes=[0], keepdims=0)], [x],
                  opset=13)


def _hardmax():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 40])
    return _model([helper.make_node("Hardmax", ["x"], ["y"])], [x])


def _one_hot():
    x = helper.make_tensor_value_info("x", TensorProto.INT64, [4])
    depth = numpy_helper.from_array(np.array(30, np.int64), "depth")
    values = numpy_helper.from_array(np.array([0.0, 1.0], np.float32), "values")
    return _model([helper.make_node("OneHot", ["x", "depth", "values"], ["y"])], [x],
                  [depth, values])


def _dropout_mask():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 9])
    graph = helper.make_graph([helper.make_node("Dropout", ["x"], ["d", "y"])], "g", [x],
                              [helper.make_tensor_value_info("y", TensorProto.BOOL, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


MODELS = {
    "ConstantOfShape": lambda: _constant_of_shape([5, 7]),
    "Range int64": lambda: _range(3, -40, -3),
    "Range float32": lambda: _range(0.5, 7.0, 0.25, np.float32),
    "LayerNormalization": _layer_norm,
    "ReduceMax of nothing": _reduce_max_of_nothing,
    "Hardmax": _hardmax,
    "OneHot": _one_hot,
    "Dropout mask": _dropout_mask,
}


@pytest.mark.parametrize("name", MODELS)
def test_constants_past_the_folding_limit_stay_operators(name):
    """Imported under a folding limit of 4 elements, no constant holds more, and the model
    computes what it computes when everything folds."""
    model = MODELS[name]()
    folded, _ = from_onnx(model)
    with PassContext(config={FOLD: 4}):
        kept, _ = from_onnx(model)
    assert _largest_constant(folded) > 4
    assert _largest_constant(kept) <= 4
    rng = np.random.default_rng(0)
    inputs = [rng.integers(-30, 30, p.checked_type.shape).astype(p.checked_type.dtype)
              for p in folded["main"].params]
    np.testing.assert_array_equal(opf.ir.evaluate(kept, inputs), opf.ir.evaluate(folded, inputs))


@needs_cc
@pytest.mark.parametrize("name", ["ConstantOfShape", "Range int64", "Range float32"])
def test_an_unfolded_constant_compiles_to_the_same_values(name):
    model = MODELS[name]()
    folded, _ = from_onnx(model)
    with PassContext(config={FOLD: 4}):
        kept, _ = from_onnx(model)
        exe = opf.compile(kept)
    np.testing.assert_array_equal(exe(), opf.ir.evaluate(folded, []))


@pytest.mark.parametrize("op", ["Conv", "Pad"])
def test_a_padding_no_int64_indexes_is_refused_naming_the_node(op):
    """A padding of 2^63 - 1 columns (a damaged model) makes an output wider than an int64
    counts: refused at import by the node's name, not met in lowering as an overflow."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 5])
    big = 2**63 - 1
    if op == "Conv":
        weight = numpy_helper.from_array(np.ones((3, 2, 3, 3), np.float32), "w")
        node = helper.make_node("Conv", ["x", "w"], ["y"], name="wide", pads=[0, 0, 0, big])
    else:
        weight = numpy_helper.from_array(np.array([0, 0, 0, 0, 0, 0, 0, big], np.int64), "w")
        node = helper.make_node("Pad", ["x", "w"], ["y"], name="wide")
    with pytest.raises(OpfusionError, match=rf"{op} \(node 'wide'\): output 'y' would have "
                       r"shape \[1, \d, \d, 9223372036854775\d+\], more elements than an "
                       "int64"):
        from_onnx(_model([node], [x], [weight]))
