"""ONNX ops whose output size depends on the data, beyond NonZero and Unique
(onnx_ops.py): NonMaxSuppression -> cuvil.nms (ir/ops/dynamic.py).

NonMaxSuppression(boxes [B, N, 4], scores [B, C, N], max_output_boxes_per_class,
iou_threshold, score_threshold; center_point_box) selects, for each batch and class,
the boxes with a score > score_threshold (when given) in decreasing score (ties: lower
index), dropping one whose IoU with a box selected before it in its class is
> iou_threshold, at most max_output_boxes_per_class per class (0 or absent: none).
Result [num_selected, 3] int64 rows (batch, class, box), by batch, class, then order of
selection. The three scalar inputs must be known at compile time.

The boxes become (x1, y1, x2, y2) with ordinary ops (corners: the min and max of each
coordinate pair; centers: center -/+ size / 2, in ONNX's float32 order), repeated for
each class: one cuvil.nms over the B*C*N (batch, class, box) triples with the group
b*C + c as the class (`by_class` order), whose kept flat indices become the rows. ONNX
calls a pair with no overlap or no area "not suppressed" whatever the threshold, so a
negative iou_threshold acts as 0.
"""
from __future__ import annotations

import numpy as np

from ..errors import UnsupportedOpError
from .graph import produced_dim
from .onnx_common import handles, operand, scalar


def _corners(low, boxes, center: bool):
    """boxes [B, N, 4] as ONNX gives them -> [B, N, 4] (x1, y1, x2, y2)."""
    bsz, n = boxes.shape[0], boxes.shape[1]
    col = [low.op("cuvil.slice", boxes, starts=[0, 0, k], ends=[bsz, n, k + 1], steps=[1, 1, 1]) for k in range(4)]
    if center:  # [x_center, y_center, width, height]
        two = low.const(np.float32(2.0))
        half_w, half_h = low.op("cuvil.div", col[2], two), low.op("cuvil.div", col[3], two)
        parts = [low.op("cuvil.sub", col[0], half_w), low.op("cuvil.sub", col[1], half_h),
                 low.op("cuvil.add", col[0], half_w), low.op("cuvil.add", col[1], half_h)]
    else:  # [y1, x1, y2, x2], any diagonal pair of corners
        parts = [low.op("cuvil.minimum", col[1], col[3]), low.op("cuvil.minimum", col[0], col[2]),
                 low.op("cuvil.maximum", col[1], col[3]), low.op("cuvil.maximum", col[0], col[2])]
    return low.op("cuvil.concat", *parts, axis=2)


@handles("NonMaxSuppression")
def _non_max_suppression(low, node):
    boxes, scores = operand(low, node, 0), operand(low, node, 1)
    if not (boxes.type.is_static and scores.type.is_static):
        raise UnsupportedOpError(f"NonMaxSuppression of symbolic shapes ({boxes.type}, {scores.type}) is not supported")
    if boxes.type.rank != 3 or boxes.shape[2] != 4 or scores.type.rank != 3 or \
            scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
        raise UnsupportedOpError(f"NonMaxSuppression takes boxes [B, N, 4] and scores [B, C, N], got "
                                 f"{boxes.type} and {scores.type}")
    bsz, classes, n = scores.shape
    present = [i < len(node.inputs) and node.inputs[i] for i in range(5)]
    limit = max(int(scalar(low, node, 2, "max_output_boxes_per_class")), 0) if present[2] else 0
    iou = float(np.float32(scalar(low, node, 3, "iou_threshold"))) if present[3] else 0.0
    attrs = {"iou_threshold": max(iou, 0.0), "by_class": True, "max_per_class": limit}
    if present[4]:
        attrs["score_threshold"] = float(np.float32(scalar(low, node, 4, "score_threshold")))
    total = bsz * classes * n
    if limit == 0 or total == 0:
        return low.const(np.zeros((0, 3), np.int64))
    xyxy = _corners(low, low.cast(boxes, "f32"), bool(node.attr("center_point_box", 0)))
    per_class = low.op("cuvil.broadcast_to", low.reshape(xyxy, [bsz, 1, n, 4]), shape=[bsz, classes, n, 4])
    group = low.const(np.repeat(np.arange(bsz * classes, dtype=np.int64), n))
    keep = low.op("cuvil.nms", low.reshape(per_class, [total, 4]), low.reshape(low.cast(scores, "f32"), [total]),
                  group, size=produced_dim(low, "nms", total), **attrs)
    k = keep.shape[0]
    keep = low.reshape(keep, [k, 1])
    g = low.op("cuvil.div", keep, low.const(np.int64(n)))  # the group, b * C + c
    b = low.op("cuvil.div", g, low.const(np.int64(classes)))
    c = low.op("cuvil.sub", g, low.op("cuvil.mul", b, low.const(np.int64(classes))))
    i = low.op("cuvil.sub", keep, low.op("cuvil.mul", g, low.const(np.int64(n))))
    return low.op("cuvil.concat", b, c, i, axis=1)
