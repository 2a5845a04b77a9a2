"""Register-blocked GEMM: C[M, N] = A[M, K] @ B[K, N] for static M, N, K.

The micro-kernel keeps an MR x (NV * VW) block of C in vector registers across the whole
K loop: each step loads NV vectors of one B row, broadcasts MR values of A, and does
MR * NV multiply-adds (fused to FMA where the target has it). VW comes from the target's
vector width; edges use smaller tiles and a scalar tail. Row blocks of C are finished
(with the caller's epilogue) while they are still in cache.
"""
from __future__ import annotations

from llvmlite import ir

from .emit import I64, i64
from .loops import alloca_in_entry, for_range

CONTRACT = ("contract",)


def _vec_ptr(b, ptr, index, vty):
    return b.bitcast(b.gep(ptr, [index], inbounds=True), vty.as_pointer())


def _splat(b, x, vty):
    undef = ir.Constant(vty, ir.Undefined)
    v = b.insert_element(undef, x, ir.Constant(ir.IntType(32), 0))
    return b.shuffle_vector(v, undef, ir.Constant(ir.VectorType(ir.IntType(32), vty.count), [0] * vty.count))


def _tile(b, A, a_row0, lda, B, b_off, ldb, C, c_row0, ldc, j0, K, mr, nv, vw, ety):
    """One mr x (nv*vw) tile at rows starting a_row0/c_row0 (i64 element offsets) and
    column j0 (i64)."""
    vty = ir.VectorType(ety, vw)
    accs = [[alloca_in_entry(b, vty) for _ in range(nv)] for _ in range(mr)]
    zero = ir.Constant(vty, [0.0] * vw)
    for row in accs:
        for a in row:
            b.store(zero, a)
    with for_range(b, K, name="k") as k:
        brow = b.add(b.add(b_off, b.mul(k, i64(ldb))), j0)
        bv = [b.load(_vec_ptr(b, B, b.add(brow, i64(v * vw)), vty), align=4) for v in range(nv)]
        for r in range(mr):
            av = _splat(b, b.load(b.gep(A, [b.add(b.add(a_row0, i64(r * lda)), k)], inbounds=True)), vty)
            for v in range(nv):
                acc = accs[r][v]
                b.store(b.fadd(b.load(acc), b.fmul(av, bv[v], flags=CONTRACT), flags=CONTRACT), acc)
    for r in range(mr):
        crow = b.add(b.add(c_row0, i64(r * ldc)), j0)
        for v in range(nv):
            b.store(b.load(accs[r][v]), _vec_ptr(b, C, b.add(crow, i64(v * vw)), vty), align=4)


def _scalar_cols(b, A, a_row0, lda, B, b_off, ldb, C, c_row0, ldc, j0, ncols, K, mr, ety):
    """The last ncols (< vw) columns of an mr-row block, one dot product each."""
    with for_range(b, ncols, name="jt") as jj:
        j = b.add(j0, jj)
        for r in range(mr):
            acc = alloca_in_entry(b, ety)
            b.store(ir.Constant(ety, 0.0), acc)
            arow = b.add(a_row0, i64(r * lda))
            with for_range(b, K, name="kt") as k:
                a = b.load(b.gep(A, [b.add(arow, k)], inbounds=True))
                bb = b.load(b.gep(B, [b.add(b.add(b_off, b.mul(k, i64(ldb))), j)], inbounds=True))
                b.store(b.fadd(b.load(acc), b.fmul(a, bb, flags=CONTRACT), flags=CONTRACT), acc)
            b.store(b.load(acc), b.gep(C, [b.add(b.add(c_row0, i64(r * ldc)), j)], inbounds=True))


def micro_shape(vw: int) -> tuple[int, int]:
    """(MR, NV): rows and vectors per tile, sized to the register file."""
    if vw >= 16:
        return 6, 2   # AVX-512: 12 accumulators of 32 zmm
    if vw == 8:
        return 4, 2   # AVX2: 8 of 16 ymm
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
        if full_cols:
            with for_range(b, full_cols, name="jb") as jb:
                _tile(b, A, a_row0, lda, B, b_off, ldb, C, c_row0, ldc, b.mul(jb, i64(nr)), K, mr, nv_full, vw, ety)
        j0 = full_cols * nr
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
    if full_rows:
        full_end = b.select(b.icmp_signed("<", end, i64(full_rows)), end, i64(full_rows))
        with for_range(b, full_end, start=begin, name="ib") as ib:
            row_block(b.mul(ib, i64(mr_full)), mr_full)
    if M % mr_full:
        last = i64(full_rows)
        has_last = b.and_(b.icmp_signed("<=", begin, last), b.icmp_signed(">", end, last))
        with b.if_then(has_last):
            row_block(i64(full_rows * mr_full), M % mr_full)
