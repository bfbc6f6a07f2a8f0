"""from_onnx on broken and awkward models: each gives an opfusion exception that says what is
wrong and where, never a bare Python error from deep inside; and freeze_params=False."""

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import opfusion as opf  # noqa: E402
from opfusion import OpfusionError  # noqa: E402
from opfusion.frontend import OnnxSymbolicModule, UnsupportedOnnxError, from_onnx  # noqa: E402
from opfusion.testing import assert_close  # noqa: E402

LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
X = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
Y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)


def make_model(nodes, inputs=(X,), outputs=(Y,), initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", list(inputs), list(outputs), list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def weight_model():
    w = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(3, 2), "w")
    return make_model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
                      initializers=[w])


# -- files that are not models ---------------------------------------------------------------


@pytest.mark.parametrize("data", [b"not an onnx model at all", bytes(range(256)) * 4,
                                  b"\x08\x07\x12\xff\xff\xff\xff\x0f"])
def test_garbage_bytes(tmp_path, data):
    path = tmp_path / "garbage.onnx"
    path.write_bytes(data)
    with pytest.raises(OpfusionError, match="garbage.onnx.*(not a valid ONNX model|no ONNX graph)"):
        from_onnx(path)
    with pytest.raises(OpfusionError, match="not a valid ONNX model|no ONNX graph"):
        from_onnx(data)


def test_truncated_model_file(tmp_path):
    data = (LIGHT_DIR / "light_squeezenet.onnx").read_bytes()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(OpfusionError, match="cut.onnx' is not a valid ONNX model.*complete"):
        from_onnx(path)


def test_every_truncation_is_an_opfusion_error(tmp_path):
    # Cut points all over the file, and each of the last 64 bytes (where a cut can fall on a
    # field boundary and parse): never a bare exception.
    data = (LIGHT_DIR / "light_squeezenet.onnx").read_bytes()
    cuts = list(range(1, len(data), 151)) + list(range(len(data) - 64, len(data)))
    for cut in cuts:
        with pytest.raises(OpfusionError):
            from_onnx(data[:cut])


def test_missing_file(tmp_path):
    with pytest.raises(OpfusionError, match="no ONNX model at"):
        from_onnx(tmp_path / "nope.onnx")


def test_not_a_model_object():
    with pytest.raises(OpfusionError, match="takes an onnx.ModelProto, bytes or a path, got int"):
        from_onnx(42)


# -- malformed graphs ------------------------------------------------------------------------


def test_unknown_ops_are_all_listed_with_node_and_opset():
    model = make_model([helper.make_node("FooOp", ["x"], ["a"], name="first"),
                        helper.make_node("Relu", ["a"], ["b"], name="fine"),
                        helper.make_node("BarOp", ["b"], ["y"], name="second")], opset=15)
    with pytest.raises(UnsupportedOnnxError) as info:
        from_onnx(model)
    message = str(info.value)
    assert "2 node(s)" in message
    assert "FooOp (node 'first', domain ai.onnx, opset 15)" in message
    assert "BarOp (node 'second', domain ai.onnx, opset 15)" in message
    assert "Relu" not in message


def test_dangling_input_name():
    model = make_model([helper.make_node("Relu", ["x"], ["a"], name="r1"),
                        helper.make_node("Relu", ["nowhere"], ["y"], name="r2")])
    with pytest.raises(OpfusionError, match="node 'r2' \\(Relu\\).*'nowhere'.*dangling"):
        from_onnx(model)


def test_dangling_graph_output():
    model = make_model([helper.make_node("Relu", ["x"], ["a"], name="r")],
                       outputs=[helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])
    with pytest.raises(OpfusionError, match="graph output 'z'.*dangling"):
        from_onnx(model)


@pytest.mark.parametrize("op_type, attrs, kinds", [
    ("Softmax", {"axis": "1"}, "must be INT but the model gives STRING"),
    ("Softmax", {"axis": 1.0}, "must be INT but the model gives FLOAT"),
    ("Transpose", {"perm": [1.0, 0.0]}, "must be INTS but the model gives FLOATS"),
    ("LeakyRelu", {"alpha": [0.1, 0.2]}, "must be FLOAT but the model gives FLOATS"),
])
def test_attribute_of_the_wrong_type(op_type, attrs, kinds):
    model = make_model([helper.make_node(op_type, ["x"], ["y"], name="n1", **attrs)])
    name = next(iter(attrs))
    with pytest.raises(OpfusionError, match=f"{op_type} \\(node 'n1', opset 17\\): attribute "
                                            f"'{name}' {kinds}"):
        from_onnx(model)


def test_wrong_attribute_type_in_gemm_is_not_a_numpy_error():
    w = numpy_helper.from_array(np.ones((3, 2), np.float32), "w")
    model = make_model([helper.make_node("Gemm", ["x", "w"], ["y"], name="g", alpha="2")],
                       initializers=[w])
    with pytest.raises(OpfusionError, match="'alpha' must be FLOAT"):
        from_onnx(model)


# -- external data ---------------------------------------------------------------------------


def save_with_external_data(model, path):
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
              location="weights.bin", size_threshold=0)


def test_external_data_inside_the_model_directory_is_read(tmp_path):
    (tmp_path / "m").mkdir()
    save_with_external_data(weight_model(), tmp_path / "m" / "model.onnx")
    mod, _ = from_onnx(tmp_path / "m" / "model.onnx")
    x = np.ones((2, 3), np.float32)
    assert_close(opf.ir.evaluate(mod, [x]), x @ np.arange(6, dtype=np.float32).reshape(3, 2))


@pytest.mark.parametrize("location", ["../x", "../m2/weights.bin", "/etc/hostname"])
def test_external_data_outside_the_model_directory_is_refused(tmp_path, location):
    (tmp_path / "m").mkdir()
    (tmp_path / "m2").mkdir()
    save_with_external_data(weight_model(), tmp_path / "m" / "model.onnx")
    (tmp_path / "x").write_bytes(bytes(24))
    (tmp_path / "m2" / "weights.bin").write_bytes(bytes(24))
    model = onnx.load(tmp_path / "m" / "model.onnx", load_external_data=False)
    for entry in model.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = location
    onnx.save(model, tmp_path / "m" / "evil.onnx")
    with pytest.raises(OpfusionError, match=f"initializer 'w': external data path "
                                            f"'{location}' leaves the model's directory"):
        from_onnx(tmp_path / "m" / "evil.onnx")


def test_external_data_file_missing(tmp_path):
    save_with_external_data(weight_model(), tmp_path / "model.onnx")
    (tmp_path / "weights.bin").unlink()
    with pytest.raises(OpfusionError, match="'weights.bin' does not exist next to the model"):
        from_onnx(tmp_path / "model.onnx")


# -- shapes ----------------------------------------------------------------------------------


def symbolic_model():
    batch = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
    return make_model([helper.make_node("Relu", ["x"], ["y"])], inputs=[batch])


def test_symbolic_dimension_without_override_gives_a_symbolic_module():
    mod, params = from_onnx(symbolic_model())
    assert isinstance(mod, OnnxSymbolicModule) and params == {}
    assert [(t.name, t.dims, t.dtype) for t in mod.inputs] == [("x", ("batch", 3), "float32")]
    # What needs a graph names the input and dimension, and says what to do.
    with pytest.raises(OpfusionError, match="graph input 'x' has a symbolic dimension 'batch' "
                                            "at axis 0; give its shape when importing"):
        mod["main"]
    static, _ = mod.specialize({"x": (2, 3)})
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    assert_close(opf.ir.evaluate(static, [x]), np.maximum(x, 0))


def test_a_symbolic_module_checks_the_model_at_import():
    model = symbolic_model()
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = -3
    with pytest.raises(OpfusionError, match="negative dimension -3 at axis 1"):
        from_onnx(model)
    with pytest.raises(OpfusionError, match="shape= names 'z', which is not a graph input"):
        from_onnx(symbolic_model(), shape={"z": (1,)})


def test_symbolic_dimension_with_override():
    mod, _ = from_onnx(symbolic_model(), shape={"x": (4, 3)})
    assert mod["main"].params[0].type_annotation.shape == (4, 3)
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
    assert_close(opf.ir.evaluate(mod, [x]), np.maximum(x, 0))


# -- parameters ------------------------------------------------------------------------------


def test_freeze_params_false_returns_params_taken_as_parameters():
    mod, params = from_onnx(weight_model(), freeze_params=False)
    assert list(params) == ["w"]
    assert_close(params["w"], np.arange(6, dtype=np.float32).reshape(3, 2))
    main = mod["main"]
    assert [p.name_hint for p in main.params] == ["x", "w"]
    assert main.params[1].type_annotation.shape == (3, 2)
    x = np.ones((2, 3), np.float32)
    assert_close(opf.ir.evaluate(mod, {"x": x, **params}), x @ params["w"])


def test_freeze_params_true_makes_constants():
    mod, params = from_onnx(weight_model())
    assert params == {}
    assert [p.name_hint for p in mod["main"].params] == ["x"]
