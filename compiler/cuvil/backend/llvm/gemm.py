"""Register-blocked GEMM: C[M, N] = A[M, K] @ B[K, N].

M, N and K are ints or runtime sizes (symbolic dims, see symbolic.py): a runtime M
picks the last, partial row block's height at run time among the MR - 1 variants; a
runtime N runs its ragged columns one vector, then one column at a time.

The micro-kernel keeps an MR x (NV * VW) block of C in vector registers across the whole
K loop: each step loads NV vectors of one B row, broadcasts MR values of A, and does
MR * NV multiply-adds (fused to FMA where the target has it). VW comes from the target's
vector width; edges use smaller tiles and a scalar tail. Row blocks of C are finished
(with the caller's epilogue) while they are still in cache.
"""
from __future__ import annotations

from llvmlite import ir

from .emit import i64, round_bf16
from .loops import alloca_in_entry, for_range
from .symbolic import is_runtime
from .vectors import imin

CONTRACT = ("contract",)


def vec_ptr(b, ptr, index, vty):
    return b.bitcast(b.gep(ptr, [index], inbounds=True), vty.as_pointer())


def splat(b, x, vty):
    undef = ir.Constant(vty, ir.Undefined)
    v = b.insert_element(undef, x, ir.Constant(ir.IntType(32), 0))
    return b.shuffle_vector(v, undef, ir.Constant(ir.VectorType(ir.IntType(32), vty.count), [0] * vty.count))


def _is_half(ptr) -> bool:
    return isinstance(ptr.type.pointee, ir.HalfType)


def _is_bf16(ptr) -> bool:
    """An i16 operand of these f32 GEMMs holds bfloat16 bits (`precision: bf16` weights)."""
    return ptr.type.pointee == ir.IntType(16)


def _elem_bytes(ptr) -> int:
    return 2 if _is_half(ptr) or _is_bf16(ptr) else 4


def bf16_panel_order(nr: int, vw: int):
    """Where each of a bfloat16 panel row's nr columns is stored: the vectors in pairs,
    the two interleaved (column i of the first, then column i of the second), so one
    load of a pair read as vw i32 lanes gives the first vector by a shift and the second
    by a mask (_ld_bf16_row); an odd last vector stays as it is. Returns the column held
    at each stored position."""
    order = []
    for v in range(0, nr // vw - 1, 2):
        for i in range(vw):
            order += [v * vw + i, (v + 1) * vw + i]
    return order + list(range(len(order), nr))


def _ld_bf16_row(b, ptr, index, nv, vw):
    """The nv f32 vectors of a bfloat16 panel row stored at index in bf16_panel_order."""
    i32v, fty = ir.VectorType(ir.IntType(32), vw), ir.VectorType(ir.FloatType(), vw)
    out = []
    for v in range(0, nv - 1, 2):
        pairs = b.load(b.bitcast(b.gep(ptr, [b.add(index, i64(v * vw))], inbounds=True), i32v.as_pointer()), align=4)
        out.append(b.bitcast(b.shl(pairs, ir.Constant(i32v, [16] * vw)), fty))
        out.append(b.bitcast(b.and_(pairs, ir.Constant(i32v, [-65536] * vw)), fty))
    if nv % 2:
        out.append(_ld_vec(b, ptr, b.add(index, i64((nv - 1) * vw)), fty))
    return out


def emit_round_run(b, src, dst, begin, count, vw):
    """dst[begin : begin + count] = src[...] rounded to bfloat16 (round_bf16; f32
    pointers, may be the same): whole vectors, then a scalar tail."""
    vty = ir.VectorType(ir.FloatType(), vw)
    whole = b.sdiv(count, i64(vw)) if not isinstance(count, int) else i64(count // vw)
    with for_range(b, whole, name="rv") as v:
        at = b.add(begin, b.mul(v, i64(vw)))
        b.store(round_bf16(b, b.load(vec_ptr(b, src, at, vty), align=4)), vec_ptr(b, dst, at, vty), align=4)
    tail = b.srem(count, i64(vw)) if not isinstance(count, int) else i64(count % vw)
    with for_range(b, tail, name="rt") as j:
        at = b.add(b.add(begin, b.mul(whole, i64(vw))), j)
        b.store(round_bf16(b, b.load(b.gep(src, [at], inbounds=True))), b.gep(dst, [at], inbounds=True))


def _ld(b, ptr, index):
    """A scalar operand load; fp16 weights are widened to f32 (bf16 ones are only ever
    read as whole panel rows, _ld_bf16_row)."""
    v = b.load(b.gep(ptr, [index], inbounds=True))
    return b.fpext(v, ir.FloatType()) if _is_half(ptr) else v


def _ld_vec(b, ptr, index, vty):
    """A vector of vty.count operand values starting at index (fp16 / bf16 widened)."""
    if _is_half(ptr):
        hty = ir.VectorType(ir.HalfType(), vty.count)
        return b.fpext(b.load(vec_ptr(b, ptr, index, hty), align=2), vty)
    if _is_bf16(ptr):  # exact: a bf16 is the top half of an f32
        bits = b.load(vec_ptr(b, ptr, index, ir.VectorType(ir.IntType(16), vty.count)), align=2)
        ity = ir.VectorType(ir.IntType(32), vty.count)
        return b.bitcast(b.shl(b.zext(bits, ity), ir.Constant(ity, [16] * vty.count)), vty)
    return b.load(vec_ptr(b, ptr, index, vty), align=4)


# Tiles of at least this many rows prefetch the next panel of a packed B: they do enough
# multiply-adds per B row to hide the extra loads. Thinner ones (a GEMV: the MLP at batch
# 1, slower with them) leave it to the hardware prefetcher.
PREFETCH_ROWS = 4


def prefetch_run(b, ptr, index, count: int, elem_bytes: int):
    """Ask for the cache lines of ptr[index : index + count] in L2, one prefetch per
    64-byte line (a hint: no fault, no effect on the result)."""
    i32, i8p = ir.IntType(32), ir.IntType(8).as_pointer()
    fn = b.module.globals.get("llvm.prefetch.p0i8") or ir.Function(
        b.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), name="llvm.prefetch.p0i8")
    for e in range(0, count, 64 // elem_bytes):
        at = b.gep(ptr, [b.add(index, i64(e))])  # not inbounds: past the last panel it may leave the blob
        b.call(fn, [b.bitcast(at, i8p), ir.Constant(i32, 0), ir.Constant(i32, 2), ir.Constant(i32, 1)])


def _tile(b, A, a_row0, lda, B, b_off, ldb, C, c_row0, ldc, j0, K, mr, nv, vw, ety, c_j0=None,
          valid=None, post=None, ldk=1, ahead=None, accumulate=False, round_a=False, store=None):
    """One mr x (nv*vw) tile at rows starting a_row0/c_row0 (i64 element offsets) and
    column j0 (i64) of B; C's column is c_j0 (default j0). A's element (row r, k) is at
    a_row0 + r*lda + k*ldk (ldk = 1: row-major; lda = 1: A stored transposed). `valid`
    (int < nv*vw) stores only that many leading columns (a zero-padded packed panel).
    `post(b, r, col, vec)` maps each whole accumulator vector (tile row r, C column col)
    before it is stored.
    `ahead` (i64 element offset from B's row k): each k step also prefetches that row of
    the next panel, so a packed B streamed from memory arrives before it is needed.
    `accumulate`: add the product to C's tile (whole vectors) instead of overwriting it.
    `round_a`: A's values are rounded to bfloat16 as they are read (`precision: bf16`).
    `store(b, vals)`: the finished tile's vectors (vals[r][v]) go there instead of into C."""
    vty = ir.VectorType(ety, vw)
    # A thin tile (a GEMV, the last rows of a block) has too few accumulators to cover the
    # FMA latency: it then sums `ks` interleaved k phases in separate accumulators.
    ks = k_phases(mr * nv) if isinstance(K, int) and K >= 2 * k_phases(mr * nv) else 1
    sets = [[[alloca_in_entry(b, vty) for _ in range(nv)] for _ in range(mr)] for _ in range(ks)]
    accs = sets[0]
    zero = ir.Constant(vty, [0.0] * vw)
    for si, acc_set in enumerate(sets):
        for r, row in enumerate(acc_set):
            for v, a in enumerate(row):
                if accumulate and si == 0:
                    at = b.add(b.add(c_row0, i64(r * ldc)), b.add(j0 if c_j0 is None else c_j0, i64(v * vw)))
                    b.store(b.load(vec_ptr(b, C, at, vty), align=4), a)
                else:
                    b.store(zero, a)

    def step(k, acc_set):
        brow = b.add(b.add(b_off, b.mul(k, i64(ldb))), j0)
        if _is_bf16(B):  # a whole panel row (bf16_panel_order), of which the tile takes nv vectors
            bv = _ld_bf16_row(b, B, brow, ldb // vw, vw)[:nv]
        else:
            bv = [_ld_vec(b, B, b.add(brow, i64(v * vw)), vty) for v in range(nv)]
        if ahead is not None:
            prefetch_run(b, B, b.add(brow, ahead), nv * vw, _elem_bytes(B))
        for r in range(mr):
            a = _ld(b, A, b.add(b.add(a_row0, i64(r * lda)), k if ldk == 1 else b.mul(k, i64(ldk))))
            av = splat(b, round_bf16(b, a) if round_a else a, vty)
            for v in range(nv):
                acc = acc_set[r][v]
                b.store(b.fadd(b.load(acc), b.fmul(av, bv[v], flags=CONTRACT), flags=CONTRACT), acc)

    if ks == 1:
        with for_range(b, K, name="k") as k:
            step(k, accs)
    else:
        with for_range(b, K // ks, name="kq") as kq:
            for s_ in range(ks):
                step(b.add(b.mul(kq, i64(ks)), i64(s_)), sets[s_])
        for k_rest in range(K // ks * ks, K):
            step(i64(k_rest), accs)
        for acc_set in sets[1:]:
            for r in range(mr):
                for v in range(nv):
                    b.store(b.fadd(b.load(accs[r][v]), b.load(acc_set[r][v])), accs[r][v])
    if store is not None:
        store(b, [[b.load(accs[r][v]) for v in range(nv)] for r in range(mr)])
        return
    c_j0 = j0 if c_j0 is None else c_j0
    width = nv * vw
    full = width if valid is None else (valid // vw) * vw
    for r in range(mr):
        crow = b.add(b.add(c_row0, i64(r * ldc)), c_j0)
        for v in range(full // vw):
            vec = b.load(accs[r][v])
            if post is not None:
                vec = post(b, r, b.add(c_j0, i64(v * vw)), vec)
            b.store(vec, vec_ptr(b, C, b.add(crow, i64(v * vw)), vty), align=4)
        if valid is not None and valid > full:  # the ragged end of the last panel
            vec = b.load(accs[r][full // vw])
            for j in range(valid - full):
                x = b.extract_element(vec, ir.Constant(ir.IntType(32), j))
                b.store(x, b.gep(C, [b.add(crow, i64(full + j))], inbounds=True))


def _scalar_cols(b, A, a_row0, lda, B, b_off, ldb, C, c_row0, ldc, j0, ncols, K, mr, ety):
    """The last ncols (< vw) columns of an mr-row block, one dot product each."""
    with for_range(b, ncols, name="jt") as jj:
        j = b.add(j0, jj)
        for r in range(mr):
            acc = alloca_in_entry(b, ety)
            b.store(ir.Constant(ety, 0.0), acc)
            arow = b.add(a_row0, i64(r * lda))
            with for_range(b, K, name="kt") as k:
                a = _ld(b, A, b.add(arow, k))
                bb = _ld(b, B, b.add(b.add(b_off, b.mul(k, i64(ldb))), j))
                b.store(b.fadd(b.load(acc), b.fmul(a, bb, flags=CONTRACT), flags=CONTRACT), acc)
            b.store(b.load(acc), b.gep(C, [b.add(b.add(c_row0, i64(r * ldc)), j)], inbounds=True))


def k_phases(accumulators: int) -> int:
    """Interleaved k phases for a tile of this many accumulator vectors: enough to keep
    ~8 independent FMA chains (4 cycles of latency x 2 units), at most 4."""
    return max(1, min(4, 8 // accumulators))


def micro_shape(vw: int) -> tuple[int, int]:
    """(MR, NV): rows and vectors per tile, sized to the register file."""
    if vw >= 16:
        return 12, 2  # AVX-512: 24 accumulators of 32 zmm (twice the FMAs per B load of 6 x 2)
    if vw == 8:
        return 6, 2   # AVX2: 12 of 16 ymm
    return 4, 3       # 128-bit (NEON, SIMD128, SSE): 12 of 16/32 registers


def row_blocks(M: int, vw: int) -> int:
    """How many row blocks emit_gemm splits M rows into (the unit of parallel work)."""
    return -(-M // micro_shape(vw)[0])


def emit_gemm(b, A, a_off, lda, B, b_off, ldb, C, c_off, ldc, M, N, K, vw, ety, epilogue=None,
              blocks=None):
    """Emit C = A @ B. Offsets are i64 values (elements); lda/ldb/ldc, M, N, K ints.
    `epilogue(b, row0, rows)` runs after each finished row block (row0: i64 value).
    `blocks=(begin, end)` (i64 values) limits the work to those row blocks."""
    mr_full, nv_full = micro_shape(vw)
    nr = nv_full * vw

    def row_block(row0, mr):
        a_row0 = b.add(a_off, b.mul(row0, i64(lda)))
        c_row0 = b.add(c_off, b.mul(row0, i64(ldc)))
        full_cols = N // nr
        if is_runtime(full_cols) or full_cols:
            with for_range(b, full_cols, name="jb") as jb:
                _tile(b, A, a_row0, lda, B, b_off, ldb, C, c_row0, ldc, b.mul(jb, i64(nr)), K, mr, nv_full, vw, ety)
        j0 = full_cols * nr
        if is_runtime(N):  # the ragged columns: whole vectors, then single columns
            with for_range(b, (N - j0) // vw, name="jv") as jv:
                _tile(b, A, a_row0, lda, B, b_off, ldb, C, c_row0, ldc, b.add(i64(j0), b.mul(jv, i64(vw))), K,
                      mr, 1, vw, ety)
            j1 = j0 + (N - j0) // vw * vw
            _scalar_cols(b, A, a_row0, lda, B, b_off, ldb, C, c_row0, ldc, i64(j1), N - j1, K, mr, ety)
            if epilogue is not None:
                epilogue(b, row0, mr)
            return
        rest_v = (N - j0) // vw
        if rest_v:
            _tile(b, A, a_row0, lda, B, b_off, ldb, C, c_row0, ldc, i64(j0), K, mr, rest_v, vw, ety)
        j0 += rest_v * vw
        if vw > 4 and (N - j0) >= 4:  # narrow vectors before the scalar tail
            q = (N - j0) // 4
            _tile(b, A, a_row0, lda, B, b_off, ldb, C, c_row0, ldc, i64(j0), K, mr, q, 4, ety)
            j0 += q * 4
        if N - j0:
            _scalar_cols(b, A, a_row0, lda, B, b_off, ldb, C, c_row0, ldc, i64(j0), N - j0, K, mr, ety)
        if epilogue is not None:
            epilogue(b, row0, mr)

    full_rows = M // mr_full
    begin, end = blocks if blocks is not None else (i64(0), i64(row_blocks(M, vw)))
    if is_runtime(full_rows) or full_rows:
        full_end = b.select(b.icmp_signed("<", end, i64(full_rows)), end, i64(full_rows))
        with for_range(b, full_end, start=begin, name="ib") as ib:
            row_block(b.mul(ib, i64(mr_full)), mr_full)
    last = i64(full_rows)
    has_last = b.and_(b.icmp_signed("<=", begin, last), b.icmp_signed(">", end, last))
    _last_block(b, M, mr_full, has_last, lambda rows: row_block(i64(full_rows * mr_full), rows))


def _last_block(b, M, mr_full, guard, emit_rows):
    """The last, partial row block (M % mr_full rows) where `guard` (i1) holds; for a
    runtime M, one variant per possible height, chosen at run time."""
    rem = M % mr_full
    if not is_runtime(rem):
        if rem:
            with b.if_then(guard):
                emit_rows(rem)
        return
    with b.if_then(guard):
        for rows in range(1, mr_full):
            with b.if_then(b.icmp_signed("==", i64(rem), i64(rows))):
                emit_rows(rows)


# -- packed B ---------------------------------------------------------------------------------
# B packed in panels of NR columns: panel p holds B[:, p*NR:(p+1)*NR] as K rows of NR
# contiguous values (zero-padded past N). The micro-kernel then streams one contiguous
# panel, which stays in cache across the row blocks that use it.


def panel_width(vw: int) -> int:
    return micro_shape(vw)[1] * vw


def pack_b(array, vw: int):
    """Pack a constant [K, N] matrix (NumPy) into panels, for the compiled-in weights."""
    import numpy as np
    k, n = array.shape
    nr = panel_width(vw)
    panels = -(-n // nr)
    padded = np.zeros((k, panels * nr), array.dtype)
    padded[:, :n] = array
    return np.ascontiguousarray(padded.reshape(k, panels, nr).transpose(1, 0, 2))


def emit_pack_b(b, B, b_off, ldb, K, N, dst, vw, ety, panels=None, slot=None, value=None):
    """Pack B[K, N] (row stride ldb) into dst at run time; `panels=(p0, p1)` limits it,
    `slot` (i64, with a single panel) packs that panel at panel slot `slot` of dst;
    `value(b, x)` maps the values (vectors or scalars) as they are copied.
    Full panels copy whole vectors; the last, ragged one (N % NR columns) goes element
    by element and is zero-filled past N."""
    nr = panel_width(vw)
    full = N // nr
    p0, p1 = panels if panels is not None else (i64(0), i64(-(-N // nr)))
    vty = ir.VectorType(ety, vw)
    if full:
        with for_range(b, imin(b, p1, i64(full)), start=p0, name="pp") as p:
            with for_range(b, K, name="pk") as k:
                src = b.add(b.add(b_off, b.mul(k, i64(ldb))), b.mul(p, i64(nr)))
                out = b.add(b.mul(p if slot is None else slot, i64(K * nr)), b.mul(k, i64(nr)))
                for v in range(nr // vw):
                    x = b.load(vec_ptr(b, B, b.add(src, i64(v * vw)), vty), align=4)
                    b.store(x if value is None else value(b, x), vec_ptr(b, dst, b.add(out, i64(v * vw)), vty), align=4)
    if N % nr == 0:
        return
    zero = ir.Constant(ety, 0.0)
    with b.if_then(b.icmp_signed(">", p1, i64(full))):
        with b.if_then(b.icmp_signed("<=", p0, i64(full))):
            p = i64(full)
            with for_range(b, K, name="pk") as k:
                src = b.add(b.add(b_off, b.mul(k, i64(ldb))), b.mul(p, i64(nr)))
                out = b.add(b.mul(p if slot is None else slot, i64(K * nr)), b.mul(k, i64(nr)))
                for j in range(nr):
                    if full * nr + j < N:
                        v = b.load(b.gep(B, [b.add(src, i64(j))], inbounds=True))
                        v = v if value is None else value(b, v)
                    else:
                        v = zero
                    b.store(v, b.gep(dst, [b.add(out, i64(j))], inbounds=True))


def packed_work_items(M: int, N: int, vw: int) -> int:
    """Units of parallel work of the packed GEMMs: (panel, row block) pairs."""
    return -(-N // panel_width(vw)) * row_blocks(M, vw)


def packed_items(b, M, N, vw, items, tile):
    """tile(row0, mr, p, valid) for the work items t in [t0, t1) (`items`, i64 values):
    panel p = t // R and row block t % R (R row blocks of the micro-tile's height; the
    last is short where M is not a multiple). `valid`: the columns of the last, ragged
    panel, None for full ones. Consecutive items share a panel, so a split of the items
    into contiguous ranges gives each thread whole panels, and the last block and panel
    (the cheap ones) are single items: the threads' shares even out."""
    mr_full, nv = micro_shape(vw)
    nr = nv * vw
    panels = -(-N // nr)
    nblocks = row_blocks(M, vw)
    full_rows = M // mr_full
    last_cols = N - (panels - 1) * nr
    t0, t1 = items
    with for_range(b, t1, start=t0, name="wi") as t:
        p = b.sdiv(t, i64(nblocks))
        ib = b.srem(t, i64(nblocks))

        def rows_of(valid):
            with b.if_then(b.icmp_signed("<", ib, i64(full_rows))):
                tile(b.mul(ib, i64(mr_full)), mr_full, p, valid)
            _last_block(b, M, mr_full, b.icmp_signed("==", ib, i64(full_rows)),
                        lambda rows: tile(i64(full_rows * mr_full), rows, p, valid))

        if last_cols == nr:
            rows_of(None)
        else:
            with b.if_else(b.icmp_signed("==", p, i64(panels - 1))) as (then, otherwise):
                with then:
                    rows_of(last_cols)
                with otherwise:
                    rows_of(None)


def tile_post(epilogue, row0, valid, vw):
    """(post for a tile of rows from row0, whether the epilogue still runs after the
    tile): a tile of whole vectors (`valid` columns, None: a whole panel) applies an
    epilogue that has `apply` to its accumulators."""
    apply = getattr(epilogue, "apply", None)
    if apply is None or (valid is not None and valid % vw):
        return None, epilogue is not None
    return (lambda bb, r, col, vec: apply(bb, bb.add(row0, i64(r)), col, vec)), False


def emit_gemm_packed(b, A, a_off, lda, Bp, C, c_off, ldc, M, N, K, vw, ety, epilogue=None, items=None,
                     panel_at=None, round_a=False, planes=None):
    """C = A @ B with B packed by pack_b/emit_pack_b, over the work items of
    packed_items; `items=(t0, t1)` (i64 values) limits the work. `panel_at` (i64): B's
    panel is read from that panel slot of Bp, whichever panel the item computes (a
    panel packed just before, in cache).
    `epilogue(b, row0, rows, col0, cols)` runs on each finished tile (row0, col0: i64);
    where it has `apply(b, row, col, vec)` (one vector of row `row` from column `col`),
    tiles of whole vectors take it on their accumulators instead, before the store.
    `round_a`: A is rounded to bfloat16 as it is read (_tile).
    `planes=(X, x_off, ld)`: whole panels are read in place from X instead (row k of
    panel p from x_off + k * ld + p * NR: a 1x1 conv's input planes, no packed copy),
    only a ragged last one from Bp."""
    nr = panel_width(vw)
    nv = nr // vw

    def tile(row0, mr, p, valid):
        j0 = b.mul(p, i64(nr))
        a_row0 = b.add(a_off, b.mul(row0, i64(lda)))
        c_row0 = b.add(c_off, b.mul(row0, i64(ldc)))
        # a last panel of at most one vector's columns: one vector per row, not nv
        nv_t = 1 if valid is not None and valid <= vw else nv
        post, after = tile_post(epilogue, row0, valid, vw)
        ahead = i64(K * nr) if mr >= PREFETCH_ROWS and panel_at is None else None
        B, b_off, ldb = Bp, b.mul(p if panel_at is None else panel_at, i64(K * nr)), nr
        if planes is not None and valid is None:  # (prefetching the next panel's row gains nothing)
            B, b_off, ldb, ahead = planes[0], b.add(planes[1], j0), planes[2], None
        _tile(b, A, a_row0, lda, B, b_off, ldb, C, c_row0, ldc,
              i64(0), K, mr, nv_t, vw, ety, c_j0=j0, valid=valid, post=post, ahead=ahead, round_a=round_a)
        if after:
            epilogue(b, row0, mr, j0, nr if valid is None else valid)
    packed_items(b, M, N, vw, items if items is not None else (i64(0), i64(packed_work_items(M, N, vw))), tile)


# A K block of a panel-at-a-time GEMM keeps its share of A (all M rows) and of the B
# panel (this one and the prefetched next) within about half of a 1 MiB L2 (blocks of
# the whole L2, as once sized for a 2 MiB one, ran slower).
K_BLOCK_BYTES = 1 << 19


def k_blocks(K: int, M: int, vw: int) -> tuple[int, int]:
    """(count, length) of the K blocks of emit_gemm_panel for an f32 A of M rows (with
    narrow vectors, l1_k_blocks)."""
    if vw < 16:
        return l1_k_blocks(K, vw)
    length = max(64, K_BLOCK_BYTES // ((M + 2 * panel_width(vw)) * 4))
    count = -(-K // length)
    return count, -(-K // count)


def emit_gemm_panel(b, A, a_off, lda, ldk, Bp, C, ldc, M, K, vw, ety, panel, store=None):
    """C[:, panel*NR : (panel+1)*NR] = A @ B's panel `panel` (i64; B packed by pack_b;
    whole panels are stored, so ldc covers N rounded up to panels). A's (row, k) element
    is at a_off + row*lda + k*ldk. K runs in k_blocks: every row block of one K block
    before the next, while that block of A and of the panel are in cache; later blocks
    add to C. Each step also prefetches the B rows the next block (or the next panel's
    first block) will read. `store(b, row0, rows, col0, valid, vals)`: the last block's
    finished tiles go there instead of into C (gemm_dot.emit_i8b_gemm's; valid: None)."""
    mr_full, nv = micro_shape(vw)
    nr = nv * vw
    count, length = k_blocks(K, M, vw)
    j0 = b.mul(panel, i64(nr))
    for kb in range(count):
        k0 = kb * length
        kl = min(length, K - k0)
        ahead = i64((length if kb + 1 < count else K - k0) * nr)

        def rows(row0, mr):
            own = None if store is None or kb + 1 < count else (lambda bb, vals: store(bb, row0, mr, j0, None, vals))
            _tile(b, A, b.add(b.add(a_off, b.mul(row0, i64(lda))), i64(k0 * ldk)), lda, Bp,
                  b.add(b.mul(panel, i64(K * nr)), i64(k0 * nr)), nr, C, b.mul(row0, i64(ldc)), ldc, i64(0), kl,
                  mr, nv, vw, ety, c_j0=j0, ldk=ldk, ahead=ahead if mr >= PREFETCH_ROWS else None,
                  accumulate=kb > 0, store=own)
        if M // mr_full:
            with for_range(b, M // mr_full, name="ib") as ib:
                rows(b.mul(ib, i64(mr_full)), mr_full)
        if M % mr_full:
            rows(i64(M // mr_full * mr_full), M % mr_full)


# -- L1-blocked packed GEMM (narrow vectors) ----------------------------------------------------
# With 256-bit or narrower vectors a B panel is 16 (or 12) columns wide and its K rows
# outgrow a 32 KiB L1 data cache from K = 512 on (and the tiles' FMAs are slow enough
# that streaming B from L2 shows). These GEMMs run K in blocks whose slice of a panel
# (L1_PANEL_BYTES) stays in L1 across the row blocks that use it, and the rows in
# blocks whose slice of A (L2_ROWS_BYTES) stays in L2 across the panels: on an AVX2 core
# with a 32 KiB L1 and a 512 KiB L2 that brings nn.Linear layers close to the FMA peak.
# AVX-512 keeps the (panel, row block) items of emit_gemm_packed: there a 12-row tile
# does enough FMAs per B row to stream B from L2 near peak.
L1_PANEL_BYTES = 16 << 10
L2_ROWS_BYTES = 256 << 10


def blocked_gemm(M, N, vw: int) -> bool:
    """Whether a packed GEMM of M rows (int or runtime) and N columns runs L1-blocked:
    narrow vectors, at least two full panels, and enough rows that a B panel is used by
    more than one row block."""
    mr = micro_shape(vw)[0]
    return vw < 16 and N // panel_width(vw) >= 2 and (is_runtime(M) or M >= 2 * mr)


def l1_k_blocks(K: int, vw: int, elem_bytes: int = 4) -> tuple[int, int]:
    """(count, length) of the K blocks of emit_gemm_blocked: equal lengths, each slice
    of a panel at most L1_PANEL_BYTES."""
    most = max(16, L1_PANEL_BYTES // (panel_width(vw) * elem_bytes))
    count = -(-K // most)
    return count, -(-K // count)


def emit_gemm_blocked(b, A, a_off, lda, Bp, C, c_off, ldc, M, N, K: int, vw, ety, epilogue=None, panels=None,
                      panel_at=None, round_a=False):
    """C = A @ B with B packed by pack_b/emit_pack_b, for B's panels p in [p0, p1)
    (`panels`, i64 values; default all), loops K block -> row block group -> panel ->
    row block (see L1_PANEL_BYTES). Later K blocks add to C; the last one applies the
    epilogue (as emit_gemm_packed's). The last panel, where N is not a multiple of the
    panel width, runs its whole K at once (its ragged tiles store only N's columns).
    `panel_at` (i64): every panel is read from that panel slot of Bp (one panel).
    A bfloat16 Bp (i16 bits) has each block's slice of a panel widened to f32 into a
    local buffer first, which the row blocks then read from L1. `round_a` as _tile's."""
    mr, nv = micro_shape(vw)
    nr = nv * vw
    full_panels = N // nr
    p0, p1 = panels if panels is not None else (i64(0), i64(-(-N // nr)))
    widen = _is_bf16(Bp)
    count, length = l1_k_blocks(K, vw, 2 if _is_half(Bp) else 4)
    if widen:
        slice_ = alloca_in_entry(b, ir.ArrayType(ety, length * nr))
        slice_.align = 64
        Bw = b.bitcast(slice_, ety.as_pointer())
    full_rows = M // mr
    group = max(1, L2_ROWS_BYTES // (length * 4 * mr))  # row blocks per group
    groups = (full_rows + group) // group  # full_rows + 1 blocks: the partial last may be empty
    apply = getattr(epilogue, "apply", None)
    f1 = imin(b, p1, i64(full_panels))

    def sweep(k0, kl, accumulate, last):
        with for_range(b, groups, name="rg") as rg:
            ib0 = b.mul(rg, i64(group))
            ib1 = imin(b, b.add(ib0, i64(group)), i64(full_rows))
            with for_range(b, f1, start=p0, name="bp") as p:
                slot = p if panel_at is None else panel_at
                b_off = b.add(b.mul(slot, i64(K * nr)), b.mul(k0, i64(nr)))
                B = Bp
                if widen:
                    _widen_slice(b, Bp, b_off, kl, Bw, vw)
                    B, b_off = Bw, i64(0)

                def tile(row0, rows):
                    post = None
                    if last and apply is not None:
                        post = (lambda bb, r, col, vec: apply(bb, bb.add(row0, i64(r)), col, vec))
                    _tile(b, A, b.add(b.add(a_off, b.mul(row0, i64(lda))), k0), lda, B, b_off, nr, C,
                          b.add(c_off, b.mul(row0, i64(ldc))), ldc, i64(0), kl, rows, nv, vw, ety,
                          c_j0=b.mul(p, i64(nr)), post=post, accumulate=accumulate, round_a=round_a)
                    if last and epilogue is not None and apply is None:
                        epilogue(b, row0, rows, b.mul(p, i64(nr)), nr)

                with for_range(b, ib1, start=ib0, name="ib") as ib:
                    tile(b.mul(ib, i64(mr)), mr)
                in_group = b.and_(b.icmp_signed("<=", ib0, i64(full_rows)),
                                  b.icmp_signed(">", b.add(ib0, i64(group)), i64(full_rows)))
                _last_block(b, M, mr, in_group, lambda rows: tile(i64(full_rows * mr), rows))

    sweep(i64(0), length if count > 1 else K, False, count == 1)
    if count > 2:
        with for_range(b, count - 1, start=i64(1), name="kb") as kb:
            sweep(b.mul(kb, i64(length)), length, True, False)
    if count > 1:
        sweep(i64((count - 1) * length), K - (count - 1) * length, True, True)
    if N % nr:
        nblocks = row_blocks(M, vw)
        with b.if_then(b.icmp_signed(">", p1, i64(full_panels))):
            emit_gemm_packed(b, A, a_off, lda, Bp, C, c_off, ldc, M, N, K, vw, ety, epilogue,
                             items=(i64(full_panels * nblocks), i64((full_panels + 1) * nblocks)), panel_at=panel_at,
                             round_a=round_a)


def _widen_slice(b, src, off, rows: int, dst, vw):
    """The `rows` panel rows at src[off] (bfloat16 bits in bf16_panel_order) into dst as
    f32 panel rows."""
    vty = ir.VectorType(ir.FloatType(), vw)
    nv = panel_width(vw) // vw
    with for_range(b, rows, name="wr") as r:
        at = b.mul(r, i64(nv * vw))
        for v, vec in enumerate(_ld_bf16_row(b, src, b.add(off, at), nv, vw)):
            b.store(vec, vec_ptr(b, dst, b.add(at, i64(v * vw)), vty), align=32)
