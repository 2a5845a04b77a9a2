"""Handlers lowering the ATen shape and data-movement ops (view, permute, cat, slice,
split, pad, ...), upsampling and gathers to Cuvil IR, registered into the HANDLERS table
of torch_ops.py."""
from __future__ import annotations

from ..errors import UnsupportedOpError
from ..ir import Value
from .graph import slice_dim, symbolic_slice
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
    if mode != "constant":
        raise UnsupportedOpError(f"pad mode {mode!r} is not supported (only 'constant')")
    flat = list(a["pad"])
    pads = [[0, 0] for _ in range(x.type.rank)]
    for i in range(len(flat) // 2):  # torch lists the last dim first
        pads[x.type.rank - 1 - i] = [flat[2 * i], flat[2 * i + 1]]
    value = float(a.get("value") or 0.0)
    # Negative padding crops.
    for d, (lo, hi) in enumerate(pads):
        if lo < 0 or hi < 0:
            x = _slice(low, x, d, max(-lo, 0), x.shape[d] - max(-hi, 0), 1)
            pads[d] = [max(lo, 0), max(hi, 0)]
    if all(p == [0, 0] for p in pads):
        return x
    return low.op("cuvil.pad", x, pads=pads, value=value)


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
    x = a["self"]
    return low.op("cuvil.gather", x, a["index"], axis=norm_dim(a["dim"], x.type.rank))
