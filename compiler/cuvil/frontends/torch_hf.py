"""ATen ops that Hugging Face Transformers models produce under torch.export and that the
core handlers do not cover: `torch.gather` along any dim and the bitwise/logical
combinations of attention masks. Registered into the same HANDLERS table as torch_ops."""
from __future__ import annotations

import numpy as np

from ..errors import UnsupportedOpError
from ..ir.types import broadcast_shapes
from .torch_composite import _index as _index_one
from .torch_ops import _norm_dim, handles


def _wrap_negative(low, idx, n: int):
    """Indices in [-n, n) -> [0, n), as torch's indexing accepts."""
    idx = low.cast(idx, "i64")
    neg = low.op("cuvil.lt", idx, low.const(0, "i64"))
    return low.op("cuvil.where", neg, low.op("cuvil.add", idx, low.const(n, "i64")), idx)


@handles("gather")
def _gather(low, a):
    """torch.gather(x, dim, index): out[..i..] = x[..index[..i..] at dim..]. Lowered as one
    cuvil.gather over the flattened x with flat indices index * stride(dim) + offsets of
    the other coordinates (a constant grid)."""
    x, idx = a["self"], a["index"]
    rank = x.type.rank
    if idx.type.rank != rank:
        raise UnsupportedOpError(f"gather needs an index of the input's rank {rank}, got {idx.type}")
    d = _norm_dim(a["dim"], rank)
    if any(i > s for k, (i, s) in enumerate(zip(idx.shape, x.shape)) if k != d):
        raise UnsupportedOpError(f"gather index {list(idx.shape)} is larger than the input {list(x.shape)} off dim {d}")
    strides = np.cumprod([1, *x.shape[::-1]])[::-1][1:].astype(np.int64)
    grid = np.zeros(idx.shape, np.int64)
    for k in range(rank):
        if k != d:
            shape = [1] * rank
            shape[k] = idx.shape[k]
            grid = grid + np.arange(idx.shape[k], dtype=np.int64).reshape(shape) * strides[k]
    i64 = low.cast(idx, "i64")
    flat_idx = low.op("cuvil.add", low.op("cuvil.mul", i64, low.const(int(strides[d]), "i64")), low.const(grid))
    flat = low.reshape(x, [int(np.prod(x.shape, dtype=np.int64))])
    return low.op("cuvil.gather", flat, flat_idx, axis=0)


def _logical(opname):
    def handler(low, a):
        x, y = a["self"], a["other"]
        if x.dtype != "bool" or (hasattr(y, "dtype") and y.dtype != "bool"):
            raise UnsupportedOpError(f"bitwise {opname.split('.')[1]} of non-bool tensors is not supported")
        y = y if hasattr(y, "dtype") else low.const(bool(y), "bool")
        return low.op(opname, x, y)
    return handler


for _n, _op in [("__and__", "cuvil.and"), ("bitwise_and", "cuvil.and"), ("logical_and", "cuvil.and"),
                ("__or__", "cuvil.or"), ("bitwise_or", "cuvil.or"), ("logical_or", "cuvil.or")]:
    handles(_n)(_logical(_op))


@handles("bitwise_not")
def _bitwise_not(low, a):
    x = a["self"]
    if x.dtype != "bool":
        raise UnsupportedOpError("bitwise_not of a non-bool tensor is not supported")
    return low.op("cuvil.eq", x, low.const(False, "bool"))


@handles("index")
def _index(low, a):
    """x[i0, i1, ...] with index tensors on consecutive dims (broadcast together): one
    cuvil.gather over those dims flattened, at flat index sum(i_k * stride_k)."""
    x, idx = a["self"], list(a["indices"])
    used = [i for i, t in enumerate(idx) if t is not None]
    if len(used) <= 1:
        return _index_one(low, a)
    if used != list(range(used[0], used[-1] + 1)):
        raise UnsupportedOpError("tensor indexing with index tensors on non-adjacent dims is not supported")
    if any(idx[d].dtype == "bool" for d in used):
        raise UnsupportedOpError("boolean-mask indexing has a data-dependent shape and is not supported")
    d0, k = used[0], len(used)
    dims = x.shape[d0:d0 + k]
    bshape = broadcast_shapes(*(idx[d].shape for d in used))
    flat = None
    for j, d in enumerate(used):
        stride = int(np.prod(dims[j + 1:], dtype=np.int64))
        term = _wrap_negative(low, idx[d], x.shape[d])
        if stride != 1:
            term = low.op("cuvil.mul", term, low.const(stride, "i64"))
        flat = term if flat is None else low.op("cuvil.add", flat, term)
    if tuple(flat.shape) != tuple(bshape):
        flat = low.op("cuvil.broadcast_to", flat, shape=list(bshape))
    merged = low.reshape(x, [*x.shape[:d0], int(np.prod(dims, dtype=np.int64)), *x.shape[d0 + k:]])
    return low.op("cuvil.gather", merged, flat, axis=d0)
