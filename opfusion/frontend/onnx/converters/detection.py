"""Converter of ONNX's NonMaxSuppression: how many boxes it keeps depends on their values, so
its inputs are taken as constants (frozen by the ONNX backend, or computed by an earlier stage
of a staged run: :mod:`opfusion.frontend.onnx.staged`) and its result computed with NumPy."""

from __future__ import annotations

import numpy as np

from ....ir.expr import Constant, Expr
from ..registry import OnnxNode, converter
from .tensor import present, required_const


@converter("NonMaxSuppression", since=10)
def non_max_suppression_10(node: OnnxNode) -> Expr:
    boxes = required_const(node, 0, "boxes; how many boxes are kept depends on their values")
    scores = required_const(node, 1, "scores; how many boxes are kept depends on them")
    if boxes.ndim != 3 or boxes.shape[2] != 4:
        raise node.error(f"boxes must be [batches, boxes, 4], got shape {boxes.shape}")
    if scores.ndim != 3 or scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
        raise node.error(f"scores must be [batches, classes, boxes] = [{boxes.shape[0]}, C, "
                         f"{boxes.shape[1]}], got shape {scores.shape}")
    limit = _scalar(node, 2, "max_output_boxes_per_class", 0)
    iou = _scalar(node, 3, "iou_threshold", 0.0)
    threshold = _scalar(node, 4, "score_threshold", None)
    center = int(node.attr("center_point_box", 0))
    if center not in (0, 1):
        raise node.error(f"center_point_box={center} must be 0 or 1")
    return Constant(non_max_suppression(boxes, scores, int(max(limit, 0)), float(iou),
                                        None if threshold is None else float(threshold),
                                        center_point=bool(center)))


def _scalar(node: OnnxNode, index: int, what: str, default: float | int | None
            ) -> float | int | None:
    value = present(node.const_input(index, what)) if node.optional_input(index) else None
    if value is None:
        return default
    if value.size != 1:
        raise node.error(f"input {index} ({what}) must hold one value, got shape {value.shape}")
    return value.reshape(-1)[0].item()


def non_max_suppression(boxes: np.ndarray, scores: np.ndarray, limit: int, iou_threshold: float,
                        score_threshold: float | None, center_point: bool = False
                        ) -> np.ndarray:
    """ONNX NonMaxSuppression: per batch and class, boxes by descending score (ties to the
    lower index), each kept unless its IoU with a kept one exceeds ``iou_threshold``, at most
    ``limit`` per class, only scores above ``score_threshold``. Returns [kept, 3] int64 rows
    (batch, class, box) in that order."""
    corners = _corners(boxes.astype(np.float64), center_point)
    areas = (corners[..., 2] - corners[..., 0]) * (corners[..., 3] - corners[..., 1])
    selected: list[tuple[int, int, int]] = []
    for batch in range(scores.shape[0]):
        for cls in range(scores.shape[1]):
            row = scores[batch, cls]
            order = np.argsort(-row.astype(np.float64), kind="stable")
            if score_threshold is not None:
                order = order[row[order] > score_threshold]
            # Greedy: the best remaining box is kept and suppresses the rest it overlaps
            # (one vector step per kept box, at most ``limit`` steps).
            kept: list[int] = []
            while order.size and len(kept) < limit:
                box, order = int(order[0]), order[1:]
                kept.append(box)
                order = order[_iou(corners[batch], areas[batch], box, order) <= iou_threshold]
            selected.extend((batch, cls, box) for box in kept)
    return np.array(selected, dtype=np.int64).reshape(-1, 3)


def _corners(boxes: np.ndarray, center_point: bool) -> np.ndarray:
    """[..., 4] boxes as (x_min, y_min, x_max, y_max) whichever corners or centers they give."""
    if center_point:  # (x_center, y_center, width, height)
        half_w, half_h = boxes[..., 2] / 2, boxes[..., 3] / 2
        return np.stack([boxes[..., 0] - half_w, boxes[..., 1] - half_h,
                         boxes[..., 0] + half_w, boxes[..., 1] + half_h], axis=-1)
    # (y1, x1, y2, x2) with either diagonal pair of corners
    y1, x1, y2, x2 = (boxes[..., i] for i in range(4))
    return np.stack([np.minimum(x1, x2), np.minimum(y1, y2), np.maximum(x1, x2),
                     np.maximum(y1, y2)], axis=-1)


def _iou(corners: np.ndarray, areas: np.ndarray, box: int, others: np.ndarray) -> np.ndarray:
    """IoU of ``box`` with each of ``others`` (0 where boxes do not overlap or are empty)."""
    mine, theirs = corners[box], corners[others]
    width = np.minimum(mine[2], theirs[:, 2]) - np.maximum(mine[0], theirs[:, 0])
    height = np.minimum(mine[3], theirs[:, 3]) - np.maximum(mine[1], theirs[:, 1])
    inter = np.where((width > 0) & (height > 0), width * height, 0.0)
    union = areas[box] + areas[others] - inter
    valid = (inter > 0) & (areas[box] > 0) & (areas[others] > 0) & (union > 0)
    return np.where(valid, inter / np.where(union > 0, union, 1.0), 0.0)
