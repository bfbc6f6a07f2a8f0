"""transformer_model(): ONNX builds of a BERT-base encoder layer and a GPT-2 decoder block with
random weights. Each is valid ONNX of the right size whose output depends on the input; the
interpreter agrees with onnxruntime, and the compiled model with the interpreter (the
vectorized erf of BERT's GELU, and GPT-2's tanh GELU and causal mask, included)."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

import opfusion as opf  # noqa: E402
from opfusion import OpfusionError  # noqa: E402
from opfusion.frontend import from_onnx  # noqa: E402
from opfusion.testing import TRANSFORMER_MODEL_NAMES, assert_close, transformer_model  # noqa: E402

#: 12 heads x (3 projections + output) of 768x768, two feed-forward layers of 768x3072, with
#: their biases, and two LayerNorms.
WEIGHTS = 4 * (768 * 768 + 768) + 768 * 3072 + 3072 + 3072 * 768 + 768 + 2 * 2 * 768


@pytest.fixture(scope="module", params=TRANSFORMER_MODEL_NAMES)
def block(request):
    path = transformer_model(request.param)
    model = onnx.load(path)
    rng = np.random.default_rng(5)
    inputs = [rng.standard_normal((1, 128, 768), dtype=np.float32) for _ in range(2)]
    mod, params = from_onnx(model)
    return request.param, path, model, inputs, mod, params


def test_valid_onnx_of_bert_base_size(block):
    _, _, model, *_ = block
    onnx.checker.check_model(model)
    weights = sum(int(np.prod(t.dims)) for t in model.graph.initializer
                  if t.data_type == onnx.TensorProto.FLOAT and len(t.dims) > 0
                  and int(np.prod(t.dims)) >= 768 and "mask" not in t.name)
    assert weights == WEIGHTS


def test_compiled_matches_interpreter_and_onnxruntime(block):
    ort = pytest.importorskip("onnxruntime")
    _, path, _, inputs, mod, params = block
    exe = opf.compile(mod, params=params)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    outs = []
    for x in inputs:
        want = session.run(None, {"input": x})[0]
        assert_close(opf.ir.evaluate(mod, [x]), want, rtol=1e-4)
        (got,) = exe.run({"input": x})
        assert_close(got, want, rtol=1e-4)
        outs.append(got)
    assert np.abs(outs[0] - outs[1]).max() > 0.1 * np.abs(outs[0]).max()


def test_unknown_name():
    with pytest.raises(OpfusionError, match="unknown transformer model 'bert'.*bert_layer"):
        transformer_model("bert")
