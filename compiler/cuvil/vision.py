"""Detection post-processing as PyTorch custom ops that Cuvil compiles into the graph:
torchvision.ops' `nms` and `batched_nms` without torchvision.

    import cuvil.vision
    keep = cuvil.vision.batched_nms(boxes, scores, classes, 0.5)  # or torch.ops.cuvil.batched_nms

Importing this module registers `torch.ops.cuvil.nms(boxes, scores, iou_threshold)`
and `torch.ops.cuvil.batched_nms(boxes, scores, idxs, iou_threshold)` with
torch.library: an eager implementation (what the model computes in PyTorch) and a fake
one whose result has a data-dependent length, so torch.export keeps them as single
nodes, which the PyTorch frontend lowers to `cuvil.nms` (docs/frameworks.md).

Semantics (torchvision's): boxes [N, 4] float32 as (x1, y1, x2, y2), scores [N]; the
result holds the indices of the kept boxes, int64, in decreasing score (equal scores:
lower index first). A box is dropped when its float32 IoU with a box already kept is
greater than iou_threshold (for batched_nms only a kept box of the same class,
`idxs`, counts: NMS per class, merged in score order).
"""
from __future__ import annotations

import torch

__all__ = ["batched_nms", "nms"]


def _where_max(a, b):
    return torch.where(a < b, b, a)  # C++'s std::max: torchvision's kernel


def _where_min(a, b):
    return torch.where(b < a, b, a)


def _greedy(boxes: torch.Tensor, scores: torch.Tensor, idxs: torch.Tensor | None, iou_threshold: float) -> torch.Tensor:
    boxes = boxes.to(torch.float32).reshape(-1, 4)
    order = torch.sort(scores.to(torch.float32), descending=True, stable=True).indices
    x1, y1, x2, y2 = boxes.unbind(1)
    areas = (x2 - x1) * (y2 - y1)
    suppressed = torch.zeros(len(order), dtype=torch.bool)
    keep = []
    for i in order.tolist():
        if suppressed[i]:
            continue
        keep.append(i)
        w = _where_max(torch.zeros(()), _where_min(x2[i], x2) - _where_max(x1[i], x1))
        h = _where_max(torch.zeros(()), _where_min(y2[i], y2) - _where_max(y1[i], y1))
        inter = w * h
        iou = inter / (areas[i] + areas - inter)
        hit = iou.to(torch.float64) > iou_threshold
        if idxs is not None:
            hit &= idxs == idxs[i]
        suppressed |= hit
    return torch.tensor(keep, dtype=torch.int64)


def _fake(boxes, scores):
    n = boxes.shape[0]
    size = torch.library.get_ctx().new_dynamic_size(max=n if isinstance(n, int) else None)
    return boxes.new_empty((size,), dtype=torch.int64)


@torch.library.custom_op("cuvil::nms", mutates_args=())
def _nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    return _greedy(boxes, scores, None, iou_threshold)


@torch.library.custom_op("cuvil::batched_nms", mutates_args=())
def _batched_nms(boxes: torch.Tensor, scores: torch.Tensor, idxs: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    return _greedy(boxes, scores, idxs, iou_threshold)


@_nms.register_fake
def _nms_fake(boxes, scores, iou_threshold):
    return _fake(boxes, scores)


@_batched_nms.register_fake
def _batched_nms_fake(boxes, scores, idxs, iou_threshold):
    return _fake(boxes, scores)


def nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """torchvision.ops.nms: the indices of the boxes kept, in decreasing score."""
    return torch.ops.cuvil.nms(boxes, scores, float(iou_threshold))


def batched_nms(boxes: torch.Tensor, scores: torch.Tensor, idxs: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """torchvision.ops.batched_nms: NMS within each class of `idxs`, the kept indices
    in decreasing score."""
    return torch.ops.cuvil.batched_nms(boxes, scores, idxs, float(iou_threshold))
