"""Row-wise kernels: softmax and log-softmax (a row in registers where it fits), layer
norm, batch norm, and the row reductions they share.
"""
from __future__ import annotations

from math import prod

from llvmlite import ir
import numpy as np

from ..emit import F32, REDUCE, fconst, fsize, i64, intrinsic, load, store
from ..gemm import splat
from ..kernel_args import KernelArgs
from ..loops import alloca_in_entry, for_range
from ..mathlib import get_math
from ..parallel import rows_parallel
from ..vectors import fmax, lanes_fold, tree_fold


def row_split(shape, axis):
    return prod(shape[:axis]), shape[axis], prod(shape[axis + 1:])


def reduce_loop(b, count, init, step_fn, name):
    acc = alloca_in_entry(b, init.type)
    b.store(init, acc)
    with for_range(b, count, name=name) as j:
        b.store(step_fn(b, b.load(acc), j), acc)
    return b.load(acc)


def row_reduce_vec(b, X, base, n: int, vw: int, identity: float, op):
    """op-fold of the f32 row X[base : base + n] (n >= vw): vw lanes of running values
    (a scalar chain does not vectorise: it is one long dependency), folded together at
    the end (halving the lanes: log2(vw) steps, not a vw - 1 long chain), then the
    n % vw tail. op(b, acc, v) works on scalars and vectors."""
    vty = ir.VectorType(F32, vw)
    acc = alloca_in_entry(b, vty)
    b.store(ir.Constant(vty, [identity] * vw), acc)
    with for_range(b, n // vw, name="mv") as c:
        v = b.load(b.bitcast(b.gep(X, [b.add(base, b.mul(c, i64(vw)))], inbounds=True), vty.as_pointer()), align=4)
        b.store(op(b, b.load(acc), v), acc)
    m = lanes_fold(b, b.load(acc), op)
    for j in range(n // vw * vw, n):
        m = op(b, m, load(b, X, b.add(base, i64(j)), "f32"))
    return m


def row_max_vec(b, X, base, n: int, vw: int):
    """max of the f32 row X[base : base + n] (n >= vw), NaN propagating (fmax)."""
    return row_reduce_vec(b, X, base, n, vw, float("-inf"), fmax)

# Softmax rows of at most this many vectors are held in registers (one load, one store
# per element), SOFTMAX_ROWS rows at a time: their reductions (a max and a sum, each a
# tree over the vectors, then over the lanes) are short dependency chains that the
# rows' independent work overlaps.
SOFTMAX_VECTORS = 16

SOFTMAX_ROWS = 2


def softmax_in_registers(n, vw: int) -> bool:
    """Whether softmax rows of n f32 stay in registers (softmax_rows_in_registers)."""
    return isinstance(n, int) and vw > 1 and n % vw == 0 and 0 < n // vw <= SOFTMAX_VECTORS


def softmax_rows_in_registers(b, X, O, vw: int, r0, count: int, n: int):
    """Rows r0 .. r0 + count (i64, each n contiguous f32 of X, n a multiple of vw and at
    most SOFTMAX_VECTORS vectors) of a softmax into the same rows of O (may be X):
    loaded once, max, exp of the differences, sum, scaled by its reciprocal, stored
    once; the rows' steps interleaved."""
    vty = ir.VectorType(F32, vw)
    exp = get_math(b.module, "exp", vw)

    def ptr(T, r, c):
        return b.bitcast(b.gep(T, [b.add(b.mul(b.add(r0, i64(r)), i64(n)), i64(c * vw))], inbounds=True),
                         vty.as_pointer())

    def add(bb, x, y):
        return bb.fadd(x, y)
    xs = [[b.load(ptr(X, r, c), align=4) for c in range(n // vw)] for r in range(count)]
    mx = [splat(b, lanes_fold(b, tree_fold(b, row, fmax), fmax), vty) for row in xs]
    es = [[b.call(exp, [b.fsub(x, m)]) for x in row] for row, m in zip(xs, mx)]
    sums = [lanes_fold(b, tree_fold(b, row, add), add) for row in es]
    for r, (row, s) in enumerate(zip(es, sums)):
        inv = splat(b, b.fdiv(fconst("f32", 1.0), s), vty)
        for c, e in enumerate(row):
            b.store(b.fmul(e, inv), ptr(O, r, c), align=4)


def k_softmax(b, k: KernelArgs):
    outer, n, inner = row_split(k.out_type.shape, k.attrs["axis"])
    dt = k.out_type.dtype
    log = k.attrs.get("_log", False)
    if inner == 1 and dt == "f32" and not log and isinstance(outer, int) and softmax_in_registers(n, k.vw):
        groups, ragged = outer // SOFTMAX_ROWS, outer % SOFTMAX_ROWS

        def rows(b, k2, g):
            def run(r0, count):
                softmax_rows_in_registers(b, k2.ins[0], k2.out, k2.vw, r0, count, n)
            if not ragged:
                run(b.mul(g, i64(SOFTMAX_ROWS)), SOFTMAX_ROWS)
                return
            with b.if_else(b.icmp_signed("<", g, i64(groups))) as (whole, rest):
                with whole:
                    run(b.mul(g, i64(SOFTMAX_ROWS)), SOFTMAX_ROWS)
                with rest:
                    run(i64(groups * SOFTMAX_ROWS), ragged)
        rows_parallel(b, k, groups + (1 if ragged else 0), n * SOFTMAX_ROWS, rows)
        return
    rows_parallel(b, k, outer * inner, n, lambda b, k2, r: softmax_row(b, k2.ins[0], k2.out, k2.vw, r, n, inner,
                                                                           dt, log))


def softmax_row(b, X, O, vw: int, r, n, inner, dt, log: bool):
    """Softmax (or log-softmax) row r (i64) of X into O: n values `inner` apart."""
    exp = lambda v: b.call(get_math(b.module, "exp"), [v])  # noqa: E731
    base = b.add(b.mul(b.sdiv(r, i64(inner)), i64(n * inner)), b.srem(r, i64(inner)))
    at = lambda j: b.add(base, b.mul(j, i64(inner)))  # noqa: E731
    if inner == 1 and dt == "f32" and isinstance(n, int) and n >= 2 * vw:
        mx = row_max_vec(b, X, base, n, vw)
    else:
        mx = reduce_loop(b, n, fconst(dt, -np.inf), lambda bb, a, j: fmax(
            bb, a, load(bb, X, at(j), dt)), "m")
    if log:
        s = reduce_loop(b, n, fconst(dt, 0.0), lambda bb, a, j: bb.fadd(
            a, exp(bb.fsub(load(bb, X, at(j), dt), mx)), flags=REDUCE), "s")
        lse = b.fadd(mx, b.call(get_math(b.module, "log"), [s]))
        with for_range(b, n, name="w") as j:
            store(b, b.fsub(load(b, X, at(j), dt), lse), O, at(j), dt)
    else:
        # exp into O, then the sum of O: two plain loops (faster than one loop that
        # exps, stores and sums)
        with for_range(b, n, name="e") as j:
            store(b, exp(b.fsub(load(b, X, at(j), dt), mx)), O, at(j), dt)
        s = reduce_loop(b, n, fconst(dt, 0.0), lambda bb, a, j: bb.fadd(a, load(bb, O, at(j), dt),
                                                                          flags=REDUCE), "s")
        inv = b.fdiv(fconst(dt, 1.0), s)
        with for_range(b, n, name="w") as j:
            store(b, b.fmul(load(b, O, at(j), dt), inv), O, at(j), dt)


def k_log_softmax(b, k: KernelArgs):
    k.attrs = {**k.attrs, "_log": True}
    k_softmax(b, k)


def k_layer_norm(b, k: KernelArgs):
    shape = k.out_type.shape
    d = prod(shape[len(shape) - k.attrs["num_axes"]:])
    rows = 0 if isinstance(d, int) and d == 0 else prod(shape) // d
    dt = k.out_type.dtype
    has_w, has_b = len(k.ins) > 1, len(k.ins) > 2

    def row(b, k2, r):
        X, O = k2.ins[0], k2.out
        Wt = k2.ins[1] if has_w else None
        Bt = k2.ins[2] if has_b else None
        base = b.mul(r, i64(d))
        s = reduce_loop(b, d, fconst(dt, 0.0), lambda bb, a, j: bb.fadd(a, load(bb, X, bb.add(base, j), dt),
                                                                          flags=REDUCE), "s")
        mean = b.fdiv(s, fsize(b, dt, d))

        def sq(bb, a, j):
            t = bb.fsub(load(bb, X, bb.add(base, j), dt), mean)
            return bb.fadd(a, bb.fmul(t, t), flags=REDUCE)
        var = b.fdiv(reduce_loop(b, d, fconst(dt, 0.0), sq, "v"), fsize(b, dt, d))
        rstd = b.fdiv(fconst(dt, 1.0), intrinsic(b, "llvm.sqrt", [b.fadd(var, fconst(dt, k.attrs["eps"]))]))
        with for_range(b, d, name="w") as j:
            y = b.fmul(b.fsub(load(b, X, b.add(base, j), dt), mean), rstd)
            if Wt is not None:
                y = b.fmul(y, load(b, Wt, j, dt), flags=("contract",))
            if Bt is not None:
                y = b.fadd(y, load(b, Bt, j, dt), flags=("contract",))
            store(b, y, O, b.add(base, j), dt)
    rows_parallel(b, k, rows, d, row)


def k_batch_norm(b, k: KernelArgs):
    shape = k.out_type.shape
    c, inner = shape[1], prod(shape[2:])
    X, MEAN, VAR, W, B = k.ins
    O, dt = k.out, k.out_type.dtype
    with for_range(b, shape[0] * c, name="nc") as nc:
        ch = b.srem(nc, i64(c))
        rstd = b.fdiv(fconst(dt, 1.0), intrinsic(b, "llvm.sqrt", [b.fadd(load(b, VAR, ch, dt), fconst(dt, k.attrs["eps"]))]))
        scale = b.fmul(rstd, load(b, W, ch, dt))
        shift = b.fsub(load(b, B, ch, dt), b.fmul(load(b, MEAN, ch, dt), scale))
        with for_range(b, inner, name="p") as p:
            idx = b.add(b.mul(nc, i64(inner)), p)
            store(b, b.fadd(b.fmul(load(b, X, idx, dt), scale), shift, flags=("contract",)), O, idx, dt)
