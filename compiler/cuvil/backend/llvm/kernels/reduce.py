"""Reductions (sum, mean, max, min, prod) over any set of axes; argmax / argmin and running
sums / products (cumsum, cumprod) along one."""
from __future__ import annotations

from math import prod

from llvmlite import ir
import numpy as np

from ..emit import REDUCE, REG_TYPES, View, contiguous_strides, fconst, fsize, i64, load, loop_nest, store
from ..kernel_args import KernelArgs
from ..loops import alloca_in_entry, for_range


def int_reduce_init(dt: str, kind: str) -> ir.Constant:
    """The identity of an integer sum/max/min in the dtype's own range."""
    ty = REG_TYPES[dt]
    if kind in ("sum", "mean", "prod"):
        return ir.Constant(ty, 1 if kind == "prod" else 0)
    unsigned = dt in ("bool", "u8")
    lo, hi = (0, (1 << ty.width) - 1) if unsigned else (-(1 << (ty.width - 1)), (1 << (ty.width - 1)) - 1)
    return ir.Constant(ty, lo if kind == "max" else hi)


def reduce_kernel(kind):
    def emit(b, k: KernelArgs):
        xt = k.in_types[0]
        axes = k.attrs["axes"]
        dt = xt.dtype
        kept = [i for i in range(xt.rank) if i not in axes]
        xs = contiguous_strides(xt.shape)
        count = prod(xt.shape[a] for a in axes)
        isf = dt in ("f32", "f16", "f64")
        init = {"sum": 0.0, "mean": 0.0, "prod": 1.0, "max": -np.inf, "min": np.inf}[kind]
        init_v = fconst(dt, init) if isf else int_reduce_init(dt, kind)
        X, O = k.ins[0], k.out
        kept_shape = [xt.shape[i] for i in kept]
        out_views = [View(O, dt, contiguous_strides(kept_shape)), View(X, dt, [xs[i] for i in kept])]

        def outer(b, idx):
            acc = alloca_in_entry(b, init_v.type)
            b.store(init_v, acc)

            def inner(b, iidx):
                v = load(b, X, b.add(idx[1], iidx[0]), dt)
                a = b.load(acc)
                if kind in ("sum", "mean"):
                    r = b.fadd(a, v, flags=REDUCE) if isf else b.add(a, v)
                elif kind == "prod":
                    r = b.fmul(a, v, flags=REDUCE) if isf else b.mul(a, v)
                elif isf:  # a NaN, once met, stays (vectors.fmax would let a later number replace it)
                    r = b.select(b.or_(b.fcmp_ordered(">" if kind == "max" else "<", v, a),
                                       b.fcmp_unordered("uno", v, v)), v, a)
                else:
                    cmp = b.icmp_unsigned if dt in ("bool", "u8") else b.icmp_signed
                    r = b.select(cmp(">" if kind == "max" else "<", v, a), v, a)
                b.store(r, acc)
            loop_nest(b, [xt.shape[a] for a in axes] or [1], [View(X, dt, [xs[a] for a in axes] or [0])], inner)
            res = b.load(acc)
            if kind == "mean":
                res = b.fdiv(res, fsize(b, dt, count)) if isf else b.sdiv(res, b.trunc(i64(count), res.type)
                                                                          if res.type.width < 64 else i64(count))
            store(b, res, O, idx[0], dt)
        loop_nest(b, kept_shape or [1], out_views if kept_shape else
                  [View(O, dt, [0]), View(X, dt, [0])], outer)
    return emit


def arg_reduce_kernel(kind: str):
    """argmax / argmin along one axis: a scalar walk per output element that keeps the
    first best index; a NaN beats every number and the first NaN is kept."""
    def emit(b, k: KernelArgs):
        xt = k.in_types[0]
        dt = xt.dtype
        if xt.rank == 0:
            store(b, i64(0), k.out, i64(0), "i64")
            return
        axis = k.attrs["axis"]
        outer, n, inner = prod(xt.shape[:axis]), xt.shape[axis], prod(xt.shape[axis + 1:])
        X = k.ins[0]
        isf = dt in ("f32", "f16", "f64")
        with for_range(b, i64(outer * inner), name="r") as r:
            base = b.add(b.mul(b.sdiv(r, i64(inner)), b.mul(i64(n), i64(inner))), b.srem(r, i64(inner)))
            best = alloca_in_entry(b, REG_TYPES[dt])
            where = alloca_in_entry(b, REG_TYPES["i64"])
            b.store(load(b, X, base, dt), best)
            b.store(i64(0), where)
            with for_range(b, i64(n), start=1, name="j") as j:
                v = load(b, X, b.add(base, b.mul(j, i64(inner))), dt)
                a = b.load(best)
                if isf:
                    op = ">" if kind == "max" else "<"
                    better = b.or_(b.fcmp_ordered(op, v, a),
                                   b.and_(b.fcmp_unordered("uno", v, v), b.fcmp_ordered("ord", a, a)))
                else:
                    cmp = b.icmp_unsigned if dt in ("bool", "u8") else b.icmp_signed
                    better = cmp(">" if kind == "max" else "<", v, a)
                b.store(b.select(better, v, a), best)
                b.store(b.select(better, j, b.load(where)), where)
            store(b, b.load(where), k.out, r, "i64")
    return emit


def scan_kernel(kind: str):
    """cumsum / cumprod along one axis: a scalar walk per (outer, inner) position, in
    order, like torch's loop."""
    def emit(b, k: KernelArgs):
        xt = k.in_types[0]
        dt = xt.dtype
        X = k.ins[0]
        if xt.rank == 0:
            store(b, load(b, X, i64(0), dt), k.out, i64(0), dt)
            return
        axis = k.attrs["axis"]
        outer, n, inner = prod(xt.shape[:axis]), xt.shape[axis], prod(xt.shape[axis + 1:])
        isf = dt in ("f32", "f16", "f64")
        init = fconst(dt, 0.0 if kind == "sum" else 1.0) if isf else int_reduce_init(dt, kind)
        with for_range(b, i64(outer * inner), name="r") as r:
            base = b.add(b.mul(b.sdiv(r, i64(inner)), b.mul(i64(n), i64(inner))), b.srem(r, i64(inner)))
            acc = alloca_in_entry(b, REG_TYPES[dt])
            b.store(init, acc)
            with for_range(b, i64(n), name="j") as j:
                at = b.add(base, b.mul(j, i64(inner)))
                v, a = load(b, X, at, dt), b.load(acc)
                if kind == "sum":
                    s = b.fadd(a, v) if isf else b.add(a, v)
                else:
                    s = b.fmul(a, v) if isf else b.mul(a, v)
                b.store(s, acc)
                store(b, s, k.out, at, dt)
    return emit
