"""Random-weight ONNX transformer blocks, built without torch, in the operator forms that
``torch.onnx.export`` gives Hugging Face's BERT and GPT-2 layers at opset 17:

- ``bert_layer``: one post-norm BERT-base encoder layer (hidden 768, 12 heads, 128 tokens,
  feed-forward 3072 with the exact GELU, ``x * 0.5 * (1 + Erf(x / sqrt 2))``): the Q, K and V
  projections as MatMul + Add, the heads split by Reshape and Transpose, scores by MatMul,
  Div by sqrt(64) and Softmax, the context merged back, then output projection, residual Add
  and LayerNormalization, the feed-forward block, residual and LayerNormalization again;
- ``gpt_block``: one pre-norm GPT-2 decoder block (hidden 768, 12 heads, 128 tokens) with the
  causal mask added to the scores (0 on and below the diagonal, -10000 above, as GPT-2's
  export has it) and the tanh form of GELU
  (``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``).

Weights are standard normal divided by sqrt(fan-in) (so every projection keeps its input's
scale), biases and LayerNorm parameters drawn near their usual values; input ``input`` is
(1, 128, 768) float32, output ``output`` the same shape. Copies are cached next to the light
models' (:func:`.light.models_dir`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import OpfusionError
from .light import models_dir, write_atomically

# Bump when the generated graphs or weights change, so stale copies in a cache are not reused.
FORMAT_VERSION = "v1"
OPSET = 17
HIDDEN, HEADS, SEQ, FFN = 768, 12, 128, 3072

TRANSFORMER_MODEL_NAMES = ("bert_layer", "gpt_block")


def transformer_model(name: str, seed: int = 0) -> Path:
    """The path of a random-weight ONNX copy of transformer block ``name`` (one of
    :data:`TRANSFORMER_MODEL_NAMES`), generated on first use and cached; feed it
    standard-normal inputs of shape (1, 128, 768)."""
    if name not in TRANSFORMER_MODEL_NAMES:
        raise OpfusionError(f"unknown transformer model {name!r}; known: "
                            f"{', '.join(TRANSFORMER_MODEL_NAMES)}")
    path = models_dir() / f"transformer_{name}_seed{int(seed)}_{FORMAT_VERSION}.onnx"
    if path.is_file():
        return path
    model = build_transformer_model(name, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(model, path)
    return path


def build_transformer_model(name: str, seed: int = 0) -> Any:
    """The ``onnx.ModelProto`` of :func:`transformer_model` (not cached)."""
    import onnx

    net = _Net(np.random.default_rng(seed))
    out = _bert_layer(net, "input") if name == "bert_layer" else _gpt_block(net, "input")
    model = net.model(name, out)
    onnx.checker.check_model(model)
    return model


class _Net:
    """Nodes and initializers of one graph, with unique names."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self.count = 0

    def name(self, stem: str) -> str:
        self.count += 1
        return f"{stem}_{self.count}"

    def const(self, stem: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        name = self.name(stem)
        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op_type: str, inputs: list[str], **attrs: Any) -> str:
        from onnx import helper

        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    def linear(self, x: str, fan_in: int, fan_out: int, scope: str) -> str:
        weight = self.rng.standard_normal((fan_in, fan_out)).astype("float32")
        weight /= np.float32(math.sqrt(fan_in))
        bias = (self.rng.standard_normal(fan_out) * 0.1).astype("float32")
        y = self.node("MatMul", [x, self.const(f"{scope}.weight", weight)])
        return self.node("Add", [y, self.const(f"{scope}.bias", bias)])

    def layer_norm(self, x: str, scope: str, epsilon: float) -> str:
        gamma = (1.0 + 0.1 * self.rng.standard_normal(HIDDEN)).astype("float32")
        beta = (0.1 * self.rng.standard_normal(HIDDEN)).astype("float32")
        return self.node("LayerNormalization", [x, self.const(f"{scope}.weight", gamma),
                                                self.const(f"{scope}.bias", beta)],
                         axis=-1, epsilon=epsilon)

    def shape(self, dims: tuple[int, ...]) -> str:
        return self.const("shape", np.array(dims, "int64"))

    def scalar(self, value: float) -> str:
        return self.const("scalar", np.array(value, "float32"))

    def model(self, name: str, out: str) -> Any:
        from onnx import TensorProto, helper

        shape = [1, SEQ, HIDDEN]
        graph = helper.make_graph(
            self.nodes, name,
            [helper.make_tensor_value_info("input", TensorProto.FLOAT, shape)],
            [helper.make_tensor_value_info(out, TensorProto.FLOAT, shape)],
            self.initializers)
        graph.output[0].name = out
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="opfusion.testing.transformer")
        model.ir_version = 8
        return model


def _attention(net: _Net, x: str, scope: str, mask: str | None) -> str:
    head = HIDDEN // HEADS

    def heads(y: str, axes: list[int]) -> str:  # (1, s, h*d) -> (1, h, s, d) or (1, h, d, s)
        y = net.node("Reshape", [y, net.shape((1, SEQ, HEADS, head))])
        return net.node("Transpose", [y], perm=axes)

    query = heads(net.linear(x, HIDDEN, HIDDEN, f"{scope}.query"), [0, 2, 1, 3])
    key = heads(net.linear(x, HIDDEN, HIDDEN, f"{scope}.key"), [0, 2, 3, 1])
    value = heads(net.linear(x, HIDDEN, HIDDEN, f"{scope}.value"), [0, 2, 1, 3])
    scores = net.node("Div", [net.node("MatMul", [query, key]), net.scalar(math.sqrt(head))])
    if mask is not None:
        scores = net.node("Add", [scores, mask])
    probs = net.node("Softmax", [scores], axis=-1)
    context = net.node("Transpose", [net.node("MatMul", [probs, value])], perm=[0, 2, 1, 3])
    context = net.node("Reshape", [context, net.shape((1, SEQ, HIDDEN))])
    return net.linear(context, HIDDEN, HIDDEN, f"{scope}.output")


def _gelu_erf(net: _Net, x: str) -> str:
    inner = net.node("Erf", [net.node("Div", [x, net.scalar(math.sqrt(2.0))])])
    half = net.node("Mul", [x, net.scalar(0.5)])
    return net.node("Mul", [half, net.node("Add", [inner, net.scalar(1.0)])])


def _gelu_tanh(net: _Net, x: str) -> str:
    cube = net.node("Mul", [net.node("Pow", [x, net.scalar(3.0)]), net.scalar(0.044715)])
    inner = net.node("Mul", [net.node("Add", [x, cube]), net.scalar(math.sqrt(2.0 / math.pi))])
    gate = net.node("Add", [net.node("Tanh", [inner]), net.scalar(1.0)])
    return net.node("Mul", [net.node("Mul", [x, net.scalar(0.5)]), gate])


def _bert_layer(net: _Net, x: str) -> str:
    attended = _attention(net, x, "attention", None)
    x = net.layer_norm(net.node("Add", [attended, x]), "attention.norm", 1e-12)
    inner = _gelu_erf(net, net.linear(x, HIDDEN, FFN, "intermediate"))
    out = net.linear(inner, FFN, HIDDEN, "output")
    return net.layer_norm(net.node("Add", [out, x]), "output.norm", 1e-12)


def _gpt_block(net: _Net, x: str) -> str:
    causal = np.triu(np.full((SEQ, SEQ), -10000.0, "float32"), k=1).reshape(1, 1, SEQ, SEQ)
    mask = net.const("attention.mask", causal)
    attended = _attention(net, net.layer_norm(x, "ln_1", 1e-5), "attention", mask)
    x = net.node("Add", [x, attended])
    inner = _gelu_tanh(net, net.linear(net.layer_norm(x, "ln_2", 1e-5), HIDDEN, FFN, "mlp.fc"))
    return net.node("Add", [x, net.linear(inner, FFN, HIDDEN, "mlp.proj")])
