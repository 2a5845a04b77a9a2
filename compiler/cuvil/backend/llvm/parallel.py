"""Parallel loops: a kernel's work items handed to the runtime's cuvil_parallel_for (a
task function rebuilding the KernelArgs from a context), and flat index helpers.
"""
from __future__ import annotations

from math import prod

from llvmlite import ir

from .emit import I64, PTR, i64
from .kernel_args import KernelArgs
from .loops import alloca_in_entry, for_range
from .symbolic import FnSizes, body_block, emitting, upper
from .vectors import index_div, index_rem


PARALLEL_MIN_ELEMENTS = 1 << 15


def outer_split(shape) -> int:
    """How many leading dims to split across threads (their product >= 16, leaving
    inner dims), or 0 for a serial loop (small tensors; symbolic dims decide by their
    upper bounds)."""
    split = next((d + 1 for d in range(len(shape)) if upper(prod(shape[:d + 1])) >= 16), 0)
    if upper(prod(shape)) < PARALLEL_MIN_ELEMENTS or split == len(shape):
        return 0
    return split

TASK_FN = ir.FunctionType(ir.VoidType(), [PTR, I64, I64])


def parallel_for_decl(module: ir.Module) -> ir.Function:
    """The runtime's `cuvil_parallel_for(fn, ctx, n)`."""
    fn = module.globals.get("cuvil_parallel_for")
    if fn is None:
        fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [TASK_FN.as_pointer(), PTR, I64]),
                         name="cuvil_parallel_for")
    return fn


def parallel(b, k: KernelArgs, count: int, body, extras=(), chunk_start: bool = False, ranges: bool = False):
    """Run body(b, k, i, extras) for i in [0, count) split across the runtime's threads.
    With chunk_start, extras end with the first i of the calling thread's chunk: a slot
    of per-i scratch that no other thread uses while this chunk runs. With ranges, the
    body runs once per chunk, as body(b, k, (begin, end), extras).

    The body is emitted into its own task function: it must use only the KernelArgs it
    is given (pointers rebuilt inside the task) and the `extras` i64 values passed in."""
    ptrs = [k.out] + [p for p in k.ins if p is not None] + ([k.scratch] if k.scratch is not None else []) \
        + ([k.dims] if k.dims is not None else [])
    task = ir.Function(b.module, TASK_FN, name=b.module.get_unique_name(f"{b.function.name}.task"))
    task.linkage = "internal"
    task.attributes.add("nounwind")
    slots = len(ptrs) + len(extras)
    ctx_t = ir.ArrayType(I64, max(slots, 1))
    ctx = alloca_in_entry(b, ctx_t)
    for i, v in enumerate([b.ptrtoint(p, I64) for p in ptrs] + list(extras)):
        b.store(v, b.gep(ctx, [i64(0), ir.Constant(ir.IntType(32), i)]))
    b.call(parallel_for_decl(b.module), [task, b.bitcast(ctx, PTR), i64(count)])

    tb = ir.IRBuilder(task.append_basic_block("entry"))
    tctx = tb.bitcast(task.args[0], ctx_t.as_pointer())
    vals = [tb.load(tb.gep(tctx, [i64(0), ir.Constant(ir.IntType(32), i)])) for i in range(slots)]
    rebuilt = [tb.inttoptr(v, p.type) for v, p in zip(vals, ptrs)]
    it = iter(rebuilt[1:])
    k2 = KernelArgs(out=rebuilt[0], out_type=k.out_type,
                    ins=[None if p is None else next(it) for p in k.ins], in_types=k.in_types,
                    attrs=k.attrs, consts=k.consts, vw=k.vw,
                    scratch=next(it) if k.scratch is not None else None,
                    dims=next(it) if k.dims is not None else None, symbols=k.symbols, int8=k.int8, bf16=k.bf16, plan=k.plan)
    # Sizes used in the body materialise in the task, from its own copy of the symbols.
    body_block(tb)
    with emitting(FnSizes(task, k2.dims, k.symbols)):
        if ranges:
            body(tb, k2, (task.args[1], task.args[2]), vals[len(ptrs):])
        else:
            with for_range(tb, task.args[2], start=task.args[1], name="t") as i:
                body(tb, k2, i, vals[len(ptrs):] + ([task.args[1]] if chunk_start else []))
    tb.ret_void()


def flat_offsets(b, flat, shape, stride_sets):
    """Element offsets, one per stride set, of the row-major flat index `flat` in `shape`."""
    offs = [i64(0)] * len(stride_sets)
    rem = flat
    for d in reversed(range(len(shape))):
        if d and not all(isinstance(e, int) and e == 1 for e in shape[:d]):
            coord, rem = index_rem(b, rem, shape[d]), index_div(b, rem, shape[d])
        else:  # the outer dims are all 1: rem < shape[d]
            coord, rem = rem, i64(0)
        offs = [b.add(o, b.mul(coord, i64(st[d]))) if st[d] else o for o, st in zip(offs, stride_sets)]
    return offs


def rows_parallel(b, k: KernelArgs, rows, row_len, row):
    """row(b, k2, r) for r in [0, rows): across the runtime's threads where the rows
    hold at least PARALLEL_MIN_ELEMENTS values (row must use only k2's pointers)."""
    if rows == 1 or upper(rows * row_len) < PARALLEL_MIN_ELEMENTS:
        with for_range(b, rows, name="r") as r:
            row(b, k, r)
        return
    parallel(b, k, rows, lambda bb, k2, r, _: row(bb, k2, r))


def parallel_ranges(b, k: KernelArgs, count: int, elements: int, body):
    """body(b, k2, (begin, end)) over [0, count) split across the threads in contiguous
    ranges, or serially where the op moves fewer than PARALLEL_MIN_ELEMENTS values."""
    if elements < PARALLEL_MIN_ELEMENTS:
        body(b, k, (i64(0), i64(count)))
        return
    parallel(b, k, count, lambda bb, k2, rng, _: body(bb, k2, rng), ranges=True)
