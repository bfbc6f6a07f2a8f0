"""Random-weight copies of the onnx package's nine "light" models, for tests and benchmarks.

The light models (resnet50, squeezenet, ...) keep real architectures but make every weight
with a ConstantOfShape node of one value: every channel is alike and the output is the same
for any input, so a numeric comparison on them proves nothing. :func:`light_model` writes a
copy in which each of those weights is a seeded random initializer of the same shape, then
calibrates every Conv and Gemm with opfusion's reference interpreter
(:mod:`opfusion.testing.calibrate`) so that activations keep unit scale at any depth and the
output really depends on the input.

A few models also ship real values for their first layers' biases, batch norms and scales
(resnet50, inception_v2, densenet121, ...). Next to random convolutions those describe nothing,
and they hurt: a batch norm whose running variance is 3900 shrinks its input to noise under a
constant bias, and the next calibrated layer amplifies the rounding errors of that difference.
So they are drawn from the same recipe as the rest.

Copies are written once into ``$OPFUSION_CACHE_DIR/models`` (default
``~/.cache/opfusion/models``), atomically, under a name that holds the model, the seed and
:data:`FORMAT_VERSION`; later calls return the cached path at once."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Container
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import OpfusionError
from .calibrate import Layer, calibrate

LIGHT_MODEL_NAMES: tuple[str, ...] = (
    "bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
    "squeezenet", "vgg19", "zfnet512",
)

# Deep random networks amplify float32 rounding differences (another summation order in a
# convolution) layer by layer: ONNX Runtime itself differs from the reference interpreter by
# 1.3-2.2e-4 (resnet50) and 2.9e-5 (vgg19) of the output's largest value on these copies; on
# inception_v2 ONNX Runtime, opfusion in NCHW and in NCHW16c each range from 1e-5 to 1.1e-4
# over four input seeds, and on an H200 opfusion's CUDA kernels differ by 1.4e-4 on vgg19
# (its 25088-long dense sums in another order). These get the tolerance ONNX Runtime would
# need; every other light model is held to 1e-4 of its output's largest value.
LIGHT_MODEL_TOLERANCE: dict[str, float] = {"resnet50": 3e-4, "vgg19": 2e-4, "inception_v2": 2e-4}


def light_model_tolerance(name: str) -> float:
    """The relative tolerance a light model's outputs are compared with (see above)."""
    return LIGHT_MODEL_TOLERANCE.get(name, 1e-4)


# Bump when the generated weights change, so stale copies in a cache are not reused.
FORMAT_VERSION = "v2"
# Standard-normal inputs the calibration averages over: enough to centre a unit that holds one
# value per input (the logits); each sample costs one forward pass (vgg19: ~2.5 s).
CALIBRATION_SAMPLES = 4

# Nodes that only re-arrange a weight on its way to the layer that reads it.
_RESHAPING = ("Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity")


def models_dir() -> Path:
    """Where generated models are cached: ``$OPFUSION_CACHE_DIR/models`` or
    ``~/.cache/opfusion/models``."""
    root = os.environ.get("OPFUSION_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "opfusion")
    return Path(root) / "models"


def shipped_light_model(name: str) -> Path:
    """The path of the original light model in the onnx package (constant weights: use it
    only for import and structure checks, never to compare numbers)."""
    import onnx

    name = _check_name(name)
    return Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"light_{name}.onnx"


def light_model(name: str, seed: int = 0) -> Path:
    """The path of a random-weight, calibrated copy of light model ``name`` (one of
    :data:`LIGHT_MODEL_NAMES`; a ``light_`` prefix is accepted).

    Generated on first use (seconds to tens of seconds per model) and cached; feed it
    standard-normal inputs."""
    name = _check_name(name)
    path = models_dir() / f"light_{name}_seed{int(seed)}_{FORMAT_VERSION}.onnx"
    if path.is_file():
        return path
    model = randomized_light_model(name, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(model, path)
    return path


def _check_name(name: str) -> str:
    short = name.removeprefix("light_")
    if short not in LIGHT_MODEL_NAMES:
        raise OpfusionError(f"no light model named {name!r}; the names are "
                            f"{', '.join(LIGHT_MODEL_NAMES)}")
    return short


def write_atomically(model: Any, path: Path) -> None:
    """Write ``model`` (an ``onnx.ModelProto``) to ``path`` so that no reader sees a partial
    file."""
    # A temporary file in the same directory, renamed into place: readers never see half a
    # file, and two processes generating the same model both end with a complete one.
    handle, temp = tempfile.mkstemp(prefix=path.stem + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(model.SerializeToString())
        os.chmod(temp, 0o644)  # mkstemp makes it private; the cache is an ordinary file
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.remove(temp)
        raise


def randomized_light_model(name: str, seed: int = 0) -> Any:
    """The random-weight, calibrated copy of light model ``name`` as an ``onnx.ModelProto``
    (not cached; :func:`light_model` caches it)."""
    import onnx

    model = onnx.load(shipped_light_model(name))
    model = _randomize(model, np.random.default_rng(seed))
    calibrate_onnx_model(model, np.random.default_rng([seed, 1]))
    onnx.checker.check_model(model)
    return model


# ---------------------------------------------------------------------------------------------
# random weights


def _randomize(model: Any, rng: np.random.Generator) -> Any:
    """A copy of ``model`` whose weights (ConstantOfShape outputs and floating-point
    initializers) are random initializers of the same names and shapes, drawn in the order the
    nodes read them; bias-less convolutions not followed by a batch norm get a zero bias (so
    calibration can centre them)."""
    from onnx import helper, numpy_helper

    graph = model.graph
    known = {tensor.name: numpy_helper.to_array(tensor) for tensor in graph.initializer}
    readers = _readers(graph)
    wanted: dict[str, tuple[list[int], np.dtype]] = {}  # weight name -> shape, dtype
    nodes = []
    for node in graph.node:
        if node.op_type == "ConstantOfShape" and node.input and node.input[0] in known:
            fill = next((numpy_helper.to_array(a.t) for a in node.attribute if a.name == "value"),
                        np.zeros(1, np.float32))
            wanted[node.output[0]] = ([int(d) for d in known[node.input[0]]], fill.dtype)
        else:
            nodes.append(node)
    for name, array in known.items():
        if array.dtype.kind == "f" and name in readers:
            wanted[name] = (list(array.shape), array.dtype)
    made: dict[str, Any] = {}
    for node in nodes:
        for name in node.input:
            if name in wanted and name not in made:
                shape, dtype = wanted[name]
                reader, slot = _weight_reader(name, readers)
                value = random_weight(rng, reader, slot, shape).astype(dtype)
                made[name] = numpy_helper.from_array(value, name)

    names = {name for node in graph.node for name in (*node.input, *node.output)}
    names |= set(known) | {value.name for value in graph.input}
    dims = {name: list(tensor.dims) for name, tensor in made.items()}
    for node in nodes:
        has_bias = len(node.input) > 2 and node.input[2]
        if node.op_type == "Conv" and not has_bias and not _batch_norm_mean(node, readers, dims):
            bias = _unique(f"{node.output[0]}_bias", names)
            made[bias] = numpy_helper.from_array(
                np.zeros(dims[node.input[1]][0], np.float32), bias)
            del node.input[2:]
            node.input.append(bias)
    used = {name for node in nodes for name in node.input} | {v.name for v in graph.output}
    initializers = [t for t in graph.initializer if t.name in used and t.name not in made]
    initializers += made.values()
    inputs = [value for value in graph.input if value.name not in known]
    if model.ir_version < 4:  # before IR 4 every initializer is also a graph input
        inputs += [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                   for t in initializers]
    new_graph = helper.make_graph(nodes, graph.name, inputs, list(graph.output), initializers,
                                  value_info=list(graph.value_info))
    return helper.make_model(new_graph, opset_imports=list(model.opset_import),
                             ir_version=model.ir_version, producer_name="opfusion.testing.light")


def _readers(graph: Any) -> dict[str, list[tuple[Any, int]]]:
    readers: dict[str, list[tuple[Any, int]]] = {}
    for node in graph.node:
        for slot, name in enumerate(node.input):
            readers.setdefault(name, []).append((node, slot))
    return readers


def _weight_reader(name: str, readers: dict[str, list[tuple[Any, int]]]) -> tuple[Any, int]:
    """The node (and input slot) that uses a weight, looking through reshaping nodes."""
    while True:
        users = readers.get(name)
        if not users:
            raise OpfusionError(f"light model weight {name!r} is not read by any node")
        node, slot = users[0]
        if node.op_type in _RESHAPING and slot == 0 and len(readers.get(node.output[0], [])) == 1:
            name = node.output[0]
            continue
        return node, slot


def random_weight(rng: np.random.Generator, node: Any, slot: int, shape: list[int]
                  ) -> np.ndarray:
    """A random value for input ``slot`` of ONNX ``node``: a Conv or Gemm weight of standard
    deviation 1/sqrt(fan-in), a small bias, a batch norm's scale near 1 with mean 0 and
    variance 1, or a scale near 1 for anything else."""
    op = node.op_type
    if op in ("Conv", "Gemm") and slot == 1:
        if op == "Gemm" and len(shape) == 2 and not _attr(node, "transB", 0):
            fan_in = shape[0]  # B is (K, N)
        else:
            fan_in = int(np.prod(shape[1:]))  # output channels first: OIHW, or (N, K)
        # float32 draws: vgg19 holds 143 million weights.
        std = np.float32(1 / np.sqrt(max(fan_in, 1)))
        return rng.standard_normal(shape, dtype=np.float32) * std
    if op in ("Conv", "Gemm"):  # biases
        return rng.normal(0.0, 0.05, shape)
    if op == "BatchNormalization":  # inputs: data, scale, bias, mean, variance
        if slot == 1:
            return rng.uniform(0.8, 1.2, shape)
        if slot == 2:
            return rng.normal(0.0, 0.1, shape)
        return np.zeros(shape) if slot == 3 else np.ones(shape)
    if op in ("Add", "Sub"):  # a bias spelled as arithmetic (densenet's scale layers)
        return rng.normal(0.0, 0.1, shape)
    return rng.uniform(0.5, 1.5, shape)  # a scale: Mul, PRelu, ...


def _attr(node: Any, name: str, default: Any) -> Any:
    from onnx import helper

    for attr in node.attribute:
        if attr.name == name:
            return helper.get_attribute_value(attr)
    return default


def _batch_norm_mean(conv: Any, readers: dict[str, list[tuple[Any, int]]],
                     initializers: Container[str]) -> str | None:
    """The running-mean initializer of the batch norm that alone reads ``conv``'s output, if
    that mean is read by nothing else (it can then absorb the convolution's mean)."""
    users = readers.get(conv.output[0], [])
    if len(users) != 1 or users[0][0].op_type != "BatchNormalization" or users[0][1] != 0:
        return None
    norm = users[0][0]
    if len(norm.input) < 4:
        return None
    mean = norm.input[3]
    return mean if mean in initializers and len(readers.get(mean, [])) == 1 else None


def _unique(name: str, taken: set[str]) -> str:
    candidate, index = name, 1
    while candidate in taken:
        candidate, index = f"{name}_{index}", index + 1
    taken.add(candidate)
    return candidate


# ---------------------------------------------------------------------------------------------
# calibration


def calibrate_onnx_model(model: Any, rng: np.random.Generator,
                         skip: Container[str] = ()) -> None:
    """Standardize every Conv and Gemm of ``model`` (in place) with opfusion's interpreter.

    Each needs an initializer weight and either a bias initializer or a batch norm that alone
    reads its output (whose running mean absorbs the layer's mean); others, and those whose
    weight is named in ``skip``, are left as they are."""
    import onnx
    from onnx import helper, numpy_helper

    from ..frontend.onnx import from_onnx

    graph = model.graph
    tensors = {tensor.name: tensor for tensor in graph.initializer}
    readers = _readers(graph)
    producer = {name: node for node in graph.node for name in node.output}
    layers: list[tuple[str, dict[str, Any]]] = []  # (output name, the Layer's other fields)
    for node in graph.node:
        if node.op_type not in ("Conv", "Gemm") or len(node.input) < 2:
            continue
        weight = node.input[1]
        while weight not in tensors and weight in producer and \
                producer[weight].op_type in _RESHAPING:
            weight = producer[weight].input[0]
        if weight not in tensors:
            continue  # a weight computed at run time: not ours to calibrate
        if weight in skip:
            continue
        conv = node.op_type == "Conv"
        bias = node.input[2] if len(node.input) > 2 and node.input[2] in tensors else None
        mean = None if bias else _batch_norm_mean(node, readers, tensors)
        if bias is None and mean is None:
            continue  # nothing can absorb its mean (_randomize gives every such conv a bias)
        layers.append((node.output[0], dict(
            weight=weight, weight_axis=0 if conv or _attr(node, "transB", 0) else 1,
            channel_axis=1 if conv else -1, bias=bias, bn_mean=mean,
            bias_scale=1.0 if conv else float(_attr(node, "beta", 1.0)))))

    # Every layer's output becomes an output of the imported function, so the interpreter's
    # value for it can be found (and patched) by expression. The outputs are added to the model
    # for the import only: a copy of vgg19's proto would cost half a gigabyte.
    outputs = [value.name for value in graph.output]
    original = len(outputs)
    for name, _ in layers:
        if name not in outputs:
            graph.output.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
            outputs.append(name)
    try:
        mod, _ = from_onnx(model)
    finally:
        del graph.output[original:]
    func = mod["main"]
    values = func.body.fields if len(outputs) > 1 else (func.body,)
    expr_of = dict(zip(outputs, values))
    calibrated = [Layer(expr_of[name], **spec) for name, spec in layers]
    names = {spec[key] for _, spec in layers for key in ("weight", "bias", "bn_mean")}
    names.discard(None)
    weights = {name: numpy_helper.to_array(tensors[name]) for name in sorted(names)}
    (data,) = func.params
    shape, dtype = data.type_annotation.shape, data.type_annotation.dtype
    samples = [{data.name_hint: rng.standard_normal(shape).astype(dtype)}
               for _ in range(CALIBRATION_SAMPLES)]
    new = calibrate(func, calibrated, weights, samples)
    for name in weights:
        tensors[name].CopyFrom(numpy_helper.from_array(new[name], name))
