"""The nine "light" models shipped in the onnx package: they import, and they compute.

The light models keep the real architectures (resnet50, squeezenet, ...) but build every weight
with a ConstantOfShape of one value: every channel is alike and the output is the same constant
for any input. So ``test_matches_shipped_output`` (issue 3's bar) proves only that the model
imports and runs, not that opfusion computes it correctly. ``test_random_weights_match_onnx``
is the check that proves numbers: the weights become seeded random initializers, and
opfusion's interpreter must agree with ``onnx.reference.ReferenceEvaluator`` on a
standard-normal input, on the logits as well as the output (the final Softmax of a random
network saturates, and would hide errors).

The oracle needs two corrections (onnx 1.23): its BatchNormalization-9 always normalizes with
the batch statistics (``momentum`` has a default, so the inference branch is dead code) and its
Softmax ignores the 2-D coercion of opsets < 13, so it runs on the model converted to opset 15
by ``onnx.version_converter``; its LRN loops over the batch axis instead of the channels, so
``LRN`` below (the spec's formula) replaces it. opfusion runs the original opset-9 model."""

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import helper, numpy_helper, version_converter  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402
from onnx.reference.ops.op_lrn import LRN as _BuggyLRN  # noqa: E402

import opfusion as opf  # noqa: E402
from opfusion.frontend import from_onnx  # noqa: E402
from opfusion.testing import assert_close  # noqa: E402

LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
NAMES = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
         "shufflenet", "squeezenet", "vgg19", "zfnet512"]


def light_model(name):
    return onnx.load(LIGHT_DIR / f"light_{name}.onnx")


def data_input(model):
    initializers = {tensor.name for tensor in model.graph.initializer}
    return next(value for value in model.graph.input if value.name not in initializers)


def shipped_output(name):
    tensor = onnx.TensorProto()
    tensor.ParseFromString((LIGHT_DIR / f"light_{name}_output_0.pb").read_bytes())
    return numpy_helper.to_array(tensor)


@pytest.mark.parametrize("name", NAMES)
def test_matches_shipped_output(name):
    # Proves only that the model imports and runs (its output is input-independent).
    model = light_model(name)
    mod, params = from_onnx(model)
    assert params == {}
    shape = [dim.dim_value for dim in data_input(model).type.tensor_type.shape.dim]
    x = (np.arange(np.prod(shape)).reshape(shape) / np.prod(shape)).astype(np.float32)
    want = shipped_output(name)
    got = opf.ir.evaluate(mod, [x])
    assert_close(got, want, rtol=1e-4)


# ---------------------------------------------------------------------------------------------
# random weights


def randomize(model, seed=0):
    """A copy of ``model`` whose ConstantOfShape weights are seeded random initializers:
    N(0, 2/fan_in) for Conv and Gemm weights (He init: ReLU networks keep their scale with
    depth), N(0, 0.05) for their biases, BatchNormalization with scale U(0.8, 1.2), bias
    N(0, 0.1), mean 0 and variance 1. Every Conv's output and, last, the logits (the input of
    the last Softmax) become graph outputs too, so that every layer is compared."""
    rng = np.random.default_rng(seed)
    graph = model.graph
    known = {tensor.name: numpy_helper.to_array(tensor) for tensor in graph.initializer}
    user = {}
    for node in graph.node:
        for slot, name in enumerate(node.input):
            user.setdefault(name, (node, slot))
    nodes, weights = [], []
    for node in graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in known:
            shape = [int(d) for d in known[node.input[0]]]
            value = _random_weight(rng, *user[node.output[0]], shape)
            weights.append(numpy_helper.from_array(value.astype(np.float32), node.output[0]))
        else:
            nodes.append(node)
    used = {name for node in nodes for name in node.input}
    initializers = [t for t in graph.initializer if t.name in used] + weights
    inputs = [value for value in graph.input if value.name not in known]  # IR < 4 lists both
    probes = [node.output[0] for node in nodes if node.op_type == "Conv"]
    probes += [node.input[0] for node in nodes if node.op_type == "Softmax"][-1:]
    outputs = list(graph.output) + [
        helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None) for name in probes]
    new_graph = helper.make_graph(nodes, graph.name, inputs, outputs, initializers)
    # IR 4 lets initializers stay out of the graph inputs.
    return helper.make_model(new_graph, opset_imports=list(model.opset_import),
                             ir_version=max(model.ir_version, 4))


def _random_weight(rng, node, slot, shape):
    if node.op_type in ("Conv", "Gemm") and slot == 1:
        if node.op_type == "Conv":
            fan_in = int(np.prod(shape[1:]))
        else:
            trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
            fan_in = shape[1] if trans_b else shape[0]
        return rng.normal(0.0, np.sqrt(2.0 / fan_in), shape)
    if node.op_type in ("Conv", "Gemm"):
        return rng.normal(0.0, 0.05, shape)
    if node.op_type == "BatchNormalization":
        return {1: lambda: rng.uniform(0.8, 1.2, shape), 2: lambda: rng.normal(0.0, 0.1, shape),
                3: lambda: np.zeros(shape), 4: lambda: np.ones(shape)}[slot]()
    raise AssertionError(f"no random init for input {slot} of {node.op_type}")


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
    return ReferenceEvaluator(version_converter.convert_version(model, 15), new_ops=[LRN])


# The smaller architectures: onnx.reference runs each in one or two seconds.
RANDOM = ["squeezenet", "shufflenet", "resnet50", "bvlc_alexnet"]
RTOL = 1e-4  # of max|want|, per output; float32 sums in another order differ by ~1e-6


@pytest.fixture(scope="module", params=RANDOM)
def random_model(request):
    return request.param, randomize(light_model(request.param))


def test_random_weights_match_onnx(random_model):
    name, model = random_model
    rng = np.random.default_rng(1)
    data = data_input(model)
    x = rng.standard_normal([d.dim_value for d in data.type.tensor_type.shape.dim],
                            dtype=np.float32)
    want = tuple(oracle(model).run(None, {data.name: x}))
    mod, _ = from_onnx(model)
    got = opf.ir.evaluate(mod, [x])
    assert_close(got, want, rtol=RTOL)


def test_random_weights_make_the_output_depend_on_the_input(random_model):
    # Without this the comparison above could pass on a constant output, as the shipped
    # models do. Global average pooling of i.i.d. noise varies little, so the logits of two
    # inputs differ by ~1.5% only; that is still 100 times the comparison's tolerance.
    name, model = random_model
    mod, _ = from_onnx(model)
    shape = mod["main"].params[0].type_annotation.shape
    rng = np.random.default_rng(2)
    first, second = (opf.ir.evaluate(mod, [rng.standard_normal(shape, dtype=np.float32)])
                     for _ in range(2))
    logits_1, logits_2 = first[-1], second[-1]
    assert np.abs(logits_1 - logits_2).max() > 100 * RTOL * np.abs(logits_1).max()
