"""vision_model(): ONNX builds of four torchvision classifiers with random, calibrated weights.

Each is valid ONNX whose shapes infer to (1, 1000) logits and whose weights number exactly
what torchvision's model has; it imports and type-checks; its output depends on the input
under opfusion's interpreter and under onnxruntime, and the two agree; compiled, it computes
the same numbers (slow). With torch installed, each architecture written again in plain torch
(torch_vision.py) takes the same weights by their state_dict names and computes the same
logits. Building a model
takes a few seconds; the copies are cached on disk."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

import opfusion as opf  # noqa: E402
from opfusion import OpfusionError  # noqa: E402
from opfusion.frontend import from_onnx  # noqa: E402
from opfusion.ir.types import TensorType  # noqa: E402
from opfusion.testing import VISION_MODEL_NAMES, assert_close, vision_model  # noqa: E402
from opfusion.testing import vision as vision_module  # noqa: E402

# As for the light models: deep random networks amplify float32 rounding, and engines sum in
# different orders (these differ by up to ~2e-5 of the largest logit); a wrong kernel, axis
# or layer moves the logits by the order of their magnitude.
RTOL = 1e-3

# Weights and biases of torchvision's models (the sum of numel over model.parameters(), the
# batch norms' running statistics not counted).
TORCHVISION_PARAMETERS = {
    "efficientnet_b0": 5_288_548,
    "mobilenet_v3_large": 5_483_032,
    "resnet18": 11_689_512,
    "shufflenet_v2_x1_0": 2_278_604,
}


@pytest.fixture(scope="module", params=VISION_MODEL_NAMES)
def vision(request):
    """One model's name, path and proto."""
    path = vision_model(request.param)
    return request.param, path, onnx.load(path)


@pytest.fixture(scope="module")
def reference(vision):
    """Two standard-normal inputs, the imported module and the interpreter's logits for each."""
    *_, model = vision
    rng = np.random.default_rng(7)
    inputs = [rng.standard_normal((1, 3, 224, 224), dtype=np.float32) for _ in range(2)]
    mod, _ = from_onnx(model)
    return inputs, mod, [opf.ir.evaluate(mod, [x]) for x in inputs]


def assert_depends_on_input(first, second):
    assert np.isfinite(first).all() and np.isfinite(second).all()
    assert np.abs(first - second).max() > 0.01 * np.abs(first).max()


def test_valid_onnx_of_torchvision_size(vision):
    name, _, model = vision
    onnx.checker.check_model(model)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    (output,) = inferred.graph.output
    assert [d.dim_value for d in output.type.tensor_type.shape.dim] == [1, 1000]
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 18)]
    weights = [tensor for tensor in model.graph.initializer
               if tensor.data_type == onnx.TensorProto.FLOAT]
    assert len({t.name for t in model.graph.initializer}) == len(model.graph.initializer)
    learned = [t for t in weights if not t.name.endswith(("running_mean", "running_var"))]
    assert sum(int(np.prod(t.dims)) for t in learned) == TORCHVISION_PARAMETERS[name]
    assert all(t.name.endswith((".weight", ".bias")) for t in learned)


def test_imports_and_type_checks(vision):
    *_, model = vision
    mod, params = from_onnx(model)
    assert params == {}  # initializers become constants
    main = mod["main"]
    (data,) = main.params
    assert data.type_annotation == TensorType((1, 3, 224, 224), "float32")
    assert main.checked_type.ret_type == TensorType((1, 1000), "float32")


def test_output_depends_on_input(reference):
    *_, outputs = reference
    assert_depends_on_input(*outputs)


def test_reference_matches_onnxruntime(vision, reference):
    ort = pytest.importorskip("onnxruntime")
    _, path, _ = vision
    inputs, _, outputs = reference
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    wants = [session.run(None, {"input": x})[0] for x in inputs]
    assert_depends_on_input(*wants)
    for got, want in zip(outputs, wants):
        assert_close(got, want, rtol=RTOL)


@pytest.mark.slow
def test_compiled_model_matches_reference(reference):
    # Compiling takes 2-5 s per model (kernels not cached).
    inputs, mod, outputs = reference
    exe = opf.compile(mod)
    for x, want in zip(inputs, outputs):
        (got,) = exe.run({"input": x})
        assert_close(got, want, rtol=RTOL)


# -- the same architectures in torch -----------------------------------------------------------


def test_torch_model_with_the_same_weights_computes_the_same_logits(vision, reference):
    # torch_vision states each architecture again in plain torch, as torchvision's source
    # does: the builder matches it layer for layer if the weights load by name, one to one,
    # and give the same logits.
    torch = pytest.importorskip("torch")
    from torch_vision import TORCH_MODELS

    name, _, model = vision
    inputs, _, outputs = reference
    net = TORCH_MODELS[name]().eval()
    state = {t.name: torch.from_numpy(onnx.numpy_helper.to_array(t).copy())
             for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
    missing, unexpected = net.load_state_dict(state, strict=False)
    assert unexpected == []
    assert all(key.endswith("num_batches_tracked") for key in missing), missing
    with torch.no_grad():
        for x, want in zip(inputs, outputs):
            assert_close(net(torch.from_numpy(x)).numpy(), want, rtol=RTOL)


# -- the cache ---------------------------------------------------------------------------------


def test_cached_copy_is_reused(monkeypatch, tmp_path):
    monkeypatch.setenv("OPFUSION_CACHE_DIR", str(tmp_path))
    path = vision_model("shufflenet_v2_x1_0")
    assert path.parent == tmp_path / "models"
    stamp = path.stat().st_mtime_ns
    monkeypatch.setattr(vision_module, "build_vision_model", None)  # would fail if called
    assert vision_model("shufflenet_v2_x1_0") == path
    assert path.stat().st_mtime_ns == stamp
    assert [p.name for p in (tmp_path / "models").iterdir()] == [path.name]  # no temp files


def test_seed_changes_weights():
    first = onnx.load(vision_model("shufflenet_v2_x1_0"))
    second = vision_module.build_vision_model("shufflenet_v2_x1_0", seed=1)
    name = "conv1.0.weight"
    values = [onnx.numpy_helper.to_array(next(t for t in model.graph.initializer
                                              if t.name == name)) for model in (first, second)]
    assert values[0].shape == values[1].shape == (24, 3, 3, 3)
    assert not np.allclose(values[0], values[1])


def test_unknown_name():
    with pytest.raises(OpfusionError, match="no vision model named 'resnet50'.*resnet18"):
        vision_model("resnet50")
