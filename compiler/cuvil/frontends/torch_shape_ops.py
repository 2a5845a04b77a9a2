"""Handlers lowering the ATen shape and data-movement ops (view, permute, cat, slice,
split, pad, ...), upsampling and gathers to Cuvil IR, registered into the HANDLERS table
of torch_ops.py."""
from __future__ import annotations

import numpy as np

from ..errors import UnsupportedOpError
from ..ir import Value
from .graph import const_array, slice_dim, symbolic_slice
from .torch_ops import handles, norm_dim


# -- shape ops ------------------------------------------------------------------------
@handles("view", "reshape", "_unsafe_view", "flatten", "unflatten", "squeeze", "unsqueeze",
         "squeeze_", "unsqueeze_", "view_as", "reshape_as")
def _reshape(low, a):
    return low.reshape(a["self"], low.meta_type().shape)


@handles("expand", "expand_as", "broadcast_to")
def _expand(low, a):
    x, shape = a["self"], list(low.meta_type().shape)
    if list(x.shape) == shape:
        return x
    if x.type.rank < len(shape):
        x = low.reshape(x, [1] * (len(shape) - x.type.rank) + list(x.shape))
    return low.op("cuvil.broadcast_to", x, shape=shape)


@handles("permute")
def _permute(low, a):
    x = a["self"]
    perm = [norm_dim(d, x.type.rank) for d in a["dims"]]
    return x if perm == sorted(perm) else low.op("cuvil.transpose", x, perm=perm)


@handles("transpose", "swapaxes")
def _transpose(low, a):
    x = a["self"]
    d0, d1 = (norm_dim(a[k], x.type.rank) for k in (("dim0", "dim1") if "dim0" in a else ("axis0", "axis1")))
    if d0 == d1:
        return x
    perm = list(range(x.type.rank))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return low.op("cuvil.transpose", x, perm=perm)


@handles("cat", "concat", "concatenate")
def _cat(low, a):
    ts = [t for t in a["tensors"] if not (t.type.rank == 1 and t.shape[0] == 0)]
    dtype = low.meta_type().dtype
    if not ts:  # only empty tensors: an empty result
        t = low.meta_type()
        return low.const(np.zeros(t.shape, t.np_dtype))
    ts = [low.cast(t, dtype) for t in ts]
    if len(ts) == 1:
        return ts[0]
    return low.op("cuvil.concat", *ts, axis=norm_dim(a["dim"], ts[0].type.rank))


def _slice(low, x: Value, dim: int, start: int, end: int, step: int) -> Value:
    n = x.shape[dim]
    if isinstance(n, str) or isinstance(end, str) or isinstance(start, str):
        return symbolic_slice(low, x, dim, start, end, step, "slice")
    if slice(start, end, step).indices(n)[2] < 1:
        raise UnsupportedOpError("slices with a negative step are not supported")
    return slice_dim(low, x, dim, start, end, step)


@handles("slice")
def _slice_h(low, a):
    x = a["self"]
    dim = norm_dim(a["dim"], x.type.rank)
    return _slice(low, x, dim, a["start"], a["end"], a["step"] or 1)


@handles("select")
def _select(low, a):
    x = a["self"]
    dim = norm_dim(a["dim"], x.type.rank)
    i = a["index"] + x.shape[dim] if a["index"] < 0 else a["index"]
    return low.reshape(_slice(low, x, dim, i, i + 1, 1), low.meta_type().shape)


@handles("narrow")
def _narrow(low, a):
    x = a["self"]
    dim = norm_dim(a["dim"], x.type.rank)
    return _slice(low, x, dim, a["start"], a["start"] + a["length"], 1)


def _split_at(low, x, dim, sizes):
    outs, start = [], 0
    for s in sizes:
        outs.append(_slice(low, x, dim, start, start + s, 1))
        start += s
    return outs


@handles("split", "split_with_sizes")
def _split(low, a):
    x = a["self"]
    dim = norm_dim(a["dim"], x.type.rank)
    n = x.shape[dim]
    size = a["split_size"] if "split_size" in a else a["split_sizes"]
    sizes = size if isinstance(size, (list, tuple)) else [min(size, n - i) for i in range(0, n, size)]
    return _split_at(low, x, dim, sizes)


@handles("chunk")
def _chunk(low, a):
    x = a["self"]
    dim = norm_dim(a["dim"], x.type.rank)
    n = x.shape[dim]
    size = -(-n // a["chunks"])
    return _split_at(low, x, dim, [min(size, n - i) for i in range(0, n, size)])


@handles("unbind")
def _unbind(low, a):
    x = a["self"]
    dim = norm_dim(a["dim"], x.type.rank)
    shape = [d for i, d in enumerate(x.shape) if i != dim]
    return [low.reshape(s, shape) for s in _split_at(low, x, dim, [1] * x.shape[dim])]


@handles("getitem")
def _getitem(low, a):
    seq, i = a["args"]
    return seq[i]


@handles("pad", "constant_pad_nd")
def _pad(low, a):
    x = a["self"] if "self" in a else a["input"]
    mode = a.get("mode", "constant")
    flat = list(a["pad"])
    pads = [[0, 0] for _ in range(x.type.rank)]
    for i in range(len(flat) // 2):  # torch lists the last dim first
        pads[x.type.rank - 1 - i] = [flat[2 * i], flat[2 * i + 1]]
    if mode != "constant":
        return _pad_by_index(low, x, pads, mode)
    value = float(a.get("value") or 0.0)
    # Negative padding crops.
    for d, (lo, hi) in enumerate(pads):
        if lo < 0 or hi < 0:
            x = _slice(low, x, d, max(-lo, 0), x.shape[d] - max(-hi, 0), 1)
            pads[d] = [max(lo, 0), max(hi, 0)]
    if all(p == [0, 0] for p in pads):
        return x
    return low.op("cuvil.pad", x, pads=pads, value=value)


def _pad_by_index(low, x: Value, pads, mode: str) -> Value:
    """reflect / replicate / circular padding (or cropping, for negative pads): per padded
    dim, a gather of the source index of every output position."""
    for d, (lo, hi) in enumerate(pads):
        if lo == 0 and hi == 0:
            continue
        n = _static_dim(x, d, f"pad (mode {mode!r})")
        if mode == "circular" and (lo < 0 or hi < 0):  # torch crops first, then wraps around what is left
            x = _slice(low, x, d, max(-lo, 0), n - max(-hi, 0), 1)
            n, lo, hi = int(x.shape[d]), max(lo, 0), max(hi, 0)
        j = np.arange(-lo, n + hi)
        if mode == "replicate":
            idx = np.clip(j, 0, n - 1)
        elif mode == "circular":
            idx = j % n
        elif mode == "reflect":
            k = np.abs(j) % max(2 * n - 2, 1)
            idx = np.where(k >= n, 2 * n - 2 - k, k)
        else:
            raise UnsupportedOpError(f"pad mode {mode!r} is not supported")
        x = low.op("cuvil.gather", x, low.const(idx.astype(np.int64)), axis=d)
    return x


# -- upsampling ----------------------------------------------------------------------------
def _resize(low, a, mode):
    x = a["input"] if "input" in a else a["self"]
    out = list(low.meta_type().shape[2:])
    scales = a.get("scale_factors")
    if scales is None and a.get("scales_h") is not None:
        scales = [a["scales_h"], a["scales_w"]]
    align = bool(a.get("align_corners") or False)
    # PyTorch maps output to input with 1/scale when a scale factor was given.
    ratio = [1.0 / float(s) if s else x.shape[2 + i] / out[i] for i, s in enumerate(scales or [None, None])]
    return low.op("cuvil.resize", x, mode=mode, size=out, ratio=ratio, align_corners=align)


@handles("upsample_nearest2d")
def _up_nearest(low, a):
    return _resize(low, a, "nearest")


@handles("upsample_bilinear2d")
def _up_bilinear(low, a):
    return _resize(low, a, "bilinear")


# -- gather -----------------------------------------------------------------------------
@handles("embedding")
def _embedding(low, a):
    return low.op("cuvil.gather", a["weight"], a["indices"], axis=0)


@handles("index_select")
def _index_select(low, a):
    x, idx = a["self"], a["index"]
    if x.type.rank == 0:  # a 0-d tensor's only element, once per index
        y = low.op("cuvil.gather", low.reshape(x, [1]), low.reshape(idx, [idx.type.numel]), axis=0)
        return low.reshape(y, list(low.meta_type().shape))
    return low.op("cuvil.gather", x, idx, axis=norm_dim(a["dim"], x.type.rank))


# -- flip, roll, diff ---------------------------------------------------------------------
def _static_dim(x: Value, d: int, what: str) -> int:
    n = x.shape[d]
    if not isinstance(n, int):
        raise UnsupportedOpError(f"aten.{what} along the symbolic dim {n} is not supported")
    return n


@handles("flip")
def _flip(low, a):
    """A constant is flipped at capture; a computed tensor by a gather of reversed indices."""
    x = a["self"]
    dims = sorted({norm_dim(d, max(x.type.rank, 1)) for d in a["dims"]}) if x.type.rank else []
    value = const_array(x)
    if value is not None:
        return low.const(np.ascontiguousarray(np.flip(value, dims)))
    for d in dims:
        n = _static_dim(x, d, "flip")
        if n > 1:
            x = low.op("cuvil.gather", x, low.const(np.arange(n - 1, -1, -1, dtype=np.int64)), axis=d)
    return x


def _roll_dim(low, x: Value, shift: int, d: int) -> Value:
    n = _static_dim(x, d, "roll")
    s = shift % n if n else 0
    if s == 0:
        return x
    return low.op("cuvil.concat", _slice(low, x, d, n - s, n, 1), _slice(low, x, d, 0, n - s, 1), axis=d)


@handles("roll")
def _roll(low, a):
    """Two slices and a concat per rolled dim; without dims, over the flattened tensor."""
    x, shifts, dims = a["self"], list(a["shifts"]), list(a.get("dims") or [])
    if not dims:
        flat = _roll_dim(low, low.reshape(x, [x.type.numel]), shifts[0], 0)
        return low.reshape(flat, list(x.shape))
    for shift, d in zip(shifts, dims):
        x = _roll_dim(low, x, int(shift), norm_dim(d, x.type.rank))
    return x


@handles("diff")
def _diff(low, a):
    """x[1:] - x[:-1] along dim, n times, after concatenating prepend and append (a
    bool tensor's difference is its xor, as in torch)."""
    x, n = a["self"], int(a.get("n", 1))
    if n == 0:  # torch returns the input itself, without prepend / append
        return x
    t = low.meta_type()
    if t.is_static and 0 in t.shape:  # n past the dim's size: an empty result
        return low.const(np.zeros(t.shape, t.np_dtype))
    d = norm_dim(a.get("dim", -1), x.type.rank)
    parts = [p if p.type.rank == x.type.rank else low.reshape(p, [1] * x.type.rank)
             for p in (a.get("prepend"), x, a.get("append")) if p is not None]
    if len(parts) > 1:
        x = low.op("cuvil.concat", *[low.cast(p, x.dtype) for p in parts], axis=d)
    for _ in range(n):
        size = _static_dim(x, d, "diff")
        hi, lo = _slice(low, x, d, 1, size, 1), _slice(low, x, d, 0, size - 1, 1)
        x = low.op("cuvil.ne" if x.dtype == "bool" else "cuvil.sub", hi, lo)
    return x


# -- pixel shuffle, meshgrid ------------------------------------------------------------
@handles("pixel_shuffle", "pixel_unshuffle")
def _pixel_shuffle(low, a):
    """[*, C*r*r, H, W] <-> [*, C, H*r, W*r] as a reshape, a transpose and a reshape."""
    x = a["self"]
    lead, (c, h, w) = list(x.shape[:-3]), x.shape[-3:]
    n = len(lead)
    if low.node.target._schema.name.endswith("unshuffle"):
        r = int(a["downscale_factor"])
        y = low.reshape(x, [*lead, c, h // r, r, w // r, r])
        perm = [*range(n), n, n + 2, n + 4, n + 1, n + 3]
    else:
        r = int(a["upscale_factor"])
        y = low.reshape(x, [*lead, c // (r * r), r, r, h, w])
        perm = [*range(n), n, n + 3, n + 1, n + 4, n + 2]
    y = low.op("cuvil.transpose", y, perm=perm)
    return low.reshape(y, list(low.meta_type().shape))


@handles("meshgrid")
def _meshgrid(low, a):
    """Each 1-D (or 0-d) input reshaped along its own dim and broadcast to the grid;
    indexing='xy' swaps the first two dims of the grid."""
    ts = list(a["tensors"])
    xy = a.get("indexing") == "xy" and len(ts) >= 2
    sizes = [t.type.numel if t.type.rank else 1 for t in ts]
    order = [1, 0, *range(2, len(ts))] if xy else list(range(len(ts)))
    shape = [sizes[i] for i in order]
    outs = []
    for i, t in enumerate(ts):
        view = [1] * len(ts)
        view[order.index(i)] = sizes[i]
        outs.append(low.op("cuvil.broadcast_to", low.reshape(t, view), shape=shape))
    return outs
