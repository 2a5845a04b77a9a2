"""Upsampling in 1-D, 2-D and 3-D: nearest, nearest-exact, (bi/tri)linear and bicubic.
Registered into the same HANDLERS table as torch_ops.

2-D nearest and bilinear run the resize kernel (torch_shape_ops.py). Everything else is
separable: along each resized dim, a gather of each tap's source rows (clamped to the
input, as torch clamps) times that tap's weight per output index, summed over the taps
(1 for nearest, 2 for linear, 4 for cubic convolution with A = -0.75). Exact taps: no
products of zero weights with inf or NaN.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import UnsupportedOpError
from ..ir import Value
from ..ir.ops.nn import resize_source
from .torch_ops import handles

_CUBIC_A = -0.75


def _cubic_weights(t: float) -> list[float]:
    a = _CUBIC_A

    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def taps(mode: str, in_size: int, out_size: int, ratio: float, align: bool):
    """[(source indices [out], weights [out]) per tap] along one dim, as torch computes them."""
    o = np.arange(out_size)
    if out_size == in_size and mode != "nearest-exact":
        return [(o, np.ones(out_size))]
    if mode == "nearest":
        return [(np.array([int(resize_source(i, in_size, out_size, ratio, "nearest", False)) for i in o]),
                 np.ones(out_size))]
    if mode == "nearest-exact":
        src = [min(int(math.floor((np.float32(i) + np.float32(0.5)) * np.float32(ratio))), in_size - 1) for i in o]
        return [(np.array(src), np.ones(out_size))]
    if mode == "linear":
        src = np.array([resize_source(i, in_size, out_size, ratio, "bilinear", align) for i in o])
        i0 = np.minimum(np.floor(src).astype(np.int64), in_size - 1)
        f = src - i0
        return [(i0, 1 - f), (np.minimum(i0 + 1, in_size - 1), f)]
    if mode == "cubic":
        if align:
            src = o * ((in_size - 1) / (out_size - 1) if out_size > 1 else 0.0)
        else:
            src = (o + 0.5) * ratio - 0.5
        i = np.floor(src).astype(np.int64)
        w = np.array([_cubic_weights(t) for t in src - i])
        return [(np.clip(i + k - 1, 0, in_size - 1), w[:, k]) for k in range(4)]
    raise UnsupportedOpError(f"upsampling mode {mode!r} is not supported")


def resize_dim(low, x: Value, d: int, mode: str, out_size: int, ratio: float, align: bool) -> Value:
    in_size = x.shape[d]
    if not isinstance(in_size, int):
        raise UnsupportedOpError(f"{mode} upsampling along the symbolic dim {in_size} is not supported")
    total = None
    for idx, w in taps(mode, in_size, out_size, ratio, align):
        if np.array_equal(idx, np.arange(in_size)) and np.all(w == 1):
            part = x
        else:
            part = low.op("cuvil.gather", x, low.const(idx.astype(np.int64)), axis=d)
        if not np.all(w == 1):
            shape = [1] * x.type.rank
            shape[d] = out_size
            part = low.op("cuvil.mul", part, low.const(w.reshape(shape), x.dtype))
        total = part if total is None else low.op("cuvil.add", total, part)
    return total


_MODES = {"nearest": "nearest", "_nearest_exact": "nearest-exact", "linear": "linear", "bilinear": "linear",
          "trilinear": "linear", "bicubic": "cubic"}


@handles("upsample_nearest1d", "upsample_nearest3d", "_upsample_nearest_exact1d", "_upsample_nearest_exact2d",
         "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_trilinear3d", "upsample_bicubic2d")
def _upsample(low, a):
    name = low.node.target._schema.name.split("::")[1]
    mode = _MODES[name.replace("upsample_", "")[:-2]]
    x = a["input"] if "input" in a else a["self"]
    nd = int(name[-2])
    out = [int(d) for d in low.meta_type().shape[2:]]
    scales = a.get("scale_factors")
    if scales is None:
        keys = {1: ["scales"], 2: ["scales_h", "scales_w"], 3: ["scales_d", "scales_h", "scales_w"]}[nd]
        scales = [a.get(k) for k in keys]
    align = bool(a.get("align_corners") or False)
    for i in range(nd):
        s = scales[i] if scales else None
        ratio = 1.0 / float(s) if s else x.shape[2 + i] / out[i]
        x = resize_dim(low, x, 2 + i, mode, out[i], ratio, align)
    return x
