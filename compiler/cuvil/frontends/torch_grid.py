"""F.grid_sample on 4-D and 5-D inputs, bilinear or nearest (and bicubic on 4-D), with
zeros, border or reflection padding.
Registered into the same HANDLERS table as torch_ops.

The grid's normalised coordinates become pixel coordinates (torch's rule for each
align_corners); each of the 1 (nearest, rounded half to even) or 4 (bilinear) corners
(2**dims for bilinear, 16 for bicubic) is a gather of the flattened image by that sample's flat index,
zeroed where the corner lies outside (zeros padding; border and reflection padding move
the coordinates inside first, as torch does), weighted and summed. Static shapes.
"""
from __future__ import annotations

import itertools

import numpy as np

from ..errors import UnsupportedOpError
from ..ir import Value
from .torch_math import _Ops, round_half_even, trunc
from .torch_ops import handles

_MODES = {0: "bilinear", 1: "nearest", 2: "bicubic"}
_PADDING = {0: "zeros", 1: "border", 2: "reflection"}


def _floor(o: _Ops, x: Value) -> Value:
    t = trunc(o, x)
    return o.where(o.gt(t, x), o.sub(t, 1.0), t)


def _reflect(o: _Ops, x: Value, lo2: int, hi2: int) -> Value:
    """torch's reflect_coordinates: x mirrored into [lo2/2, hi2/2] as often as needed."""
    if lo2 == hi2:
        return o.mul(x, 0.0)
    low_, span = lo2 / 2, (hi2 - lo2) / 2
    x = o.abs(o.sub(x, low_))
    flips = _floor(o, o.div(x, span))
    extra = o.sub(x, o.mul(flips, span))
    even = o.eq(o.sub(flips, o.mul(_floor(o, o.div(flips, 2.0)), 2.0)), 0.0)
    return o.where(even, o.add(extra, low_), o.add(o.sub(span, extra), low_))


def _unnormalise(o: _Ops, gi: Value, size: int, align: bool) -> Value:
    return o.mul(o.add(gi, 1.0), (size - 1) / 2) if align else o.div(o.sub(o.mul(o.add(gi, 1.0), size), 1.0), 2.0)


def _pad_coordinate(o: _Ops, pix: Value, size: int, padding: str, align: bool) -> Value:
    if padding == "reflection":
        pix = _reflect(o, pix, 0, 2 * (size - 1)) if align else _reflect(o, pix, -1, 2 * size - 1)
    if padding in ("border", "reflection"):
        pix = o.clamp(pix, min=0.0, max=float(size - 1))
    return pix


def _cubic(o: _Ops, t: Value) -> list[Value]:
    """The 4 cubic-convolution weights (A = -0.75) of taps -1, 0, 1, 2 at fraction t."""
    a = -0.75

    def near(x):  # |x| <= 1
        return o.add(o.mul(o.mul(o.sub(o.mul(x, a + 2), a + 3), x), x), 1.0)

    def far(x):  # 1 < |x| < 2
        return o.sub(o.mul(o.add(o.mul(o.sub(o.mul(x, a), 5 * a), x), 8 * a), x), 4 * a)
    u = o.sub(1.0, t)
    return [far(o.add(t, 1.0)), near(t), near(u), far(o.add(u, 1.0))]


@handles("grid_sampler", "grid_sampler_2d", "grid_sampler_3d")
def _grid_sample(low, a):
    x, grid = a["input"], a["grid"]
    mode, padding = _MODES[int(a["interpolation_mode"])], _PADDING[int(a["padding_mode"])]
    align = bool(a["align_corners"])
    if mode == "bicubic" and x.type.rank != 4:
        raise UnsupportedOpError("grid_sample with mode 'bicubic' needs a 4-D input, as in torch")
    if not (x.type.is_static and grid.type.is_static):
        raise UnsupportedOpError(f"grid_sample over the symbolic shape {list(x.shape)} is not supported")
    nd = x.type.rank - 2
    n, c = int(x.shape[0]), int(x.shape[1])
    sizes = [int(d) for d in x.shape[2:]]                      # D, H, W (outer to inner)
    out = [int(d) for d in grid.shape[1:-1]]
    m = int(np.prod(out))
    o = _Ops(low, x.dtype)
    g = low.cast(grid, x.dtype)
    pix = []
    for d in range(nd):  # the grid lists x (innermost dim) first
        comp = nd - 1 - d
        gi = low.op("cuvil.slice", g, starts=[0] * (nd + 1) + [comp], ends=[n, *out, comp + 1], steps=[1] * (nd + 2))
        raw = _unnormalise(o, low.reshape(gi, [n, 1, m]), sizes[d], align)
        pix.append(raw if mode == "bicubic" else _pad_coordinate(o, raw, sizes[d], padding, align))
    if mode == "nearest":
        corners = [([round_half_even(o, p) for p in pix], None)]
    elif mode == "bicubic":  # 4 x 4 taps around floor(pix), each moved inside by the padding on its own
        lo = [_floor(o, p) for p in pix]
        weights = [_cubic(o, o.sub(p, f)) for p, f in zip(pix, lo)]
        corners = []
        for ky, kx in itertools.product(range(4), repeat=2):
            cs = [_pad_coordinate(o, o.add(f, float(k - 1)), size, padding, align)
                  for f, k, size in zip(lo, (ky, kx), sizes)]
            corners.append((cs, o.mul(weights[0][ky], weights[1][kx])))
    else:
        lo = [_floor(o, p) for p in pix]
        frac = [o.sub(p, f) for p, f in zip(pix, lo)]
        corners = []
        for bits in itertools.product((0, 1), repeat=nd):
            cs = [o.add(f, 1.0) if b else f for f, b in zip(lo, bits)]
            wt = None
            for fr, b in zip(frac, bits):
                term = fr if b else o.sub(1.0, fr)
                wt = term if wt is None else o.mul(wt, term)
            corners.append((cs, wt))
    strides = [int(np.prod(sizes[d + 1:])) for d in range(nd)]
    flat = low.reshape(x, [n * c * int(np.prod(sizes))])
    base = low.const((np.arange(n * c) * int(np.prod(sizes))).reshape(n, c, 1), "i64")
    total = None
    for cs, weight in corners:
        inside, idx = None, base
        for cd, size, stride in zip(cs, sizes, strides):
            ok = o.and_(o.ge(cd, 0.0), o.le(cd, float(size - 1)))
            inside = ok if inside is None else o.and_(inside, ok)
            ci = low.cast(o.clamp(cd, min=0.0, max=float(size - 1)), "i64")
            idx = low.op("cuvil.add", idx, low.op("cuvil.mul", ci, low.const(np.asarray(stride), "i64")))
        v = o.where(inside, low.op("cuvil.gather", flat, idx, axis=0), o.c(0.0))  # [n, c, m]
        v = v if weight is None else o.mul(v, weight)
        total = v if total is None else o.add(total, v)
    return low.reshape(total, [n, c, *out])
