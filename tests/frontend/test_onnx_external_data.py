"""External data of untrusted models: read only from inside the model's directory (or the
base_dir the caller names), never relative to the current directory, every reference checked
(location, offset, length) before a byte is read."""

import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.external_data_helper import set_external_data  # noqa: E402

import opfusion as opf  # noqa: E402
from opfusion.errors import OnnxImportError  # noqa: E402
from opfusion.frontend import from_onnx  # noqa: E402
from opfusion.testing import assert_close  # noqa: E402

WEIGHT = np.arange(6, dtype=np.float32).reshape(3, 2)
X = np.ones((2, 3), np.float32)


def external_model(location="weights.bin", offset=None, length=None, dims=(3, 2)):
    """x @ w with w's data at ``location`` (written by the tests where they want it)."""
    w = numpy_helper.from_array(WEIGHT, "w")
    set_external_data(w, location, offset=offset, length=length)
    w.data_location = TensorProto.EXTERNAL
    w.ClearField("raw_data")
    del w.dims[:]
    w.dims.extend(dims)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def check_result(mod):
    assert_close(opf.ir.evaluate(mod, [X]), X @ WEIGHT)


@pytest.fixture
def data_dir(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "weights.bin").write_bytes(WEIGHT.tobytes())
    return tmp_path / "m"


@pytest.mark.parametrize("form", ["proto", "bytes"])
def test_no_directory_no_external_data(data_dir, monkeypatch, form):
    # The old importer read "weights.bin" relative to the current directory.
    monkeypatch.chdir(data_dir)
    model = external_model()
    given = model if form == "proto" else model.SerializeToString()
    with pytest.raises(OnnxImportError, match="initializer 'w' keeps its data in an external "
                                              "file .* pass base_dir="):
        from_onnx(given)


@pytest.mark.parametrize("form", ["proto", "bytes"])
def test_base_dir_reads_external_data(data_dir, form):
    model = external_model()
    given = model if form == "proto" else model.SerializeToString()
    mod, _ = from_onnx(given, base_dir=data_dir)
    check_result(mod)
    assert model.graph.initializer[0].data_location == TensorProto.EXTERNAL  # not changed


def test_model_path_reads_from_its_directory(data_dir, tmp_path, monkeypatch):
    onnx.save(external_model(), data_dir / "model.onnx")
    monkeypatch.chdir(tmp_path)
    mod, _ = from_onnx(data_dir / "model.onnx")
    check_result(mod)


def test_constant_attribute_with_external_data(data_dir):
    value = numpy_helper.from_array(WEIGHT, "value")
    set_external_data(value, "weights.bin")
    value.data_location = TensorProto.EXTERNAL
    value.ClearField("raw_data")
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["w"], name="c", value=value),
         helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(OnnxImportError, match=r"attribute 'value' of Constant \(node 'c'\)"):
        from_onnx(model)
    check_result(from_onnx(model, base_dir=data_dir)[0])


@pytest.mark.parametrize("location, reason", [
    ("../secret", "'..' component"),
    ("sub/../../secret", "'..' component"),
    ("..\\secret", "'..' component"),
    ("/etc/hostname", "absolute path"),
    ("link/secret", "symbolic link"),
    ("weights.bin\x00.txt", "NUL byte"),
])
def test_locations_that_leave_the_directory(data_dir, location, reason):
    (data_dir.parent / "secret").write_bytes(WEIGHT.tobytes())
    os.symlink(data_dir.parent, data_dir / "link")
    with pytest.raises(OnnxImportError, match=f"initializer 'w': external data path .*{reason}"):
        from_onnx(external_model(location), base_dir=data_dir)


@pytest.mark.parametrize("offset, length, dims, message", [
    (100, None, (3, 2), "is 24 bytes but the tensor asks for bytes 100"),
    (8, 24, (3, 2), "is 24 bytes but the tensor asks for bytes 8 to 32"),
    (0, 20, (3, 2), "gives 20 bytes but .* needs 24"),
    (None, None, (4, 2), "gives 24 bytes but .* needs 32"),
    (None, None, (-3, -2), "negative dimension"),
])
def test_offsets_and_lengths_are_checked(data_dir, offset, length, dims, message):
    with pytest.raises(OnnxImportError, match=f"initializer 'w'.*{message}"):
        from_onnx(external_model(offset=offset, length=length, dims=dims), base_dir=data_dir)


@pytest.mark.parametrize("key, value", [("offset", "-1"), ("length", "1e3"), ("offset", "")])
def test_offset_and_length_must_be_non_negative_integers(data_dir, key, value):
    model = external_model(offset=0, length=24)
    for entry in model.graph.initializer[0].external_data:
        if entry.key == key:
            entry.value = value
    with pytest.raises(OnnxImportError, match=f"initializer 'w': external data {key} "
                                              f"'{value}' is not a non-negative integer"):
        from_onnx(model, base_dir=data_dir)


def test_offset_and_length_inside_the_file(data_dir):
    (data_dir / "weights.bin").write_bytes(bytes(8) + WEIGHT.tobytes() + bytes(8))
    mod, _ = from_onnx(external_model(offset=8, length=24), base_dir=data_dir)
    check_result(mod)


def test_missing_file_and_missing_location(data_dir):
    with pytest.raises(OnnxImportError, match="'other.bin' does not exist"):
        from_onnx(external_model("other.bin"), base_dir=data_dir)
    with pytest.raises(OnnxImportError, match="names no location"):
        from_onnx(external_model(""), base_dir=data_dir)


def test_base_dir_must_be_a_directory(data_dir):
    with pytest.raises(OnnxImportError, match="is not a directory"):
        from_onnx(external_model(), base_dir=data_dir / "weights.bin")


def test_an_external_data_entry_that_is_not_utf8_is_refused_by_name(data_dir):
    """A damaged model's entry whose bytes are not UTF-8 (protobuf hands them over as
    bytes): an import error naming the tensor, not a TypeError from the digit check."""
    model = external_model(offset=0, length=24)
    for entry in model.graph.initializer[0].external_data:
        if entry.key == "offset":
            entry.value = "QQQQ"
    data = model.SerializeToString().replace(b"QQQQ", b"-\xf6\xf6\xf6")
    with pytest.raises(OnnxImportError, match="initializer 'w': an external data entry .* is "
                                              "not UTF-8 text"):
        from_onnx(data, base_dir=data_dir)
