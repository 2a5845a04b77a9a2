"""ATen ops lowered as compositions of other Cuvil ops: transposed convolution, group and
instance norm, PReLU, softplus/mish, repeat, tensor indexing and
vector norms. Registered into the same HANDLERS table as torch_ops."""
from __future__ import annotations

import numpy as np

from ..errors import UnsupportedOpError
from ..ir import Value
from . import (  # noqa: F401  (register their handlers)
    torch_einsum, torch_grid, torch_math, torch_pool, torch_reduce, torch_resize, torch_scatter, torch_sort)
from .torch_ops import _conv, handles, norm_dim, pair, reduce_axes


@handles("conv_transpose2d", "conv_transpose1d")
def _conv_transpose(low, a):
    """As a stride-1 conv over the input with zeros inserted between pixels, padded by
    dilation*(k-1) - padding (cropped where that is negative), with the kernel flipped
    and its in/out channels swapped (at capture for a constant weight, else in the IR)."""
    x, w, b = a["input"], a["weight"], a["bias"]
    one_d = w.type.rank == 3
    unbatched = x.type.rank == w.type.rank - 1
    if unbatched:
        x = low.reshape(x, [1, *x.shape])
    if one_d:
        x = low.reshape(x, [x.shape[0], x.shape[1], 1, x.shape[2]])
        w = low.reshape(w, [w.shape[0], w.shape[1], 1, w.shape[2]])
    g = int(a["groups"])
    (sh, sw) = [1, *pair(a["stride"], 1)] if one_d else pair(a["stride"])
    (ph, pw) = [0, *pair(a["padding"], 1)] if one_d else pair(a["padding"])
    (oph, opw) = [0, *pair(a["output_padding"], 1)] if one_d else pair(a["output_padding"])
    (dh, dw) = [1, *pair(a["dilation"], 1)] if one_d else pair(a["dilation"])
    cin, ocg, kh, kw = (int(d) for d in w.shape)
    n, c, h, wd = x.shape
    # Insert (stride - 1) zeros between pixels: [N,C,H,1,W,1] -> pad -> [N,C,H*s,W*s] -> crop.
    if sh > 1 or sw > 1:
        x = low.reshape(x, [n, c, h, 1, wd, 1])
        x = low.op("cuvil.pad", x, pads=[[0, 0], [0, 0], [0, 0], [0, sh - 1], [0, 0], [0, sw - 1]], value=0.0)
        x = low.reshape(x, [n, c, h * sh, wd * sw])
        x = low.op("cuvil.slice", x, starts=[0, 0, 0, 0], ends=[n, c, (h - 1) * sh + 1, (wd - 1) * sw + 1],
                   steps=[1, 1, 1, 1])
    lo_h, lo_w = dh * (kh - 1) - ph, dw * (kw - 1) - pw
    hi_h, hi_w = lo_h + oph, lo_w + opw
    wv = _transposed_weight(low, w, g)
    y = low.op("cuvil.conv2d", x, wv, stride=[1, 1], dilation=[dh, dw],
               pads=[max(lo_h, 0), max(lo_w, 0), max(hi_h, 0), max(hi_w, 0)], groups=g)
    if min(lo_h, lo_w, hi_h, hi_w) < 0:  # padding past dilation*(k-1): crop the output instead
        oh, ow = (int(d) for d in y.shape[2:])
        y = low.op("cuvil.slice", y, starts=[0, 0, max(-lo_h, 0), max(-lo_w, 0)],
                   ends=[int(y.shape[0]), int(y.shape[1]), oh - max(-hi_h, 0), ow - max(-hi_w, 0)], steps=[1] * 4)
    if b is not None:
        y = low.op("cuvil.add", y, low.reshape(b, [1, b.shape[0], 1, 1]))
    return low.reshape(y, low.meta_type().shape) if one_d or unbatched else y


def _transposed_weight(low, w: Value, g: int) -> Value:
    """[Cin, OCg, kh, kw] per group -> [OC, Cin/g, kh, kw], flipped spatially."""
    cin, ocg, kh, kw = (int(d) for d in w.shape)
    cg = cin // g
    op = w.defining_op
    if op is not None and op.name == "cuvil.constant":
        wt = op.value.reshape(g, cg, ocg, kh, kw).transpose(0, 2, 1, 3, 4).reshape(g * ocg, cg, kh, kw)
        return low.const(np.ascontiguousarray(wt[:, :, ::-1, ::-1]))
    wt = low.op("cuvil.transpose", low.reshape(w, [g, cg, ocg, kh, kw]), perm=[0, 2, 1, 3, 4])
    wt = low.reshape(wt, [g * ocg, cg, kh, kw])
    for axis, k in ((2, kh), (3, kw)):
        if k > 1:
            wt = low.op("cuvil.gather", wt, low.const(np.arange(k - 1, -1, -1, dtype=np.int64)), axis=axis)
    return wt


@handles("conv3d")
def _conv3d(low, a):
    """conv3d as one conv2d per kernel depth offset over the depth-strided slices of the
    (depth-padded) input, with the output depths folded into the batch, summed."""
    x, w, b = a["input"], a["weight"], a["bias"]
    if x.type.rank == 4:  # unbatched
        y = _conv3d(low, dict(a, input=low.reshape(x, [1, *x.shape])))
        return low.reshape(y, list(y.shape[1:]))
    if not (x.type.is_static and w.type.is_static):
        raise UnsupportedOpError(f"conv3d over the symbolic shape {list(x.shape)} is not supported")
    stride, dil = pair(a["stride"], 3), pair(a["dilation"], 3)
    n, c, depth = (int(d) for d in x.shape[:3])
    o, _, kd = (int(d) for d in w.shape[:3])
    padding = a["padding"]
    if isinstance(padding, str):
        total = dil[0] * (kd - 1) if padding == "same" else 0
        pd, hw_pad = (total // 2, total - total // 2), padding
    else:
        p3 = pair(padding, 3)
        pd, hw_pad = (p3[0], p3[0]), p3[1:]
    if any(pd):
        x = low.op("cuvil.pad", x, pads=[[0, 0], [0, 0], list(pd), [0, 0], [0, 0]], value=0.0)
        depth += sum(pd)
    od = (depth - dil[0] * (kd - 1) - 1) // stride[0] + 1
    h, wd = (int(d) for d in x.shape[3:])
    total = None
    for k in range(kd):
        start = k * dil[0]
        xs = low.op("cuvil.slice", x, starts=[0, 0, start, 0, 0], ends=[n, c, start + (od - 1) * stride[0] + 1, h, wd],
                    steps=[1, 1, stride[0], 1, 1])
        xs = low.reshape(low.op("cuvil.transpose", xs, perm=[0, 2, 1, 3, 4]), [n * od, c, h, wd])
        wk = low.op("cuvil.slice", w, starts=[0, 0, k, 0, 0], ends=[*map(int, w.shape[:2]), k + 1, *map(int, w.shape[3:])],
                    steps=[1] * 5)
        wk = low.reshape(wk, [o, int(w.shape[1]), *map(int, w.shape[3:])])
        y = _conv(low, xs, wk, None, stride[1:], hw_pad, dil[1:], a["groups"])
        total = y if total is None else low.op("cuvil.add", total, y)
    oh, ow = (int(d) for d in total.shape[2:])
    y = low.op("cuvil.transpose", low.reshape(total, [n, od, o, oh, ow]), perm=[0, 2, 1, 3, 4])
    if b is not None:
        y = low.op("cuvil.add", y, low.reshape(b, [1, o, 1, 1, 1]))
    return y


@handles("group_norm", "native_group_norm")
def _group_norm(low, a):
    x = a["input"]
    g = int(a["num_groups"] if "num_groups" in a else a["group"])
    n, c = x.shape[0], x.shape[1]
    rest = int(np.prod(x.shape[2:], dtype=np.int64))
    y = low.reshape(x, [n, g, (c // g) * rest])
    y = low.op("cuvil.layer_norm", y, num_axes=1, eps=float(a["eps"]))
    y = low.reshape(y, list(x.shape))
    bshape = [1, c] + [1] * (x.type.rank - 2)
    if a.get("weight") is not None:
        y = low.op("cuvil.mul", y, low.reshape(a["weight"], bshape))
    if a.get("bias") is not None:
        y = low.op("cuvil.add", y, low.reshape(a["bias"], bshape))
    return y if low.node.target._schema.name == "aten::group_norm" else [y, None, None]


@handles("rms_norm")
def _rms_norm(low, a):
    """x / sqrt(mean(x^2 over the normalised dims) + eps) * weight; eps defaults to the
    dtype's machine epsilon, as in torch."""
    x, k = a["input"], len(a["normalized_shape"])
    eps = a.get("eps")
    eps = float(np.finfo(x.type.np_dtype).eps) if eps is None else float(eps)
    axes = list(range(x.type.rank - k, x.type.rank))
    ms = low.op("cuvil.reduce_mean", low.op("cuvil.mul", x, x), axes=axes, keepdims=True)
    y = low.op("cuvil.mul", x, low.op("cuvil.rsqrt", low.op("cuvil.add", ms, low.const(np.asarray(eps), x.dtype))))
    return y if a.get("weight") is None else low.op("cuvil.mul", y, a["weight"])


@handles("instance_norm")
def _instance_norm(low, a):
    if a.get("use_input_stats") is False:
        raise UnsupportedOpError("instance_norm with running statistics is not supported")
    x = a["input"]
    n, c = x.shape[0], x.shape[1]
    y = low.reshape(x, [n, c, int(np.prod(x.shape[2:], dtype=np.int64))])
    y = low.reshape(low.op("cuvil.layer_norm", y, num_axes=1, eps=float(a["eps"])), list(x.shape))
    bshape = [1, c] + [1] * (x.type.rank - 2)
    if a.get("weight") is not None:
        y = low.op("cuvil.mul", y, low.reshape(a["weight"], bshape))
    if a.get("bias") is not None:
        y = low.op("cuvil.add", y, low.reshape(a["bias"], bshape))
    return y


@handles("prelu", "_prelu_kernel")
def _prelu(low, a):
    x, w = a["self"], a["weight"]
    if w.type.numel > 1 and x.type.rank >= 2:
        w = low.reshape(w, [1, w.shape[0]] + [1] * (x.type.rank - 2))
    zero = low.const(0.0, x.dtype)
    y = low.op("cuvil.where", low.op("cuvil.gt", x, zero), x, low.op("cuvil.mul", x, w))
    return low.reshape(y, list(low.meta_type().shape))  # a 0-d x with a [1] weight stays 0-d


def _softplus(low, x, beta=1.0, threshold=20.0):
    bx = low.op("cuvil.mul", x, low.const(float(beta), x.dtype)) if beta != 1 else x
    soft = low.op("cuvil.log", low.op("cuvil.add", low.op("cuvil.exp", bx), low.const(1.0, x.dtype)))
    if beta != 1:
        soft = low.op("cuvil.div", soft, low.const(float(beta), x.dtype))
    big = low.op("cuvil.gt", bx, low.const(float(threshold), x.dtype))
    return low.op("cuvil.where", big, x, soft)


@handles("softplus")
def _softplus_h(low, a):
    return _softplus(low, a["self"], a.get("beta", 1.0), a.get("threshold", 20.0))


@handles("mish", "mish_")
def _mish(low, a):
    x = a["self"]
    return low.op("cuvil.mul", x, low.op("cuvil.tanh", _softplus(low, x)))


@handles("repeat")
def _repeat(low, a):
    x, reps = a["self"], list(a["repeats"])
    shape = [1] * (len(reps) - x.type.rank) + list(x.shape)
    inter, bcast = [], []
    for r, d in zip(reps, shape):
        inter += [1, d]
        bcast += [r, d]
    y = low.op("cuvil.broadcast_to", low.reshape(x, inter), shape=bcast)
    return low.reshape(y, low.meta_type().shape)


@handles("index")
def _index(low, a):
    x, idx = a["self"], list(a["indices"])
    used = [i for i, t in enumerate(idx) if t is not None]
    if len(used) != 1:
        raise UnsupportedOpError("tensor indexing with more than one index tensor is not supported")
    d = used[0]
    t = idx[d]
    if t.dtype == "bool":
        raise UnsupportedOpError("boolean-mask indexing has a data-dependent shape and is not supported")
    return low.op("cuvil.gather", x, low.cast(t, "i64"), axis=d)


@handles("stack")
def _stack(low, a):
    ts = list(a["tensors"])
    rank = ts[0].type.rank + 1
    d = norm_dim(a.get("dim", 0), rank)
    parts = [low.reshape(t, list(t.shape[:d]) + [1] + list(t.shape[d:])) for t in ts]
    return parts[0] if len(parts) == 1 else low.op("cuvil.concat", *parts, axis=d)
