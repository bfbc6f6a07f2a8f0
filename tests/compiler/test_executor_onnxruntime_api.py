"""ONNX Runtime's calling conventions on a compiled model: ``exe.run(None, feeds)``,
``exe.run(["probs"], feeds)``, ``get_inputs()``/``get_outputs()``, and outputs that keep the
model's names through compilation, export and load; opfusion's own ``exe.run(feeds)`` keeps
working, and a call of neither form is an opfusion error saying what was expected."""

import io
import json
import threading
import zipfile

import numpy as np
import pytest

import opfusion as opf
from opfusion.backend.cpu.toolchain import have_c_compiler
from opfusion.compiler.artifact import ArtifactError, write_archive
from opfusion.compiler.signature import NodeArg, RunArgumentError
from opfusion.testing import assert_close, light_model

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

pytestmark = pytest.mark.skipif(not have_c_compiler(), reason="no C compiler installed")

RNG = np.random.default_rng(0)
FEEDS = {"x": RNG.standard_normal((2, 3)).astype(np.float32),
         "bias": RNG.standard_normal(4).astype(np.float32)}


def two_output_model():
    """x (2, 3), bias (4,) -> logits = x @ w + bias, probs = softmax(logits)."""
    weight = numpy_helper.from_array(
        np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]),
             helper.make_node("Add", ["xw", "bias"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["probs"], axis=-1)]
    graph = helper.make_graph(
        nodes, "two_outputs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("bias", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [2, 4]),
         helper.make_tensor_value_info("probs", TensorProto.FLOAT, [2, 4])], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def model():
    """The model, its compiled executor and the reference outputs on FEEDS."""
    proto = two_output_model()
    mod, params = opf.frontend.from_onnx(proto)
    want = opf.ir.evaluate(mod, {**FEEDS, **params})
    return proto, opf.compile(mod, params=params), list(want)


def test_run_none_returns_every_output_in_the_models_order(model):
    _, exe, want = model
    got = exe.run(None, FEEDS)
    assert isinstance(got, list) and len(got) == 2
    for array, expected in zip(got, want):
        assert_close(array, expected)


def test_run_with_output_names_returns_those_outputs_in_the_order_asked(model):
    _, exe, (logits, probs) = model
    got = exe.run(["probs", "logits"], FEEDS)
    assert len(got) == 2
    assert_close(got[0], probs)
    assert_close(got[1], logits)
    (only,) = exe.run(["probs"], input_feed=FEEDS)
    assert_close(only, probs)


def test_run_with_feeds_alone_still_returns_every_output(model):
    _, exe, want = model
    for got in (exe.run(FEEDS), exe.run([FEEDS["x"], FEEDS["bias"]]),
                exe.run([], FEEDS), list(exe(**FEEDS))):
        for array, expected in zip(got, want, strict=True):
            assert_close(array, expected)


def test_an_unknown_output_name_lists_the_models_outputs(model):
    _, exe, _ = model
    with pytest.raises(RunArgumentError, match="'scores'.*'logits', 'probs'"):
        exe.run(["scores"], FEEDS)


@pytest.mark.parametrize("args, expected", [
    ((["probs"],), r"needs the feeds after the output names"),
    (("probs", FEEDS), r"output_names must be None or a list"),
    ((FEEDS, True), r"output_names must be None or a list of output names, got a dict"),
    (([0], FEEDS), r"output_names must be None or a list"),
    ((None, FEEDS["x"]), r"feeds must be a dict of input name -> array"),
    ((FEEDS["x"],), r"feeds must be a dict of input name -> array.*an array of shape \(2, 3\)"),
    ((None, FEEDS, object()), r"takes no run_options"),
])
def test_a_call_of_neither_form_says_what_was_expected(model, args, expected):
    _, exe, _ = model
    with pytest.raises(opf.OpfusionError, match=expected):
        exe.run(*args)


def test_get_inputs_and_outputs_describe_the_model(model):
    _, exe, _ = model
    assert exe.get_inputs() == [NodeArg("x", [2, 3], "tensor(float)", np.dtype("float32")),
                                NodeArg("bias", [4], "tensor(float)", np.dtype("float32"))]
    assert [(o.name, o.shape, o.type, o.dtype) for o in exe.get_outputs()] == [
        ("logits", [2, 4], "tensor(float)", np.float32),
        ("probs", [2, 4], "tensor(float)", np.float32)]


def test_the_calls_match_onnxruntime_on_the_same_model(model):
    ort = pytest.importorskip("onnxruntime")
    proto, exe, _ = model
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    for ours, theirs in ((exe.get_inputs(), session.get_inputs()),
                         (exe.get_outputs(), session.get_outputs())):
        assert [(a.name, a.shape, a.type) for a in ours] == [
            (a.name, a.shape, a.type) for a in theirs]
    for names in (None, ["probs"], ["probs", "logits"]):
        for got, want in zip(exe.run(names, FEEDS), session.run(names, FEEDS), strict=True):
            assert_close(got, want)


def test_a_light_model_answers_as_onnxruntime_does():
    ort = pytest.importorskip("onnxruntime")
    path = str(light_model("squeezenet"))
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    mod, params = opf.frontend.from_onnx(path)
    exe = opf.compile(mod, params=params)
    assert [(a.name, a.shape, a.type) for a in exe.get_outputs()] == [
        (a.name, a.shape, a.type) for a in session.get_outputs()]
    (data,) = exe.get_inputs()
    feeds = {data.name: np.random.default_rng(3).standard_normal(data.shape).astype(data.dtype)}
    name = session.get_outputs()[0].name
    assert_close(exe.run([name], feeds)[0], session.run([name], feeds)[0], rtol=1e-4)


def test_models_built_in_code_get_default_output_names():
    x = opf.var("x", shape=(3,), dtype="int32")
    mod = opf.IRModule.from_expr(opf.Function([x], opf.Tuple([x + x, x * x])))
    exe = opf.compile(mod)
    assert exe.output_names == ["output_0", "output_1"]
    assert [(o.name, o.type, o.dtype) for o in exe.get_outputs()] == [
        ("output_0", "tensor(int32)", np.int32), ("output_1", "tensor(int32)", np.int32)]
    (squared,) = exe.run(["output_1"], {"x": np.array([1, -2, 3], np.int32)})
    np.testing.assert_array_equal(squared, [1, 4, 9])


def test_four_threads_running_run_none_get_identical_results(model):
    _, exe, want = model
    results: list = [None] * 4
    failures = []

    def work(index):
        try:
            results[index] = [exe.run(None, FEEDS) for _ in range(20)]
        except BaseException as err:  # noqa: BLE001 - handed to the main thread
            failures.append(err)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
    first = results[0][0]
    for runs in results:
        for outputs in runs:
            for got, same in zip(outputs, first, strict=True):
                np.testing.assert_array_equal(got, same)
    for got, expected in zip(first, want):
        assert_close(got, expected)


# -- artifacts ---------------------------------------------------------------------------------

def _edit_manifest(src, dst, edit):
    """Copy artifact ``src`` to ``dst`` with its manifest edited by ``edit(dict)``."""
    with zipfile.ZipFile(src) as source:
        members = {name: source.read(name) for name in source.namelist()
                   if name != "weights.bin"}
        weights = source.read("weights.bin")
    manifest = json.load(io.BytesIO(members["manifest.json"]))
    edit(manifest)
    members["manifest.json"] = json.dumps(manifest).encode()
    write_archive(dst, members, [weights])  # the weights stored and aligned, as export does
    return dst


@pytest.fixture(scope="module")
def exported(model, tmp_path_factory):
    path = tmp_path_factory.mktemp("names") / "two.opf"
    model[1].export(path)
    return path


def test_output_names_survive_export_and_load(model, exported):
    _, _, (_, probs) = model
    loaded = opf.load(exported)
    assert loaded.output_names == ["logits", "probs"]
    assert_close(loaded.run(["probs"], FEEDS)[0], probs)


def test_a_manifest_without_output_names_gets_the_default_names(exported, tmp_path):
    older = _edit_manifest(exported, tmp_path / "older.opf",
                           lambda manifest: manifest.pop("output_names"))
    assert opf.load(older).output_names == ["output_0", "output_1"]


@pytest.mark.parametrize("names", [["logits"], ["logits", 7], "lp", None,
                                   ["logits", "probs", "extra"]])
def test_malformed_output_names_in_a_manifest_are_an_artifact_error(exported, tmp_path, names):
    forged = _edit_manifest(exported, tmp_path / "forged.opf",
                            lambda manifest: manifest.update(output_names=names))
    with pytest.raises(ArtifactError, match="output_names"):
        opf.load(forged)
