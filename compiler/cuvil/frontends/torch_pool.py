"""Pooling over 1, 2 or 3 spatial dims, batched or not, with the optional indices of max
pooling: ATen's max_pool{1,2,3}d[_with_indices], avg_pool{1,2,3}d, adaptive max/avg
pooling and im2col (`F.unfold`). Registered into the same HANDLERS table as torch_ops.

1-D and 2-D pooling without indices use the pooling kernels (a 1-D input is a 2-D one of
height 1). The rest is a *window decomposition*: the input padded once, then one strided
slice per kernel offset (each [N, C, *out]), combined elementwise in the kernel's scan
order: running max and its index for max pooling (a later value wins when it is greater,
or NaN, as in torch's CPU loop), a sum over a constant divisor grid for average pooling,
a concat for im2col. Exact for any size; one elementwise op per kernel offset.
"""
from __future__ import annotations

import itertools

import numpy as np

from ..errors import UnsupportedOpError
from ..ir import Value
from .torch_ops import handles, pair


def _ints(v, n):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return [int(x) for x in (v * n if len(v) == 1 else v)]


def batched(low, x: Value, nd: int):
    """(x with a batch dim of 1 where it was unbatched, whether one was added)."""
    if any(not isinstance(d, int) for d in x.shape[-nd:]):
        raise UnsupportedOpError(f"{nd}-D pooling over the symbolic spatial dims {list(x.shape[-nd:])} is not "
                                 "supported (a symbolic batch is)")
    if x.type.rank == nd + 2:
        return x, False
    if x.type.rank == nd + 1:
        return low.reshape(x, [1, *x.shape]), True
    raise UnsupportedOpError(f"{nd}-D pooling needs a {nd + 1}-D or {nd + 2}-D input, got {x.type}")


def out_shape_of(low, i: int | None = None) -> list:
    """The shape torch recorded for the node's output (output i of a multi-output node)."""
    val = low.meta() if i is None else low.meta()[i]
    return [low.dim(d) for d in val.shape]


def indices_used(node) -> bool:
    """Whether anything reads output 1 (the indices) of a (values, indices) node
    (torch.export keeps a getitem of every output, used or not)."""
    import operator
    return any(u.target is not operator.getitem or (u.args[1] != 0 and u.users) for u in node.users)


def _static(x: Value, what: str) -> None:
    if not x.type.is_static:
        raise UnsupportedOpError(f"{what} over the symbolic shape {list(x.shape)} is not supported")


class Windows:
    """The strided slices of x [N, C, *S] that each kernel offset sees, for outputs `out`."""

    def __init__(self, low, x: Value, kernel, stride, pads, dilation, out, fill: float):
        self.low, self.kernel, self.stride, self.dilation, self.out = low, kernel, stride, dilation, out
        self.size = [int(d) for d in x.shape[2:]]
        self.pads = pads
        nd = len(kernel)
        need = [(kernel[d] - 1) * dilation[d] + (out[d] - 1) * stride[d] + 1 for d in range(nd)]
        hi = [max(0, need[d] - pads[d] - self.size[d]) for d in range(nd)]
        lo = [min(pads[d], need[d]) for d in range(nd)]
        self.lo = lo
        if any(lo) or any(hi):
            x = low.op("cuvil.pad", x, pads=[[0, 0], [0, 0], *[[lo[d], hi[d]] for d in range(nd)]], value=fill)
        self.x = x
        self.offsets = list(itertools.product(*[range(k) for k in kernel]))

    def slice(self, offset) -> Value:
        x = self.x
        starts = [0, 0] + [offset[d] * self.dilation[d] for d in range(len(offset))]
        ends = [int(x.shape[0]), int(x.shape[1])] + [starts[2 + d] + (self.out[d] - 1) * self.stride[d] + 1
                                                      for d in range(len(offset))]
        steps = [1, 1, *self.stride]
        return self.low.op("cuvil.slice", x, starts=starts, ends=ends, steps=steps)

    def coords(self, offset) -> list[np.ndarray]:
        """Per spatial dim, the unpadded input coordinate each output reads at `offset`."""
        return [np.arange(self.out[d]) * self.stride[d] + offset[d] * self.dilation[d] - self.lo[d]
                for d in range(len(offset))]

    def flat_index(self, offset) -> np.ndarray:
        """The flat index (over the spatial dims) each output reads at `offset`, shaped out."""
        nd = len(offset)
        flat = np.zeros(self.out, np.int64)
        stride = 1
        for d in reversed(range(nd)):
            c = np.clip(self.coords(offset)[d], 0, self.size[d] - 1)
            shape = [1] * nd
            shape[d] = self.out[d]
            flat = flat + c.reshape(shape) * stride
            stride *= self.size[d]
        return flat


def max_windows(low, x: Value, kernel, stride, pads, dilation, out, with_indices: bool):
    """(values, indices or None) of max pooling by the window decomposition."""
    w = Windows(low, x, kernel, stride, pads, dilation, out, float("-inf"))
    best, idx = None, None
    for off in w.offsets:
        v = w.slice(off)
        if best is None:
            best = v
            idx = low.const(w.flat_index(off)) if with_indices else None
            continue
        better = low.op("cuvil.or", low.op("cuvil.gt", v, best), low.op("cuvil.ne", v, v))
        best = low.op("cuvil.where", better, v, best)
        if with_indices:
            idx = low.op("cuvil.where", better, low.const(w.flat_index(off)), idx)
    if with_indices and tuple(idx.shape) != tuple(best.shape):
        idx = low.op("cuvil.broadcast_to", idx, shape=list(best.shape))
    return best, idx


def _adaptive_max_pool2d_kernel(low, a):
    """Adaptive max pooling of a 4-D input by the pooling kernel where the windows are
    uniform (the window decomposition does the rest, and the indices)."""
    x = a["self"]
    oh, ow = (int(d) for d in low.meta()[0].shape[2:])  # outputs (values, indices)
    h, w = x.shape[2:]
    if (oh, ow) == (1, 1):
        y = low.op("cuvil.reduce_max", x, axes=[2, 3], keepdims=True)
    elif h % oh == 0 and w % ow == 0:
        k = [h // oh, w // ow]
        y = low.op("cuvil.max_pool2d", x, kernel=k, stride=k, pads=[0, 0, 0, 0], dilation=[1, 1],
                   ceil_mode=False)
    else:
        raise UnsupportedOpError(f"adaptive_max_pool2d from {h}x{w} to {oh}x{ow} (sizes must divide)")
    return [y, None]


def _pool_args(low, a, nd):
    k = _ints(a["kernel_size"], nd)
    s = _ints(a["stride"], nd) if a.get("stride") else k
    return k, s, _ints(a["padding"], nd)


@handles("max_pool1d", "max_pool1d_with_indices", "max_pool2d", "max_pool2d_with_indices", "max_pool3d",
         "max_pool3d_with_indices")
def _max_pool(low, a):
    name = low.node.target._schema.name
    nd = int(name.split("max_pool")[1][0])
    multi = name.endswith("_with_indices")
    with_indices = multi and indices_used(low.node)
    x, unbatched = batched(low, a["self"], nd)
    k, s, p = _pool_args(low, a, nd)
    dil = _ints(a["dilation"], nd)
    ceil = bool(a["ceil_mode"])
    shape = out_shape_of(low, 0 if multi else None)
    out = [int(d) for d in shape[-nd:]]
    if nd <= 2 and not with_indices:
        x4 = x if nd == 2 else low.reshape(x, [x.shape[0], x.shape[1], 1, x.shape[2]])
        k2, s2, p2, d2 = (k, s, p, dil) if nd == 2 else ([1, *k], [1, *s], [0, *p], [1, *dil])
        y = low.op("cuvil.max_pool2d", x4, kernel=k2, stride=s2, pads=[p2[0], p2[1], p2[0], p2[1]],
                   dilation=d2, ceil_mode=ceil)
        y = low.reshape(y, shape)
        return [y, None] if multi else y
    _static(x, f"max_pool{nd}d")
    y, idx = max_windows(low, x, k, s, p, dil, out, with_indices)
    if unbatched:
        y = low.reshape(y, y.shape[1:])
        idx = low.reshape(idx, idx.shape[1:]) if idx is not None else None
    return [y, idx] if multi else y


def _avg_divisors(size, kernel, stride, pad, out, ceil, include_pad):
    """torch's divisor of each output along one dim (its window clipped as torch clips it)."""
    del ceil
    div = []
    for o in range(out):
        start = o * stride - pad
        end = min(start + kernel, size + pad)
        full = end - start
        start, end = max(start, 0), min(end, size)
        div.append(full if include_pad else end - start)
    return np.array(div, np.float64)


@handles("avg_pool1d", "avg_pool2d", "avg_pool3d")
def _avg_pool(low, a):
    nd = int(low.node.target._schema.name.split("avg_pool")[1][0])
    x, unbatched = batched(low, a["self"], nd)
    k, s, p = _pool_args(low, a, nd)
    ceil, include = bool(a["ceil_mode"]), bool(a["count_include_pad"])
    divisor = int(a.get("divisor_override") or 0)
    out_shape = out_shape_of(low)
    if nd <= 2:
        x4 = x if nd == 2 else low.reshape(x, [x.shape[0], x.shape[1], 1, x.shape[2]])
        k2, s2, p2 = (k, s, p) if nd == 2 else ([1, *k], [1, *s], [0, *p])
        y = low.op("cuvil.avg_pool2d", x4, kernel=k2, stride=s2, pads=[p2[0], p2[1], p2[0], p2[1]],
                   ceil_mode=ceil, count_include_pad=include, divisor=divisor)
        return low.reshape(y, out_shape) if nd == 1 or unbatched else y
    _static(x, f"avg_pool{nd}d")
    out = [int(d) for d in out_shape[-nd:]]
    w = Windows(low, x, k, s, p, [1] * nd, out, 0.0)
    total = None
    for off in w.offsets:
        v = w.slice(off)
        total = v if total is None else low.op("cuvil.add", total, v)
    if divisor:
        grid = np.full(out, float(divisor))
    else:
        grid = np.ones(out)
        for d in range(nd):
            shape = [1] * nd
            shape[d] = out[d]
            grid = grid * _avg_divisors(w.size[d], k[d], s[d], p[d], out[d], ceil, include).reshape(shape)
    y = low.op("cuvil.div", total, low.const(grid, x.dtype))
    return low.reshape(y, out_shape) if unbatched else y


def _adaptive_windows(size: int, out: int) -> list[tuple[int, int]]:
    return [((o * size) // out, -(-((o + 1) * size) // out)) for o in range(out)]


def _adaptive(low, x: Value, out: list[int], kind: str, with_indices: bool):
    """Adaptive pooling of x [N, C, *S] to `out`: uniform windows become one pooling
    (window decomposition); otherwise each output cell is a slice and a reduction."""
    nd = len(out)
    size = [int(d) for d in x.shape[2:]]
    if all(size[d] % out[d] == 0 for d in range(nd)):
        k = [size[d] // out[d] for d in range(nd)]
        if kind == "max":
            return max_windows(low, x, k, k, [0] * nd, [1] * nd, out, with_indices)
        w = Windows(low, x, k, k, [0] * nd, [1] * nd, out, 0.0)
        total = None
        for off in w.offsets:
            v = w.slice(off)
            total = v if total is None else low.op("cuvil.add", total, v)
        return low.op("cuvil.div", total, low.const(float(np.prod(k)), x.dtype)), None
    cells = [_adaptive_windows(size[d], out[d]) for d in range(nd)]
    vals, idxs = [], []
    for cell in itertools.product(*[range(o) for o in out]):
        bounds = [cells[d][cell[d]] for d in range(nd)]
        part = low.op("cuvil.slice", x, starts=[0, 0, *[b[0] for b in bounds]],
                      ends=[int(x.shape[0]), int(x.shape[1]), *[b[1] for b in bounds]], steps=[1] * (nd + 2))
        kern = [b[1] - b[0] for b in bounds]
        if kind == "max":
            v, i = max_windows(low, part, kern, kern, [0] * nd, [1] * nd, [1] * nd, with_indices)
            if i is not None:  # the index within the slice -> within the input
                coords = np.unravel_index(np.arange(int(np.prod(kern))), kern)
                lut = np.ravel_multi_index([c + b[0] for c, b in zip(coords, bounds)], size)
                i = low.op("cuvil.gather", low.const(lut.astype(np.int64)), i, axis=0)
        else:
            v, i = low.op("cuvil.reduce_mean", part, axes=list(range(2, nd + 2)), keepdims=True), None
        vals.append(low.reshape(v, [x.shape[0], x.shape[1], 1]))
        idxs.append(low.reshape(i, [x.shape[0], x.shape[1], 1]) if i is not None else None)
    shape = [x.shape[0], x.shape[1], *out]
    y = low.reshape(low.op("cuvil.concat", *vals, axis=2) if len(vals) > 1 else vals[0], shape)
    if not with_indices:
        return y, None
    return y, low.reshape(low.op("cuvil.concat", *idxs, axis=2) if len(idxs) > 1 else idxs[0], shape)


@handles("adaptive_avg_pool1d", "adaptive_avg_pool2d", "_adaptive_avg_pool2d")
def _adaptive_avg_pool_kernel(low, a):
    """1-D and 2-D adaptive average pooling by its kernel (a 1-D input as height 1)."""
    nd = 1 if low.node.target._schema.name.endswith("pool1d") else 2
    x, unbatched = batched(low, a["self"], nd)
    shape = out_shape_of(low)
    size = [int(d) for d in shape[-nd:]]
    if nd == 1:
        x = low.reshape(x, [x.shape[0], x.shape[1], 1, x.shape[2]])
        size = [1, *size]
    y = low.op("cuvil.adaptive_avg_pool2d", x, size=size)
    return low.reshape(y, shape) if nd == 1 or unbatched else y


@handles("adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d", "adaptive_avg_pool3d",
         "_adaptive_avg_pool3d")
def _adaptive_pool(low, a):
    name = low.node.target._schema.name
    nd = int(name.split("pool")[1][0])
    kind = "max" if "max" in name else "avg"
    x, unbatched = batched(low, a["self"], nd)
    out = _ints(a["output_size"], nd)
    if kind == "max" and nd == 2 and not unbatched and not indices_used(low.node):
        h, w = x.shape[2:]
        if out == [1, 1] or (isinstance(h, int) and isinstance(w, int) and h % out[0] == 0 and w % out[1] == 0):
            return _adaptive_max_pool2d_kernel(low, a)  # the pooling kernel; no indices
    _static(x, name.split("::")[1])
    y, idx = _adaptive(low, x, out, kind, kind == "max")
    if unbatched:
        y = low.reshape(y, y.shape[1:])
        idx = low.reshape(idx, idx.shape[1:]) if idx is not None else None
    return [y, idx] if kind == "max" else y


@handles("im2col")
def _im2col(low, a):
    """F.unfold: [N, C, H, W] -> [N, C * kh * kw, L], channel-major then kernel offset."""
    x, unbatched = batched(low, a["self"], 2)
    _static(x, "unfold")
    k, dil, p, s = (pair(a[n]) for n in ("kernel_size", "dilation", "padding", "stride"))
    n, c, h, w = (int(d) for d in x.shape)
    out = [(h + 2 * p[0] - dil[0] * (k[0] - 1) - 1) // s[0] + 1, (w + 2 * p[1] - dil[1] * (k[1] - 1) - 1) // s[1] + 1]
    win = Windows(low, x, k, s, p, dil, out, 0.0)
    cols = [low.reshape(win.slice(off), [n, c, 1, out[0] * out[1]]) for off in win.offsets]
    y = low.op("cuvil.concat", *cols, axis=2) if len(cols) > 1 else cols[0]
    y = low.reshape(y, [n, c * k[0] * k[1], out[0] * out[1]])
    return low.reshape(y, y.shape[1:]) if unbatched else y
