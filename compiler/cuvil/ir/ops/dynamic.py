"""Ops whose result size depends on the data: nonzero (with gather: masked_select and
boolean-mask indexing) and unique (with its inverse and counts).

Such a result has a symbolic dim of its own, named by the op's `size` attribute (a
*produced* symbol: no input binds it). Its bounds are [0, the largest possible count]
in the function's `dim_bounds`; memory is planned at the upper bound, and the op's
kernel stores the count it found into the run's symbol values, so every later kernel,
the output shapes the runtime reports and `cuvil.compile`'s arrays use the actual size.
The interpreter binds the symbol from the reference's result.
"""
from __future__ import annotations

import numpy as np

from ...errors import VerifyError
from ..core import Op
from ..types import TensorType


def produced_symbols(op: Op) -> list[str]:
    """The symbols op's results introduce (empty for every other op)."""
    return [op.attrs["size"]] if isinstance(op, DataDependent) else []


class DataDependent(Op):
    """An op whose first result's leading dim is the produced symbol attrs["size"]."""

    @classmethod
    def check_size(cls, attrs) -> str:
        size = attrs.get("size")
        if not isinstance(size, str) or not size.isidentifier():
            raise VerifyError(f"{cls.name}: `size` must name the result's produced dim, got {size!r}")
        return size


class NonZero(DataDependent):
    """The indices of x's nonzero (true) elements, one row per element in row-major
    order: [size, rank] i64 (as torch.nonzero; ONNX's NonZero is its transpose)."""

    name = "cuvil.nonzero"
    num_operands = 1

    @classmethod
    def infer_types(cls, types, attrs):
        return [TensorType((cls.check_size(attrs), types[0].rank), "i64")]

    @classmethod
    def reference(cls, args, attrs):
        x = args[0]
        if x.ndim == 0:
            return [np.zeros((1 if x else 0, 0), np.int64)]
        return [np.argwhere(x).astype(np.int64)]


class Unique(DataDependent):
    """The distinct values of x (flattened), ascending: [size] of x's dtype."""

    name = "cuvil.unique"
    num_operands = 1

    @classmethod
    def infer_types(cls, types, attrs):
        return [TensorType((cls.check_size(attrs),), types[0].dtype)]

    @classmethod
    def reference(cls, args, attrs):
        return [np.unique(np.asarray(args[0]).reshape(-1))]


class _UniqueOf(Op):
    """An op on x and its sorted distinct values (cuvil.unique's result): an i64 result
    shaped like operand `shaped_as` (0: x, 1: the values)."""
    num_operands = 2
    shaped_as = 0

    @classmethod
    def infer_types(cls, types, attrs):
        x, values = types
        if values.rank != 1 or values.dtype != x.dtype:
            raise VerifyError(f"{cls.name}: the values must be x's distinct values, got {values} for {x}")
        return [TensorType(types[cls.shaped_as].shape, "i64")]

    @staticmethod
    def positions(x, values) -> np.ndarray:
        return np.searchsorted(values, np.asarray(x).reshape(-1)).astype(np.int64)


class UniqueInverse(_UniqueOf):
    """Each element's index in the distinct values: x's shape, i64."""

    name = "cuvil.unique_inverse"

    @classmethod
    def reference(cls, args, attrs):
        x, values = args
        return [cls.positions(x, values).reshape(np.shape(x))]


class UniqueCounts(_UniqueOf):
    """How often each distinct value occurs: [size] i64."""

    name = "cuvil.unique_counts"
    shaped_as = 1

    @classmethod
    def reference(cls, args, attrs):
        x, values = args
        return [np.bincount(cls.positions(x, values), minlength=len(values)).astype(np.int64)]


def _std_max(a, b):
    """C++'s std::max(a, b) (a < b ? b : a), elementwise: torchvision's kernel's."""
    return np.where(a < b, b, a)


def _std_min(a, b):
    return np.where(b < a, b, a)


def nms_order(scores: np.ndarray, idxs: np.ndarray | None, by_class: bool) -> np.ndarray:
    """The order boxes are considered in: decreasing score (a NaN above every number, as
    torch.sort), ties by lower index; with `by_class`, by class first (ascending)."""
    s = np.asarray(scores, np.float32)
    nan = np.isnan(s)
    keys = [np.arange(len(s)), np.where(nan, np.float32(0), -s), ~nan]  # lexsort: last key first
    if by_class:
        keys.append(np.asarray(idxs, np.int64))
    return np.lexsort(keys)


def nms_iou(kept: np.ndarray, box: np.ndarray) -> np.ndarray:
    """float32 IoU of each kept box (rows of [K, 4] x1, y1, x2, y2) with `box`, as
    torchvision's CPU kernel computes it: a degenerate pair's 0/0 is NaN (never above a
    threshold)."""
    kx1, ky1, kx2, ky2 = (kept[:, c] for c in range(4))
    x1, y1, x2, y2 = box
    zero = np.float32(0)
    w = _std_max(zero, _std_min(kx2, x2) - _std_max(kx1, x1))
    h = _std_max(zero, _std_min(ky2, y2) - _std_max(ky1, y1))
    inter = w * h
    with np.errstate(invalid="ignore", divide="ignore"):
        return inter / ((kx2 - kx1) * (ky2 - ky1) + (x2 - x1) * (y2 - y1) - inter)


class Nms(DataDependent):
    """Greedy non-maximum suppression: the indices of the boxes kept, in the order they
    were kept, [size] i64.

    Operands: boxes [N, 4] f32 as (x1, y1, x2, y2), scores [N] f32 and optionally idxs
    [N] i64, each box's class: a box is then only suppressed by kept boxes of its own
    class (torchvision's batched_nms, without its coordinate offsets). Boxes are taken
    in decreasing score (ties: lower index first; `by_class`: by class, then score), and
    one is kept unless its IoU with a kept box (of its class) is > iou_threshold (float32
    IoU compared in double, as torchvision's kernel), or its score is not >
    `score_threshold` (optional), or `max_per_class` (optional) boxes of its class are
    kept already. Attributes: iou_threshold, size, and optionally score_threshold,
    max_per_class, by_class (ONNX NonMaxSuppression uses all three).
    """

    name = "cuvil.nms"

    @classmethod
    def infer_types(cls, types, attrs):
        size = cls.check_size(attrs)
        if len(types) not in (2, 3):
            raise VerifyError(f"{cls.name} takes boxes, scores and optionally idxs, got {len(types)} operands")
        boxes, scores = types[0], types[1]
        if boxes.rank != 2 or boxes.shape[1] != 4 or boxes.dtype != "f32":
            raise VerifyError(f"{cls.name}: boxes must be [N, 4] f32, got {boxes}")
        if scores.shape != (boxes.shape[0],) or scores.dtype != "f32":
            raise VerifyError(f"{cls.name}: scores must be [{boxes.shape[0]}] f32, got {scores}")
        if len(types) == 3 and (types[2].shape != scores.shape or types[2].dtype != "i64"):
            raise VerifyError(f"{cls.name}: idxs must be [{boxes.shape[0]}] i64, got {types[2]}")
        if not isinstance(attrs.get("iou_threshold"), (int, float)) or isinstance(attrs["iou_threshold"], bool):
            raise VerifyError(f"{cls.name}: iou_threshold must be a number, got {attrs.get('iou_threshold')!r}")
        if "score_threshold" in attrs and not isinstance(attrs["score_threshold"], (int, float)):
            raise VerifyError(f"{cls.name}: score_threshold must be a number, got {attrs['score_threshold']!r}")
        limit = attrs.get("max_per_class", 0)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise VerifyError(f"{cls.name}: max_per_class must be an int >= 0, got {limit!r}")
        if attrs.get("by_class") and len(types) != 3:
            raise VerifyError(f"{cls.name}: by_class needs idxs")
        return [TensorType((size,), "i64")]

    @classmethod
    def reference(cls, args, attrs):
        boxes = np.asarray(args[0], np.float32).reshape(-1, 4)
        scores = np.asarray(args[1], np.float32)
        idxs = np.asarray(args[2], np.int64) if len(args) > 2 else np.zeros(len(scores), np.int64)
        thr, limit = float(attrs["iou_threshold"]), attrs.get("max_per_class")
        kept: list[int] = []
        for i in nms_order(scores, idxs, bool(attrs.get("by_class"))):
            if "score_threshold" in attrs and not float(scores[i]) > float(attrs["score_threshold"]):
                continue
            same = [k for k in kept if idxs[k] == idxs[i]]
            if limit is not None and len(same) >= limit:
                continue
            if not same or not np.any(nms_iou(boxes[same], boxes[i]).astype(np.float64) > thr):
                kept.append(int(i))
        return [np.asarray(kept, np.int64)]
