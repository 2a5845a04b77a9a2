"""scatter, scatter_add, scatter_reduce, index_add, index_put and repeat_interleave.
Registered into the same HANDLERS table as torch_ops.

The scatters are *dense*: with the scattered dim moved last, output position p of a row
compares p with each of the row's m indices ([..., n, m] of bools), and reduces the
matching sources (sum, prod, mean, amax, amin, or the last match for a plain scatter)
over m; positions no index hits keep the input. Exact for any values (no products of
zeros with inf or NaN); n * m work per row, so meant for the modest sizes of models'
bookkeeping (scattering logits, position tables), with static shapes.
"""
from __future__ import annotations

import numpy as np

from ..errors import UnsupportedOpError
from ..ir import Value
from .torch_ops import handles, norm_dim


def _static(v: Value, what: str) -> None:
    if not v.type.is_static:
        raise UnsupportedOpError(f"{what} over the symbolic shape {list(v.shape)} is not supported")


def _last(low, v: Value, d: int) -> Value:
    if d == v.type.rank - 1:
        return v
    perm = [i for i in range(v.type.rank) if i != d] + [d]
    return low.op("cuvil.transpose", v, perm=perm)


def _unlast(low, v: Value, d: int) -> Value:
    rank = v.type.rank
    if d == rank - 1:
        return v
    perm = [i for i in range(rank) if i != d] + [d]
    return low.op("cuvil.transpose", v, perm=[perm.index(i) for i in range(rank)])


def _crop(low, v: Value, shape) -> Value:
    if list(v.shape) == list(shape):
        return v
    return low.op("cuvil.slice", v, starts=[0] * v.type.rank, ends=list(shape), steps=[1] * v.type.rank)


def dense_scatter(low, x: Value, d: int, index: Value, src: Value, reduce: str, include_self: bool) -> Value:
    """x with src scattered along dim d at index (index and src: x's rank, index no
    larger than x off d, src cropped to index's shape)."""
    for v, what in ((x, "scatter"), (index, "scatter index"), (src, "scatter source")):
        _static(v, what)
    rank, n = x.type.rank, int(x.shape[d])
    region = [int(index.shape[k]) if k != d else n for k in range(rank)]
    base = _last(low, _crop(low, x, region), d)                      # [..., n]
    idx = _last(low, low.cast(index, "i64"), d)                      # [..., m]
    vals = _last(low, _crop(low, low.cast(src, x.dtype), list(index.shape)), d)
    lead, m = list(idx.shape[:-1]), int(idx.shape[-1])
    idx = low.op("cuvil.where", low.op("cuvil.lt", idx, low.const(np.zeros((), np.int64), "i64")),
                 low.op("cuvil.add", idx, low.const(np.asarray(n), "i64")), idx)
    hits = low.op("cuvil.eq", low.reshape(idx, [*lead, 1, m]), low.const(np.arange(n).reshape(n, 1), "i64"))
    vals = low.reshape(vals, [*lead, 1, m])
    any_hit = low.cast(low.op("cuvil.reduce_max", low.cast(hits, "u8"), axes=[len(lead) + 1], keepdims=False), "bool")
    c = lambda v: low.const(np.asarray(v), x.dtype)  # noqa: E731
    red = lambda name, fill: low.op(f"cuvil.reduce_{name}", low.op("cuvil.where", hits, vals, c(fill)),  # noqa: E731
                                    axes=[len(lead) + 1], keepdims=False)
    if reduce == "replace":
        iota = low.const(np.arange(m), "i64")
        last = low.op("cuvil.reduce_max", low.op("cuvil.where", hits, iota, low.const(np.asarray(-1), "i64")),
                      axes=[len(lead) + 1], keepdims=True)
        pick = low.op("cuvil.and", hits, low.op("cuvil.eq", iota, last))
        new = low.op("cuvil.reduce_sum", low.op("cuvil.where", pick, vals, c(0.0)), axes=[len(lead) + 1],
                     keepdims=False)
    elif reduce == "sum":
        new = red("sum", 0.0)
        new = low.op("cuvil.add", base, new) if include_self else new
    elif reduce == "prod":
        new = red("prod", 1.0)
        new = low.op("cuvil.mul", base, new) if include_self else new
    elif reduce in ("amax", "amin"):
        new = red("max" if reduce == "amax" else "min", -np.inf if reduce == "amax" else np.inf)
        new = low.op("cuvil.maximum" if reduce == "amax" else "cuvil.minimum", base, new) if include_self else new
    elif reduce == "mean":
        total = red("sum", 0.0)
        count = low.op("cuvil.reduce_sum", low.cast(hits, x.dtype), axes=[len(lead) + 1], keepdims=False)
        if include_self:
            total, count = low.op("cuvil.add", total, base), low.op("cuvil.add", count, c(1.0))
        new = low.op("cuvil.div", total, count)
        if x.dtype not in ("f16", "f32", "f64"):  # torch floors an integer mean
            new = low.cast(new, x.dtype)
    else:
        raise UnsupportedOpError(f"scatter reduce {reduce!r} is not supported")
    out = _unlast(low, low.op("cuvil.where", any_hit, new, base), d)
    if region == [int(s) for s in x.shape]:
        return out
    inside = np.zeros([int(s) for s in x.shape], bool)
    inside[tuple(slice(0, r) for r in region)] = True
    padded = low.op("cuvil.pad", out, pads=[[0, int(s) - r] for s, r in zip(x.shape, region)], value=0.0)
    return low.op("cuvil.where", low.const(inside), padded, x)


_REDUCE_NAMES = {"add": "sum", "multiply": "prod", "sum": "sum", "prod": "prod", "mean": "mean", "amax": "amax",
                 "amin": "amin"}


@handles("scatter", "scatter_", "scatter_add", "scatter_add_", "scatter_reduce", "scatter_reduce_")
def _scatter(low, a):
    x = a["self"]
    name = low.node.target._schema.name.split("::")[1].rstrip("_")
    if x.type.rank == 0:
        x1 = low.reshape(x, [1])
        idx, src = (low.reshape(a[k], [1]) if isinstance(a.get(k), Value) else a.get(k) for k in ("index", "src"))
        inner = dict(a, self=x1, index=idx, src=src if src is not None else a.get("value"), dim=0)
        return low.reshape(_scatter_nd(low, inner, name), [])
    return _scatter_nd(low, a, name)


def _scatter_nd(low, a, name: str) -> Value:
    x = a["self"]
    d = norm_dim(int(a["dim"]), x.type.rank)
    index = a["index"]
    src = a.get("src")
    if not isinstance(src, Value):  # scatter.value: a scalar
        src = low.op("cuvil.broadcast_to", low.const(np.asarray(a.get("value")).reshape([1] * x.type.rank),
                                                     x.dtype), shape=list(index.shape))
    if name == "scatter_add":
        return dense_scatter(low, x, d, index, src, "sum", True)
    if name == "scatter_reduce":
        return dense_scatter(low, x, d, index, src, _REDUCE_NAMES[a["reduce"]], bool(a.get("include_self", True)))
    reduce = a.get("reduce")
    return dense_scatter(low, x, d, index, src, _REDUCE_NAMES[reduce] if reduce else "replace", True)


@handles("index_add", "index_add_")
def _index_add(low, a):
    """x.index_add(dim, index [m], source, alpha): a scatter_add whose index is the 1-D
    index repeated across source's other dims."""
    x, index, src = a["self"], a["index"], a["source"]
    if x.type.rank == 0:
        x, src, index = low.reshape(x, [1]), low.reshape(src, [1]), low.reshape(index, [index.type.numel])
    d = norm_dim(int(a["dim"]), x.type.rank)
    alpha = a.get("alpha", 1)
    if alpha not in (None, 1):
        src = low.op("cuvil.mul", src, low.const(np.asarray(alpha), src.dtype))
    view = [1] * src.type.rank
    view[d] = int(index.shape[0]) if index.type.rank else 1
    full = low.op("cuvil.broadcast_to", low.reshape(index, view), shape=list(src.shape))
    y = dense_scatter(low, x, d, full, src, "sum", True)
    return low.reshape(y, list(low.meta_type().shape))


@handles("index_put", "index_put_", "_index_put_impl_")
def _index_put(low, a):
    """x[..., idx, ...] = values (or += with accumulate) for one integer index tensor
    after any leading full slices: a dense scatter along that dim (the last write of a
    repeated index wins)."""
    x, indices, values = a["self"], list(a["indices"]), a["values"]
    d = next(i for i, t in enumerate(indices) if t is not None)
    idx = indices[d]
    if any(t is not None for t in indices[d + 1:]):
        raise UnsupportedOpError("index_put with more than one index tensor is not supported")
    if idx.dtype == "bool":
        return _masked_put(low, x, d, idx, values, bool(a.get("accumulate")))
    m = idx.type.numel
    shape = [*x.shape[:d], *idx.shape, *x.shape[d + 1:]]
    vals = low.cast(values, x.dtype)
    if vals.type.rank < len(shape):
        vals = low.reshape(vals, [1] * (len(shape) - vals.type.rank) + list(vals.shape))
    if list(vals.shape) != shape:
        vals = low.op("cuvil.broadcast_to", vals, shape=shape)
    target = [*x.shape[:d], m, *x.shape[d + 1:]]
    vals = low.reshape(vals, target)
    view = [1] * len(target)
    view[d] = m
    full = low.op("cuvil.broadcast_to", low.reshape(low.cast(idx, "i64"), view), shape=target)
    return dense_scatter(low, x, d, full, vals, "sum" if a.get("accumulate") else "replace", True)


def _masked_put(low, x: Value, d: int, mask: Value, values: Value, accumulate: bool) -> Value:
    """x[..., mask, ...] = values where values broadcast over every selected element
    (their shape is x's trailing dims): a where, or an add of the masked values."""
    trailing = list(x.shape[d + mask.type.rank:])
    if values.type.rank > len(trailing):
        raise UnsupportedOpError("index_put with a boolean mask and one value per selected element is not "
                                 "supported (their count depends on the data)")
    m = low.reshape(mask, [1] * d + list(mask.shape) + [1] * len(trailing))
    vals = low.cast(values, x.dtype)
    vals = low.reshape(vals, [1] * (x.type.rank - vals.type.rank) + list(vals.shape))
    if accumulate:
        return low.op("cuvil.add", x, low.op("cuvil.where", m, vals, low.const(np.zeros(()), x.dtype)))
    return low.op("cuvil.where", m, vals, x)


@handles("repeat_interleave")
def _repeat_interleave(low, a):
    """Each element repeated r times along dim (the flattened tensor without one): a
    new axis after dim, broadcast to r, merged back. Tensor repeats must be constants."""
    x, reps, dim = a.get("self", a.get("input")), a.get("repeats"), a.get("dim")
    if isinstance(reps, Value):
        value = reps.defining_op.value if reps.defining_op is not None and reps.defining_op.name == "cuvil.constant" \
            else None
        if value is None or np.unique(value).size != 1:
            raise UnsupportedOpError("repeat_interleave with computed or unequal tensor repeats is not supported")
        reps = int(np.asarray(value).reshape(-1)[0])
    r = int(reps)
    if dim is None or x.type.rank == 0:
        x, d = low.reshape(x, [x.type.numel]), 0
    else:
        d = norm_dim(int(dim), x.type.rank)
    shape = list(x.shape)
    y = low.reshape(x, shape[:d + 1] + [1] + shape[d + 1:])
    y = low.op("cuvil.broadcast_to", y, shape=shape[:d + 1] + [r] + shape[d + 1:])
    return low.reshape(y, list(low.meta_type().shape))
