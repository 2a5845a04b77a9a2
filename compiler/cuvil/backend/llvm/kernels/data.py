"""Data movement: copies (reshape), transposes (by rows or vector blocks), broadcast,
slice, concat, pad, gather, resize and cuvil.dim.
"""
from __future__ import annotations

from math import prod

from llvmlite import ir

from ....errors import BackendError
from ....ir.ops.nn import Resize
from ..emit import (F32, I64, REG_TYPES, View, broadcast_strides, contiguous_strides, fconst, i64, load,
                    loop_nest, store)
from ..kernel_args import KernelArgs
from ..loops import for_range
from ..parallel import flat_offsets, outer_split, parallel, parallel_ranges
from ..symbolic import lower, upper
from ..vectors import vector_transpose
from .pooling import float_table, window_table


def copy_strided(b, out, out_dt, shape, out_strides, out_off, src, src_strides, src_off):
    views = [View(out, out_dt, out_strides, out_off), View(src, out_dt, src_strides, src_off)]
    loop_nest(b, shape, views, lambda bb, idx: store(bb, load(bb, src, idx[1], out_dt), out, idx[0], out_dt))


def k_copy(b, k: KernelArgs):  # reshape (when not aliased) and identity copies
    n = k.out_type.numel
    copy_strided(b, k.out, k.out_type.dtype, [n], [1], 0, k.ins[0], [1], 0)


def _transpose_rows(b, k: KernelArgs, shape, strides):
    """A transpose that keeps the last dim: rows of shape[-1] contiguous values on both
    sides, copied a vector at a time (loads and stores of whole vectors, a scalar tail)."""
    n, vw = shape[-1], k.vw
    vty = ir.VectorType(F32, vw)

    def body(b, k2, rng):
        with for_range(b, rng[1], start=rng[0], name="tr") as r:
            oo, io = flat_offsets(b, r, shape[:-1], [st[:-1] for st in strides])

            def vec(c):
                src = b.bitcast(b.gep(k2.ins[0], [b.add(io, c)], inbounds=True), vty.as_pointer())
                b.store(b.load(src, align=4), b.bitcast(b.gep(k2.out, [b.add(oo, c)], inbounds=True),
                                                        vty.as_pointer()), align=4)
            if n // vw <= 8:
                for c in range(0, n - n % vw, vw):
                    vec(i64(c))
            else:
                with for_range(b, n // vw, name="tc") as c:
                    vec(b.mul(c, i64(vw)))
            for c in range(n - n % vw, n):
                store(b, load(b, k2.ins[0], b.add(io, i64(c)), "f32"), k2.out, b.add(oo, i64(c)), "f32")
    parallel_ranges(b, k, prod(shape[:-1]), prod(shape), body)


def _transpose_blocks(b, k: KernelArgs, shape, strides):
    """A transpose whose input's last dim becomes the output's next-to-last (and the
    output's last one is strided in the input), both multiples of vw: vw x vw blocks,
    vw vectors loaded along the input's rows, transposed in registers, stored along the
    output's."""
    vw = k.vw
    vty = ir.VectorType(F32, vw)
    rows, cols = shape[-2] // vw, shape[-1] // vw
    outer = shape[:-2]
    in_col = strides[1][-1]  # input stride of the output's last dim

    def body(b, k2, rng):
        with for_range(b, rng[1], start=rng[0], name="tb") as t:
            blk, o = b.srem(t, i64(rows * cols)), b.sdiv(t, i64(rows * cols))
            oo, io = flat_offsets(b, o, outer, [st[:-2] for st in strides]) if outer else (i64(0), i64(0))
            i0, j0 = b.mul(b.sdiv(blk, i64(cols)), i64(vw)), b.mul(b.srem(blk, i64(cols)), i64(vw))
            src0 = b.add(b.add(io, i0), b.mul(j0, i64(in_col)))
            got = [b.load(b.bitcast(b.gep(k2.ins[0], [b.add(src0, i64(jj * in_col))], inbounds=True),
                                    vty.as_pointer()), align=4) for jj in range(vw)]
            dst0 = b.add(b.add(oo, b.mul(i0, i64(shape[-1]))), j0)
            for ii, v in enumerate(vector_transpose(b, got)):
                b.store(v, b.bitcast(b.gep(k2.out, [b.add(dst0, i64(ii * shape[-1]))], inbounds=True),
                                     vty.as_pointer()), align=4)
    parallel_ranges(b, k, prod(outer) * rows * cols, prod(shape), body)


def k_transpose(b, k: KernelArgs):
    xt = k.in_types[0]
    xs = contiguous_strides(xt.shape)
    perm = k.attrs["perm"]
    shape = list(k.out_type.shape)
    strides = [contiguous_strides(shape), [xs[p] for p in perm]]
    if xt.dtype == "f32" and k.vw > 1 and len(shape) >= 2 and all(isinstance(d, int) for d in shape):
        if perm[-1] == len(shape) - 1 and shape[-1] >= k.vw:
            return _transpose_rows(b, k, shape, strides)
        if perm[-2] == len(shape) - 1 and shape[-1] % k.vw == 0 and shape[-2] % k.vw == 0:
            return _transpose_blocks(b, k, shape, strides)
    split = outer_split(shape)
    if not split:
        copy_strided(b, k.out, xt.dtype, shape, strides[0], 0, k.ins[0], strides[1], 0)
        return

    def body(b, k2, i, _):  # the outer dims across the threads, the inner ones copied
        oo, io = flat_offsets(b, i, shape[:split], [st[:split] for st in strides])
        copy_strided(b, k2.out, xt.dtype, shape[split:], strides[0][split:], oo, k2.ins[0], strides[1][split:], io)
    parallel(b, k, prod(shape[:split]), body)


def k_broadcast_to(b, k: KernelArgs):
    shape = k.out_type.shape
    copy_strided(b, k.out, k.out_type.dtype, shape, contiguous_strides(shape), 0, k.ins[0],
          broadcast_strides(k.in_types[0].shape, shape), 0)


def k_slice(b, k: KernelArgs):
    xt = k.in_types[0]
    for d, (e, n) in enumerate(zip(k.attrs["ends"], xt.shape)):
        end = k.out_type.shape[d] + k.attrs["starts"][d]
        if end == n:
            continue
        if upper(end) > lower(n):  # must hold for every size within the bounds
            raise BackendError(f"cuvil.slice: the end {e} of dim {d} can exceed its size {n} within the "
                               f"symbols' bounds (up to {upper(end)}); change the bounds")
    xs = contiguous_strides(xt.shape)
    off = sum(s * st for s, st in zip(k.attrs["starts"], xs))
    copy_strided(b, k.out, xt.dtype, k.out_type.shape, contiguous_strides(k.out_type.shape), 0, k.ins[0],
          [st * step for st, step in zip(xs, k.attrs["steps"])], off)


def k_concat(b, k: KernelArgs):
    ax = k.attrs["axis"]
    ot = k.out_type
    os_ = contiguous_strides(ot.shape)
    start = 0
    for p, t in zip(k.ins, k.in_types):
        copy_strided(b, k.out, ot.dtype, t.shape, os_, start * os_[ax], p, contiguous_strides(t.shape), 0)
        start += t.shape[ax]


def k_pad(b, k: KernelArgs):
    ot, xt = k.out_type, k.in_types[0]
    dt = ot.dtype
    val = fconst(dt, k.attrs["value"]) if dt in ("f32", "f16", "f64") else ir.Constant(REG_TYPES[dt], int(k.attrs["value"]))
    with for_range(b, ot.numel, name="f") as i:
        store(b, val, k.out, i, dt)
    os_ = contiguous_strides(ot.shape)
    off = sum(lo * s for (lo, _), s in zip(k.attrs["pads"], os_))
    copy_strided(b, k.out, dt, xt.shape, os_, off, k.ins[0], contiguous_strides(xt.shape), 0)


def k_gather(b, k: KernelArgs):
    """Out-of-range indices (after adding the dim for negatives) produce zeros, never a
    read outside the table."""
    xt, it = k.in_types
    ax = k.attrs["axis"]
    pre, n, post = prod(xt.shape[:ax]), xt.shape[ax], prod(xt.shape[ax + 1:])
    m = it.numel
    X, IDX, O, dt = k.ins[0], k.ins[1], k.out, xt.dtype
    zero = fconst(dt, 0.0) if dt in ("f32", "f16", "f64") else ir.Constant(REG_TYPES[dt], 0)
    with for_range(b, pre, name="p") as p:
        with for_range(b, m, name="j") as j:
            raw = load(b, IDX, j, it.dtype)
            idx = b.sext(raw, I64) if raw.type.width < 64 else raw
            idx = b.select(b.icmp_signed("<", idx, i64(0)), b.add(idx, i64(n)), idx)
            ok = b.and_(b.icmp_signed(">=", idx, i64(0)), b.icmp_signed("<", idx, i64(n)))
            safe = b.select(ok, idx, i64(0))
            src = b.mul(b.add(b.mul(p, i64(n)), safe), i64(post))
            dst = b.mul(b.add(b.mul(p, i64(m)), j), i64(post))
            with for_range(b, post, name="q") as q:
                v = b.select(ok, load(b, X, b.add(src, q), dt), zero)
                store(b, v, O, b.add(dst, q), dt)


def k_resize(b, k: KernelArgs):
    n, c, h, w = k.in_types[0].shape
    _, _, oh, ow = k.out_type.shape
    mode, align = k.attrs["mode"], k.attrs.get("align_corners", False)
    rh, rw = k.attrs["ratio"]
    th, tw = Resize.taps(h, oh, rh, mode, align), Resize.taps(w, ow, rw, mode, align)
    hi = window_table(b, "ry", [v for t in th for v in t[:2]])
    wi = window_table(b, "rx", [v for t in tw for v in t[:2]])
    hf = b.bitcast(float_table(b, "fy", [t[2] for t in th]), F32.as_pointer())
    wf = b.bitcast(float_table(b, "fx", [t[2] for t in tw]), F32.as_pointer())
    X, O, dt = k.ins[0], k.out, k.out_type.dtype
    one = fconst(dt, 1.0)
    with for_range(b, n * c, name="nc") as nc:
        xplane = b.mul(nc, i64(h * w))
        with for_range(b, oh, name="y") as y:
            y0 = b.load(b.gep(hi, [b.mul(y, i64(2))]))
            y1 = b.load(b.gep(hi, [b.add(b.mul(y, i64(2)), i64(1))]))
            fy = b.load(b.gep(hf, [y]))
            r0, r1 = b.add(xplane, b.mul(y0, i64(w))), b.add(xplane, b.mul(y1, i64(w)))
            with for_range(b, ow, name="x") as x:
                x0 = b.load(b.gep(wi, [b.mul(x, i64(2))]))
                x1 = b.load(b.gep(wi, [b.add(b.mul(x, i64(2)), i64(1))]))
                fx = b.load(b.gep(wf, [x]))
                if mode == "nearest":
                    v = load(b, X, b.add(r0, x0), dt)
                else:
                    def lerp(a, c_, f):
                        return b.fadd(b.fmul(a, b.fsub(one, f)), b.fmul(c_, f))
                    top = lerp(load(b, X, b.add(r0, x0), dt), load(b, X, b.add(r0, x1), dt), fx)
                    bot = lerp(load(b, X, b.add(r1, x0), dt), load(b, X, b.add(r1, x1), dt), fx)
                    v = lerp(top, bot, fy)
                store(b, v, O, b.add(b.mul(nc, i64(oh * ow)), b.add(b.mul(y, i64(ow)), x)), dt)


def k_dim(b, k: KernelArgs):
    """cuvil.dim: a dim's runtime value."""
    store(b, i64(k.attrs["dims"][0]), k.out, i64(0), "i64")
