"""sort, argsort, topk and msort by ranks: along a static dim of size n, each element's
rank is the number of elements that come before it (smaller, or equal and earlier: a
stable order; NaN after every number ascending and before it descending, as torch);
output k takes the element of rank k. Every step is a broadcast comparison or a
reduction over [..., n, n], so memory and time grow as n^2: meant for the short rows of
models (top-k of logits, sorting a few boxes), not for sorting long arrays.
Registered into the same HANDLERS table as torch_ops.
"""
from __future__ import annotations

import numpy as np

from ..errors import UnsupportedOpError
from ..ir import Value
from .torch_ops import handles, norm_dim


def _to_last(low, x: Value, d: int) -> tuple[Value, list[int] | None]:
    if d == x.type.rank - 1:
        return x, None
    perm = [i for i in range(x.type.rank) if i != d] + [d]
    return low.op("cuvil.transpose", x, perm=perm), perm


def _from_last(low, y: Value, perm: list[int] | None) -> Value:
    if perm is None:
        return y
    return low.op("cuvil.transpose", y, perm=[perm.index(i) for i in range(len(perm))])


def sorted_along(low, x: Value, d: int, descending: bool) -> tuple[Value, Value]:
    """(values, int64 indices) of x sorted stably along dim d."""
    n = x.shape[d]
    if not isinstance(n, int):
        raise UnsupportedOpError(f"sorting along the symbolic dim {n} is not supported")
    xt, perm = _to_last(low, x, d)
    lead = list(xt.shape[:-1])
    xi = low.reshape(xt, [*lead, n, 1])   # element i (rows)
    xj = low.reshape(xt, [*lead, 1, n])   # element j (columns)
    op = low.op
    nan_i, nan_j = op("cuvil.ne", xi, xi), op("cuvil.ne", xj, xj)
    not_nan = lambda m: op("cuvil.eq", m, low.const(False, "bool"))  # noqa: E731
    if descending:  # j before i: x_j > x_i, or x_j NaN and x_i not
        ahead = op("cuvil.or", op("cuvil.gt", xj, xi), op("cuvil.and", nan_j, not_nan(nan_i)))
    else:           # j before i: x_j < x_i, or x_i NaN and x_j not
        ahead = op("cuvil.or", op("cuvil.lt", xj, xi), op("cuvil.and", nan_i, not_nan(nan_j)))
    same = op("cuvil.or", op("cuvil.eq", xj, xi), op("cuvil.and", nan_i, nan_j))
    earlier = low.const(np.arange(n)[None, :] < np.arange(n)[:, None], "bool")   # [i, j]: j < i
    before = op("cuvil.or", ahead, op("cuvil.and", same, earlier))
    rank = op("cuvil.reduce_sum", low.cast(before, "i64"), axes=[len(lead) + 1], keepdims=False)  # [..., n(i)]
    pick = op("cuvil.eq", low.reshape(rank, [*lead, 1, n]), low.const(np.arange(n).reshape(n, 1), "i64"))
    zero = low.const(np.zeros(()), x.dtype)
    values = op("cuvil.reduce_sum", op("cuvil.where", pick, xj, zero), axes=[len(lead) + 1], keepdims=False)
    iota = low.const(np.arange(n).reshape(1, n), "i64")
    indices = op("cuvil.reduce_sum", op("cuvil.where", pick, iota, low.const(np.zeros((), np.int64), "i64")),
                 axes=[len(lead) + 1], keepdims=False)
    return _from_last(low, values, perm), _from_last(low, indices, perm)


def _zero_d(low, x: Value):
    return x, low.const(np.zeros((), np.int64), "i64")


@handles("sort", "argsort", "msort")
def _sort(low, a):
    x = a["self"]
    name = low.node.target._schema.name.split("::")[1]
    if x.type.rank == 0:
        v, i = _zero_d(low, x)
    else:
        d = 0 if name == "msort" else norm_dim(int(a.get("dim", -1)), x.type.rank)
        v, i = sorted_along(low, x, d, bool(a.get("descending", False)))
    return i if name == "argsort" else (v if name == "msort" else [v, i])


@handles("topk")
def _topk(low, a):
    x, k = a["self"], int(a["k"])
    if x.type.rank == 0:
        return list(_zero_d(low, x))
    d = norm_dim(int(a.get("dim", -1)), x.type.rank)
    v, i = sorted_along(low, x, d, bool(a.get("largest", True)))
    starts, ends = [0] * x.type.rank, list(v.shape)
    ends[d] = k
    cut = lambda t: low.op("cuvil.slice", t, starts=starts, ends=ends, steps=[1] * x.type.rank)  # noqa: E731
    return [cut(v), cut(i)]
