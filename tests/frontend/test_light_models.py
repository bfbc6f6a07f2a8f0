"""The nine "light" models shipped in the onnx package: they import, and they compute.

The shipped light models keep the real architectures (resnet50, squeezenet, ...) but build
every weight with a ConstantOfShape of one value: every channel is alike and the output is the
same constant for any input. So on them only import and structure are tested
(``test_shipped_model_imports_and_runs``), never numbers. The numbers are checked on
``opfusion.testing.light_model`` copies, whose weights are seeded, calibrated random
initializers: opfusion's interpreter must agree with ``onnx.reference.ReferenceEvaluator`` on
a standard-normal input, on every convolution's output and on the logits as well as the output
(a final Softmax compresses differences). ``tests/testing/test_random_light_models.py`` checks
all nine copies against onnxruntime too.

The oracle needs two corrections (onnx 1.23): its BatchNormalization-9 always normalizes with
the batch statistics (``momentum`` has a default, so the inference branch is dead code) and its
Softmax ignores the 2-D coercion of opsets < 13, so it runs on the model converted to opset 15
by ``onnx.version_converter``; its LRN loops over the batch axis instead of the channels, so
``LRN`` below (the spec's formula) replaces it. opfusion runs the original opset-9 model."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import helper, numpy_helper, version_converter  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402
from onnx.reference.ops.op_lrn import LRN as _BuggyLRN  # noqa: E402

import opfusion as opf  # noqa: E402
from opfusion.frontend import from_onnx  # noqa: E402
from opfusion.ir import Call, post_order  # noqa: E402
from opfusion.testing import (  # noqa: E402
    LIGHT_MODEL_NAMES,
    assert_close,
    light_model,
    shipped_light_model,
)


def data_input(model):
    initializers = {tensor.name for tensor in model.graph.initializer}
    return next(value for value in model.graph.input if value.name not in initializers)


def shipped_output(name):
    tensor = onnx.TensorProto()
    path = shipped_light_model(name)
    tensor.ParseFromString(path.with_name(f"{path.stem}_output_0.pb").read_bytes())
    return numpy_helper.to_array(tensor)


@pytest.mark.parametrize("name", LIGHT_MODEL_NAMES)
def test_shipped_model_imports_and_runs(name):
    # Structure only: the output of a shipped light model does not depend on its input.
    model = onnx.load(shipped_light_model(name))
    mod, params = from_onnx(model)
    assert params == {}
    main = mod["main"]
    (data,) = main.params
    shape = tuple(dim.dim_value for dim in data_input(model).type.tensor_type.shape.dim)
    assert data.type_annotation.shape == shape
    calls = [node for node in post_order(main.body) if isinstance(node, Call)]
    convs = sum(node.op_type == "Conv" for node in model.graph.node)
    assert sum(call.op_name == "nn.conv2d" for call in calls) == convs
    want = shipped_output(name)
    got = opf.ir.evaluate(mod, [np.zeros(shape, np.float32)])
    assert got.shape == want.shape and got.dtype == want.dtype
    assert np.isfinite(got).all()


# ---------------------------------------------------------------------------------------------
# random weights


def with_probes(model):
    """A copy of ``model`` whose every Conv output and, last, the logits (the input of the last
    Softmax) are graph outputs too, so that every layer is compared."""
    probed = onnx.ModelProto()
    probed.CopyFrom(model)
    nodes = probed.graph.node
    probes = [node.output[0] for node in nodes if node.op_type == "Conv"]
    probes += [node.input[0] for node in nodes if node.op_type == "Softmax"][-1:]
    probed.graph.output.extend(
        helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None) for name in probes)
    return probed


class LRN(_BuggyLRN):
    """LRN as the ONNX spec defines it: the sum of squares runs over the channel window
    [c - floor((size-1)/2), c + ceil((size-1)/2)]."""

    def _run(self, x, alpha=None, beta=None, bias=None, size=None):
        channels = x.shape[1]
        before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
        squares = (x.astype(np.float64) ** 2)
        square_sum = np.zeros_like(squares)
        for c in range(channels):
            window = squares[:, max(0, c - before):min(channels, c + after + 1)]
            square_sum[:, c] = window.sum(axis=1)
        return ((x / (bias + alpha / size * square_sum) ** beta).astype(x.dtype),)


def oracle(model):
    # The oracle takes IR >= 4, where initializers need not be graph inputs.
    converted = version_converter.convert_version(model, 15)
    initializers = {tensor.name for tensor in converted.graph.initializer}
    inputs = [value for value in converted.graph.input if value.name not in initializers]
    del converted.graph.input[:]
    converted.graph.input.extend(inputs)
    converted.ir_version = max(converted.ir_version, 8)
    return ReferenceEvaluator(converted, new_ops=[LRN])


# The smaller architectures: onnx.reference runs each in one or two seconds.
RANDOM = ["squeezenet", "shufflenet", "resnet50", "bvlc_alexnet"]
# Of max|want|, per output. Float32 sums in another order differ by ~1e-6 at the first layer;
# a deep random network amplifies that to ~1e-4 at its last (resnet50).
RTOL = 1e-3


@pytest.mark.parametrize("name", RANDOM)
def test_random_weights_match_onnx(name):
    model = with_probes(onnx.load(light_model(name)))
    rng = np.random.default_rng(1)
    data = data_input(model)
    x = rng.standard_normal([d.dim_value for d in data.type.tensor_type.shape.dim],
                            dtype=np.float32)
    want = tuple(oracle(model).run(None, {data.name: x}))
    mod, _ = from_onnx(model)
    got = opf.ir.evaluate(mod, [x])
    assert_close(got, want, rtol=RTOL)
