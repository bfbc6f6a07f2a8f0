"""Random-weight ONNX sequence models, built without torch, for tests and benchmarks of the
recurrent layers (:mod:`opfusion.frontend.onnx.converters.recurrent`).

``lstm_model`` is a small sequence classifier in the operator forms ``torch.onnx.export``
gives an ``nn.LSTM`` model at opset 17: a MatMul + Add projection of every step's features
(an embedding-like input layer), a bidirectional LSTM whose final hidden states (``Y_h``,
both directions) are flattened per batch entry, and a Gemm classifier. Weights are standard
normal divided by sqrt(fan-in), so activations keep their scale; feed standard-normal input
``x`` of shape (seq_len, batch, features)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

OPSET = 17


def lstm_model(seq_len: int = 16, batch: int = 2, features: int = 8, embed: int = 16,
               hidden: int = 32, classes: int = 5, seed: int = 0,
               bidirectional: bool = True) -> Any:
    """An ``onnx.ModelProto``: input ``x`` (seq_len, batch, features) float32 -> MatMul/Add
    projection to ``embed`` -> LSTM (``hidden`` units, bidirectional unless told otherwise)
    -> last-step ``Y_h`` as (batch, directions * hidden) -> Gemm -> output ``logits``
    (batch, classes)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    directions = 2 if bidirectional else 1

    def weight(shape: tuple[int, ...], fan_in: int) -> np.ndarray:
        return (rng.standard_normal(shape) / math.sqrt(fan_in)).astype(np.float32)

    consts = {
        "embed_w": weight((features, embed), features),
        "embed_b": weight((embed,), embed),
        "lstm_w": weight((directions, 4 * hidden, embed), embed),
        "lstm_r": weight((directions, 4 * hidden, hidden), hidden),
        "lstm_b": weight((directions, 8 * hidden), hidden),
        "flat_shape": np.array([batch, directions * hidden], np.int64),
        "fc_w": weight((classes, directions * hidden), directions * hidden),
        "fc_b": weight((classes,), classes),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "embed_w"], ["projected"]),
        helper.make_node("Add", ["projected", "embed_b"], ["embedded"]),
        helper.make_node("LSTM", ["embedded", "lstm_w", "lstm_r", "lstm_b"], ["", "y_h"],
                         hidden_size=hidden,
                         direction="bidirectional" if bidirectional else "forward"),
        # Y_h is (directions, batch, hidden): batch first, then the directions side by side.
        helper.make_node("Transpose", ["y_h"], ["y_h_batch"], perm=[1, 0, 2]),
        helper.make_node("Reshape", ["y_h_batch", "flat_shape"], ["flat"]),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], transB=1),
    ]
    graph = helper.make_graph(
        nodes, "lstm_classifier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq_len, batch, features])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, classes])],
        [numpy_helper.from_array(value, name) for name, value in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    onnx.checker.check_model(model)
    return model
