"""Kernels of ops with a data-dependent size (ir/ops/dynamic.py): each stores the size
it found into the run's `dims` (the produced symbol's slot), which every later kernel
reads when it starts."""
from __future__ import annotations

from math import prod

from llvmlite import ir

from ..emit import I64, i64, load, store
from ..kernel_args import KernelArgs
from ..loops import alloca_in_entry, for_range


def store_size(b, k: KernelArgs, value: ir.Value) -> None:
    """Set the op's produced dim to `value` for the rest of the run."""
    slot = b.gep(k.dims, [i64(k.symbols[k.attrs["size"]])], inbounds=True)
    b.store(value, slot)


def k_nonzero(b, k: KernelArgs):
    """One pass in row-major order: each true element appends its coordinates."""
    xt = k.in_types[0]
    shape = [int(d) for d in xt.shape]
    rank = len(shape)
    count = alloca_in_entry(b, I64)
    b.store(i64(0), count)
    with for_range(b, prod(shape) if rank else 1, name="e") as e:
        with b.if_then(load(b, k.ins[0], e, "bool")):
            c = b.load(count)
            rem = e
            for d in reversed(range(rank)):
                store(b, b.urem(rem, i64(shape[d])) if d else rem, k.out,
                      b.add(b.mul(c, i64(rank)), i64(d)), "i64")
                rem = b.udiv(rem, i64(shape[d]))
            b.store(b.add(c, i64(1)), count)
    store_size(b, k, b.load(count))


def _less(b, a, v, dt: str):
    """a < v in dt's order (floats: ordered, so a NaN is never less)."""
    if dt in ("f32", "f16", "f64"):
        return b.fcmp_ordered("<", a, v)
    return (b.icmp_unsigned if dt in ("bool", "u8") else b.icmp_signed)("<", a, v)


def _equal(b, a, v, dt: str):
    if dt in ("f32", "f16", "f64"):
        return b.fcmp_ordered("==", a, v)
    return b.icmp_unsigned("==", a, v)


def lower_bound(b, ptr, n, v, dt: str):
    """The first index j in [0, n) with not ptr[j] < v (n if none): a binary search of the
    ascending ptr[0:n]."""
    lo, hi = alloca_in_entry(b, I64), alloca_in_entry(b, I64)
    b.store(i64(0), lo)
    b.store(n, hi)
    head = b.append_basic_block("lb.head")
    body = b.append_basic_block("lb.body")
    done = b.append_basic_block("lb.done")
    b.branch(head)
    b.position_at_end(head)
    b.cbranch(b.icmp_signed("<", b.load(lo), b.load(hi)), body, done)
    b.position_at_end(body)
    mid = b.lshr(b.add(b.load(lo), b.load(hi)), i64(1))
    below = _less(b, load(b, ptr, mid, dt), v, dt)
    b.store(b.select(below, b.add(mid, i64(1)), b.load(lo)), lo)
    b.store(b.select(below, b.load(hi), mid), hi)
    b.branch(head)
    b.position_at_end(done)
    return b.load(lo)


def k_unique(b, k: KernelArgs):
    """Insertion into the ascending output: each new value is placed by a binary search
    and the larger ones move up one (O(n log u + n u) for n elements, u distinct)."""
    xt = k.in_types[0]
    dt = xt.dtype
    n = prod(int(d) for d in xt.shape) if xt.rank else 1
    O = k.out
    count = alloca_in_entry(b, I64)
    b.store(i64(0), count)
    with for_range(b, n, name="e") as e:
        v = load(b, k.ins[0], e, dt)
        c = b.load(count)
        p = lower_bound(b, O, c, v, dt)
        inside = b.icmp_signed("<", p, c)
        q = b.select(inside, p, i64(0))  # a slot in the buffer either way; read only when inside
        seen = b.and_(inside, _equal(b, load(b, O, q, dt), v, dt))
        with b.if_then(b.not_(seen)):
            with for_range(b, p, start=c, step=-1, name="up") as j:  # O[p:c] -> O[p+1:c+1]
                store(b, load(b, O, b.sub(j, i64(1)), dt), O, j, dt)
            store(b, v, O, p, dt)
            b.store(b.add(c, i64(1)), count)
    store_size(b, k, b.load(count))


def k_unique_inverse(b, k: KernelArgs):
    """Each element's index in the distinct values (binary search)."""
    xt, vt = k.in_types
    n = prod(int(d) for d in xt.shape) if xt.rank else 1
    u = i64(vt.shape[0])
    with for_range(b, n, name="e") as e:
        v = load(b, k.ins[0], e, xt.dtype)
        store(b, lower_bound(b, k.ins[1], u, v, xt.dtype), k.out, e, "i64")


def k_unique_counts(b, k: KernelArgs):
    """How often each distinct value occurs: zeroed, then one increment per element."""
    xt, vt = k.in_types
    n = prod(int(d) for d in xt.shape) if xt.rank else 1
    u = i64(vt.shape[0])
    with for_range(b, u, name="z") as j:
        store(b, i64(0), k.out, j, "i64")
    with for_range(b, n, name="e") as e:
        p = lower_bound(b, k.ins[1], u, load(b, k.ins[0], e, xt.dtype), xt.dtype)
        store(b, b.add(load(b, k.out, p, "i64"), i64(1)), k.out, p, "i64")
