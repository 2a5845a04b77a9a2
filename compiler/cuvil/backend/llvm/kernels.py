"""Kernel emitters: one function per op kind, generating a loop nest for a static shape.

Each emitter gets a `KernelArgs` (typed pointers for the result and the operands, their
types and the op's attributes) and emits the body of one LLVM function. Correct first;
the inner loops run over contiguous memory so LLVM's vectoriser widens them.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from math import prod

import numpy as np
from llvmlite import ir

from ...errors import BackendError
from ...ir.ops.nn import AvgPool2d, Resize, adaptive_ranges
from ...ir.ops.quant import rounds_to_bf16
from ...ir.types import TensorType
from .symbolic import FnSizes, KType, body_block, emitting, lower, upper
from .emit import (F32, I64, PTR, REDUCE, REG_TYPES, View, broadcast_strides, coalesce, contiguous_strides,
                   const_like, emit_program, fconst, fsize, i64, intrinsic, load, loop_nest,
                   store, vector_step)
from .gemm import (_splat, blocked_gemm, emit_round_run, round_bf16, emit_gemm, emit_gemm_blocked, emit_gemm_packed, emit_gemm_panel,
                   emit_pack_b, micro_shape, pack_b, packed_work_items, panel_width, row_blocks)
from .loops import alloca_in_entry, for_range
from .mathlib import get_math


@dataclass
class KernelArgs:
    out: ir.Value                       # typed pointer to the result
    out_type: TensorType
    ins: list[ir.Value | None]          # typed pointers (None: inlined scalar constant)
    in_types: list[TensorType]
    attrs: dict
    consts: dict[int, float] = field(default_factory=dict)  # operand index -> inlined scalar
    vw: int = 4                         # f32 lanes of the target's vector registers
    packed_b: bool = False              # matmul / transposed conv: operand 1 is packed by gemm.pack_b
    scratch: ir.Value | None = None     # i8* scratch memory (see scratch_bytes)
    dims: ir.Value | None = None        # i64* runtime values of the symbolic dims (symbolic.py)
    symbols: dict = field(default_factory=dict)  # symbol -> index into dims
    int8: object = None                 # qgemm8.Int8Isa of the int8 kernels (None: generic)
    bf16: object = None                 # qgemm8.Int8Isa of the bf16 kernels (None: generic)


# -- elementwise ----------------------------------------------------------------------------
def emit_elementwise(b: ir.IRBuilder, out: ir.Value, out_type: TensorType, ins, in_types, consts,
                     program, first_is_out: bool = False) -> None:
    """out[i] = program(inputs broadcast to out). With first_is_out, slot 0 is out itself
    (a conv/matmul epilogue applied in place)."""
    shape = list(out_type.shape)
    views = [View(out, out_type.dtype, contiguous_strides(shape))]
    slots = []  # per program input: ('view', k) or ('const', value)
    for i, (p, t) in enumerate(zip(ins, in_types)):
        if i in consts:
            slots.append(("const", fconst(t.dtype, consts[i]) if t.dtype in ("f32", "f16", "f64")
                          else ir.Constant(REG_TYPES[t.dtype], int(consts[i]))))
        else:
            views.append(View(p, t.dtype, broadcast_strides(t.shape, shape)))
            slots.append(("view", len(views) - 1))
    dtypes = [t.dtype for t in in_types]

    def body(b, idx):
        vals = []
        for kind, v in slots:
            vals.append(v if kind == "const" else load(b, views[v].ptr, idx[v], views[v].dtype))
        prog_vals = ([load(b, out, idx[0], out_type.dtype)] + vals) if first_is_out else vals
        prog_types = ([out_type.dtype] + dtypes) if first_is_out else dtypes
        res, rdt = emit_program(b, program, prog_vals, prog_types)
        if rdt != out_type.dtype:
            raise BackendError(f"program yields {rdt}, result is {out_type.dtype}")
        store(b, res, out, idx[0], out_type.dtype)

    loop_nest(b, shape, views, body)


PARALLEL_MIN_ELEMENTS = 1 << 15


def _outer_split(shape) -> int:
    """How many leading dims to split across threads (their product >= 16, leaving
    inner dims), or 0 for a serial loop (small tensors; symbolic dims decide by their
    upper bounds)."""
    split = next((d + 1 for d in range(len(shape)) if upper(prod(shape[:d + 1])) >= 16), 0)
    if upper(prod(shape)) < PARALLEL_MIN_ELEMENTS or split == len(shape):
        return 0
    return split


def k_fused(b, k: KernelArgs):
    shape = list(k.out_type.shape)
    split = _outer_split(shape)
    if not split:
        emit_elementwise(b, k.out, k.out_type, k.ins, k.in_types, k.consts, k.attrs["program"])
        return
    outer, inner = shape[:split], shape[split:]
    full = [[1] * (len(shape) - t.rank) + list(t.shape) for t in k.in_types]
    strides = [contiguous_strides(shape)] + [broadcast_strides(t.shape, shape) for t in k.in_types]
    sub_types = [KType(tuple(f[split:]), t.dtype) for f, t in zip(full, k.in_types)]

    def body(b, k2, i, _):
        offs = flat_offsets(b, i, outer, strides)
        out = b.gep(k2.out, [offs[0]], inbounds=True)
        ins = [None if p is None else b.gep(p, [o], inbounds=True) for p, o in zip(k2.ins, offs[1:])]
        emit_elementwise(b, out, KType(tuple(inner), k.out_type.dtype), ins, sub_types, k.consts,
                         k.attrs["program"])
    parallel(b, k, prod(outer), body)


def _epilogue(b, k: KernelArgs, n_main: int):
    """Apply the post program to the whole result in place (after a direct kernel)."""
    post = k.attrs.get("post") or []
    if post:
        consts = {i - n_main: v for i, v in k.consts.items() if i >= n_main}
        emit_elementwise(b, k.out, k.out_type, k.ins[n_main:], k.in_types[n_main:], consts, post,
                         first_is_out=True)


def pair_half(b, v, half: int):
    """The f32 value (scalar or vector) of one code of elements of plane pairs (32 bits
    each, as f32: two bf16 codes): half 0 the low code (plane 2i's), 1 the high one."""
    vec = isinstance(v.type, ir.VectorType)
    ity = ir.VectorType(ir.IntType(32), v.type.count) if vec else ir.IntType(32)

    def c(x):
        return ir.Constant(ity, [x] * v.type.count) if vec else ir.Constant(ity, x)
    bits = b.bitcast(v, ity)
    return b.bitcast(b.shl(bits, c(16)) if half == 0 else b.and_(bits, c(-65536)), v.type)


def pair_join(b, lo, hi):
    """pair_half's inverse for two f32 scalars holding bf16 values: the element of plane
    pairs whose low code is lo's, high code hi's."""
    i32 = ir.IntType(32)
    return b.bitcast(b.or_(b.bitcast(hi, i32), b.lshr(b.bitcast(lo, i32), ir.Constant(i32, 16))), F32)


def index_div(b, x, n):
    """x // n for an index x >= 0 (i64) and a count n > 0 (an int or a runtime size): a
    shift for a power of two, else an unsigned division (the signed one's fix-ups for a
    negative x cost a few instructions per use: ResNet-50 bf16's expand convs, whose
    epilogues find each row's bias and residual, -5..8% each)."""
    if isinstance(n, int) and n & (n - 1) == 0:
        return b.lshr(x, i64(n.bit_length() - 1))
    return b.udiv(x, i64(n))


def index_rem(b, x, n):
    """x % n for an index x >= 0 (i64) and a count n > 0 (an int or a runtime size)."""
    if isinstance(n, int) and n & (n - 1) == 0:
        return b.and_(x, i64(n - 1))
    return b.urem(x, i64(n))


def _row_epilogue(k: KernelArgs, n_main: int, split: int):
    """An epilogue callback for GEMM row blocks: the result is viewed as rows (the first
    `split` dims, flattened) x columns (the rest); rows [row0, row0+rows) get the post
    program while they are in cache. Returns None when there is no post program.
    An extra operand that `pairs_extras` (k.attrs: operand indices) names is a bf16 conv
    result stored as plane pairs of codes (qkernels.stored_pairs), of the result's shape:
    flat row r's value at column c is the code in 32-bit element (r // 2) * cols + c,
    its low half for an even r, its high one for an odd; only the vector paths (`apply`)
    read such an operand."""
    post = k.attrs.get("post") or []
    if not post:
        return None
    shape = list(k.out_type.shape)
    row_dims, col_dims = shape[:split], shape[split:]
    consts = {i - n_main: v for i, v in k.consts.items() if i >= n_main}
    kept = [i for i in range(len(k.in_types) - n_main) if i not in consts]  # the extras with a pointer
    extras = [(k.ins[n_main + i], k.in_types[n_main + i]) for i in kept]
    paired = {1 + kept.index(o - n_main) for o in k.attrs.get("pairs_extras") or ()
              if o - n_main in kept}  # their places in ptrs
    if paired and (split != 2 or any(tuple(extras[j - 1][1].shape) != tuple(shape) for j in paired)):
        raise BackendError("an epilogue operand stored as plane pairs needs the result's shape and NCHW rows")
    n_cols = prod(shape[split:])
    strides = [contiguous_strides(shape)] + [broadcast_strides(t.shape, shape) for _, t in extras]
    ptrs = [k.out] + [p for p, _ in extras]
    dtypes = [k.out_type.dtype] + [t.dtype for _, t in extras]
    all_types = [t.dtype for t in k.in_types[n_main:]]
    flat_cols, flat_strides = coalesce(list(col_dims), [st[split:] for st in strides])
    supports_cols = len(flat_cols) == 1
    # tiles take whole vectors when every operand is f32 and either walks the columns
    # contiguously or is one value per row (a bias), and the program vectorises
    vector_cols = (supports_cols and all(dt == "f32" for dt in dtypes + all_types)
                   and all(fs[0] in (0, 1) for fs in flat_strides)
                   and all(vector_step(op, attrs) for op, _, attrs in post))

    def values_of(b, loaded):
        """The program's operand list: the result, then each extra operand (loaded) or constant."""
        vals, vi = [loaded[0]], 1
        for i, t in enumerate(all_types):
            if i in consts:
                c = consts[i]
                vals.append(const_like(loaded[0], t, c) if t in ("f32", "f16", "f64")
                            else ir.Constant(REG_TYPES[t], int(c)))
            else:
                vals.append(loaded[vi])
                vi += 1
        return vals

    def row_offsets(b, r):
        """Each operand's element offset of flat row r (of a pairs operand: (its 32-bit
        element offset, the shift that brings r's half down, i32))."""
        offs = flat_offsets(b, r, row_dims, [st[:split] for st in strides])
        for j in paired:
            offs[j] = (b.mul(index_div(b, r, 2), i64(n_cols)),
                       b.trunc(b.mul(index_rem(b, r, 2), i64(16)), ir.IntType(32)))
        return offs

    def load_pairs(b, j, off, col, vty, lanes, half=None):
        """The f32 values of pairs operand j at columns from col (off: row_offsets'); `half`
        (0, 1): the row's parity where it is known."""
        ptr = b.bitcast(b.gep(ptrs[j], [b.add(off[0], col)], inbounds=True), vty.as_pointer())
        got = _load_lanes(b, ptr, vty, [lanes is None or e < lanes for e in range(vty.count)])
        if half is not None:
            return pair_half(b, got, half)
        ity = ir.VectorType(ir.IntType(32), vty.count)  # the row's half brought down to the low code
        one = b.insert_element(ir.Constant(ity, ir.Undefined), off[1], ir.Constant(ir.IntType(32), 0))
        shift = b.shuffle_vector(one, ir.Constant(ity, ir.Undefined), ir.Constant(ity, [0] * vty.count))
        return pair_half(b, b.bitcast(b.lshr(b.bitcast(got, ity), shift), vty), 0)

    def apply_at(b, offs, col, vec, lanes=None, half=None):
        """The program on vec, the result's vector at columns from col of the row whose
        operand offsets are offs: each extra operand is a vector there (only its first
        `lanes` elements read, where given) or, one value per row, a splat. `half`: the
        row's parity, where known (for a pairs operand)."""
        vty = vec.type
        at = [None if j in paired else b.add(o, b.mul(col, i64(fs[0]))) if fs[0] else o
              for j, (o, fs) in enumerate(zip(offs, flat_strides))]
        loaded = [vec] + [
            load_pairs(b, j, offs[j], col, vty, lanes, half) if j in paired else
            _splat(b, load(b, ptrs[j], at[j], "f32"), vty) if flat_strides[j][0] == 0 else
            _load_lanes(b, b.bitcast(b.gep(ptrs[j], [at[j]], inbounds=True), vty.as_pointer()), vty,
                        [lanes is None or e < lanes for e in range(vty.count)])
            for j in range(1, len(ptrs))]
        res, _ = emit_program(b, post, values_of(b, loaded), ["f32"] + all_types)
        return res

    def apply(b, r, col, vec, lanes=None, half=None):
        """apply_at for flat row r: a tile's accumulators, in registers. `lanes`: only the
        first that many columns are real (the extra operands read no further); `half`:
        r % 2, where the caller knows it."""
        return apply_at(b, row_offsets(b, r), col, vec, lanes, half)

    def apply_rows(b, r0, vec, lanes=None):
        """The program on vec whose lanes are flat rows r0, r0 + 1, .. of one column
        (the first `lanes` of them real): for an epilogue in_registers, each extra
        operand's value per row read as a vector over the rows where they lie one apart
        (a bias over channels), else row by row."""
        vty, n = vec.type, vec.type.count
        real = n if lanes is None else lanes
        assert not paired, "apply_rows: no epilogue in registers has a pairs operand (a residual)"
        offs = row_offsets(b, r0)
        loaded = [vec]
        for j in range(1, len(ptrs)):
            if strides[j][split - 1] == 1:
                ptr = b.bitcast(b.gep(ptrs[j], [offs[j]], inbounds=True), vty.as_pointer())
                loaded.append(_load_lanes(b, ptr, vty, [e < real for e in range(n)]))
                continue
            got = ir.Constant(vty, [0.0] * n)
            for e in range(real):
                at = row_offsets(b, b.add(r0, i64(e)))[j]
                got = b.insert_element(got, load(b, ptrs[j], at, "f32"), ir.Constant(ir.IntType(32), e))
            loaded.append(got)
        res, _ = emit_program(b, post, values_of(b, loaded), ["f32"] + all_types)
        return res

    def vector_row(b, offs, col0, cols):
        """One row's whole vectors of columns from col0 (cols an int), in place; returns
        how many columns that covered."""
        vty = ir.VectorType(F32, k.vw)
        whole = cols // k.vw
        for v in range(whole):
            col = b.add(col0, i64(v * k.vw))
            ptr = b.bitcast(b.gep(ptrs[0], [b.add(offs[0], col)], inbounds=True), vty.as_pointer())
            b.store(apply_at(b, offs, col, b.load(ptr, align=4)), ptr, align=4)
        return whole * k.vw

    def run(b, row0, rows, col0=None, cols=None):
        """Rows [row0, row0+rows); with col0/cols, only those (flattened) columns."""
        vec = vector_cols and col0 is not None and isinstance(cols, int) and cols >= k.vw
        with for_range(b, rows, name="er") as rr:
            offs = row_offsets(b, b.add(row0, rr))
            if not vec:
                by_element(b, offs, col0, cols)
            else:
                done = vector_row(b, offs, col0, cols)
                if done < cols:
                    by_element(b, offs, b.add(col0, i64(done)), cols - done)

    def by_element(b, offs, col0, cols):
        """One row (offs: its offset per operand): all its columns, or [col0, col0+cols)."""
        if paired:
            raise BackendError("an epilogue operand stored as plane pairs is read by whole vectors only "
                               "(qkernels.stored_pairs)")
        if col0 is None:
            views = [View(p, dt, st[split:], o) for p, dt, st, o in zip(ptrs, dtypes, strides, offs)]
            nest = col_dims
        else:
            views = [View(p, dt, [fs[0]], b.add(o, b.mul(col0, i64(fs[0]))) if fs[0] else o)
                     for p, dt, fs, o in zip(ptrs, dtypes, flat_strides, offs)]
            nest = [cols]

        def body(b, idx):
            loaded = [load(b, v.ptr, i, v.dtype) for v, i in zip(views, idx)]
            res, _ = emit_program(b, post, values_of(b, loaded), [k.out_type.dtype] + all_types)
            store(b, res, k.out, idx[0], k.out_type.dtype)
        loop_nest(b, nest, views, body)
    run.supports_cols = supports_cols
    # run.apply may take whole vectors anywhere in a row, lanes past its end included:
    # every extra operand is one value per row (a bias; not one stored as pairs, even of
    # 1x1 planes: apply_rows reads no pairs)
    run.in_registers = vector_cols and not paired and all(fs[0] == 0 for fs in flat_strides[1:])
    if vector_cols:
        run.apply = apply
    if run.in_registers:
        run.apply_rows = apply_rows
    return run


def pairs_epilogue(k2: KernelArgs):
    """The _row_epilogue of a conv that stores plane pairs of codes (`out_pairs`), less a
    last rounding to bfloat16 (quantize_bf16.rounds_result): the codes are that rounding."""
    post = k2.attrs.get("post") or []
    if rounds_to_bf16(post):
        k2 = replace(k2, attrs={**k2.attrs, "post": post[:-1]})
    return _row_epilogue(k2, 2, 2)


def _zero(b, ptr, start, count, dtype):
    with for_range(b, count, name="z") as j:
        store(b, fconst(dtype, 0.0), ptr, b.add(start, j), dtype)


# -- parallel loops -----------------------------------------------------------------------------
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
                    dims=next(it) if k.dims is not None else None, symbols=k.symbols, int8=k.int8, bf16=k.bf16)
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


# -- matmul --------------------------------------------------------------------------------
def k_matmul(b, k: KernelArgs):
    at, bt = k.in_types[:2]
    ot = k.out_type
    m, kk, n = at.shape[-2], at.shape[-1], bt.shape[-1]
    A, B, O = k.ins[0], k.ins[1], k.out
    ety = REG_TYPES[ot.dtype]
    if ot.dtype != "f32":
        raise BackendError(f"cuvil.matmul on {ot.dtype} is not supported by the backend yet")
    if k.packed_b:
        return matmul_packed(b, k)
    if bt.rank == 2:
        # B is shared by every batch: one GEMM over all rows of A, row blocks in parallel.
        rows = at.numel // kk

        def gemm_block(b, k2, ib, _):
            emit_gemm(b, k2.ins[0], i64(0), kk, k2.ins[1], i64(0), n, k2.out, i64(0), n, rows, n, kk,
                      k2.vw, ety, _row_epilogue(k2, 2, ot.rank - 1), blocks=(ib, b.add(ib, i64(1))))
        parallel(b, k, row_blocks(rows, k.vw), gemm_block)
        return
    batch = list(ot.shape[:-2])
    a_str = [s_ * m * kk for s_ in broadcast_strides(tuple(at.shape[:-2]), batch)]
    b_str = [s_ * kk * n for s_ in broadcast_strides(tuple(bt.shape[:-2]), batch)]
    o_str = [s_ * m * n for s_ in contiguous_strides(batch)]
    nb = row_blocks(m, k.vw)

    def batch_block(b, k2, t, _):
        bi, ib = b.sdiv(t, i64(nb)), b.srem(t, i64(nb))
        oa, ob, oo = flat_offsets(b, bi, batch, [a_str, b_str, o_str])
        emit_gemm(b, k2.ins[0], oa, kk, k2.ins[1], ob, n, k2.out, oo, n, m, n, kk, k2.vw, ety,
                  blocks=(ib, b.add(ib, i64(1))))
    parallel(b, k, prod(batch) * nb, batch_block)
    _epilogue(b, k, 2)


def matmul_packed(b, k: KernelArgs, weights=None, round_a=False, a=None):
    """A matmul whose B is a constant packed in panels at compile time (gemm.pack_b):
    (panel, row block) work items, or (blocked_gemm) ranges of panels, each K-blocked.
    `weights(b, k2)` / `a(b, k2)`: B's / A's pointer (default the operands; i16 for
    bfloat16 panels); `round_a`: A rounded to bfloat16 as it is read (`precision: bf16`)."""
    at, bt = k.in_types[:2]
    ot = k.out_type
    kk, n = at.shape[-1], bt.shape[-1]
    rows = at.numel // kk
    ety = REG_TYPES[ot.dtype]
    weights = weights or (lambda b, k2: k2.ins[1])
    a = a or (lambda b, k2: k2.ins[0])
    epi = _row_epilogue(k, 2, ot.rank - 1)
    if epi is not None and not epi.supports_cols:
        raise BackendError("matmul epilogue cannot be applied per tile")
    if blocked_gemm(rows, n, k.vw):
        def panel_range(b, k2, panels, _):
            emit_gemm_blocked(b, a(b, k2), i64(0), kk, weights(b, k2), k2.out, i64(0), n, rows, n, kk, k2.vw, ety,
                              _row_epilogue(k2, 2, ot.rank - 1), panels=panels, round_a=round_a)
        parallel(b, k, -(-n // panel_width(k.vw)), panel_range, ranges=True)
        return

    def packed_items(b, k2, t, _):
        emit_gemm_packed(b, a(b, k2), i64(0), kk, weights(b, k2), k2.out, i64(0), n, rows, n, kk, k2.vw, ety,
                         _row_epilogue(k2, 2, ot.rank - 1), items=(t, b.add(t, i64(1))), round_a=round_a)
    parallel(b, k, packed_work_items(rows, n, k.vw), packed_items)


# -- convolution ---------------------------------------------------------------------------
def _inside(size: int, out: int, span: int, stride: int, pad: int) -> tuple[int, int]:
    """The output indices [lo, hi) whose whole window (`span` input positions from
    o * stride - pad) lies inside [0, size), at compile time."""
    lo = min(out, -(-pad // stride))
    return lo, max(lo, min(out, (size - span + pad) // stride + 1))


def _range_for_tap(b, tap_off, stride, size, out_size):
    """Output indices o with 0 <= o*stride + tap_off < size, as [lo, hi) i64 values.
    tap_off = k*dilation - pad_lo (an i64 value)."""
    zero = i64(0)
    neg = b.sub(zero, tap_off)  # need o*stride >= -tap_off
    lo = b.select(b.icmp_signed(">", neg, zero),
                  b.sdiv(b.add(neg, i64(stride - 1)), i64(stride)), zero)
    last = b.sub(i64(size - 1), tap_off)  # o*stride <= size-1-tap_off
    hi = b.select(b.icmp_signed("<", last, zero), zero,
                  b.add(b.sdiv(last, i64(stride)), i64(1)))
    hi = b.select(b.icmp_signed(">", hi, i64(out_size)), i64(out_size), hi)
    hi = b.select(b.icmp_signed("<", hi, lo), lo, hi)
    return lo, hi


def conv_geometry(x: TensorType, w: TensorType, out: TensorType, attrs):
    n, c, h, wd = x.shape
    oc, icg, kh, kw = w.shape
    g = attrs["groups"]
    (sh, sw), (pt, pl, _, _) = attrs["stride"], attrs["pads"]
    pointwise = kh == kw == 1 and sh == sw == 1 and pt == pl == 0 and tuple(out.shape[2:]) == (h, wd)
    gemm = icg * kh * kw >= 4 and oc // g >= 4
    return pointwise, gemm


PANEL_PAD = 32  # the widest panel (AVX-512): scratch sizes are bounds for every target


def padded_input(x: TensorType, w: TensorType, out: TensorType, attrs):
    """(hp, sw, wq) of the zero-padded copy of the input planes that a dilation-1 f32
    GEMM convolution packs its im2col panels from (plain vector loads, no bounds
    checks), or None where the conv packs straight from its input. Each of the hp padded
    rows holds its columns split by phase (column sw * q + phase at phase * wq + q), so
    that the taps of consecutive outputs read consecutive elements at any stride."""
    pointwise, gemm = conv_geometry(x, w, out, attrs)
    if pointwise or not gemm or x.dtype != "f32" or tuple(attrs["dilation"]) != (1, 1):
        return None
    pt, pl, pb, pr = attrs["pads"]
    sw = attrs["stride"][1]
    return x.shape[2] + pt + pb, sw, -(-(x.shape[3] + pl + pr) // sw)


def padded_column(padded, kx: int) -> int:
    """Where tap column kx starts in a row of the padded copy (padded_input's (hp, sw,
    wq)): its phase's run of columns, then its offset in that run."""
    _, sw, wq = padded
    return kx % sw * wq + kx // sw


def _im2col_bytes(x: TensorType, w: TensorType, out: TensorType) -> int:
    """The packed im2col panels' share of a GEMM conv's scratch (64-byte multiple)."""
    _, icg, kh, kw = w.shape
    nbytes = icg * kh * kw * (out.shape[2] * out.shape[3] + PANEL_PAD) * x.itemsize
    return -(-nbytes // 64) * 64


def scratch_bytes(op) -> int:
    """Scratch memory a kernel needs while it runs (the memory planner reserves it): the
    GEMM convolutions pack their B operand (im2col or the input planes) in panels; an
    int8 matmul keeps its quantized A (qkernels.int8_scratch_bytes); a depthwise conv
    fused with the 1x1 conv it reads holds its bands (fuse_pw_dw)."""
    if op.name == "cuvil.matmul":
        from .qkernels import int8_scratch_bytes
        return int8_scratch_bytes(op)
    if op.name != "cuvil.conv2d":
        return 0
    x, w = (v.type for v in op.operands[:2])
    _, gemm = conv_geometry(x, w, op.result.type, op.attrs)
    if not gemm:  # a depthwise conv that may run fused with the 1x1 conv before it
        from .fuse_pw_dw import scratch_bytes as fused_scratch
        return fused_scratch(op)
    # The memory plan does not know the target: a conv that runs transposed on some
    # vector width reserves the larger of the two forms' scratch.
    from .qkernels import bf16_transposable
    need = max(_conv_scratch(x, w, op.result.type, op.attrs, t)[1] for t in {False, _transposable(op)})
    if bf16_transposable(op):
        need = max(need, _conv_scratch(x, w, op.result.type, op.attrs, True, codes=True)[1])
    if _transposable(op) and _winograd_shape(x, w, op.result.type, op.attrs, 16):
        need = max(need, _winograd_scratch(w, op.result.type))
    return need


def memory_plan_options(vector_bits: int | None = None) -> dict:
    """The memory-plan pass's options for this backend: its scratch sizes, the values
    fused kernels read beyond their operands and, for a target of `vector_bits`, the
    convs that may write over a residual (residual_in_place; none where the target is
    not known yet)."""
    opts = {"scratch": scratch_bytes, "reads": _fused_reads}
    if vector_bits:
        opts["in_place_conv"] = lambda op: residual_in_place(op, max(vector_bits // 32, 1))
    return opts


def _fused_reads(op) -> tuple:
    """Values op's kernel reads beyond its operands: a depthwise conv fused with the 1x1
    conv before it reads that conv's operands (fuse_pw_dw)."""
    from .fuse_pw_dw import pointwise_producer
    a = pointwise_producer(op) if op.name == "cuvil.conv2d" else None
    return () if a is None else tuple(a.operands)


def _conv_scratch(x: TensorType, w: TensorType, out: TensorType, attrs, transposed: bool,
                  codes: bool = False) -> tuple[int, int]:
    """(element offset of the transposed result C^T, total bytes) of a GEMM conv's
    scratch: the im2col panels (or, transposed, im2col^T; none for a transposed 1x1
    conv, which reads its input in place, except with `codes`: a bf16 one's codes of its
    input, qkernels.k_conv2d_bf16_transposed), the padded input copy with PANEL_PAD * 2
    elements of slack either side, then C^T (P + PANEL_PAD rows of OC + PANEL_PAD: whole
    panels) if transposed."""
    pointwise, _ = conv_geometry(x, w, out, attrs)
    padded = padded_input(x, w, out, attrs)
    extra = 0 if padded is None else (w.shape[1] * prod(padded) + 4 * PANEL_PAD) * x.itemsize
    front = _im2col_bytes(x, w, out) + extra
    if transposed and pointwise:  # bf16 codes: pairs of input rows, 4 bytes a position
        front = -(-w.shape[1] // 2) * (out.shape[2] * out.shape[3] + PANEL_PAD) * 4 if codes else 0
    front = -(-front // 64) * 64
    if not transposed:
        return 0, front
    ct = (out.shape[2] * out.shape[3] + PANEL_PAD) * (w.shape[0] + PANEL_PAD) * 4
    return front // 4, front + ct


def _transposable(op) -> bool:
    """Whether conv_transposed may choose the transposed form for some vector width: an
    f32 GEMM conv of static shapes, one group, with a constant weight."""
    if op.name != "cuvil.conv2d" or len(op.operands) < 2:
        return False
    x, w, out = op.operands[0].type, op.operands[1].type, op.result.type
    d = op.operands[1].defining_op
    if d is None or d.name != "cuvil.constant" or not (x.dtype == w.dtype == out.dtype == "f32"):
        return False
    if not all(isinstance(v, int) for v in (*x.shape, *w.shape, *out.shape)) or op.attrs["groups"] != 1:
        return False
    return conv_geometry(x, w, out, op.attrs)[1]


def conv_transposed(op, vw: int) -> bool:
    """Whether a conv runs transposed, C^T[P, OC] = im2col^T @ W^T with W^T packed in
    panels at compile time (gemm.pack_b): for f32 GEMM convs with a constant weight whose
    output planes (P = OH*OW values) would fill the target's column panels poorly (P = 49
    uses 49 of 64 lanes in 16-wide panels), the output channels take the vector lanes
    instead. Measured on an AVX2 Zen 1 core: 512 -> 512 3x3 at 7x7 31 GFLOP/s transposed,
    26 not; 256 -> 256 3x3 at 14x14 (196 of 208 lanes) 32 not transposed, 26-29 transposed."""
    if not _transposable(op):
        return False
    return thin_panels(op.result.type, vw)


def op_epilogue(op):
    """The _row_epilogue op's GEMM kernel builds, from its types and attrs alone (no
    pointers: for what it supports, not to emit), or None without a post program."""
    return _row_epilogue(KernelArgs(out=None, out_type=op.result.type, ins=[None] * len(op.operands),
                                    in_types=[v.type for v in op.operands], attrs=op.attrs), 2, 2)


def residual_in_place(op, vw: int) -> bool:
    """Whether op's kernel on a target of vw f32 lanes may write its result over an
    epilogue operand of the result's shape (a residual; the memory plan's `in_place_conv`,
    which spares the result its own memory and the caches a stream of fresh lines): a
    column-panel GEMM conv, f32 or bf16, whose tiles apply the whole epilogue in
    registers to each vector before storing it, every panel whole (no ragged columns
    stored first and finished after), not transposed, Winograd or K-blocked. Measured
    (ResNet-50, Zen 5, its 56x56 stage in place): fp32 -1% / -2%, bf16 -2% / -3% at 1 / 2
    threads."""
    from .qgemm8 import Int8Isa
    from .qkernels import bf16_transposed, quantized_weight
    if op.name != "cuvil.conv2d" or len(op.operands) < 3 or not op.attrs.get("post"):
        return False
    x, w, out = op.operands[0].type, op.operands[1].type, op.result.type
    if not all(isinstance(d, int) for d in (*x.shape, *w.shape, *out.shape)) or out.dtype != "f32":
        return False
    scheme = quantized_weight(op)
    if scheme not in (None, "bf16") or not conv_geometry(x, w, out, op.attrs)[1]:
        return False
    p, g = out.shape[2] * out.shape[3], op.attrs["groups"]
    if p % panel_width(vw) or blocked_gemm(out.shape[1] // g, p, vw):
        return False
    if scheme is None and (conv_transposed(op, vw) or conv_winograd(op, vw)):
        return False
    if scheme == "bf16" and bf16_transposed(x, w, out, op.attrs, vw, Int8Isa(2, "dpbf16ps")):
        return False
    epi = op_epilogue(op)
    return epi is not None and epi.supports_cols and hasattr(epi, "apply")


def thin_panels(out: TensorType, vw: int) -> bool:
    """Whether a conv's output planes fill less than 90% of the column panels of vectors
    of vw lanes (conv_transposed)."""
    p, nr = out.shape[2] * out.shape[3], panel_width(vw)
    return p < 0.9 * -(-p // nr) * nr


# -- Winograd F(2x2, 3x3) ------------------------------------------------------------------------
# A 3x3 stride-1 conv as 16 GEMMs: each 2x2 output tile comes from the 4x4 input patch
# d over it as Y = A^T [(G g G^T) * (B^T d B)] A, so the 36 multiply-adds per output and
# input channel become 16 per tile (2.25x fewer), at the cost of the two transforms
# (additions only) and of writing V = B^T d B and M = U * V to scratch. The transform
# matrices hold 0, +-1 and 1/2: the result differs from the direct sum by a few ulps.
WINO_BT = ((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1))
WINO_G = ((1, 0, 0), (0.5, 0.5, 0.5), (0.5, -0.5, 0.5), (0, 0, 1))
WINO_AT = ((1, 1, 1, 0), (0, 1, -1, -1))
# Channels and 2x2 tiles below which the direct GEMM conv is kept. A 7x7 plane has 16
# tiles: ResNet-50's 512 -> 512 convs there took 960 instead of 1130 us at one thread on
# Zen 5 but gained nothing at two, where the transformed weight (16/9 of the bytes,
# 16.8 MiB) streams from memory.
WINO_MIN_CHANNELS = 16
WINO_MIN_TILES = 32


def _winograd_shape(x, w, out, attrs, vw: int) -> bool:
    """Whether a GEMM conv of these static types runs Winograd on vectors of vw f32 lanes."""
    if not masked_vectors(vw) or tuple(w.shape[2:]) != (3, 3) or tuple(attrs["stride"]) != (1, 1) or tuple(attrs["dilation"]) != (1, 1):
        return False
    tiles = -(-out.shape[2] // 2) * -(-out.shape[3] // 2)
    return min(w.shape[0], w.shape[1]) >= WINO_MIN_CHANNELS and tiles >= WINO_MIN_TILES


def conv_winograd(op, vw: int) -> bool:
    """Whether an f32 conv with a constant weight runs k_conv2d_winograd (its weight
    stored transformed, winograd_weights): 3x3, stride and dilation 1, one group, at
    least WINO_MIN_CHANNELS channels in and out and WINO_MIN_TILES output tiles, and
    256- or 512-bit vectors (x86: the transforms use masked loads and stores). Measured
    on a Zen 5 core, 64@56x56 / 128@28 / 256@14: AVX-512 1005 / 917 / 951 -> 613 / 522 /
    620 us; AVX2 code 1991 / 1886 / 1911 -> 1120 / 1018 / 1094 us."""
    return _transposable(op) and _winograd_shape(op.operands[0].type, op.operands[1].type, op.result.type,
                                                 op.attrs, vw)


def winograd_weights(value):
    """U = G g G^T of each [OC, IC, 3, 3] filter as [16, OC, IC] (element 4 * i + j of the
    4x4 transformed filter first), f32."""
    g = np.asarray(WINO_G, np.float64)
    u = np.einsum("ak,oikl,bl->aboi", g, value.astype(np.float64), g)
    return np.ascontiguousarray(u.reshape(16, value.shape[0], value.shape[1]).astype(np.float32))


def _winograd_geometry(out: TensorType) -> tuple[int, int, int]:
    """(tiles per row, tiles, row pitch of V and M): a row of V / M holds the tiles of
    every tile row back to back, with a vector's slack at the end (the last vector of a
    tile row may run past it)."""
    tx = -(-out.shape[3] // 2)
    t = -(-out.shape[2] // 2) * tx
    return tx, t, -(-t // 16) * 16 + 16


def _winograd_scratch(w: TensorType, out: TensorType) -> int:
    _, _, tp = _winograd_geometry(out)
    if _winograd_blocked(w.shape[1], w.shape[0], out):  # a slot of one tile row per tile row
        return -(-out.shape[2] // 2) * 16 * (w.shape[0] + w.shape[1]) * _winograd_row_pitch(out) * 4
    return 16 * (w.shape[0] + w.shape[1]) * tp * 4


def conv_weights_packed(value, vw: int):
    """A transposed conv's weight [OC, IC, KH, KW] as packed W^T panels (conv_transposed)."""
    return pack_b(value.reshape(value.shape[0], -1).T, vw)


def _imin(b, x, y):
    return b.select(b.icmp_signed("<", x, y), x, y)


def _imax(b, x, y):
    return b.select(b.icmp_signed(">", x, y), x, y)


def _im2col_packed(b, X, xplane0, S, icg, h, w, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl, dt, nr, panel,
                   pitches=None, ic=None):
    """Panel `panel` (i64) of the packed im2col matrix: S[panel][r][j] for r over
    (ic, ky, kx) and j < nr, = X[ic, y*sh - pt + ky*dh, x*sw - pl + kx*dw] at column
    panel*nr + j = y*ow + x, or 0 outside the image or past the last column.
    `pitches=(panel, row)`: S's element strides (default kdim*nr, nr); `ic` (i64): only
    that input channel's rows.

    Per (r, output row y) the panel's columns are one run of x; the run splits into a
    zero head, a strided copy of one input row and a zero tail, so the inner loops are
    plain copies and fills."""
    zero = fconst(dt, 0.0)
    kdim, p = icg * kh * kw, oh * ow
    c0 = b.mul(panel, i64(nr))
    c1 = _imin(b, b.add(c0, i64(nr)), i64(p))
    y_first, y_last = b.sdiv(c0, i64(ow)), b.sdiv(b.sub(c1, i64(1)), i64(ow))
    panel_pitch, row_pitch = pitches or (kdim * nr, nr)
    r_lo = i64(0) if ic is None else b.mul(ic, i64(kh * kw))
    r_hi = i64(kdim) if ic is None else b.add(r_lo, i64(kh * kw))
    with for_range(b, r_hi, start=r_lo, name="r") as r:
        ic = b.sdiv(r, i64(kh * kw))
        ky = b.srem(b.sdiv(r, i64(kw)), i64(kh))
        kx = b.srem(r, i64(kw))
        toff_h = b.sub(b.mul(ky, i64(dh)), i64(pt))
        toff_w = b.sub(b.mul(kx, i64(dw)), i64(pl))
        ox_lo, ox_hi = _range_for_tap(b, toff_w, sw, w, ow)
        xplane = b.add(xplane0, b.mul(ic, i64(h * w)))
        dst = b.sub(b.add(b.mul(panel, i64(panel_pitch)), b.mul(r, i64(row_pitch))), c0)  # + column
        with for_range(b, b.add(y_last, i64(1)), start=y_first, name="y") as y:
            s0 = _imax(b, c0, b.mul(y, i64(ow)))                 # columns of row y in the panel
            s1 = _imin(b, c1, b.mul(b.add(y, i64(1)), i64(ow)))
            iy = b.add(b.mul(y, i64(sh)), toff_h)
            row_ok = b.and_(b.icmp_signed(">=", iy, i64(0)), b.icmp_signed("<", iy, i64(h)))
            base = b.mul(y, i64(ow))
            a0 = b.select(row_ok, _imin(b, _imax(b, s0, b.add(base, ox_lo)), s1), s1)  # copy range [a0, a1)
            a1 = b.select(row_ok, _imax(b, a0, _imin(b, s1, b.add(base, ox_hi))), s1)
            with for_range(b, a0, start=s0, name="zh") as cc:
                store(b, zero, S, b.add(dst, cc), dt)
            src = b.add(b.add(xplane, b.mul(b.select(row_ok, iy, i64(0)), i64(w))), toff_w)
            with for_range(b, a1, start=a0, name="cp") as cc:
                x = b.sub(cc, base)
                store(b, load(b, X, b.add(src, b.mul(x, i64(sw))), dt), S, b.add(dst, cc), dt)
            with for_range(b, s1, start=a1, name="zt") as cc:
                store(b, zero, S, b.add(dst, cc), dt)
        with for_range(b, b.add(c0, i64(nr)), start=c1, name="zp") as cc:  # padding past the last column
            store(b, zero, S, b.add(dst, cc), dt)


# A GEMM convolution with at least this many panels packs each panel right before
# multiplying it (one parallel loop over panels); fewer panels are packed first, then
# the (panel, row block) items split across the threads.
FUSED_PACK_PANELS = 16


def tile_epilogue_of(k2: KernelArgs, rb, tile_epilogue: bool):
    """A GEMM conv's epilogue for the tiles of one (image, group), whose result rows
    start at row rb (i64): callable per finished tile, with `apply` for its accumulators
    where the program runs in vectors; None where the epilogue runs after the kernel."""
    epi = _row_epilogue(k2, 2, 2) if tile_epilogue else None
    if epi is None:
        return None

    def tile_epi(bb, r0, mr, c0, nc):
        epi(bb, bb.add(rb, r0), mr, c0, nc)
    if hasattr(epi, "apply"):
        tile_epi.apply = lambda bb, r, col, vec: epi.apply(bb, bb.add(rb, r), col, vec)
    return tile_epi


def k_conv2d(b, k: KernelArgs, weights=None, round_panel=False):
    """Convolution as GEMM: per (image, group), B (the input planes for 1x1 convs, the
    im2col matrix otherwise) is packed in panels into scratch, then C[OC, P] = W @ B; a
    1x1 conv's whole panels are read from its input planes in place.
    `weights(b, k2)`: W's pointer (default the operand; i16 for bfloat16 rows);
    `round_panel`: each packed panel is rounded to bfloat16 (`precision: bf16`)."""
    xt, wt = k.in_types[:2]
    _, gemm = conv_geometry(xt, wt, k.out_type, k.attrs)
    if weights is None and (not gemm or k.out_type.dtype != "f32"):
        if depthwise(xt, wt, k.out_type, k.attrs):
            return (k_conv2d_depthwise_masked if masked_vectors(k.vw) else k_conv2d_depthwise)(b, k)
        return k_conv2d_direct(b, k)
    if k.packed_b and weights is None:
        if _winograd_shape(xt, wt, k.out_type, k.attrs, k.vw):
            return k_conv2d_winograd(b, k)
        return k_conv2d_transposed(b, k)
    weights = weights or (lambda b, k2: k2.ins[1])
    rnd = round_bf16 if round_panel else None
    n, c, h, w = xt.shape
    oc, icg, kh, kw = wt.shape
    _, _, oh, ow = k.out_type.shape
    g = k.attrs["groups"]
    ocg, kdim, p = oc // g, icg * kh * kw, oh * ow
    ety = REG_TYPES[k.out_type.dtype]
    nr = panel_width(k.vw)
    panels = -(-p // nr)
    epi_all = _row_epilogue(k, 2, 2)
    tile_epilogue = epi_all is not None and epi_all.supports_cols
    # A 1x1 conv's whole panels are its input planes' columns as they are: the tiles read
    # them in place (measured, AVX-512, 2 threads: 512->128 at 28x28 -8%, MobileNetV2
    # -4%, ResNet-50 -1.5%); the K-blocked GEMM (narrow vectors) reads packed panels only.
    in_place = conv_geometry(xt, wt, k.out_type, k.attrs)[0] and rnd is None and not blocked_gemm(ocg, p, k.vw)
    with for_range(b, n * g, name="ng") as ng:
        ni, gi = b.sdiv(ng, i64(g)), b.srem(ng, i64(g))
        xplane0 = b.mul(b.add(b.mul(ni, i64(c)), b.mul(gi, i64(icg))), i64(h * w))
        row_base = b.add(b.mul(ni, i64(oc)), b.mul(gi, i64(ocg)))

        def pack(b, k2, pp, ex, slot):
            with b.if_then(b.icmp_signed(">=", pp, i64(p // nr))) if in_place else nullcontext():  # only a ragged one
                conv_pack_panel(b, k2, b.bitcast(k2.scratch, k2.ins[0].type), ex[0], pp, slot, rnd)

        def gemm_items(b, k2, t, ex, slot):
            rb, g_, xp0 = ex
            S = b.bitcast(k2.scratch, k2.ins[0].type)
            epi = tile_epilogue_of(k2, rb, tile_epilogue)
            emit_gemm_packed(b, weights(b, k2), b.mul(g_, i64(ocg * kdim)), kdim, S, k2.out, b.mul(rb, i64(p)), p,
                             ocg, p, kdim, k2.vw, ety, epi, items=(t, b.add(t, i64(1))), panel_at=slot,
                             planes=(k2.ins[0], xp0, p) if in_place else None)

        def gemm_panels(b, k2, panels_, ex, slot):  # all weight rows times panels [p0, p1), K-blocked
            rb, g_ = ex[:2]
            S = b.bitcast(k2.scratch, k2.ins[0].type)
            epi = tile_epilogue_of(k2, rb, tile_epilogue)
            emit_gemm_blocked(b, weights(b, k2), b.mul(g_, i64(ocg * kdim)), kdim, S, k2.out, b.mul(rb, i64(p)), p,
                              ocg, p, kdim, k2.vw, ety, epi, panels=panels_, panel_at=slot)

        conv_schedule(b, k, panels, row_blocks(ocg, k.vw), pack, gemm_items, xplane0,
                      [row_base, gi, xplane0], gemm_panels if blocked_gemm(ocg, p, k.vw) else None, rnd)
    if epi_all is not None and not tile_epilogue:
        _epilogue(b, k, 2)


@dataclass(frozen=True)
class Transposed:
    """A transposed conv's layout (k_conv2d_transposed, qkernels.k_conv2d_bf16_transposed):
    P output positions per plane, K = kdim, im2col^T's columns in `panels` panels of nr,
    C^T[P, OC] in the scratch from element ct_at with rows of ldct (OC rounded up to
    whole panels)."""
    pointwise: bool
    p: int
    kdim: int
    nr: int
    panels: int
    ldct: int
    ct_at: int

    @classmethod
    def of(cls, k: KernelArgs, codes: bool = False) -> "Transposed":
        xt, wt = k.in_types[:2]
        oc, icg, kh, kw = wt.shape
        p, nr = k.out_type.shape[2] * k.out_type.shape[3], panel_width(k.vw)
        return cls(conv_geometry(xt, wt, k.out_type, k.attrs)[0], p, icg * kh * kw, nr, -(-p // nr),
                   -(-oc // nr) * nr, _conv_scratch(xt, wt, k.out_type, k.attrs, True, codes)[0])


def run_transposed(b, k: KernelArgs, t: Transposed, prepare, gemm, direct: bool = False, pairs=None):
    """A transposed conv's steps per image, each a parallel loop whose body gets the
    extras [xplane0, ni]: the padded input copy where the conv has one, `prepare` =
    (count, body) building im2col^T (None: the GEMM reads the input), `gemm` = (count,
    body) into C^T, then C^T transposed into the NCHW result vw x vw blocks at a time,
    each channel block taking the epilogue while it is in cache (not with `direct`:
    the GEMM stored the result itself). An epilogue that cannot run per channel block
    runs on the whole result after. `pairs`: the padded copy's (padded_copy)."""
    xt, wt = k.in_types[:2]
    n, c, h, w = xt.shape
    oc, vw = wt.shape[0], k.vw
    epi_all = _row_epilogue(k, 2, 2)
    row_epi = epi_all is not None and epi_all.supports_cols

    def transpose(b, k2, i, ex):
        Ct = b.gep(b.bitcast(k2.scratch, F32.as_pointer()), [i64(t.ct_at)], inbounds=True)
        _transpose_channels(b, k2, Ct, t.ldct, b.mul(i, i64(vw)), ex[1], t.p, oc,
                            _row_epilogue(k2, 2, 2) if row_epi else None)

    with for_range(b, n, name="n") as ni:
        extras = [b.mul(ni, i64(c * h * w)), ni]
        if padded_input(xt, wt, k.out_type, k.attrs) is not None:
            padded_copy(b, k, extras[0], pairs=pairs)
        for step in (prepare, gemm):
            if step is not None:
                parallel(b, k, step[0], step[1], extras)
        if not direct:
            parallel(b, k, -(-oc // vw), transpose, extras)
    if epi_all is not None and not row_epi:
        _epilogue(b, k, 2)


def k_conv2d_transposed(b, k: KernelArgs):
    """A conv_transposed convolution (run_transposed): im2col^T (K rows of P, padded to
    whole panels; a 1x1 conv's input planes already are that) times the packed W^T
    gives C^T[P, OC] in scratch. A 1x1 one on masked vectors whose epilogue, if any,
    runs on vectors and whose channels fill whole panels stores its tiles transposed in
    registers instead (transposed_store: no C^T, no transpose pass; ResNet-50's 14x14
    and 7x7 expand convs -1..4% each at 1 and 2 threads, MobileNetV2's 14x14 / 7x7 1x1
    convs -5..10% at 2; the 3x3 ones at 7x7, K-blocked, gained nothing)."""
    icg = k.in_types[1].shape[1]
    t = Transposed.of(k)
    ldk = t.p if t.pointwise else t.panels * t.nr

    def scratch(b, k2):
        return b.bitcast(k2.scratch, F32.as_pointer())

    def pack(b, k2, i, ex):
        _im2col_panel(b, k2, scratch(b, k2), ex[0], b.sdiv(i, i64(icg)), (t.nr, ldk), b.srem(i, i64(icg)))

    epi_all = _row_epilogue(k, 2, 2)
    direct = t.pointwise and masked_vectors(k.vw) and (epi_all is None or hasattr(epi_all, "apply")) \
        and k.out_type.shape[1] % t.nr == 0

    def gemm_panel(b, k2, i, ex):
        A, a_off = (k2.ins[0], ex[0]) if t.pointwise else (scratch(b, k2), i64(0))
        Ct = b.gep(scratch(b, k2), [i64(t.ct_at)], inbounds=True)
        emit_gemm_panel(b, A, a_off, 1, ldk, k2.ins[1], Ct, t.ldct, t.p, t.kdim, k2.vw, F32, i,
                        store=transposed_store(b, k2, ex[1]) if direct else None)

    run_transposed(b, k, t, None if t.pointwise else (t.panels * icg, pack), (t.ldct // t.nr, gemm_panel), direct)


def _vector_transpose(b, rows):
    """The transpose of a square block held as len(rows) vectors of as many lanes: at
    each level h, the off-diagonal h x h blocks of every 2h x 2h block trade places."""
    n = len(rows)
    rows = list(rows)
    h = n // 2
    while h:
        for i in range(n):
            if i // h % 2:
                continue
            lo, hi = [], []
            for j in range(n):
                g, o = j // (2 * h) * 2 * h, j % (2 * h)
                lo.append(g + o if o < h else n + g + o - h)
                hi.append(g + h + o if o < h else n + g + o)
            a, c = rows[i], rows[i + h]
            mask = ir.IntType(32)
            rows[i] = b.shuffle_vector(a, c, ir.Constant(ir.VectorType(mask, n), lo))
            rows[i + h] = b.shuffle_vector(a, c, ir.Constant(ir.VectorType(mask, n), hi))
        h //= 2
    return rows


def transposed_store(b, k2: KernelArgs, ni, pairs=None):
    """For a transposed conv whose epilogue is absent or runs on vectors (`apply`; its
    extra operands read in the tile's pixels only): a GEMM tile
    store(b, row0, rows, col0, valid, vals) that writes the tile's vectors (vals[r][v]:
    pixel row0 + r, channels from col0 + v * vw) transposed in registers straight into
    image ni's NCHW result, each channel's rows pixels (rows <= vw) in one masked store,
    after the epilogue. `valid`: the channels of a ragged last panel (None: a whole one).
    `pairs` (a bf16 Int8Isa; `out_pairs`, whose epilogue, if any, runs on vectors):
    the result is plane pairs of codes. An epilogue in registers (one value per channel)
    runs on the tile as it is (apply_rows: a vector of a bias's channels), each pixel's
    two vectors become the codes of its 2 * vw channels (qkernels.concat_codes: pair j in
    element j) and one transpose gives every pair's pixels (measured, ResNet-50 bf16's
    3x3 convs, against two transposes first and the pairs' codes after: -1.8% at 1 and 2
    threads); one over pixels (a residual) needs each channel's pixels: the tile's
    vectors are transposed first, then two channels' vectors become a pair's codes.
    Used by the bf16 transposed convs (qkernels) and the f32 1x1 ones
    (k_conv2d_transposed)."""
    oc, p, vw = k2.out_type.shape[1], k2.out_type.shape[2] * k2.out_type.shape[3], k2.vw
    fv = ir.VectorType(F32, vw)
    epi = _row_epilogue(k2, 2, 2) if pairs is None else pairs_epilogue(k2)
    zero = ir.Constant(fv, [0.0] * vw)

    def pair_store(b, row0, rows, col0, valid, vals):
        # the tile as it is (a pixel's channels per vector) takes the epilogue, two
        # vectors of a pixel become the codes of 2 * vw channels (vw pairs, in order),
        # and one transpose of those gives each pair's pixels
        from .qkernels import concat_codes
        nv = len(vals[0])
        for v in range(0, nv, 2):
            ch0 = b.add(b.mul(ni, i64(oc)), b.add(col0, i64(v * vw)))
            real = [vw if valid is None else max(0, min(vw, valid - (v + h) * vw)) for h in (0, 1)]
            codes = []
            for r in range(rows):
                two = []
                for h in (0, 1):
                    x = vals[r][v + h] if v + h < nv else zero
                    if epi is not None and real[h]:
                        x = epi.apply_rows(b, b.add(ch0, i64(h * vw)), x, real[h])
                    two.append(x)
                codes.append(concat_codes(b, two[0], two[1], pairs))
            lanes = _vector_transpose(b, codes + [zero] * (vw - rows))
            for j, vec in enumerate(lanes):  # pair j: channels 2j, 2j + 1 from ch0
                if 2 * j >= real[0] + real[1]:
                    break
                at = b.add(b.mul(b.add(index_div(b, ch0, 2), i64(j)), i64(p)), row0)
                _store_lanes(b, vec, b.bitcast(b.gep(k2.out, [at], inbounds=True), fv.as_pointer()), rows)

    if pairs is not None and epi is not None and not hasattr(epi, "apply"):
        raise BackendError("a transposed conv stores plane pairs only with an epilogue on vectors (writes_pairs)")

    def store(b, row0, rows, col0, valid, vals):
        if pairs is not None and (epi is None or hasattr(epi, "apply_rows")):
            return pair_store(b, row0, rows, col0, valid, vals)
        # by channel: each vector of the tile transposed, each channel's pixels take the
        # epilogue (an even channel count where a pairs operand is read: channel parity
        # j % 2); with `pairs` (an epilogue over pixels, a residual) channels 2i and
        # 2i + 1 then become pair i's codes
        from .qkernels import pair_codes
        step = 1 if pairs is None else 2
        for v in range(len(vals[0])):
            lanes = _vector_transpose(b, [vals[r][v] for r in range(rows)] + [zero] * (vw - rows))
            for j in range(0, vw, step):  # channels col0 + v * vw + j (and the next): pixels row0 ..
                if valid is not None and v * vw + j >= valid:
                    break
                ch = b.add(b.mul(ni, i64(oc)), b.add(col0, i64(v * vw + j)))
                got = [lanes[j + h] if epi is None else epi.apply(b, b.add(ch, i64(h)), row0, lanes[j + h], rows,
                                                                  (j + h) % 2) for h in range(step)]
                vec = got[0] if pairs is None else pair_codes(b, got[0], got[1], pairs)
                at = b.mul(ch, i64(p)) if pairs is None else b.mul(index_div(b, ch, 2), i64(p))
                _store_lanes(b, vec, b.bitcast(b.gep(k2.out, [b.add(at, row0)], inbounds=True), fv.as_pointer()),
                             rows)
    return store


def _transpose_channels(b, k2: KernelArgs, Ct, ldct, oc0, ni, p, oc, epi):
    """Channels [oc0, oc0 + vw) of image ni from C^T[P, OC] (row stride ldct; rows past
    P may be read, their lanes are not stored) into the NCHW result, then the epilogue
    on them. A last block of fewer than vw channels goes element by element."""
    vw = k2.vw
    vty = ir.VectorType(F32, vw)
    plane0 = b.mul(b.add(b.mul(ni, i64(oc)), oc0), i64(p))

    def block(p0, count):
        rows = [b.load(b.bitcast(b.gep(Ct, [b.add(b.mul(b.add(p0, i64(i)), i64(ldct)), oc0)], inbounds=True),
                                 vty.as_pointer()), align=4) for i in range(vw)]
        for lane, vec in enumerate(_vector_transpose(b, rows)):
            dst = b.add(b.add(plane0, i64(lane * p)), p0)
            if count == vw:
                b.store(vec, b.bitcast(b.gep(k2.out, [dst], inbounds=True), vty.as_pointer()), align=4)
            else:
                for j in range(count):
                    b.store(b.extract_element(vec, ir.Constant(ir.IntType(32), j)),
                            b.gep(k2.out, [b.add(dst, i64(j))], inbounds=True))

    full = b.icmp_signed("<=", b.add(oc0, i64(vw)), i64(oc))
    with b.if_else(full) as (then, otherwise):
        with then:
            with for_range(b, p // vw, name="pb") as pb:
                block(b.mul(pb, i64(vw)), vw)
            if p % vw:
                block(i64(p // vw * vw), p % vw)
            if epi is not None:
                epi(b, b.add(b.mul(ni, i64(oc)), oc0), vw, i64(0), p)
        with otherwise:
            if oc % vw:
                with for_range(b, oc % vw, name="ch") as ch:
                    with for_range(b, p, name="pe") as pe:
                        v = b.load(b.gep(Ct, [b.add(b.mul(pe, i64(ldct)), b.add(oc0, ch))], inbounds=True))
                        b.store(v, b.gep(k2.out, [b.add(b.add(plane0, b.mul(ch, i64(p))), pe)], inbounds=True))
                if epi is not None:
                    epi(b, b.add(b.mul(ni, i64(oc)), oc0), oc % vw, i64(0), p)


# Work items of the padded input copy: at least this many, whole planes where there are
# enough of them, else bands of rows (a stem's 3 planes would leave one of 2 threads idle
# for a third of the copy).
PADDED_COPY_ITEMS = 8


def padded_copy(b, k: KernelArgs, xplane0, rnd=None, pairs=None):
    """The zero-padded, phase-split copy (padded_input) of the conv's input planes from
    element xplane0 (one image or group), across the threads; `rnd(b, value)` maps each
    copied value. `pairs(b, v0, v1)` (masked vectors only): the copy holds one plane per
    pair of input planes (2i, 2i + 1), each element the 32 bits that function makes of
    the two planes' vectors (a bf16 conv's codes of both, qkernels.pair_codes); where
    the input is such pairs already (`in_pairs`: xplane0 still counts f32 planes), the
    copy is of them as they are."""
    icg = k.in_types[1].shape[1]
    planes = icg // 2 if pairs else icg
    hp = padded_input(*k.in_types[:2], k.out_type, k.attrs)[0]
    bands = min(hp, -(-PADDED_COPY_ITEMS // planes))

    def item(b, k2, t, ex):
        band = b.srem(t, i64(bands))
        y0 = b.sdiv(b.mul(band, i64(hp)), i64(bands))
        y1 = b.sdiv(b.mul(b.add(band, i64(1)), i64(hp)), i64(bands))
        _padded_copy(b, k2, b.sdiv(t, i64(bands)), ex[0], (y0, y1), rnd, pairs)
    parallel(b, k, planes * bands, item, [xplane0])


def _padded_copy(b, k2: KernelArgs, ic, xplane0, rows, rnd=None, pairs=None):
    """Rows [y0, y1) (`rows`, i64 values) of plane ic's padded copy (with `pairs`, of
    pair ic's). With masked vectors (x86), sw * vw consecutive input columns at a time:
    one masked load (the lanes in the padding read as zeros), split into the sw phases
    by shuffles; else column by column."""
    xt, wt = k2.in_types[:2]
    _, _, h, w = xt.shape
    hp, sw, wq = padded_input(xt, wt, k2.out_type, k2.attrs)
    pt, pl, _, _ = k2.attrs["pads"]
    Xp = _padded_base(b, k2)
    stored = pairs is not None and k2.attrs.get("in_pairs")
    if stored:  # the input is pairs already: pair ic is a plane of 32-bit elements, half the f32 offset
        src0 = b.add(b.sdiv(xplane0, i64(2)), b.mul(ic, i64(h * w)))
    else:  # f32 planes: plane ic, or the first of pair ic's two
        src0 = b.add(xplane0, b.mul(ic, i64(h * w * (2 if pairs else 1))))
    dst0 = b.mul(ic, i64(hp * sw * wq))
    zero = fconst("f32", 0.0)
    vw = k2.vw
    vty, wide = ir.VectorType(F32, vw), ir.VectorType(F32, vw * sw)
    if pairs and not masked_vectors(vw):
        raise BackendError("a padded copy of plane pairs needs masked vectors")

    def phases(src, start, valid):  # the sw phase vectors of sw * vw columns from `start`
        if any(valid):
            ptr = b.bitcast(b.gep(k2.ins[0], [b.add(src, i64(start))]), wide.as_pointer())
            got = _load_lanes(b, ptr, wide, valid)
        else:
            got = ir.Constant(wide, [0.0] * (vw * sw))
        return [got if sw == 1 else b.shuffle_vector(got, ir.Constant(wide, ir.Undefined), ir.Constant(
            ir.VectorType(ir.IntType(32), vw), [phase + sw * j for j in range(vw)])) for phase in range(sw)]

    def vector_row(src, row):
        for q0 in range(0, wq, vw):
            start = q0 * sw - pl  # the input column of phase 0's lane 0
            valid = [0 <= start + e < w for e in range(vw * sw)]
            vs = phases(src, start, valid)
            if pairs and not stored:
                vs = [pairs(b, v0, v1) for v0, v1 in zip(vs, phases(b.add(src, i64(h * w)), start, valid))]
            for phase, v in enumerate(vs):
                v = rnd(b, v) if rnd else v
                at = b.gep(Xp, [b.add(row, i64(phase * wq + q0))], inbounds=True)
                _store_lanes(b, v, b.bitcast(at, vty.as_pointer()), wq - q0)

    with for_range(b, rows[1], start=rows[0], name="py") as yy:
        row = b.add(dst0, b.mul(yy, i64(sw * wq)))
        iy = b.sub(yy, i64(pt))
        inside = b.and_(b.icmp_signed(">=", iy, i64(0)), b.icmp_signed("<", iy, i64(h)))
        with b.if_else(inside) as (then, otherwise):
            with then:
                src = b.add(src0, b.mul(iy, i64(w)))
                if masked_vectors(vw):
                    vector_row(src, row)
                elif sw == 1:  # zeros, a plain copy of the row, zeros
                    for j in range(pl):
                        store(b, zero, Xp, b.add(row, i64(j)), "f32")
                    with for_range(b, w, name="px") as xx:
                        v = load(b, k2.ins[0], b.add(src, xx), "f32")
                        store(b, rnd(b, v) if rnd else v, Xp, b.add(b.add(row, i64(pl)), xx), "f32")
                    for j in range(pl + w, wq):
                        store(b, zero, Xp, b.add(row, i64(j)), "f32")
                else:
                    for phase in range(sw):
                        with for_range(b, wq, name="pq") as q:
                            ix = b.add(b.mul(q, i64(sw)), i64(phase - pl))
                            ok = b.and_(b.icmp_signed(">=", ix, i64(0)), b.icmp_signed("<", ix, i64(w)))
                            v = load(b, k2.ins[0], b.add(src, b.select(ok, ix, i64(0))), "f32")
                            v = rnd(b, v) if rnd else v
                            store(b, b.select(ok, v, zero), Xp, b.add(row, b.add(i64(phase * wq), q)), "f32")
            with otherwise:
                with for_range(b, sw * wq, name="pz") as xx:
                    store(b, zero, Xp, b.add(row, xx), "f32")


def _padded_base(b, k2: KernelArgs):
    """The padded input copy in the scratch, after the im2col panels and PANEL_PAD * 2
    elements of slack (vector loads may reach that far either side; their lanes there
    are never used)."""
    xt, wt = k2.in_types[:2]
    S = b.bitcast(k2.scratch, F32.as_pointer())
    return b.gep(S, [i64(_im2col_bytes(xt, wt, k2.out_type) // 4 + 2 * PANEL_PAD)], inbounds=True)


def padded_reader(b, k2: KernelArgs, panel):
    """The loads of panel `panel`'s im2col columns from the padded input copy:
    read(b, tap, v) -> vector v (<vw x f32>) of the im2col row whose first tap is
    element `tap` of the copy, (ic * hp + ky) * sw * wq + padded_column(kx). The vw
    columns of each vector span at most `segs` output rows y; the lanes of row y read
    consecutive elements of the copy (row sh*y + ky, phase kx % sw, from x + kx // sw),
    so each (vector, row) is one unaligned load at an offset fixed for the panel, and the
    rows' lanes are blended by masks computed here, once per panel. Columns past the
    last are zero."""
    xt, wt = k2.in_types[:2]
    _, _, oh, ow = k2.out_type.shape
    hp, sw, wq = padded_input(xt, wt, k2.out_type, k2.attrs)
    sh, pitch = k2.attrs["stride"][0], sw * wq  # elements per padded row
    vw, nr = k2.vw, panel_width(k2.vw)
    p = oh * ow
    vty = ir.VectorType(F32, vw)
    ity = ir.VectorType(I64, vw)
    # rows of whole vectors (ow a multiple of vw): each vector lies in one output row,
    # and where every panel is whole, no lane is ever past the last column
    segs = 1 if ow % vw == 0 else -(-(vw - 1) // ow) + 1
    whole = ow % vw == 0 and p % nr == 0
    Xp = _padded_base(b, k2)
    c0 = b.mul(panel, i64(nr))
    parts = []  # per vector: [(mask, element offset of lane 0 in Xp)] per output row
    for v in range(nr // vw):
        cv = b.add(c0, i64(v * vw))
        cols = b.add(_splat(b, cv, ity), ir.Constant(ity, list(range(vw))))
        rows = b.sdiv(cols, _splat(b, i64(ow), ity))
        live = b.icmp_signed("<", cols, _splat(b, i64(p), ity))
        y0 = b.sdiv(cv, i64(ow))
        vparts = []
        for sgi in range(segs):
            y = b.add(y0, i64(sgi))
            mask = None if whole else live if segs == 1 else b.and_(live, b.icmp_signed("==", rows, _splat(b, y, ity)))
            ya = _imin(b, y, i64(oh - 1))  # rows past the image are masked off: any in-bounds address
            vparts.append((mask, b.add(b.mul(ya, i64(sh * pitch - ow)), cv)))
        parts.append(vparts)
    zero = ir.Constant(vty, [0.0] * vw)

    def read(b, tap, v):
        vec = zero
        for mask, off in parts[v]:
            got = b.load(b.bitcast(b.gep(Xp, [b.add(tap, off)]), vty.as_pointer()), align=4)
            vec = got if mask is None else b.select(mask, got, vec)
        return vec
    return read


def _im2col_padded(b, k2: KernelArgs, S, panel, pitches=None, ic=None):
    """Panel `panel` of a conv's im2col matrix from the padded input copy
    (padded_reader). `pitches` and `ic` as in _im2col_packed."""
    xt, wt = k2.in_types[:2]
    _, icg, kh, kw = wt.shape
    padded = hp, sw, wq = padded_input(xt, wt, k2.out_type, k2.attrs)
    pitch = sw * wq
    vw, nr = k2.vw, panel_width(k2.vw)
    kdim = icg * kh * kw
    vty = ir.VectorType(F32, vw)
    read = padded_reader(b, k2, panel)
    panel_pitch, row_pitch = pitches or (kdim * nr, nr)
    dst0 = b.mul(panel, i64(panel_pitch))
    ic_lo = i64(0) if ic is None else ic
    with for_range(b, i64(icg) if ic is None else b.add(ic, i64(1)), start=ic_lo, name="ic") as ic:
        with for_range(b, kh, name="ky") as ky:
            tap0 = b.add(b.mul(ic, i64(hp * pitch)), b.mul(ky, i64(pitch)))
            r0 = b.add(b.mul(ic, i64(kh * kw)), b.mul(ky, i64(kw)))
            for kx in range(kw):
                dst = b.add(dst0, b.mul(b.add(r0, i64(kx)), i64(row_pitch)))
                tap = b.add(tap0, i64(padded_column(padded, kx)))
                for v in range(nr // vw):
                    b.store(read(b, tap, v),
                            b.bitcast(b.gep(S, [b.add(dst, i64(v * vw))], inbounds=True), vty.as_pointer()), align=4)


def _im2col_panel(b, k2: KernelArgs, S, xplane0, panel, pitches, ic=None):
    """Panel `panel` of a conv's im2col matrix into S (`pitches`, `ic` as in
    _im2col_packed): vector loads from the padded input copy for dilation 1, element by
    element otherwise."""
    if padded_input(*k2.in_types[:2], k2.out_type, k2.attrs) is not None:
        _im2col_padded(b, k2, S, panel, pitches, ic)
        return
    _, _, h, w = k2.in_types[0].shape
    _, icg, kh, kw = k2.in_types[1].shape
    _, _, oh, ow = k2.out_type.shape
    (sh, sw), (dh, dw), (pt, pl, _, _) = k2.attrs["stride"], k2.attrs["dilation"], k2.attrs["pads"]
    _im2col_packed(b, k2.ins[0], xplane0, S, icg, h, w, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl,
                   k2.out_type.dtype, panel_width(k2.vw), panel, pitches, ic)


def conv_pack_panel(b, k2: KernelArgs, S, xplane0, pp, slot, rnd=None):
    """Panel pp of a GEMM conv's B operand into panel slot `slot` of S (f32): the input
    planes of a 1x1 conv (vector copies), else the im2col matrix (_im2col_panel).
    `rnd(b, value)` (scalar or vector) maps the panel's values: as they are copied, or
    already in the padded input copy (conv_schedule's `rnd`), else after packing."""
    xt, wt = k2.in_types[:2]
    pointwise, _ = conv_geometry(xt, wt, k2.out_type, k2.attrs)
    kdim, p, nr = wt.shape[1] * wt.shape[2] * wt.shape[3], k2.out_type.shape[2] * k2.out_type.shape[3], \
        panel_width(k2.vw)
    if pointwise:
        emit_pack_b(b, k2.ins[0], xplane0, p, kdim, p, S, k2.vw, S.type.pointee, panels=(pp, b.add(pp, i64(1))),
                    slot=slot, value=rnd)
        return
    _im2col_panel(b, k2, b.gep(S, [b.mul(slot, i64(kdim * nr))], inbounds=True), xplane0, pp, (0, nr))
    if rnd is not None and padded_input(xt, wt, k2.out_type, k2.attrs) is None:
        emit_round_run(b, S, S, b.mul(slot, i64(kdim * nr)), kdim * nr, k2.vw)


def conv_schedule(b, k: KernelArgs, panels: int, blocks: int, pack, gemm_items, xplane0, extras, gemm_panels=None,
                  rnd=None, pairs=None):
    """Run a GEMM conv's pack(b, k2, panel, [xplane0], slot) and gemm_items(b, k2, t,
    extras, slot) (t = panel * blocks + row block; the panel is packed at panel slot
    `slot` of the scratch) across the threads: with >= FUSED_PACK_PANELS panels each
    work item packs one panel and multiplies it by all the weight rows at once, while
    it is in cache, every panel of a thread's chunk in the same slot (the first of the
    chunk), by gemm_panels(b, k2, (panel, panel + 1), extras, slot) where given, else
    item by item; fewer panels are all packed first, each at its own slot, then split:
    gemm_panels(b, k2, (p0, p1), extras, None) on each thread's range of panels where
    given (K-blocked across them: a weight block is read from L2 for every panel of the
    range, not streamed once per panel), else the items.
    Convs of dilation 1 first copy their input planes zero-padded (padded_input), each
    value mapped by `rnd` where given, in plane pairs with `pairs` (padded_copy)."""
    xt, wt = k.in_types[:2]
    if padded_input(xt, wt, k.out_type, k.attrs) is not None:
        padded_copy(b, k, xplane0, rnd, pairs)
    if panels >= FUSED_PACK_PANELS:
        def pack_and_multiply(b, k2, pp, ex):
            slot = ex[-1]  # every panel of this thread's chunk goes through one slot, kept in cache
            pack(b, k2, pp, ex[:1], slot)
            if gemm_panels is not None:
                gemm_panels(b, k2, (pp, b.add(pp, i64(1))), ex[1:-1], slot)
                return
            with for_range(b, blocks, name="rb") as rb:
                gemm_items(b, k2, b.add(b.mul(pp, i64(blocks)), rb), ex[1:-1], slot)
        parallel(b, k, panels, pack_and_multiply, [xplane0, *extras], chunk_start=True)
    else:
        parallel(b, k, panels, lambda b, k2, pp, ex: pack(b, k2, pp, ex, pp), [xplane0])
        if gemm_panels is not None:  # each thread's range of panels, K-blocked across its panels
            parallel(b, k, panels, lambda b, k2, rng, ex: gemm_panels(b, k2, rng, ex, None), extras, ranges=True)
        else:
            parallel(b, k, blocks * panels, lambda b, k2, t, ex: gemm_items(b, k2, t, ex, None), extras)


def k_conv2d_direct(b, k: KernelArgs):
    xt, wt = k.in_types[:2]
    n, c, h, w = xt.shape
    oc, icg, kh, kw = wt.shape
    _, _, oh, ow = k.out_type.shape
    g = k.attrs["groups"]
    ocg = oc // g
    (sh, sw), (dh, dw), (pt, pl, _, _) = k.attrs["stride"], k.attrs["dilation"], k.attrs["pads"]
    dt = k.out_type.dtype
    pointwise = kh == kw == 1 and sh == sw == 1 and pt == pl == 0 and (oh, ow) == (h, w)

    def plane_body(b, k2, t, _):
        X, W, O = k2.ins[0], k2.ins[1], k2.out
        ni, o = b.sdiv(t, i64(oc)), b.srem(t, i64(oc))
        grp = b.sdiv(o, i64(ocg))
        plane = b.mul(b.add(b.mul(ni, i64(oc)), o), i64(oh * ow))
        _zero(b, O, plane, oh * ow, dt)
        with for_range(b, icg, name="ic") as icx:
            ch = b.add(b.mul(grp, i64(icg)), icx)
            xplane = b.mul(b.add(b.mul(ni, i64(c)), ch), i64(h * w))
            wbase = b.mul(b.add(b.mul(o, i64(icg)), icx), i64(kh * kw))
            if pointwise:
                wv = load(b, W, wbase, wt.dtype)
                with for_range(b, oh * ow, name="p") as p:
                    idx = b.add(plane, p)
                    acc = b.fadd(load(b, O, idx, dt), b.fmul(wv, load(b, X, b.add(xplane, p), dt),
                                                             flags=("contract",)), flags=("contract",))
                    store(b, acc, O, idx, dt)
            else:
                with for_range(b, kh, name="ky") as ky:
                    toff_h = b.sub(b.mul(ky, i64(dh)), i64(pt))
                    oh_lo, oh_hi = _range_for_tap(b, toff_h, sh, h, oh)
                    with for_range(b, kw, name="kx") as kx:
                        toff_w = b.sub(b.mul(kx, i64(dw)), i64(pl))
                        ow_lo, ow_hi = _range_for_tap(b, toff_w, sw, w, ow)
                        wv = load(b, W, b.add(wbase, b.add(b.mul(ky, i64(kw)), kx)), wt.dtype)
                        with for_range(b, oh_hi, start=oh_lo, name="y") as y:
                            iy = b.add(b.mul(y, i64(sh)), toff_h)
                            orow = b.add(plane, b.mul(y, i64(ow)))
                            xrow = b.add(b.add(xplane, b.mul(iy, i64(w))), toff_w)
                            with for_range(b, ow_hi, start=ow_lo, name="x") as x:
                                idx = b.add(orow, x)
                                xi = b.add(xrow, b.mul(x, i64(sw)))
                                acc = b.fadd(load(b, O, idx, dt), b.fmul(wv, load(b, X, xi, dt),
                                                                         flags=("contract",)), flags=("contract",))
                                store(b, acc, O, idx, dt)
    parallel(b, k, n * oc, plane_body)
    _epilogue(b, k, 2)


def _lin(b, coeffs, vecs):
    """sum(c * v) over the nonzero coefficients (each +-1 or 1/2: adds and subtracts)."""
    acc = None
    for c, v in zip(coeffs, vecs):
        if c == 0:
            continue
        if abs(c) != 1:
            v = b.fmul(v, _splat(b, ir.Constant(F32, abs(c)), v.type))
        if acc is None:
            acc = v if c > 0 else b.fneg(v)
        else:
            acc = b.fadd(acc, v) if c > 0 else b.fsub(acc, v)
    return acc if acc is not None else ir.Constant(vecs[0].type, [0.0] * vecs[0].type.count)


def _winograd_blocked(c: int, oc: int, out: TensorType) -> bool:
    """Whether a Winograd conv runs tile row by tile row (each thread's V and M rows in
    its cache, the transformed weight kept there across rows): small weights (16 * IC *
    OC f32 at most WINO_BLOCKED_WEIGHT_BYTES) and enough tile rows to share."""
    return 16 * c * oc * 4 <= WINO_BLOCKED_WEIGHT_BYTES and -(-out.shape[2] // 2) >= 8


# The largest transformed weight that the tile-row form re-reads for every tile row.
# Zen 5, 128 -> 128 at 28x28 (1 MiB): tile rows 568 / 298 us at 1 / 2 threads, whole
# planes 522 / 317: kept whole.
WINO_BLOCKED_WEIGHT_BYTES = 256 << 10


def _winograd_row_pitch(out: TensorType) -> int:
    """Row pitch of V and M in the tile-row form: one tile row in whole 16-lane vectors."""
    return -(-_winograd_geometry(out)[0] // 16) * 16


def k_conv2d_winograd(b, k: KernelArgs):
    """A conv_winograd convolution. The steps: (1) each tile row's 4x4 patches of an
    input channel -> V[16][IC][tiles] = B^T d B, a vector of tiles at a time (two masked
    loads of 2 * vw input columns per patch row give the patches' four columns as the
    even and odd lanes; the mask supplies the zero padding); (2) the 16 GEMMs M[e] =
    U[e] @ V[e] (U = winograd_weights, [OC, IC] each); (3) Y = A^T M A for a vector of
    tiles of an output channel at a time, the two columns of each tile interleaved into
    an output row and stored masked, with the epilogue in registers (one value per
    channel) or on each stored row pair. Per image, either each step across the threads
    over the whole plane (channels, (e, row block) items, output channels), or, for small
    weights (_winograd_blocked), tile row by tile row: each thread runs all three steps
    for its rows in one slot of V and M, which stays in its cache (ResNet-50's 64 -> 64
    convs at 56x56 on Zen 5, alone: 613 -> 602 us at 1 thread, 410 -> 312 at 2; in the
    model at 2 threads 451-486 -> 318-348)."""
    xt, wt = k.in_types[:2]
    n, c, h, w = xt.shape
    oc = wt.shape[0]
    _, _, oh, ow = k.out_type.shape
    pt, pl, _, _ = k.attrs["pads"]
    vw = k.vw
    tx_n, tiles, tp = _winograd_geometry(k.out_type)
    ty_n = -(-oh // 2)
    vty, wide = ir.VectorType(F32, vw), ir.VectorType(F32, 2 * vw)
    chunks = list(range(0, tx_n, vw))
    i32 = ir.IntType(32)
    even = ir.Constant(ir.VectorType(i32, vw), [2 * j for j in range(vw)])
    odd = ir.Constant(ir.VectorType(i32, vw), [2 * j + 1 for j in range(vw)])
    inter = ir.Constant(ir.VectorType(i32, 2 * vw), [j // 2 + (vw if j % 2 else 0) for j in range(2 * vw)])
    epi_all = _row_epilogue(k, 2, 2)
    in_regs = epi_all is not None and epi_all.in_registers
    in_lo, in_hi = _inside(h, ty_n, 4, 2, pt)  # tile rows whose patch rows all lie in the image

    def scratch(b, k2):
        return b.bitcast(k2.scratch, F32.as_pointer())

    def input_row(b, k2, ci, xplane, ty, sty, v0, pitch):
        """Tile row ty of input channel ci into V[e][ci] at element v0 + (e * IC + ci) *
        pitch (sty: ty where known at compile time, its patch rows outside the image
        skipped; None: all inside)."""
        X, V = k2.ins[0], scratch(b, k2)
        xplane = b.add(xplane, b.mul(ci, i64(h * w)))
        for tx0 in chunks:
            d = []  # d[r] = the four patch columns of patch row r, as vectors over tiles
            for r in range(4):
                if sty is not None and not 0 <= 2 * sty - pt + r < h:
                    d.append([ir.Constant(vty, [0.0] * vw)] * 4)
                    continue
                iy = b.add(b.mul(ty, i64(2)), i64(r - pt))
                row = b.add(xplane, b.mul(iy, i64(w)))
                cols = []
                for shift in (0, 2):
                    col = 2 * tx0 - pl + shift
                    valid = [0 <= col + e < w for e in range(2 * vw)]
                    if not any(valid):
                        cols += [ir.Constant(vty, [0.0] * vw)] * 2
                        continue
                    got = _load_lanes(b, b.bitcast(b.gep(X, [b.add(row, i64(col))], inbounds=True), wide.as_pointer()),
                                      wide, valid)
                    cols += [b.shuffle_vector(got, got, even), b.shuffle_vector(got, got, odd)]
                d.append(cols)
            tmp = [[_lin(b, WINO_BT[i], [d[r][j] for r in range(4)]) for j in range(4)] for i in range(4)]
            for i in range(4):
                for j in range(4):
                    dst = b.add(v0, b.add(b.mul(b.add(i64((4 * i + j) * c), ci), i64(pitch)), i64(tx0)))
                    b.store(_lin(b, WINO_BT[j], tmp[i]), b.bitcast(b.gep(V, [dst], inbounds=True), vty.as_pointer()),
                            align=4)

    def output_row(b, k2, t, ty, sty, m0, pitch, epi):
        """Tile row ty of output plane t (image * OC + channel) from M[e][channel] at
        element m0 + (e * OC + channel) * pitch (sty: ty where known, else both output
        rows exist)."""
        S, O = scratch(b, k2), k2.out
        o = b.srem(t, i64(oc))
        oplane = b.mul(t, i64(oh * ow))
        rows = 2 if sty is None or 2 * sty + 1 < oh else 1
        for tx0 in chunks:
            m = [b.load(b.bitcast(b.gep(S, [b.add(m0, b.add(b.mul(b.add(i64(e * oc), o), i64(pitch)), i64(tx0)))],
                                        inbounds=True), vty.as_pointer()), align=4) for e in range(16)]
            tmp = [[_lin(b, WINO_AT[i], [m[4 * r + j] for r in range(4)]) for j in range(4)] for i in range(2)]
            for i in range(rows):
                y0, y1 = (_lin(b, WINO_AT[jj], tmp[i]) for jj in range(2))
                row = b.shuffle_vector(y0, y1, inter)  # columns 2 * tx0 + (0, 1, 2, ...)
                col = b.add(b.mul(b.add(b.mul(ty, i64(2)), i64(i)), i64(ow)), i64(2 * tx0))
                if in_regs:
                    row = epi.apply(b, t, col, row)
                _store_lanes(b, row, b.bitcast(b.gep(O, [b.add(oplane, col)], inbounds=True), wide.as_pointer()),
                             ow - 2 * tx0)
        if epi is not None and not in_regs:
            epi(b, t, 1, b.mul(ty, i64(2 * ow)), rows * ow)

    def rows_of(b, body, lo, hi):
        """body(ty, static_ty) for every tile row: those outside [lo, hi) unrolled
        (static_ty an int), the others in a loop (static_ty None)."""
        lo = max(0, min(lo, ty_n))
        hi = max(lo, min(hi, ty_n))
        for ty in range(lo):
            body(i64(ty), ty)
        if hi > lo:
            with for_range(b, i64(hi), start=i64(lo), name="ty") as ty:
                body(ty, None)
        for ty in range(hi, ty_n):
            body(i64(ty), ty)

    def dispatch(b, ty, lo, hi, body):
        """body(ty, static_ty) for one tile row ty (an i64 value): the compile-time
        variant where ty is outside [lo, hi), else the general one."""
        statics = [s for s in range(ty_n) if not lo <= s < hi]
        if not statics:
            body(ty, None)
            return
        outside = b.or_(b.icmp_signed("<", ty, i64(lo)), b.icmp_signed(">=", ty, i64(hi)))
        with b.if_else(outside) as (then, otherwise):
            with then:
                for s_ in statics:
                    with b.if_then(b.icmp_signed("==", ty, i64(s_))):
                        body(i64(s_), s_)
            with otherwise:
                body(ty, None)

    if _winograd_blocked(c, oc, k.out_type):
        rp = _winograd_row_pitch(k.out_type)
        slot = 16 * (c + oc) * rp

        def tile_row(b, k2, ty, ex):
            ni, first = ex[0], ex[1]
            v0 = b.mul(first, i64(slot))  # this thread's slot (its first row's), reused for all its rows
            m0 = b.add(v0, i64(16 * c * rp))
            xplane = b.mul(ni, i64(c * h * w))
            with for_range(b, c, name="ci") as ci:
                dispatch(b, ty, in_lo, in_hi, lambda t_, s_: input_row(b, k2, ci, xplane, t_, s_, v0, rp))
            S = scratch(b, k2)
            with for_range(b, 16, name="e") as e:
                emit_gemm(b, k2.ins[1], b.mul(e, i64(oc * c)), c, S, b.add(v0, b.mul(e, i64(c * rp))), rp,
                          S, b.add(m0, b.mul(e, i64(oc * rp))), rp, oc, len(chunks) * vw, c, vw, F32)
            epi = _row_epilogue(k2, 2, 2) if epi_all is not None else None
            with for_range(b, oc, name="oc") as o:
                t = b.add(b.mul(ni, i64(oc)), o)
                dispatch(b, ty, 0, oh // 2, lambda t_, s_: output_row(b, k2, t, t_, s_, m0, rp, epi))

        with for_range(b, n, name="n") as ni:
            parallel(b, k, ty_n, tile_row, [ni], chunk_start=True)
        return

    def input_plane(b, k2, ci, ex):
        rows_of(b, lambda ty, sty: input_row(b, k2, ci, ex[0], ty, sty, b.mul(ty, i64(tx_n)), tp), in_lo, in_hi)

    def gemm(b, k2, t, ex):
        e, rb = b.sdiv(t, i64(row_blocks(oc, vw))), b.srem(t, i64(row_blocks(oc, vw)))
        S = scratch(b, k2)
        emit_gemm(b, k2.ins[1], b.mul(e, i64(oc * c)), c, S, b.mul(e, i64(c * tp)), tp,
                  S, b.add(i64(16 * c * tp), b.mul(e, i64(oc * tp))), tp, oc, -(-tiles // vw) * vw, c, vw, F32,
                  blocks=(rb, b.add(rb, i64(1))))

    def output_plane(b, k2, i, ex):
        t = b.add(b.mul(ex[0], i64(oc)), i)
        epi = _row_epilogue(k2, 2, 2) if epi_all is not None else None
        rows_of(b, lambda ty, sty: output_row(b, k2, t, ty, sty, b.add(i64(16 * c * tp), b.mul(ty, i64(tx_n))), tp,
                                              epi), 0, oh // 2)

    with for_range(b, n, name="n") as ni:
        parallel(b, k, c, input_plane, [b.mul(ni, i64(c * h * w))])
        parallel(b, k, 16 * row_blocks(oc, vw), gemm, [])
        parallel(b, k, oc, output_plane, [ni])


# -- depthwise convolution ---------------------------------------------------------------------
# Vectors of output columns per register block of the depthwise kernel: with a 3x3
# window, 4 x 9 multiply-adds per block hide the FMA latency and leave registers for
# the nine weight splats (AVX2: 4 + 9 + 2 of 16).
DW_BLOCK = 4


def depthwise(x: TensorType, w: TensorType, out: TensorType, attrs) -> bool:
    """Whether a conv runs as k_conv2d_depthwise: one input channel per group (any
    channel multiplier), f32 activations, sizes known at compile time."""
    shapes = (*x.shape, *w.shape, *out.shape)
    return (all(isinstance(s, int) for s in shapes) and attrs["groups"] == x.shape[1] and w.shape[1] == 1
            and x.dtype == out.dtype == "f32" and w.dtype in ("f32", "f16"))


def _dw_plane(b, k2: KernelArgs, t):
    """Output plane t (image * OC + channel) of a depthwise conv: the element offset of
    its input plane and its kh * kw weights (f32 values)."""
    (_, c, h, w), (oc, _, kh, kw) = k2.in_types[0].shape, k2.in_types[1].shape
    ni, o = b.sdiv(t, i64(oc)), b.srem(t, i64(oc))
    xplane = b.mul(b.add(b.mul(ni, i64(c)), b.sdiv(o, i64(oc // c))), i64(h * w))
    return xplane, [load(b, k2.ins[1], b.add(b.mul(o, i64(kh * kw)), i64(j)), k2.in_types[1].dtype)
                    for j in range(kh * kw)]


def _strided_load(b, X, index, width: int, stride: int):
    """X[index + j * stride] for j < width as one vector: a plain load for stride 1,
    else a load of width * stride values and a shuffle that keeps every stride-th."""
    vty = ir.VectorType(F32, width * stride)
    wide = b.load(b.bitcast(b.gep(X, [index], inbounds=True), vty.as_pointer()), align=4)
    if stride == 1:
        return wide
    return b.shuffle_vector(wide, ir.Constant(vty, ir.Undefined),
                            ir.Constant(ir.VectorType(ir.IntType(32), width), [j * stride for j in range(width)]))


# Output rows per register block of the masked depthwise kernel: with 32 registers
# (AVX-512) six rows' accumulators, the 3x3 window's weight splats and the loaded inputs
# fit; with 16 (AVX2), four.
DW_ROWS = {16: 6, 8: 4}
# Planes of at most this many (row, vector) pairs are emitted without a row loop.
DW_STATIC_VECTORS = 64


def _masked_mem(b, name: str, vty, args):
    """Call llvm.masked.load / llvm.masked.store (the form with the alignment operand)."""
    full = f"llvm.masked.{name}.v{vty.count}f32.p0"
    fn = b.module.globals.get(full)
    if fn is None:
        ret = vty if name == "load" else ir.VoidType()
        fn = ir.Function(b.module, ir.FunctionType(ret, [a.type for a in args]), name=full)
    return b.call(fn, args)


def _mask(bits) -> ir.Constant:
    return ir.Constant(ir.VectorType(ir.IntType(1), len(bits)), [int(v) for v in bits])


def _load_lanes(b, ptr, vty, valid):
    """The vector at ptr (a vty pointer), the lanes where `valid` is false read as 0
    and not touched in memory: a plain load where all are valid."""
    if all(valid):
        return b.load(ptr, align=4)
    return _masked_mem(b, "load", vty, [ptr, ir.Constant(ir.IntType(32), 4), _mask(valid),
                                        ir.Constant(vty, [0.0] * vty.count)])


def _store_lanes(b, v, ptr, count: int):
    """Store the first `count` lanes of v at ptr (a pointer to v's type)."""
    if count >= v.type.count:
        b.store(v, ptr, align=4)
    else:
        _masked_mem(b, "store", v.type, [v, ptr, ir.Constant(ir.IntType(32), 4),
                                         _mask([j < count for j in range(v.type.count)])])


def masked_vectors(vw: int) -> bool:
    """Whether kernels may use masked vector loads and stores: 256- and 512-bit vectors,
    which only x86 targets (AVX, AVX-512) have here; narrower targets would scalarise them."""
    return vw >= 8


def k_conv2d_depthwise_masked(b, k: KernelArgs):
    """A depthwise convolution for 256- and 512-bit vectors (x86: native masked loads and
    stores), one output plane per work item, in register blocks of up to DW_ROWS output
    rows by one vector of output columns: each input row
    the block reads is loaded once per tap column (a masked load where the taps leave the
    row: the zero padding comes from the mask, so no border columns are computed apart)
    and feeds every output row of the block that uses it. Rows whose window leaves the
    image are handled at compile time (the border blocks are unrolled, the others run in
    a loop); the last vector of a row is stored masked. The epilogue is applied in
    registers where its extra operands are one value per plane (a bias), else to each
    block once it is stored. `attrs["out_plane_pitch"]` (fuse_pw_dw: a band of output
    rows, stored into the whole result's planes): elements from one output plane to the
    next, where they are not oh * ow (the epilogue must then run in registers). Against
    the row kernel (k_conv2d_depthwise), MobileNetV2's
    depthwise convs at one thread on Zen 5: AVX-512 1.78 -> 0.51 ms; AVX2 code on the
    same core 0.82 -> 0.56 ms (not measured on an AVX2-only CPU)."""
    xt, wt = k.in_types[:2]
    n, _, h, w = xt.shape
    oc, _, kh, kw = wt.shape
    _, _, oh, ow = k.out_type.shape
    (sh, sw), (dh, dw), (pt, pl, _, _) = k.attrs["stride"], k.attrs["dilation"], k.attrs["pads"]
    vw = k.vw
    rows_per = DW_ROWS[min(vw, 16)]
    vty, wide = ir.VectorType(F32, vw), ir.VectorType(F32, vw * sw)
    chunks = list(range(0, ow, vw))
    y_lo, y_hi = _inside(h, oh, (kh - 1) * dh + 1, sh, pt)
    epi_all = _row_epilogue(k, 2, 2)
    in_regs = epi_all is not None and epi_all.in_registers
    keep = ir.Constant(ir.VectorType(ir.IntType(32), vw), [j * sw for j in range(vw)])

    def plane(b, k2, t, _):
        X, O = k2.ins[0], k2.out
        xplane, wts = _dw_plane(b, k2, t)
        wv = [_splat(b, v, vty) for v in wts]
        oplane = b.mul(t, i64(k.attrs.get("out_plane_pitch", oh * ow)))
        epi = _row_epilogue(k2, 2, 2) if epi_all is not None else None

        def block(y0, rows: int, first: int | None):
            """Output rows [y0, y0 + rows); `first` is y0 where it is known at compile
            time (a border block: its tap rows outside the image are skipped), else
            every tap row lies in the image."""
            for x0 in chunks:
                accs = [None] * rows
                for r_in in range((rows - 1) * sh + (kh - 1) * dh + 1):
                    users = [(r, ky) for r in range(rows) for ky in range(kh) if r * sh + ky * dh == r_in]
                    if not users:
                        continue
                    if first is not None and not 0 <= first * sh - pt + r_in < h:
                        continue
                    iy = b.add(b.mul(y0, i64(sh)), i64(r_in - pt))
                    rbase = b.add(xplane, b.mul(iy, i64(w)))
                    for kx in range(kw):
                        col = x0 * sw + kx * dw - pl
                        valid = [0 <= col + e < w for e in range(vw * sw)]
                        if not any(valid):
                            continue
                        ptr = b.bitcast(b.gep(X, [b.add(rbase, i64(col))], inbounds=True), wide.as_pointer())
                        xv = _load_lanes(b, ptr, wide, valid)
                        if sw > 1:
                            xv = b.shuffle_vector(xv, ir.Constant(wide, ir.Undefined), keep)
                        for r, ky in users:
                            p = b.fmul(wv[ky * kw + kx], xv, flags=("contract",))
                            accs[r] = p if accs[r] is None else b.fadd(accs[r], p, flags=("contract",))
                for r in range(rows):
                    acc = accs[r] if accs[r] is not None else ir.Constant(vty, [0.0] * vw)
                    at = b.add(b.mul(b.add(y0, i64(r)), i64(ow)), i64(x0))
                    if in_regs:
                        acc = epi.apply(b, t, at, acc)
                    _store_lanes(b, acc, b.bitcast(b.gep(O, [b.add(oplane, at)], inbounds=True), vty.as_pointer()),
                                 ow - x0)
            if epi is not None and not in_regs:
                epi(b, t, 1, b.mul(y0, i64(ow)), rows * ow)

        def static_blocks(y_from: int, y_to: int):
            count = y_to - y_from
            if count <= 0:
                return
            nb = -(-count // rows_per)
            for i in range(nb):
                r0, r1 = y_from + count * i // nb, y_from + count * (i + 1) // nb
                block(i64(r0), r1 - r0, r0)

        if oh * len(chunks) <= DW_STATIC_VECTORS:
            static_blocks(0, oh)
            return
        inner = (y_hi - y_lo) // rows_per
        static_blocks(0, y_lo)
        if inner:
            with for_range(b, i64(inner), name="yb") as yb:
                block(b.add(i64(y_lo), b.mul(yb, i64(rows_per))), rows_per, None)
        static_blocks(y_lo + inner * rows_per, oh)

    parallel(b, k, n * oc, plane)


def k_conv2d_depthwise(b, k: KernelArgs):
    """A depthwise convolution, one output plane per work item, row by row: the output
    row's columns whose taps all fall inside the input row (and whose strided loads stay
    in it) are built in vector registers, DW_BLOCK vectors at a time, from one vector
    load and one multiply-add per tap (no im2col, no read-modify-write of the output);
    the few border columns take the taps one by one with bounds checks, and rows whose
    window leaves the image skip those tap rows. Each finished row takes the epilogue
    while it is in cache."""
    xt, wt = k.in_types[:2]
    n, _, h, w = xt.shape
    oc, _, kh, kw = wt.shape
    _, _, oh, ow = k.out_type.shape
    (sh, sw), (dh, dw), (pt, pl, _, _) = k.attrs["stride"], k.attrs["dilation"], k.attrs["pads"]
    # output columns whose every tap (and strided load) lies inside the input row
    x_lo = min(ow, -(-pl // sw))
    x_hi = max(x_lo, min(ow, (w + pl - (kw - 1) * dw) // sw))
    y_lo, y_hi = _inside(h, oh, (kh - 1) * dh + 1, sh, pt)  # output rows whose taps all lie in the image
    vw = k.vw
    widths = []  # (width, vectors) of the static blocks after the DW_BLOCK loop
    span = x_hi - x_lo
    blocks = span // (DW_BLOCK * vw) if vw >= 4 else 0
    rest = span - blocks * DW_BLOCK * vw
    width = vw
    while width >= 4 and rest >= width:
        widths.append((width, rest // width))
        rest -= rest // width * width
        width //= 2
    x_vec_end = x_hi - rest
    epi_all = _row_epilogue(k, 2, 2)
    row_epi = epi_all is not None and epi_all.supports_cols
    zero = ir.Constant(F32, 0.0)

    def plane(b, k2, t, _):
        X, O = k2.ins[0], k2.out
        xplane, wts = _dw_plane(b, k2, t)
        oplane = b.mul(t, i64(oh * ow))
        epi = _row_epilogue(k2, 2, 2) if row_epi else None

        def row(y, checked: bool):
            taps = []  # per tap row: (in the image (i1) or None, the input row's element offset)
            for ky in range(kh):
                iy = b.add(b.mul(y, i64(sh)), i64(ky * dh - pt))
                ok = b.and_(b.icmp_signed(">=", iy, i64(0)), b.icmp_signed("<", iy, i64(h))) if checked else None
                taps.append((ok, b.add(xplane, b.mul(b.select(ok, iy, i64(0)) if checked else iy, i64(w)))))
            obase = b.add(oplane, b.mul(y, i64(ow)))

            def vector_block(x0, width, count):  # count vectors of width columns from output column x0
                vty = ir.VectorType(F32, width)
                accs = [alloca_in_entry(b, vty) for _ in range(count)]
                for a in accs:
                    b.store(ir.Constant(vty, [0.0] * width), a)
                splats = {}
                for ky, (ok, rbase) in enumerate(taps):
                    def tap_row():
                        for kx in range(kw):
                            wv = splats.setdefault((ky, kx, width), _splat(b, wts[ky * kw + kx], vty))
                            at = b.add(rbase, b.add(b.mul(x0, i64(sw)), i64(kx * dw - pl)))
                            for v, a in enumerate(accs):
                                xv = _strided_load(b, X, b.add(at, i64(v * width * sw)), width, sw)
                                b.store(b.fadd(b.load(a), b.fmul(wv, xv, flags=("contract",)),
                                               flags=("contract",)), a)
                    if ok is None:
                        tap_row()
                    else:
                        with b.if_then(ok):
                            splats.clear()  # values made inside the branch do not dominate later code
                            tap_row()
                        splats.clear()
                for v, a in enumerate(accs):
                    dst = b.gep(O, [b.add(obase, b.add(x0, i64(v * width)))], inbounds=True)
                    b.store(b.load(a), b.bitcast(dst, vty.as_pointer()), align=4)

            def scalar_cols(x_from: int, x_to: int):
                if x_to <= x_from:
                    return
                with for_range(b, i64(x_to), start=i64(x_from), name="xs") as x:
                    acc = alloca_in_entry(b, F32)
                    b.store(zero, acc)
                    for ky, (ok, rbase) in enumerate(taps):
                        def tap_row():
                            for kx in range(kw):
                                ix = b.add(b.mul(x, i64(sw)), i64(kx * dw - pl))
                                inside = b.and_(b.icmp_signed(">=", ix, i64(0)), b.icmp_signed("<", ix, i64(w)))
                                v = load(b, X, b.add(rbase, b.select(inside, ix, i64(0))), "f32")
                                v = b.select(inside, v, zero)
                                b.store(b.fadd(b.load(acc), b.fmul(wts[ky * kw + kx], v, flags=("contract",)),
                                               flags=("contract",)), acc)
                        if ok is None:
                            tap_row()
                        else:
                            with b.if_then(ok):
                                tap_row()
                    store(b, b.load(acc), O, b.add(obase, x), "f32")

            scalar_cols(0, x_lo)
            if blocks:
                with for_range(b, i64(blocks), name="xb") as xb:
                    vector_block(b.add(i64(x_lo), b.mul(xb, i64(DW_BLOCK * vw))), vw, DW_BLOCK)
            x0 = x_lo + blocks * DW_BLOCK * vw
            for width, count in widths:
                vector_block(i64(x0), width, count)
                x0 += width * count
            scalar_cols(x_vec_end, ow)
            if epi is not None:
                epi(b, t, 1, b.mul(y, i64(ow)), ow)

        for y0, y1, checked in ((0, y_lo, True), (y_lo, y_hi, False), (y_hi, oh, True)):
            if y1 > y0:
                with for_range(b, i64(y1), start=i64(y0), name="y") as y:
                    row(y, checked)

    parallel(b, k, n * oc, plane)
    if epi_all is not None and not row_epi:
        _epilogue(b, k, 2)


# -- pooling ---------------------------------------------------------------------------------
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
        raise BackendError("a max pool over plane pairs needs windows that overlap the image (qkernels.passes_pairs)")

    def plane(b, k2, nc):
        X, O = k2.ins[0], k2.out
        xplane = b.mul(nc, i64(h * w))
        with for_range(b, oh, name="y") as y:
            with for_range(b, ow, name="x") as x:
                isf = dt in ("f32", "f16", "f64")
                low = fconst(dt, -np.inf) if isf else _int_reduce_init(dt, "max")
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
    _rows_parallel(b, k, n * c, oh * ow * kh * kw, plane)


def _max_pool_clamped(b, k: KernelArgs):
    """Float max pooling of dilation 1 whose windows all overlap the image (pads smaller
    than the kernel): a tap outside the image is moved to the nearest row / column
    inside, which is in the same window, and max ignores repeats, so there are no masks.
    Per output row the kh row offsets are clamped once; the columns whose taps are all
    inside (the interior) load without clamping.
    `out_pairs` (qkernels.passes_pairs): input and result are plane pairs of bf16 codes
    (the types: half the planes of 32-bit elements); each element's two codes are
    widened to f32, maxed apart and joined again (exact: they are bf16 values)."""
    n, c, h, w = k.in_types[0].shape
    _, _, oh, ow = k.out_type.shape
    (kh, kw), (sh, sw), (pt, pl, _, _) = k.attrs["kernel"], k.attrs["stride"], k.attrs["pads"]
    dt = k.out_type.dtype
    x_lo, x_hi = _inside(w, ow, kw, sw, pl)
    pairs = bool(k.attrs.get("out_pairs"))
    if pairs and dt != "f32":
        raise BackendError("a max pool over plane pairs needs f32 types")

    def plane(b, k2, nc):
        X, O = k2.ins[0], k2.out
        xplane = b.mul(nc, i64(h * w))
        with for_range(b, oh, name="y") as y:
            rows = [b.add(xplane, b.mul(_imin(b, _imax(b, b.add(b.mul(y, i64(sh)), i64(i - pt)), i64(0)),
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
                            ix = _imin(b, _imax(b, ix, i64(0)), i64(w - 1))
                        for r in rows:
                            v = load(b, X, b.add(r, ix), dt)
                            v = (pair_half(b, v, 0), pair_half(b, v, 1)) if pairs else (v,)
                            best = v if best is None else tuple(_fmax(b, m, u) for m, u in zip(best, v))
                    store(b, pair_join(b, *best) if pairs else best[0], O, b.add(orow, x), dt)
            columns(0, x_lo, True)
            columns(x_lo, x_hi, False)
            columns(x_hi, ow, True)
    _rows_parallel(b, k, n * c, oh * ow * kh * kw, plane)


def _window_table(b, name, entries):
    """A private constant i64 table, returned as a pointer."""
    arr_t = ir.ArrayType(I64, len(entries))
    gv = ir.GlobalVariable(b.module, arr_t, name=b.module.get_unique_name(name))
    gv.linkage = "private"
    gv.global_constant = True
    gv.initializer = ir.Constant(arr_t, [int(e) for e in entries])
    return b.bitcast(gv, I64.as_pointer())


def _pool_sum(b, X, xplane, w, h0, h1, w0, w1, dt):
    acc = alloca_in_entry(b, F32)
    b.store(fconst("f32", 0.0), acc)
    with for_range(b, h1, start=h0, name="wy") as iy:
        rbase = b.add(xplane, b.mul(iy, i64(w)))
        with for_range(b, w1, start=w0, name="wx") as ix:
            v = load(b, X, b.add(rbase, ix), dt)
            b.store(b.fadd(b.load(acc), v, flags=REDUCE), acc)
    return b.load(acc)


def _emit_window_pool(b, k: KernelArgs, rows, cols, divisors):
    """Average over per-output windows given by static tables (start, end) and divisors."""
    n, c, h, w = k.in_types[0].shape
    _, _, oh, ow = k.out_type.shape
    X, O, dt = k.ins[0], k.out, k.out_type.dtype
    rt = _window_table(b, "rows", [v for r in rows for v in r[:2]])
    ct = _window_table(b, "cols", [v for r in cols for v in r[:2]])
    divt = b.bitcast(_float_table(b, "div", divisors), F32.as_pointer())
    with for_range(b, n * c, name="nc") as nc:
        xplane = b.mul(nc, i64(h * w))
        with for_range(b, oh, name="y") as y:
            h0 = b.load(b.gep(rt, [b.mul(y, i64(2))]))
            h1 = b.load(b.gep(rt, [b.add(b.mul(y, i64(2)), i64(1))]))
            with for_range(b, ow, name="x") as x:
                w0 = b.load(b.gep(ct, [b.mul(x, i64(2))]))
                w1 = b.load(b.gep(ct, [b.add(b.mul(x, i64(2)), i64(1))]))
                s = _pool_sum(b, X, xplane, w, h0, h1, w0, w1, dt)
                d = b.load(b.gep(divt, [b.add(b.mul(y, i64(ow)), x)]))
                store(b, b.fdiv(s, d), O, b.add(b.mul(nc, i64(oh * ow)), b.add(b.mul(y, i64(ow)), x)), dt)


def _float_table(b, name, entries):
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
    _emit_window_pool(b, k, rows, cols, divisors)


def _global_avg_pool(b, k: KernelArgs):
    """out[plane] = sum(plane) / (h * w) for every contiguous f32 input plane: vw lanes
    of partial sums (_row_reduce_vec), the planes split across the threads."""
    _, _, h, w = k.in_types[0].shape
    n = h * w

    def plane(b, k2, r):
        s = _row_reduce_vec(b, k2.ins[0], b.mul(r, i64(n)), n, k2.vw, 0.0,
                            lambda bb, a, v: bb.fadd(a, v, flags=REDUCE))
        b.store(b.fdiv(s, fconst("f32", float(n))), b.gep(k2.out, [r], inbounds=True))
    _rows_parallel(b, k, k.out_type.numel, n, plane)


def k_adaptive_avg_pool2d(b, k: KernelArgs):
    _, _, h, w = k.in_types[0].shape
    _, _, oh, ow = k.out_type.shape
    if (oh, ow) == (1, 1) and k.out_type.dtype == "f32" and isinstance(k.out_type.numel, int) and h * w >= k.vw:
        return _global_avg_pool(b, k)
    rows, cols = adaptive_ranges(h, oh), adaptive_ranges(w, ow)
    divisors = [(r[1] - r[0]) * (c_[1] - c_[0]) for r in rows for c_ in cols]
    _emit_window_pool(b, k, rows, cols, divisors)


# -- rows: softmax, layer norm ---------------------------------------------------------------
def _rows(shape, axis):
    return prod(shape[:axis]), shape[axis], prod(shape[axis + 1:])


def _fmax(b, a, v):
    """max for reductions: NaN propagates (as in torch); written as compare + select,
    a form LLVM's vectoriser handles without tripping over maxnum's cost model."""
    return b.select(b.fcmp_unordered(">", v, a), v, a)


def _fmin(b, a, v):
    return b.select(b.fcmp_unordered("<", v, a), v, a)


def _reduce_loop(b, count, init, step_fn, name):
    acc = alloca_in_entry(b, init.type)
    b.store(init, acc)
    with for_range(b, count, name=name) as j:
        b.store(step_fn(b, b.load(acc), j), acc)
    return b.load(acc)


def _rows_parallel(b, k: KernelArgs, rows, row_len, row):
    """row(b, k2, r) for r in [0, rows): across the runtime's threads where the rows
    hold at least PARALLEL_MIN_ELEMENTS values (row must use only k2's pointers)."""
    if rows == 1 or upper(rows * row_len) < PARALLEL_MIN_ELEMENTS:
        with for_range(b, rows, name="r") as r:
            row(b, k, r)
        return
    parallel(b, k, rows, lambda bb, k2, r, _: row(bb, k2, r))


def _row_reduce_vec(b, X, base, n: int, vw: int, identity: float, op):
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
    m = _lanes_fold(b, b.load(acc), op)
    for j in range(n // vw * vw, n):
        m = op(b, m, load(b, X, b.add(base, i64(j)), "f32"))
    return m


def _row_max_vec(b, X, base, n: int, vw: int):
    """max of the f32 row X[base : base + n] (n >= vw), NaN propagating (_fmax)."""
    return _row_reduce_vec(b, X, base, n, vw, float("-inf"), _fmax)


# Softmax rows of at most this many vectors are held in registers (one load, one store
# per element), SOFTMAX_ROWS rows at a time: their reductions (a max and a sum, each a
# tree over the vectors, then over the lanes) are short dependency chains that the
# rows' independent work overlaps.
SOFTMAX_VECTORS = 16
SOFTMAX_ROWS = 2


def _tree(b, vals, op):
    """op-fold of vals (a list) as a balanced tree."""
    while len(vals) > 1:
        vals = [op(b, vals[i], vals[i + 1]) if i + 1 < len(vals) else vals[i] for i in range(0, len(vals), 2)]
    return vals[0]


def _lanes_fold(b, v, op):
    """op-fold of the lanes of vector v, halving: a scalar."""
    width = v.type.count
    while width > 1:
        width //= 2
        halves = [b.shuffle_vector(v, v, ir.Constant(ir.VectorType(ir.IntType(32), width),
                                                      list(range(at, at + width)))) for at in (0, width)]
        v = op(b, halves[0], halves[1])
    return b.extract_element(v, ir.Constant(ir.IntType(32), 0))


def _softmax_in_registers(n, vw: int) -> bool:
    """Whether softmax rows of n f32 stay in registers (_softmax_rows_in_registers)."""
    return isinstance(n, int) and vw > 1 and n % vw == 0 and 0 < n // vw <= SOFTMAX_VECTORS


def _softmax_rows_in_registers(b, X, O, vw: int, r0, count: int, n: int):
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
    mx = [_splat(b, _lanes_fold(b, _tree(b, row, _fmax), _fmax), vty) for row in xs]
    es = [[b.call(exp, [b.fsub(x, m)]) for x in row] for row, m in zip(xs, mx)]
    sums = [_lanes_fold(b, _tree(b, row, add), add) for row in es]
    for r, (row, s) in enumerate(zip(es, sums)):
        inv = _splat(b, b.fdiv(fconst("f32", 1.0), s), vty)
        for c, e in enumerate(row):
            b.store(b.fmul(e, inv), ptr(O, r, c), align=4)


def k_softmax(b, k: KernelArgs):
    outer, n, inner = _rows(k.out_type.shape, k.attrs["axis"])
    dt = k.out_type.dtype
    log = k.attrs.get("_log", False)
    if inner == 1 and dt == "f32" and not log and isinstance(outer, int) and _softmax_in_registers(n, k.vw):
        groups, ragged = outer // SOFTMAX_ROWS, outer % SOFTMAX_ROWS

        def rows(b, k2, g):
            def run(r0, count):
                _softmax_rows_in_registers(b, k2.ins[0], k2.out, k2.vw, r0, count, n)
            if not ragged:
                run(b.mul(g, i64(SOFTMAX_ROWS)), SOFTMAX_ROWS)
                return
            with b.if_else(b.icmp_signed("<", g, i64(groups))) as (whole, rest):
                with whole:
                    run(b.mul(g, i64(SOFTMAX_ROWS)), SOFTMAX_ROWS)
                with rest:
                    run(i64(groups * SOFTMAX_ROWS), ragged)
        _rows_parallel(b, k, groups + (1 if ragged else 0), n * SOFTMAX_ROWS, rows)
        return
    _rows_parallel(b, k, outer * inner, n, lambda b, k2, r: _softmax_row(b, k2.ins[0], k2.out, k2.vw, r, n, inner,
                                                                           dt, log))


def _softmax_row(b, X, O, vw: int, r, n, inner, dt, log: bool):
    """Softmax (or log-softmax) row r (i64) of X into O: n values `inner` apart."""
    exp = lambda v: b.call(get_math(b.module, "exp"), [v])  # noqa: E731
    base = b.add(b.mul(b.sdiv(r, i64(inner)), i64(n * inner)), b.srem(r, i64(inner)))
    at = lambda j: b.add(base, b.mul(j, i64(inner)))  # noqa: E731
    if inner == 1 and dt == "f32" and isinstance(n, int) and n >= 2 * vw:
        mx = _row_max_vec(b, X, base, n, vw)
    else:
        mx = _reduce_loop(b, n, fconst(dt, -np.inf), lambda bb, a, j: _fmax(
            bb, a, load(bb, X, at(j), dt)), "m")
    if log:
        s = _reduce_loop(b, n, fconst(dt, 0.0), lambda bb, a, j: bb.fadd(
            a, exp(bb.fsub(load(bb, X, at(j), dt), mx)), flags=REDUCE), "s")
        lse = b.fadd(mx, b.call(get_math(b.module, "log"), [s]))
        with for_range(b, n, name="w") as j:
            store(b, b.fsub(load(b, X, at(j), dt), lse), O, at(j), dt)
    else:
        # exp into O, then the sum of O: two plain loops (measured ~10% faster than
        # exp, store and sum in one, on 512-wide rows)
        with for_range(b, n, name="e") as j:
            store(b, exp(b.fsub(load(b, X, at(j), dt), mx)), O, at(j), dt)
        s = _reduce_loop(b, n, fconst(dt, 0.0), lambda bb, a, j: bb.fadd(a, load(bb, O, at(j), dt),
                                                                          flags=REDUCE), "s")
        inv = b.fdiv(fconst(dt, 1.0), s)
        with for_range(b, n, name="w") as j:
            store(b, b.fmul(load(b, O, at(j), dt), inv), O, at(j), dt)


# The fused attention's stack buffer of scores (each thread's block of query rows, at
# most a micro-tile's height of them), small enough for any thread's stack (wasm's 1 MiB
# included): long key sequences take fewer rows a block.
ATTENTION_BUF_BYTES = 32 << 10


def k_attention(b, k: KernelArgs):
    """cuvil.attention per (batch, block of R query rows): scores = q @ kt into a stack
    buffer (emit_gemm), the scores' program applied to it in vectors, softmax of its rows
    in place (in registers where they fit), then out rows = buffer @ v: the score matrix
    is never written out, and each block's scores stay in L1."""
    from ...ir.ops.nn import Attention
    qt, ktt, vt = k.in_types[:3]
    s_len, d = qt.shape[-2:]
    sk, dv = ktt.shape[-1], vt.shape[-1]
    batch = prod(qt.shape[:-2])
    vw = k.vw
    rows_max = max(1, min(micro_shape(vw)[0], s_len, ATTENTION_BUF_BYTES // (4 * sk)))
    blocks = -(-s_len // rows_max)
    scores_t = Attention.scores_type(k.in_types)
    vty, one = ir.VectorType(F32, vw), ir.VectorType(F32, 1)

    def item(b, k2, t, _):
        bi, blk = b.sdiv(t, i64(blocks)), b.srem(t, i64(blocks))
        slot = alloca_in_entry(b, ir.ArrayType(F32, rows_max * sk))
        slot.align = 64
        buf = b.bitcast(slot, F32.as_pointer())
        epi = _row_epilogue(replace(k2, out_type=scores_t), 3, scores_t.rank - 1)
        if epi is not None and not hasattr(epi, "apply"):
            raise BackendError("cuvil.attention: the scores' program does not run on vectors")

        def rows_of(r0, rows: int):
            grow = b.add(b.mul(bi, i64(s_len)), r0)  # the block's first row of q / of the scores
            emit_gemm(b, k2.ins[0], b.mul(grow, i64(d)), d, k2.ins[1], b.mul(bi, i64(d * sk)), sk, buf, i64(0), sk,
                      rows, sk, d, vw, F32)
            if epi is not None:
                for r in range(rows):
                    for c in range(0, sk - sk % vw, vw):
                        ptr = b.bitcast(b.gep(buf, [i64(r * sk + c)], inbounds=True), vty.as_pointer())
                        b.store(epi.apply(b, b.add(grow, i64(r)), i64(c), b.load(ptr, align=4)), ptr, align=4)
                    for c in range(sk - sk % vw, sk):  # the tail, as one-lane vectors
                        ptr = b.bitcast(b.gep(buf, [i64(r * sk + c)], inbounds=True), one.as_pointer())
                        b.store(epi.apply(b, b.add(grow, i64(r)), i64(c), b.load(ptr, align=4)), ptr, align=4)
            if _softmax_in_registers(sk, vw):
                for r in range(0, rows, SOFTMAX_ROWS):
                    _softmax_rows_in_registers(b, buf, buf, vw, i64(r), min(SOFTMAX_ROWS, rows - r), sk)
            else:
                with for_range(b, rows, name="sr") as r:
                    _softmax_row(b, buf, buf, vw, r, sk, 1, "f32", False)
            emit_gemm(b, buf, i64(0), sk, k2.ins[2], b.mul(bi, i64(sk * dv)), dv, k2.out, b.mul(grow, i64(dv)), dv,
                      rows, dv, sk, vw, F32)

        last = s_len - (blocks - 1) * rows_max
        if last == rows_max:
            rows_of(b.mul(blk, i64(rows_max)), rows_max)
        else:
            with b.if_else(b.icmp_signed("<", blk, i64(blocks - 1))) as (whole, short):
                with whole:
                    rows_of(b.mul(blk, i64(rows_max)), rows_max)
                with short:
                    rows_of(i64((blocks - 1) * rows_max), last)
    parallel(b, k, batch * blocks, item)


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
        s = _reduce_loop(b, d, fconst(dt, 0.0), lambda bb, a, j: bb.fadd(a, load(bb, X, bb.add(base, j), dt),
                                                                          flags=REDUCE), "s")
        mean = b.fdiv(s, fsize(b, dt, d))

        def sq(bb, a, j):
            t = bb.fsub(load(bb, X, bb.add(base, j), dt), mean)
            return bb.fadd(a, bb.fmul(t, t), flags=REDUCE)
        var = b.fdiv(_reduce_loop(b, d, fconst(dt, 0.0), sq, "v"), fsize(b, dt, d))
        rstd = b.fdiv(fconst(dt, 1.0), intrinsic(b, "llvm.sqrt", [b.fadd(var, fconst(dt, k.attrs["eps"]))]))
        with for_range(b, d, name="w") as j:
            y = b.fmul(b.fsub(load(b, X, b.add(base, j), dt), mean), rstd)
            if Wt is not None:
                y = b.fmul(y, load(b, Wt, j, dt), flags=("contract",))
            if Bt is not None:
                y = b.fadd(y, load(b, Bt, j, dt), flags=("contract",))
            store(b, y, O, b.add(base, j), dt)
    _rows_parallel(b, k, rows, d, row)


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


# -- reductions ------------------------------------------------------------------------------
def _int_reduce_init(dt: str, kind: str) -> ir.Constant:
    """The identity of an integer sum/max/min in the dtype's own range."""
    ty = REG_TYPES[dt]
    if kind in ("sum", "mean"):
        return ir.Constant(ty, 0)
    unsigned = dt in ("bool", "u8")
    lo, hi = (0, (1 << ty.width) - 1) if unsigned else (-(1 << (ty.width - 1)), (1 << (ty.width - 1)) - 1)
    return ir.Constant(ty, lo if kind == "max" else hi)


def _reduce_kernel(kind):
    def emit(b, k: KernelArgs):
        xt = k.in_types[0]
        axes = k.attrs["axes"]
        dt = xt.dtype
        kept = [i for i in range(xt.rank) if i not in axes]
        xs = contiguous_strides(xt.shape)
        count = prod(xt.shape[a] for a in axes)
        isf = dt in ("f32", "f16", "f64")
        init = {"sum": 0.0, "mean": 0.0, "max": -np.inf, "min": np.inf}[kind]
        init_v = fconst(dt, init) if isf else _int_reduce_init(dt, kind)
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
                elif isf:
                    r = _fmax(b, a, v) if kind == "max" else _fmin(b, a, v)
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


# -- data movement ---------------------------------------------------------------------------
def _copy(b, out, out_dt, shape, out_strides, out_off, src, src_strides, src_off):
    views = [View(out, out_dt, out_strides, out_off), View(src, out_dt, src_strides, src_off)]
    loop_nest(b, shape, views, lambda bb, idx: store(bb, load(bb, src, idx[1], out_dt), out, idx[0], out_dt))


def k_copy(b, k: KernelArgs):  # reshape (when not aliased) and identity copies
    n = k.out_type.numel
    _copy(b, k.out, k.out_type.dtype, [n], [1], 0, k.ins[0], [1], 0)


def _parallel_ranges(b, k: KernelArgs, count: int, elements: int, body):
    """body(b, k2, (begin, end)) over [0, count) split across the threads in contiguous
    ranges, or serially where the op moves fewer than PARALLEL_MIN_ELEMENTS values."""
    if elements < PARALLEL_MIN_ELEMENTS:
        body(b, k, (i64(0), i64(count)))
        return
    parallel(b, k, count, lambda bb, k2, rng, _: body(bb, k2, rng), ranges=True)


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
    _parallel_ranges(b, k, prod(shape[:-1]), prod(shape), body)


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
            for ii, v in enumerate(_vector_transpose(b, got)):
                b.store(v, b.bitcast(b.gep(k2.out, [b.add(dst0, i64(ii * shape[-1]))], inbounds=True),
                                     vty.as_pointer()), align=4)
    _parallel_ranges(b, k, prod(outer) * rows * cols, prod(shape), body)


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
    split = _outer_split(shape)
    if not split:
        _copy(b, k.out, xt.dtype, shape, strides[0], 0, k.ins[0], strides[1], 0)
        return

    def body(b, k2, i, _):  # the outer dims across the threads, the inner ones copied
        oo, io = flat_offsets(b, i, shape[:split], [st[:split] for st in strides])
        _copy(b, k2.out, xt.dtype, shape[split:], strides[0][split:], oo, k2.ins[0], strides[1][split:], io)
    parallel(b, k, prod(shape[:split]), body)


def k_broadcast_to(b, k: KernelArgs):
    shape = k.out_type.shape
    _copy(b, k.out, k.out_type.dtype, shape, contiguous_strides(shape), 0, k.ins[0],
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
    _copy(b, k.out, xt.dtype, k.out_type.shape, contiguous_strides(k.out_type.shape), 0, k.ins[0],
          [st * step for st, step in zip(xs, k.attrs["steps"])], off)


def k_concat(b, k: KernelArgs):
    ax = k.attrs["axis"]
    ot = k.out_type
    os_ = contiguous_strides(ot.shape)
    start = 0
    for p, t in zip(k.ins, k.in_types):
        _copy(b, k.out, ot.dtype, t.shape, os_, start * os_[ax], p, contiguous_strides(t.shape), 0)
        start += t.shape[ax]


def k_pad(b, k: KernelArgs):
    ot, xt = k.out_type, k.in_types[0]
    dt = ot.dtype
    val = fconst(dt, k.attrs["value"]) if dt in ("f32", "f16", "f64") else ir.Constant(REG_TYPES[dt], int(k.attrs["value"]))
    with for_range(b, ot.numel, name="f") as i:
        store(b, val, k.out, i, dt)
    os_ = contiguous_strides(ot.shape)
    off = sum(lo * s for (lo, _), s in zip(k.attrs["pads"], os_))
    _copy(b, k.out, dt, xt.shape, os_, off, k.ins[0], contiguous_strides(xt.shape), 0)


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
    hi = _window_table(b, "ry", [v for t in th for v in t[:2]])
    wi = _window_table(b, "rx", [v for t in tw for v in t[:2]])
    hf = b.bitcast(_float_table(b, "fy", [t[2] for t in th]), F32.as_pointer())
    wf = b.bitcast(_float_table(b, "fx", [t[2] for t in tw]), F32.as_pointer())
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


EMITTERS = {
    "cuvil.dim": k_dim,
    "cuvil.fused": k_fused,
    "cuvil.matmul": k_matmul,
    "cuvil.conv2d": k_conv2d,
    "cuvil.max_pool2d": k_max_pool2d,
    "cuvil.avg_pool2d": k_avg_pool2d,
    "cuvil.adaptive_avg_pool2d": k_adaptive_avg_pool2d,
    "cuvil.softmax": k_softmax,
    "cuvil.attention": k_attention,
    "cuvil.log_softmax": k_log_softmax,
    "cuvil.layer_norm": k_layer_norm,
    "cuvil.batch_norm": k_batch_norm,
    "cuvil.reduce_sum": _reduce_kernel("sum"),
    "cuvil.reduce_mean": _reduce_kernel("mean"),
    "cuvil.reduce_max": _reduce_kernel("max"),
    "cuvil.reduce_min": _reduce_kernel("min"),
    "cuvil.reshape": k_copy,
    "cuvil.transpose": k_transpose,
    "cuvil.broadcast_to": k_broadcast_to,
    "cuvil.slice": k_slice,
    "cuvil.concat": k_concat,
    "cuvil.pad": k_pad,
    "cuvil.gather": k_gather,
    "cuvil.resize": k_resize,
}
