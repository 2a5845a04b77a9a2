"""Neural-network ops: matmul and conv2d (with fused epilogues), pooling, normalisation,
softmax and resize.

`cuvil.matmul` and `cuvil.conv2d` take their main operands first and then *extra*
operands used by the optional `post` program (slot 0 is the raw result, slot 1.. the
extras, broadcast to the result): bias, residual and activation fused into the kernel.
"""
from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ...errors import VerifyError
from ..core import Op
from ..types import FLOAT_DTYPES, TensorType, broadcast_shapes
from .elementwise import eval_program, infer_program
from .quant import fake_quant


def _apply_post(raw: np.ndarray, extras, attrs) -> np.ndarray:
    post = attrs.get("post") or []
    if not post:
        return raw
    out = eval_program(post, [raw, *extras])
    return np.broadcast_to(out, raw.shape).astype(raw.dtype)


def _infer_post(name, raw: TensorType, extras: list[TensorType], attrs) -> TensorType:
    post = attrs.get("post") or []
    if not post:
        if extras:
            raise VerifyError(f"{name}: extra operands without a post program")
        return raw
    out = infer_program(post, [raw, *extras])
    if broadcast_shapes(raw.shape, out.shape) != raw.shape or out.dtype != raw.dtype:
        raise VerifyError(f"{name}: post program changes the result type to {out}")
    return raw


class MatMul(Op):
    """Batched matrix product with NumPy broadcasting over leading dims (ranks >= 2)."""

    name = "cuvil.matmul"

    @classmethod
    def infer_types(cls, types, attrs):
        if len(types) < 2:
            raise VerifyError("cuvil.matmul takes at least 2 operands")
        a, b = types[:2]
        if a.rank < 2 or b.rank < 2:
            raise VerifyError(f"cuvil.matmul needs rank >= 2 operands, got {a} and {b}")
        # B may be an f16 weight of an f32 product (fp16 quantization): computed in f32.
        if a.dtype not in FLOAT_DTYPES or not (a.dtype == b.dtype or (a.dtype, b.dtype) == ("f32", "f16")):
            raise VerifyError(f"cuvil.matmul needs equal float dtypes (or f32 x f16 weights), got {a.dtype} and {b.dtype}")
        if a.shape[-1] != b.shape[-2]:
            raise VerifyError(f"cuvil.matmul: contraction dims differ in {a} and {b}")
        batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
        raw = TensorType((*batch, a.shape[-2], b.shape[-1]), a.dtype)
        return [_infer_post(cls.name, raw, list(types[2:]), attrs)]

    @classmethod
    def reference(cls, args, attrs):
        a, b = args[:2]
        if attrs.get("act_quant"):  # int8: the product of the quantized activation
            a = fake_quant(a, attrs["act_quant"])
        raw = np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(a.dtype)
        return [_apply_post(raw, args[2:], attrs)]


def conv_out_dim(size, k, stride, pad_lo, pad_hi, dilation, ceil_mode=False):
    span = size + pad_lo + pad_hi - dilation * (k - 1) - 1
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + pad_lo:
        out -= 1  # the last window must start inside the input or the left padding
    if out < 1:  # ceil_mode keeps one partial window even when the window exceeds the input
        raise VerifyError(f"window of {k} (dilation {dilation}) larger than padded input {size}")
    return out


class Conv2d(Op):
    """NCHW conv; w is [OC, C/groups, KH, KW]; pads = [top, left, bottom, right]."""

    name = "cuvil.conv2d"

    @classmethod
    def infer_types(cls, types, attrs):
        if len(types) < 2:
            raise VerifyError("cuvil.conv2d takes at least 2 operands")
        x, w = types[:2]
        if x.rank != 4 or w.rank != 4:
            raise VerifyError(f"cuvil.conv2d needs 4-D input and weight, got {x} and {w}")
        g = attrs["groups"]
        n, c, h, wd = x.shape
        oc, icg, kh, kw = w.shape
        if c != icg * g or oc % g:
            raise VerifyError(f"cuvil.conv2d: {c} input channels, weight {w.shape} and groups={g} disagree")
        (sh, sw), (dh, dw), (pt, pl, pb, pr) = attrs["stride"], attrs["dilation"], attrs["pads"]
        oh = conv_out_dim(h, kh, sh, pt, pb, dh)
        ow = conv_out_dim(wd, kw, sw, pl, pr, dw)
        raw = TensorType((n, oc, oh, ow), x.dtype)
        return [_infer_post(cls.name, raw, list(types[2:]), attrs)]

    @classmethod
    def reference(cls, args, attrs):
        x, w = args[:2]
        if attrs.get("act_quant"):  # int8: the convolution of the quantized activation
            x = fake_quant(x, attrs["act_quant"])
        g = attrs["groups"]
        (sh, sw), (dh, dw), (pt, pl, pb, pr) = attrs["stride"], attrs["dilation"], attrs["pads"]
        n, c, _, _ = x.shape
        oc, icg, kh, kw = w.shape
        xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
        win = sliding_window_view(xp, ((kh - 1) * dh + 1, (kw - 1) * dw + 1), axis=(2, 3))
        win = win[:, :, ::sh, ::sw, ::dh, ::dw]  # n, c, oh, ow, kh, kw
        oh, ow = win.shape[2:4]
        win = win.reshape(n, g, icg, oh, ow, kh, kw)
        wg = w.astype(np.float64).reshape(g, oc // g, icg, kh, kw)
        raw = np.einsum("ngchwkl,gockl->ngohw", win, wg, optimize=True).reshape(n, oc, oh, ow)
        return [_apply_post(raw.astype(x.dtype), args[2:], attrs)]


def _pool_geometry(x: TensorType, attrs):
    (kh, kw), (sh, sw), (pt, pl, pb, pr) = attrs["kernel"], attrs["stride"], attrs["pads"]
    dh, dw = attrs.get("dilation", [1, 1])
    ceil = attrs.get("ceil_mode", False)
    if x.rank != 4:
        raise VerifyError(f"pooling needs a 4-D NCHW input, got {x}")
    if max(pt, pb) > kh // 2 + kh % 2 or max(pl, pr) > kw // 2 + kw % 2:
        raise VerifyError("pooling padding must be at most half the kernel")
    oh = conv_out_dim(x.shape[2], kh, sh, pt, pb, dh, ceil)
    ow = conv_out_dim(x.shape[3], kw, sw, pl, pr, dw, ceil)
    return oh, ow


class MaxPool2d(Op):
    """attrs: kernel, stride, pads [t, l, b, r], dilation, ceil_mode."""

    name = "cuvil.max_pool2d"
    num_operands = 1

    @classmethod
    def infer_types(cls, types, attrs):
        x = types[0]
        oh, ow = _pool_geometry(x, attrs)
        return [TensorType((*x.shape[:2], oh, ow), x.dtype)]

    @classmethod
    def reference(cls, args, attrs):
        x = args[0]
        oh, ow = _pool_geometry(TensorType.of(x), attrs)
        (kh, kw), (sh, sw), (pt, pl, _, _) = attrs["kernel"], attrs["stride"], attrs["pads"]
        dh, dw = attrs.get("dilation", [1, 1])
        h, w = x.shape[2:]
        out = np.full((*x.shape[:2], oh, ow), -np.inf, dtype=x.dtype)
        for i in range(kh):
            for j in range(kw):
                for o in range(oh):
                    ih = o * sh - pt + i * dh
                    if not 0 <= ih < h:
                        continue
                    cols = np.arange(ow) * sw - pl + j * dw
                    ok = (cols >= 0) & (cols < w)
                    out[:, :, o, ok] = np.maximum(out[:, :, o, ok], x[:, :, ih, cols[ok]])
        return [out]


class AvgPool2d(Op):
    """attrs: kernel, stride, pads, ceil_mode, count_include_pad, divisor (0: none)."""

    name = "cuvil.avg_pool2d"
    num_operands = 1

    @classmethod
    def infer_types(cls, types, attrs):
        x = types[0]
        oh, ow = _pool_geometry(x, attrs)
        return [TensorType((*x.shape[:2], oh, ow), x.dtype)]

    @staticmethod
    def windows(size, out, k, s, lo, hi, include_pad):
        """(start, end, count) per output index, following PyTorch's avg_pool rules."""
        res = []
        for o in range(out):
            start = o * s - lo
            end = min(start + k, size + hi)
            pool = end - start
            start, end = max(start, 0), min(end, size)
            res.append((start, end, pool if include_pad else end - start))
        return res

    @classmethod
    def reference(cls, args, attrs):
        x = args[0].astype(np.float64)
        oh, ow = _pool_geometry(TensorType.of(args[0]), attrs)
        (kh, kw), (sh, sw), (pt, pl, pb, pr) = attrs["kernel"], attrs["stride"], attrs["pads"]
        inc, div = attrs.get("count_include_pad", True), attrs.get("divisor", 0)
        rows = cls.windows(x.shape[2], oh, kh, sh, pt, pb, inc)
        cols = cls.windows(x.shape[3], ow, kw, sw, pl, pr, inc)
        out = np.zeros((*x.shape[:2], oh, ow))
        for i, (h0, h1, hc) in enumerate(rows):
            for j, (w0, w1, wc) in enumerate(cols):
                out[:, :, i, j] = x[:, :, h0:h1, w0:w1].sum(axis=(2, 3)) / (div or hc * wc)
        return [out.astype(args[0].dtype)]


def adaptive_ranges(size: int, out: int):
    return [(i * size // out, -(-(i + 1) * size // out)) for i in range(out)]


class AdaptiveAvgPool2d(Op):
    name = "cuvil.adaptive_avg_pool2d"
    num_operands = 1

    @classmethod
    def infer_types(cls, types, attrs):
        x = types[0]
        if x.rank != 4:
            raise VerifyError(f"cuvil.adaptive_avg_pool2d needs a 4-D input, got {x}")
        return [TensorType((*x.shape[:2], *attrs["size"]), x.dtype)]

    @classmethod
    def reference(cls, args, attrs):
        x = args[0].astype(np.float64)
        oh, ow = attrs["size"]
        out = np.zeros((*x.shape[:2], oh, ow))
        for i, (h0, h1) in enumerate(adaptive_ranges(x.shape[2], oh)):
            for j, (w0, w1) in enumerate(adaptive_ranges(x.shape[3], ow)):
                out[:, :, i, j] = x[:, :, h0:h1, w0:w1].mean(axis=(2, 3))
        return [out.astype(args[0].dtype)]


class Softmax(Op):
    name = "cuvil.softmax"
    num_operands = 1
    log = False

    @classmethod
    def infer_types(cls, types, attrs):
        x = types[0]
        if not 0 <= attrs["axis"] < x.rank:
            raise VerifyError(f"{cls.name}: axis {attrs['axis']} out of range for {x}")
        return [x]

    @classmethod
    def reference(cls, args, attrs):
        x = args[0].astype(np.float64)
        ax = attrs["axis"]
        z = x - x.max(axis=ax, keepdims=True)
        if cls.log:
            out = z - np.log(np.exp(z).sum(axis=ax, keepdims=True))
        else:
            e = np.exp(z)
            out = e / e.sum(axis=ax, keepdims=True)
        return [out.astype(args[0].dtype)]


class LogSoftmax(Softmax):
    name = "cuvil.log_softmax"
    log = True


class LayerNorm(Op):
    """Normalise over the last `num_axes` dims; optional weight and bias operands."""

    name = "cuvil.layer_norm"

    @classmethod
    def infer_types(cls, types, attrs):
        x, k = types[0], attrs["num_axes"]
        if not 1 <= k <= x.rank or len(types) not in (1, 2, 3):
            raise VerifyError(f"cuvil.layer_norm: bad num_axes {k} or operand count for {x}")
        for t in types[1:]:
            if t.shape != x.shape[x.rank - k:]:
                raise VerifyError(f"cuvil.layer_norm: affine operand {t} must be {x.shape[x.rank - k:]}")
        return [x]

    @classmethod
    def reference(cls, args, attrs):
        x = args[0].astype(np.float64)
        axes = tuple(range(x.ndim - attrs["num_axes"], x.ndim))
        mu = x.mean(axis=axes, keepdims=True)
        var = ((x - mu) ** 2).mean(axis=axes, keepdims=True)
        y = (x - mu) / np.sqrt(var + attrs["eps"])
        for p, fn in zip(args[1:], (np.multiply, np.add)):
            y = fn(y, p)
        return [y.astype(args[0].dtype)]


class BatchNorm(Op):
    """Inference batch norm over axis 1: operands x, mean, var, weight, bias."""

    name = "cuvil.batch_norm"
    num_operands = 5

    @classmethod
    def infer_types(cls, types, attrs):
        x = types[0]
        if x.rank < 2 or any(t.shape != (x.shape[1],) for t in types[1:]):
            raise VerifyError(f"cuvil.batch_norm: parameters must be [{x.shape[1] if x.rank > 1 else '?'}]")
        return [x]

    @classmethod
    def reference(cls, args, attrs):
        x, mean, var, w, b = (a.astype(np.float64) for a in args)
        shape = (1, -1) + (1,) * (x.ndim - 2)
        y = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + attrs["eps"])
        return [(y * w.reshape(shape) + b.reshape(shape)).astype(args[0].dtype)]


def resize_source(out_index: int, in_size: int, out_size: int, ratio: float, mode: str,
                  align_corners: bool):
    """Source coordinate (float) of an output index, following PyTorch's upsample rules."""
    if out_size == in_size:  # torch copies along a dim whose size is unchanged, whatever the scale
        return float(out_index)
    if mode == "nearest":
        if out_size == 2 * in_size:  # torch halves the index, whatever the scale
            return float(out_index // 2)
        # torch computes floor(index * scale) in float32
        return float(min(int(math.floor(np.float32(out_index) * np.float32(ratio))), in_size - 1))
    if align_corners:
        return out_index * (in_size - 1) / (out_size - 1) if out_size > 1 else 0.0
    return max((out_index + 0.5) * ratio - 0.5, 0.0)


class Resize(Op):
    """Upsample NCHW: mode nearest|bilinear, size [OH, OW], ratio [rh, rw], align_corners."""

    name = "cuvil.resize"
    num_operands = 1

    @classmethod
    def infer_types(cls, types, attrs):
        x = types[0]
        if x.rank != 4 or attrs["mode"] not in ("nearest", "bilinear"):
            raise VerifyError(f"cuvil.resize needs a 4-D input and mode nearest|bilinear")
        return [TensorType((*x.shape[:2], *attrs["size"]), x.dtype)]

    @classmethod
    def taps(cls, in_size, out_size, ratio, mode, align):
        """Per output index: (i0, i1, frac) for linear interpolation between rows."""
        res = []
        for o in range(out_size):
            src = resize_source(o, in_size, out_size, ratio, mode, align)
            i0 = min(int(math.floor(src)), in_size - 1)
            i1 = min(i0 + 1, in_size - 1)
            res.append((i0, i1, src - i0 if mode == "bilinear" else 0.0))
        return res

    @classmethod
    def reference(cls, args, attrs):
        x = args[0].astype(np.float64)
        (oh, ow), (rh, rw) = attrs["size"], attrs["ratio"]
        mode, align = attrs["mode"], attrs.get("align_corners", False)
        th = cls.taps(x.shape[2], oh, rh, mode, align)
        tw = cls.taps(x.shape[3], ow, rw, mode, align)
        h0, h1, fh = (np.array(v) for v in zip(*th))
        w0, w1, fw = (np.array(v) for v in zip(*tw))
        rows = x[:, :, h0, :] * (1 - fh)[:, None] + x[:, :, h1, :] * fh[:, None]
        out = rows[:, :, :, w0] * (1 - fw) + rows[:, :, :, w1] * fw
        return [out.astype(args[0].dtype)]


class Attention(Op):
    """softmax(q @ kt, last axis) @ v in one op (passes/fuse_attention.py), the score
    matrix never stored: q [..., S, D], kt [..., D, Sk], v [..., Sk, Dv] (the same
    leading dims), then the extra operands of `post`, the program applied to the scores
    (a scale, a mask) as a matmul's epilogue. Result [..., S, Dv]."""
    name = "cuvil.attention"

    @classmethod
    def infer_types(cls, types, attrs):
        if len(types) < 3:
            raise VerifyError("cuvil.attention takes q, kt, v and the post program's operands")
        q, kt, v = types[:3]
        if not (q.rank == kt.rank == v.rank >= 2) or not (q.shape[:-2] == kt.shape[:-2] == v.shape[:-2]):
            raise VerifyError("cuvil.attention needs operands of one rank and the same leading dims, "
                              f"got {q}, {kt}, {v}")
        if not q.dtype == kt.dtype == v.dtype == "f32":
            raise VerifyError(f"cuvil.attention works in f32, got {q.dtype}, {kt.dtype}, {v.dtype}")
        if q.shape[-1] != kt.shape[-2] or kt.shape[-1] != v.shape[-2]:
            raise VerifyError(f"cuvil.attention: contraction dims differ in {q}, {kt}, {v}")
        _infer_post(cls.name, cls.scores_type(types), list(types[3:]), attrs)
        return [TensorType((*q.shape[:-1], v.shape[-1]), "f32")]

    @staticmethod
    def scores_type(types) -> TensorType:
        q, kt = types[:2]
        return TensorType((*q.shape[:-1], kt.shape[-1]), "f32")

    @classmethod
    def reference(cls, args, attrs):
        q, kt, v = args[:3]
        scores = MatMul.reference([q, kt, *args[3:]], {"post": attrs.get("post") or []})[0]
        probs = Softmax.reference([scores], {"axis": scores.ndim - 1})[0]
        return MatMul.reference([probs, v], {})


# Ops whose results elementwise epilogues fuse into.
ANCHORS = frozenset({"cuvil.matmul", "cuvil.conv2d"})
