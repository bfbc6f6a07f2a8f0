"""Malformed ONNX models: each gives an OnnxImportError (an OpfusionError) naming the node or
tensor at fault, from a specific check where there is one (tensors, element types, opsets,
names) and from the importer's last line otherwise (any other exception while converting a
node), never a bare TypeError, KeyError, ValueError or MemoryError."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import opfusion as opf  # noqa: E402
from opfusion.errors import OnnxImportError, OpfusionError, ResourceLimitError  # noqa: E402
from opfusion.frontend import from_onnx  # noqa: E402
from opfusion.frontend.onnx import importer as onnx_frontend  # noqa: E402
from opfusion.frontend.onnx.tensors import MAX_TENSOR_ELEMENTS  # noqa: E402

X = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
Y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)


def make_model(nodes, inputs=(X,), outputs=(Y,), initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", list(inputs), list(outputs), list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def add_model(tensor, opset=17):
    """y = x + w for an initializer ``w``."""
    return make_model([helper.make_node("Add", ["x", "w"], ["y"], name="add")],
                      initializers=[tensor], opset=opset)


def constant_model(tensor):
    """y = x + c for a Constant node 'c' holding ``tensor``."""
    return make_model([helper.make_node("Constant", [], ["c"], name="c", value=tensor),
                       helper.make_node("Add", ["x", "c"], ["y"], name="add")])


def tensor(name, data_type, dims, **fields):
    proto = TensorProto(name=name, data_type=data_type, dims=dims)
    for field, values in fields.items():
        if field == "raw_data":
            proto.raw_data = values
        else:
            getattr(proto, field).extend(values)
    return proto


def import_error(model, match):
    with pytest.raises(OnnxImportError, match=match) as info:
        from_onnx(model)
    assert isinstance(info.value, OpfusionError)
    return info.value


# -- opsets ----------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [2**31, 2**40, 0, -3, onnx.defs.onnx_opset_version() + 1])
def test_opset_out_of_range(version):
    model = make_model([helper.make_node("Relu", ["x"], ["y"], name="r")])
    model.opset_import[0].version = version
    import_error(model, f"imports opset {version} of the default ONNX domain; opfusion reads "
                        "opsets 1 to")


def test_two_versions_of_the_default_domain():
    model = make_model([helper.make_node("Relu", ["x"], ["y"], name="r")])
    model.opset_import.append(helper.make_opsetid("ai.onnx", 13))
    import_error(model, r"at several versions \[17, 13\]")


# -- element types ---------------------------------------------------------------------------


@pytest.mark.parametrize("to", [0, 999, TensorProto.STRING, TensorProto.BFLOAT16])
def test_cast_to_an_unknown_or_unsupported_type(to):
    model = make_model([helper.make_node("Cast", ["x"], ["y"], name="cast", to=to)])
    import_error(model, r"Cast \(node 'cast', opset 17\): the target of attribute 'to' has "
                        "element type .* which opfusion does not support")


def test_opset_1_cast_reads_onnx_type_names():
    # Opset 1 spelled 'to' as ONNX's name: "FLOAT" is float32 (NumPy's "float" is float64).
    model = make_model([helper.make_node("Cast", ["x"], ["y"], name="cast", to="FLOAT")],
                       opset=1)
    assert from_onnx(model)[0]["main"].checked_type.ret_type.dtype == "float32"
    model = make_model([helper.make_node("Cast", ["x"], ["y"], name="cast", to="NOPE")],
                       opset=1)
    import_error(model, r"Cast \(node 'cast', opset 1\): attribute 'to' is 'NOPE'")


@pytest.mark.parametrize("data_type", [0, 999, TensorProto.STRING])
def test_initializer_of_an_unknown_type(data_type):
    import_error(add_model(tensor("w", data_type, [3], raw_data=bytes(12))),
                 "initializer 'w' has element type .* which opfusion does not support")


@pytest.mark.parametrize("data_type", [0, 999])
def test_constant_of_an_unknown_type(data_type):
    import_error(constant_model(tensor("value", data_type, [3], raw_data=bytes(12))),
                 r"attribute 'value' of Constant \(node 'c'\) has element type")


def test_graph_input_of_an_unknown_type():
    x = helper.make_tensor_value_info("x", 999, [2, 3])
    import_error(make_model([helper.make_node("Relu", ["x"], ["y"], name="r")], inputs=[x]),
                 "graph input 'x' has element type 999")


# -- shapes and data -------------------------------------------------------------------------


@pytest.mark.parametrize("make", [add_model, constant_model])
def test_huge_shape_without_data(make):
    error = import_error(make(tensor("w", TensorProto.FLOAT, [10**6] * 3)),
                         "declares shape .* opfusion reads at most")
    assert "span 1000000000000000000 elements" in str(error)


@pytest.mark.parametrize("make", [add_model, constant_model])
def test_an_empty_tensor_with_a_huge_dimension(make):
    """No elements, but a dimension of 2^62 (NumPy makes no such array: a bare ValueError
    before): refused by name like any shape past the limit."""
    import_error(make(tensor("w", TensorProto.FLOAT, [0, 2**62], raw_data=b"")),
                 r"declares shape \[0, 4611686018427387904\], whose non-zero dimensions span")


@pytest.mark.parametrize("make", [add_model, constant_model])
def test_shape_within_the_limit_without_data(make):
    dims = [MAX_TENSOR_ELEMENTS // 4, 4]
    import_error(make(tensor("w", TensorProto.FLOAT, dims)),
                 rf"has shape {dims}.* but stores 0 values in float_data".replace("[", r"\["))


def test_data_shorter_than_the_shape():
    import_error(add_model(tensor("w", TensorProto.FLOAT, [2, 3], float_data=[1, 2, 3])),
                 r"initializer 'w' has shape \[2, 3\] \(6 elements of float32\) but stores 3 "
                 "values in float_data")


def test_data_in_two_fields():
    import_error(add_model(tensor("w", TensorProto.FLOAT, [3], float_data=[1, 2, 3],
                                  int64_data=[4])),
                 "and data in int64_data")


@pytest.mark.parametrize("make, name", [(add_model, "initializer 'w'"),
                                        (constant_model, "attribute 'value' of Constant")])
def test_negative_dimension(make, name):
    # The old importer read dims [-4, 4] with 4 values as shape (1, 4).
    import_error(make(tensor("w", TensorProto.FLOAT, [-4, 4], float_data=[1, 2, 3, 4])),
                 rf"{name}.* has a negative dimension in its shape \[-4, 4\]")


@pytest.mark.parametrize("size", [8, 13, 0])
def test_raw_data_length_must_match(size):
    import_error(add_model(tensor("w", TensorProto.FLOAT, [3], raw_data=bytes(size))),
                 rf"initializer 'w' has {size} bytes of raw_data but its shape \[3\] of "
                 "float32 needs 12")


@pytest.mark.parametrize("data_type, fields, expected", [
    (TensorProto.FLOAT16, {"int32_data": [0x3C00, 0xC000, 0]}, np.float16([1, -2, 0])),
    (TensorProto.BOOL, {"int32_data": [1, 0, 1]}, np.array([True, False, True])),
    (TensorProto.UINT32, {"uint64_data": [1, 2, 2**32 - 1]}, np.uint32([1, 2, 2**32 - 1])),
    (TensorProto.INT8, {"int32_data": [-1, 2, 3]}, np.int8([-1, 2, 3])),
    (TensorProto.DOUBLE, {"raw_data": np.float64([1, 2, 3]).tobytes()}, np.float64([1, 2, 3])),
])
def test_well_formed_tensors_are_read(data_type, fields, expected):
    x = helper.make_tensor_value_info("x", data_type, [3])
    y = helper.make_tensor_value_info("y", data_type, None)
    model = make_model([helper.make_node("Identity", ["w"], ["y"], name="id")], inputs=[x],
                       outputs=[y], initializers=[tensor("w", data_type, [3], **fields)])
    got = opf.ir.evaluate(from_onnx(model)[0], [expected])
    np.testing.assert_array_equal(got, expected)
    assert got.dtype == expected.dtype


# -- names -----------------------------------------------------------------------------------


def w(name="w"):
    return numpy_helper.from_array(np.ones(3, np.float32), name)


@pytest.mark.parametrize("model, match", [
    (make_model([helper.make_node("Relu", ["x"], ["y"])], initializers=[w(), w()]),
     "initializer 'w' is defined twice"),
    (make_model([helper.make_node("Relu", ["x"], ["y"])], initializers=[w("")]),
     "initializer 0 has no name"),
    (make_model([helper.make_node("Relu", ["x"], ["y"])], inputs=[X, X]),
     "graph input 'x' is listed twice"),
    (make_model([helper.make_node("Relu", ["x"], ["y"], name="a"),
                 helper.make_node("Neg", ["x"], ["y"], name="b")]),
     r"Neg \(node 'b', #1 in the graph\): output 'y' is already defined by node 'a' \(Relu\)"),
    (make_model([helper.make_node("Relu", ["x"], ["x"], name="a")]),
     r"Relu \(node 'a', #0 in the graph\): output 'x' is already defined by a graph input"),
    (make_model([helper.make_node("Relu", ["x"], ["w"], name="a")], initializers=[w()]),
     "output 'w' is already defined by an initializer"),
    (make_model([helper.make_node("Relu", ["x"], ["y"])],
                outputs=[helper.make_tensor_value_info("", TensorProto.FLOAT, None)]),
     "graph output 0 has no name"),
])
def test_names_defined_once(model, match):
    import_error(model, match)


def test_node_input_naming_nothing():
    model = make_model([helper.make_node("Add", ["x", "nothing"], ["y"], name="add")])
    import_error(model, r"input of node 'add' \(Add\): 'nothing' is not produced")


def test_node_without_name_or_outputs():
    # The old importer took node.output[0] as the name of an unnamed node.
    model = make_model([helper.make_node("Relu", ["x"], [])])
    import_error(model, "graph output 'y' is not produced by any node")


def test_constant_of_shape_too_large():
    shape = numpy_helper.from_array(np.array([10**6] * 3, np.int64), "s")
    model = make_model([helper.make_node("ConstantOfShape", ["s"], ["y"], name="cos")],
                       inputs=[], initializers=[shape])
    with pytest.raises(ResourceLimitError, match=r"ConstantOfShape \(node 'cos'\): its result "
                       r"\(1000000000000000000 elements\) .* compile.max_allocation_bytes"):
        from_onnx(model)


# -- the last line: any other exception while converting a node -------------------------------


@pytest.mark.parametrize("exception", [TypeError("t"), ValueError("v"), KeyError("k"),
                                       IndexError("i"), ZeroDivisionError("z"),
                                       OverflowError("o"), MemoryError("m"),
                                       AssertionError("from inference")])
def test_any_converter_failure_names_the_node(monkeypatch, exception):
    def broken(node):
        raise exception

    real = onnx_frontend.lookup_converter
    monkeypatch.setattr(onnx_frontend, "lookup_converter",
                        lambda op_type, *rest: broken if op_type == "Neg" else real(op_type,
                                                                                    *rest))
    model = make_model([helper.make_node("Relu", ["x"], ["r"], name="first"),
                        helper.make_node("Neg", ["r"], ["y"], name="second")])
    error = import_error(model, rf"Neg \(node 'second', #1 in the graph\): importing it failed "
                                rf"with {type(exception).__name__}: ")
    assert error.__cause__ is exception


def test_failure_inside_a_function_body_names_the_model_node(monkeypatch):
    # Celu, without its converter, is expanded into its ONNX function body, whose nodes fail.
    real = onnx_frontend.lookup_converter

    def lookup(op_type, *rest):
        if op_type == "Celu":
            return None
        fn = real(op_type, *rest)
        return fn if op_type in ("Relu",) else (lambda node: 1 / 0)

    monkeypatch.setattr(onnx_frontend, "lookup_converter", lookup)
    model = make_model([helper.make_node("Relu", ["x"], ["r"], name="first"),
                        helper.make_node("Celu", ["r"], ["y"], name="celu")], opset=13)
    error = import_error(model, r"\(node 'celu/.*', #1 in the graph\): importing it failed "
                                "with ZeroDivisionError")
    assert isinstance(error.__cause__, ZeroDivisionError)


def test_type_inference_failure_of_the_graph(monkeypatch):
    import opfusion.ir.expr as expr

    def broken(self):
        raise IndexError("no such field")

    model = make_model([helper.make_node("Relu", ["x"], ["y"], name="r")])
    monkeypatch.setattr(expr.Function, "checked_type", property(broken))
    error = import_error(model, "type inference of the imported graph failed with IndexError")
    assert isinstance(error.__cause__, IndexError)


def test_function_body_of_an_earlier_opset_is_found(monkeypatch):
    # ONNX keeps Celu's body under opset 12 only; a model of opset 13 must get that body
    # (asking by 13 returned none: "ONNX gives no function body at opset 13").
    real = onnx_frontend.lookup_converter
    monkeypatch.setattr(onnx_frontend, "lookup_converter",
                        lambda op_type, *rest: None if op_type == "Celu" else real(op_type,
                                                                                   *rest))
    model = make_model([helper.make_node("Celu", ["x"], ["y"], name="celu", alpha=2.0)],
                       opset=13)
    x = np.linspace(-3, 3, 6, dtype=np.float32).reshape(2, 3)
    expected = np.maximum(x, 0) + np.minimum(0, 2.0 * (np.exp(x / 2.0) - 1))
    np.testing.assert_allclose(opf.ir.evaluate(from_onnx(model)[0], [x]), expected, rtol=1e-5)


def test_names_that_are_not_utf8_are_refused():
    """A damaged model whose names are not UTF-8 (protobuf hands them over as bytes, which
    had become names like "b'x\\\\xf6'"): an import error saying which."""
    w = helper.make_tensor("wQQ", TensorProto.FLOAT, [3, 2], [1.0] * 6)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["xQQ", "wQQ"], ["yQQ"], name="mmQQ")], "g",
        [helper.make_tensor_value_info("xQQ", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("yQQ", TensorProto.FLOAT, None)], [w])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    damaged = data.SerializeToString().replace(b"QQ", b"\xf6\xf7")
    with pytest.raises(OnnxImportError, match="graph input 0 is named b'x.*not UTF-8 text"):
        from_onnx(damaged)


@pytest.mark.parametrize("op_type, dtype, refused", [
    ("HardSwish", TensorProto.INT16, True),  # float16, float, double only
    ("Sqrt", TensorProto.INT32, True),
    ("Relu", TensorProto.INT32, False),  # ints since opset 14
    ("Concat", TensorProto.INT64, False),  # a variadic input: every part checked
])
def test_an_input_of_a_type_the_schema_refuses_names_the_node(op_type, dtype, refused):
    """A tensor input of an element type the op's schema does not take (a damaged model's
    Cast before a HardSwish: fuzzing found its kernel failing to lower) is refused at import
    with the node's name and the types it takes, as ONNX Runtime refuses it."""
    attrs = {"axis": 0} if op_type == "Concat" else {}
    inputs = ["xi", "xi"] if op_type == "Concat" else ["xi"]
    nodes = [helper.make_node("Cast", ["x"], ["xi"], name="cast", to=dtype),
             helper.make_node(op_type, inputs, ["y"], name="op", **attrs)]
    model = make_model(nodes, outputs=(helper.make_tensor_value_info("y", dtype, None),))
    if refused:
        with pytest.raises(OnnxImportError, match=rf"{op_type} \(node 'op', opset 17\): input "
                                                  r"0 \(\w+\) is int\d+, but the operator "
                                                  r"takes .*float.*; the model is malformed"):
            from_onnx(model)
    else:
        mod, params = from_onnx(model)
        assert mod["main"].checked_type.ret_type.dtype == helper.tensor_dtype_to_np_dtype(
            dtype).name
