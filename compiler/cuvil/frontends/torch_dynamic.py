"""PyTorch ops whose output size depends on the data -> cuvil.nonzero (ir/ops/dynamic.py).

torch.export gives such a size an unbacked symbol (u0) bounded by the tensor's element
count; here it becomes a produced dim (`nonzero`, `nonzero.1`, ... in the IR, with
bounds [0, count]) that later ops' shapes use. `x[mask]` and `masked_select` are the
nonzero positions' flat indices gathered from x.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import UnsupportedOpError
from ..ir import Value
from ..ir.types import broadcast_shapes
from .graph import produced_dim as fresh_produced_dim
from .torch_ops import handles


def produced_dim(low, kind: str, bound: int) -> str:
    """The produced symbol for this node's data-dependent size: torch's unbacked symbol in
    the node's meta value, named afresh (or as before, when torch reused the symbol for
    an identical op)."""
    unbacked = None
    val = low.meta()
    for t in (val if isinstance(val, (list, tuple)) else [val]):
        for d in getattr(t, "shape", ()):
            text = str(getattr(getattr(d, "node", None), "expr", ""))
            if unbacked is None and text.startswith("u") and text[1:].isdigit():
                unbacked = text
    if unbacked in low.symbols:
        return low.symbols[unbacked]
    name = fresh_produced_dim(low, kind, bound, low.symbols.values())
    if unbacked is not None:
        low.symbols[unbacked] = name
    return name


def _static_count(t) -> int:
    if not t.is_static:
        raise UnsupportedOpError(f"a data-dependent size of a tensor with symbolic dims ({t}) is not supported")
    return math.prod(t.shape) if t.rank else 1


def nonzero(low, x: Value) -> Value:
    x = low.cast(x, "bool")
    return low.op("cuvil.nonzero", x, size=produced_dim(low, "nonzero", _static_count(x.type)))


@handles("nonzero", "argwhere")
def _nonzero(low, a):
    return nonzero(low, a["self"])


def mask_select(low, x: Value, mask: Value, first: int = 0) -> Value:
    """x[..., mask, ...] with a bool mask over dims first .. first + mask.rank of x:
    [*x.shape[:first], count, *x.shape[first + mask.rank:]]."""
    r = mask.type.rank
    if tuple(x.shape[first:first + r]) != tuple(mask.shape):
        raise UnsupportedOpError(f"a boolean mask of shape {list(mask.shape)} for dims {first}.. of {list(x.shape)}")
    idx = nonzero(low, mask)  # [count, r]
    strides = [math.prod(mask.shape[k + 1:]) for k in range(r)]
    if r == 0:
        flat = low.op("cuvil.reduce_sum", idx, axes=[1], keepdims=False)
    elif r == 1:
        flat = low.reshape(idx, [idx.shape[0]])
    else:
        weighted = low.op("cuvil.mul", idx, low.const(np.asarray(strides, np.int64)))
        flat = low.op("cuvil.reduce_sum", weighted, axes=[1], keepdims=False)
    merged = low.reshape(x, [*x.shape[:first], math.prod(mask.shape), *x.shape[first + r:]])
    return low.op("cuvil.gather", merged, flat, axis=first)


@handles("masked_select")
def _masked_select(low, a):
    x, mask = a["self"], a["mask"]
    shape = list(broadcast_shapes(x.shape, mask.shape))
    if list(x.shape) != shape:
        x = low.op("cuvil.broadcast_to", low.reshape(x, [1] * (len(shape) - x.type.rank) + list(x.shape)), shape=shape)
    if list(mask.shape) != shape:
        mask = low.op("cuvil.broadcast_to", low.reshape(mask, [1] * (len(shape) - mask.type.rank) + list(mask.shape)),
                      shape=shape)
    return mask_select(low, x, mask)


@handles("_unique2", "unique_dim", "_unique")
def _unique(low, a):
    """torch.unique of the flattened tensor (sorted; inverse and counts when asked)."""
    if low.node.target.__name__.startswith("unique_dim") or a.get("dim") is not None:
        raise UnsupportedOpError("torch.unique along a dim is not supported (the flattened form is)")
    x = a["self"]
    values = low.op("cuvil.unique", x, size=produced_dim(low, "unique", _static_count(x.type)))
    out = [values]
    val = low.meta()
    n_out = len(val) if isinstance(val, (list, tuple)) else 1
    if n_out > 1:
        out.append(low.op("cuvil.unique_inverse", x, values) if a.get("return_inverse") else
                   low.const(np.zeros(0, np.int64)))
    if n_out > 2:
        out.append(low.op("cuvil.unique_counts", x, values) if a.get("return_counts") else
                   low.const(np.zeros(0, np.int64)))
    return tuple(out) if n_out > 1 else values


def nms(low, boxes: Value, scores: Value, idxs: Value | None, iou_threshold: float) -> Value:
    """cuvil.nms (ir/ops/dynamic.py) of boxes [N, 4] and scores [N] (idxs [N]: classes),
    its size bounded by N."""
    from ..ir import symdim
    if boxes.type.rank != 2 or boxes.shape[1] != 4 or scores.type.rank != 1:
        raise UnsupportedOpError(f"nms takes boxes [N, 4] and scores [N], got {boxes.type} and {scores.type}")
    n = boxes.shape[0]
    bound = n if isinstance(n, int) else symdim.upper_bound(n, low.fn.attrs.get("dim_bounds", {}))
    operands = [low.cast(boxes, "f32"), low.cast(scores, "f32")] + ([low.cast(idxs, "i64")] if idxs is not None else [])
    return low.op("cuvil.nms", *operands, iou_threshold=float(iou_threshold), size=produced_dim(low, "nms", bound))


@handles("cuvil::nms")
def _nms(low, a):
    """torch.ops.cuvil.nms (cuvil/vision.py): torchvision.ops.nms."""
    return nms(low, a["boxes"], a["scores"], None, a["iou_threshold"])


@handles("cuvil::batched_nms")
def _batched_nms(low, a):
    """torch.ops.cuvil.batched_nms: NMS per class of idxs, as an operand of cuvil.nms
    (exact per class, where torchvision's coordinate offsets round)."""
    return nms(low, a["boxes"], a["scores"], a["idxs"], a["iou_threshold"])
