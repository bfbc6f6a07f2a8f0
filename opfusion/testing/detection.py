"""A detection head for tests and benchmarks: features -> boxes and class scores ->
NonMaxSuppression -> the kept boxes gathered. How many boxes it keeps depends on the input,
so opfusion runs it in stages (:mod:`opfusion.frontend.onnx.staged`)."""

from __future__ import annotations

from typing import Any

import numpy as np


def nms_model(boxes: int = 64, features: int = 16, classes: int = 3, seed: int = 0,
              max_per_class: int = 8, iou_threshold: float = 0.5,
              score_threshold: float = 0.3) -> Any:
    """An ONNX model (opset 17, random weights) with input ``features`` [1, boxes, features]
    and outputs ``selected`` [kept, 3] (batch, class, box), ``kept_boxes`` [kept, 4] and
    ``kept_scores`` [kept]."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    scale = 1 / np.sqrt(features)
    weights = {
        "w_center": (rng.standard_normal((features, 2)) * scale).astype(np.float32),
        "w_size": (rng.standard_normal((features, 2)) * scale).astype(np.float32),
        "w_class": (rng.standard_normal((features, classes)) * scale).astype(np.float32),
        "half": np.array(0.5, np.float32),
        "limit": np.array([max_per_class], np.int64),
        "iou": np.array([iou_threshold], np.float32),
        "threshold": np.array([score_threshold], np.float32),
        "box_start": np.array([2], np.int64),
        "box_end": np.array([3], np.int64),
        "one_axis": np.array([1], np.int64),
    }
    node = helper.make_node
    nodes = [
        # boxes as (y1, x1, y2, x2): a center and a positive half size around it
        node("MatMul", ["features", "w_center"], ["center"]),
        node("MatMul", ["features", "w_size"], ["size_raw"]),
        node("Softplus", ["size_raw"], ["size"]),
        node("Mul", ["size", "half"], ["half_size"]),
        node("Sub", ["center", "half_size"], ["low"]),
        node("Add", ["center", "half_size"], ["high"]),
        node("Concat", ["low", "high"], ["boxes"], axis=2),
        node("MatMul", ["features", "w_class"], ["logits"]),
        node("Sigmoid", ["logits"], ["probs"]),
        node("Transpose", ["probs"], ["scores"], perm=[0, 2, 1]),
        node("NonMaxSuppression", ["boxes", "scores", "limit", "iou", "threshold"],
             ["selected"], name="nms"),
        node("Slice", ["selected", "box_start", "box_end", "one_axis"], ["box_column"]),
        node("Squeeze", ["box_column", "one_axis"], ["box_index"]),
        node("Squeeze", ["boxes", "zero_axis"], ["boxes_2d"]),
        node("Gather", ["boxes_2d", "box_index"], ["kept_boxes"], axis=0),
        node("GatherND", ["scores", "selected"], ["kept_scores"]),
    ]
    weights["zero_axis"] = np.array([0], np.int64)
    graph = helper.make_graph(
        nodes, "detection_head",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, [1, boxes, features])],
        [helper.make_tensor_value_info("selected", TensorProto.INT64, None),
         helper.make_tensor_value_info("kept_boxes", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("kept_scores", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(array, name) for name, array in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
