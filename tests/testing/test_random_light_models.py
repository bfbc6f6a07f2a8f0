"""light_model(): random-weight, calibrated copies of the nine onnx light models. They are
valid ONNX without a ConstantOfShape weight left, their output depends on the input under
opfusion's import + interpreter and under onnxruntime (an independent engine), and the two
agree. Generating all nine takes about a minute; the copies are cached on disk, so later runs
(and the other tests that use them) start at once."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

import opfusion as opf  # noqa: E402
from opfusion import OpfusionError  # noqa: E402
from opfusion.frontend import from_onnx  # noqa: E402
from opfusion.testing import LIGHT_MODEL_NAMES, light_model, shipped_light_model  # noqa: E402
from opfusion.testing import light as light_module  # noqa: E402

# Deep random networks amplify float32 rounding (onnxruntime's and ours differ in summation
# order): on these models the outputs differ by up to ~2e-4 of their largest magnitude
# (resnet50); a wrong kernel, axis or layer moves them by the order of the magnitude itself.
RTOL = 1e-3


def data_input(model):
    initializers = {tensor.name for tensor in model.graph.initializer}
    (value,) = [v for v in model.graph.input if v.name not in initializers]
    return value.name, [d.dim_value for d in value.type.tensor_type.shape.dim]


@pytest.fixture(scope="module", params=LIGHT_MODEL_NAMES)
def light(request):
    """The copy of one light model, two standard-normal inputs and opfusion's outputs."""
    path = light_model(request.param)
    model = onnx.load(path)
    name, shape = data_input(model)
    rng = np.random.default_rng(7)
    inputs = [rng.standard_normal(shape, dtype=np.float32) for _ in range(2)]
    mod, _ = from_onnx(model)
    outputs = [opf.ir.evaluate(mod, [x]) for x in inputs]
    return request.param, path, model, name, inputs, outputs


def assert_depends_on_input(first, second):
    assert np.isfinite(first).all() and np.isfinite(second).all()
    assert np.abs(first - second).max() > 0.01 * np.abs(first).max()


def test_copy_is_valid_onnx_without_constant_weights(light):
    name, path, model, *_ = light
    onnx.checker.check_model(model)
    assert not [node for node in model.graph.node if node.op_type == "ConstantOfShape"]
    shipped = onnx.load(shipped_light_model(name))
    made = {node.output[0] for node in shipped.graph.node if node.op_type == "ConstantOfShape"}
    initializers = {tensor.name: tensor for tensor in model.graph.initializer}
    assert made <= set(initializers)  # every former ConstantOfShape weight is an initializer
    for node in model.graph.node:
        if node.op_type == "Conv":  # random, not one value repeated
            values = onnx.numpy_helper.to_array(initializers[node.input[1]])
            assert np.unique(values).size > values.size // 2, node.name
    if model.ir_version < 4:
        assert set(initializers) <= {value.name for value in model.graph.input}
    # The same computation: every shipped node but the ConstantOfShape ones, in order.
    kept = [node.op_type for node in shipped.graph.node if node.op_type != "ConstantOfShape"]
    assert [node.op_type for node in model.graph.node] == kept


def test_output_depends_on_input(light):
    *_, outputs = light
    assert_depends_on_input(*outputs)


def test_matches_onnxruntime(light):
    ort = pytest.importorskip("onnxruntime")
    _, path, _, name, inputs, outputs = light
    options = ort.SessionOptions()
    options.log_severity_level = 3  # IR 3 models list initializers as inputs: ort warns
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    wants = [session.run(None, {name: x})[0] for x in inputs]
    assert_depends_on_input(*wants)
    for got, want in zip(outputs, wants):
        opf.testing.assert_close(got, want, rtol=RTOL)


# -- the cache -------------------------------------------------------------------------------


def test_cached_copy_is_reused(monkeypatch, tmp_path):
    monkeypatch.setenv("OPFUSION_CACHE_DIR", str(tmp_path))
    path = light_model("squeezenet")
    assert path.parent == tmp_path / "models"
    stamp = path.stat().st_mtime_ns
    monkeypatch.setattr(light_module, "randomized_light_model", None)  # would fail if called
    assert light_model("light_squeezenet") == path
    assert path.stat().st_mtime_ns == stamp
    assert [p.name for p in (tmp_path / "models").iterdir()] == [path.name]  # no temp files


def test_seed_changes_weights(monkeypatch, tmp_path):
    monkeypatch.setenv("OPFUSION_CACHE_DIR", str(tmp_path))
    first, second = (onnx.load(light_model("squeezenet", seed=seed)) for seed in (0, 1))
    weight = first.graph.node[0].input[1]
    values = [onnx.numpy_helper.to_array(next(t for t in model.graph.initializer
                                              if t.name == weight)) for model in (first, second)]
    assert values[0].shape == values[1].shape
    assert not np.allclose(values[0], values[1])


def test_unknown_name():
    with pytest.raises(OpfusionError, match="no light model named 'resnet18'.*squeezenet"):
        light_model("resnet18")
