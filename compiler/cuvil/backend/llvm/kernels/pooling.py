"""Pooling: max pool (the clamped form where every window overlaps the image, which also
passes bf16 plane pairs on), average pool and adaptive average pool (global pooling as
vector lanes per plane).
"""
from __future__ import annotations

from llvmlite import ir
import numpy as np

from ....errors import BackendError
from ....ir.ops.nn import AvgPool2d, adaptive_ranges
from ..emit import F32, I64, REDUCE, fconst, i64, load, store
from ..kernel_args import KernelArgs
from ..loops import alloca_in_entry, for_range
from ..parallel import rows_parallel
from ..vectors import fmax, imax, imin, pair_half, pair_join
from .conv_shapes import inside_range
from .reduce import int_reduce_init
from .rows import row_reduce_vec


def k_max_pool2d(b, k: KernelArgs):
    n, c, h, w = k.in_types[0].shape
    _, _, oh, ow = k.out_type.shape
    (kh, kw), (sh, sw), (pt, pl, _, _) = k.attrs["kernel"], k.attrs["stride"], k.attrs["pads"]
    dh, dw = k.attrs.get("dilation", [1, 1])
    dt = k.out_type.dtype
    _, _, pb, pr = k.attrs["pads"]
    if dt in ("f32", "f16", "f64") and dh == dw == 1 and max(pt, pb) < kh and max(pl, pr) < kw:
        return _max_pool_clamped(b, k)
    if k.attrs.get("out_pairs"):
        raise BackendError("a max pool over plane pairs needs windows that overlap the image (bf16.passes_pairs)")

    def plane(b, k2, nc):
        X, O = k2.ins[0], k2.out
        xplane = b.mul(nc, i64(h * w))
        with for_range(b, oh, name="y") as y:
            with for_range(b, ow, name="x") as x:
                isf = dt in ("f32", "f16", "f64")
                low = fconst(dt, -np.inf) if isf else int_reduce_init(dt, "max")
                cmp = b.icmp_unsigned if dt in ("bool", "u8") else b.icmp_signed
                best = low
                # The window is small: unroll it with compile-time taps and runtime bounds checks.
                for i in range(kh):
                    iy = b.add(b.mul(y, i64(sh)), i64(i * dh - pt))
                    oky = b.and_(b.icmp_signed(">=", iy, i64(0)), b.icmp_signed("<", iy, i64(h)))
                    for j in range(kw):
                        ix = b.add(b.mul(x, i64(sw)), i64(j * dw - pl))
                        ok = b.and_(oky, b.and_(b.icmp_signed(">=", ix, i64(0)), b.icmp_signed("<", ix, i64(w))))
                        safe = b.select(ok, b.add(xplane, b.add(b.mul(iy, i64(w)), ix)), xplane)
                        v = load(b, X, safe, dt)
                        v = b.select(ok, v, low)
                        best = b.select(b.fcmp_unordered(">", v, best) if isf else cmp(">", v, best), v, best)
                store(b, best, O, b.add(b.mul(nc, i64(oh * ow)), b.add(b.mul(y, i64(ow)), x)), dt)
    rows_parallel(b, k, n * c, oh * ow * kh * kw, plane)


def _max_pool_clamped(b, k: KernelArgs):
    """Float max pooling of dilation 1 whose windows all overlap the image (pads smaller
    than the kernel): a tap outside the image is moved to the nearest row / column
    inside, which is in the same window, and max ignores repeats, so there are no masks.
    Per output row the kh row offsets are clamped once; the columns whose taps are all
    inside (the interior) load without clamping.
    `out_pairs` (bf16.passes_pairs): input and result are plane pairs of bf16 codes
    (the types: half the planes of 32-bit elements); each element's two codes are
    widened to f32, maxed apart and joined again (exact: they are bf16 values)."""
    n, c, h, w = k.in_types[0].shape
    _, _, oh, ow = k.out_type.shape
    (kh, kw), (sh, sw), (pt, pl, _, _) = k.attrs["kernel"], k.attrs["stride"], k.attrs["pads"]
    dt = k.out_type.dtype
    x_lo, x_hi = inside_range(w, ow, kw, sw, pl)
    pairs = bool(k.attrs.get("out_pairs"))
    if pairs and dt != "f32":
        raise BackendError("a max pool over plane pairs needs f32 types")

    def plane(b, k2, nc):
        X, O = k2.ins[0], k2.out
        xplane = b.mul(nc, i64(h * w))
        with for_range(b, oh, name="y") as y:
            rows = [b.add(xplane, b.mul(imin(b, imax(b, b.add(b.mul(y, i64(sh)), i64(i - pt)), i64(0)),
                                              i64(h - 1)), i64(w))) for i in range(kh)]
            orow = b.add(b.mul(nc, i64(oh * ow)), b.mul(y, i64(ow)))

            def columns(x0, x1, clamp):
                if x1 <= x0:
                    return
                with for_range(b, i64(x1), start=i64(x0), name="px") as x:
                    best = None
                    for j in range(kw):
                        ix = b.add(b.mul(x, i64(sw)), i64(j - pl))
                        if clamp:
                            ix = imin(b, imax(b, ix, i64(0)), i64(w - 1))
                        for r in rows:
                            v = load(b, X, b.add(r, ix), dt)
                            v = (pair_half(b, v, 0), pair_half(b, v, 1)) if pairs else (v,)
                            best = v if best is None else tuple(fmax(b, m, u) for m, u in zip(best, v))
                    store(b, pair_join(b, *best) if pairs else best[0], O, b.add(orow, x), dt)
            columns(0, x_lo, True)
            columns(x_lo, x_hi, False)
            columns(x_hi, ow, True)
    rows_parallel(b, k, n * c, oh * ow * kh * kw, plane)


def window_table(b, name, entries):
    """A private constant i64 table, returned as a pointer."""
    arr_t = ir.ArrayType(I64, len(entries))
    gv = ir.GlobalVariable(b.module, arr_t, name=b.module.get_unique_name(name))
    gv.linkage = "private"
    gv.global_constant = True
    gv.initializer = ir.Constant(arr_t, [int(e) for e in entries])
    return b.bitcast(gv, I64.as_pointer())


def pool_sum(b, X, xplane, w, h0, h1, w0, w1, dt):
    acc = alloca_in_entry(b, F32)
    b.store(fconst("f32", 0.0), acc)
    with for_range(b, h1, start=h0, name="wy") as iy:
        rbase = b.add(xplane, b.mul(iy, i64(w)))
        with for_range(b, w1, start=w0, name="wx") as ix:
            v = load(b, X, b.add(rbase, ix), dt)
            b.store(b.fadd(b.load(acc), v, flags=REDUCE), acc)
    return b.load(acc)


def emit_window_pool(b, k: KernelArgs, rows, cols, divisors):
    """Average over per-output windows given by static tables (start, end) and divisors."""
    n, c, h, w = k.in_types[0].shape
    _, _, oh, ow = k.out_type.shape
    X, O, dt = k.ins[0], k.out, k.out_type.dtype
    rt = window_table(b, "rows", [v for r in rows for v in r[:2]])
    ct = window_table(b, "cols", [v for r in cols for v in r[:2]])
    divt = b.bitcast(float_table(b, "div", divisors), F32.as_pointer())
    with for_range(b, n * c, name="nc") as nc:
        xplane = b.mul(nc, i64(h * w))
        with for_range(b, oh, name="y") as y:
            h0 = b.load(b.gep(rt, [b.mul(y, i64(2))]))
            h1 = b.load(b.gep(rt, [b.add(b.mul(y, i64(2)), i64(1))]))
            with for_range(b, ow, name="x") as x:
                w0 = b.load(b.gep(ct, [b.mul(x, i64(2))]))
                w1 = b.load(b.gep(ct, [b.add(b.mul(x, i64(2)), i64(1))]))
                s = pool_sum(b, X, xplane, w, h0, h1, w0, w1, dt)
                d = b.load(b.gep(divt, [b.add(b.mul(y, i64(ow)), x)]))
                store(b, b.fdiv(s, d), O, b.add(b.mul(nc, i64(oh * ow)), b.add(b.mul(y, i64(ow)), x)), dt)


def float_table(b, name, entries):
    arr_t = ir.ArrayType(F32, len(entries))
    gv = ir.GlobalVariable(b.module, arr_t, name=b.module.get_unique_name(name))
    gv.linkage = "private"
    gv.global_constant = True
    gv.initializer = ir.Constant(arr_t, [float(np.float32(e)) for e in entries])
    return gv


def k_avg_pool2d(b, k: KernelArgs):
    _, _, h, w = k.in_types[0].shape
    _, _, oh, ow = k.out_type.shape
    (kh, kw), (sh, sw), (pt, pl, pb, pr) = k.attrs["kernel"], k.attrs["stride"], k.attrs["pads"]
    inc, div = k.attrs.get("count_include_pad", True), k.attrs.get("divisor", 0)
    rows = AvgPool2d.windows(h, oh, kh, sh, pt, pb, inc)
    cols = AvgPool2d.windows(w, ow, kw, sw, pl, pr, inc)
    divisors = [div or r[2] * c_[2] for r in rows for c_ in cols]
    emit_window_pool(b, k, rows, cols, divisors)


def global_avg_pool(b, k: KernelArgs):
    """out[plane] = sum(plane) / (h * w) for every contiguous f32 input plane: vw lanes
    of partial sums (row_reduce_vec), the planes split across the threads."""
    _, _, h, w = k.in_types[0].shape
    n = h * w

    def plane(b, k2, r):
        s = row_reduce_vec(b, k2.ins[0], b.mul(r, i64(n)), n, k2.vw, 0.0,
                            lambda bb, a, v: bb.fadd(a, v, flags=REDUCE))
        b.store(b.fdiv(s, fconst("f32", float(n))), b.gep(k2.out, [r], inbounds=True))
    rows_parallel(b, k, k.out_type.numel, n, plane)


def k_adaptive_avg_pool2d(b, k: KernelArgs):
    _, _, h, w = k.in_types[0].shape
    _, _, oh, ow = k.out_type.shape
    if (oh, ow) == (1, 1) and k.out_type.dtype == "f32" and isinstance(k.out_type.numel, int) and h * w >= k.vw:
        return global_avg_pool(b, k)
    rows, cols = adaptive_ranges(h, oh), adaptive_ranges(w, ow)
    divisors = [(r[1] - r[0]) * (c_[1] - c_[0]) for r in rows for c_ in cols]
    emit_window_pool(b, k, rows, cols, divisors)
