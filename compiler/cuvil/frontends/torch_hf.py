"""ATen ops that Hugging Face Transformers models produce under torch.export and that the
core handlers do not cover: `torch.gather` along any dim (and `take_along_dim`), the
bitwise/logical combinations of attention masks. Registered into the same HANDLERS
table as torch_ops."""
from __future__ import annotations

import numpy as np

from ..errors import UnsupportedOpError
from ..ir import symdim
from ..ir.types import broadcast_shapes
from .torch_composite import _index as _index_one
from .torch_ops import handles, norm_dim


def _wrap_negative(low, idx, n):
    """Indices in [-n, n) -> [0, n), as torch's indexing accepts (n: an int or symbolic dim)."""
    idx = low.cast(idx, "i64")
    neg = low.op("cuvil.lt", idx, low.const(0, "i64"))
    size = low.const(n, "i64") if isinstance(n, int) else low.op("cuvil.dim", dims=[n])
    return low.op("cuvil.where", neg, low.op("cuvil.add", idx, size), idx)


@handles("gather")
def _gather(low, a):
    """torch.gather(x, dim, index): out[..i..] = x[..index[..i..] at dim..]. Lowered as one
    cuvil.gather over the flattened x with flat indices index * stride(dim) + offsets of
    the other coordinates (a constant grid)."""
    x, idx = a["self"], a["index"]
    t = low.meta_type()
    if t.is_static and t.numel == 0:  # an empty index: an empty result
        return low.const(np.zeros(t.shape, t.np_dtype))
    if x.type.rank == 0:  # a 0-d input's only element, once per index
        y = _gather(low, {"self": low.reshape(x, [1]), "index": low.reshape(idx, [idx.type.numel]), "dim": 0})
        return low.reshape(y, list(t.shape))
    rank = x.type.rank
    if idx.type.rank != rank:
        raise UnsupportedOpError(f"gather needs an index of the input's rank {rank}, got {idx.type}")
    d = norm_dim(a["dim"], rank)
    off = [k for k in range(rank) if k != d]
    one_row = all(idx.shape[k] == 1 for k in off)  # the flat index is the index itself (scaled)
    if one_row:
        pass
    elif not (x.type.is_static and idx.type.is_static):
        raise UnsupportedOpError(f"gather of {x.type} by {idx.type}: symbolic shapes are supported where the "
                                 "index has size 1 off the gathered dim")
    elif any(idx.shape[k] > x.shape[k] for k in off):
        raise UnsupportedOpError(f"gather index {list(idx.shape)} is larger than the input {list(x.shape)} off dim {d}")
    strides = [symdim.product(x.shape[k + 1:]) for k in range(rank)]
    if not isinstance(strides[d], int):
        raise UnsupportedOpError(f"gather along dim {d} of {x.type}: the dims after it must be static")
    i64 = low.cast(idx, "i64")
    flat_idx = low.op("cuvil.mul", i64, low.const(int(strides[d]), "i64")) if strides[d] != 1 else i64
    if not one_row:  # plus the flat offsets of the other coordinates: a constant grid
        grid = np.zeros(idx.shape, np.int64)
        for k in off:
            shape = [1] * rank
            shape[k] = idx.shape[k]
            grid = grid + np.arange(idx.shape[k], dtype=np.int64).reshape(shape) * strides[k]
        flat_idx = low.op("cuvil.add", flat_idx, low.const(grid))
    flat = low.reshape(x, [x.type.numel_dim])
    return low.op("cuvil.gather", flat, flat_idx, axis=0)


def _logical(opname):
    def handler(low, a):
        x, y = a["self"], a["other"]
        if low.node.target._schema.name.startswith("aten::logical_"):  # any dtype: nonzero is true
            x, y = (low.op("cuvil.ne", t, low.const(np.zeros(()), t.dtype)) if t.dtype != "bool" else t
                    for t in (x, y))
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
    if len(used) == 1 and idx[used[0]].dtype == "bool":  # x[mask]: a data-dependent size
        from .torch_dynamic import mask_select
        return mask_select(low, x, idx[used[0]], used[0])
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
        stride = symdim.product(dims[j + 1:])
        term = _wrap_negative(low, idx[d], x.shape[d])
        if stride != 1:  # a symbolic stride is the dim's runtime value
            factor = low.const(stride, "i64") if isinstance(stride, int) else low.op("cuvil.dim", dims=[stride])
            term = low.op("cuvil.mul", term, factor)
        flat = term if flat is None else low.op("cuvil.add", flat, term)
    if tuple(flat.shape) != tuple(bshape):
        flat = low.op("cuvil.broadcast_to", flat, shape=list(bshape))
    merged = low.reshape(x, [*x.shape[:d0], symdim.product(dims), *x.shape[d0 + k:]])
    return low.op("cuvil.gather", merged, flat, axis=d0)


@handles("take_along_dim")
def _take_along_dim(low, a):
    """torch.gather after broadcasting input and indices off `dim` (the flattened input
    without a dim)."""
    x, idx, dim = a["self"], a["indices"], a.get("dim")
    if dim is None:
        x, idx, dim = low.reshape(x, [x.type.numel]), low.reshape(idx, [idx.type.numel]), 0
    d = norm_dim(int(dim), x.type.rank)
    idx = low.cast(idx, "i64")  # negative indices count from the end, as in take_along_dim
    idx = low.op("cuvil.where", low.op("cuvil.lt", idx, low.const(np.zeros((), np.int64), "i64")),
                 low.op("cuvil.add", idx, low.const(np.asarray(int(x.shape[d])), "i64")), idx)
    shape = [max(int(p), int(q)) for p, q in zip(x.shape, idx.shape)]
    xs, ids = list(shape), list(shape)
    xs[d], ids[d] = int(x.shape[d]), int(idx.shape[d])
    x = x if list(x.shape) == xs else low.op("cuvil.broadcast_to", x, shape=xs)
    idx = idx if list(idx.shape) == ids else low.op("cuvil.broadcast_to", idx, shape=ids)
    return _gather(low, {"self": x, "index": idx, "dim": d})
