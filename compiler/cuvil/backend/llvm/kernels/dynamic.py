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
    n = i64(prod(xt.shape) if xt.rank else 1)  # values may be x itself (a produced size)
    u = i64(vt.shape[0])
    with for_range(b, n, name="e") as e:
        v = load(b, k.ins[0], e, xt.dtype)
        store(b, lower_bound(b, k.ins[1], u, v, xt.dtype), k.out, e, "i64")


def k_unique_counts(b, k: KernelArgs):
    """How often each distinct value occurs: zeroed, then one increment per element."""
    xt, vt = k.in_types
    n = i64(prod(xt.shape) if xt.rank else 1)  # values may be x itself (a produced size)
    u = i64(vt.shape[0])
    with for_range(b, u, name="z") as j:
        store(b, i64(0), k.out, j, "i64")
    with for_range(b, n, name="e") as e:
        p = lower_bound(b, k.ins[1], u, load(b, k.ins[0], e, xt.dtype), xt.dtype)
        store(b, b.add(load(b, k.out, p, "i64"), i64(1)), k.out, p, "i64")


def _nms_before(b, sj, si, cj, ci, j, i, by_class: bool):
    """Whether box j comes before box i (ir/ops/dynamic.nms_order): a higher score (NaN
    above every number), equal scores by index; with by_class, a lower class first."""
    nan_j, nan_i = b.fcmp_unordered("uno", sj, sj), b.fcmp_unordered("uno", si, si)
    higher = b.or_(b.and_(nan_j, b.not_(nan_i)), b.fcmp_ordered(">", sj, si))
    equal = b.or_(b.fcmp_ordered("==", sj, si), b.and_(nan_j, nan_i))
    before = b.or_(higher, b.and_(equal, b.icmp_signed("<", j, i)))
    if by_class:
        before = b.or_(b.icmp_signed("<", cj, ci), b.and_(b.icmp_signed("==", cj, ci), before))
    return before


def _std_max(b, x, y):
    return b.select(b.fcmp_ordered("<", x, y), y, x)


def _std_min(b, x, y):
    return b.select(b.fcmp_ordered("<", y, x), y, x)


def _while(b, name: str, cond):
    """Start a loop that runs while cond(b) (emitted at the top of each trip) is true and
    leave the builder in its body; returns (head, exit): the body ends by branching to
    head (next trip) or exit, where the caller then continues."""
    head, body, done = (b.append_basic_block(f"{name}.{s}") for s in ("head", "body", "done"))
    b.branch(head)
    b.position_at_end(head)
    b.cbranch(cond(b), body, done)
    b.position_at_end(body)
    return head, done


def _sift_down(b, heap, first: ir.Value, end: ir.Value, later) -> None:
    """Heapsort's sift-down of heap[first] within heap[:end] (box indices), `later(x, y)`
    whether box x is ordered after box y (the heap's root is the last box)."""
    root = alloca_in_entry(b, I64)
    b.store(first, root)
    head, done = _while(b, "sift", lambda b: b.icmp_signed("<", b.add(b.mul(b.load(root), i64(2)), i64(1)), end))
    r = b.load(root)
    child = b.add(b.mul(r, i64(2)), i64(1))
    right = b.add(child, i64(1))
    right_ok = b.icmp_signed("<", right, end)
    other = b.select(right_ok, right, child)
    vc, vo = load(b, heap, child, "i64"), load(b, heap, other, "i64")
    pick = b.select(b.and_(right_ok, later(vo, vc)), other, child)
    vr, vp = load(b, heap, r, "i64"), load(b, heap, pick, "i64")
    swap = b.append_basic_block("sift.swap")
    b.cbranch(later(vp, vr), swap, done)
    b.position_at_end(swap)
    store(b, vp, heap, r, "i64")
    store(b, vr, heap, pick, "i64")
    b.store(pick, root)
    b.branch(head)
    b.position_at_end(done)


def k_nms(b, k: KernelArgs):
    """Greedy non-maximum suppression (ir/ops/dynamic.py Nms), in the result's buffer
    (planned for all N boxes): the box indices heapsorted into the order (in place,
    O(N log N)), then one pass over that order that appends each kept box after the kept
    ones. A box is compared with the kept boxes newest first and stops at the first that
    suppresses it; in by_class order, at the first of another class (a class's kept
    boxes are the last ones). float32 IoU as the reference, no fused multiply-adds."""
    boxes, scores = k.ins[0], k.ins[1]
    idxs = k.ins[2] if len(k.ins) > 2 else None
    by_class = bool(k.attrs.get("by_class"))
    n = i64(k.in_types[1].shape[0])
    zero_i, true = i64(0), ir.Constant(ir.IntType(1), 1)

    def cls(i):
        return load(b, idxs, i, "i64") if idxs is not None else zero_i

    def later(x, y):  # box x after box y in the order
        return _nms_before(b, load(b, scores, y, "f32"), load(b, scores, x, "f32"), cls(y), cls(x), y, x, by_class)

    with for_range(b, n, name="i") as i:
        store(b, i, k.out, i, "i64")
    with for_range(b, -1, start=b.sub(b.sdiv(n, i64(2)), i64(1)), step=-1, name="h") as h:
        _sift_down(b, k.out, h, n, later)
    with for_range(b, 0, start=b.sub(n, i64(1)), step=-1, name="e") as e:
        top, last = load(b, k.out, zero_i, "i64"), load(b, k.out, e, "i64")
        store(b, last, k.out, zero_i, "i64")
        store(b, top, k.out, e, "i64")
        _sift_down(b, k.out, zero_i, e, later)

    count, keep, same, q = (alloca_in_entry(b, t) for t in (I64, ir.IntType(1), I64, I64))
    b.store(zero_i, count)
    thr = ir.Constant(ir.DoubleType(), float(k.attrs["iou_threshold"]))
    f0 = ir.Constant(ir.FloatType(), 0.0)
    with for_range(b, n, name="p") as p:
        i = load(b, k.out, p, "i64")
        ci = cls(i)
        if "score_threshold" in k.attrs:
            ok = b.fcmp_ordered(">", b.fpext(load(b, scores, i, "f32"), ir.DoubleType()),
                                ir.Constant(ir.DoubleType(), float(k.attrs["score_threshold"])))
        else:
            ok = true
        b.store(ok, keep)
        b.store(zero_i, same)
        with b.if_then(ok):
            x1, y1, x2, y2 = (load(b, boxes, b.add(b.mul(i, i64(4)), i64(c)), "f32") for c in range(4))
            area = b.fmul(b.fsub(x2, x1), b.fsub(y2, y1))
            b.store(b.load(count), q)
            head, done = _while(b, "kept", lambda b: b.and_(b.icmp_signed(">", b.load(q), zero_i), b.load(keep)))
            at = b.sub(b.load(q), i64(1))
            b.store(at, q)
            kk = load(b, k.out, at, "i64")
            same_class = b.icmp_signed("==", cls(kk), ci) if idxs is not None else true
            if by_class:
                compare = b.append_basic_block("kept.compare")
                b.cbranch(same_class, compare, done)
                b.position_at_end(compare)
            b.store(b.add(b.load(same), b.zext(same_class, I64)), same)
            kx1, ky1, kx2, ky2 = (load(b, boxes, b.add(b.mul(kk, i64(4)), i64(c)), "f32") for c in range(4))
            w = _std_max(b, f0, b.fsub(_std_min(b, kx2, x2), _std_max(b, kx1, x1)))
            h = _std_max(b, f0, b.fsub(_std_min(b, ky2, y2), _std_max(b, ky1, y1)))
            inter = b.fmul(w, h)
            karea = b.fmul(b.fsub(kx2, kx1), b.fsub(ky2, ky1))
            iou = b.fdiv(inter, b.fsub(b.fadd(karea, area), inter))
            hit = b.and_(b.fcmp_ordered(">", b.fpext(iou, ir.DoubleType()), thr), same_class)
            b.store(b.not_(hit), keep)
            b.branch(head)
            b.position_at_end(done)
            if "max_per_class" in k.attrs:
                under = b.icmp_signed("<", b.load(same), i64(int(k.attrs["max_per_class"])))
                b.store(b.and_(b.load(keep), under), keep)
        with b.if_then(b.load(keep)):
            c = b.load(count)
            store(b, i, k.out, c, "i64")
            b.store(b.add(c, i64(1)), count)
    store_size(b, k, b.load(count))
