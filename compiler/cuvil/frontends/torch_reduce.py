"""Reductions beyond sum/mean/amax/amin: prod, any/all, logsumexp, var/std (with their
correction), and the running cumsum/cumprod. Registered into the same HANDLERS table as
torch_ops. Every form works on 0-d tensors (a reduction over no axes)."""
from __future__ import annotations

from math import prod

import numpy as np

from ..errors import UnsupportedOpError
from ..ir import Value
from ..ir.types import FLOAT_DTYPES
from .torch_ops import handles, norm_dim, reduce_axes


def _dims(a):
    d = a.get("dim")
    return d if d is None or isinstance(d, (list, tuple)) else [d]


def _finish(low, y: Value, keep: bool) -> Value:
    """y reduced with kept dims, squeezed to the shape torch recorded when not `keep`."""
    return y if keep else low.reshape(y, list(low.meta_type().shape))


@handles("prod")
def _prod(low, a):
    x = low.cast(a["self"], low.meta_type().dtype)
    keep = bool(a.get("keepdim", False))
    return low.op("cuvil.reduce_prod", x, axes=reduce_axes(_dims(a), x.type.rank), keepdims=keep)


@handles("any", "all")
def _any_all(low, a):
    x = a["self"]
    which = low.node.target._schema.name.split("::")[1]
    nonzero = low.op("cuvil.ne", x, low.const(np.zeros((), np.float64), x.dtype)) if x.dtype != "bool" else x
    keep = bool(a.get("keepdim", False))
    y = low.op("cuvil.reduce_max" if which == "any" else "cuvil.reduce_min", low.cast(nonzero, "u8"),
               axes=reduce_axes(_dims(a), x.type.rank), keepdims=keep)
    return low.cast(y, low.meta_type().dtype)


@handles("logsumexp")
def _logsumexp(low, a):
    """max + log(sum(exp(x - max))), the max taken as 0 where it is infinite (all -inf
    gives -inf, any +inf gives +inf, as in torch)."""
    dtype = low.meta_type().dtype
    x = low.cast(a["self"], dtype)
    axes = reduce_axes(_dims(a), x.type.rank)
    m = low.op("cuvil.reduce_max", x, axes=axes, keepdims=True)
    inf = low.const(np.asarray(np.inf), dtype)
    m = low.op("cuvil.where", low.op("cuvil.eq", low.op("cuvil.abs", m), inf), low.const(np.zeros(()), dtype), m)
    s = low.op("cuvil.reduce_sum", low.op("cuvil.exp", low.op("cuvil.sub", x, m)), axes=axes, keepdims=True)
    return _finish(low, low.op("cuvil.add", low.op("cuvil.log", s), m), bool(a.get("keepdim", False)))


@handles("var", "std", "var_mean", "std_mean")
def _var_std(low, a):
    """sum((x - mean)^2) / (N - correction); torch's default correction is 1."""
    name = low.node.target._schema.name.split("::")[1]
    multi = name.endswith("_mean")
    x = a["self"]
    dtype = x.dtype if x.dtype in FLOAT_DTYPES else "f32"
    x = low.cast(x, dtype)
    axes = reduce_axes(_dims(a), x.type.rank)
    sizes = [x.shape[i] for i in axes] if x.type.rank else []
    if not all(isinstance(d, int) for d in sizes):
        raise UnsupportedOpError(f"aten.{name} over the symbolic dims {sizes} is not supported")
    if a.get("correction") is not None:
        correction = float(a["correction"])
    else:
        correction = 1.0 if a.get("unbiased", True) else 0.0
    keep = bool(a.get("keepdim", False))
    mean = low.op("cuvil.reduce_mean", x, axes=axes, keepdims=True)
    d = low.op("cuvil.sub", x, mean)
    ss = low.op("cuvil.reduce_sum", low.op("cuvil.mul", d, d), axes=axes, keepdims=keep)
    denom = max(prod(sizes) - correction, 0.0)  # 0: inf, or NaN where the sum is 0, as in torch
    var = low.op("cuvil.div", ss, low.const(np.asarray(denom), dtype))
    y = low.op("cuvil.sqrt", var) if name.startswith("std") else var
    if not multi:
        return y
    mean = mean if keep else low.reshape(mean, list(y.shape))
    return [y, mean]


@handles("cumsum", "cumsum_", "cumprod", "cumprod_")
def _cumulative(low, a):
    t = low.meta_type()
    x = low.cast(a["self"], t.dtype)
    if not x.type.is_static:
        raise UnsupportedOpError(f"aten.cumsum/cumprod over the symbolic shape {list(x.shape)} is not supported")
    which = "cuvil.cumsum" if "cumsum" in low.node.target._schema.name else "cuvil.cumprod"
    return low.op(which, x, axis=norm_dim(int(a["dim"]), max(x.type.rank, 1)) if x.type.rank else 0)


@handles("linalg_vector_norm", "norm")
def _vector_norm(low, a):
    """Vector norms of every order: max / min |x| (+-inf), the count of nonzeros (0),
    sum |x| (1), sqrt(sum x^2) (2), (sum |x|^p)^(1/p) otherwise; 'fro' is 2."""
    x = a["self"] if "self" in a else a["input"]
    order = a.get("ord", a.get("p", 2))
    order = 2.0 if order in (None, "fro") else order
    if isinstance(order, str):
        raise UnsupportedOpError(f"norm of order {order!r} is not supported")
    order = float(order)
    dtype = low.meta_type().dtype
    x = low.cast(x, dtype)
    axes = reduce_axes(_dims(a), x.type.rank)
    keep = bool(a.get("keepdim", False))
    ax = low.op("cuvil.abs", x)
    if order in (np.inf, -np.inf):
        return low.op("cuvil.reduce_max" if order > 0 else "cuvil.reduce_min", ax, axes=axes, keepdims=keep)
    if order == 0:
        nz = low.cast(low.op("cuvil.ne", x, low.const(np.zeros(()), dtype)), dtype)
        return low.op("cuvil.reduce_sum", nz, axes=axes, keepdims=keep)
    if order == 1:
        return low.op("cuvil.reduce_sum", ax, axes=axes, keepdims=keep)
    if order == 2:
        return low.op("cuvil.sqrt", low.op("cuvil.reduce_sum", low.op("cuvil.mul", x, x), axes=axes, keepdims=keep))
    powered = low.op("cuvil.pow", ax, low.const(np.asarray(order), dtype))
    total = low.op("cuvil.reduce_sum", powered, axes=axes, keepdims=keep)
    return low.op("cuvil.pow", total, low.const(np.asarray(1.0 / order), dtype))
